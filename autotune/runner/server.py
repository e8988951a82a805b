"""The zygote server: imports torch once, then forks one trial per request.

Started by :class:`autotune.runner.zygote.Zygote` as
``python -m autotune.runner.server``; ``--single DIR`` runs one trial in this
interpreter instead (the fallback). The file protocol is described in
:mod:`autotune.runner.zygote`.
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autotune.runner import measure
from autotune.runner.zygote import EVENTS, EXIT, IDLE_EXIT, OUTPUT, REQUEST

# ---------------------------------------------------------------- the trial
#: Longest directory for multiprocessing's files: its listener socket, ``DIR/listener-XXXXXXXX``,
#: must fit the 108 bytes of an AF_UNIX socket path.
MP_DIR_MAX = 80


def keep_multiprocessing_files_in(trial_dir: Path) -> None:
    """Make the trial's multiprocessing directory a folder of ``trial_dir``.

    Loader workers hand tensors over a socket in multiprocessing's temporary
    directory (``pymp-*`` in the system's). Its clean-up runs at a normal
    exit only: a trial the search prunes or times out is killed, and its
    ``pymp-*`` would stay behind, one per such trial. Inside the trial's
    directory it goes with the rest when the parent removes that. Where the
    socket's path would be too long, multiprocessing keeps its default.
    """
    import multiprocessing

    folder = trial_dir / "mp"
    if len(str(folder)) <= MP_DIR_MAX:
        folder.mkdir(mode=0o700, exist_ok=True)
        # multiprocessing.util.get_temp_dir() reads it; forked loader workers inherit it.
        multiprocessing.current_process()._config["tempdir"] = str(folder)  # type: ignore[attr-defined]


#: How much sooner than the search the kernel's OOM killer takes a trial (and its loader workers, which inherit it) and the
#: trial server: out of memory under a container's limit, a trial is recorded as ``oom`` and a server started again,
#: where the killer took the search itself, the largest process (exit 137, not a word). 1000 is the most; no privilege is needed.
TRIAL_OOM_SCORE = 1000
SERVER_OOM_SCORE = 500


def volunteer_for_oom_kill(score: int) -> None:
    """Raise this process's ``oom_score_adj`` to ``score`` (its children inherit it); nothing where /proc says no."""
    try:
        with open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
            fh.write(str(score))
    except OSError:
        pass


def run_child(trial_dir: str, *, new_session: bool, inherited_bytes: int = 0) -> None:
    """Execute the trial in ``trial_dir`` in this process, then ``_exit``; ``inherited_bytes``: the forking server's RSS
    (its imports, which the trial's memory figure counts as a run of its own would)."""
    status = 0
    try:
        measure.inherited_bytes = inherited_bytes
        started = time.perf_counter()
        volunteer_for_oom_kill(TRIAL_OOM_SCORE)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        if new_session:
            os.setsid()
        directory = Path(trial_dir)
        keep_multiprocessing_files_in(directory)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        log = os.open(directory / OUTPUT, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        events = os.open(directory / EVENTS, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

        def send(event: dict[str, Any]) -> None:
            os.write(events, (json.dumps(event) + "\n").encode())

        from autotune.runner.entry import execute

        request = json.loads((directory / REQUEST).read_text(encoding="utf-8"))
        result = execute(request, started=started, send=send)
        send({"event": "result", "result": result.to_dict()})
    except BaseException:  # pragma: no cover - execute() already catches everything
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            # Skip interpreter teardown (joining loader workers can take
            # seconds); the parent kills the whole process group anyway.
            os._exit(status)


# --------------------------------------------------------------- the server
_children: dict[int, str] = {}


def _reap(signum: int, frame: Any) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        trial_dir = _children.pop(pid, None)
        if trial_dir is not None:
            code = os.waitstatus_to_exitcode(status)
            tmp = Path(trial_dir) / f".{EXIT}.tmp"
            try:
                tmp.write_text(str(code))
                os.replace(tmp, Path(trial_dir) / EXIT)
            except OSError:
                pass


def kill_children() -> None:
    """SIGKILL every trial forked and not yet reaped: its process group, and the trial itself, which leads no group
    until its ``setsid()``. A trial forked just before the parent went (an interrupt right after the launch) may not
    have reached it yet: ``killpg`` alone missed it, and it ran on, orphaned, its directory removed under it."""
    for pid in list(_children):
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except OSError:
                pass


#: An idle server (no trial running, no request) exits after this long: a Python caller's search or trial left one holding
#: hundreds of MiB (torch and torchvision imported) until its own exit. The client starts another on the next trial.
IDLE_S = 60.0
IDLE_ENV = "AUTOTUNE_SERVER_IDLE_S"
#: Before its first request a server waits this many times longer: it is started ahead of a search's own preparation
#: (checks, synthetic JPEGs), which may take minutes.
FIRST_REQUEST_FACTOR = 10


def idle_seconds() -> float:
    """``AUTOTUNE_SERVER_IDLE_S`` where it is a number of seconds > 0, else :data:`IDLE_S`."""
    try:
        seconds = float(os.environ.get(IDLE_ENV, IDLE_S))
    except ValueError:
        return IDLE_S
    return seconds if 0 < seconds < float("inf") else IDLE_S


class Idle(Exception):
    """The server has been idle for its time: no request, and no trial of its own running."""


def _requests(idle_s: float) -> Iterator[str]:
    """The trial directories read from stdin, one per line, until its end.

    Raises:
        Idle: No request and no trial of its own running for ``idle_s`` (before the first request, FIRST_REQUEST_FACTOR
            times that).
    """
    buffer, active, wait = b"", time.monotonic(), idle_s * FIRST_REQUEST_FACTOR
    while True:
        while b"\n" in buffer:
            line, _, buffer = buffer.partition(b"\n")
            if line.strip():
                yield line.decode().strip()
            active, wait = time.monotonic(), idle_s
        readable, _, _ = select.select([0], [], [], min(1.0, wait))
        if _children:
            active = time.monotonic()
        if not readable:
            if time.monotonic() - active >= wait:
                raise Idle
            continue
        chunk = os.read(0, 4096)
        if not chunk:
            return
        buffer += chunk


def serve() -> None:
    """Import the heavy modules once, then fork a trial per request line."""
    volunteer_for_oom_kill(SERVER_OOM_SCORE)  # before torch's import, the server's largest allocation
    import autotune.runner._preload  # noqa: F401

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGCHLD, _reap)
    out = sys.stdout
    idle_s = idle_seconds()
    out.write("ready\n")
    out.flush()
    try:
        serve_requests(_requests(idle_s), out)
    except Idle:
        out.flush()
        os._exit(IDLE_EXIT)
    kill_children()  # the parent is gone: take the trials with us
    # Nothing is left to write or release; tearing down the preloaded torch took about 2 s of every command's exit.
    out.flush()
    os._exit(0)


def serve_requests(requests: Iterator[str], out: Any) -> None:
    """Fork a trial for each request and answer with its pid and directory."""
    for trial_dir in requests:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGCHLD])
        try:
            inherited = measure.process_rss(os.getpid())
            pid = os.fork()
            if pid == 0:
                run_child(trial_dir, new_session=True, inherited_bytes=inherited)
            _children[pid] = trial_dir
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGCHLD])
        out.write(f"{pid} {trial_dir}\n")
        out.flush()


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--single":
        run_child(sys.argv[2], new_session=False)
    else:
        serve()
