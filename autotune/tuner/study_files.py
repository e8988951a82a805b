"""Where a search's study and winner are: the SQLite study a search kept in its ``--out`` or the ``--storage`` given,
and whether ``DIR/best.json`` is this study's winner (not one another search left there), an earlier run's that a
rerun will replace, or one a rerun keeps after an interruption.
"""

from __future__ import annotations

import datetime as _dt
import json
import shlex
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import AutotuneError, StorageError, UsageError
from autotune.output.best import Best, read_best
from autotune.records import TrialRecord
from autotune.redact import shell_quote
from autotune.tuner.budget import ATTR_FREE, FINISHED
from autotune.tuner.config import SearchOutcome
from autotune.tuner.lock import LOCK_FILE, Holder
from autotune.tuner.storage_urls import refuse_foreign_sqlite, sqlite_url
from autotune.tuner.study import STUDY_SIGNATURE, SearchStudy
from autotune.tuner.study_facts import stored_confirmed


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


#: A best.json whose file time is further than this from its own ``created`` was copied (or touched) since it was written.
COPIED_AFTER_S = 120.0


def written_at(path: Path) -> _dt.datetime | None:
    """When the best.json at ``path`` was written, on the wall clock of the machine that wrote it (naive, as Optuna
    records trial starts): the file's time; where a copy reset that (``cp -r``, rsync without -t), best.json's own
    ``created`` (to the second, rounded up) in the writer's time zone, which it names. None where it is gone."""
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return None
    try:
        created = _dt.datetime.fromisoformat(json.loads(path.read_text(encoding="utf-8")).get("created"))
    except (OSError, ValueError, TypeError, AttributeError):
        created = None
    if created is None or created.tzinfo is None or abs(created.timestamp() - mtime) <= COPIED_AFTER_S:
        return _dt.datetime.fromtimestamp(mtime)
    return created.replace(tzinfo=None) + _dt.timedelta(seconds=1.0 if created.microsecond == 0 else 0.0)


def measured_after(trials: Sequence[FrozenTrial], path: Path) -> int:
    """How many of ``trials`` measured a setup (finished, not free) after the best.json at ``path`` was written (0 if it
    is gone): a rerun's trials that its confirmation, interrupted, never took in. A trial not run, cut short or left
    running measured nothing."""
    written = written_at(path)
    if written is None:
        return 0
    return sum(t.state in FINISHED and not t.user_attrs.get(ATTR_FREE) and t.datetime_start is not None
               and t.datetime_start.replace(tzinfo=None) > written for t in trials)


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


def _kept_where(out: Path) -> tuple[bool, str]:
    """Where the search of ``out/best.json`` kept its study, as its command says, read once: whether in ``out/study.db``
    (an ``autotune search`` command without --storage), and the ``--storage URL --study NAME`` that reach it (a
    password hidden there stays hidden: the line says so; the placeholders where the command names none)."""
    placeholder = "that --storage URL --study NAME"
    try:
        best = read_best(out / "best.json")
    except AutotuneError:  # missing or broken: nothing tells where the study was kept
        return False, placeholder
    try:
        words = shlex.split(best.command)
    except ValueError:  # no shell words: a command of the Python API
        words = []
    storage = next((words[i + 1] for i, word in enumerate(words[:-1]) if word == "--storage"), None)
    storage = storage or next((word.split("=", 1)[1] for word in words if word.startswith("--storage=")), None)
    if storage is None:
        return best.command.startswith("autotune search") and " --storage" not in best.command, placeholder
    hidden = " (best.json hides its password: put it back)" if "***@" in storage or "password=***" in storage else ""
    return False, f"--storage {shell_quote(storage)} --study {shell_quote(best.study) if best.study else 'NAME'}{hidden}"


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
            kept_here, where = _kept_where(out)
            if kept_here:
                raise StorageError(
                    f"no study in {out}: {db} is missing, yet the search of {out / 'best.json'} kept its study there "
                    "(its command has no --storage): the file was removed or moved; put it back, or pass --storage URL --study NAME"
                )
            if (out / "best.json").is_file():  # its command names no study.db here: the study is in the --storage it names
                raise StorageError(f"no study in {out}: its search kept the study in its --storage; pass {where}")
            raise StorageError(f"no study in {out}: {db} is missing; it was removed or moved (put it back), or the search kept its "
                               "study in a --storage (pass that --storage URL --study NAME)")
        if (out / LOCK_FILE).is_file():  # a search ran here, and stopped before it wrote a file: a --storage holds its study
            raise StorageError(f"no study in {out}: {db} does not exist, yet a search used this directory ({LOCK_FILE}): one run with "
                               "--storage keeps its study there (pass that --storage URL --study NAME, as its command named them); "
                               "else its study.db was removed")
        raise StorageError(
            f"no study in {out}: {db} does not exist (run `autotune search --out {shell_quote(str(out))}` first, or pass --storage URL --study NAME)"
        )
    return sqlite_url(db)


def check_one_study(out: Path, name: str, *, local: bool = True) -> None:
    """Refuse a search of study ``name`` on an output directory whose ``study.db`` holds other studies only.

    best.json, train.py and report.html there are the outputs of that study's search: another one would overwrite them.
    With ``local`` (the study is ``out/study.db``), a ``trials.csv`` beside a missing or empty ``study.db`` is refused
    too: the study of those trials is gone, and a new search would overwrite the only record of its measurements.

    Raises:
        UsageError: ``out/study.db`` holds studies and none is ``name``, or has lost the trials ``out`` records.
    """
    db = out / "study.db"
    if local and (out / "trials.csv").is_file() and (not db.is_file() or db.stat().st_size == 0):
        raise UsageError(
            f"{out} holds the trials.csv of an earlier search but its study.db is {'empty' if db.is_file() else 'missing'}: "
            "a new search would overwrite that record; move trials.csv (and best.json, train.py, report.html) away, "
            "or pass another --out"
        )
    if not db.is_file() or db.stat().st_size == 0:
        return
    refuse_foreign_sqlite(sqlite_url(db))  # before Optuna's own read, which would create its tables in it
    try:
        summaries = optuna.get_all_study_summaries(sqlite_url(db), include_best_trial=False)
    except Exception:  # not a study database: opening it says so
        return
    names = [s.study_name for s in summaries]
    if names and name not in names:
        if not any(s.n_trials for s in summaries):  # kept after Ctrl-C (or a refusal) before its first trial
            raise UsageError(
                f"{out} holds study {', '.join(map(repr, names))}, stopped before its first trial: pass another --out, "
                f"--study {shell_quote(names[0])} to continue it, or remove {db} to start afresh"
            )
        raise UsageError(
            f"{out} holds the search of study {', '.join(map(repr, names))} (its best.json, train.py and report.html): "
            f"study {name!r} would overwrite them; pass another --out for this search, or --study {shell_quote(names[0])} with that search's "
            "own flags to continue it"
        )
