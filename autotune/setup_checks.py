"""The checks behind :meth:`TrainSetup.validate` and :meth:`TrainSetup.check_device`.

Kept apart from :mod:`autotune.train_setup` so the dataclass module stays a
readable list of knobs and helpers; both functions take the
:class:`~autotune.train_setup.TrainSetup` (typed ``Any`` here: this module
sits below it) and raise :class:`~autotune.errors.SetupError` with a
one-line reason.
"""

from __future__ import annotations

import numbers
from typing import TYPE_CHECKING, Any

from autotune.devices import device_type
from autotune.errors import SetupError
from autotune.torch_knobs import COMPILE_MODES, DECODES, OPTIMIZER_IMPLS, fused_supported

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch

AMP_MODES: tuple[str, ...] = ("off", "bf16", "fp16")


#: The knobs that hold an integer (``prefetch_factor`` and ``num_threads`` may also be ``None``).
INTEGER_KNOBS: tuple[str, ...] = ("num_workers", "prefetch_factor", "batch_size", "accumulation_steps", "num_threads", "bucket_cap_mb")
#: The knobs every best.json has held: a file of an earlier version lacks the later ones, which take their defaults.
FIRST_KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers", "batch_size", "accumulation_steps", "amp",
               "channels_last")
#: The largest value per integer knob, in a setup and in ``--set``: far above any real machine, low enough that a typo
#: cannot start a million loader workers (a hand-edited best.json's train.py hung) or build a range that exhausts memory.
INT_LIMITS = {"num_workers": 1024, "prefetch_factor": 1024, "batch_size": 2**20, "accumulation_steps": 2**16, "num_threads": 1024,
              "bucket_cap_mb": 2**16}


#: The knobs that hold true or false.
BOOL_KNOBS: tuple[str, ...] = ("pin_memory", "persistent_workers", "channels_last", "cudnn_benchmark", "tf32", "gradient_as_bucket_view",
                               "static_graph")


def python_numbers(setup: Any) -> None:
    """Store NumPy's integers and booleans (``np.int64(64)``, ``np.True_``: a row of trials.csv read with pandas, a config
    read with NumPy) as Python's, as :class:`~autotune.workloads.task.Task` does: best.json and the emitted script write
    them as JSON."""
    for name in INTEGER_KNOBS:
        value = getattr(setup, name)
        if isinstance(value, numbers.Integral) and not isinstance(value, (int, bool)):
            object.__setattr__(setup, name, int(value))
    for name in BOOL_KNOBS:
        value = getattr(setup, name)
        if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):  # not an Integral: np.True_
            object.__setattr__(setup, name, bool(value))


def missing_knob(setup: dict[str, Any]) -> str | None:
    """The first of :data:`FIRST_KNOBS` a best.json's ``setup`` lacks (its default would not be what was measured), or None."""
    return next((knob for knob in FIRST_KNOBS if knob not in setup), None)


def validate_setup(setup: Any) -> None:
    """Reject values and combinations that cannot run on any device.

    Raises:
        SetupError: With a one-line reason.
    """
    for name in ("num_workers", "batch_size", "accumulation_steps", "bucket_cap_mb"):
        value = getattr(setup, name)
        if not isinstance(value, int) or isinstance(value, bool):
            raise SetupError(f"{name} must be an integer, got {value!r}")
    for name in BOOL_KNOBS:
        if not isinstance(getattr(setup, name), bool):
            raise SetupError(f"{name} must be true or false, got {getattr(setup, name)!r}")
    if setup.num_workers < 0:
        raise SetupError(f"num_workers must be >= 0, got {setup.num_workers}")
    if setup.batch_size < 1:
        raise SetupError(f"batch_size must be >= 1, got {setup.batch_size}")
    if setup.accumulation_steps < 1:
        raise SetupError(f"accumulation_steps must be >= 1, got {setup.accumulation_steps}")
    if setup.bucket_cap_mb < 1:
        raise SetupError(f"bucket_cap_mb must be >= 1, got {setup.bucket_cap_mb}")
    for name, limit in INT_LIMITS.items():
        if isinstance(getattr(setup, name), int) and getattr(setup, name) > limit:
            raise SetupError(f"{name} must be <= {limit}, got {getattr(setup, name)}")
    if setup.static_graph and setup.accumulation_steps > 1:
        raise SetupError("static_graph does not work with accumulation_steps > 1 (DDP's no_sync breaks its reducer)")
    if setup.amp not in AMP_MODES:
        raise SetupError(f"amp must be one of {', '.join(AMP_MODES)}, got {setup.amp!r}")
    if setup.num_threads is not None and (isinstance(setup.num_threads, bool) or not isinstance(setup.num_threads, int) or setup.num_threads < 1):
        raise SetupError(f"num_threads must be an integer >= 1 (or null for torch's choice), got {setup.num_threads!r}")
    for name, allowed in (("compile", COMPILE_MODES), ("optimizer_impl", (None, *OPTIMIZER_IMPLS)), ("decode", DECODES)):
        if getattr(setup, name) not in allowed:
            shown = ", ".join(str(a).lower() if a is None else str(a) for a in allowed).replace("none", "null")
            raise SetupError(f"{name} must be one of {shown}, got {getattr(setup, name)!r}")
    if setup.num_workers == 0:
        if setup.prefetch_factor is not None:
            raise SetupError("prefetch_factor needs num_workers > 0 (PyTorch rejects it with 0 workers): leave it unset with 0 workers")
        if setup.persistent_workers:
            raise SetupError("persistent_workers needs num_workers > 0: leave it off with 0 workers")
    elif setup.prefetch_factor is not None:
        if isinstance(setup.prefetch_factor, bool) or not isinstance(setup.prefetch_factor, int):
            raise SetupError(f"prefetch_factor must be an integer, got {setup.prefetch_factor!r}")
        if setup.prefetch_factor < 1:
            raise SetupError(f"prefetch_factor must be >= 1, got {setup.prefetch_factor}")


def check_setup_device(
    setup: Any, device: str | torch.device, *, bf16_supported: bool | None = None, tf32_supported: bool | None = None
) -> None:
    """Reject knobs the given device cannot run.

    Args:
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:K"``.
        bf16_supported: Whether the device runs bf16 natively. ``None``
            asks torch (for CUDA) or allows it (CPU autocast always runs).
        tf32_supported: Whether the GPU has TF32 tensor cores. ``None`` asks torch.

    Raises:
        SetupError: A CUDA device this machine does not have (asked without
            ``bf16_supported``/``tf32_supported``), fp16 on a CPU, bf16 on a GPU without it, pinned memory,
            cuDNN, TF32, GPU decoding or CUDA graphs without a GPU, fused
            optimizer kernels the installed torch lacks for the device.
    """
    kind = device_type(device)
    if setup.optimizer_impl == "fused" and kind in ("cpu", "cuda") and not fused_supported(kind):
        raise SetupError(f"optimizer_impl=fused: the installed torch has no fused optimizer kernels for {kind}")
    if kind == "cpu":
        said: list[str] = []  # every knob a CPU cannot run, at once (a GPU's best.json holds several)
        fix: dict[str, str] = {}
        for name, knob, on, off in (("cudnn_benchmark", "cudnn_benchmark", setup.cudnn_benchmark, "False"),
                                    ("tf32", "tf32", setup.tf32, "False"), ("decode=gpu", "decode", setup.decode == "gpu", "'cpu'")):
            if on:
                said.append(f"{name} needs a CUDA device; it changes nothing on a CPU")
                fix[knob] = off
        if setup.compile == "reduce-overhead":
            said.append("compile=reduce-overhead uses CUDA graphs and needs a CUDA device; use compile=default")
            fix["compile"] = "'default'"
        if setup.amp == "fp16":
            other = "amp=off" if bf16_supported is False else "amp=bf16 or amp=off"
            said.append(f"amp=fp16 needs a CUDA device; on a CPU use {other}")
            fix["amp"] = "'bf16'" if bf16_supported else "'off'"  # bf16 only where known native: emulated, it is slower
        if setup.pin_memory:
            said.append("pin_memory only helps host-to-GPU copies; it needs a CUDA device")
            fix["pin_memory"] = "False"
        if bf16_supported is False and setup.amp == "bf16":
            said.append("amp=bf16: this CPU has no native bf16 (AMX / AVX512-BF16); use amp=off")
            fix["amp"] = "'off'"
        if len(said) == 1:
            raise SetupError(said[0])
        if said:
            change = ", ".join(f"{knob}={value}" for knob, value in fix.items())
            raise SetupError(f"{len(said)} knobs of this setup cannot run on a CPU: {'; '.join(said)} (setup.replace({change}) "
                             "runs it here)")
    elif kind == "cuda":
        if bf16_supported is None and tf32_supported is None:  # asked without the device's facts: it must be here
            _check_cuda_present(device)
        if setup.amp == "bf16":
            if bf16_supported is None:
                bf16_supported = _ampere_or_newer(device)
            if not bf16_supported:
                raise SetupError("amp=bf16: this GPU does not support bf16; use amp=fp16")
        if setup.tf32:
            if tf32_supported is None:
                tf32_supported = _ampere_or_newer(device)
            if not tf32_supported:
                raise SetupError("tf32: this GPU has no TF32 tensor cores (compute capability 8.0+ needed)")
    else:
        raise SetupError(f"unsupported device {str(device)!r}; use cpu, cuda or cuda:K")


def _ampere_or_newer(device: str | torch.device) -> bool:
    """Whether the GPU ``device`` has native bf16 and TF32 (compute capability 8.0+); ``torch.cuda.is_bf16_supported()``
    also counts emulation, and reads the current device."""
    import torch

    return bool(torch.cuda.is_available() and torch.cuda.get_device_capability(device) >= (8, 0))


def _check_cuda_present(device: str | torch.device) -> None:
    """Refuse a CUDA device torch cannot use here."""
    import torch

    index = torch.device(device).index or 0
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        have = "no CUDA GPU is usable here" if count == 0 else f"this machine has {count} CUDA GPU(s), cuda:0 to cuda:{count - 1}"
        raise SetupError(f"device {str(device)!r}: {have}")


def check_move_device(device: object) -> None:
    """Refuse, for :meth:`~autotune.train_setup.TrainSetup.to_device`, a device torch cannot name (``"gpu"``) or a CUDA
    device torch cannot use here, as the other helpers refuse them; any other device torch names (``meta``) is taken.

    Raises:
        SetupError: Naming the helper, not torch's own error.
    """
    import torch

    try:
        kind = torch.device(device).type
    except (RuntimeError, TypeError, ValueError):
        kind = None
    if kind in (None, "cuda"):
        helper_device_type(device, "to_device")


def helper_device_type(device: object, method: str, amp: str = "off") -> str:
    """``"cpu"`` or ``"cuda"`` for the device a :class:`~autotune.train_setup.TrainSetup` helper was given.

    Raises:
        SetupError: ``device`` names no CPU or CUDA device (``"gpu"``, ``"cuda:x"``, ``None``), or a CUDA device
            torch cannot use here, or a CPU for ``amp="fp16"`` (refused as :meth:`~autotune.train_setup.TrainSetup.check_device` refuses it: torch's
            CPU autocast would run fp16 there, which no search measured).
    """
    import torch

    try:
        kind = torch.device(device).type  # anything else is the error below
    except (RuntimeError, TypeError, ValueError):
        kind = None
    if kind not in ("cpu", "cuda"):
        raise SetupError(f"TrainSetup.{method}: unsupported device {device!r}; use cpu, cuda or cuda:K")
    if kind == "cpu" and amp == "fp16":
        raise SetupError(f"TrainSetup.{method}: amp=fp16 needs a CUDA device; on a CPU use amp=bf16 or amp=off")
    if kind == "cuda":  # torch itself only warns, and its autocast or grad scaler then does nothing
        try:
            _check_cuda_present(device)
        except SetupError as exc:
            raise SetupError(f"TrainSetup.{method}: {exc}") from None
    return kind


def helper_module(model: object, method: str, *, callables: bool = False) -> None:
    """Refuse a ``model`` that is no ``torch.nn.Module`` (with ``callables``: no callable either, as ``torch.compile`` takes).

    Raises:
        SetupError: With the type that was given.
    """
    import torch

    if not isinstance(model, torch.nn.Module) and not (callables and callable(model)):
        raise SetupError(f"TrainSetup.{method} takes a torch.nn.Module, got {type(model).__name__}")


def native_cpu_bf16(device: str | torch.device) -> bool | None:
    """True where ``device`` is this machine's CPU and it has a native bf16 unit (the probe's ``bf16``); None otherwise
    (unknown: :func:`check_setup_device` then refuses nothing for it, and names amp='off' as a CPU's fix)."""
    from probes.cpu import native_bf16_flags

    return True if device_type(device) == "cpu" and native_bf16_flags() else None
