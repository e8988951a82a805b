"""Many workers, one study: ``autotune search --storage URL --study NAME`` started on several machines.

Every worker runs the same search loop against the shared study; the study
itself is the only coordinator:

* **Elections** (:mod:`autotune.tuner.elections`). Work that must happen once (the calibration and the first
  trials; the confirmation of a ``--trials`` budget) goes to the worker with the lowest-numbered live election marker.
  The others wait for the result while the elected worker makes progress: they stop only after :attr:`Crew.wait_s` in
  which it stored nothing (no calibration run, no confirmation measurement). Joining is an election too: the first
  live worker's search settings (its signature) are the study's, so a worker started at the same moment with another
  ``--image-size`` or ``--set`` is refused before the study stores either.
* **Budget.** ``--trials`` is the total over workers: a worker asks only while finished plus running trials are
  below it, and after asking counts again; when the others' trials already fill the budget it gives its trial back
  (failed, its fixed parameters queued again) and waits. A worker of another ``--trials`` says so as it joins.
* **Crashes.** A running trial records Optuna heartbeats (server storages); every worker fails trials whose heartbeat
  went stale (``optuna.storages.fail_stale_trials``, which queues them again) and, on any storage, trials of a worker
  on this host whose process is gone.
* **Lost storage.** Every storage step is retried with backoff (:func:`~autotune.tuner.storage.with_retries`); a
  worker that gives up writes what it measured to its own ``trials.csv`` first.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import SearchInterrupted, StorageError, StudyMismatch
from autotune.output.best import Best
from autotune.records import Calibration, TrialRecord, TrialResult
from autotune.runner import TrialRunner
from autotune.tuner import elections
from autotune.tuner.budget import STUDY_BUDGET, store_budget
from autotune.tuner.cohosts import CoreSharing
from autotune.tuner.config import SearchOutcome
from autotune.tuner.explore import Exploration, check_recipe, known_result, pruning_hook, queue_refinements, setup_for, starved
from autotune.tuner.heartbeats import failed_elsewhere, heartbeats, stale_trial_ids, stalled_line
from autotune.tuner.identity import signature_difference
from autotune.tuner.lock import STALE_AFTER_S, Holder
from autotune.tuner.patience import Patience
from autotune.tuner.pending import PendingTrial, kept_pending
from autotune.tuner.progress import Reporter
from autotune.tuner.signals import interrupts_held, sigterm_as_interrupt
from autotune.tuner.storage import CONNECTION_ERRORS, with_retries
from autotune.tuner.study import ATTR_MARKER, ATTR_ROLE, ATTR_WORKER, ROLE_SEARCH, STUDY_WINNER, SearchStudy
from autotune.tuner.study_facts import stored_confirmed

T = TypeVar("T")
R = TypeVar("R")

#: Study user attributes of a shared study.
STUDY_READY = "first_trials"  # set once calibration and the first trials are in: who did it

MARKER_CALIBRATE = "calibrate"
#: The election of the worker whose search settings (signature, on its marker) the others must share.
MARKER_JOIN = "join"
ATTR_SIGNATURE = "signature"


def confirm_marker(trials: int) -> str:
    """The election for confirming a budget of ``trials``."""
    return f"confirm@{trials}"


def shared_signature(signature: dict[str, Any]) -> dict[str, Any]:
    """A signature all workers share: the device's kind, not its index (``cuda:1`` joins ``cuda:0``)."""
    device = str(signature.get("device", ""))
    return {**signature, "device": device.split(":")[0]}


@dataclass
class Crew:
    """This worker's view of a shared study.

    Attributes:
        study: The shared study.
        wait_s: The longest wait without progress for another worker's calibration or confirmation.
        poll_s: Seconds between looks at the study while waiting.
        me: This worker.
    """

    study: SearchStudy
    wait_s: float
    poll_s: float = 1.0
    me: Holder = field(default_factory=Holder.me)
    waited_s: float = field(default=0.0, init=False)  #: waiting for the others (their calibration, confirmation, last trials)

    def __post_init__(self) -> None:
        self.study.alive_key = self.me.alive_key()  # its calibration and confirmation keep its election marker alive

    def _retry(self, step: Callable[[], T], on_give_up: Callable[[], None] | None = None) -> T:
        return with_retries(step, self.study.storage, on_give_up=on_give_up)

    def _attrs(self) -> dict[str, Any]:
        return self._retry(lambda: dict(self.study.study.user_attrs))

    # ------------------------------------------------------------ joining
    def join(self, signature: dict[str, Any]) -> list[int]:
        """Check this worker may join (same fingerprint and search); fail what dead workers left running.

        Raises:
            StudyMismatch: The fingerprint or the search differs, naming the first difference (a usage error, as where the
                study already stores the other search's settings).
        """
        mine = shared_signature(signature)
        with interrupts_held():  # the first live worker to join sets the search: one started with other settings is refused
            first, marker = self._retry(lambda: elections.enter(self.study.study, self.me, MARKER_JOIN, {ATTR_SIGNATURE: mine}))
        difference = None if self.is_me(first) else signature_difference(marker.user_attrs.get(ATTR_SIGNATURE) or {}, mine)
        if difference is not None:
            raise StudyMismatch(f"study {self.study.name!r} in {self.study.storage} is being searched by {first.describe()} for a "
                               f"different search ({difference}); start this worker with the same settings, or pass --study NEW_NAME")
        self._retry(lambda: self.study.check_signature(mine))
        return self.fail_stale()

    def fail_stale(self) -> list[int]:
        """Fail (and queue again) trials left running by dead workers; their numbers."""
        def step() -> list[int]:
            running = self.study.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if not running:
                return []
            # Failed by Optuna just below: this call's (another worker may fail some first; then both say so).
            stale_ids = stale_trial_ids(self.study.study)
            stale = {t.number for t in running if t._trial_id in stale_ids}
            optuna.storages.fail_stale_trials(self.study.study)
            failed = {t.number for t in self.study.study.get_trials(deepcopy=False, states=(TrialState.FAIL,))} & stale
            for t in self.study.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
                holder = Holder.from_dict(t.user_attrs.get(ATTR_WORKER))
                if holder is not None and holder.host == self.me.host and not holder.alive():
                    try:
                        self.study.study.tell(t.number, state=TrialState.FAIL)
                    except Exception:  # another worker failed it first
                        continue
                    self._requeue(t)
                    failed.add(t.number)
            return sorted(failed)

        with interrupts_held():
            return self._retry(step)

    def _requeue(self, trial: FrozenTrial) -> None:
        """Queue a failed trial again with its parameters, role and fixed parameters."""
        self.study.study.add_trial(optuna.create_trial(
            state=TrialState.WAITING, params=trial.params, distributions=trial.distributions,
            user_attrs={k: v for k, v in trial.user_attrs.items() if k != ATTR_WORKER},
            system_attrs={**trial.system_attrs, "failed_trial": trial.number}))

    # ------------------------------------------------------------ elections
    def leads(self, kind: str) -> Holder:
        """Enter the election ``kind`` (once) and return its winner among the live markers."""
        # The marker carries the time it was entered: on another host a marker older than STALE_AFTER_S is passed over,
        # and one stamped with this worker's start was, once a search had run that long.
        entering = replace(self.me, heartbeat=time.time())
        with interrupts_held():
            # A run of the elected worker may last longer than STALE_AFTER_S: its marker counts as alive that long.
            return self._retry(lambda: elections.enter(self.study.study, entering, kind, stale_after=max(STALE_AFTER_S, self.wait_s)))[0]

    def is_me(self, holder: Holder) -> bool:
        """Whether ``holder`` is this worker."""
        return self.me.same_process(holder)

    def once(self, work: Callable[[], T], reporter: Reporter) -> T | None:
        """Calibrate and queue the first trials in exactly one worker; the others wait for it.

        Returns:
            What ``work`` returned in the worker that ran it; None in the others.

        Raises:
            StorageError: The elected worker stored nothing for :attr:`wait_s`.
            SearchInterrupted: Ctrl-C, SIGTERM or SIGHUP while this worker waited.
        """
        ready = self._until(
            MARKER_CALIBRATE, lambda attrs: attrs.get(STUDY_READY), reporter,
            waiting=lambda leader: f"worker of study {self.study.name!r}: waiting for {leader.describe()} to calibrate",
            gave_up=lambda leader: (f"study {self.study.name!r}: {leader.describe()} stored no calibration run for {self.wait_s:.0f} s; "
                                    "rerun this worker once it has finished calibrating (or once it is gone)"),
            stopped=lambda leader: (f"interrupted while {leader} calibrated study {self.study.name!r}: this worker measured nothing; "
                                    "rerun the same command to join the study again"),
        )
        if ready is not None:  # the elected worker's
            return None
        value = work()
        self._retry(lambda: self.study.study.set_user_attr(STUDY_READY, self.me.to_dict()))
        return value

    def confirm_or_wait(self, trials: int, reporter: Reporter) -> dict[str, Any] | None:
        """The stored winner of this budget (waiting for the elected worker), or None when this worker confirms.

        Raises:
            StorageError: The elected worker stored nothing for :attr:`wait_s`, in one line.
            SearchInterrupted: Ctrl-C, SIGTERM or SIGHUP while this worker waited (its finished trials are in the study).
        """

        def stored(attrs: dict[str, Any]) -> dict[str, Any] | None:
            winner = attrs.get(STUDY_WINNER)
            return winner if isinstance(winner, dict) and winner.get("trials") == trials else None

        return self._until(
            confirm_marker(trials), stored, reporter,
            waiting=lambda leader: f"{trials} trials finished: {leader.describe()} confirms the finalists; waiting for its winner",
            gave_up=lambda leader: (f"study {self.study.name!r}: no winner from {leader.describe()}, which stored no confirmation "
                                    f"measurement for {self.wait_s:.0f} s; rerun a worker's search command to confirm it once that worker has ended"),
            stopped=lambda leader: (f"interrupted while {leader} confirmed the finalists of study {self.study.name!r}: "
                                    f"the study's finished trials are kept in {self.study.storage}; `autotune status` shows its winner "
                                    "once written, and the same command reruns to write it to this --out"),
        )

    def _until(self, marker: str, found: Callable[[dict[str, Any]], R | None], reporter: Reporter, *,
               waiting: Callable[[Holder], str], gave_up: Callable[[Holder], str], stopped: Callable[[str], str]) -> R | None:
        """What ``found`` reads in the study's attributes once it reads something (``waiting`` said once meanwhile), or
        None once this worker is elected for ``marker``. A StorageError of ``gave_up``'s line after :attr:`wait_s` without
        progress; a SearchInterrupted of ``stopped``'s line (given the elected worker) on Ctrl-C, SIGTERM or SIGHUP meanwhile."""
        patience = Patience(self.wait_s, time.monotonic)
        told, leader, began = False, None, time.monotonic()
        try:
            with sigterm_as_interrupt():
                while (value := found(attrs := self._attrs())) is None:
                    patience.saw(attrs)
                    waited_for, leader = leader, self.leads(marker)
                    if self.is_me(leader):
                        if waited_for is None or self.is_me(waited_for):
                            return None
                        if (value := found(self._attrs())) is not None:  # it stored its result, then ended
                            return value
                        reporter.message(f"{waited_for.describe()} is gone before it was done; this worker takes over")
                        return None
                    if not told:
                        reporter.message(waiting(leader))
                        told = True
                    if patience.over():
                        raise StorageError(gave_up(leader))
                    time.sleep(self.poll_s)
        except KeyboardInterrupt:
            raise SearchInterrupted(stopped(leader.describe() if leader is not None else "another worker")) from None
        finally:
            self.waited_s += time.monotonic() - began
        return value

    def publish(self, best: Best, trials: int, out: Path) -> None:
        """Store the confirmed winner for the other workers and ``autotune status``, with its budget as the study's.

        Workers started with different ``--trials`` each store theirs when they start; the winner stored last
        stands for the study, so its budget does too (``autotune status`` and ``report`` show a winner only
        of the study's budget: otherwise a worker of another ``--trials`` that started after this one hid it).
        """
        winner = {"trials": trials, "best": best.to_dict(), "by": self.me.describe(), "out": str(out.resolve())}

        def step() -> None:
            self.study.study.set_user_attr(STUDY_WINNER, winner)
            self.study.study.set_user_attr(STUDY_BUDGET, trials)

        with interrupts_held():
            self._retry(step)

    def outcome(self, winner: dict[str, Any], records: list[TrialRecord], calibration: Calibration, out: Path, csv_path: Path) -> SearchOutcome:
        """The search outcome of a worker that did not confirm: the winner another worker stored."""
        (verdict, ceilings), best = self._retry(self.study.verdict), Best.from_dict(winner["best"])
        by, there = winner.get("by"), winner.get("out")  # out itself, on this host: a rerun of the search that confirmed it
        here = there == str(out.resolve()) and str(by).endswith(f" on {self.me.host}")  # not another host's namesake folder
        where = (f"confirmed by an earlier run of this search in {out} ({by})" if here else
                 f"confirmed by the worker {by}, which wrote best.json and train.py to {there}; this worker wrote the same to {out}")
        return SearchOutcome(
            best=replace(best, notes=(where, *best.notes)), records=tuple(records), calibration=calibration,
            confirmed=self._retry(lambda: stored_confirmed(self.study, records)),
            verdict=verdict or f"confirmed by {by}, written to {there}",
            out=out, storage=self.study.storage, study=self.study.name, files=(str(csv_path),), ceilings=ceilings,
        )

    # ------------------------------------------------------------ the loop
    def explore(self, study: SearchStudy, plan: Exploration, reporter: Reporter, runner: TrialRunner) -> None:
        """Run trials until the study holds ``plan.wanted`` finished ones, counted over every worker.

        Raises:
            KeyboardInterrupt: Ctrl-C or SIGTERM; the running trial is failed and queued again.
            StorageError: The storage stayed unreachable; this worker's results are in its trials.csv.
        """
        if (earlier := self._attrs().get(STUDY_BUDGET)) not in (None, plan.wanted):  # a typo on one node changes the result
            reporter.message(f"the study's budget was --trials {earlier}; this worker's --trials {plan.wanted} replaces it: "
                             "workers of both budgets may each confirm a winner, and the one stored last stands for the study")
        self._retry(lambda: store_budget(study.study, plan.wanted))
        known = self._retry(study.records)  # what trials.csv holds if the storage is lost before the next trial ends
        waiting, sharing = False, CoreSharing(self.me, plan.workload.device, plan.options.cores)
        while True:
            if stale := self.fail_stale():  # a worker that died mid-trial: its trial runs again here or in another worker
                reporter.message(f"left running by a worker that is gone, marked failed and queued again: {', '.join(f'trial #{n}' for n in stale)}")
            finished, running = self._retry(lambda: study.counts(plan.wanted))
            if finished >= plan.wanted:
                return
            if finished + running >= plan.wanted:
                if not waiting:
                    reporter.message(f"{finished}/{plan.wanted} trials finished; the last ones run on other workers")
                    waiting = True
                began = time.monotonic()
                time.sleep(self.poll_s)
                self.waited_s += time.monotonic() - began
                continue
            waiting = False
            self._retry(lambda: queue_refinements(study, plan))
            if said := self._retry(lambda: sharing.check(study)):  # another worker on these cores: both measure each other
                reporter.message(said)
            trial = self._ask(study, plan.wanted)
            if trial is None:
                time.sleep(self.poll_s * random.uniform(0.5, 1.5))
                continue
            known = self._one(study, plan, reporter, runner, trial, known)

    def _ask(self, study: SearchStudy, wanted: int) -> optuna.Trial | None:
        """A trial of this worker, or None when the others filled the budget meanwhile (given back)."""
        def step() -> optuna.Trial:
            trial, _ = study.ask()
            trial.set_user_attr(ATTR_WORKER, replace(self.me, heartbeat=time.time()).to_dict())  # another host: alive 30 min
            return trial

        trial = None
        try:
            with interrupts_held():
                trial = self._retry(step)
                finished, running = self._retry(lambda: study.counts(wanted, besides=trial.number))
                if finished + running < wanted:
                    return trial
                self._give_back(study, trial)
                return None
        except KeyboardInterrupt:  # a stop held while the trial was asked, raised as the block ends: given back, not left RUNNING
            if trial is not None:
                with interrupts_held(), contextlib.suppress(StorageError, *CONNECTION_ERRORS):
                    self._give_back(study, trial)
            raise

    def _give_back(self, study: SearchStudy, trial: optuna.Trial, *, unrun: bool = True) -> None:
        def step() -> None:
            frozen = study.study.get_trials(deepcopy=False)[trial.number]
            if frozen.state.is_finished():  # failed and queued again by another worker while this one stalled
                return
            if unrun:  # never ran (the budget filled meanwhile): `autotune status` counts it neither measured nor cut short
                trial.set_user_attr(ATTR_MARKER, "given back")
            study.study.tell(trial.number, state=TrialState.FAIL)
            if ATTR_ROLE in frozen.user_attrs or frozen.system_attrs.get("fixed_params") or frozen.params:
                self._requeue(frozen)

        self._retry(step)

    def _one(
        self, study: SearchStudy, plan: Exploration, reporter: Reporter, runner: TrialRunner, trial: optuna.Trial, known: list[TrialRecord]
    ) -> list[TrialRecord]:
        """Run, record and tell one trial; the study's records after it."""
        pending: list[TrialRecord] = []

        def keep_locally() -> None:  # the storage is gone: what this worker measured stays in its --out
            plan.write_csv([*known, *pending])

        try:
            with interrupts_held():
                role = str(trial.user_attrs.get(ATTR_ROLE, ROLE_SEARCH))
                setup = self._retry(lambda: setup_for(trial, role, plan), keep_locally)
                finished, _ = self._retry(lambda: study.counts(plan.wanted), keep_locally)
                reporter.trial_started(finished, plan.wanted, role, setup)
                without_run = self._retry(lambda: known_result(study, setup, trial.number, plan.workload), keep_locally)
            result: TrialResult
            if without_run is None:
                with heartbeats(study.study, trial._trial_id):
                    result = runner(setup, plan.workload, plan.options, on_window=pruning_hook(trial, role))
                reused_from = None
            else:
                result, reused_from = without_run.result, without_run.reused_from
            free = without_run is not None or starved(result)
            pending.append(TrialRecord(trial.number, role, setup, result, reused_from, free))
            with interrupts_held():
                try:
                    self._retry(lambda: study.record(trial, role, setup, result, reused_from, free), keep_locally)
                    self._retry(lambda: study.tell(trial, result), keep_locally)
                except StorageError as exc:  # measured, not stored: kept in --out until the rerun adds it
                    raise kept_pending(plan.out, PendingTrial.of(study, trial, role, setup, result, reused_from, free), exc) from None
                except (optuna.exceptions.UpdateFinishedTrialError, ValueError):  # ValueError: "Cannot tell a FAIL trial"
                    if not self._retry(lambda: failed_elsewhere(study.study, trial.number)):
                        raise
                    reporter.message(stalled_line(trial.number))
                    return self._retry(study.records, keep_locally)
        except BaseException as exc:  # Ctrl-C, bad data: the unfinished trial does not count; it is queued again
            if not isinstance(exc, StorageError):
                with interrupts_held():
                    try:
                        self._give_back(study, trial, unrun=False)  # a stop cut it short: `autotune status` says so
                    except StorageError:
                        pass
            raise
        with interrupts_held():
            records = self._retry(study.records, keep_locally)
            plan.write_csv(records)
            check_recipe(records, plan.workload)
            best = plan.best(records)
            record = next((r for r in records if r.number == trial.number), pending[0])
            reporter.trial_finished(self._retry(lambda: study.counts(plan.wanted))[0], plan.wanted, record, best)
        return records
