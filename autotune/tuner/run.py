"""The search: prepare, calibrate, explore, confirm, finish.

:func:`run_search` is the library entry point behind ``autotune search``.
Each step is a function below (the first, :func:`~autotune.tuner.prepare.prepare`,
in a module of its own); the trial runner is handed in (``runner=``),
so tests pass a fake one. The study lives in an Optuna storage (SQLite in
the output directory by default), so re-running the same command resumes it.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TypeVar

from autotune.errors import AutotuneError, DataError, EmitError, SearchFailed, SearchInterrupted, StorageError, UsageError
from autotune.output.emit import write_winner
from autotune.records import Calibration, TrialOptions, TrialRecord
from autotune.rounds import Confirmed
from autotune.runner import TrialRunner, prestart, run_trial
from autotune.runner.held import HeldTrials, holding
from autotune.runner.zygote import server_rss
from autotune.time_spent import TimeSpent
from autotune.train_setup import TrainSetup
from autotune.tuner.budget import counted_records
from autotune.tuner.calibrate import calibrate
from autotune.tuner.config import SearchConfig, SearchOutcome, Timing
from autotune.tuner.confirm import confirm, confirmation_plan, measure_ceilings
from autotune.tuner.constraints import allows, excluding
from autotune.tuner.explore import Exploration, check_recipe
from autotune.tuner.finalists import REUSED, pick_candidates
from autotune.tuner.guesses import guess_setups
from autotune.tuner.kept_runs import KeptRuns
from autotune.tuner.leftovers import nothing_left_if_nothing_measured
from autotune.tuner.neighbours import neighbour_trials
from autotune.tuner.offered import compiled_note
from autotune.tuner.parallel import explore_placed
from autotune.tuner.prepare import Prepared, prepare
from autotune.tuner.progress import Reporter, SilentReporter, check_reporter
from autotune.tuner.refine import compile_skipped
from autotune.tuner.signals import clear_stop, interrupts_held, runs_to_the_end, sigterm_as_interrupt, stop_reason, stop_requested
from autotune.tuner.space import Space, build_space, defaults_setup
from autotune.tuner.storage import storage_failures_said, with_retries
from autotune.tuner.storage_urls import is_shared
from autotune.tuner.study import ROLE_DEFAULTS, ROLE_GUESS
from autotune.tuner.study_facts import stored_confirmed
from autotune.tuner.study_files import kept_outcome, kept_winner
from autotune.tuner.study_report import report_command, report_search
from autotune.tuner.timed import TimedRunner
from autotune.tuner.verdict import bottleneck_verdict
from autotune.tuner.winner import make_best
from autotune.units import counted
from probes.memory import collect_memory

T = TypeVar("T")


def run_search(config: SearchConfig, reporter: Reporter | None = None, *, runner: TrialRunner = run_trial) -> SearchOutcome:
    """Search the fastest setup for the workload; write best.json, trials.csv, train.py and report.html.

    Args:
        config: What to search and where to write.
        reporter: Progress hooks (silent by default).
        runner: Runs one trial (default: an isolated, real trial).

    Returns:
        The outcome; ``best`` is the confirmed winner.

    Raises:
        UsageError: Bad input (nothing is written).
        WorkloadError: Unknown model, missing or empty data (nothing is written).
        StorageError: Unwritable output or unreachable storage.
        SearchFailed: Every trial failed.
        SearchInterrupted: Ctrl-C; finished trials are kept and the best so far is written.
    """
    if not isinstance(config, SearchConfig):
        raise UsageError(f"run_search takes an autotune.SearchConfig, got {type(config).__name__}")
    check_reporter(reporter)
    with _optuna_settings_kept():
        return _run_search(config, reporter or SilentReporter(), runner)


@contextmanager
def _optuna_settings_kept() -> Iterator[None]:
    """Run the block with optuna's log level and the warnings filters restored after it: the search quiets optuna's
    per-trial INFO lines and its experimental-feature warnings for itself, not for the rest of the caller's process."""
    import optuna

    verbosity = optuna.logging.get_verbosity()
    with warnings.catch_warnings():
        try:
            yield
        finally:
            optuna.logging.set_verbosity(verbosity)


def _run_search(config: SearchConfig, reporter: Reporter, runner: TrialRunner) -> SearchOutcome:
    """:func:`run_search` once its arguments are checked."""
    config.validate()
    if runner is run_trial:
        prestart()  # the trial server's imports overlap the checks of prepare()
    clear_stop()
    timing, began = Timing(), time.monotonic()
    timed = TimedRunner(HeldTrials() if runner is run_trial else runner, timing)  # the confirmation holds its trials
    try:
        with sigterm_as_interrupt():  # SIGTERM or SIGHUP while the checks run (or JPEGs are generated) as Ctrl-C
            prepared = prepare(config, reporter)
    except KeyboardInterrupt:
        raise SearchInterrupted("interrupted while the search was prepared: this run measured nothing (what earlier runs of the "
                                "study measured is kept); rerun the same command") from None
    timed.out = prepared.out
    # A storage that fails mid-search is one StorageError (the clean-up then leaves the storage alone).
    try:
        with nothing_left_if_nothing_measured(prepared.study, prepared.made_out, prepared.crew is not None), \
                storage_failures_said(prepared.study.storage), prepared.held:
            outcome = _search(config, prepared, reporter, timed, timing, began)
    except SearchInterrupted as exc:  # a trial terminated from outside (earlyoom's SIGTERM, say): the user pressed nothing
        if (why := stop_reason()) is None:
            raise
        raise SearchInterrupted(f"{exc} (what stopped it: {why})", outcome=exc.outcome, trial_stopped=True) from None
    if stop_requested():  # while report.html was drawn (its one line said so), or written (held: then it is whole)
        raise SearchInterrupted(f"interrupted as report.html was written; it is written, with best.json, train.py and trials.csv, "
                                f"in {prepared.out}" if any(Path(f).name == "report.html" for f in outcome.files) else
                                f"interrupted while report.html was written; best.json, train.py and trials.csv are written in {prepared.out}: "
                                f"`{report_command(prepared.out, prepared.study.storage, prepared.study.name)}` writes the page", outcome=outcome)
    return outcome


def _search(config: SearchConfig, prepared: Prepared, reporter: Reporter, timed: TimedRunner, timing: Timing, began: float) -> SearchOutcome:
    """The steps after :func:`prepare`, while the output directory and the study are held."""
    placed = prepared.placement.runner(timed)  # the trials' ranks, device and cores
    crew, constraints, work = prepared.crew, config.pins, prepared.workload

    def this_run() -> TimeSpent:  # this run's time so far, a worker's waits for the others included
        return replace(timing.record(), waiting_s=crew.waited_s) if crew else timing.record()

    first = (crew.once(lambda: first_steps(config, prepared, reporter, placed), reporter) if crew else None)
    calibration, space = first or first_steps(config, prepared, reporter, placed)
    defaults = defaults_setup(prepared.placement.rank_batch(config.effective_batch), work.reference_batch, work.images or calibration.stream_batch)
    options = TrialOptions(trial_seconds=config.trial_seconds, timeout_s=config.timeout_s, max_memory_bytes=config.max_memory,
                           world_size=prepared.placement.world_size)
    moves = neighbour_trials(config.trials) if config.sampler == "tpe" else 0  # the random baseline stays random
    plan = Exploration(space, defaults, prepared.workload, options, config.trials, prepared.out / "trials.csv", moves, constraints)
    timing.phase = "search"
    check_recipe(prepared.study.records(), prepared.workload)  # a resumed study whose defaults diverged
    explore_all = partial(crew.explore, runner=placed) if crew else partial(explore_placed, prepared.placement, runner=timed)
    before = counted_records(prepared.study.records())  # measured: the sampler's repeats of measured setups add nothing
    interrupted = not runs_to_the_end(lambda: explore_all(prepared.study, plan, reporter))
    records = prepared.study.records()
    plan.write_csv(records)
    feasible = [r for r in records if r.result.ok and r.result.samples_per_s]
    if not feasible:
        timing.wall_s = time.monotonic() - began
        status = "interrupted" if interrupted else "failed: no feasible trial"
        written, _ = report_search(prepared.study, prepared.out, this_run(), reporter.message, status, records, calibration)
        raise _nothing_feasible(records, prepared.study.storage, interrupted or stop_requested(), written[0] if written else None)
    if crew is not None and not interrupted and (winner := crew.confirm_or_wait(config.trials, reporter)) is not None:
        shared = crew.outcome(winner, records, calibration, prepared.out, plan.csv_path)
        assert shared.best is not None  # a published winner always has one
        # This worker's --out holds the study's winner too (not a stale best.json of an interrupted run of its own),
        # best.json and train.py both whole: a stop waits for them, then ends the search without its report.
        try:
            with interrupts_held():
                files = (*shared.files, *write_winner(shared.best, prepared.out))
        except KeyboardInterrupt:
            raise SearchInterrupted(f"interrupted: the study's confirmed winner is in {prepared.out / 'best.json'}; only this worker's "
                                    f"report was skipped (`{report_command(prepared.out, prepared.study.storage, prepared.study.name)}` "
                                    "writes it)", outcome=shared) from None
        timing.wall_s = time.monotonic() - began
        written, spent = report_search(prepared.study, prepared.out, this_run(), reporter.message,
                                       f"finished: confirmed by {winner.get('by')}", records, calibration, shared)
        files = (*files, *written)
        return replace(shared, files=files, time_spent=spent, timing=timing)
    confirmed: list[Confirmed] = []
    reuse = crew is None and counted_records(records) == before  # a lone study's run that measured no trial
    bad: DataError | None = None  # met in the confirmation: best.json of the trials is written first, as on a Ctrl-C there
    if not interrupted:
        timing.phase = "confirmation"
        with holding(timed.runner):  # a finalist's process is kept between its rounds
            try:
                interrupted = not runs_to_the_end(lambda: confirmed.extend(
                    confirm_finalists(config, prepared, records, calibration, defaults, options, reporter, placed, reuse=reuse)))
            except DataError as exc:
                interrupted, bad = True, exc
    reused = reuse and bool(confirmed) and prepared.study.confirmation() == {}  # the stored rounds taken, none measured now
    kept = kept_winner(prepared.out, prepared.study, records) if interrupted and not confirmed else None
    so_far = stored_confirmed(prepared.study, records, prepared.study.confirmation()) if interrupted else ()  # shown, never dropped
    try:
        with interrupts_held():  # a stop now waits for best.json and train.py, then skips only the ceilings
            outcome = finish(config, prepared, calibration, records, feasible, confirmed, defaults, interrupted, write=kept is None,
                             partial_rounds=so_far, stopped_by="bad data" if bad else "")
    except KeyboardInterrupt:
        interrupted = True
    if reused and (stored := prepared.study.verdict())[0] is not None and (stored[1] is not None or not config.ceilings):
        outcome = replace(outcome, verdict=stored[0], ceilings=stored[1])
    elif config.ceilings and confirmed and outcome.best is not None and not interrupted:
        timing.phase = "ceilings"
        measured = [outcome]
        interrupted = not runs_to_the_end(lambda: measured.append(with_ceilings(outcome, prepared, options, placed)))
        outcome = measured[-1]
    timing.wall_s = time.monotonic() - began
    status = ("finished" if not interrupted else "stopped by bad data (winner not confirmed)" if bad else "interrupted" if confirmed else
              "interrupted (an earlier run's confirmed winner kept)" if kept else "interrupted (winner not confirmed)")
    shown = outcome if kept is None else kept_outcome(outcome, kept, prepared.study, records)  # the report agrees with best.json
    written, spent = report_search(prepared.study, prepared.out, this_run(), reporter.message, status, records, calibration, shown)
    timing.wall_s = time.monotonic() - began
    outcome = replace(outcome, files=(*outcome.files, *written), time_spent=spent, timing=timing)
    if crew is not None and outcome.best is not None and not interrupted:
        crew.publish(outcome.best, config.trials, prepared.out)
    if bad is not None:  # said with what was written, as a stop's line says it
        where = prepared.out / "best.json"
        said = f"best so far written to {where} (unconfirmed)" if kept is None else f"the confirmed winner of an earlier run stays in {where}"
        raise DataError(f"{bad.alone}; {said}", if_kept=str(bad)[len(bad.alone):], outcome=outcome)  # as a stop's: this run's
    if interrupted:  # after a finished confirmation only the winner's ceilings were left
        best_json = prepared.out / "best.json"
        said = (f"the confirmed winner is in {best_json}{'; only its ceilings were skipped' if config.ceilings else ''}" if confirmed else
                f"the confirmed winner of an earlier run stays in {best_json} (this run's best so far is not confirmed); "
                "rerun the same command to resume" if kept else
                f"best so far written to {best_json} (unconfirmed); rerun the same command to resume")
        kept_line = counted(counted_records(records), "finished trial")
        raise SearchInterrupted(f"interrupted: {kept_line} kept in {prepared.study.storage}; {said}", outcome=outcome)
    return outcome


def first_steps(config: SearchConfig, prepared: Prepared, reporter: Reporter, runner: TrialRunner) -> tuple[Calibration, Space]:
    """Calibrate (or reuse the stored calibration), build the space, queue the first trials of a new study."""
    calibration = calibrate_once(config, prepared, reporter, runner)
    try:
        space = build_space(device=prepared.device, calibration=calibration, **prepared.placement.space_args(config.effective_batch),
                            constraints=config.pins, images=prepared.workload.images,
                            image_input=prepared.workload.image_input, workload=prepared.workload)
    except UsageError:  # pins only the calibrated batches refuse: a study kept with its calibration refused the corrected --set
        if prepared.crew is None and prepared.study.is_empty():
            prepared.study.forget_calibration()  # then it holds nothing and goes: the corrected command calibrates again
        raise
    reporter.message(space.describe() + compile_skipped(space, config.trials))
    enqueue_first_trials(config, prepared, space, calibration)
    return calibration, space


def _nothing_feasible(records: list[TrialRecord], storage: str, interrupted: bool, report: str | None = None) -> AutotuneError:
    """The error when no trial measured a throughput: interrupted, or every trial failed (``report``: report.html, if written)."""
    if interrupted:
        kept = counted(counted_records(records), "trial")
        return SearchInterrupted(f"interrupted before any feasible trial; {kept} kept in {storage}; rerun the same command to resume")
    reasons = sorted({f"{r.result.status}: {r.result.error}" for r in records})
    where = f"; every trial's reason in {report}" if report else ""
    return SearchFailed(f"all {len(records)} trials failed ({'; '.join(reasons)[:300]}){where}")


def available_now(prepared: Prepared) -> int:
    """RAM a trial's memory figure may take: what is left at the probe and now (less this search's torch: read at the probe
    only, a container's OOM killer stopped a search), plus the trial server's RSS, which each trial counts (tree_memory)."""
    return min(prepared.hardware.memory.usable_bytes(), collect_memory().usable_bytes()) + server_rss()


def calibrate_once(config: SearchConfig, prepared: Prepared, reporter: Reporter, runner: TrialRunner) -> Calibration:
    """The calibration stored in the study, or a new one (then stored; each run as it returns, :class:`KeptRuns`).

    Raises:
        SearchInterrupted: Ctrl-C or SIGTERM during calibration (its runs so far are kept).
    """
    stored = prepared.study.calibration()
    if stored is not None:
        trials = counted(counted_records(prepared.study.records()), "finished trial")
        reporter.message(f"continuing study {prepared.study.name!r}: calibration reused, {trials} kept")
        return stored
    kept = KeptRuns(runner, prepared.study.calibration_runs(), prepared.study.store_calibration_runs)
    try:  # the line too: a stop as it is printed is one during calibration (it ended as the CLI's generic interruption)
        reporter.message(f"calibration: memory pre-pass, compute-only and loader-only ceilings{kept.opening()}")
        with sigterm_as_interrupt():
            calibration = calibrate(
                prepared.workload, prepared.device, usable_cores=prepared.placement.rank_cores,
                available_bytes=available_now(prepared), max_memory=config.max_memory,
                trial_seconds=config.trial_seconds, bf16_ok=prepared.device.bf16, log=reporter.message, runner=kept,
                world_size=prepared.placement.world_size, ram_share=prepared.placement.processes, pinned=config.constraints,
                timeout_s=config.timeout_s, contained=prepared.hardware.memory.limited_by_cgroup(),
            )
    except KeyboardInterrupt:
        raise SearchInterrupted(f"interrupted during calibration, before the first trial (runs measured and kept: {kept.measured}); "
                                "rerun the same command to go on") from None
    prepared.study.store_calibration(calibration)
    if (summary := kept.summary()) is not None:
        reporter.message(summary)
    return calibration


def enqueue_first_trials(config: SearchConfig, prepared: Prepared, space: Space, calibration: Calibration) -> None:
    """In a new study: the PyTorch defaults first, then the probe-informed guesses (TPE only).

    In a shared study each step is retried through a lost connection (:func:`with_retries`), as every other step of
    a worker is: before, a database restarting just then stopped the elected worker right after its calibration.
    """
    study = prepared.study
    def retried(step: Callable[[], T]) -> T:  # through a lost connection; a lone study's storage (a local file) once
        return with_retries(step, study.storage) if is_shared(study.storage) else step()

    if not retried(study.is_empty):
        return
    guesses = []
    if config.trials > 1 and config.sampler == "tpe":
        guesses = guess_setups(space, calibration, prepared.device, prepared.placement.rank_cores)[: config.trials - 1]
    with interrupts_held():  # all or none: a rerun queues them only into an empty study
        retried(partial(study.enqueue, ROLE_DEFAULTS, {}))
        for guess in guesses:
            retried(partial(study.enqueue, ROLE_GUESS, space.params_for(guess)))


def confirm_finalists(
    config: SearchConfig, prepared: Prepared, records: list[TrialRecord], calibration: Calibration, defaults: TrainSetup,
    options: TrialOptions, reporter: Reporter, runner: TrialRunner, reuse: bool = False,
) -> list[Confirmed]:
    """Re-measure the finalists and the defaults in interleaved rounds of one trial length each; with ``reuse`` (a run
    of a lone study that added no trial), take the last finished confirmation of the same finalists instead.

    Raises:
        KeyboardInterrupt: Ctrl-C or SIGTERM; the rounds measured so far are stored.
    """
    fp32 = allows(config.constraints, "amp", "off")  # the finalists' float32 twins join, and an unstable precision goes whole
    candidates = pick_candidates(records, defaults, config.confirm_top, fp32_twin=fp32, fp32_allowed=fp32,
                                 calibration=calibration, baseline_only=excluding(config.pins, defaults) is not None)
    if reuse and (kept := prepared.study.reuse_rounds({c.key for c in candidates}, config.confirm_rounds))[0]:
        reporter.message(REUSED)
        return list(stored_confirmed(prepared.study, records, *kept))
    reporter.message(confirmation_plan(candidates, options.trial_seconds, config.confirm_rounds))
    with sigterm_as_interrupt():
        confirmed = confirm(candidates, prepared.workload, options, rounds=config.confirm_rounds, known=prepared.study.confirmation(),
                            store=prepared.study.store_confirmation, runner=runner, baseline=defaults.to_json(),
                            on_measure=lambda done, total, cand, result: reporter.confirm_progress(done, total, cand.label, result))
    # The winner written next rests on them (a rerun's do not replace them), and on the peaks they measured.
    prepared.study.keep_winner_rounds(config.confirm_rounds, {c.candidate.key: c.peak_bytes for c in confirmed if c.peak_bytes})
    return confirmed


def with_ceilings(outcome: SearchOutcome, prepared: Prepared, options: TrialOptions, runner: TrialRunner) -> SearchOutcome:
    """Measure the winner computing alone and loading alone; redo the verdict with them beside its confirmed median.

    Raises:
        KeyboardInterrupt: Ctrl-C or SIGTERM; best.json and train.py are already written.
    """
    best = outcome.best
    assert best is not None
    rounds = next((c for c in outcome.confirmed if c.candidate.setup == best.setup and c.median is not None), None)
    short = replace(options, trial_seconds=max(1.0, options.trial_seconds / 2), windows=3)
    with sigterm_as_interrupt():
        ceilings = measure_ceilings(best.setup, prepared.workload, short, together=rounds.median if rounds else None,
                                    wait=rounds.data_wait if rounds else None, runner=runner)
    verdict = bottleneck_verdict(best, outcome.calibration, list(outcome.records), prepared.device, ceilings)
    return replace(outcome, ceilings=ceilings, verdict=verdict)


def finish(
    config: SearchConfig, prepared: Prepared, calibration: Calibration, records: list[TrialRecord], feasible: list[TrialRecord],
    confirmed: list[Confirmed], defaults: TrainSetup, interrupted: bool, write: bool = True, partial_rounds: tuple[Confirmed, ...] = (),
    stopped_by: str = "",
) -> SearchOutcome:
    """Write best.json and train.py (not with ``write=False``: an earlier confirmed winner stays); the outcome with the verdict.

    ``partial_rounds``: the rounds of a confirmation interrupted before it ended, shown with the outcome but not ranked.
    """
    out = prepared.out
    best = make_best(
        workload=prepared.workload, hardware=prepared.hardware, feasible=feasible, confirmed=confirmed, defaults=defaults,
        effective_batch=config.effective_batch, world_size=prepared.placement.world_size, command=config.command, interrupted=interrupted,
        excluded_by=excluding(config.pins, defaults), partial=partial_rounds, batch_pin=config.pins.get("batch_size"),
        defaults_ran=any(r.setup == defaults for r in records), stopped_by=stopped_by, tried=records, amp_pin=config.pins.get("amp"),
    )
    best = replace(best, study=prepared.study.name)
    if note := compiled_note(prepared.workload):
        best = replace(best, notes=(*best.notes, note))
    slots = prepared.placement.slots
    if prepared.placement.parallel and prepared.device.type == "cpu":  # each trial had a share of the cores; train.py has all
        best = replace(best, torch_threads=None, notes=(*best.notes, (
            f"measured with --devices: every trial, the PyTorch defaults' too, ran pinned to {counted(len(slots[0].cores), 'core')} "
            f"beside {counted(len(slots) - 1, 'other trial')}, and the confirmation's rounds on those cores alone; train.py runs "
            "one process on every core, so its speed, and the "
            "num_workers and num_threads that suit it, may differ from these figures (a search without --devices measures that run)")))
    try:
        written = write_winner(best, out) if write else ()
    except EmitError as exc:  # a full disk at the very end: what is stored stays, the rerun writes the winner
        raise StorageError(f"{exc}; {counted(counted_records(records), 'finished trial')} kept in {prepared.study.storage}: fix that (a "
                           "full disk: free some space) and rerun the same command (it keeps the confirmation's rounds, then writes "
                           "best.json and train.py)") from None
    return SearchOutcome(
        best=best,
        records=tuple(records),
        confirmed=tuple(confirmed) or partial_rounds,
        calibration=calibration,
        verdict=bottleneck_verdict(best, calibration, records, prepared.device),
        out=out,
        storage=prepared.study.storage,
        study=prepared.study.name,
        interrupted=interrupted,
        files=(str(out / "trials.csv"), *written),
    )
