"""What names a study and what must match for a stored study to be resumed (or joined by another worker)."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from autotune.devices import DeviceInfo
from autotune.errors import AutotuneError, UsageError
from autotune.records import Workload
from autotune.tuner.config import SearchConfig
from autotune.tuner.constraints import Constraint, merge_constraints, parse_constraint
from autotune.tuner.space import space_version
from autotune.units import format_bytes
from autotune.workloads.data import SYNTHETIC_IMAGES_CPU, SYNTHETIC_IMAGES_CUDA


def study_name(config: SearchConfig, device: DeviceInfo, workload: Workload | None = None) -> str:
    """The default study name: model and image size (or the workload factory), device (and pinned effective batch)."""
    if workload is not None and workload.task is not None:
        name = f"{workload.task.replace(':', '.')}-{device.name.replace(':', '')}"
    else:
        name = f"{config.model.replace(':', '.')}-{config.image_size}px-{device.name.replace(':', '')}"
    if config.effective_batch:
        name += f"-eb{config.effective_batch}"
    return name


def signature(config: SearchConfig, workload: Workload, machine: dict[str, Any] | None = None, parallel_trials: int = 1) -> dict[str, Any]:
    """What must match for a stored study to be resumed by this search (``machine``: its fingerprint; ``parallel_trials``:
    trials run at once, ``--devices``, each on its share of the cores beside the others)."""
    task = {"task": workload.task} if workload.task is not None else {}
    return {
        **task,
        **(machine or {}),
        "timeout_s": config.timeout_s,
        "model": workload.model,
        "image_size": workload.image_size,
        "data": workload.data,
        "synthetic_images": workload.synthetic_images if workload.data is None else None,
        "device": workload.device,
        "effective_batch": config.effective_batch,
        "max_memory": config.max_memory,
        "trial_seconds": config.trial_seconds,
        "constraints": sorted(str(c) for c in config.constraints),  # as --set writes them
        "space": space_version(config.effective_batch),
        **({"nproc_per_node": config.nproc_per_node} if config.nproc_per_node > 1 else {}),
        "parallel_trials": parallel_trials,
        # The data's size bounds the space (batches, loader queues); a Task's model is told by its size.
        "samples": workload.images,
        **({"parameters": workload.parameters} if workload.parameters is not None else {}),
        # Not float32 (a float64 model): the amp values differ; a study of a version that did not read it ran bf16 there.
        **({"precision": workload.precision} if workload.precision is not None else {}),
        # A Task's batch_size is the PyTorch defaults' batch: a study whose defaults ran another has no baseline for this one.
        **({"batch_size": workload.reference_batch} if workload.reference_batch is not None else {}),
    }


def described_workload(signature: Any) -> str | None:
    """What a stored search signature says the search trains, in the words of :meth:`Workload.describe`.

    Args:
        signature: What a study stores of its search (:func:`signature`).

    Returns:
        One line (model, image size, device and data; a Task's reference, device and samples),
        or None where the study stores no signature or one that says too little.
    """
    if not isinstance(signature, dict) or not isinstance(signature.get("model"), str) or not isinstance(signature.get("device"), str):
        return None
    task, data, samples = signature.get("task"), signature.get("data"), signature.get("samples")
    # A Task's data is its own: its line names no image size (the record's default stands in, unread).
    size: Any = signature.get("image_size") if task is None else Workload.image_size
    try:
        workload = Workload(model=signature["model"], image_size=size, device=signature["device"], task=task if isinstance(task, str) else None,
                            data=data if isinstance(data, str) else None, images=samples if isinstance(samples, int) else None)
    except (AutotuneError, TypeError, ValueError):  # an image size this version cannot read
        return None
    ranks = signature.get("nproc_per_node")
    return workload.describe(ranks if isinstance(ranks, int) and not isinstance(ranks, bool) else 1)  # its samples: a rank's share


def machine_fingerprint(hardware: Any, device: Any) -> dict[str, Any]:
    """What makes measurements of one machine incomparable with another's:
    CPU and GPU model, usable cores, torch and CUDA versions (part of the
    search signature, so a study on a shared filesystem is not resumed on
    another node)."""
    software = hardware.to_dict().get("software", {})
    return {
        "cpu_model": str(getattr(hardware.cpu, "model", "")),
        "usable_cores": int(hardware.cpu.usable_cores),
        "device_model": str(getattr(device, "label", "")),
        "torch": software.get("torch"),
        "cuda": software.get("cuda"),
    }


#: How earlier studies stored a ``--set`` constraint: the dataclass's repr.
_REPR = re.compile(r"Constraint\(knob='(?P<knob>\w+)', value=(?P<value>.*), choices=(?P<choices>.*), low=(?P<low>.*), high=(?P<high>.*)\)")


def _as_set(entry: Any) -> Any:
    """A stored constraint as ``--set`` writes it (an older study stored its repr)."""
    found = _REPR.fullmatch(entry) if isinstance(entry, str) else None
    if found is None:
        return entry
    try:
        parts = {name: ast.literal_eval(text) for name, text in found.groupdict().items() if name != "knob"}
        return str(Constraint(found["knob"], **parts))
    except (ValueError, SyntaxError):
        return entry


def stored_constraints(signature: Any) -> dict[str, Constraint] | None:
    """The ``--set`` constraints of a stored search signature, by knob.

    Args:
        signature: What a study stores of its search (:func:`signature`).

    Returns:
        The constraints (empty: no ``--set``), or None where the study stores none that
        this version can read (no signature, or an entry it cannot parse).
    """
    entries = signature.get("constraints") if isinstance(signature, dict) else None
    if not isinstance(entries, list) or not all(isinstance(entry, str) for entry in entries):
        return None
    try:
        return merge_constraints(parse_constraint(_as_set(entry)) for entry in entries)
    except UsageError:
        return None


#: Signature keys that studies of earlier versions did not store: such a study resumes without them.
_ADDED = ("samples", "parameters", "batch_size", "parallel_trials")
#: The value of a signature key that is stored only when it is not the default.
_ABSENT: dict[str, Any] = {"nproc_per_node": 1}


#: What a signature's null means, by key (``timeout_s: None there, 30.0 now`` read as a timeout of None).
_NULL_MEANS = {"timeout_s": "the default", "max_memory": "the default (half the RAM)", "effective_batch": "none pinned",
               "data": "synthetic JPEGs", "precision": "float32 (or not read: an earlier autotune version)"}


#: A signature key in the user's words: the flag that sets it, or what it reads (``timeout_s`` was said as is).
_LABELS = {"timeout_s": "--timeout", "trial_seconds": "--trial-seconds", "max_memory": "--max-memory", "image_size": "--image-size",
           "effective_batch": "--effective-batch", "nproc_per_node": "--nproc-per-node", "data": "--data", "device": "--device",
           "model": "--model", "task": "--workload", "synthetic_images": "--synthetic-images", "parallel_trials": "trials at once (--devices)",
           "samples": "samples in the data", "parameters": "the model's parameters", "batch_size": "the Task's batch_size",
           "precision": "the model's precision", "cpu_model": "CPU", "usable_cores": "usable CPU cores", "device_model": "device model",
           "torch": "torch version", "cuda": "CUDA version"}


def _said_value(key: str, value: Any) -> str:
    if value is None and key in _NULL_MEANS:
        return _NULL_MEANS[key]
    return format_bytes(value) if key == "max_memory" and isinstance(value, int) else repr(value)  # not 4294967296


def _said(constraints: Any) -> str:
    return " ".join(f"--set {c}" for c in constraints or ()) or "no --set"


def signature_difference(stored: dict[str, Any], current: dict[str, Any]) -> str | None:
    """The first setting where two search signatures differ, in words; None if equal."""
    normalized = json.loads(json.dumps(current))
    normalized = {k: v for k, v in normalized.items() if k in stored or k not in _ADDED}  # an older study's signature lacks them
    if isinstance(stored.get("constraints"), list):
        stored = {**stored, "constraints": sorted(_as_set(c) for c in stored["constraints"])}
    if stored == normalized:
        return None
    counts = stored.get("synthetic_images"), normalized.get("synthetic_images")
    others = {k for k in set(stored) | set(normalized) if stored.get(k) != normalized.get(k)} - {"synthetic_images", "samples"}
    if not others and all(isinstance(n, int) for n in counts) and counts[0] != counts[1]:  # the flag alone continues it
        return (f"synthetic JPEGs: {counts[0]} there, {counts[1]} now; --synthetic-images {counts[0]} continues it "
                f"(without it: {SYNTHETIC_IMAGES_CPU} on a CPU, {SYNTHETIC_IMAGES_CUDA} on CUDA)")
    for key in sorted(set(stored) | set(normalized)):
        if stored.get(key) != normalized.get(key):
            if key == "constraints":
                return f"{_said(stored.get(key))} there, {_said(normalized.get(key))} now"
            if key == "space":
                return f"space: {stored.get(key)!r} there, {normalized.get(key)!r} now: another autotune version sampled it"
            absent = _ABSENT.get(key)  # a key left out of a signature for its default
            there, now = (_said_value(key, side.get(key, absent)) for side in (stored, normalized))
            label = "--workload" if key == "model" and ("task" in stored or "task" in normalized) else _LABELS.get(key, key)  # a Task's
            return f"{label}: {there} there, {now} now"
    return "settings differ"
