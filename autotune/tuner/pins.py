"""``--set`` pins checked before anything is measured: those with nothing to act on, and the DDP knobs' values.

A pin the device, the workload or the other pins leave without effect is refused before the calibration: refused
after it, the search left a study that the corrected command could not reuse (its ``--set`` differs).
"""

from __future__ import annotations

from typing import Any

from autotune.errors import UsageError
from autotune.tuner.constraints import Constraint, allows_workers

__all__ = ["check_pins_act", "ddp_values", "threads_over_cores"]


def check_pins_act(constraints: dict[str, Constraint], image_input: bool | None, world_size: int = 1) -> None:
    """Refuse a ``--set`` pin that has nothing to act on.

    ``channels_last=true`` for a workload whose batches hold no 4-D floating
    tensor; ``prefetch_factor`` or ``persistent_workers`` with ``num_workers``
    pinned to 0 (the DataLoader uses them only with workers); a DDP knob
    (``bucket_cap_mb``, ``gradient_as_bucket_view``, ``static_graph``) away
    from PyTorch's default in a search of one rank; ``static_graph=true`` with
    ``accumulation_steps`` pinned above 1 (before the calibration, not after it:
    a refusal after it left a study the corrected command could not reuse).
    ``image_input`` None: the workload is not built yet (the pins that need no
    workload are said before its import and checks, seconds to minutes).

    Raises:
        UsageError: The first such pin.
    """
    pinned = constraints.get("channels_last")
    if image_input is False and pinned is not None and pinned.allows(True) and not pinned.allows(False):
        raise UsageError("--set channels_last=true: this workload's batches hold no 4-D floating tensor for it to act on")
    if not allows_workers(constraints.get("num_workers")):
        for knob in ("prefetch_factor", "persistent_workers"):
            if knob in constraints:
                raise UsageError(f"--set {knob}: the DataLoader uses it only with workers, and --set num_workers=0 leaves none")
    for knob, (default,) in ddp_values(1).items() if world_size <= 1 else ():  # first: the pair below needs DDP to matter
        pin = constraints.get(knob)
        if pin is not None and not pin.allows(default):
            raise UsageError(f"--set {knob}: a DDP knob; it changes nothing in a search of one process "
                             "(search with --nproc-per-node 2 or more)")
    steps, static = constraints.get("accumulation_steps"), constraints.get("static_graph")
    if static is not None and not static.allows(False) and steps is not None and not steps.allows(1):
        raise UsageError(f"--set static_graph=true does not work with accumulation_steps > 1 (DDP's no_sync breaks its reducer), "
                         f"and --set {steps} allows no step of one micro-batch")


def ddp_values(world_size: int) -> dict[str, tuple[Any, ...]]:
    """The DDP knobs' candidates: searched with more than one rank, PyTorch's defaults otherwise."""
    if world_size > 1:
        return {"bucket_cap_mb": (10, 25, 50, 100), "gradient_as_bucket_view": (False, True), "static_graph": (False, True)}
    return {"bucket_cap_mb": (25,), "gradient_as_bucket_view": (False,), "static_graph": (False,)}


def threads_over_cores(pin: Constraint | None, cores: int) -> str | None:
    """A warning for a ``--set num_threads`` that allows more training threads than the ``cores`` one trial process
    has (its rank's share with several). Searched as given, as a pin may step outside the computed range, but the
    threads then take turns on the cores. None otherwise."""
    if pin is None:
        return None
    if pin.low is not None or pin.high is not None:
        over = f"up to {pin.high}" if pin.high is not None and pin.high > cores else None
    else:
        counts = sorted({n for n in (pin.choices if pin.choices is not None else (pin.value,)) if n is not None and n > cores})
        over = ", ".join(map(str, counts)) if counts else None
    if over is None:
        return None
    return (f"--set {pin}: {over} training threads on the {cores} CPU core(s) a trial process has take turns on them, "
            f"usually slower than {cores}; searched as given")
