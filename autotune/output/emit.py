"""Render the winner of a search as a standalone, DDP-ready ``train.py``.

The script is rendered from ``templates/train.py.tmpl`` (or ``train_task.py.tmpl`` for a Task; the code both
share is in ``shared.py.tmpl``) with :class:`string.Template`. Nothing from ``best.json`` is pasted into code as
raw text: every value is type-checked and written as a Python literal with
``repr()``; the model reference must be made of identifiers; text that ends up
in the header comment has its line breaks and other unprintable characters
escaped. The rendered code is compiled before it is returned.

Example::

    from autotune.output.best import read_best
    from autotune.output.emit import write_script

    write_script(read_best("autotune-out"), "autotune-out/train.py")
"""

from __future__ import annotations

import math
import os
import re
import string
from importlib import resources
from pathlib import Path
from typing import Any

from autotune.devices import device_type
from autotune.errors import AutotuneError, EmitError
from autotune.files import atomic_write_text
from autotune.output.best import DEFAULTS_KEPT, Best, search_thread_env, write_best
from autotune.records import LR_SCALINGS
from autotune.redact import hide_passwords, shell_quote
from autotune.torch_knobs import COMPILE_MODES, DECODES, OPTIMIZER_IMPLS
from autotune.train_setup import AMP_MODES
from autotune.units import counted
from autotune.workloads.data import synthetic_dir
from autotune.workloads.folders import SPLITS, SYSTEM_FOLDERS
from autotune.workloads.models import validate_model_ref
from probes.cpu import BF16_FLAGS

__all__ = ["render_script", "write_script", "write_winner"]

_TEMPLATE = "train.py.tmpl"
#: The template for a user's Task workload (the factory is imported, its loss/step and optimizer used).
_TASK_TEMPLATE = "train_task.py.tmpl"
_DEVICE_TYPES = ("cpu", "cuda")
#: Code both templates share: its ``# @section NAME`` parts replace the templates' ``# @shared NAME`` lines.
_SHARED = "shared.py.tmpl"
_SECTION = "\n# @section "
_INCLUDE = "# @shared "


# ------------------------------------------------------------ literal checks
def _int(name: str, value: Any, minimum: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int):
        raise EmitError(f"cannot emit train.py: {name} must be an integer, got {value!r}")
    if value < minimum:
        raise EmitError(f"cannot emit train.py: {name} must be >= {minimum}, got {value}")
    return repr(value)


def _optional_int(name: str, value: Any, minimum: int) -> str:
    return "None" if value is None else _int(name, value, minimum)


def _bool(name: str, value: Any) -> str:
    if not isinstance(value, bool):
        raise EmitError(f"cannot emit train.py: {name} must be true or false, got {value!r}")
    return repr(value)


def _float(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise EmitError(f"cannot emit train.py: {name} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise EmitError(f"cannot emit train.py: {name} must be a finite number > 0, got {value!r}")
    return repr(float(value))


def _str(name: str, value: Any) -> str:
    """A string as a Python literal; repr() escapes quotes, backslashes and line breaks."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str):
        raise EmitError(f"cannot emit train.py: {name} must be a string, got {value!r}")
    return repr(value)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise EmitError(f"cannot emit train.py: {name} must be one of {', '.join(choices)}, got {value!r}")
    return repr(value)


def _script_device(device: Any) -> str:
    """The script's ``--device`` default: ``cpu``, ``cuda`` (``cuda:0``: rank K on ``cuda:K`` under torchrun) or the
    ``cuda:K`` a search on another GPU ran on (its script trained on ``cuda:0``, beside the job the user avoided)."""
    if isinstance(device, str) and re.fullmatch(r"cuda:[1-9][0-9]*", device):
        return repr(device)
    return _choice("device", device_type(device) if isinstance(device, str) else device, _DEVICE_TYPES)


def _comment_text(value: Any) -> str:
    """Text safe inside a ``#`` comment: unprintable characters (line breaks too) escaped."""
    text = str(value)
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)


# --------------------------------------------------------------- the header
def _hardware_summary(hardware: dict[str, Any]) -> str:
    """CPU model and GPU names from the probe summary in best.json."""
    parts: list[str] = []
    cpu = hardware.get("cpu")
    if isinstance(cpu, dict) and cpu.get("model"):  # a hand-edited best.json may hold anything there: it is a comment only
        cores = cpu.get("usable_cores")
        parts.append(f"{cpu['model']} ({counted(cores, 'usable core')})" if isinstance(cores, int) else str(cpu["model"]))
    gpus = hardware.get("gpus")
    names = [str(g["name"]) for g in gpus if isinstance(g, dict) and g.get("name")] if isinstance(gpus, list) else []
    if names:
        each = {name: names.count(name) for name in dict.fromkeys(names)}
        parts.append(", ".join(f"{n} x {name}" if n > 1 else name for name, n in each.items()))
    return "; ".join(parts) or "unknown (no probe summary in best.json)"


def _header(best: Best, data_is_synthetic: bool) -> str:
    workload, setup = best.workload, best.setup
    if workload.task is not None:
        share = " per rank" if best.world_size > 1 else ""
        size = f"{counted(workload.images, 'sample')}{share}" if workload.images is not None else "an iterable dataset"
        tuned = f"Tuned for: workload {workload.task} (autotune.Task) on {workload.device}, {size}"
    else:
        tuned = f"Tuned for: {workload.model} at {workload.image_size} px on {workload.device}, " + (
            "synthetic JPEG data" if data_is_synthetic else f"data {workload.data}"
        )
    lines = [
        tuned,
        f"Hardware: {_hardware_summary(best.hardware if isinstance(best.hardware, dict) else {})}",
        (
            f"{'Workload' if workload.task is not None else 'Model'}: imports {workload.model} (module:function) "
            "from your code; run this script where that import works (the search's directory is added to sys.path)"
            if ":" in workload.model
            else f"Model: torchvision.models.{workload.model}"
        ),
        f"Setup: {setup.describe()}",
        f"  num_workers={setup.num_workers} prefetch_factor={setup.prefetch_factor} "
        f"pin_memory={setup.pin_memory} persistent_workers={setup.persistent_workers}",
        f"  batch_size={setup.batch_size} accumulation_steps={setup.accumulation_steps} "
        f"amp={setup.amp} channels_last={setup.channels_last}",
        f"  num_threads={setup.num_threads} compile={setup.compile} cudnn_benchmark={setup.cudnn_benchmark} "
        f"tf32={setup.tf32} optimizer_impl={setup.optimizer_impl} decode={setup.decode}",
    ]
    if best.world_size > 1:
        lines.append(
            f"  bucket_cap_mb={setup.bucket_cap_mb} gradient_as_bucket_view={setup.gradient_as_bucket_view} "
            f"static_graph={setup.static_graph}"
        )
        lines.append(f"Run: {run_command(best)} (measured with {best.world_size} processes on one node)")
    spread = f" (spread {best.samples_per_s_spread:.1f})" if best.samples_per_s_spread else ""
    measured = f"Measured: {best.samples_per_s:.1f} samples/s{spread}"
    if best.defaults_won:
        measured += f": {DEFAULTS_KEPT}"
    elif best.defaults_samples_per_s:
        measured += f"; PyTorch defaults {best.defaults_samples_per_s:.1f} samples/s"
    if best.speedup and not best.defaults_won:  # not winner / defaults when confirmed: the median of the paired ratios
        how = best.speedup_basis
        measured += f"; speedup {best.speedup:.2f}x ({how})"
    lines.append(measured)
    rule = {"sqrt": "scaled by the square root of the batch ratio", "linear": "scaled linearly with the batch"}.get(workload.lr_scaling)
    rule, scales = (rule, "the script scales it for the processes it runs with") if rule else ("kept at every batch", "the script keeps it")
    lines.append(
        f"Learning rate: {workload.lr:g} at effective batch {best.reference_batch}, {rule} "
        f"(effective batch {best.effective_batch} with {best.world_size} process{'es' if best.world_size > 1 else ''} -> lr {best.lr:g}; "
        f"{scales})"
    )
    if best.command:
        lines.append(f"Command: {hide_passwords(best.command)}")
    if best.created:
        lines.append(f"Created: {best.created}")
    for note in best.notes:
        lines.append(f"Note: {note}")
    return "\n".join("# " + _comment_text(line) for line in lines)


# ---------------------------------------------------------------- rendering
def _template(name: str = _TEMPLATE) -> string.Template:
    """The script template, with the code both scripts share (``shared.py.tmpl``) put in place."""
    folder = resources.files("autotune.output.templates")
    text = folder.joinpath(name).read_text(encoding="utf-8")
    for section in folder.joinpath(_SHARED).read_text(encoding="utf-8").split(_SECTION)[1:]:
        section_name, _, code = section.partition("\n")
        marker = f"{_INCLUDE}{section_name}\n"
        if marker not in text:
            raise EmitError(f"template {name} lacks {marker.strip()!r}")  # pragma: no cover - a packaging defect
        text = text.replace(marker, code.rstrip("\n") + "\n")
    return string.Template(text)


def _values(best: Best) -> dict[str, str]:
    if not isinstance(best, Best):
        raise EmitError(f"cannot emit train.py from {type(best).__name__}; expected a Best")
    workload, setup = best.workload, best.setup
    try:
        model = validate_model_ref(workload.model)
    except AutotuneError as exc:
        raise EmitError(f"cannot emit train.py: {exc}") from None
    if workload.task is not None:
        data = "None"
        synthetic = False
    elif workload.data is not None:
        data = _str("data", workload.data)
        synthetic = False
    else:
        if workload.cache_dir is not None and not isinstance(workload.cache_dir, (str, os.PathLike)):
            raise EmitError(f"cannot emit train.py: cache_dir must be a string, got {workload.cache_dir!r}")
        _int("synthetic_images", workload.synthetic_images, 16)
        data = _str("data", os.path.abspath(synthetic_dir(workload.cache_dir, workload.synthetic_images)))
        synthetic = True
    if not isinstance(workload.sys_path, (tuple, list)):
        raise EmitError(f"cannot emit train.py: sys_path must be a list of paths, got {workload.sys_path!r}")
    factory_paths = "[" + ", ".join(_str("sys_path entry", p) for p in workload.sys_path) + "]"
    device = _script_device(workload.device)
    values = {
        "autotune_version": _autotune_version(),
        "data": data,
        "model": repr(model),
        "image_size": _int("image_size", workload.image_size, 1),
        "device": device,
        "batch_size": _int("batch_size", setup.batch_size, 1),
        "accumulation_steps": _int("accumulation_steps", setup.accumulation_steps, 1),
        "num_workers": _int("num_workers", setup.num_workers, 0),
        "prefetch_factor": _optional_int("prefetch_factor", setup.prefetch_factor, 1),
        "pin_memory": _bool("pin_memory", setup.pin_memory),
        "persistent_workers": _bool("persistent_workers", setup.persistent_workers),
        "amp": _choice("amp", setup.amp, AMP_MODES),
        "channels_last": _bool("channels_last", setup.channels_last),
        "num_threads": _optional_int("num_threads", setup.num_threads, 1),
        "num_threads_shown": "auto" if setup.num_threads is None else str(setup.num_threads),
        "compile": _choice("compile", setup.compile, COMPILE_MODES),
        "cudnn_benchmark": _bool("cudnn_benchmark", setup.cudnn_benchmark),
        "tf32": _bool("tf32", setup.tf32),
        "optimizer_impl": repr("auto") if setup.optimizer_impl is None else _choice("optimizer_impl", setup.optimizer_impl, OPTIMIZER_IMPLS),
        "decode": _choice("decode", setup.decode, DECODES),
        "bucket_cap_mb": _int("bucket_cap_mb", setup.bucket_cap_mb, 1),
        "gradient_as_bucket_view": _bool("gradient_as_bucket_view", setup.gradient_as_bucket_view),
        "static_graph": _bool("static_graph", setup.static_graph),
        "lr": _float("lr", workload.lr),
        "lr_scaling": _choice("lr_scaling", workload.lr_scaling, LR_SCALINGS),
        "reference_batch": _int("reference_batch", best.reference_batch, 1),
        "world_size": _int("world_size", best.world_size, 1),
        "thread_env": repr(search_thread_env(best)),
        "torch_threads": repr(best.torch_threads),
        "factory_paths": factory_paths,
        "unsharded": _bool("unsharded", workload.unsharded),
        "workload": repr(model if workload.task is None else _task_ref(workload.task)),
        "bf16_flags": repr(tuple(BF16_FLAGS)),
        "split_names": repr(tuple(sorted(SPLITS))),
        "system_folders": repr(tuple(sorted(SYSTEM_FOLDERS))),
    }
    # Numbers only reach the header comment, but a NaN there would still mislead.
    for name in ("samples_per_s", "samples_per_s_spread", "defaults_samples_per_s", "speedup", "lr"):
        value = getattr(best, name)
        if value is None and name in ("defaults_samples_per_s", "speedup"):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise EmitError(f"cannot emit train.py: {name} must be a finite number, got {value!r}")
    _int("effective_batch", best.effective_batch, 1)
    values["header"] = _header(best, synthetic)
    return values


def _task_ref(ref: Any) -> str:
    try:
        return validate_model_ref(ref) if isinstance(ref, str) and ":" in ref else validate_model_ref("")
    except AutotuneError:
        raise EmitError(f"cannot emit train.py: workload {ref!r} is not package.module:function") from None


def _autotune_version() -> str:
    from autotune._version import __version__

    return _comment_text(__version__)


def script_target(path: str | Path, flag: str = "--output") -> Path:
    """Where :func:`write_script` writes for ``path`` (a directory, or a path ending in ``/``, gets ``train.py``),
    checked before anything runs.

    Raises:
        EmitError: A parent is a file, the target is a file autotune did not write (the user's own train.py), or it is
            no regular file (a device such as ``/dev/null``, a FIFO), which writing by an atomic rename would replace.
    """
    target = Path(path)
    if target.is_dir() or str(path).endswith(("/", os.sep)):  # a directory, or one named with its slash, still to be made
        target = target / "train.py"
    blocker = next((d for d in (target.parent, *target.parent.parents) if d.exists() and not d.is_dir()), None)
    if blocker is not None:  # mkdir would say only "File exists"
        raise EmitError(f"cannot write {target}: {blocker} is a file, not a directory")
    if target.exists() and not target.is_file():  # /dev/null, a FIFO, a socket: the atomic rename would replace it
        raise EmitError(f"{target} exists and is not a regular file: not overwritten (pass another {flag})")
    if target.is_file() and not _written_by_autotune(target):  # best.json, study.db, the user's own train.py
        raise EmitError(f"{target} exists and is not a script written by autotune: not overwritten (pass another {flag})")
    return target


def run_command(best: Best, script: str | Path = "train.py") -> str:
    """The command that runs the emitted script with the world size it was measured with."""
    if best.world_size > 1:
        return f"torchrun --nproc_per_node {best.world_size} {shell_quote(str(script))}"
    return f"python {shell_quote(str(script))}"


def render_script(best: Best) -> str:
    """The text of a standalone ``train.py`` for ``best``.

    Args:
        best: The search result (``best.json``) to render.

    Returns:
        Python source that imports only torch, torchvision and the standard
        library (for a Task workload: torch and the workload's factory);
        every flag defaults to the tuned value.

    Raises:
        EmitError: A value in ``best`` cannot be rendered safely (a model
            reference that is not ``name`` or ``module:function``, an unknown
            amp mode or device, a non-integer knob, ...).
    """
    values = _values(best)
    try:
        text = _template(_TASK_TEMPLATE if best.workload.task is not None else _TEMPLATE).substitute(values)
    except (KeyError, ValueError) as exc:  # a template bug, not a user error
        raise EmitError(f"cannot emit train.py: template error: {exc}") from None
    try:
        compile(text, "train.py", "exec")
    except SyntaxError as exc:
        raise EmitError(f"cannot emit train.py: rendered code does not compile: {exc.msg} (line {exc.lineno})") from None
    return text


def _written_by_autotune(path: Path) -> bool:
    """Whether ``path`` starts as every emitted script does (its second line names autotune)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(200).split(b"\n")
    except OSError:
        return False
    return len(head) > 1 and head[1].startswith(b"# train.py -- written by autotune ")


def write_winner(best: Best, out: Path) -> tuple[str, str]:
    """Write ``out/train.py``, then ``out/best.json`` (a script that cannot be rendered leaves no new best.json).

    Returns:
        The two paths written, best.json first.

    Raises:
        EmitError: The script cannot be rendered, or either file cannot be written (a full disk).
    """
    write_script(best, out / "train.py", flag="--out")  # the search's flag
    try:
        write_best(out / "best.json", best)
    except OSError as exc:
        raise EmitError(f"cannot write {out / 'best.json'}: {exc.strerror or exc}") from None
    return str(out / "best.json"), str(out / "train.py")


def _holds_text(path: Path, text: str) -> bool:
    """Whether the regular file ``path`` holds ``text`` exactly (False when it cannot be read)."""
    try:
        return path.is_file() and path.read_text(encoding="utf-8") == text
    except (OSError, UnicodeDecodeError):
        return False


def write_script(best: Best, path: str | Path, *, flag: str = "path") -> Path:
    """Render ``train.py`` and write it atomically, executable.

    Args:
        best: The search result to render.
        path: The file to write (an existing directory gets ``train.py`` inside
            it). Missing parent directories are created.
        flag: What a refusal to overwrite a file asks for another of (the CLI's ``--output``; a Python caller's path).

    Returns:
        The path written.

    Raises:
        EmitError: The script cannot be rendered or written.
    """
    text = render_script(best)
    target = script_target(path, flag)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        if not _holds_text(target, text):  # the same script already there is kept: a full disk has no room for a copy
            atomic_write_text(target, text)
        target.chmod(0o755)
    except OSError as exc:
        raise EmitError(f"cannot write {target}: {exc.strerror or exc}") from None
    return target
