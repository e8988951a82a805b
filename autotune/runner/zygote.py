"""Start trial processes fast: a warm "zygote" server that forks them.

Importing torch and torchvision takes about 3 s on a small machine, as long
as a short trial measures. The zygote is one server process that imports them
once (and nothing else: no tensor, no thread pool, no CUDA), then forks a
fresh process for every trial. A forked trial starts in milliseconds, in a
new session of its own, with no state from any other trial.

The protocol is files in a per-trial directory, so nothing can block:

* ``request.json``: written by the parent (setup, workload, options);
* ``events.jsonl``: appended by the trial, one JSON event per line;
* ``output.txt``: the trial's stdout and stderr (user prints, warnings);
* ``exit``: written by the zygote when it reaps the trial: its exit code.

This module is the client side; the server is :mod:`autotune.runner.server`
(``python -m autotune.runner.server`` serves; ``... --single DIR`` runs one
trial in a fresh interpreter, the fallback when the zygote cannot start, or
with ``AUTOTUNE_ZYGOTE=0``).
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REQUEST = "request.json"
EVENTS = "events.jsonl"
OUTPUT = "output.txt"
EXIT = "exit"
START_TIMEOUT_S = 120.0
#: The exit code of a server that ended idle (:mod:`autotune.runner.server`, which imports it from here).
IDLE_EXIT = 75


# --------------------------------------------------------------- the client
class TrialProcess:
    """A started trial: its pid (also its process group) and exit status."""

    def __init__(
        self,
        pid: int,
        directory: Path,
        popen: subprocess.Popen[bytes] | None = None,
        server: subprocess.Popen[bytes] | None = None,
    ) -> None:
        self.pid = pid
        self.directory = directory
        self._popen = popen
        self._server = server

    def lost(self) -> int | None:
        """The exit code of the trial's server (negative: a signal's) where the trial is gone without an exit status, which
        nobody will ever write now (the server was terminated, or it could not write the ``exit`` file); else None."""
        code = self._server.poll() if self._server is not None else None
        if code is None or self.exitcode() is not None:
            return None
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return code
        except OSError:
            return None
        return None

    def exitcode(self) -> int | None:
        """The exit code once the process is gone (negative: killed by a signal)."""
        if self._popen is not None:
            return self._popen.poll()
        path = self.directory / EXIT
        if not path.exists():
            return None
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return None

    def wait_reaped(self, timeout: float) -> bool:
        """Wait until the exit status is known (the zygote has reaped the trial)."""
        deadline = time.monotonic() + timeout
        while self.exitcode() is None:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
        return True

    def kill(self) -> None:
        """Kill the trial's whole process group (its loader workers too)."""
        for kill in (lambda: os.killpg(self.pid, signal.SIGKILL), lambda: os.kill(self.pid, signal.SIGKILL)):
            try:
                kill()
            except OSError:
                pass
        if self._popen is not None:
            try:
                self._popen.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not fail
                pass


#: Python 3.10 has no ``-P``: ``-c`` puts the working directory first on ``sys.path`` (as ``''``), which the command
#: takes off before it runs the server as ``-m`` would.
WITHOUT_SAFE_PATH = ("import runpy, sys; del sys.path[0]; "
                     "runpy.run_module('autotune.runner.server', run_name='__main__', alter_sys=True)")


def server_command(safe_path: bool = sys.version_info >= (3, 11)) -> list[str]:
    """How the server starts: ``-P`` keeps the working directory off
    ``sys.path`` (``-m`` would put it first, so a ``json.py`` where the user
    runs autotune would be imported); autotune is found through the
    ``PYTHONPATH`` of :func:`_child_env`, the user's factory through the
    workload's ``sys_path``, appended when the factory is imported. On Python 3.10, whose interpreter refuses
    ``-P`` (every trial failed to start), :data:`WITHOUT_SAFE_PATH` does the same."""
    return [sys.executable, "-P", "-m", "autotune.runner.server"] if safe_path else [sys.executable, "-c", WITHOUT_SAFE_PATH]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    package_root = str(Path(__file__).resolve().parents[2])
    paths = [package_root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


#: Variables that change in the caller's process without the caller changing its setup: those torch sets for itself
#: (inductor's cache directories when something asks for them, CUDA's lazy module loading at its first use) and
#: pytest's name of the test running, new at each test's every phase (each trial of a test suite then started a
#: server, whose start-up forks a test that signals "the trial" could take for it).
NOT_COMPARED = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "CUDA_MODULE_LOADING", "PYTEST_CURRENT_TEST"})


def _compared(env: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in env.items() if key not in NOT_COMPARED}


class Zygote:
    """Client side of the zygote server; one per parent process."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._ready = False
        self._buffer = b""
        self._lock = threading.Lock()
        self.disabled = os.environ.get("AUTOTUNE_ZYGOTE", "1") == "0"
        self._env: dict[str, str] = {}  # the environment the server started with, which every trial it forks inherits
        self._retired: list[subprocess.Popen[bytes]] = []  # servers of an earlier environment, ending once idle

    def _readline(self, timeout: float) -> str | None:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode()

    def _reply_for(self, directory: Path) -> int | None:
        """The pid the server forked for ``directory``.

        Each reply names its directory, so a reply left unread by an
        interrupted launch is skipped instead of taken for this trial's.
        """
        while (answer := self._readline(30.0)) is not None:
            pid, _, answered = answer.partition(" ")
            if answered == str(directory) and pid.isdigit():
                return int(pid)
        return None

    def _spawn(self) -> None:
        self._buffer, self._ready, self._env = b"", False, _child_env()
        self._proc = subprocess.Popen(
            server_command(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            env=self._env,
        )

    def _retire_if_the_environment_changed(self) -> None:
        """A caller that changed ``os.environ`` since the server started (``CUDA_VISIBLE_DEVICES`` between two Python API
        calls, ``TMPDIR``, ``OMP_NUM_THREADS``) gets a new server: trials forked from the old one kept its environment, and a
        trial ran on the GPU the probe no longer described. The old server is left to end once idle (its own trials
        first: closing it would kill them); :meth:`close_all` stops it at exit."""
        for ended in [proc for proc in self._retired if proc.poll() is not None]:
            self._retired.remove(ended)
            for pipe in (ended.stdin, ended.stdout):
                if pipe is not None:
                    pipe.close()
        if self._proc is not None and self._proc.poll() is None and _compared(_child_env()) != _compared(self._env):
            self._retired.append(self._proc)
            self._proc, self._ready, self._buffer = None, False, b""

    def _start(self) -> bool:
        """Make sure a server of the caller's environment is up and has said it is ready."""
        self._retire_if_the_environment_changed()
        if self._proc is None or self._proc.poll() is not None:
            self._spawn()
        if self._ready or self._readline(START_TIMEOUT_S) == "ready":
            self._ready = True
            return True
        self.close()
        return False

    def prestart(self) -> None:
        """Start the server now without waiting for it: its imports (seconds)
        overlap with whatever the caller does before the first trial."""
        with self._lock:
            if not self.disabled and (self._proc is None or self._proc.poll() is not None):
                try:
                    self._spawn()
                except OSError:
                    self._proc = None  # launch() falls back to one interpreter per trial

    def _request(self, directory: Path) -> int | None:
        """Ask the ready server to fork the trial of ``directory``: its pid, or None where the server did not answer."""
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(f"{directory}\n".encode())
            self._proc.stdin.flush()
            return self._reply_for(directory)
        except OSError:
            return None
        except BaseException:  # Ctrl-C mid-exchange: the server and its trial go too
            self.close()
            raise

    def launch(self, directory: Path) -> TrialProcess:
        """Start the trial whose request is in ``directory``."""
        with self._lock:
            for _ in range(2):  # a second try where the server ended idle as the request went to it (it forked nothing)
                if self.disabled:
                    break
                if not self._start():
                    self.disabled = True  # fall back to one interpreter per trial
                    sys.stderr.write(
                        f"autotune: the trial server did not start within {START_TIMEOUT_S:.0f} s; each trial now starts "
                        "its own interpreter (seconds more per trial, measured windows unchanged)\n"
                    )
                    break
                pid = self._request(directory)
                if pid is not None:
                    return TrialProcess(pid, directory, server=self._proc)
                if self.close() != IDLE_EXIT:
                    break
            popen = subprocess.Popen(
                [*server_command(), "--single", str(directory)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env=_child_env(),
            )
            return TrialProcess(popen.pid, directory, popen)

    def close_all(self) -> None:
        """At exit: stop the server and those of an earlier environment (with any trial still running)."""
        self.close()
        while self._retired:
            self._proc, self._ready = self._retired.pop(), True
            self.close()

    def close(self) -> int | None:
        """Stop the server (it kills any trial still running); its exit code (IDLE_EXIT: it had ended idle)."""
        proc, self._proc = self._proc, None
        ready, self._ready = self._ready, False
        if proc is None:
            return None
        try:
            if proc.stdin is not None:
                proc.stdin.close()  # a ready server winds down at end of input, its trials with it
            if ready:
                proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        if proc.poll() is None:  # still importing (prestarted, never used), or not winding down
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        return proc.returncode


_ZYGOTE = Zygote()
atexit.register(_ZYGOTE.close_all)


def launch(directory: Path) -> TrialProcess:
    """Start the trial whose ``request.json`` is in ``directory``."""
    return _ZYGOTE.launch(directory)


def prestart() -> None:
    """Start the zygote server in the background, ahead of the first trial."""
    _ZYGOTE.prestart()


def server_rss() -> int:
    """The trial server's RSS now: the imports every trial it forks counts in its memory figure
    (:func:`autotune.runner.measure.tree_memory`); 0 while none runs."""
    from autotune.runner.measure import process_rss

    proc = _ZYGOTE._proc
    return process_rss(proc.pid) if proc is not None and proc.poll() is None else 0
