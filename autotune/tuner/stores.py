"""What a search stores per study beside its trials: calibration, confirmation rounds, time spent, the verdict.

:class:`StudyStores` is the part of :class:`~autotune.tuner.study.SearchStudy`
that reads and writes these study user attributes.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import optuna

from autotune.records import Calibration
from autotune.rounds import Ceilings, Runs
from autotune.time_spent import TimeSpent
from autotune.tuner.kept_runs import KeptRun
from autotune.tuner.signals import interrupts_held
from autotune.tuner.storage import with_retries
from autotune.tuner.storage_urls import is_shared

STUDY_CALIBRATION = "calibration"
STUDY_CALIBRATION_RUNS = "calibration_runs"
STUDY_CONFIRMATION = "confirmation"
STUDY_WINNER_ROUNDS = "winner_rounds"
STUDY_TIME_SPENT = "time_spent"
STUDY_VERDICT = "verdict"

#: Confirmation measurements per candidate key.
Rounds = dict[str, Runs]


class StudyStores:
    """The study-level records of a search (a base of :class:`~autotune.tuner.study.SearchStudy`)."""

    study: optuna.Study
    #: Its storage URL, password hidden.
    storage: str
    #: This run (one process opening the study), so confirmation rounds are never mixed across runs.
    run_id: str

    #: For a worker of a shared study, the user attribute (:meth:`~autotune.tuner.lock.Holder.alive_key`) it stamps
    #: with the time whenever it stores a calibration run or a confirmation measurement, which keeps its election
    #: marker alive for workers on other hosts while it stores one at least every STALE_AFTER_S (30 minutes).
    alive_key: str | None = None

    def heartbeat(self) -> None:
        """Refresh the claim's heartbeat (the study defines it)."""

    def _proved_alive(self) -> None:
        """Refresh the claim's heartbeat and, for a worker of a shared study, its stamp."""
        self.heartbeat()
        if self.alive_key is not None:
            self.study.set_user_attr(self.alive_key, time.time())

    def _write(self, step: Callable[[], None]) -> None:
        """Run ``step``'s reads and writes of study attributes with interrupts held (never half stored). On a shared
        storage (a database server, a journal file) a lost connection is retried as every worker's step is
        (:func:`~autotune.tuner.storage.with_retries`): before, a server restarting during the calibration or the
        confirmation stopped the search at once."""
        with interrupts_held():
            if is_shared(self.storage):
                with_retries(step, self.storage)
            else:
                step()

    def calibration(self) -> Calibration | None:
        """The calibration stored by an earlier run, if any."""
        data = self.study.user_attrs.get(STUDY_CALIBRATION)
        return Calibration.from_dict(data) if data is not None else None

    def store_calibration(self, calibration: Calibration) -> None:
        """Keep the calibration, so a resumed search reuses it (with interrupts held: never half stored); its runs,
        kept one by one meanwhile (:meth:`store_calibration_runs`), are then no longer needed."""
        def step() -> None:
            self.study.set_user_attr(STUDY_CALIBRATION, calibration.to_dict())
            if STUDY_CALIBRATION_RUNS in self.study.user_attrs:
                self.study.set_user_attr(STUDY_CALIBRATION_RUNS, {})
            self._proved_alive()

        self._write(step)

    def forget_calibration(self) -> None:
        """Drop the stored calibration (a search refused on its pins after calibrating: its study then holds nothing)."""
        self._write(lambda: self.study.set_user_attr(STUDY_CALIBRATION, None))

    def calibration_runs(self) -> dict[str, list[KeptRun]]:
        """The runs of a calibration that was interrupted before it ended, per run key (:mod:`autotune.tuner.kept_runs`)."""
        stored = self.study.user_attrs.get(STUDY_CALIBRATION_RUNS) or {}
        return {key: [KeptRun.from_dict(r) for r in runs] for key, runs in stored.items()}

    def store_calibration_runs(self, runs: dict[str, list[KeptRun]]) -> None:
        """Keep the calibration's runs so far, per run key, the moment one returns (with interrupts held: never half stored)."""
        stored = {key: [run.to_dict() for run in kept] for key, kept in runs.items()}

        def step() -> None:
            self.study.set_user_attr(STUDY_CALIBRATION_RUNS, stored)
            self._proved_alive()

        self._write(step)

    def confirmation(self) -> Rounds:
        """The confirmation measurements this run stored so far, per candidate key.

        Rounds of an earlier run are never returned: measured at another
        time (another load), they are not comparable with this run's.
        """
        return self._this_run(self.study.user_attrs)

    def _this_run(self, attrs: dict[str, Any]) -> Rounds:
        stored = attrs.get(STUDY_CONFIRMATION, {})
        return _rounds(stored) if isinstance(stored, dict) and stored.get("run") == self.run_id else {}

    def _stamped(self, rounds: Rounds) -> dict[str, Any]:
        """``rounds`` as stored: with this run's id."""
        return {"run": self.run_id, "rounds": {key: [list(part) for part in runs] for key, runs in rounds.items()}}

    def stored_confirmation(self) -> Rounds:
        """The confirmation rounds of the last run that measured any (for a report of the study)."""
        return _rounds(self.study.user_attrs.get(STUDY_CONFIRMATION))

    def store_confirmation(self, key: str, runs: Runs) -> None:
        """Record one candidate's confirmation measurements (after every measurement), for this run only,
        with interrupts held: a measurement is never half stored."""
        def step() -> None:
            attrs = self.study.user_attrs  # one read of the storage per measurement
            rounds = {**self._this_run(attrs), key: runs}
            earlier = attrs.get(STUDY_CONFIRMATION)
            if STUDY_WINNER_ROUNDS not in attrs and isinstance(earlier, dict) and earlier and earlier.get("run") != self.run_id:
                self.study.set_user_attr(STUDY_WINNER_ROUNDS, earlier)  # a study of an earlier version: its last rounds are kept,
                own = f"{STUDY_CONFIRMATION}:{earlier.get('run', 'earlier')}"  # and under their run, where no later one replaces them
                if own not in attrs:
                    self.study.set_user_attr(own, earlier)
            self.study.set_user_attr(STUDY_CONFIRMATION, self._stamped(rounds))
            # Each run's own rounds too, which no later run replaces: a rerun's confirmation overwrote the last one's.
            self.study.set_user_attr(f"{STUDY_CONFIRMATION}:{self.run_id}", self._stamped(rounds))
            self._proved_alive()

        self._write(step)

    def keep_winner_rounds(self, asked: int, peaks: dict[str, int]) -> None:
        """Keep this run's finished confirmation (of up to ``asked`` rounds) as its winner's evidence (a rerun's rounds
        replace it only when finished), with the peak memory each finalist's runs measured alone (``peaks``, by key); and
        as the confirmation of its finalists, which a rerun with the same finalists takes, whatever came after it."""
        kept = {**self._stamped(self.confirmation()), "asked": asked, "peaks": peaks}

        def step() -> None:
            self.study.set_user_attr(STUDY_WINNER_ROUNDS, kept)
            self.study.set_user_attr(_of_finalists(set(kept["rounds"])), kept)

        self._write(step)

    def reuse_rounds(self, keys: set[str], asked: int) -> tuple[Rounds, dict[str, int]]:
        """The study's last finished confirmation of exactly the finalists ``keys``, of ``asked`` rounds or more, and the
        peaks its runs measured; else none. A rerun that added no trial takes them rather than measure again: its own
        rounds, on a machine loaded differently, had replaced a confirmed 3.40x winner by the defaults (and a rerun that
        went back to earlier finalists, with another --confirm-top, measured them again: only the last one was kept).

        Taken, they are the winner's rounds again (``autotune report`` and ``status`` show them), and the bottleneck
        verdict of the confirmation after them is dropped: it spoke of another winner, and the winner's ceilings are
        measured again. A study of an earlier version kept its last run's rounds only, without the rounds it was asked
        for: the rounds its leader measured stand for them."""
        attrs = self.study.user_attrs
        last = attrs.get(STUDY_CONFIRMATION)  # an earlier version's, which kept no run's rounds apart; this one's may be cut short
        older = isinstance(last, dict) and f"{STUDY_CONFIRMATION}:{last.get('run')}" not in attrs
        names = (_of_finalists(keys), STUDY_WINNER_ROUNDS) if STUDY_WINNER_ROUNDS in attrs else (STUDY_CONFIRMATION,) if older else ()
        for name in names:
            stored = attrs.get(name)
            rounds = _rounds(stored)
            if not isinstance(stored, dict) or not rounds or set(rounds) != keys:
                continue
            measured = max(len(values) + len(failures) for values, failures, _ in rounds.values())
            if (stored["asked"] if isinstance(stored.get("asked"), int) else measured) < asked:
                continue
            if stored != attrs.get(STUDY_WINNER_ROUNDS):
                self._take_as_winner_s({**stored, "asked": stored.get("asked", measured)})
            peaks = stored.get("peaks")
            return rounds, {key: peak for key, peak in (peaks.items() if isinstance(peaks, dict) else ()) if isinstance(peak, int) and peak > 0}
        return {}, {}

    def _take_as_winner_s(self, kept: dict[str, Any]) -> None:
        def step() -> None:
            self.study.set_user_attr(STUDY_WINNER_ROUNDS, kept)
            self.study.set_user_attr(STUDY_VERDICT, {})  # the confirmation after it had another winner

        self._write(step)

    def winner_rounds(self) -> Rounds:
        """The rounds of the last finished confirmation (of a study from before they were kept: the last run's)."""
        stored = self.study.user_attrs.get(STUDY_WINNER_ROUNDS)
        return _rounds(stored) if stored is not None else self.stored_confirmation()

    def time_spent(self, *, others: bool = False) -> TimeSpent | None:
        """Where the time of the study's runs went, summed over every run that recorded it (with ``others``: but
        this one); None when none did.

        Each run keeps its own breakdown (:meth:`store_time_spent`): workers sharing a study each add theirs,
        however their runs overlap (one total, read at a run's start and written at its end, kept the last
        worker's alone). A study of an older version holds one total of its runs under the bare key.
        """
        own = f"{STUDY_TIME_SPENT}:{self.run_id}"
        parts = [TimeSpent.from_dict(value) for key, value in self.study.user_attrs.items()
                 if isinstance(value, dict) and (key == STUDY_TIME_SPENT or key.startswith(f"{STUDY_TIME_SPENT}:"))
                 and not (others and key == own)]
        return sum(parts[1:], parts[0]) if parts else None

    def store_time_spent(self, spent: TimeSpent) -> None:
        """Keep this run's own time breakdown (stored again, it replaces this run's); the report sums every run's."""
        self._write(lambda: self.study.set_user_attr(f"{STUDY_TIME_SPENT}:{self.run_id}", asdict(spent)))

    def verdict(self) -> tuple[str | None, Ceilings | None]:
        """The bottleneck verdict of the last finished run and the winner's ceilings it rests on."""
        data = self.study.user_attrs.get(STUDY_VERDICT) or {}
        ceilings = data.get("ceilings")
        return data.get("text"), Ceilings(**ceilings) if ceilings else None

    def store_verdict(self, verdict: str, ceilings: Ceilings | None) -> None:
        """Keep the verdict printed with best.json (the report shows it again)."""
        self._write(lambda: self.study.set_user_attr(STUDY_VERDICT, {"text": verdict, "ceilings": ceilings.to_dict() if ceilings else None}))


def _of_finalists(keys: set[str]) -> str:
    """The study attribute that keeps the last finished confirmation of the finalists ``keys``."""
    return f"{STUDY_WINNER_ROUNDS}:{hashlib.sha1(json.dumps(sorted(keys)).encode()).hexdigest()[:16]}"


def _rounds(stored: Any) -> Rounds:
    """The rounds of a stored confirmation: ``{"run": id, "rounds": {...}}``, or the bare rounds of an older version
    (whose entries do not say which rounds failed)."""
    if not isinstance(stored, dict):
        return {}
    rounds = stored.get("rounds", {}) if "run" in stored else stored
    return {key: (list(v[0]), list(v[1]), list(v[2]) if len(v) > 2 else []) for key, v in rounds.items()}
