"""Reading and writing autotune's own files: atomic writes, JSON reads that
fail with one line, and the check that an output directory is usable."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, StorageError, UsageError


def maker_is_gone(pid: str) -> bool:
    """Whether the process whose pid a temporary path carries in its name is gone (killed with
    ``kill -9``, so nothing removed what it left): not this process, no such pid running."""
    import psutil

    return pid.isdigit() and int(pid) != os.getpid() and not psutil.pid_exists(int(pid))


def _umask() -> int:
    """The process umask: from /proc (Linux), else by setting it and setting it back."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            return next(int(line.split()[1], 8) for line in fh if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) via a temporary file and ``os.replace``.

    A lone surrogate, which Python makes of a byte of a file name that is not UTF-8 (``--data`` in Latin-1), is
    written as its escape (``\\udcff``), as the ``train.py`` header names such a path: UTF-8 cannot hold it.
    """
    atomic_write_bytes(path, text.encode("utf-8", errors="backslashreplace"))


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file and ``os.replace``.

    The file gets the mode a plain ``open()`` gives (0666 less the umask), not
    the temporary file's private 0600: a report is read by others too.
    """
    target = _through_link(Path(path))
    tmp = _written_beside(target, data)
    try:
        os.replace(tmp, target)
    except OSError as exc:  # a directory there, say
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise _renamed_onto(target, exc) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _renamed_onto(target: Path, exc: OSError) -> OSError:
    """The error of a rename of a temporary file onto ``target``, naming ``target`` alone (the rename's error names the
    temporary file the user never heard of, then the target)."""
    return OSError(exc.errno, exc.strerror, str(target))


def _through_link(target: Path) -> Path:
    """``target``, or the file it leads to when it is a symbolic link: a write replaces that file and the link stays, as
    a shell's ``>`` leaves it (the rename onto the link put a file in the link's place, and the file it led to kept
    the old text)."""
    return Path(os.path.realpath(target)) if target.is_symlink() else target


def _written_beside(target: Path, data: bytes) -> str:
    """A temporary file beside ``target`` holding ``data``, on disk (fsync), with the mode a plain ``open()`` gives; its
    path. Removed again where writing it fails. An error names ``target``, not the temporary file (a read-only
    directory refused ``.report.html.abc123``, which the user never heard of)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        exc.filename = str(target)
        raise
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return tmp


def atomic_write_all(files: dict[Path, bytes]) -> None:
    """Write every file of ``files`` as :func:`atomic_write_bytes` does, all or none: each is first written in full to
    a temporary file beside it, and only then are they renamed into place. A target that is a directory (or no regular
    file) is refused before anything is written: a report that failed on its third PNG had replaced its page and first
    PNG, a page beside an earlier run's plots.

    Raises:
        OSError: A file cannot be written (its ``filename`` names it); no target has changed, unless a rename itself
            failed midway (the temporary files are removed either way).
    """
    files = {_through_link(target): data for target, data in files.items()}
    for target in files:
        if target.exists() and not target.is_file():
            raise OSError(errno.EISDIR if target.is_dir() else errno.EEXIST,
                          "Is a directory" if target.is_dir() else "exists and is not a regular file", str(target))
    temps: dict[Path, str] = {}
    try:
        for target, data in files.items():
            try:
                temps[target] = _written_beside(target, data)
            except OSError as exc:
                exc.filename = str(target)  # the file it was for (a failed write of its temporary copy named that)
                raise
        for target, tmp in temps.items():
            try:
                os.replace(tmp, target)
            except OSError as exc:
                raise _renamed_onto(target, exc) from None
    except BaseException:
        for tmp in temps.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise


def nearest_existing(path: str | Path) -> Path:
    """``path`` itself or its nearest ancestor that exists (``/`` at worst): where a file on the way blocks a folder."""
    path = Path(path).absolute()
    return next(p for p in (path, *path.parents) if p.exists())


def dangling(path: str | Path) -> str:
    """What a symbolic link whose target is gone is (``ls`` lists it: "No such file or directory" names a file that
    looked there): its target, or where a chain of links ends."""
    target = os.readlink(path)
    if os.path.islink(os.path.join(os.path.dirname(path), target)):
        return f"a symbolic link to {target}, a chain of links that ends at {os.path.realpath(path)}, which does not exist"
    return f"a symbolic link to {target}, which does not exist"


def read_json(file: Path, error: type[AutotuneError], missing_hint: str = "") -> Any:
    """The parsed JSON of ``file``.

    Args:
        file: The file.
        error: The error class raised, so each caller keeps its exit code.
        missing_hint: Appended to the missing-file message, e.g.
            ``" (run `autotune search` first)"``.

    Raises:
        AutotuneError: (as ``error``) missing, unreadable or not JSON, in one
            line that names the file.
    """
    if file.exists() and not file.is_file():  # a FIFO blocked its read for good, /dev/zero filled the memory
        raise error(f"{file}: not a regular file ({'a directory' if file.is_dir() else 'a FIFO, a device or a socket'})")
    try:
        text = file.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows Notepad saves one) is no error
    except FileNotFoundError:
        if file.is_symlink():  # a link whose target is gone reads as a missing file
            raise error(f"{file}: {dangling(file)}") from None
        raise error(f"{file}: no such file{missing_hint}") from None
    except OSError as exc:
        loop = exc.errno == errno.ELOOP
        raise error(f"{file}: cannot read: {'a loop of symbolic links' if loop else exc.strerror}") from None
    except UnicodeDecodeError:  # a database, an image: not a text file at all
        raise error(f"{file}: not valid JSON (not even UTF-8 text)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{file}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:  # arrays or objects nested deeper than Python's parser recurses: no file autotune wrote
        raise error(f"{file}: not valid JSON for autotune (nested too deeply to parse)") from None
    except ValueError as exc:  # an integer of more than 4300 digits (Python's limit on reading one): no file autotune wrote
        raise error(f"{file}: not valid JSON for autotune ({exc})") from None


def _can_write(directory: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def _refuse_dangling(out: Path, path: Path) -> None:
    """Refuse ``out`` when ``path`` (``out`` or a directory above it) is a symbolic link that leads to no directory:
    ``mkdir`` would say only "File exists"."""
    if path.is_symlink() and not path.exists():
        where = f"--out {out}" if path == out else f"--out {out} cannot be created: {path}"
        raise StorageError(f"{where} is a symbolic link to {os.readlink(path)}, which leads to no directory: "
                           "create its target or pass another --out")


def check_writable(out: Path, flag: str = "--out") -> None:
    """Fail early (leaving nothing behind) when ``out`` cannot be created or written.

    Args:
        out: The directory.
        flag: The option that named it, for the message (``--cache-dir``, whose synthetic JPEGs were refused only
            after "writing 2000 synthetic JPEGs to ...").

    Raises:
        StorageError: ``out`` is a file, or it or its nearest existing parent
            is not a writable directory.
    """
    _refuse_dangling(out, out)
    if out.exists():
        if not out.is_dir():
            raise StorageError(f"{flag} {out} exists and is not a directory")
        if not _can_write(out):
            raise StorageError(f"{flag} {out} is not writable")
        return
    parent = out.absolute().parent
    while not parent.exists():
        _refuse_dangling(out, parent)
        parent = parent.parent
    if not parent.is_dir():
        raise StorageError(f"{flag} {out} cannot be created: {parent} is not a directory")
    if not _can_write(parent):
        raise StorageError(f"{flag} {out} cannot be created: {parent} is not writable")


#: The text chunk of the report's PNGs (``Software``), near their start.
PNG_MARK = b"autotune report"
#: What the head of each result file autotune writes holds: one without it, in an --out no search wrote to, is the user's.
_OURS = {"best.json": b'{\n  "schema": ', "report.html": b"<title>autotune report: ",
         **{f"report-{name}.png": PNG_MARK for name in ("summary", "history", "confirmation")}}


def _head_holds(path: Path, mark: bytes) -> bool:
    """Whether the first 400 bytes of ``path`` hold ``mark`` (False when it cannot be read)."""
    try:
        with path.open("rb") as fh:
            return mark in fh.read(400)
    except OSError:
        return False


#: A DataLoader worker hands tensors over through multiprocessing's socket TMPDIR/pymp-XXXXXXXX/listener-XXXXXXXX, whose
#: path a Unix socket holds in 107 bytes: past them the worker fails to send and the loop waits for its batch for good.
SOCKET_PATH_BYTES, SOCKET_TAIL = 107, len("/pymp-XXXXXXXX/listener-XXXXXXXX")


def check_temp_dir_for_workers(root: str | None = None) -> None:
    """Refuse a temporary directory too long for the loader workers' sockets (a job scheduler's deep TMPDIR).

    Raises:
        UsageError: The socket path would pass :data:`SOCKET_PATH_BYTES`.
    """
    root = root or tempfile.gettempdir()
    if len(os.fsencode(root)) + SOCKET_TAIL > SOCKET_PATH_BYTES:
        raise UsageError(f"the temporary directory {root} is too long for DataLoader workers: their sockets under it pass the "
                         f"{SOCKET_PATH_BYTES} bytes of a Unix socket path, and a trial with workers would hang at its first "
                         "batch; set TMPDIR to a shorter directory (TMPDIR=/tmp), or pass --set num_workers=0")


def check_out(out: Path, data: Path | None) -> None:
    """:func:`check_writable`, and that ``out`` lies outside the ImageFolder ``data`` (its root itself is fine).

    torchvision's ImageFolder takes every sub-directory of ``data`` as a class: an ``--out`` below it would become
    one (empty at first, then holding the report's PNGs), changing the data the search measures.

    Raises:
        StorageError: As :func:`check_writable`, or a result file of ``out`` (``best.json``, ``train.py``, ``trials.csv``,
            ``report.html``, ``study.db``) is a directory, a FIFO or a device: its rename would fail after the whole search, or replace it;
            or, in an ``out`` no search wrote to (no ``study.db``, no ``trials.csv``), ``best.json``, ``report.html`` or a
            ``report-*.png`` is a file autotune did not write (the user's own), which the search would replace.
        UsageError: ``out`` is below ``data``.
    """
    check_writable(out)
    for name in ("best.json", "train.py", "trials.csv", "report.html", "study.db"):  # written by an atomic rename, which fails on
        if (out / name).exists() and not (out / name).is_file():                      # a directory only at the end (study.db: at once)
            raise StorageError(f"{out / name} exists and is not a regular file: the search writes its results there; "
                               "move it away or pass another --out")
    searched = (out / "study.db").exists() or (out / "trials.csv").exists()  # a search wrote here: its own results (or hand-broken)
    page = _head_holds(out / "report.html", _OURS["report.html"])  # an older autotune's PNGs beside its page: matplotlib's mark
    for name, mark in _OURS.items():  # train.py: checked as emit checks its --output
        older = page and name.endswith(".png") and _head_holds(out / name, b"Software\x00Matplotlib")
        if not searched and (out / name).is_file() and not _head_holds(out / name, mark) and not older:
            raise StorageError(f"{out / name} exists and was not written by autotune: the search would replace it with its "
                               "results; move it away or pass another --out")
    if data is None:
        return
    root, target = Path(data).resolve(), out.resolve()
    if root in target.parents:
        top = root / target.relative_to(root).parts[0]
        raise UsageError(f"--out {out} is inside --data {data}: torchvision's ImageFolder would read it as part of class "
                         f"{top.name} (the report's PNGs as images, a new empty directory as a class without any); "
                         "pass an --out outside the data directory")
