"""One search at a time per output directory and per study.

Two searches writing the same output directory (or study) would calibrate
twice, run their trials side by side on the same cores, store each other's
slowed measurements and overwrite each other's ``best.json``. The rules:

* **Output directory.** A search holds an exclusive ``fcntl.flock`` on
  ``OUT/autotune.lock`` while it runs; the file names the holder's pid and
  host. The kernel drops the lock when the holder dies (even of ``kill -9``),
  so a lock left by a dead process is simply taken over.
* **Study.** The study records its holder (pid, host, process start time and
  a heartbeat refreshed with every stored trial) as a user attribute, so a
  search on another ``--out`` with the same ``--storage`` and study is
  refused too. A holder on this host counts as alive while its process
  exists; a holder on another host while its heartbeat is younger than
  :data:`STALE_AFTER_S`. A worker of a shared study that leaves in an orderly
  way (done, an error, Ctrl-C or SIGTERM) stamps itself :data:`GONE`: then it
  counts as gone at once, on every host.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil

from autotune.errors import StorageError
from autotune.tuner.storage_urls import storage_file

LOCK_FILE = "autotune.lock"

#: A study holder on another host whose heartbeat is older than this is taken over.
STALE_AFTER_S = 30 * 60.0
#: Prefix of a shared study's user attribute ``alive:HOST:PID:START`` holding when that worker last stored a
#: calibration run or a confirmation measurement: on another host its election marker counts as alive from then.
ALIVE = "alive"
#: What a worker stamps on its ``alive:`` attribute as it leaves the search: without it, a worker on another host counted
#: its election markers alive for STALE_AFTER_S after it ended, and waited for its work that long.
GONE = "gone"


@dataclass(frozen=True)
class Holder:
    """The process that holds a lock.

    Attributes:
        pid: Its process id.
        host: Its host name.
        started: Its process start time (seconds since the epoch), so a
            reused pid is not mistaken for the holder.
        heartbeat: When it last proved alive (seconds since the epoch).
        left: It stamped itself :data:`GONE` (read by :meth:`refreshed`; never stored on a marker).
    """

    pid: int
    host: str
    started: float = 0.0
    heartbeat: float = 0.0
    left: bool = field(default=False, compare=False)

    @classmethod
    def me(cls) -> Holder:
        """This process, now."""
        return cls(os.getpid(), socket.gethostname(), _started(os.getpid()) or 0.0, time.time())

    @classmethod
    def from_dict(cls, data: Any) -> Holder | None:
        """The holder stored in a study; None when absent or malformed."""
        if not isinstance(data, dict):
            return None
        try:
            return cls(int(data["pid"]), str(data["host"]), float(data["started"]), float(data["heartbeat"]))
        except (KeyError, TypeError, ValueError):
            return None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {k: v for k, v in asdict(self).items() if k != "left"}

    def same_process(self, other: Holder) -> bool:
        """Whether both name one process (same host, pid and start time)."""
        return self.host == other.host and self.pid == other.pid and abs(self.started - other.started) < 1.0

    def alive(self, now: float | None = None, stale_after: float = STALE_AFTER_S, seen_from: str | None = None) -> bool:
        """Whether the holder may still be running (see the module rules; on another host: a heartbeat younger than
        ``stale_after``); never once it stamped itself :data:`GONE`. ``seen_from``: as a process on that host sees it
        (default: this one); a process is looked up only where both are this host's, any other by its heartbeat."""
        if self.left:
            return False
        here = socket.gethostname()
        if self.host != here or (seen_from or here) != here:
            return (now if now is not None else time.time()) - self.heartbeat < stale_after
        started = _started(self.pid)
        return started is not None and abs(started - self.started) < 1.0

    def alive_key(self) -> str:
        """The study user attribute where this worker stamps the time it last proved alive (:data:`ALIVE`)."""
        return f"{ALIVE}:{self.host}:{self.pid}:{self.started:.2f}"

    def refreshed(self, attrs: dict[str, Any]) -> Holder:
        """This holder with the heartbeat it stamped in the study's user attributes ``attrs``, when later; ``left``
        where it stamped itself :data:`GONE`."""
        stamp = attrs.get(self.alive_key())
        if stamp == GONE:
            return replace(self, left=True)
        return replace(self, heartbeat=stamp) if isinstance(stamp, (int, float)) and stamp > self.heartbeat else self

    def describe(self) -> str:
        """``pid N on HOST``."""
        return f"pid {self.pid} on {self.host}"


#: The studies and --out directories the searches of this process hold now: a search in another thread of it is refused
#: as one in another process is (a Holder, a flock and a pid name processes alike, not threads).
_HELD_HERE: set[str] = set()
_HELD_LOCK = threading.Lock()
#: Who holds what a thread of this process's search holds, as the refusals say it.
IN_THIS_PROCESS = "another search of this process, in another thread"


def hold_here(key: str) -> bool:
    """Take ``key`` (a study, a directory) for a search of this process; False where another one holds it."""
    with _HELD_LOCK:
        if key in _HELD_HERE:
            return False
        _HELD_HERE.add(key)
        return True


def study_key(storage: str, name: str) -> str:
    """A study as :func:`hold_here` takes it: by its file where it has one (two URLs may name it), else its URL."""
    file = storage_file(storage)
    return f"study:{file.resolve() if file is not None else storage}\0{name}"


@contextmanager
def let_go_on_error(key: str) -> Iterator[None]:
    """Give ``key`` up where the block raises (what it took it for failed)."""
    try:
        yield
    except BaseException:
        let_go_here(key)
        raise


def held_here(key: str) -> bool:
    """Whether a search of this process holds ``key``."""
    with _HELD_LOCK:
        return key in _HELD_HERE


def let_go_here(key: str) -> None:
    """Give ``key`` up (nothing where it is not held)."""
    with _HELD_LOCK:
        _HELD_HERE.discard(key)


def _started(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError):
        return None


class OutputLock:
    """An exclusive lock on an output directory (see the module rules).

    Use as a context manager, or call :meth:`acquire` and :meth:`release`.
    """

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / LOCK_FILE
        self._fd: int | None = None
        self._key = f"out:{os.path.realpath(self.path)}"  # the same --out through a link too

    def acquire(self) -> None:
        """Take the lock, or refuse in one line naming the holder.

        Raises:
            StorageError: Another live process holds it (or another thread's search of this one), or it cannot be created.
        """
        if not hold_here(self._key):
            raise self._in_use(IN_THIS_PROCESS)
        with let_go_on_error(self._key):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise StorageError(f"cannot create the lock file {self.path}: {exc.strerror}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
                os.close(fd)
                if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise self._in_use(holder) from None
                raise StorageError(f"cannot lock {self.path}: {exc.strerror}") from None
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{Holder.me().describe()}\n".encode(), 0)
            except OSError as exc:  # a full disk, a quota: the lock goes with its line unwritten, and is said in one line
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                raise StorageError(f"cannot write the lock file {self.path}: {exc.strerror or exc}") from None
        self._fd = fd

    def refuse_if_held(self) -> None:
        """Refuse as :meth:`acquire` would where a live process holds the lock, taking nor creating anything: a search's
        first check, before the seconds its workload takes to build (torchvision's import, a Task's module).

        Never call it in a process that holds the lock: on NFS, where flock is emulated by POSIX locks, closing any
        descriptor of the file drops the process's own lock.

        Raises:
            StorageError: Another live process holds it.
        """
        if held_here(self._key):  # another thread's search: its file is not opened (on NFS that drops its lock)
            raise self._in_use(IN_THIS_PROCESS)
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return  # none yet, or unreadable: acquire() says what it meets
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise self._in_use(os.read(fd, 200).decode(errors="replace").strip() or "another process") from None
        finally:
            os.close(fd)  # drops the shared lock, where it was taken

    def _in_use(self, holder: str) -> StorageError:
        return StorageError(f"--out {self.path.parent} is in use by another autotune search ({holder}); "
                            "wait for it to finish or pass another --out")

    def release(self) -> None:
        """Drop the lock (the file stays: removing it would race a new holder)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.ftruncate(fd, 0)
            except OSError:
                pass
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            let_go_here(self._key)

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
