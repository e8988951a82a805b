"""Which side limits the winner: the loader, the training step, or both sharing the CPU cores.

The one-line verdict of a search, from the winner's confirmed median beside its own ceilings (computing alone, loading
alone, measured right after the confirmation) or, without them, the calibration's.
"""

from __future__ import annotations

from autotune.devices import DeviceInfo
from autotune.epochs import queue_fits
from autotune.output.best import Best
from autotune.records import Calibration, TrialRecord
from autotune.rounds import Ceilings
from autotune.tuner.loader_ceiling import more_to_load, workers_broken
from autotune.tuner.study import ROLE_DEFAULTS

__all__ = ["UNCLEAR", "bottleneck_verdict"]

#: Training faster than this multiple of computing alone: the figures contradict each other.
UNCLEAR = 1.25


def _workers_said(records: list[TrialRecord], calibration: Calibration) -> str:
    """What the search knows of loader workers, for a winner without them: they failed here, lost, or were not tried."""
    tried = [r for r in records if r.setup.num_workers]
    if any(r.result.status in ("ok", "pruned") for r in tried):
        return "the setups with workers the search measured were not faster here"
    if workers_broken(list(calibration.loader), None) is not None:
        then = "and so did every search trial that had them" if tried else "so the search tried none"
        return f"but they failed here in the calibration's loader-only runs, {then}: its lines say why"
    if tried:
        return "but every search trial that had them failed: its lines say why"
    return "no setup with workers was measured"


def _held_by_the_epoch(best: Best, calibration: Calibration) -> str:
    """Why an input-bound winner has fewer loader workers than the machine offers, when one epoch of the data held its
    queue (one more worker's batch would not fit): the data's size, not the cores, set the limit; else empty. Under DDP
    each rank's loader reads its share of the samples."""
    setup, images, world = best.setup, best.workload.images, max(1, best.world_size)
    share = best.workload.rank_share(world).images
    if images is None or share is None or setup.num_workers == 0 or setup.num_workers >= calibration.max_workers:
        return ""
    if queue_fits(setup.num_workers + 1, 1, setup.batch_size, share):
        return ""
    of = f"its {images} samples" if world == 1 else f"one rank's {share} samples ({images} over {world} ranks)"
    return (f"; here the data's size held the loader to {setup.num_workers} worker{'s' if setup.num_workers != 1 else ''}: "
            f"a queue of {setup.num_workers + 1} workers x batch {setup.batch_size} would hold more than one epoch of "
            f"{of}, so a larger dataset (or a smaller batch) lets more workers feed it")


def bottleneck_verdict(
    best: Best, calibration: Calibration, records: list[TrialRecord], device: DeviceInfo, ceilings: Ceilings | None = None
) -> str:
    """Which side limits training: the loader, the device, or both sharing CPUs.

    With ``ceilings`` (the winner's own setup measured computing alone and
    loading alone right after its confirmation rounds, beside its median
    there) like is compared with like; without them the calibration's
    ceilings stand in, measured at a probe batch and precision.
    """
    if ceilings is not None and ceilings.together and ceilings.compute and ceilings.loader:
        compute, loader, together = ceilings.compute, ceilings.loader, ceilings.together
        wait = ceilings.data_wait_fraction
        facts = (
            f"at the winner's setup: compute alone {compute:.0f} samples/s; loader alone {loader:.0f} samples/s, "
            f"both right after the confirmation; together {together:.0f} samples/s, "
            f"{'its confirmed median' if best.confirmed else 'one run beside them'}"
        )
    else:
        winner = next((r for r in records if r.setup == best.setup and r.result.ok), None)
        wait = winner.result.data_wait_fraction if winner else None
        # The calibration's figures nearest the winner's setup: its precision and layout, at most its workers (the best
        # of them all would name a setting --set excluded); both at the probe batch.
        setup = best.setup
        compute = (point.samples_per_s if (point := calibration.precision_of(setup)) else None) or calibration.compute_samples_per_s or 0.0
        nearest = calibration.fastest_loader(within=setup.num_workers)
        loader, workers = (nearest.samples_per_s or 0.0, nearest.num_workers) if nearest is not None else (0.0, 0)
        together = best.samples_per_s
        parts = []
        if compute:
            parts.append(f"compute alone {compute:.0f} samples/s (calibration, batch {calibration.probe_batch})")
        if loader:
            parts.append(f"loader alone {loader:.0f} samples/s ({workers} worker{'s' if workers != 1 else ''})")
        parts.append(f"together {together:.0f} samples/s")
        facts = "; ".join(parts)
    images = best.workload.image_input and best.workload.task is None  # files the loader decodes (a Task's items may be tensors)
    own = ceilings is not None and bool(ceilings.together and ceilings.compute and ceilings.loader)  # like for like, as above
    # Training faster than either side alone names no limit: a ceiling measured low by a noisy run (DDP ranks' loader
    # runs on a busy machine ranged 100 to 25,000 samples/s).
    side = "computing alone" if compute and together > UNCLEAR * compute else "loading alone" if loader and together > UNCLEAR * loader else ""
    unclear = bool(side)
    elsewhere = side != "loading alone" and not own and calibration.probe_batch != best.setup.batch_size  # compute at another batch
    why = "compute alone was measured at another batch" if elsewhere else "the steps are too short or too noisy to compare"
    waited = wait is not None and wait > 0.2
    # Training at about the loader's own rate, well below computing alone: the loader is the limit even where the wait
    # read low (its workers' decoding slows the step on shared cores); a loader-only run of 1600x1200 JPEGs read 34
    # samples/s, computing alone 66, training 40, and the verdict said compute-bound.
    at_loader_rate = bool(device.type == "cpu" and best.setup.num_workers and compute and loader and together * UNCLEAR < compute
                          and loader <= UNCLEAR * together <= UNCLEAR * UNCLEAR * loader)
    if unclear and own and not (side == "loading alone" and waited):  # a ceiling below what it reached names no limit...
        return f"unclear: training measured faster than {side} ({facts}), so these figures name no limit; {why}."
    if waited or at_loader_rate:  # ... but the training itself waiting on the loader does (its short loader-only run read low)
        cheaper = ("Cheaper decoding (smaller stored images, fewer augmentations)" if images
                   else f"A cheaper dataset {'__iter__' if best.workload.iterable else '__getitem__'} or collate_fn "
                   "(tensors prepared once, not per item)")
        held = _held_by_the_epoch(best, calibration)  # then more cores would feed no more workers: not advised
        alone, fed = calibration.loader_rate(0), loader if own else calibration.loader_rate(best.setup.num_workers)  # the winner's workers
        tried = any(r.setup.num_workers == 0 and r.role != ROLE_DEFAULTS and r.result.status in ("ok", "pruned") for r in records)
        handover = (f" Loading in the training process measured faster than the winner's workers deliver ({alone:.0f} "
                    f"against {fed:.0f} samples/s: handing the items over costs more than making them), so "
                    "--set num_workers=0 searches that side." if best.setup.num_workers and alone and fed and alone > fed
                    and not tried else "")
        more = "" if held else more_to_load(best.setup.num_workers, best.hardware.get("cpu", {}).get("usable_cores"))
        if not best.setup.num_workers:  # the training process loads each batch itself: more cores would not feed it
            more = f" or loader workers, which overlap loading with training on spare cores ({_workers_said(records, calibration)})"
        how = (f"the winner waits on the DataLoader {wait:.0%} of the time" if waited else "training runs at about the loader's own rate, "
               "well below computing alone" + (f", though it waited on the DataLoader only {wait:.0%} of the time" if wait is not None else ""))
        return f"input-bound: {how} ({facts}). {cheaper}{more} would help{held}.{handover}"
    if device.type == "cpu" and compute and loader and together < 0.8 * min(compute, loader):
        if not best.setup.num_workers:  # one process loads, then trains: nothing ran side by side
            return (f"serial: without loader workers the training process {'decodes' if images else 'loads'} each batch and "
                    f"then trains on it ({facts}), so their times add up; workers would overlap the two on spare cores "
                    f"({_workers_said(records, calibration)}).")
        return (
            f"CPU-shared: {'decoding' if images else 'data loading'} and training compete for the same cores ({facts}); "
            "each alone is faster than both together."
        )
    if unclear:
        return f"unclear: training measured faster than {side} ({facts}), so these figures name no limit; {why}."
    if compute and together >= compute:  # a single short run of each: within the noise, not a contradiction (UNCLEAR)
        return (f"compute-bound: the training step is the limit ({facts}); training ran as fast as computing alone, "
                f"within the noise of these runs: the loader costs it nothing.")
    return f"compute-bound: the training step is the limit ({facts})."
