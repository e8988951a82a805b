"""Calibration before the search: what fits, what the device consumes, what
the loader delivers.

Three kinds of short measurements, each an isolated trial:

* a memory pre-pass: peak memory at two small batches, extrapolated to the
  largest batch under the budget, then verified at that batch;
* the compute ceiling: the model alone, one batch already on the device;
* the loader ceiling per worker count: the DataLoader alone, no model.

Their results bound the search space and explain the final verdict.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace

from autotune.devices import DeviceInfo
from autotune.errors import CUDA_START, DeviceError, WorkloadError
from autotune.records import Calibration, MemoryPoint, PrecisionPoint, TrialOptions, TrialResult, Workload
from autotune.runner import TrialRunner, run_trial
from autotune.runner.failures import WAITING, killed_from_outside
from autotune.train_setup import TrainSetup
from autotune.tuner.batch_sizes import data_limit, powers_of_two
from autotune.tuner.constraints import Constraint, allows
from autotune.tuner.diverged import HALF_ADAMW, half_adamw
from autotune.tuner.loader_ceiling import loader_ceiling, outcome_text, rate_text, without_workers, workers_broken
from autotune.tuner.offered import autocasts
from autotune.tuner.space import probe_batch
from autotune.units import format_bytes
from autotune.workloads.models import size_hint

#: Largest micro-batch the pre-pass proposes; pin a larger one with --set.
BATCH_CAP = 4096
#: Share of a CPU budget left to DataLoader workers when sizing the batch.
WORKER_RESERVE = 0.2
#: Share of the GPU's free memory kept free: a config at 99 % fragments and OOMs in long runs.
GPU_HEADROOM = 0.10

Log = Callable[[str], None]


def calibration_seconds(trial_seconds: float) -> float:
    """How long each calibration run measures: a third of a trial, between 0.5 and 3 s."""
    return max(0.5, min(3.0, trial_seconds / 3))


def memory_budget(device: DeviceInfo, max_memory: int | None, available_bytes: int, *, contained: bool = False) -> int | None:
    """Bytes the model side of a trial may use; None for no budget.

    CPU: ``--max-memory`` or half of the available RAM, less 20 % left to
    the loader workers; all of it in a container (``contained``: what its
    memory limit leaves after the search, plus the trial server's RSS, which
    each trial counts as its imports, and which the host's other processes
    cannot take; half of it sized a 1.5 GiB container's budget under what
    torch and a resnet18 hold at batch 1, where batch 32 trained). GPU: 90 % of the memory free now (the headroom is
    taken from what is free, so a shared card still leaves a budget), capped
    by ``--max-memory``. When NVML cannot say how much is free, there is no
    budget but ``--max-memory``: the pre-pass then finds the limit by
    running out of memory. A budget is at least 1 byte: a trial's limit of 0 would be no limit at all.
    """
    if device.type == "cuda":
        free = device.memory_free_bytes
        if free is None:
            return max_memory
        budget = int(free * (1.0 - GPU_HEADROOM))
        return max(1, min(budget, max_memory) if max_memory is not None else budget)
    budget = max_memory if max_memory is not None else available_bytes if contained else available_bytes // 2
    return max(1, int(budget * (1.0 - WORKER_RESERVE)))


def extrapolate_batch(points: list[MemoryPoint], budget: int) -> int | None:
    """Largest batch whose linear memory estimate stays under ``budget``.

    With one run that fit, the line runs through it and the smallest larger batch that ran out of memory, at the
    peak read as that run crossed the budget (at most its real peak: a slope no steeper than the real one, so the
    estimate errs large, and the pre-pass's verification halves it): proportional to the batch alone, as without
    such a run, it took torch's and the model's fixed cost for samples' (batch 8 at 502 MiB and batch 32 over a
    639 MiB budget searched batch 8 only, where batch 16 fits).
    """
    good = [p for p in points if p.status == "ok" and p.peak_bytes]
    if not good:
        return None
    over = min((p for p in points if p.status == "oom" and p.peak_bytes and p.batch_size > good[0].batch_size
                and p.peak_bytes >= budget), key=lambda p: p.batch_size, default=None)  # crossed it (a CUDA OOM reads lower)
    if len(good) == 1 and over is not None and over.peak_bytes > good[0].peak_bytes:  # type: ignore[operator]
        good = [good[0], over]
        cap = over.batch_size - 1  # below the batch that ran out, whatever the line says
    else:
        cap = None
    if len(good) == 1:
        per_sample = good[0].peak_bytes / good[0].batch_size  # type: ignore[operator]
        base = 0.0
    else:
        a, b = good[-2], good[-1]
        per_sample = (b.peak_bytes - a.peak_bytes) / (b.batch_size - a.batch_size)  # type: ignore[operator]
        if per_sample <= 0:  # noise: fall back to the pessimistic proportional model
            per_sample = b.peak_bytes / b.batch_size  # type: ignore[operator]
            base = 0.0
        else:
            base = b.peak_bytes - per_sample * b.batch_size  # type: ignore[operator]
    if budget <= base:
        return 0
    fit = int((budget - base) / per_sample)
    return min(fit, cap) if cap is not None else fit


def calibrate(
    workload: Workload,
    device: DeviceInfo,
    *,
    usable_cores: int,
    available_bytes: int,
    max_memory: int | None,
    trial_seconds: float,
    bf16_ok: bool,
    log: Log = lambda _msg: None,
    runner: TrialRunner = run_trial,
    batch_cap: int = BATCH_CAP,
    world_size: int = 1,
    ram_share: int = 1,
    pinned: Iterable[Constraint] = (),
    timeout_s: float | None = None,
    contained: bool = False,
) -> Calibration:
    """Run the pre-pass and ceilings; return what bounds the space.

    Args:
        workload: What is trained.
        device: Where.
        usable_cores: The probe's usable cores (upper bound for workers).
        available_bytes: Available RAM.
        max_memory: The user's memory budget, if any.
        trial_seconds: The search's trial length (calibration uses less).
        bf16_ok: Whether the device runs bf16.
        log: Progress messages.
        runner: The trial runner (default :func:`autotune.runner.run_trial`).
        batch_cap: Largest batch proposed.
        world_size: Ranks per trial: ``runner`` reports the whole world's
            samples/s, the batches are one rank's.
        ram_share: Trial processes sharing the host's RAM at once (ranks x
            parallel trials): on a CPU each gets this part of the default budget.
        pinned: The user's ``--set`` constraints: precisions, layouts and worker
            counts they exclude are not measured (the main process's loading,
            0 workers, always is: it tells whether the data loads at all).
        timeout_s: The user's ``--timeout`` for each run (default: the trials' own, from their length).
        contained: ``available_bytes`` is what a container's memory limit leaves (:func:`memory_budget`).

    Raises:
        WorkloadError: The model fails (not out of memory) at the first,
            smallest pre-pass batch: the factory raises, the forward does not
            fit the input shape. Or loading the data alone, without workers,
            fails: a dataset item raises or cannot be collated, or it measures
            nothing within the timeout (an item hangs), or the Task's factory
            fails in it (it worked in the parent's check: it fails now and then).
    """
    cuda = device.type == "cuda"
    budget = memory_budget(device, max_memory, available_bytes // max(1, ram_share), contained=contained)
    if not cuda and max_memory is not None and 0 < available_bytes < max_memory:
        log(f"--max-memory {format_bytes(max_memory)} is more than the {format_bytes(available_bytes)} of RAM available now: a "
            "batch that needs it swaps, or is killed before the budget counts it out of memory")
    short = TrialOptions(trial_seconds=calibration_seconds(trial_seconds), windows=2, mode="compute", max_memory_bytes=budget,
                         timeout_s=timeout_s)
    fp32 = TrainSetup()
    points: list[MemoryPoint] = []
    measured: dict[int, TrialResult] = {}  # the pre-pass runs by batch: fp32, contiguous, compute only
    retried: list[int] = []  # the batch whose timeout was measured again (one per calibration)

    def prepass(batch: int) -> TrialResult:
        run = lambda: runner(fp32.replace(batch_size=batch), workload, short)  # noqa: E731
        result = run()
        if killed_from_outside(result):  # maybe not the batch's doing: it must not bound the space on one kill
            log(f"memory pre-pass: batch {batch}: {result.error}; measuring it again")
            result = run()
            if killed_from_outside(result):  # killed at this batch twice: a user-space OOM daemon's limit
                result = TrialResult(status="oom", error=f"{result.error}; killed twice at this batch: taken as a memory limit")
        elif result.status == "timeout" and not retried and WAITING not in (result.error or ""):  # a machine busy for a while,
            retried.append(batch)  # as often as a batch too slow: the first timeout is no bound; a model only slow pays one more
            log(f"memory pre-pass: batch {batch}: timeout ({result.error}); measuring it again")
            result = run()
        measured[batch] = result
        if result.status == "diverged" and half_adamw(workload) and len(measured) > 1:  # its known cause, at any later batch
            raise WorkloadError(f"{subject}: the loss became NaN or infinite in a memory pre-pass run (batch size {batch}, "
                                f"{workload.precision}, the PyTorch defaults){HALF_ADAMW}")
        return result

    subject = f"workload {workload.task}" if workload.task else f"model {workload.model}"
    for batch in (8, 32) if not cuda else (16, 64):
        result = prepass(batch)
        if result.status == "error" and CUDA_START in (result.error or ""):  # no model, no setup can run ("rank 0: " before it)
            raise DeviceError(f"{result.error}; compare the driver (nvidia-smi) with torch's CUDA build, or pass --device cpu")
        if (result.status == "error" or WAITING in (result.error or "")) and not points:
            # The model fails (or waits, computing nothing) at a small batch with the plainest setup, and not
            # for memory: no setup can work, so stop now, not after every trial.
            raise WorkloadError(f"{subject} fails: {result.error}{size_hint(workload, result.error)}")
        if result.status == "diverged" and not points:
            # Not a memory limit: the plainest setup diverges, so every setup would.
            raise WorkloadError(f"{subject}: the loss became NaN or infinite in the first run (batch size {batch}, "
                                f"{workload.precision or 'fp32'}, the PyTorch defaults); check the model, the loss and the learning rate"
                                + (HALF_ADAMW if half_adamw(workload) else ""))
        points.append(MemoryPoint(batch, result.status, result.peak_memory_bytes, result.samples_per_s))
        log(f"memory pre-pass: batch {batch}: {outcome_text(result)}, peak {format_bytes(result.peak_memory_bytes)}")
        if result.status != "ok":
            break
    where = f"{device.name} ({format_bytes(device.memory_free_bytes)} free)" if cuda else device.name
    if not cuda:  # the budget is the model's share: say of what
        limit = (f"--max-memory {format_bytes(max_memory)}" if max_memory is not None else
                 "what the container's memory limit leaves" if contained else "half the available memory")
        if max_memory is None and ram_share > 1:
            limit += f" split among {ram_share} trial processes"
        where += f": {1 - WORKER_RESERVE:.0%} of {limit}, the rest left to loader workers"

    def advice() -> str:  # what to change, read from the runs so far
        fixed = fixed_cost(points, budget, cuda=cuda)
        if fixed is not None:
            return f"{fixed}: free some memory, raise --max-memory or make the model smaller" + (
                ", or have the Task's dataset load its items lazily (data it holds in memory counts in every trial)"
                if workload.task is not None else "")
        return "free some memory, raise --max-memory or " + (
            "pick a smaller --image-size" if workload.task is None else "make the Task's model or batches smaller")

    def too_small() -> WorkloadError:
        return WorkloadError(f"not even batch 1 of {subject} fits the memory budget of {format_bytes(budget)} on {where}; {advice()}")

    fit = extrapolate_batch(points, budget) if budget is not None else batch_cap
    if fit is not None and fit < 1:
        raise too_small()
    rate = max((_items_per_s(batch, result, world_size) for batch, result in measured.items()), default=0.0)  # one rank's
    # A trial must hold a few optimizer steps: a batch whose step takes more
    # than half the trial cannot be measured in steady state. Never below the
    # PyTorch default of 32, so the defaults stay inside the space.
    time_cap = max(32, int(rate * trial_seconds / 2)) if rate > 0 else batch_cap
    # An optimizer step must fit in one epoch of the data: no batch above len(dataset).
    data_cap = workload.images if workload.images is not None else batch_cap
    caps = {"memory": fit if fit is not None else 8, "trial": time_cap, "data": data_cap, "cap": batch_cap}
    candidates = powers_of_two(1, min(caps.values()))
    max_batch = candidates[-1] if candidates else 1
    stream_batch = None
    if workload.iterable and max_batch > 1:  # a stream of unknown length: the batches it fills bound the space; read
        # before the memory check, which then verifies a batch the stream fills, not one no trial could run
        filled = _stream_batch(max_batch, workload, runner, replace(short, mode="loader", max_memory_bytes=None), log)
        max_batch, stream_batch = filled, (filled if filled < max_batch else None)
    # Verify the extrapolated bound; halve on failure.
    while max_batch > 1:
        known = {p.batch_size: p for p in points}
        if max_batch in known:
            if known[max_batch].status == "ok":
                break
            max_batch //= 2
            continue
        result = prepass(max_batch)
        points.append(MemoryPoint(max_batch, result.status, result.peak_memory_bytes, result.samples_per_s))
        log(f"memory pre-pass: verify batch {max_batch}: {outcome_text(result)}, peak {format_bytes(result.peak_memory_bytes)}")
    if not any(p.status == "ok" for p in points):
        result = prepass(1)
        points.append(MemoryPoint(1, result.status, result.peak_memory_bytes, result.samples_per_s))
        log(f"memory pre-pass: batch 1: {outcome_text(result)}, peak {format_bytes(result.peak_memory_bytes)}")
        if result.status == "oom":
            raise too_small()
        larger = sorted((p.batch_size, p.status) for p in points if p.batch_size > 1)
        if not result.ok and {status for _, status in larger} == {"oom"}:  # every larger batch ran out of memory
            raise WorkloadError(
                f"no batch of {subject} trains within the memory budget of {format_bytes(budget)} on {where}: "
                f"batches 2 to {max(p.batch_size for p in points)} ran out of it and batch 1 fails ({result.error}); {advice()}"
            )
        if not result.ok:  # not memory alone: say what each run did (a run timed out on a busy machine, the model failed)
            said = ", ".join(f"batch {batch} {status}" for batch, status in larger)
            busy = "; a run that timed out may have met a busy machine: rerun on an idle one or raise --timeout" if any(
                status == "timeout" for _, status in larger) else ""
            raise WorkloadError(f"no batch of {subject} trains: {said}, and batch 1 fails ({result.error})"
                                f"{size_hint(workload, result.error)}{busy}")
    if stream_batch is not None and max_batch < stream_batch:  # memory bounded it below what the stream fills
        stream_batch = None
    # A pre-pass run that failed below every cap set the bound; else the smallest cap, on a tie the plainest reason: the
    # data's size, the trial's length, the largest batch searched, then memory.
    above = min((p for p in points if max_batch < p.batch_size <= min(caps.values()) and p.status != "ok"),
                key=lambda p: p.batch_size, default=None)
    bound = ("stream" if stream_batch is not None else f"failed {above.batch_size} {above.status}" if above is not None
             else min(("data", "trial", "cap", "memory"), key=lambda k: caps[k]))
    limit = _batch_limit(bound, budget=budget, trial_seconds=trial_seconds, rate=rate, data=data_cap, cap=batch_cap)
    if bound.endswith(" timeout") or bound == "trial":  # no memory evidence: said now, not only where a batch is pinned
        log(f"memory pre-pass: no batch above {max_batch} is searched: {limit}")
    middle = probe_batch(max_batch, device)
    reduced = ("bf16" if bf16_ok else "fp16") if cuda else ("bf16" if bf16_ok else None)
    precisions: list[PrecisionPoint] = []
    compute, compute_setup = TrialResult(status="error", error="not measured"), TrainSetup(batch_size=middle)
    failed: list[str] = []
    # Like for like: every precision and layout at the same batch, so the first guesses follow the numbers.
    # autocasts: none for a float64 Task model (it would compute as fp32), no fp16 beside 16-bit parameters.
    for amp in [a for a in autocasts(("off", reduced) if reduced else ("off",), workload) if allows(pinned, "amp", a)]:
        for channels_last in [c for c in ((False, True) if workload.image_input else (False,)) if allows(pinned, "channels_last", c)]:
            setup = TrainSetup(batch_size=middle, amp=amp, channels_last=channels_last)  # type: ignore[arg-type]
            same = measured.get(middle) if setup == fp32.replace(batch_size=middle) else None
            # The plain fp32 point at the pre-pass's own batch was measured there, with the same options.
            result = same if same is not None and same.ok else runner(setup, workload, short)
            precisions.append(PrecisionPoint(amp, channels_last, result.status, result.samples_per_s))
            layout = "channels_last" if channels_last else "contiguous"
            log(f"compute only (batch {middle}, {(workload.precision or 'fp32') if amp == 'off' else amp}, {layout}): {rate_text(result)}")
            if result.ok and (result.samples_per_s or 0.0) > (compute.samples_per_s or 0.0):
                compute, compute_setup = result, setup
            elif not result.ok:
                failed.append(f"{result.status}: {result.error}")
    if max_batch == 1 and not compute.ok:  # the space holds batch 1 alone, and the model's step fails there: so would every trial
        why = f"the data holds {workload.images} sample" if workload.images == 1 else "no larger one fits the memory budget"
        raise WorkloadError(f"{subject}: batch 1 is the only batch the search could try ({why}) and the model's step fails there "
                            f"({failed[0] if failed else 'not measured'}); give it more samples or memory")
    loader_opts = TrialOptions(trial_seconds=short.trial_seconds, windows=2, mode="loader", timeout_s=timeout_s)
    loader_points, worker_cap, worker_error = loader_ceiling(
        subject, workload, runner, loader_opts, batch=middle, cuda=cuda, usable_cores=usable_cores, pinned=pinned,
        target=compute.samples_per_s if compute.ok else None, log=log)
    calibration = Calibration(
        budget_bytes=budget,
        max_batch=max(1, max_batch),
        memory_points=tuple(points),
        probe_batch=middle,
        compute_setup=compute_setup,
        compute_samples_per_s=compute.samples_per_s if compute.ok else None,
        loader=tuple(loader_points),
        max_workers=worker_cap,
        precisions=tuple(precisions),
        stream_batch=stream_batch,
        batch_limit=limit,
        batch_bound=bound.split(" ", 1)[0],
        torch_threads=compute.num_threads if compute.ok else None,
    )
    enough = calibration.workers_enough()
    if enough is not None:
        calibration = replace(calibration, max_workers=min(worker_cap, max(2, 2 * enough)))
    broken = workers_broken(loader_points, worker_error)
    if broken is not None:
        said, dropped = without_workers(broken, middle, pinned)
        log(said)
        calibration = replace(calibration, max_workers=0) if dropped else calibration
    return calibration


def fixed_cost(points: list[MemoryPoint], budget: int | None, *, cuda: bool = False) -> str | None:
    """Why no batch fits, when it is not the batch: runs over the budget by a tenth or more whose peaks hardly grew
    from one batch to a batch at least 4x larger (within a tenth). What every trial process holds whatever its batch
    (torch on a CPU, the model, its gradients and optimizer state, the data it holds) then exceeds the budget alone, and
    no smaller batch can fit; None where the runs do not show it."""
    over = sorted((p.batch_size, p.peak_bytes) for p in points if p.status == "oom" and p.peak_bytes)
    if budget is None or len(over) < 2 or over[-1][0] < 4 * over[0][0]:
        return None
    (small, low), (large, high) = over[0], over[-1]
    lowest, highest = min(peak for _, peak in over), max(peak for _, peak in over)
    if lowest < 1.1 * budget or highest > 1.1 * lowest:
        return None
    holds = "the model, its gradients and optimizer state" if cuda else "torch, the model, its gradients and optimizer state, the data it holds"
    return (f"its runs peaked at {format_bytes(low)} at batch {small} and {format_bytes(high)} at batch {large}: what a trial "
            f"process holds whatever its batch ({holds}) exceeds the budget alone, so no smaller batch fits")


def _batch_limit(bound: str, *, budget: int | None, trial_seconds: float, rate: float, data: int, cap: int) -> str:
    """Why no larger batch than the calibration's largest is searched (``bound``: the cap that set it, or ``failed N
    STATUS``: the memory pre-pass's run of batch N ended so), in words."""
    if bound.startswith("failed "):
        _, batch, status = bound.split(" ", 2)
        if status == "timeout":
            return (f"batch {batch} timed out in the memory pre-pass (a busy machine, a step slower than the --timeout, or a "
                    "dataset item that hangs): rerun on an idle machine or raise --timeout")
        return f"batch {batch} {'ran out of memory' if status == 'oom' else f'failed ({status})'} in the memory pre-pass"
    if bound == "memory":
        return f"a larger one does not fit the memory budget of {format_bytes(budget)}" if budget is not None else "a larger one ran out of memory"
    if bound == "trial":
        return (f"one step of a larger one would take over half of a {trial_seconds:g}-s trial at the {rate:.0f} samples/s the "
                "calibration measured: raise --trial-seconds, or pin one batch (--set batch_size=N runs it as given)")
    if bound == "data":
        return data_limit(data)
    if bound == "stream":
        return "one pass of the dataset's stream fills no larger one"
    return f"{cap} is the largest batch autotune searches (--set batch_size=N runs a larger one as given)"


def _items_per_s(batch: int, result: TrialResult, world_size: int) -> float:
    """One rank's items per second at ``batch``: the batch over its step time, since samples/s counts what the Task's
    ``batch_size_of`` counts (tokens, say, not the items a batch size holds); the world's samples/s over its ranks
    when the runner reports no step time."""
    if result.ok and result.step_time_s:
        return batch / result.step_time_s
    return (result.samples_per_s or 0.0) / world_size


def _stream_batch(max_batch: int, workload: Workload, runner: TrialRunner, options: TrialOptions, log: Log) -> int:
    """The largest batch, halving from ``max_batch``, that an iterable dataset fills (the loader alone, no workers)."""
    batch, unfilled = max_batch, []
    while batch > 1:
        result = runner(TrainSetup(batch_size=batch), workload, options)
        if result.ok or "no full batch" not in (result.error or ""):
            break
        unfilled.append(batch)
        batch //= 2
    if unfilled:  # one line for the halvings, not one per halving
        tried = f" (tried {', '.join(map(str, unfilled))})" if len(unfilled) > 1 else ""
        log(f"the dataset yields no full batch of {unfilled[-1]} samples{tried}: the search keeps batch_size <= {batch}")
    return batch
