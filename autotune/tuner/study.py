"""Everything the search keeps in an Optuna storage.

A :class:`SearchStudy` wraps one ``optuna.Study`` and reads and writes what
every search keeps there: per trial its role, setup, result and the trial it
reused; per study the search signature and the TPE start-up schedule. Each
user-attribute key is a named constant in the module that owns it: this
one's below; the budget and free trials in :mod:`~autotune.tuner.budget`; the
neighbour and compile trials in :mod:`~autotune.tuner.neighbours` and
:mod:`~autotune.tuner.refine`; a shared study's elections in
:mod:`~autotune.tuner.workers`; the calibration, confirmation rounds, time
spent and verdict in :mod:`~autotune.tuner.stores`. Writes that belong
together happen with interrupts held (:func:`~autotune.tuner.signals.interrupts_held`:
the calibration and confirmation stores hold them themselves, the callers
that write in a loop or a sequence around the rest), so a Ctrl-C never
leaves half of them written.
"""

from __future__ import annotations

import json
import uuid
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import StorageError, StudyMismatch
from autotune.records import TrialRecord, TrialResult
from autotune.redact import hide_passwords, hide_url_password
from autotune.runner.failures import killed_from_outside
from autotune.train_setup import TrainSetup
from autotune.tuner.budget import ATTR_FREE, FINISHED, STUDY_BUDGET, counted_toward_budget, progress
from autotune.tuner.constraints import Constraint, excluding
from autotune.tuner.identity import signature_difference
from autotune.tuner.lock import IN_THIS_PROCESS, Holder, hold_here, let_go_here, let_go_on_error, study_key
from autotune.tuner.pruning import ScreeningPruner
from autotune.tuner.storage import DATABASE_ERRORS, cause_said, connection_lost, open_storage, with_retries
from autotune.tuner.storage_urls import foreign_sqlite, storage_file
from autotune.tuner.stored_records import UnreadableRecord, stored_result, stored_setup
from autotune.tuner.stores import StudyStores

# Trial roles (also ``neighbours.ROLE_NEIGHBOUR`` and ``refine.ROLE_COMPILE``).
ROLE_DEFAULTS = "defaults"
ROLE_GUESS = "guess"
ROLE_SEARCH = "search"

# Trial user attributes.
ATTR_ROLE = "role"
ATTR_SETUP = "setup"
ATTR_RESULT = "result"
ATTR_REUSED_FROM = "reused_from"
ATTR_MARKER = "marker"  # a shared study's election entry (autotune.tuner.workers), not a measurement
#: Trial user attribute: the worker (a :class:`~autotune.tuner.lock.Holder`) of a shared study running the trial.
ATTR_WORKER = "worker"
#: Wall-clock start and end (Unix seconds) of a trial run in parallel with others.
ATTR_STARTED, ATTR_ENDED = "started", "ended"

# Study user attributes.
STUDY_SIGNATURE = "signature"
STUDY_STARTUP_TRIALS = "n_startup_trials"
STUDY_HOLDER = "holder"
STUDY_WINNER = "winner"  # a shared study's confirmed winner of a budget: {"trials", "best", "by", "out"}

def startup_trials_for(trials: int) -> int:
    """TPE's random start-up trials for a search of ``trials`` trials."""
    return max(3, min(10, trials // 3))


def _sampler(kind: str, seed: int, n_startup: int, liar: bool = False) -> optuna.samplers.BaseSampler:
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    # constant_liar: trials running elsewhere count as bad, so the next ask samples apart from them.
    return optuna.samplers.TPESampler(seed=seed, n_startup_trials=n_startup, multivariate=True, group=True, constant_liar=liar)


class SearchStudy(StudyStores):
    """One search's Optuna study and what the search stores in it.

    Attributes:
        study: The underlying ``optuna.Study``.
        storage: Its storage URL, password hidden (for messages and records).
        name: Its name.
    """

    def __init__(self, study: optuna.Study, storage: str, name: str) -> None:
        self.study = study
        self.storage = hide_url_password(storage)
        self.name = name
        self._holder: Holder | None = None
        #: This run (one process opening the study), so confirmation rounds are never mixed across runs.
        self.run_id = uuid.uuid4().hex

    @classmethod
    def open(
        cls, storage: str, name: str, *, sampler: str = "tpe", seed: int = 0, trials: int = 30, shared: bool = False,
        parallel: bool = False, in_out: bool = False, pins: dict[str, Constraint] | None = None,
    ) -> SearchStudy:
        """Create or resume the study ``name`` in ``storage`` (URL forms in :mod:`autotune.tuner.storage_urls`).

        The TPE start-up schedule is fixed when the study is created, so a resumed study (with a larger ``--trials``)
        keeps the one it began with. A resumed study's sampler is seeded ``seed`` plus the trials it holds, so it draws
        new points rather than the first run's again. A ``shared`` study's TPE lies about running trials
        (``constant_liar``) so workers do not all sample the same point.
        The screening pruner's bar is the fastest finished trial the search's ``pins``
        (its ``--set``) allow: the PyTorch defaults they exclude are the baseline only.

        Raises:
            StorageError: The storage cannot be opened (a database server's connection lost meanwhile is retried, as
                every storage step is), or ``name`` is a study another program filled (trials, no search signature), refused
                before anything is written to it (``in_out``: the storage is ``--out``'s own ``study.db``).
        """
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
        backend = open_storage(storage)  # a URL that reaches nothing fails here, at once

        def opened() -> optuna.Study:  # repeatable: a connection lost meanwhile (a server restarting) runs it again
            n_startup, drawn = startup_trials_for(trials), 0
            try:
                existing = optuna.load_study(study_name=name, storage=backend)
            except KeyError:  # a new study
                existing = None
            if existing is not None:
                n_startup = int(existing.user_attrs.get(STUDY_STARTUP_TRIALS, n_startup))
                drawn = len(existing.get_trials(deepcopy=False))  # a sampler seeded as in the first run draws its points again
                if foreign := _foreign_trials(existing):
                    raise _foreign(name, hide_url_password(storage), foreign, f"pass {'another --out' if in_out else '--study NEW_NAME'}")
            study = optuna.create_study(storage=backend, study_name=name, direction="maximize", load_if_exists=True,
                                        sampler=_sampler(sampler, seed + drawn, n_startup, shared or parallel),
                                        pruner=ScreeningPruner(counts=_within(pins) if pins else None))
            if STUDY_STARTUP_TRIALS not in study.user_attrs:
                study.set_user_attr(STUDY_STARTUP_TRIALS, n_startup)
            if not shared and STUDY_BUDGET not in study.user_attrs:  # `autotune status` reads "0/N" during the calibration
                study.set_user_attr(STUDY_BUDGET, trials)
            return study

        try:
            try:
                study = opened()
            except DATABASE_ERRORS as exc:  # a server's lost connection is retried; a file that fails stays failed (read-only)
                if not connection_lost(storage, exc):
                    raise
                study = with_retries(opened, hide_url_password(storage))
            return cls(study, storage, name)
        except StorageError:
            raise
        except Exception as exc:  # sqlalchemy / redis / journal errors all differ
            message = f"cannot open study storage {storage!r}: {cause_said(storage, exc)}"
            raise StorageError(hide_passwords(message)) from None

    @classmethod
    def load(cls, storage: str, name: str | None = None) -> SearchStudy:
        """Open an existing study to read it (nothing is created or written).

        Args:
            storage: Optuna storage URL.
            name: Study name; None picks the only study in the storage.

        Raises:
            StorageError: The storage cannot be read, or holds no such study, or another program filled it.
        """
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        file = storage_file(storage)
        if file is not None and (not file.is_file() or file.stat().st_size == 0):  # opening it would create or write it
            raise StorageError(f"{storage}: holds no study ({file} is {'empty' if file.is_file() else 'missing'})")
        foreign = None if file is None else foreign_sqlite(storage, file)
        if foreign is not None:  # Optuna would write its tables into it
            raise StorageError(f"{hide_url_password(storage)}: holds no study ({foreign})")
        backend, url, storage = open_storage(storage), storage, hide_url_password(storage)  # the URL only names it in messages below
        try:
            names = optuna.get_all_study_names(backend)
        except Exception as exc:  # sqlalchemy / redis / journal errors all differ
            raise StorageError(hide_passwords(f"cannot read study storage {storage!r}: {cause_said(url, exc)}")) from None
        found = ", ".join(n if n.isprintable() else repr(n) for n in names)  # a name holding ESC would reach the terminal raw
        if name is None:
            if len(names) != 1:
                raise StorageError(f"{storage}: " + (f"{len(names)} studies ({found}); pass --study NAME" if names else "holds no study"))
            name = names[0]
        elif name not in names:
            raise StorageError(f"{storage}: no study {name!r} (studies there: {found or 'none'})")
        study = optuna.load_study(study_name=name, storage=backend)
        if foreign_trials := _foreign_trials(study):  # its trials are no search's: no setups, no results to show
            raise _foreign(name, storage, foreign_trials, "autotune reads only the studies of its own searches")
        return cls(study, storage, name)

    # ------------------------------------------------------------ study level
    def claim(self) -> None:
        """Become the study's only search (rules in :mod:`autotune.tuner.lock`).

        Raises:
            StorageError: Another live search holds the study, named in one line.
        """
        me, key = Holder.me(), study_key(self.storage, self.name)
        other = Holder.from_dict(self.study.user_attrs.get(STUDY_HOLDER))  # one of this process: ended, or another thread's
        other = other if other is not None and not other.same_process(me) and other.alive() else None
        if other is not None or not hold_here(key):
            raise StorageError(f"study {self.name!r} in {self.storage} is in use by another autotune search ("
                               f"{other.describe() if other else IN_THIS_PROCESS}); wait for it to finish or pass --study NEW_NAME")
        with let_go_on_error(key):
            self.study.set_user_attr(STUDY_HOLDER, me.to_dict())
        self._holder = me

    def heartbeat(self) -> None:
        """Refresh the claim's heartbeat (done with every stored trial)."""
        if self._holder is not None:
            self.study.set_user_attr(STUDY_HOLDER, Holder.me().to_dict())

    def release(self) -> None:
        """Give the study up, if this process holds it."""
        if self._holder is None:
            return
        self._holder = None
        try:
            stored = Holder.from_dict(self.study.user_attrs.get(STUDY_HOLDER))
            if stored is not None and stored.same_process(Holder.me()):
                self.study.set_user_attr(STUDY_HOLDER, None)
        finally:  # last: a thread that takes it then is the study's holder
            let_go_here(study_key(self.storage, self.name))

    def check_signature(self, signature: dict[str, Any], *, in_out: bool = False) -> None:
        """Refuse to resume a study made for a different search; record the signature.

        A study that holds no calibration and no trial (its first run failed
        before any, on input its error told the user to change) takes the new
        signature instead, so the corrected command is not refused; the runs of
        a calibration it kept are then dropped: they measured the other search.

        Raises:
            StudyMismatch: The stored signature differs, naming the first difference (a study another program
                filled is refused by :meth:`open`).
        """
        stored = self.study.user_attrs.get(STUDY_SIGNATURE)
        if stored is not None:
            difference = signature_difference(stored, signature)
            if difference is not None and not self.holds_nothing():
                raise StudyMismatch(
                    f"study {self.name!r} in {self.storage} was made for a different search ({difference}); "
                    + ("pass another --out for this one (an --out holds one search)" if in_out
                       else "pass --study NEW_NAME (the study lives in --storage: another --out names the same one)")
                )
            if difference is not None and self.calibration_runs():  # keyed by setup, not workload: never reused for another
                self.store_calibration_runs({})
        self.study.set_user_attr(STUDY_SIGNATURE, signature)

    def holds_nothing(self) -> bool:
        """Whether the study holds no calibration and no trial (see :meth:`is_empty`); runs of an unfinished calibration aside."""
        return self.calibration() is None and self.is_empty()

    def measured_nothing(self) -> bool:
        """Whether nothing at all was measured into the study: :meth:`holds_nothing`, and no calibration run kept either."""
        return self.holds_nothing() and not self.calibration_runs()

    def delete(self) -> None:
        """Remove the study from its storage (a study that measured nothing, see :meth:`measured_nothing`)."""
        optuna.delete_study(study_name=self.name, storage=self.study._storage)

    def is_empty(self) -> bool:
        """Whether the study holds no trial at all (not even a failed one; workers' election markers aside)."""
        return all(ATTR_MARKER in t.user_attrs for t in self.study.get_trials(deepcopy=False))

    def enqueue(self, role: str, params: dict[str, Any]) -> None:
        """Queue a trial with fixed params and a role (the defaults, a guess)."""
        self.study.enqueue_trial(params, user_attrs={ATTR_ROLE: role})

    def recover(self) -> list[int]:
        """Repair what a dead or interrupted run left behind; the trial numbers failed.

        Call it only while holding the study's lock (no other process runs
        its trials): a trial still RUNNING was left by a process that died
        (``kill -9``, a power cut) and becomes FAIL. A defaults or guess trial
        that failed or was interrupted, with no finished copy and none
        waiting, is queued again with its role, so the baseline is never lost.
        """
        trials = self.study.get_trials(deepcopy=False)
        stale = [t.number for t in trials if t.state == TrialState.RUNNING]
        for number in stale:
            self.study.tell(number, state=TrialState.FAIL)
        present = {
            _queued_key(t) for t in trials if t.state in (*FINISHED, TrialState.WAITING) and t.number not in stale
        }
        for t in trials:
            role, key = t.user_attrs.get(ATTR_ROLE), _queued_key(t)
            if role in (ROLE_DEFAULTS, ROLE_GUESS) and (t.number in stale or t.state == TrialState.FAIL) and key not in present:
                present.add(key)
                self.enqueue(str(role), dict(t.system_attrs.get("fixed_params", {})))
        return stale

    # ------------------------------------------------------------ trial level
    def finished(self, wanted: int | None = None) -> int:
        """Finished trials that count toward ``--trials`` (see :func:`counted_toward_budget`)."""
        return counted_toward_budget(self.study.get_trials(deepcopy=False, states=FINISHED), wanted)

    def counts(self, wanted: int | None = None, besides: int | None = None) -> tuple[int, int]:
        """:func:`progress` of the study from one read, trial ``besides`` left out."""
        trials = self.study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.RUNNING))
        return progress([t for t in trials if t.number != besides], wanted)

    def records(self, trials: Sequence[FrozenTrial] | None = None) -> list[TrialRecord]:
        """Every finished trial that carries a setup and a result, of ``trials`` (one read of the study shared with
        other lines, as ``autotune status`` does) or read now.

        Raises:
            StorageError: A trial's stored setup or result is not one autotune wrote (the study was edited).
        """
        read = self.study.get_trials(deepcopy=False, states=FINISHED) if trials is None else [t for t in trials if t.state in FINISHED]
        try:
            return [r for t in read if (r := _record(t)) is not None]
        except UnreadableRecord as exc:
            raise StorageError(f"study {self.name!r} in {self.storage}: {exc}; the study was edited or written by another "
                               "program: restore it from a backup, or start afresh with another --out (--study)") from None

    def ask(self) -> tuple[optuna.Trial, str]:
        """The next trial and its role."""
        trial = self.study.ask()
        return trial, str(trial.user_attrs.get(ATTR_ROLE, ROLE_SEARCH))

    def same_setup(self, setup: TrainSetup, number: int) -> TrialRecord | None:
        """A finished trial other than ``number`` that measured ``setup`` already (in full or until pruned); where it was
        only killed from outside (:func:`killed_from_outside`), none until that happened twice: the setup runs again."""
        target = setup.to_dict()
        found = [r for t in self.study.get_trials(deepcopy=False, states=FINISHED)
                 if t.number != number and t.user_attrs.get(ATTR_SETUP) == target and (r := _record(t))]
        measured = [r for r in found if not killed_from_outside(r.result)]
        return measured[0] if measured else found[-1] if len(found) > 1 else None

    def record(
        self, trial: optuna.Trial, role: str, setup: TrainSetup, result: TrialResult, reused_from: int | None,
        free: bool = False,
    ) -> None:
        """Store what a trial ran and measured (before it is told); ``free``: nothing ran for it."""
        if reused_from is not None:
            trial.set_user_attr(ATTR_REUSED_FROM, reused_from)
        if free:
            trial.set_user_attr(ATTR_FREE, True)
        trial.set_user_attr(ATTR_ROLE, role)
        trial.set_user_attr(ATTR_SETUP, setup.to_dict())
        trial.set_user_attr(ATTR_RESULT, result.to_dict())
        self.heartbeat()

    def tell(self, trial: optuna.Trial, result: TrialResult) -> None:
        """Finish a trial: pruned, or complete with its samples/s (0 when infeasible: TPE learns to avoid their region; it
        ignores failed trials). A defaults or guess trial killed from outside (:func:`killed_from_outside`: a SIGKILL that
        says nothing of its setup) is queued once more with its role, unless a trial of that role and setup finished before."""
        if result.status == "pruned":
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            self.study.tell(trial, result.samples_per_s if result.ok and result.samples_per_s else 0.0)
        if killed_from_outside(result) and trial.user_attrs.get(ATTR_ROLE) in (ROLE_DEFAULTS, ROLE_GUESS):
            finished = self.study.get_trials(deepcopy=False, states=FINISHED)
            this = next(t for t in finished if t.number == trial.number)
            if not any(_queued_key(t) == _queued_key(this) for t in finished if t.number != trial.number):
                self.enqueue(str(this.user_attrs[ATTR_ROLE]), dict(this.system_attrs.get("fixed_params", {})))

    def fail(self, trial: optuna.Trial) -> None:
        """Mark an interrupted trial failed: it does not count toward ``--trials``."""
        self.study.tell(trial, state=TrialState.FAIL)


def _foreign_trials(study: optuna.Study) -> int:
    """The trials of a study another program filled (no search signature: every search stores its own before its
    first trial); 0 for a search's study."""
    if STUDY_SIGNATURE in study.user_attrs:
        return 0
    return sum(ATTR_MARKER not in t.user_attrs for t in study.get_trials(deepcopy=False))


def _foreign(name: str, storage: str, trials: int, advice: str) -> StorageError:
    return StorageError(f"study {name!r} in {storage} holds {trials} trials but no autotune search signature: another program made it; {advice}")


def _within(pins: dict[str, Constraint]) -> Callable[[FrozenTrial], bool]:
    """Whether a finished trial's setup is one ``pins`` allow (a trial without a stored setup counts)."""

    def counts(trial: FrozenTrial) -> bool:
        stored = trial.user_attrs.get(ATTR_SETUP)
        return stored is None or excluding(pins, TrainSetup.from_dict(stored)) is None

    return counts


def _queued_key(trial: FrozenTrial) -> tuple[str, str]:
    """A queued trial's role and fixed params, comparable across copies."""
    params = trial.system_attrs.get("fixed_params", {})
    return str(trial.user_attrs.get(ATTR_ROLE, ROLE_SEARCH)), json.dumps(params, sort_keys=True)


def _record(trial: FrozenTrial) -> TrialRecord | None:
    attrs = trial.user_attrs
    if ATTR_SETUP not in attrs or ATTR_RESULT not in attrs:
        return None
    return TrialRecord(
        number=trial.number,
        role=attrs.get(ATTR_ROLE, ROLE_SEARCH),
        setup=stored_setup(trial.number, attrs[ATTR_SETUP]),
        result=stored_result(trial.number, attrs[ATTR_RESULT]),
        reused_from=attrs.get(ATTR_REUSED_FROM),
        free=bool(attrs.get(ATTR_FREE)),
    )
