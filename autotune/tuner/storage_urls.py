"""What a ``--storage`` URL names (a journal file, an SQLite file, a database server) and whether it could be opened,
read without opening it: a malformed URL, a journal path whose directory is missing, an SQLite file of another
program's are refused before anything is written."""

from __future__ import annotations

import contextlib
import os
import re
import urllib.parse
from pathlib import Path

import sqlalchemy.exc

from autotune.errors import MalformedStorageURL, StorageError
from autotune.files import nearest_existing
from autotune.redact import hide_passwords
from autotune.tuner.journal_file import journal_begins

JOURNAL_SCHEME = "journal://"


def journal_path(url: str) -> str | None:
    """The log file of a journal storage URL; None for any other URL."""
    if url.startswith(JOURNAL_SCHEME):
        return url[len(JOURNAL_SCHEME) :] or None
    if "://" not in url and url.endswith(".log"):
        return url
    return None


def sqlite_url(path: Path) -> str:
    """The ``sqlite:///`` URL of the database file ``path`` (made absolute), its ``%``, ``?`` and ``#`` escaped: pasted
    as they are, SQLAlchemy read ``--out 'runs/s?x=1'``'s study as the file ``runs/s``, outside ``--out``, with ``x=1``
    an ignored query, and ``%41`` as an ``A``."""
    text = str(path.resolve())
    return "sqlite:///" + text.replace("%", "%25").replace("?", "%3F").replace("#", "%23")


def storage_file(url: str) -> Path | None:
    """The file of a ``sqlite:///PATH`` or journal URL; None for a database server (or an in-memory SQLite)."""
    journal = journal_path(url)
    if journal is not None:
        return Path(journal)
    if not url.startswith("sqlite:///"):
        return None
    path = sqlite_path(url)
    return Path(path) if path and path != ":memory:" else None


def foreign_sqlite(url: str, file: Path, *, empty_ok: bool = False) -> str | None:
    """Why the SQLite ``file`` of ``url`` holds no Optuna study, read without writing it; None when it may hold one
    (with ``empty_ok``, a database of no table too: Optuna's to fill, where a search writes its study).

    Opening such a file with Optuna would create Optuna's tables in it, which a command that only reads must not do.
    A journal file, or a file that is not a database at all (Optuna's own error names it), gives None.
    """
    if journal_path(url) is not None:
        return None
    import sqlite3

    try:
        with contextlib.closing(sqlite3.connect(f"{file.resolve().as_uri()}?mode=ro", uri=True)) as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.Error:
        return None
    if "studies" in tables or (empty_ok and not tables):
        return None
    return f"{file} is an SQLite database without Optuna's tables" + (f" (tables: {', '.join(sorted(tables)[:5])})" if tables else "")


def no_folder(folder: str) -> str:
    """Why a storage file cannot go in ``folder``, which is no directory: it does not exist, or a file stands on its path."""
    above = nearest_existing(folder)
    return f"{above} is not a directory" if not above.is_dir() else f"directory {folder} does not exist"


def refuse_foreign_sqlite(url: str) -> None:
    """Refuse to open, for a search, an SQLite file of another program's (``--out`` holding the user's own
    ``study.db``): Optuna would add its tables to it, and the search then replaced the best.json and report.html
    beside it, which the check of an ``--out`` no search wrote to guards. An empty database is Optuna's to fill.

    Raises:
        StorageError: The file holds tables, none of them Optuna's.
    """
    file = storage_file(url)
    if file is None or not file.is_file() or file.stat().st_size == 0:
        return
    if (foreign := foreign_sqlite(url, file, empty_ok=True)) is not None:
        raise StorageError(hide_passwords(f"cannot open study storage {url!r}: {foreign}; it is left as it is (Optuna would "
                                          "add its tables to it): pass another --out or --storage"))


def sqlite_path(url: str) -> str | None:
    """The database file a ``sqlite://`` URL names (``:memory:`` for an in-memory one), a URI filename's too
    (``sqlite:///file:PATH?uri=true``); None when it names none."""
    parsed = sqlalchemy.engine.make_url(url)
    where = parsed.database
    if where and where.startswith("file:"):  # a SQLite URI filename: its path, or memory
        path = urllib.parse.unquote(urllib.parse.urlsplit(where).path)
        return ":memory:" if parsed.query.get("mode") == "memory" else path
    return where


def is_shared(url: str | None) -> bool:
    """Whether the storage is meant for many workers (a database server or a journal file)."""
    return url is not None and (journal_path(url) is not None or not url.startswith("sqlite"))


def check_storage_url(url: str) -> None:
    """Refuse a ``--storage`` URL that no storage could open, without connecting or touching files (before the
    workload is built, and before ``--out``, where its SQLite file may go, is made).

    Raises:
        MalformedStorageURL: Not a URL of a known kind, or an in-memory SQLite (the password is hidden): exit 2.
        StorageError: A journal file's directory is missing, or the path holds something else: exit 1.
    """
    if url != url.strip():  # pasted with a space: a trailing one would name another database (postgresql://h/db )
        raise MalformedStorageURL(hide_passwords(f"cannot open study storage {url!r}: it begins or ends with a space"))
    if url.startswith("postgres:"):  # SQLAlchemy knows the dialect as postgresql only
        raise MalformedStorageURL(hide_passwords(f"cannot open study storage {url!r}: write postgresql:// (SQLAlchemy has no postgres:// dialect)"))
    if (journal := journal_path(url)) is not None:
        _check_journal_file(url, journal)
        return
    if url.startswith("journal:"):  # journal://x or journal:x: not the three slashes of a path
        raise MalformedStorageURL(f"cannot open study storage {url!r}: write {JOURNAL_SCHEME}/ABSOLUTE/PATH.log (or a plain path ending .log)")
    if "://" not in url and (scheme := re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", url)):  # postgresql:host/db: not echoed, it may hold a password
        raise MalformedStorageURL(f"cannot open study storage {scheme.group(1)}:...: its {scheme.group(1)}: is not followed by //; write "
                           f"postgresql://USER@HOST/DB, sqlite:///ABSOLUTE/PATH.db or {JOURNAL_SCHEME}/ABSOLUTE/PATH.log")
    if "://" not in url:  # a file path (the default study.db's): SQLAlchemy says only "Could not parse SQLAlchemy URL"
        raise MalformedStorageURL(f"cannot open study storage {url!r}: not a storage URL; write {sqlite_url(Path(url))} for an "
                           "SQLite file (a search alone), a path ending .log for a journal file, or postgresql://USER@HOST/DB")
    if url.split("://", 1)[1].split("/", 1)[0].count("@") > 1:  # the driver would read the password's tail as the host
        raise MalformedStorageURL(hide_passwords(f"cannot open study storage {url!r}: more than one '@' before the host; percent-encode "
                                          "an '@' in the user name or password as %40"))
    try:
        if not url.startswith("sqlite"):
            sqlalchemy.engine.make_url(url).get_dialect()  # the URL's form and its dialect; the driver loads on connecting
            return
        where = sqlite_path(url)
    except sqlalchemy.exc.NoSuchModuleError:  # a typo in the scheme (jornal://): SQLAlchemy names its plugin loader
        raise MalformedStorageURL(hide_passwords(f"cannot open study storage {url!r}: no storage kind {url.split(':', 1)[0]}://; write "
                                          f"postgresql://USER@HOST/DB, sqlite:///ABSOLUTE/PATH.db or {JOURNAL_SCHEME}/ABSOLUTE/PATH.log")) from None
    except Exception as exc:  # sqlalchemy's parse and plugin errors differ
        why = first_line(exc)
        if "invalid literal for int()" in why:  # postgresql://HOST:abc/DB
            why = f"its port {why.rsplit(': ', 1)[-1]} is not a number"
        raise MalformedStorageURL(hide_passwords(f"cannot open study storage {url!r}: {why}")) from None
    if not where or where == ":memory:":
        raise MalformedStorageURL(hide_passwords(f"study storage {url!r} is an in-memory database, lost when the search ends: "
                                          "give a file (sqlite:///PATH)"))


def _check_journal_file(url: str, path: str) -> None:
    """Refuse a journal path whose directory is missing, that is a directory, or a file of something else, before
    anything is written: Optuna appended its first record to a text file of the user's (then failed on reading its
    first line), and a missing directory read as a raw ``[Errno 2]``."""
    where = os.path.abspath(path)
    where = "/" + where.lstrip("/") if where.startswith("//") else where  # journal:////abs/path: POSIX keeps a leading //
    if os.path.isdir(where):
        why = f"{where} is a directory; name a journal file in it ({os.path.join(where, 'study.log')})"
    elif not os.path.isdir(folder := os.path.dirname(where)):
        why = no_folder(folder)
    elif os.path.isfile(where) and os.path.getsize(where) > 0 and not journal_begins(where):
        why = not_a_journal(where) if _is_sqlite(where) else f"{not_a_journal(where)}; it is left as it is: pass a new file's path for a new study"
    else:
        return
    raise StorageError(f"cannot open study storage {url!r}: {why}")


def not_a_journal(path: str) -> str:
    """Why the file at ``path`` cannot be a journal storage, naming the URL that opens it where it is an SQLite database."""
    return f"{path} is not an Optuna journal file (a JSON record per line)" + (
        f": it is an SQLite database; pass {sqlite_url(Path(os.path.realpath(path)))}" if _is_sqlite(path) else "")


def _is_sqlite(path: str) -> bool:
    """Whether the file at ``path`` begins as an SQLite database does."""
    try:
        with open(path, "rb") as file:
            return file.read(16) == b"SQLite format 3\x00"
    except OSError:
        return False


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type when empty)."""
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else type(exc).__name__
