"""Where the torch knobs are offered: threads, compile, cuDNN, TF32, optimizer kernels, GPU decoding.

Each knob is offered only where it can work, and a ``--set`` that asks for
one where it cannot is refused with one line:

- ``num_threads``: torch's own choice (``None``, ``auto`` in ``--set``: no
  ``torch.set_num_threads`` call), then 1 .. the usable cores (the loader's
  workers run one thread each, so threads and workers share the same
  cores). The first is not the same as naming torch's thread count:
  ``torch.set_num_threads`` also switches off MKL's dynamic threading, and a
  small-GEMM model (a width-32 transformer) trained 10 % slower with
  ``num_threads=2`` than with torch's own choice of 2 threads on the 2-core
  development machine (docs/benchmarks.md, "Torch's own thread count").
- ``compile``: ``off`` and ``default`` (plus ``reduce-overhead`` on CUDA);
  sampled trials run eagerly, compiled modes are tried on the leading setup
  (:mod:`autotune.tuner.refine`); ``off`` only for a Task whose factory returns a compiled model.
- ``cudnn_benchmark``: CUDA, and only for a workload whose batches keep
  their shapes.
- ``tf32``: CUDA on Ampere and newer (the probe's ``tf32``).
- ``optimizer_impl``: the default AdamW (not a Task's own optimizer factory);
  ``fused`` where the installed torch has fused kernels for the device.
- ``decode``: ``gpu`` for the classifier's JPEG folders on CUDA only.
- ``amp``: none for a Task's model wholly in float64 (:attr:`~autotune.records.Workload.precision`), which autocast
  leaves alone (it would compute as ``amp=off``); no ``fp16`` for one with float16 or bfloat16 parameters, whose
  gradients fp16's GradScaler cannot unscale (it raises on float16 ones).
"""

from __future__ import annotations

from typing import Any

from autotune.devices import DeviceInfo
from autotune.errors import UsageError
from autotune.records import Workload
from autotune.torch_knobs import COMPILE_MODES, OPTIMIZER_IMPLS, fused_supported
from autotune.tuner.constraints import Constraint
from autotune.workloads.streams import UNSHARDED


def torch_knob_values(device: DeviceInfo, workload: Workload | None, usable_cores: int) -> dict[str, tuple[Any, ...]]:
    """The values of the torch knobs this device and workload can run (first value: PyTorch's default)."""
    cuda = device.type == "cuda"
    fixed = workload is None or workload.fixed_shapes
    classifier = workload is None or workload.task is None
    own_optimizer = workload is not None and workload.own_optimizer
    impls: tuple[str | None, ...] = (None,)
    if not own_optimizer:
        impls = tuple(i for i in OPTIMIZER_IMPLS if i != "fused" or fused_supported(device.type))
    return {
        "num_threads": (None, *range(1, max(1, usable_cores) + 1)),
        "compile": ("off",) if workload is not None and workload.compiled else ("off", "default", "reduce-overhead") if cuda else ("off", "default"),
        "cudnn_benchmark": (False, True) if cuda and fixed else (False,),
        "tf32": (False, True) if cuda and device.tf32 else (False,),
        "optimizer_impl": impls,
        "decode": ("cpu", "gpu") if cuda and classifier else ("cpu",),
    }


#: The dtype each autocast precision computes in.
AUTOCAST_DTYPES = {"bf16": "bfloat16", "fp16": "float16"}


def autocasts(amp: tuple[str, ...], workload: Workload | None) -> tuple[str, ...]:
    """The ``amp`` values ``workload``'s model can train in: every one for a float32 model; none but ``off`` for one
    wholly in float64; no ``fp16`` for one with 16-bit parameters (:func:`autocast_refusal`)."""
    return tuple(a for a in amp if a == "off" or not autocast_refusal(a, workload))


def autocast_refusal(amp: str, workload: Workload | None) -> str:
    """Why ``amp`` (an autocast) does not suit ``workload``'s model, or "" where it does."""
    dtypes = set(workload.precision.split("+")) if workload is not None and workload.precision is not None else set()
    if dtypes == {"float64"}:
        return f"the Task's model is in float64, which autocast leaves alone: amp={amp} would compute as amp=off"
    if amp == "fp16" and dtypes & {"float16", "bfloat16"}:
        return f"the Task's model has {workload.precision if workload else ''} parameters, whose gradients fp16's GradScaler cannot unscale"
    return ""


#: Said of a Task whose factory returns a compiled model.
COMPILED = "the Task's factory returns a model torch.compile wraps, which compiles in every setup (compile=off included)"


def compiled_note(workload: Workload | None) -> str:
    """best.json's note for a Task whose factory compiles its model (empty for one that does not)."""
    return f"{COMPILED}: the search did not measure compiling against eager" if workload is not None and workload.compiled else ""


def precision_note(workload: Workload | None) -> str:
    """What the setups' ``fp32`` means for a Task's model not in float32 (empty for one that is)."""
    if workload is None or workload.precision is None:
        return ""
    return f"the Task's model is in {workload.precision}: fp32 in a setup's name means no autocast (the model's own dtype)"


def check_workload_constraints(constraints: dict[str, Constraint], workload: Workload | None, device: DeviceInfo) -> None:
    """Refuse ``--set`` values of the torch knobs that this workload cannot use (the device is checked elsewhere).

    Raises:
        UsageError: cuDNN autotuning for batches of varying shapes, GPU decoding
            of a Task's data, an optimizer kernel for a Task's own optimizer,
            more than one loader worker for a stream every worker yields whole.
    """
    if workload is None:
        return

    def asks(knob: str, value: Any) -> bool:
        constraint = constraints.get(knob)
        return constraint is not None and (
            constraint.allows(value) if constraint.low is None and constraint.high is None else False
        )

    if not workload.fixed_shapes and asks("cudnn_benchmark", True):
        raise UsageError("--set cudnn_benchmark=true: this workload's batches change shape; cuDNN would re-tune every step")
    if workload.task is not None and asks("decode", "gpu"):
        raise UsageError("--set decode=gpu: GPU JPEG decoding applies to --model/--data image folders, not to a Task")
    if workload.unsharded and any(asks("num_workers", n) for n in range(2, 1025)):
        raise UsageError(f"--set num_workers: {UNSHARDED}; use 0 or 1, or shard it (docs/workloads.md)")
    amp = constraints.get("amp")
    if amp is not None and not any(amp.allows(a) for a in autocasts(("off", *AUTOCAST_DTYPES), workload)):  # only refused ones
        asked = next(a for a in AUTOCAST_DTYPES if amp.allows(a))
        suits = autocasts(("off", "bf16", "fp16") if device.type == "cuda" else ("off", "bf16"), workload)
        raise UsageError(f"--set amp={asked}: {autocast_refusal(asked, workload)}; use " + " or ".join(f"amp={a}" for a in suits))
    if workload.compiled and any(asks("compile", mode) for mode in COMPILE_MODES if mode != "off"):
        raise UsageError(f"--set compile: {COMPILED}; return the plain module to let the search measure compiling against eager")
    if workload.own_optimizer and any(asks("optimizer_impl", impl) for impl in OPTIMIZER_IMPLS):
        raise UsageError("--set optimizer_impl: the Task brings its own optimizer factory; set foreach/fused there")
