"""report.html of a search: written at its end, and from a stored study (``autotune report``).

:func:`write_search_report` stores what only the search knows (the time
breakdown, the winner's own ceilings and verdict) in the study, then writes
the page. :func:`report_study` reads everything back from the study and the
winner from ``best.json`` when the search wrote one, so it works on a
finished study, an interrupted one and one still running (its trials so far;
nothing is written to the study).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from autotune.errors import AutotuneError, StorageError, UsageError
from autotune.output.best import Best, read_best
from autotune.output.report import ReportInput, render_report, write_rendered, write_report
from autotune.records import Calibration, TrialRecord
from autotune.rounds import Candidate, Confirmed
from autotune.time_spent import TimeSpent
from autotune.train_setup import TrainSetup
from autotune.tuner.budget import ATTR_FREE, FINISHED, STUDY_BUDGET
from autotune.tuner.config import SearchOutcome
from autotune.tuner.confirm import TIMED_OUT, TWIN, finalist_label
from autotune.tuner.constraints import Constraint, excluding
from autotune.tuner.identity import described_workload, stored_constraints
from autotune.tuner.lock import Holder
from autotune.tuner.signals import interrupts_held, remember_stop, sigterm_as_interrupt
from autotune.tuner.storage import CONNECTION_ERRORS, first_line, is_shared, with_retries
from autotune.tuner.stores import STUDY_WINNER_ROUNDS, Rounds
from autotune.tuner.study import ATTR_WORKER, STUDY_HOLDER, STUDY_SIGNATURE, STUDY_WINNER, SearchStudy


def write_search_report(study: SearchStudy, out: Path, data: ReportInput, log: Callable[[str], None], *,
                        own: TimeSpent | None = None) -> tuple[str, ...]:
    """Store this run's time breakdown ``own`` (and the winner's ceilings and verdict) in the study; write report.html.

    The report is never worth a search: if it cannot be written, ``log`` gets
    one line saying why and the search goes on (best.json and trials.csv are
    already written); a Ctrl-C, SIGTERM or SIGHUP while it is written ends the
    page only (the caller sees :func:`~autotune.tuner.signals.stop_requested`).

    Returns:
        The files written (report.html first), or none.
    """
    written: tuple[Path, ...] = ()
    try:
        with sigterm_as_interrupt():  # SIGTERM and SIGHUP too: a stop while the page is drawn costs the page, not the search
            with interrupts_held():
                if own is not None:
                    study.store_time_spent(own)
                if data.verdict is not None:
                    study.store_verdict(data.verdict, data.ceilings)
            page, images = render_report(data)
            with interrupts_held():  # the page and its PNGs of one report, never of two (a stop waits milliseconds)
                written = write_rendered(out, page, images)
            return tuple(str(p) for p in written)
    except KeyboardInterrupt:  # remembered: the search ends as interrupted once its files are written (signals.stop_requested)
        remember_stop()
        if not written:
            log(f"report.html not written: interrupted (`autotune report {out}` writes it from the study)")
        return tuple(str(p) for p in written)
    except Exception as exc:  # a storage, plotting or disk failure must not cost the measured search
        log(f"report.html not written: {type(exc).__name__}: {exc}")
        return ()


#: What reading the other runs' time may raise at a search's end: the storage lost (after its retries, when shared).
READ_ERRORS: tuple[type[BaseException], ...] = (StorageError, *CONNECTION_ERRORS)


def report_search(
    study: SearchStudy,
    out: Path,
    spent: TimeSpent,
    log: Callable[[str], None],
    status: str,
    records: list[TrialRecord],
    calibration: Calibration,
    outcome: SearchOutcome | None = None,
) -> tuple[tuple[str, ...], TimeSpent]:
    """Store this run's time (``spent``) in the study; write report.html with it plus every other run's of the study
    (its earlier runs, and the other workers' of a shared one, as stored by now).

    Returns:
        The files written and the time breakdown the report shows.
    """
    try:
        others = with_retries(lambda: study.time_spent(others=True), study.storage) if is_shared(study.storage) else (
            study.time_spent(others=True))
    except READ_ERRORS as exc:  # the storage stayed lost: the search's files are written already
        log(f"report.html shows this run's time only: {first_line(exc)}")
        others = None
    own, spent = spent, spent + others if others else spent
    data = ReportInput(
        records=tuple(records),
        calibration=calibration,
        confirmed=outcome.confirmed if outcome else (),
        best=outcome.best if outcome else None,
        verdict=(outcome.verdict or None) if outcome else None,  # "": no verdict of its own (an earlier winner kept)
        time_spent=spent,
        study=study.name,
        storage=study.storage,
        status=status,
        ceilings=outcome.ceilings if outcome else None,
        baseline_only=baseline_only(records, stored_set(study)),
        workload=stored_workload(study),
        max_memory_bytes=stored_max_memory(study),
        world_size=stored_world_size(study),
    )
    return write_search_report(study, out, data, log, own=own), spent


def stored_set(study: SearchStudy) -> dict[str, Constraint]:
    """The search's ``--set`` constraints as the study stored them in its signature (none: none stored or readable)."""
    return stored_constraints(study.study.user_attrs.get(STUDY_SIGNATURE)) or {}


def stored_workload(study: SearchStudy) -> str | None:
    """What the study's search trains, in one line, from its stored signature (None: none stored or readable)."""
    return described_workload(study.study.user_attrs.get(STUDY_SIGNATURE))


def stored_max_memory(study: SearchStudy) -> int | None:
    """The search's ``--max-memory`` in bytes, from its stored signature (None: none given, stored or readable)."""
    return _stored_count(study, "max_memory")


def stored_world_size(study: SearchStudy) -> int:
    """The search's ``--nproc-per-node`` from its stored signature (1: none given, stored or readable)."""
    return _stored_count(study, "nproc_per_node") or 1


def _stored_count(study: SearchStudy, key: str) -> int | None:
    value = (study.study.user_attrs.get(STUDY_SIGNATURE) or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def baseline_only(records: Sequence[TrialRecord], constraints: dict[str, Constraint]) -> frozenset[int]:
    """The trials whose setup the search's ``--set`` (:func:`stored_set`) excludes: the PyTorch defaults it measured as the baseline."""
    return frozenset(r.number for r in records if excluding(constraints, r.setup) is not None)


def kept_winner(out: Path, study: SearchStudy, records: list[TrialRecord]) -> Best | None:
    """The confirmed winner a run of ``study`` left in ``out/best.json`` (an interrupted rerun keeps it;
    ``autotune status DIR`` names it); None when there is none or the file cannot be read."""
    best, _ = best_json_of(out, study, records)  # unreadable: nothing to keep
    return best if best is not None and best.confirmed else None


def rerun_replaces(out: Path, holder: Holder | None) -> bool:
    """Whether ``out/best.json`` is an earlier run's that the lone search holding the study now (``holder``, alive) will
    replace once it confirms its own: written before that run started. False if it is gone or no run is alive."""
    if holder is None or not holder.alive():
        return False
    try:
        return (out / "best.json").stat().st_mtime < holder.started
    except OSError:
        return False


def measured_after(trials: Sequence[FrozenTrial], path: Path) -> int:
    """How many of ``trials`` measured a setup (finished, not free) after ``path`` was last written (0 if it is gone):
    a rerun's trials that its confirmation, interrupted, never took in. A trial not run, cut short or left running
    measured nothing."""
    try:
        written = path.stat().st_mtime
    except OSError:
        return 0
    return sum(t.state in FINISHED and not t.user_attrs.get(ATTR_FREE) and t.datetime_start is not None
               and t.datetime_start.timestamp() > written for t in trials)


def best_json_of(out: Path, study: SearchStudy, records: list[TrialRecord]) -> tuple[Best | None, str | None]:
    """``out/best.json`` read once: the Best if it is this study's (:func:`stored_best`), and why it cannot be read
    (damaged, another version's schema), or None; ``(None, None)`` when it is absent or another search's."""
    try:
        return stored_best(out, study, records), None
    except AutotuneError as exc:
        return None, str(exc)


def kept_outcome(outcome: SearchOutcome, kept: Best, study: SearchStudy, records: list[TrialRecord]) -> SearchOutcome:
    """``outcome`` showing the ``kept`` winner of an earlier run with that run's rounds, verdict and ceilings (an
    interrupted rerun measured rounds of its own: they are not the kept winner's evidence)."""
    verdict, ceilings = study.verdict()
    return replace(outcome, best=kept, verdict=verdict or "", ceilings=ceilings,
                   confirmed=stored_confirmed(study, records, study.winner_rounds()))


def run_by_workers(trials: Sequence[FrozenTrial]) -> bool:
    """Whether workers of a shared study (``--storage`` with several workers) ran these trials; a lone search names none."""
    return any(ATTR_WORKER in t.user_attrs for t in trials)


def published_winner(study: SearchStudy) -> tuple[Best, str] | None:
    """The winner a shared study's confirming worker stored, and who wrote it where; None for none.

    Any worker's ``autotune status`` and ``autotune report`` read it, whichever
    directory holds that worker's best.json and train.py.
    """
    stored = study.study.user_attrs.get(STUDY_WINNER)
    if not isinstance(stored, dict) or not isinstance(stored.get("best"), dict):
        return None
    budget = study.study.user_attrs.get(STUDY_BUDGET)
    if isinstance(budget, int) and stored.get("trials") != budget:  # an earlier budget's: a rerun with more --trials is not confirmed yet
        return None
    try:
        best = Best.from_dict(stored["best"])
    except AutotuneError:  # written by another version: no winner to show
        return None
    return best, f"{stored.get('by')} (best.json and train.py in {stored.get('out')})"


def stored_confirmed(study: SearchStudy, records: list[TrialRecord], rounds: Rounds | None = None) -> tuple[Confirmed, ...]:
    """The stored confirmation rounds (or ``rounds``), labelled like the search labels them."""
    found = []
    for key, (values, failures, failed_rounds) in (study.stored_confirmation() if rounds is None else rounds).items():
        setup = TrainSetup.from_json(key)
        # The trials that measured it, as the search picked its finalists from (a pruned twin stays "a finalist in fp32").
        same = sorted((r for r in records if r.setup == setup and r.result.ok and r.result.samples_per_s),
                      key=lambda r: -(r.result.samples_per_s or 0.0))
        timed_out = [r for r in records if r.setup == setup and r.result.status == "timeout"]  # the defaults' trial, say
        label = finalist_label(same) if same else finalist_label(timed_out) + TIMED_OUT if timed_out else setup.describe() + TWIN
        found.append(Confirmed(Candidate(key, setup, label, twin=not same and not timed_out, timed_out=not same and bool(timed_out)),
                               tuple(values), tuple(failures),
                               failed_rounds=tuple(failed_rounds)))
    return tuple(found)


def stored_best(out: Path, stored: SearchStudy, records: list[TrialRecord]) -> Best | None:
    """``out/best.json`` if it is this study's: its study name, one of its setups, its model or Task, image size, data and
    device (not one left by another search, such as ``autotune report o1 --storage sqlite:///o2/study.db`` of another
    image size, or ``--study beta`` of the same workload)."""
    path = out / "best.json"
    if not path.is_file() and not path.is_symlink():  # a dangling link is read: its error names the link
        return None
    best = read_best(path)
    if best.study and best.study != stored.study.study_name:  # a search of the same workload kept in another study
        return None
    signature = stored.study.user_attrs.get(STUDY_SIGNATURE) or {}
    if signature and (signature.get("model"), signature.get("task")) != (best.workload.model, best.workload.task):
        return None
    told = {"device": best.workload.device, "data": best.workload.data,
            **({"image_size": best.workload.image_size} if best.workload.task is None else {})}  # a Task's image size is unread
    if any(key in signature and signature[key] != value for key, value in told.items()):  # an older study may lack a key
        return None
    # One of its trials' setups, or a finalist's fp32 twin (measured in a confirmation only; that run's
    # rounds may since have been replaced by a rerun's).
    return best if any(best.setup in (r.setup, r.setup.replace(amp="off")) for r in records) else None


def _kept_in_out(out: Path) -> bool:
    """Whether ``out/best.json`` records an ``autotune search`` command that kept its study in ``out/study.db`` (no --storage)."""
    try:
        command = read_best(out / "best.json").command
    except AutotuneError:  # missing or broken: nothing tells where the study was kept
        return False
    return command.startswith("autotune search") and " --storage" not in command


def own_study(out: Path, storage: str | None, study: str | None) -> str | None:
    """The study to read for the search whose ``--out`` is ``out``: ``study`` when given (or with a ``--storage``);
    else the one ``out/best.json`` names where ``out/study.db`` holds it (another search's ``--storage`` may have added
    a study of its own there); else None, the only one there."""
    if study is not None or storage is not None or not (out / "best.json").is_file():
        return study
    try:
        named = read_best(out / "best.json").study or None
        if named is not None:
            SearchStudy.load(storage_of(out, None), named)
    except AutotuneError:  # unreadable, or a study not there: the only one, as before
        return None
    return named


def storage_of(out: Path, storage: str | None) -> str:
    """``storage``, or else the SQLite study a search wrote in ``out``.

    Raises:
        StorageError: No storage given and ``out/study.db`` does not exist.
        UsageError: An empty ``storage`` (the search refuses it too; taken as a path, it read as the working directory).
    """
    if storage is not None and not storage.strip():
        raise UsageError(f"--storage must not be empty (leave it out for {out / 'study.db'})")
    if storage is not None:
        return storage
    if out.is_file():
        where = f" ({out.parent})" if (out.parent / "study.db").is_file() else ""  # not a folder without a study
        raise StorageError(f"{out} is a file; pass the search's output directory{where}, which holds study.db")
    db = out / "study.db"
    if db.exists() and not db.is_file():
        raise StorageError(f"no study in {out}: {db} is not a file (a directory, say), where a search keeps its study database")
    if not db.is_file():
        if (out / "trials.csv").is_file():  # a search wrote here: its study.db was removed, or it was kept in a --storage
            if _kept_in_out(out):
                raise StorageError(
                    f"no study in {out}: {db} is missing, yet the search of {out / 'best.json'} kept its study there "
                    "(its command has no --storage): the file was removed or moved; put it back, or pass --storage URL --study NAME"
                )
            if (out / "best.json").is_file():  # its command names no study.db here: the study is in the --storage it names
                raise StorageError(f"no study in {out}: its search kept the study in its --storage; pass that --storage URL --study NAME")
            raise StorageError(f"no study in {out}: {db} is missing; it was removed or moved (put it back), or the search kept its "
                               "study in a --storage (pass that --storage URL --study NAME)")
        raise StorageError(
            f"no study in {out}: {db} does not exist (run `autotune search --out {out}` first, or pass --storage URL --study NAME)"
        )
    return f"sqlite:///{db.resolve()}"


def report_study(out: Path, *, storage: str | None = None, study: str | None = None,
                 warn: Callable[[str], None] | None = None) -> tuple[Path, ...]:
    """Write ``out/report.html`` (and its PNG copies) from a stored study.

    Args:
        out: The search's output directory; the report is written there.
        storage: Optuna storage URL (default: ``out/study.db``).
        study: Study name (default: the only study in the storage).
        warn: Told why the page shows no winner where ``out/best.json`` cannot be read or is another search's
            (the CLI's warning line: the page alone said it).

    Returns:
        The files written, report.html first.

    Raises:
        StorageError: No study there, or a study without a finished trial.
    """
    study = own_study(out, storage, study)
    storage = storage_of(out, storage)
    stored = SearchStudy.load(storage, study)
    records = stored.records()
    calibration = stored.calibration()
    if not records and calibration is None:
        raise StorageError(f"study {stored.name!r} in {stored.storage} holds no finished trial yet: nothing to report")
    # A shared study's winner is the one stored for its current budget: a best.json here may be an interrupted
    # run's unconfirmed pick, or this worker's copy of an earlier budget's winner.
    shared = run_by_workers(stored.study.get_trials(deepcopy=False))
    best, unreadable = best_json_of(out, stored, records) if not shared else (None, None)  # unreadable: the trials, no winner
    published = published_winner(stored)
    if published is not None:  # a shared study: another worker confirmed and wrote its best.json
        best = published[0]
    holder = None if shared else Holder.from_dict(stored.study.user_attrs.get(STUDY_HOLDER))  # a lone search running now
    rerun = best is not None and rerun_replaces(out, holder)
    superseded = rerun and best is not None and not best.confirmed  # an interrupted run's pick: the rerun's trials are newer
    if superseded:
        best = None
    verdict, ceilings = stored.verdict() if best is not None else (None, None)
    spent = stored.time_spent()
    if published is not None:
        status = f"finished: confirmed by {published[1]}"
    elif unreadable:
        status = f"winner not shown: {unreadable}; rerun the search's command to write best.json again"
    elif not records:  # calibrated: the page shows its ceilings, as the search's own page did
        status = "calibrated, no trial finished yet (in progress or interrupted)"
    elif superseded:
        status = "in progress: a rerun is searching; the best trial so far is shown, not confirmed"
    elif best is None and not any(r.result.ok for r in records) and not stored.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        status = "failed: no feasible trial"
    elif best is None and not shared and (out / "best.json").is_file():
        status = (f"winner not shown: {out / 'best.json'} is another search's (another study, workload or setups), not the winner "
                  f"of study {stored.name!r}")
    elif best is None and not shared and STUDY_WINNER_ROUNDS in stored.study.user_attrs and not (holder and holder.alive()):
        status = (f"winner confirmed, not shown here: it is in the best.json of the search's own --out ({out} holds none); "
                  "report that directory to show it")
    elif best is None:
        status = "in progress or interrupted (no confirmed winner for this budget yet)" if shared else "in progress or interrupted (no best.json yet)"
    elif rerun:
        status = ("in progress: a rerun is searching; the winner shown is an earlier run's (best.json and train.py), which it "
                  "replaces once it confirms its own")
    elif not best.confirmed:
        status = "interrupted (winner not confirmed)"
    elif not shared and (later := measured_after(stored.study.get_trials(deepcopy=False), out / "best.json")):
        status = (f"interrupted (an earlier run's confirmed winner kept; {later} trial(s) measured after it are not confirmed: "
                  "rerun the search's command to confirm them)")
    else:
        status = "finished"
    if warn is not None and status.startswith("winner not shown"):
        warn(status)
    data = ReportInput(
        records=tuple(records),
        calibration=calibration,
        confirmed=stored_confirmed(stored, records, stored.winner_rounds() if best is not None and best.confirmed else None),
        best=best,
        verdict=verdict,
        ceilings=ceilings,
        time_spent=spent or TimeSpent.from_records(records),
        study=stored.name,
        storage=stored.storage,  # the password hidden
        time_complete=spent is not None,
        status=status,
        baseline_only=baseline_only(records, stored_set(stored)),
        workload=stored_workload(stored),
        max_memory_bytes=stored_max_memory(stored),
        world_size=stored_world_size(stored),
    )
    return write_report(out, data)
