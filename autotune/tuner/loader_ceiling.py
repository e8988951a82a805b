"""The calibration's loader ceiling: the DataLoader alone, no model, per worker count.

Counts run from none up to the cores this process may use. Where the loader alone still falls short of what the
device consumes at every one of them, counts beyond the cores are measured too, doubling while each loads clearly
more than the last: a dataset whose items wait (network storage, a remote bucket, a database) rather than compute
keeps gaining from workers a CPU-bound one cannot use. The space then offers up to the count that loaded most.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from autotune.errors import WorkloadError
from autotune.records import LOADER_MARGIN, LoaderPoint, TrialOptions, TrialResult, Workload
from autotune.runner import TrialRunner
from autotune.runner.failures import SHM_COUNTED
from autotune.train_setup import TrainSetup
from autotune.tuner.batch_sizes import powers_of_two
from autotune.tuner.constraints import Constraint, allows
from autotune.units import counted
from autotune.workloads.streams import UNSHARDED

#: A count beyond the cores is kept only where it loads at least this many times what half as many loaded: a loader
#: bound by its own computing gains nothing there, one that waits nearly doubles.
BEYOND_CORES_GAIN = 1.3
#: Counts beyond the cores stop at this many workers per core.
MOST_PER_CORE = 8

Log = Callable[[str], None]


def loader_ceiling(
    subject: str,
    workload: Workload,
    runner: TrialRunner,
    options: TrialOptions,
    *,
    batch: int,
    cuda: bool,
    usable_cores: int,
    pinned: Iterable[Constraint],
    target: float | None,
    log: Log,
) -> tuple[list[LoaderPoint], int, str | None]:
    """Measure the loader alone at each worker count.

    Args:
        subject: The workload in words, for errors.
        workload: What is loaded.
        runner: The trial runner.
        options: The loader-only runs' options.
        batch: The batch they load.
        cuda: Whether the device is a GPU (pinned memory).
        usable_cores: The cores this process may use.
        pinned: The user's ``--set`` constraints (counts they exclude are not run).
        target: What the device consumes (compute-only samples/s), or None where unknown.
        log: Progress messages.

    Returns:
        The points measured, the largest worker count the space may offer, and the first error of a run with workers.

    Raises:
        WorkloadError: Loading alone in the main process failed: every trial would.
    """
    pinned = tuple(pinned)
    points: list[LoaderPoint] = []
    cap = usable_cores
    if workload.unsharded:  # a second worker would only add copies of the stream
        cap = min(usable_cores, 1)
        log(f"the dataset: {UNSHARDED}, so the search keeps num_workers <= 1")
    first_error: str | None = None

    def run(workers: int) -> TrialResult:
        nonlocal first_error
        setup = TrainSetup(batch_size=batch, num_workers=workers, prefetch_factor=2 if workers else None, pin_memory=cuda)
        result = runner(setup, workload, options)
        if workers == 0:
            _refuse_unloadable(subject, workload, result, batch)
        points.append(LoaderPoint(workers, result.status, result.samples_per_s))
        if workers > 0 and not result.ok and first_error is None:
            first_error = result.error
        log(f"loader only ({counted(workers, 'worker')}): {rate_text(result)}")
        return result

    for workers in sorted(n for n in {0, *powers_of_two(1, cap), cap} if n == 0 or allows(pinned, "num_workers", n)):
        result = run(workers)
        if target and result.ok and workers > 0 and (result.samples_per_s or 0) >= 2.0 * target:
            return points, cap, first_error  # far more than the device consumes: more workers cannot help
    if not target or workload.unsharded:
        return points, cap, first_error
    best = _rate_at(points, cap)
    while best and best < LOADER_MARGIN * target and 2 * cap <= MOST_PER_CORE * usable_cores:
        if not allows(pinned, "num_workers", 2 * cap):
            break
        if cap == usable_cores:
            log(f"the loader alone falls short of the device ({target:.1f} samples/s) with as many workers as cores: "
                "measuring more, for a dataset whose items wait rather than compute")
        result = run(2 * cap)
        if not result.ok or (result.samples_per_s or 0.0) < BEYOND_CORES_GAIN * best:
            break
        cap, best = 2 * cap, result.samples_per_s or 0.0
    return points, cap, first_error


def more_to_load(workers: int, usable_cores: object) -> str:
    """What else would feed an input-bound winner of ``workers`` loader workers: more CPU cores, or, where it has more
    workers than cores (a loader that waits, measured gaining from them), more workers still."""
    if isinstance(usable_cores, (int, float)) and 0 < usable_cores < workers:
        return (f" or more loader workers than its {workers} (its items wait: workers past the {usable_cores:g} cores kept "
                f"adding speed; --set num_workers={workers}..{4 * workers} measures more)")
    return " or more CPU cores"


def _rate_at(points: list[LoaderPoint], workers: int) -> float | None:
    """What the run of ``workers`` loaded, or None where it failed or did not run."""
    return next((p.samples_per_s for p in points if p.num_workers == workers and p.status == "ok"), None)


def outcome_text(result: TrialResult) -> str:
    """``ok``, or the status with its reason (``error (...)``)."""
    return result.status if result.ok or not result.error else f"{result.status} ({result.error})"


def rate_text(result: TrialResult) -> str:
    """``123.4 samples/s``, or the status with its reason."""
    if result.ok and result.samples_per_s is not None:
        return f"{result.samples_per_s:.1f} samples/s"
    return outcome_text(result)


def _refuse_unloadable(subject: str, workload: Workload, result: TrialResult, batch: int) -> None:
    """Stop the search when loading alone, in the main process, failed: every setup reads the same data (and calls the
    same factory), so every trial would fail too.

    Raises:
        WorkloadError: The run failed (an item raises, the factory failed) or measured nothing within its timeout.
    """
    run = f"loader alone, no workers, batch {batch}"
    factory_failed = f"workload {workload.task} failed: "
    if result.status == "error" and workload.task and (result.error or "").startswith(factory_failed):
        raise WorkloadError(f"{subject}: the factory failed in a calibration run ({run}) after it worked in the first check: "
                            f"{(result.error or '').removeprefix(factory_failed)}; every trial calls it, so it must not fail now and then")
    if result.status == "error":
        raise WorkloadError(f"{subject}: loading the data fails ({run}): {result.error}; fix the dataset (every setup reads the same data)")
    if result.status == "timeout":
        raise WorkloadError(f"{subject}: loading the data measured nothing in time ({run}): {result.error}; a dataset item "
                            "hangs or takes minutes (every setup reads the same data); fix it, or raise --timeout")


def workers_broken(points: list[LoaderPoint], first_error: str | None) -> str | None:
    """Why loader workers cannot run: every worker count failed while the main process loaded fine."""
    main = [p for p in points if p.num_workers == 0]
    workers = [p for p in points if p.num_workers > 0]
    if not main or main[0].status != "ok" or not workers or any(p.status == "ok" for p in workers):
        return None
    return first_error or "every loader-only measurement with workers failed"


def without_workers(broken: str, batch: int, pinned: Iterable[Constraint]) -> tuple[str, bool]:
    """What the calibration says of loader workers that failed every loader-only run (``broken``, the first error), and
    whether the search drops them. Batches in flight counted larger than /dev/shm (the runs' ``batch`` x prefetch 2,
    times the ranks) fail for their size alone: setups with fewer in flight still run, each checked at its first batch, where
    dropping every worker left a DDP search in a container's /dev/shm without any. A ``--set`` that leaves no count
    below one keeps its workers either way."""
    if SHM_COUNTED.search(broken):
        return (f"loader workers' batches in flight at batch {batch} x prefetch 2 do not fit /dev/shm ({broken}); the search "
                "keeps setups with workers, and one whose batches in flight do not fit fails at its first batch"), False
    if not allows(pinned, "num_workers", 0):
        return f"loader workers fail ({broken}); --set num_workers keeps them: those trials are likely to fail alike", False
    return f"loader workers fail ({broken}); the search keeps num_workers=0", True
