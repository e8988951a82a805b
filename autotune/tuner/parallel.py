"""Several trials at once, one per device of ``--devices``.

The main thread does every storage write (ask, record, tell) with interrupts
held, as :func:`~autotune.tuner.explore.explore` does; one thread per running
trial only waits for its trial process. The sampler is TPE with
``constant_liar`` (set when the study is opened), so trials asked while
others still run do not all land on the same point. Each trial records its
wall-clock start and end, so the overlap can be read from the study.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from dataclasses import dataclass

import optuna

from autotune.records import TrialResult
from autotune.runner import TrialRunner, WindowCallback
from autotune.train_setup import TrainSetup
from autotune.tuner.explore import (
    Exploration,
    check_recipe,
    explore,
    known_result,
    pruning_hook,
    queue_refinements,
    setup_for,
    starved,
    store_lone_budget,
)
from autotune.tuner.pending import PendingTrial, kept_pending
from autotune.tuner.placement import Placement
from autotune.tuner.progress import Reporter
from autotune.tuner.signals import interrupts_held
from autotune.tuner.storage import DATABASE_ERRORS, storage_failure
from autotune.tuner.study import ATTR_ENDED, ATTR_STARTED, SearchStudy

#: How long the main thread waits for the running trials to stop after an interrupt.
STOP_WAIT_S = 15.0


def explore_placed(placement: Placement, study: SearchStudy, plan: Exploration, reporter: Reporter, runner: TrialRunner) -> None:
    """Run trials until ``plan.wanted`` are finished: one at a time, or one per slot of ``placement`` at once.

    Raises:
        KeyboardInterrupt: Ctrl-C or SIGTERM; running trials are failed (they
            do not count) and every finished one is kept.
        WorkloadError: A data file cannot be decoded; the same.
    """
    if not placement.parallel:
        explore(study, plan, reporter, placement.runner(runner))
        return
    store_lone_budget(study, plan, reporter)  # as explore() does: `autotune status` shows the rerun's larger --trials
    _Parallel(placement, study, plan, reporter, runner).run()


@dataclass
class _Running:
    trial: optuna.Trial
    role: str
    setup: TrainSetup


@dataclass(frozen=True)
class _Finished:
    slot: int
    result: TrialResult | None
    error: BaseException | None
    started: float
    ended: float


class _Parallel:
    def __init__(self, placement: Placement, study: SearchStudy, plan: Exploration, reporter: Reporter, runner: TrialRunner) -> None:
        self.study = study
        self.plan = plan
        self.reporter = reporter
        self.runners = [placement.runner(runner, k) for k in range(len(placement.slots))]
        self.free = list(range(len(placement.slots)))
        self.running: dict[int, _Running] = {}
        self.finished: queue.Queue[_Finished] = queue.Queue()
        self.cancel = threading.Event()

    def run(self) -> None:
        try:
            while True:
                self.fill()
                if not self.running:
                    return
                self.collect(self.wait())
        except BaseException:
            self.cancel.set()
            with interrupts_held():
                for entry in self.running.values():
                    try:
                        self.study.fail(entry.trial)
                    except DATABASE_ERRORS:  # the storage is gone: the error already raised says so; the rerun fails it
                        pass
            self.drain()
            raise

    def fill(self) -> None:
        """Start a trial on every free slot while more are wanted."""
        while self.free and (done := self.study.finished(self.plan.wanted)) + len(self.running) < self.plan.wanted:
            slot = self.free.pop(0)
            trial = None
            try:
                with interrupts_held():
                    queue_refinements(self.study, self.plan)
                    trial, role = self.study.ask()
                    setup = setup_for(trial, role, self.plan)
                    self.reporter.trial_started(done + len(self.running), self.plan.wanted, role, setup)
                    known = known_result(self.study, setup, trial.number, self.plan.workload)
            except BaseException:  # a space the study's trials were not sampled from, or a stop held while it was asked
                if trial is not None:  # (raised as the block ends): it ran nothing; not left RUNNING "on an unknown worker"
                    with interrupts_held(), contextlib.suppress(*DATABASE_ERRORS):
                        self.study.fail(trial)
                raise
            self.running[slot] = _Running(trial, role, setup)
            if known is not None:
                now = time.time()
                self.collect(_Finished(slot, known.result, None, now, now), known.reused_from, free=True)
                continue
            hook = pruning_hook(trial, role)
            threading.Thread(target=self.measure, args=(slot, setup, hook), name=f"autotune-slot-{slot}", daemon=True).start()

    def measure(self, slot: int, setup: TrainSetup, hook: WindowCallback | None) -> None:
        """In a thread: run one trial on ``slot`` and hand its result to the main thread."""

        def on_window(index: int, value: float) -> bool:
            return self.cancel.is_set() or (hook is not None and hook(index, value))

        started = time.time()
        try:
            result = self.runners[slot](setup, self.plan.workload, self.plan.options, on_window=on_window)
            self.finished.put(_Finished(slot, result, None, started, time.time()))
        except BaseException as exc:  # an interrupted trial, bad data: re-raised in the main thread
            self.finished.put(_Finished(slot, None, exc, started, time.time()))

    def wait(self) -> _Finished:
        while True:
            try:
                return self.finished.get(timeout=0.2)
            except queue.Empty:
                continue

    def collect(self, done: _Finished, reused_from: int | None = None, free: bool = False) -> None:
        """Store a finished trial (the main thread only)."""
        entry = self.running.pop(done.slot)
        self.free.append(done.slot)
        if done.error is not None or done.result is None:
            with interrupts_held():
                self.study.fail(entry.trial)
            raise done.error or RuntimeError("a parallel trial ended without a result")
        trial = entry.trial
        with interrupts_held():
            free = free or starved(done.result)
            try:
                trial.set_user_attr(ATTR_STARTED, done.started)
                trial.set_user_attr(ATTR_ENDED, done.ended)
                self.study.record(trial, entry.role, entry.setup, done.result, reused_from, free)
                self.study.tell(trial, done.result)
            except DATABASE_ERRORS as exc:  # measured, not stored: kept in --out for the rerun, which fails the trial
                kept = PendingTrial.of(self.study, trial, entry.role, entry.setup, done.result, reused_from, free,
                                       **{ATTR_STARTED: done.started, ATTR_ENDED: done.ended})
                raise kept_pending(self.plan.out, kept, storage_failure(self.study.storage, exc)) from None
            records = self.study.records()
            self.plan.write_csv(records)
            check_recipe(records, self.plan.workload)
            best = self.plan.best(records)
            record = next(r for r in records if r.number == trial.number)
            self.reporter.trial_finished(self.study.finished(self.plan.wanted), self.plan.wanted, record, best)

    def drain(self) -> None:
        """After an interrupt: wait a while for the running trials' threads to stop (they prune at the next window)."""
        deadline = time.monotonic() + STOP_WAIT_S
        while self.running and time.monotonic() < deadline:
            try:
                done = self.finished.get(timeout=0.2)
            except queue.Empty:
                continue
            self.running.pop(done.slot, None)
