"""report.html of a search: written at its end, and from a stored study (``autotune report``).

:func:`write_search_report` stores what only the search knows (the time
breakdown, the winner's own ceilings and verdict) in the study, then writes
the page. :func:`report_study` reads everything back from the study and the
winner from ``best.json`` when the search wrote one, so it works on a
finished study, an interrupted one and one still running (its trials so far;
nothing is written to the study). What the study and best.json say are
read by :mod:`autotune.tuner.study_facts` and :mod:`autotune.tuner.study_files`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from optuna.trial import TrialState

from autotune.errors import AutotuneError, StorageError
from autotune.output.report import ReportInput, render_report, write_rendered, write_report
from autotune.records import Calibration, TrialRecord
from autotune.redact import hide_url_password, shell_quote
from autotune.time_spent import TimeSpent
from autotune.tuner.config import SearchOutcome
from autotune.tuner.lock import Holder
from autotune.tuner.signals import interrupts_held, remember_stop, sigterm_as_interrupt
from autotune.tuner.storage import CONNECTION_ERRORS, with_retries
from autotune.tuner.storage_urls import first_line, is_shared, sqlite_url
from autotune.tuner.stores import STUDY_WINNER_ROUNDS
from autotune.tuner.study import STUDY_HOLDER, SearchStudy
from autotune.tuner.study_facts import (
    baseline_only,
    published_winner,
    run_by_workers,
    stored_confirmed,
    stored_max_memory,
    stored_set,
    stored_workload,
    stored_world_size,
)
from autotune.tuner.study_files import best_json_of, measured_after, own_study, rerun_replaces, storage_of


def report_command(out: Path, storage: str, study: str) -> str:
    """The ``autotune report`` command that writes ``out``'s report from its study: ``--storage`` and ``--study`` too
    where the study is not ``out/study.db`` (a journal file, a database server), as ``autotune report OUT`` alone
    finds no study there; paths quoted for a shell, passwords hidden."""
    command = f"autotune report {shell_quote(str(out))}"
    if storage != sqlite_url(out / "study.db"):
        command += f" --storage {shell_quote(hide_url_password(storage))} --study {shell_quote(study)}"
    return command


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
            log(f"report.html not written: interrupted (`{report_command(out, study.storage, study.name)}` writes it from the study)")
        return tuple(str(p) for p in written)
    except Exception as exc:  # a storage, plotting or disk failure must not cost the measured search
        said = str(exc) if isinstance(exc, AutotuneError) else f"{type(exc).__name__}: {exc}"  # its own line has no class name
        log(f"report.html not written: {said} (`{report_command(out, study.storage, study.name)}` writes it from the study)")
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
        elsewhere=published[1] if published is not None and not (out / "best.json").is_file() else None,  # the confirming worker's
    )
    return write_report(out, data)
