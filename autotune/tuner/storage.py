"""Which Optuna storage a ``--storage`` URL opens, and how a worker talks to a shared one.

* ``sqlite:///...`` (the default, in ``--out``): embedded, one search at a time.
* ``postgresql://user@host/db`` (or another server URL Optuna's RDB storage
  takes): a study shared by workers on many machines. Every running trial
  records an Optuna heartbeat every :func:`~autotune.tuner.heartbeats.heartbeat_s` seconds; a trial
  whose heartbeat is older than three intervals is failed by the next worker
  that looks (``optuna.storages.fail_stale_trials``) and queued again with
  its parameters (``RetryHeartbeatStaleTrialCallback``).
* ``journal:///path/to/study.log`` or a plain path ending in ``.log``:
  Optuna's ``JournalFileBackend``, for workers on one host or on a shared
  filesystem (no server).

A worker that cannot reach a shared storage retries with backoff
(:func:`with_retries`) and then stops with one line.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import optuna
import sqlalchemy.exc
from optuna.storages import BaseStorage, JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback

from autotune.errors import StorageError
from autotune.redact import hide_passwords
from autotune.tuner.heartbeats import heartbeat_s
from autotune.tuner.journal_file import JournalFile, journal_begins
from autotune.tuner.signals import stop_requested, wait_unless_stopped
from autotune.tuner.storage_urls import (
    check_storage_url,
    first_line,
    journal_path,
    no_folder,
    not_a_journal,
    refuse_foreign_sqlite,
    sqlite_path,
    storage_file,
)

T = TypeVar("T")


def _no_fallback_notice(record: logging.LogRecord) -> bool:
    """Optuna's notice of a query it runs again another way (``Caught an error from sqlalchemy ... Falling back to a
    slower alternative``): on a lost connection it printed the SQL with its parameters, 9 lines guessing at too many
    query variables. The retries and their one line say what failed."""
    return not record.getMessage().startswith("Caught an error from sqlalchemy")


logging.getLogger("optuna.storages._rdb.storage").addFilter(_no_fallback_notice)

#: Attempts and first pause of a worker that lost its storage (the pause doubles: 1+2+4+8+16 s;
#: ``AUTOTUNE_STORAGE_RETRIES`` overrides the attempts).
RETRIES = 6
FIRST_PAUSE_S = 1.0


def retries() -> int:
    """Attempts at a storage step before a worker gives up (``AUTOTUNE_STORAGE_RETRIES``, else :data:`RETRIES`)."""
    try:
        return max(1, int(os.environ.get("AUTOTUNE_STORAGE_RETRIES", RETRIES)))
    except ValueError:
        return RETRIES


def close_connections(storage: BaseStorage) -> None:
    """Close the pooled database connections of ``storage`` (an RDB storage, or Optuna's cache in front of one): after
    a search in a Python session (a notebook) their files stayed open until garbage collection ran. A later read of the
    storage opens new ones."""
    backend = getattr(storage, "_backend", storage)
    engine = getattr(backend, "engine", None)
    if engine is not None:
        engine.dispose()


def open_storage(url: str) -> BaseStorage:
    """The Optuna storage for ``url`` (SQLite and servers: an RDB storage whose tables are created once, however many
    processes open it at the same time; a journal file: a journal storage).

    Raises:
        StorageError: The storage cannot be opened (the password is hidden).
    """
    check_storage_url(url)
    path = journal_path(url)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    try:
        if path is not None:
            return JournalStorage(JournalFile(os.path.abspath(path)))  # whole records only, whatever a full disk cut short
        if url.startswith("sqlite"):
            folder = os.path.dirname(os.path.abspath(sqlite_path(url) or ""))
            if not os.path.isdir(folder):
                raise StorageError(hide_passwords(f"cannot open study storage {url!r}: {no_folder(folder)}"))
            refuse_foreign_sqlite(url)
            return _rdb_storage(url, {}, heartbeats=False)
        engine: dict[str, Any] = {"pool_pre_ping": True}
        if url.startswith("postgresql"):
            engine["connect_args"] = {"connect_timeout": 10}
        return _rdb_storage(url, engine)
    except StorageError:
        raise
    except Exception as exc:  # sqlalchemy, driver and file errors all differ
        why = first_line(exc)
        if "Failed to import DB access module" in why:  # Optuna's words for a missing SQLAlchemy driver
            dialect = url.split(":", 1)[0]
            why = (f"no database driver for {dialect} is installed in this environment (autotune brings psycopg for "
                   "postgresql+psycopg://; install the SQLAlchemy driver your URL names)")
        elif path is not None and isinstance(exc, (ValueError, KeyError, TypeError)) and not journal_begins(path):  # not a journal
            why = not_a_journal(path)
        elif path is not None and isinstance(exc, ValueError):  # a journal with a broken record (two writers on NFS, say)
            why = f"{path} is a damaged Optuna journal ({why}): restore it from a backup, or pass another --storage for a new search"
        else:
            why = cause_said(url, exc)
        raise StorageError(hide_passwords(f"cannot open study storage {url!r}: {why}")) from None


def _rdb_storage(url: str, engine: dict[str, Any], *, heartbeats: bool = True) -> RDBStorage:
    """Optuna's RDB storage (with heartbeats for a shared one); when another process creates its tables at the same
    time (a second worker, or ``autotune status`` while a search starts), creating them again is retried."""
    beat = heartbeat_s()
    # Optuna warns that heartbeats are meant for Study.optimize; this search records them itself (heartbeats()).
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    kwargs: dict[str, Any] = {}
    if heartbeats:
        kwargs = {"heartbeat_interval": beat, "grace_period": 3 * beat,
                  "heartbeat_stale_trial_callback": RetryHeartbeatStaleTrialCallback(max_retry=3)}
    for attempt in range(5):
        try:
            return RDBStorage(url, engine_kwargs=engine, **kwargs)
        except sqlalchemy.exc.DBAPIError as exc:
            if attempt == 4 or not _created_meanwhile(exc):
                raise
            time.sleep(random.uniform(0.1, 0.5))
    raise AssertionError("unreachable")


def _created_meanwhile(exc: sqlalchemy.exc.DBAPIError) -> bool:
    """Whether creating the tables failed because another process created them first (SQLite says "table ... already
    exists" or fails on the unique schema version; a server raises an integrity or "already exists" error)."""
    if isinstance(exc, sqlalchemy.exc.IntegrityError | sqlalchemy.exc.ProgrammingError):
        return True
    text = str(exc).lower()
    return "already exists" in text or "database is locked" in text


#: What PostgreSQL says to a client beyond its max_connections.
SLOTS_FULL = ("remaining connection slots are reserved", "too many clients already")


def cause_said(url: str, exc: BaseException) -> str:
    """What the storage at ``url`` said when it could not be opened or read: the database's own first line (behind
    Optuna's wrapper of a failed commit, whose words guess at invalid data), and for a damaged SQLite file what to do."""
    why = first_line(storage_cause(exc))
    if any(words in why for words in SLOTS_FULL):  # PostgreSQL's, at max_connections: said as the server's limit, not an outage
        why += ("; the server has no connection slot free: each search (and `autotune status`) keeps connections open to "
                "it, so raise its max_connections or run fewer searches on it at once")
    if url.startswith("sqlite") and _damaged(why):
        if _text_file(sqlite_path(url) or ""):  # never a database, so nothing to restore (random bytes over one: damaged)
            return why + (f": {sqlite_path(url)} is a text file, no SQLite database; it is left as it is: pass a new file's "
                          "path (or another --out) for the study")
        why += (f": {sqlite_path(url)} is damaged (not a readable SQLite database): restore it from a backup, or move it "
                "away and pass another --out (or --storage) for a new search")
    return why


def _text_file(path: str) -> bool:
    """Whether the file at ``path`` begins as text (UTF-8, no control characters but whitespace), not as SQLite's header."""
    try:
        with open(path, "rb") as file:
            head = file.read(4096)
        text = head.decode("utf-8")
    except (OSError, UnicodeDecodeError):  # a multi-byte character cut at 4096 bytes reads as no text: said as damaged
        return False
    return bool(text) and all(c.isprintable() or c in "\t\n\r\f" for c in text)


def _damaged(why: str) -> bool:
    """Whether SQLite's error says its file is damaged (cut short, overwritten), not busy or unreachable."""
    return "malformed" in why or "file is not a database" in why


def storage_cause(exc: BaseException) -> BaseException:
    """The database's own error behind Optuna's wrapper of a failed commit (whose words guess at invalid data), else ``exc``."""
    if isinstance(exc, optuna.exceptions.StorageInternalError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def connection_lost(url: str, exc: BaseException) -> bool:
    """Whether ``exc`` is a database server's lost connection (retrying may succeed once it is back), not a refusal that
    stays (a read-only SQLite file, a full disk, a permission): an ``OperationalError`` or ``InterfaceError`` behind
    Optuna's wrapper, of a server URL."""
    return not url.startswith("sqlite") and isinstance(storage_cause(exc), sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError)


#: What a database that fails or drops its connection raises (the last: Optuna's wrapper of a failed commit).
DATABASE_ERRORS: tuple[type[BaseException], ...] = (
    sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError, optuna.exceptions.StorageInternalError)
#: What a lost database connection or an unreachable journal file raises.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (*DATABASE_ERRORS, OSError)


def with_retries(step: Callable[[], T], storage: str, *, on_give_up: Callable[[], None] | None = None) -> T:
    """Run a storage step; on a lost connection retry it with doubling pauses.

    Most steps run inside :func:`~autotune.tuner.signals.interrupts_held`, which holds a stop signal (Ctrl-C,
    SIGTERM, SIGHUP) until they end: one that arrives while the step is retried cuts the pause short and ends the
    retries after one more attempt, where waiting out the pauses held it for 31 s. A stop that came before the call
    (a stopped search writing what it measured) waits them out as before.

    Args:
        step: The storage calls (repeatable: a retry runs all of it again).
        storage: The storage URL, for the message (password hidden).
        on_give_up: Called once before giving up (keep what is only in memory).

    Raises:
        StorageError: Still unreachable after :func:`retries` attempts, or when a stop arrived meanwhile, in one line.
    """
    pause, attempts = FIRST_PAUSE_S, retries()
    stopped_before = stop_requested()
    for attempt in range(1, attempts + 1):
        try:
            return step()
        except CONNECTION_ERRORS as exc:
            if attempt == attempts or (not stopped_before and stop_requested()):
                if on_give_up is not None:
                    on_give_up()
                tried = (f"{attempts} attempts over {FIRST_PAUSE_S * (2 ** (attempts - 1) - 1):.0f} s" if attempt == attempts
                         else f"{attempt} attempts, then the stop")
                raise StorageError(
                    hide_passwords(
                        f"lost the study storage {storage}: {first_line(storage_cause(exc))} "
                        f"({tried}); finished trials are kept, rerun to resume"
                    )
                ) from None
            if attempt == 1:  # said once per outage: a worker silent for half a minute reads as hung
                sys.stderr.write(hide_passwords(f"autotune: lost the study storage {storage} ({first_line(storage_cause(exc))}); "
                                                f"retrying for up to {FIRST_PAUSE_S * (2 ** (attempts - 1) - 1):.0f} s\n"))
            wait = pause * random.uniform(0.8, 1.2)
            if stopped_before:
                time.sleep(wait)
            else:
                wait_unless_stopped(wait)  # a stop meanwhile: one more attempt at once, then the line above
            pause *= 2
    raise AssertionError("unreachable")


@contextmanager
def storage_failures_said(storage: str) -> Iterator[None]:
    """Turn a study storage that fails while the search writes to it (SQLite on a full disk, a server gone) into one line.

    Raises:
        StorageError: Naming ``storage`` (password hidden) and its error (Optuna's wrapper of a failed commit: the error it wraps).
    """
    try:
        yield
    except DATABASE_ERRORS as exc:  # an OSError is the command line's own one-line error already
        raise storage_failure(storage, exc) from None


def storage_failure(storage: str, exc: BaseException) -> StorageError:
    """The one line of :func:`storage_failures_said` for the database error ``exc`` of ``storage``, with what to do."""
    why, file = first_line(storage_cause(exc)), storage_file(storage) if storage.startswith("sqlite") else None
    fix = ("make it writable again" if "readonly" in why or "read-only" in why or "unable to open database file" in why else
           "free disk space" if "disk is full" in why or "No space" in why else "bring the storage back")
    what = f"what it stored before this is kept (finished trials, calibration): {fix}, then rerun the same command to resume"
    if file is not None and not file.parent.exists():
        held = "the study.db and trials.csv" if file.name == "study.db" else file.name  # a search's --out, or a --storage's folder
        what = f"{file.parent} was removed or moved during the search, with {held} in it: put it back, or search again with another --out or --storage"
    elif file is not None and not file.exists():
        what = (f"{file} was removed or moved while the search ran, and what it stored with it (the search's trials.csv lists "
                "the finished trials): put it back, or search again with another --out or --storage")
    elif file is not None and _damaged(why):
        what = (f"{file} was damaged while the search ran (not a readable SQLite database): restore it from a backup, or search "
                "again with another --out or --storage")
    return StorageError(hide_passwords(f"cannot write to the study storage {storage}: {why}; {what}"))
