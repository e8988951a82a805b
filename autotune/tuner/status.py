"""``autotune status``: a study's progress and winner, read from its storage by any worker (nothing is written)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.trial import TrialState

from autotune.errors import PendingTrialsError
from autotune.output.best import DEFAULTS_KEPT, Best
from autotune.output.sections import fastest_trial
from autotune.records import TrialRecord
from autotune.redact import hide_passwords
from autotune.tuner import elections
from autotune.tuner.budget import STUDY_BUDGET, STUDY_LARGEST_BUDGET, counted_records, counted_toward_budget
from autotune.tuner.constraints import allows, excluding
from autotune.tuner.diverged import diverged_math
from autotune.tuner.lock import Holder
from autotune.tuner.pending import pending_file, read_pending
from autotune.tuner.storage_urls import storage_file
from autotune.tuner.stores import STUDY_WINNER_ROUNDS
from autotune.tuner.study import ATTR_MARKER, ATTR_ROLE, ATTR_WORKER, ROLE_SEARCH, STUDY_HOLDER, SearchStudy
from autotune.tuner.study_facts import baseline_only, published_winner, run_by_workers, stored_set
from autotune.tuner.study_files import best_json_of, measured_after, rerun_replaces
from autotune.tuner.workers import MARKER_CALIBRATE, confirm_marker


@dataclass(frozen=True)
class Running:
    """A trial in the RUNNING state: its number, the worker running it (``pid N on HOST``),
    and whether that worker is gone (killed: the trial stays RUNNING until the next run marks it failed)."""

    number: int
    worker: str
    gone: bool = False
    role: str = "search"
    seconds: float | None = None  # since it started

    def describe(self) -> str:
        """``#5 (search, 12 s) on pid 4242 on node-b``."""
        since = f", {self.seconds:.0f} s" if self.seconds is not None else ""
        return f"#{self.number} ({self.role}{since}) on {self.worker}"


@dataclass(frozen=True)
class StudyStatus:
    """Where a study stands.

    Attributes:
        study: Its name.
        storage: Its storage URL (password hidden).
        wanted: The ``--trials`` budget its search ran for (None: a study from before it was stored).
        finished: Trials that count toward the budget.
        failed: Trials cut short: a run of the search stopped (Ctrl-C, a signal, an error that ended it) or died during
            them (not the election markers); they do not count toward the budget.
        running: Trials running now.
        best: The fastest finished trial so far that the search's ``--set`` allows (the PyTorch defaults it
            excludes are its baseline only), or the fastest of all while no trial within it measured a throughput;
            never one whose training math diverged in a trial (:mod:`autotune.tuner.diverged`).
        best_excluded_by: The ``--set`` values ``best`` lies outside (that fallback), as the user wrote them.
        winner: The confirmed winner, once a worker stored it.
        winner_by: The worker that confirmed it and the directory it wrote to.
        confirming: A search that may still store a winner holds the study (of a shared
            study's workers, the one its budget's election picks, alive and waiting for
            no other; a lone search only while it runs: it writes its winner to best.json alone).
        out: The search directory read for its best.json (None: the study read by URL alone).
        infeasible: Finished trials of the budget that measured no throughput (oom, timeout, error, diverged);
            ``failed`` counts trials that crashed or were interrupted instead.
        infeasible_kinds: The statuses those trials ended with.
        shared: Workers of a shared study ran it (``--storage`` with several workers).
        calibration_runs: While the calibration is not finished, how many of its runs are measured and kept
            (None once it is).
        calibrating: The lone search or the shared study's worker measuring that calibration now (``pid N on HOST``);
            None where none runs (interrupted: the same command goes on from the runs kept).
        pending: A line about the measured trials ``out``'s pending-trials.json keeps for this study (the storage
            could not take them; the search's rerun adds them), or why that file is unreadable; None: none kept.
        foreign_best: ``out/best.json`` is readable and another search's (``--storage`` naming another study).
        unreadable_best: Why ``out/best.json`` cannot be read (damaged, another version's), or None.
        largest: The largest ``--trials`` a worker of the shared study searched for (None: none stored).
        confirmed_elsewhere: A lone search confirmed a winner (its rounds are stored) and ``out`` holds no best.json,
            while the study file's own directory (``own_out``) holds one: the winner is there, not in ``out``. False
            where ``out`` is that directory (its best.json removed) or the storage is elsewhere (a server, another file).
        own_out: The directory of the study's file where it holds a best.json.
        measured: The finished trials that measured a setup (``finished`` also counts the sampler's repeats of measured
            setups past the budget: :func:`~autotune.tuner.budget.counted_toward_budget`).
    """

    study: str
    storage: str
    wanted: int | None
    finished: int
    failed: int
    running: tuple[Running, ...]
    best: TrialRecord | None
    winner: Best | None
    winner_by: str | None
    confirming: bool = True
    out: Path | None = None
    infeasible: int = 0
    infeasible_kinds: tuple[str, ...] = ()
    shared: bool = False
    best_excluded_by: str | None = None
    calibration_runs: int | None = None
    calibrating: str | None = None
    pending: str | None = None
    foreign_best: bool = False
    unreadable_best: str | None = None
    largest: int | None = None
    confirmed_elsewhere: bool = False
    own_out: Path | None = None
    measured: int | None = None

    def lines(self) -> list[str]:
        """The status in plain lines."""
        if not self.wanted:
            count = f"{self.finished} trials finished"
        elif self.finished > self.wanted and (self.largest or 0) > self.wanted:  # a worker of a larger --trials went on
            count = f"{self.finished} trials finished (the study's last stored --trials: {self.wanted}; a worker with a larger one searched past it)"
        elif self.finished > self.wanted:  # no worker had more (an earlier version counted a kept trial twice, say)
            count = f"{self.finished} trials finished (the study's --trials: {self.wanted}; {self.finished - self.wanted} more stored past it)"
        else:
            count = f"{self.finished}/{self.wanted} trials finished"
        if self.wanted and self.measured is not None and self.measured < self.finished:  # as a search's line and report.html count
            count += (f" ({self.measured} measured; the sampler proposed setups measured before more times than --trials: it "
                      "converged)")
        alive = [r for r in self.running if not r.gone]
        kinds = ", ".join(self.infeasible_kinds) or "oom, timeout, error, diverged"
        infeasible = f" ({self.infeasible} infeasible: {kinds})" if self.infeasible else ""
        # A FAIL trial is one a run of the search stopped or died during (Ctrl-C, a signal, kill -9), not a setup that
        # failed (those are infeasible): a probe read "1 failed" for a Ctrl-C long after the search finished.
        them = "it" if self.failed == 1 else "them"
        unfinished = f", {self.failed} cut short (a search stopped or died during {them}; not counted)" if self.failed else ""
        lines = [f"study {self.study!r} in {self.storage}: {count}{infeasible}, {len(alive)} running{unfinished}"]
        if self.calibration_runs is not None:  # no trial runs before it: "0 running" alone read as a stalled search
            if self.calibrating is not None:
                lines.append(f"  calibrating now ({self.calibrating}): {self.calibration_runs} of its runs measured so far; "
                             "the trials follow it")
            elif not self.shared:
                lines.append(f"  calibration not finished, and no search runs it now: {self.calibration_runs} of its runs "
                             "measured and kept; rerun the search's command to go on from them")
            else:
                lines.append(f"  calibration not finished, and no worker runs it now: {self.calibration_runs} of its runs measured "
                             "and kept; rerun a worker's search command to go on from them")
        if self.pending is not None:
            lines.append(f"  {self.pending}")
        lines += [f"  running: {r.describe()}" for r in alive]
        lines += [f"  left running by a search that died: #{r.number} ({r.worker}); the next run marks it failed"
                  for r in self.running if r.gone]
        if self.best is not None and self.best.result.samples_per_s:
            outside = f" (outside {self.best_excluded_by}: no trial within it measured a throughput yet)" if self.best_excluded_by else ""
            lines.append(f"best so far: #{self.best.number} {self.best.setup.describe()}: {self.best.result.samples_per_s:.1f} samples/s{outside}")
        if self.winner is not None:
            speedup = (f", {DEFAULTS_KEPT}" if self.winner.defaults_won else
                       f", {self.winner.speedup:.2f}x the PyTorch defaults" if self.winner.speedup else "")
            lines.append(f"winner: {self.winner.setup.describe()}: {self.winner.samples_per_s:.1f} samples/s{speedup}")
            lines.append(f"  confirmed by {self.winner_by}")
        elif self.wanted and self.finished >= self.wanted:
            no_throughput = self.best is None or not self.best.result.samples_per_s
            lines.append("winner: none: no trial measured a throughput (trials.csv says why)" if no_throughput else
                         "winner: being confirmed" if self.confirming else
                         "winner: none confirmed: the worker confirming it stopped; rerun a worker's search command" if self.shared else
                         "winner: in the best.json of the search's directory (autotune status DIR --storage URL shows it)" if self.out is None else
                         f"winner: confirmed, in the best.json of the search's own directory ({self.own_out}), not in {self.out} (it "
                         "holds none): autotune status THAT_DIR shows it" if self.confirmed_elsewhere else
                         f"winner: none of this study's in {self.out}: its best.json is another search's (another storage or study)"
                         if self.foreign_best else
                         f"winner: not shown: {self.unreadable_best}; rerun the search's command to write best.json again"
                         if self.unreadable_best else
                         f"winner: none confirmed in {self.out / 'best.json'}; rerun the search's command to confirm one"
                         if (self.out / "best.json").exists() else
                         f"winner: none confirmed ({self.out} holds no best.json: the search stopped before it wrote one); rerun the "
                         "search's command to confirm one")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "study": self.study,
            "storage": self.storage,
            "trials": self.wanted,
            "finished": self.finished,
            "failed": self.failed,
            "infeasible": self.infeasible,
            "running": [{"number": r.number, "worker": r.worker, "gone": r.gone, "role": r.role, "seconds": r.seconds}
                        for r in self.running],
            "best": self.best.to_dict() if self.best else None,
            "best_excluded_by": self.best_excluded_by,
            "winner": self.winner.to_dict() if self.winner else None,
            "winner_by": self.winner_by,
            "calibration_runs": self.calibration_runs,
            "calibrating": self.calibrating,
            "pending": self.pending,
        }


def study_status(storage: str, study: str | None = None, out: Path | None = None) -> StudyStatus:
    """Read a study's progress and winner.

    A lone search stores no winner in its study: with ``out`` (the search's
    directory), its best.json is the winner when it is this study's.

    Raises:
        StorageError: The storage cannot be read or holds no such study.
    """
    found = SearchStudy.load(storage, study)
    trials = found.study.get_trials(deepcopy=False)
    attrs = found.study.user_attrs
    lone_holder = Holder.from_dict(attrs.get(STUDY_HOLDER))  # a lone search holds the study while it runs
    calibrated = found.calibration() is not None
    running = []
    for t in trials:
        if t.state == TrialState.RUNNING:
            # A shared study's worker names itself on the trial.
            holder = Holder.from_dict(t.user_attrs.get(ATTR_WORKER)) or lone_holder
            gone = holder is not None and not holder.alive()
            started = t.datetime_start.timestamp() if t.datetime_start is not None else None
            running.append(Running(t.number, holder.describe() if holder else "an unknown worker", gone=gone,
                                   role=str(t.user_attrs.get(ATTR_ROLE, ROLE_SEARCH)),
                                   seconds=max(0.0, time.time() - started) if started is not None else None))
    records = found.records(trials)  # the same read as the running trials: a trial finishing between two reads was in both
    # The search's --set: the PyTorch defaults it excludes were measured as the baseline, never a winner.
    constraints = stored_set(found)
    shaky = diverged_math(records)  # a setup whose math diverged in another trial finished by luck: no finalist, nor best so far
    shaky = shaky if allows(constraints.values(), "amp", "off") else shaky.exact()  # as the finalists
    fastest = fastest_trial([r for r in records if r.setup not in shaky], baseline_only(records, constraints))
    # Among the trials the budget counts: a setup that could not run (free) is not one of the "N finished".
    unmeasured = [r for r in records if not r.result.ok and r.result.status != "pruned" and not r.free]
    lone = not run_by_workers(trials)
    winner, winner_by = published_winner(found) or (None, None)
    foreign, unreadable = False, None
    if winner is None and out is not None and lone:  # a shared study's worker's copy may be an earlier budget's
        mine, unreadable = best_json_of(out, found, records)
        best = mine if mine is not None and mine.confirmed else None  # an interrupted search's or an unreadable best.json is no winner
        foreign = mine is None and unreadable is None and (out / "best.json").is_file()  # another search's
        if best is not None:
            winner, winner_by = best, f"this search (best.json and train.py in {out.resolve()})"
            if rerun_replaces(out, lone_holder):
                winner_by = (f"an earlier run of this search (best.json and train.py in {out.resolve()}); the run in progress "
                             "confirms its own winner and replaces them")
            elif later := measured_after(trials, out / "best.json"):  # a rerun (more --trials) stopped before confirming
                winner_by = (f"an earlier run of this search (best.json and train.py in {out.resolve()}); {later} trial(s) "
                             "measured after it are not confirmed: rerun the search's command to confirm them")
    wanted = attrs.get(STUDY_BUDGET)
    file = storage_file(storage)  # a lone search's study file lies in its --out unless --storage put it elsewhere
    own = file.parent if file is not None and (file.parent / "best.json").is_file() else None
    # The worker confirming the budget: the one its election picks, not any that entered it (one waiting for a worker
    # that stopped read as "being confirmed" for the 30 minutes the stopped one's marker lives on other hosts).
    confirming = elections.acting(trials, attrs, confirm_marker(wanted)) if wanted else None
    # Who calibrates now: the lone search holding the study, or the shared study's worker its election picked.
    calibrator = None if calibrated else (lone_holder if lone else elections.acting(trials, attrs, MARKER_CALIBRATE))
    return StudyStatus(
        study=found.name,
        storage=found.storage,
        wanted=attrs.get(STUDY_BUDGET),
        finished=counted_toward_budget(trials, attrs.get(STUDY_BUDGET)),
        measured=counted_records(records),
        failed=sum(t.state == TrialState.FAIL and ATTR_MARKER not in t.user_attrs for t in trials),
        running=tuple(running),
        best=fastest,
        best_excluded_by=excluding(constraints, fastest.setup) if fastest is not None else None,
        winner=winner,
        winner_by=winner_by,
        confirming=confirming is not None if not lone else (lone_holder is not None and lone_holder.alive()),
        shared=not lone,
        out=out,
        infeasible=len(unmeasured),
        infeasible_kinds=tuple(sorted({r.result.status for r in unmeasured})),
        foreign_best=foreign,
        unreadable_best=unreadable,
        calibration_runs=None if calibrated else sum(map(len, found.calibration_runs().values())),
        calibrating=calibrator.describe() if calibrator is not None and calibrator.alive() else None,
        pending=_pending(out, found) if out is not None else None,
        largest=attrs.get(STUDY_LARGEST_BUDGET),
        # Said only where the study file's directory holds a best.json: --storage elsewhere names no search directory.
        confirmed_elsewhere=(lone and out is not None and not (out / "best.json").exists() and STUDY_WINNER_ROUNDS in attrs
                             and not (lone_holder is not None and lone_holder.alive()) and own is not None and not _same_dir(own, out)),
        own_out=own,
    )


def _same_dir(home: Path, out: Path) -> bool:
    try:
        return home.resolve() == out.resolve()
    except OSError:
        return False


def _pending(out: Path, found: SearchStudy) -> str | None:
    """What ``out``'s pending-trials.json keeps for ``found`` (see :attr:`StudyStatus.pending`)."""
    try:
        kept = [e.number for e in read_pending(out) if e.study == found.name and e.storage == hide_passwords(found.storage)]
    except PendingTrialsError as exc:
        return str(exc)
    if not kept:
        return None
    numbers = ", ".join(f"#{n}" for n in kept)
    return (f"measured but not in the study: trial{'s' if len(kept) > 1 else ''} {numbers}, kept in {pending_file(out)} "
            "when the study storage failed; rerun the search's command to add them")
