"""The ask/tell loop: one isolated trial per Optuna trial until ``--trials`` are finished.

The last trials of a TPE search step from the leading setup one knob at a
time (:mod:`autotune.tuner.neighbours`); those of either sampler then re-run
it with ``torch.compile`` (:mod:`autotune.tuner.refine`).

Infeasible trials (oom, timeout, error, diverged) are recorded as results,
never raised; a setup measured before is reused instead of re-run; a step
larger than the data is infeasible without running. Those two run nothing
and do not use up ``--trials`` (:func:`autotune.tuner.budget.counted_toward_budget`), and
neither does a trial that found a stream of unknown length too short for
one optimizer step (:func:`starved`); a later step at least as large is
infeasible without running, as is a loader queue no smaller than one that
found /dev/shm too small (:func:`beyond_the_shm`). ``trials.csv`` is
rewritten after every trial, so nothing measured is lost.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import optuna

from autotune.epochs import queue_fits
from autotune.errors import StorageError, WorkloadError
from autotune.output.trials_csv import write_trials_csv
from autotune.records import TrialOptions, TrialRecord, TrialResult, Workload
from autotune.runner import TrialRunner, WindowCallback
from autotune.runner.failures import SHM_TOO_SMALL
from autotune.train_setup import TrainSetup
from autotune.tuner.budget import STUDY_BUDGET, counted_records
from autotune.tuner.constraints import Constraint, excluding
from autotune.tuner.neighbours import ROLE_NEIGHBOUR, enqueue_neighbour
from autotune.tuner.pending import PendingTrial, kept_pending
from autotune.tuner.progress import Reporter
from autotune.tuner.refine import ROLE_COMPILE, compile_setup, compile_trials, enqueue_compile_trials
from autotune.tuner.signals import interrupts_held
from autotune.tuner.space import Space
from autotune.tuner.storage import DATABASE_ERRORS, storage_failure
from autotune.tuner.study import ROLE_DEFAULTS, ROLE_SEARCH, SearchStudy
from autotune.units import counted, format_bytes
from autotune.workloads.pipeline import NO_FULL_STEP
from probes.hardware import SHM_MIN_BYTES
from probes.memory import collect_shm


@dataclass(frozen=True)
class Exploration:
    """What the loop needs besides the study.

    Attributes:
        space: Where setups are sampled.
        defaults: The PyTorch-defaults setup (the ``defaults`` role's trial).
        workload: What is trained.
        options: How each trial measures.
        wanted: Finished trials wanted in the study.
        csv_path: Where ``trials.csv`` is rewritten after every trial.
        neighbours: Trials of the budget for one-knob moves from the leader
            (:func:`autotune.tuner.neighbours.neighbour_trials`; 0: none, as with the random sampler).
        constraints: The search's ``--set``: a trial it excludes (the PyTorch defaults, measured as the
            baseline) is never the best so far.
    """

    space: Space
    defaults: TrainSetup
    workload: Workload
    options: TrialOptions
    wanted: int
    csv_path: Path
    neighbours: int = 0
    constraints: dict[str, Constraint] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        """The search's output directory (where ``trials.csv`` is)."""
        return self.csv_path.parent

    def write_csv(self, records: list[TrialRecord]) -> None:
        """Rewrite ``trials.csv`` with ``records`` (effective batches over every rank of a trial)."""
        write_trials_csv(self.csv_path, records, self.options.world_size)

    def best(self, records: list[TrialRecord]) -> float | None:
        """The best samples/s so far of the trials the ``--set`` allows (each finished trial's progress line); None before one."""
        rates = [r.result.samples_per_s or 0.0 for r in records if r.result.ok and excluding(self.constraints, r.setup) is None]
        return max(rates, default=None)


def check_recipe(records: list[TrialRecord], workload: Workload) -> None:
    """Stop when the PyTorch defaults diverged, or failed with the error another setup's trial failed with: the recipe
    itself does, and every setup trains it.

    A setup's speed says nothing where the loss is NaN, and a winner would
    hand back a recipe that cannot train. An error that setups of two batch
    sizes meet alike, while no trial has trained (one label out of the
    classes' range among many items: the memory pre-pass, on a spread of the
    first items, took it for a limit of its batch), is the workload's: every
    further trial would meet it too.

    Raises:
        WorkloadError: The defaults' trial ended ``diverged``, or ``error`` as a trial at another batch did while none
            trained (every trial so far stays in the study).
    """
    subject = f"workload {workload.task}" if workload.task else f"model {workload.model}"
    for record in records:
        if record.role == ROLE_DEFAULTS and record.result.status == "diverged":
            raise WorkloadError(
                f"{subject}: the loss became NaN or infinite in trial #{record.number}, the PyTorch defaults (batch "
                f"{record.setup.batch_size}, {workload.precision or 'fp32'}): the recipe diverges whatever the setup; check the model, the loss and "
                "the learning rate (the trials so far are kept; fix it and search with another --out)"
            )
        if record.role == ROLE_DEFAULTS and record.result.status == "error" and raised(record.result.error) and not record.free:
            same = next((r for r in records if r.number != record.number and not r.free and r.setup.batch_size != record.setup.batch_size
                         and r.result.status == "error" and r.result.error == record.result.error), None)
            if same is not None and not any(r.result.ok for r in records if not r.free):  # one that trains: not every setup fails
                raise WorkloadError(
                    f"{subject}: trial #{record.number} (the PyTorch defaults) and trial #{same.number} ({same.setup.describe()}) "
                    f"failed alike: {record.result.error}; so would every setup: check every item of the data with the model "
                    "and the loss, not the first ones only (a target out of range, a bad shape) (the trials so far are kept; "
                    "fix it and search with another --out)"
                )


def raised(error: str | None) -> bool:
    """Whether a trial's error is an exception the workload's code raised (``IndexError: ...``), not the death of a
    process (a signal, a kill from outside, a loader worker gone)."""
    return error is not None and re.match(r"[A-Z]\w*(Error|Exception): ", error) is not None


def explore(study: SearchStudy, plan: Exploration, reporter: Reporter, runner: TrialRunner) -> None:
    """Run trials until ``plan.wanted`` are finished.

    Raises:
        KeyboardInterrupt: Ctrl-C or SIGTERM; the running trial is marked
            failed (it does not count) and every finished one is kept.
        DataError: The data cannot be read now (a file that cannot be decoded, the directory gone); the same.
        WorkloadError: The defaults diverged, or failed as every setup would (:func:`check_recipe`).
        StorageError: The measured trials kept in ``OUT/pending-trials.json`` cannot be read or added.
    """
    store_lone_budget(study, plan, reporter)
    while (done := study.finished(plan.wanted)) < plan.wanted:
        trial, told = None, False
        try:
            with interrupts_held():
                queue_refinements(study, plan)
                trial, role = study.ask()
                setup = setup_for(trial, role, plan)
                reporter.trial_started(done, plan.wanted, role, setup)
                known = known_result(study, setup, trial.number, plan.workload)
            if known is None:
                result, reused_from = runner(setup, plan.workload, plan.options, on_window=pruning_hook(trial, role)), None
            else:
                result, reused_from = known.result, known.reused_from
            # Stored, told and written in one held block: an interrupt meanwhile takes effect once the trial counts.
            with interrupts_held():
                free = known is not None or starved(result)
                try:
                    study.record(trial, role, setup, result, reused_from, free=free)
                    study.tell(trial, result)
                except DATABASE_ERRORS as exc:  # measured, not stored: kept in --out for the rerun, which fails the trial
                    told = True
                    entry = PendingTrial.of(study, trial, role, setup, result, reused_from, free)
                    raise kept_pending(plan.out, entry, storage_failure(study.storage, exc)) from None
                told = True
                records = study.records()
                plan.write_csv(records)
                check_recipe(records, plan.workload)
                best = plan.best(records)
                record = next(r for r in records if r.number == trial.number)
                reporter.trial_finished(study.finished(plan.wanted), plan.wanted, record, best)
        except BaseException:  # Ctrl-C, bad data: the unfinished trial does not count
            if trial is not None and not told:
                with interrupts_held():
                    study.fail(trial)
            raise


def store_lone_budget(study: SearchStudy, plan: Exploration, reporter: Reporter) -> None:
    """Store the trials this lone search wants in its study (``autotune status`` shows "done/wanted"), or say why a rerun
    with fewer ``--trials`` than the study holds runs none. A shared study's worker stores its own
    (:func:`~autotune.tuner.budget.store_budget`)."""
    already = study.finished(plan.wanted)
    measured = counted_records(study.records()) if already >= plan.wanted else already
    if already >= plan.wanted and measured < already:  # the sampler's repeats of measured setups outgrew the budget
        reporter.message(f"the study holds {measured} measured trials, and its sampler proposed setups measured before "
                         f"{already - measured + plan.wanted} times, more than --trials {plan.wanted}: it has converged, none "
                         "runs (a larger --trials runs only setups not measured yet; fewer --set pins widen the space)")
    elif already >= plan.wanted:
        reporter.message(f"the study holds {already} finished trials, --trials {plan.wanted} asks for no more: none runs "
                         f"(pass --trials {already + 1} or more to search further)")
    stored = study.study.user_attrs.get(STUDY_BUDGET)
    # A converged study keeps the budget it converged under: `already` counts repeats past this smaller one (status read 5/12).
    kept = max(plan.wanted, stored) if measured < already and isinstance(stored, int) else max(plan.wanted, already)
    study.study.set_user_attr(STUDY_BUDGET, kept)


def queue_refinements(study: SearchStudy, plan: Exploration) -> None:
    """Queue the next neighbour move, or the compiled leader, once the budget has reached their trials."""
    after = compile_trials(plan.space, plan.wanted)  # the neighbour moves come just before the compiled trials
    skip = lambda setup: unrunnable(setup, plan.workload) is not None  # noqa: E731
    allowed = lambda setup: excluding(plan.constraints, setup) is None  # noqa: E731  (defaults a --set excludes: baseline only)
    enqueue_neighbour(study, plan.space, plan.wanted, share=plan.neighbours, after=after, skip=skip, allowed=allowed)
    enqueue_compile_trials(study, plan.space, plan.wanted, allowed)


def setup_for(trial: optuna.Trial, role: str, plan: Exploration) -> TrainSetup:
    """What a trial runs: the defaults, a queued compiled leader, or its params through the space (sampled or queued)."""
    if role == ROLE_COMPILE:
        return compile_setup(trial.user_attrs)
    if role == ROLE_DEFAULTS:
        return plan.defaults
    try:
        return plan.space.suggest(trial)
    except ValueError as exc:  # Optuna: a knob's choices differ from those of the study's earlier trials
        if "dynamic value space" not in str(exc):
            raise
        prefix = "dynamic value space: "  # Space names the knob after it
        which = str(exc).removeprefix(prefix) + "; " if str(exc).startswith(prefix) else ""
        raise StorageError(
            f"study {trial.study.study_name!r} holds trials sampled from other choices of a knob than this search offers "
            f"({which}its data or model changed since, --devices/--nproc-per-node split the cores another way, or an earlier "
            "autotune version built its space); "
            "pass another --out (with --storage: --study NEW_NAME)"
        ) from None


@dataclass(frozen=True)
class Known:
    """The result of a trial that runs nothing, and the trial that measured its setup (None: the data cannot feed it)."""

    result: TrialResult
    reused_from: int | None = None


def known_result(study: SearchStudy, setup: TrainSetup, number: int, workload: Workload) -> Known | None:
    """What trial ``number`` is told without running (a free trial, see
    :func:`autotune.tuner.budget.counted_toward_budget`), or None when it must run."""
    too_big = unrunnable(setup, workload)
    if too_big is None and workload.iterable and workload.images is None:
        too_big = beyond_the_stream(setup, study.records())
    if too_big is None and setup.num_workers:
        too_big = beyond_the_shm(setup, study.records)
    if too_big is not None:
        return Known(too_big)
    previous = study.same_setup(setup, number)
    return Known(previous.result, previous.number) if previous is not None else None


def unrunnable(setup: TrainSetup, workload: Workload) -> TrialResult | None:
    """An infeasible result, not run, for a setup the data cannot feed (:func:`unfed` says why)."""
    why = unfed(setup, workload)
    return None if why is None else TrialResult(status="error", error=why)


def starved(result: TrialResult) -> bool:
    """Whether one pass of the data held no optimizer step of the trial's setup (a stream of unknown length found
    short by running): the setup's speed is not in question, so like a step :func:`unfed` refuses it is free (it ran,
    but it uses up no trial of ``--trials``).

    Args:
        result: A trial's result.
    """
    return NO_FULL_STEP in (result.error or "")


def beyond_the_stream(setup: TrainSetup, records: list[TrialRecord]) -> TrialResult | None:
    """An infeasible result, not run, for a stream of unknown length: a trial with at most one loader worker found one
    pass of it shorter than ``batch x accumulation`` of its setup (it yielded fewer full batches than the steps), so a
    step at least as large cannot fill from it either. (With more workers each one drops its own last partial batch,
    so a pass holds fewer batches than its length says: such a trial bounds nothing.)

    Args:
        setup: The setup to run next.
        records: The study's trials so far.
    """
    short = [r for r in records if starved(r.result) and r.reused_from is None and r.setup.num_workers <= 1]
    shortest = min(short, key=lambda r: r.setup.effective_batch(), default=None)
    step = setup.effective_batch()
    if shortest is None or step < shortest.setup.effective_batch():
        return None
    return TrialResult(status="error", error=(
        f"batch {setup.batch_size} x {setup.accumulation_steps} accumulation = {step}: one pass of the dataset holds fewer "
        f"than {shortest.setup.effective_batch()} samples (trial #{shortest.number}): an epoch would hold no optimizer step"))


def in_flight(setup: TrainSetup) -> int:
    """Samples the loader's workers hold in /dev/shm at most: workers x prefetch x batch."""
    return setup.num_workers * (setup.prefetch_factor or 2) * setup.batch_size


def beyond_the_shm(setup: TrainSetup, records: Callable[[], list[TrialRecord]]) -> TrialResult | None:
    """An infeasible result, not run, for a setup with loader workers whose batches in flight are at least those a trial
    found /dev/shm too small for (a container's default 64 MiB): it fails alike, where the search spent trial after
    trial on it. Only while this host's /dev/shm is small and as large as the trial's error names it (a rerun in a larger
    one runs it), and for the same ``decode`` (GPU decoding hands over compressed files).

    Args:
        setup: The setup to run next.
        records: Reads the study's trials so far: only where /dev/shm is small (on most hosts, never).
    """
    shm = collect_shm()
    if shm.total_bytes is None or shm.total_bytes >= SHM_MIN_BYTES:
        return None
    full = [r for r in records() if SHM_TOO_SMALL in (r.result.error or "") and r.reused_from is None and r.setup.decode == setup.decode]
    size = f"{shm.path} ({format_bytes(shm.total_bytes)}, "  # the trial's error: "/dev/shm (64 MiB, 2 MiB free) is too small ..."
    smallest = min((r for r in full if size in (r.result.error or "")), key=lambda r: in_flight(r.setup), default=None)
    if smallest is None or in_flight(setup) < in_flight(smallest.setup):
        return None
    return TrialResult(status="error", error=(
        f"{in_flight(setup)} samples in flight (workers x prefetch x batch) are no fewer than the {in_flight(smallest.setup)} "
        f"that /dev/shm could not hold in trial #{smallest.number}: not run"))


def unfed(setup: TrainSetup, workload: Workload, knob_terms: bool = False) -> str | None:
    """Why the data cannot feed ``setup``, or None when it can (or its size is unknown).

    An optimizer step larger than the data holds no step per epoch; a loader
    queue (workers x prefetch x batch) larger than an epoch prefetches what
    the epoch does not hold, memory held for nothing.

    Args:
        setup: The setup to check.
        workload: What it reads (one rank's share of it in a DDP trial).
        knob_terms: Name each value by its knob (``batch_size=64``), as a refused setup does, so that
            :func:`autotune.flag_terms.in_flag_terms` can name the flag that set it; otherwise the search's trial
            record wording (``batch 64 x 4 accumulation``).
    """
    images = workload.images
    if images is None:
        return None
    unit = "sample" if workload.task else "image"
    batch, prefetch = setup.batch_size, setup.prefetch_factor or 2
    if setup.effective_batch() > images:
        step = (f"batch_size={batch} x accumulation_steps={setup.accumulation_steps}" if knob_terms
                else f"batch {batch} x {setup.accumulation_steps} accumulation")
        return f"{step} = {setup.effective_batch()} exceeds the {counted(images, 'training ' + unit)}: an epoch would hold no optimizer step"
    queue = setup.num_workers * prefetch * batch
    if not queue_fits(setup.num_workers, prefetch, batch, images):
        held = (f"num_workers={setup.num_workers} x prefetch_factor={prefetch} x batch_size={batch}" if knob_terms
                else f"{setup.num_workers} workers x prefetch {prefetch} x batch {batch}")
        return f"the loader queue ({held} = {queue} samples) is larger than an epoch of {counted(images, unit)}"
    return None


def pruning_hook(trial: optuna.Trial, role: str) -> WindowCallback | None:
    """Report each window to Optuna's pruner; None for the defaults, guesses and compiled runs (always measured in full).

    A storage that fails to take a window (a lost connection, a locked
    SQLite file) never stops or loses the trial: it runs on, unpruned, and
    storing its result meets the storage's error where it is handled.
    """
    if role not in (ROLE_SEARCH, ROLE_NEIGHBOUR):
        return None

    def hook(index: int, value: float) -> bool:
        try:
            trial.report(value, step=index)
            return bool(trial.should_prune())
        except Exception:  # sqlalchemy, journal and driver errors all differ
            return False

    return hook
