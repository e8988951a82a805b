"""Many files written by worker processes at once: the synthetic JPEGs over the usable CPU cores.

Writing a JPEG is CPU work (about 6 ms each on the 2-core VM): 16384 of them
in one process take minutes. The parent draws every file's parameters itself,
in file order (so the files do not depend on how many processes write them),
and hands each worker process every P-th file. The workers are fresh
interpreters (``python -c``), torch-free, each in its own session: not forked
from a parent that may hold torch and threads, and not started by
``multiprocessing``'s spawn, which imports the caller's ``__main__`` again (a
script without a main guard would run once per worker). A worker stops at its
next file when its parent is gone (``kill -9``); the parent kills them all when
it stops (Ctrl-C, a remembered stop, a failed worker).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from autotune.errors import WorkloadError

#: Files a worker process must have to pay for its start (an interpreter with numpy and PIL: about 0.3 s, ~60 JPEGs).
FILES_PER_PROCESS = 100
#: How often the parent looks at its workers and at ``stop`` (seconds).
POLL_S = 0.05
#: A worker's last line on stderr when writing a file failed with an OSError (a full disk): the rest is its text.
_OSERROR = "autotune-file-worker-oserror: "
#: What a worker runs: the job (JSON on stdin) names the parent's sys.path, so the writer imports as it does there.
_BOOT = (
    "import json, sys; job = json.load(sys.stdin); sys.path[:0] = job['sys_path']; "
    "from autotune.workloads.file_workers import serve; sys.exit(serve(job))"
)

Writer = Callable[[tuple[int, ...], Path], None]


def worker_count(n_files: int, cores: int | None = None) -> int:
    """Processes worth starting for ``n_files``: one per usable core, each with at least :data:`FILES_PER_PROCESS`.

    Args:
        n_files: Files to write.
        cores: Usable CPU cores (None: the affinity mask capped by a cgroup quota, ``probes.cpu.usable_cores``).

    Returns:
        At least 1 (1: write them in this process).
    """
    if cores is None:
        from probes.cpu import usable_cores

        cores = usable_cores()
    return max(1, min(cores, n_files // FILES_PER_PROCESS))


def writer_reference(write: Writer) -> str | None:
    """``module:function`` by which a worker process imports ``write``, or None where it cannot (a lambda, a closure,
    a function of ``__main__``): then this process writes the files itself."""
    module, name = getattr(write, "__module__", None), getattr(write, "__qualname__", "")
    if not module or module == "__main__" or not name.isidentifier():
        return None
    try:
        found = getattr(importlib.import_module(module), name, None)
    except ImportError:  # pragma: no cover - the function's own module imports
        return None
    return f"{module}:{name}" if found is write else None


def write_in_processes(write: Writer, files: Sequence[tuple[Path, tuple[int, ...]]], processes: int,
                       stop: Callable[[], bool] | None = None) -> None:
    """Write ``files`` (path, parameters) with ``write`` in ``processes`` worker processes, file i by worker i mod P.

    Args:
        write: A module-level function (see :func:`writer_reference`); called as ``write(parameters, path)``.
        files: Each file's path and the parameters drawn for it.
        processes: Worker processes (at least 2; one is this process's own loop).
        stop: Whether the caller was asked to stop meanwhile, looked at every :data:`POLL_S`.

    Raises:
        OSError: A worker could not write a file (its message: ``No space left on device``).
        WorkloadError: A worker failed otherwise, or was killed.
        KeyboardInterrupt: ``stop`` said so, or a Ctrl-C arrived; every worker is killed before it propagates.
    """
    reference = writer_reference(write)
    if reference is None:
        raise WorkloadError(f"{write!r} cannot be imported by a worker process")
    workers: list[tuple[subprocess.Popen[bytes], IO[bytes]]] = []
    try:
        for _ in range(processes):
            stderr = tempfile.TemporaryFile()
            workers.append((subprocess.Popen([sys.executable, "-c", _BOOT], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                             stderr=stderr, start_new_session=True), stderr))
        sys_path = _import_path()
        for index, (proc, _) in enumerate(workers):  # all started first: each reads its job while the next starts
            job = {"sys_path": sys_path, "write": reference, "parent": os.getpid(),
                   "files": [[str(path), list(spec)] for path, spec in files[index::processes]]}
            assert proc.stdin is not None
            proc.stdin.write(json.dumps(job).encode())
            proc.stdin.close()
        while True:
            if stop is not None and stop():
                raise KeyboardInterrupt
            codes = [proc.poll() for proc, _ in workers]
            failed = next((i for i, code in enumerate(codes) if code not in (None, 0)), None)
            if failed is not None:
                _raise_failure(*workers[failed])
            if all(code == 0 for code in codes):
                return
            time.sleep(POLL_S)
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: the worker leads its group
                except ProcessLookupError:  # pragma: no cover - ended meanwhile
                    pass
        for proc, log in workers:
            proc.wait()
            log.close()


def _import_path() -> list[str]:
    """The parent's sys.path for a worker, behind the directory this autotune was imported from (the same
    autotune, also where a ``''`` entry, the directory a ``python -c`` started in, found it)."""
    return [str(Path(__file__).resolve().parents[2]), *(entry or os.getcwd() for entry in sys.path)]


def _raise_failure(proc: subprocess.Popen[bytes], stderr: IO[bytes]) -> None:
    """Raise what a worker that ended badly says: its OSError as one, anything else as a one-line WorkloadError."""
    stderr.seek(0)
    lines = [line.strip() for line in stderr.read().decode(errors="replace").splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if last.startswith(_OSERROR):  # "ERRNO:text": the errno tells a full disk from a refused permission
        number, _, text = last[len(_OSERROR):].partition(":")
        raise OSError(int(number), text) if number.isdigit() and text else OSError(last[len(_OSERROR):])
    code = proc.returncode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"failed (exit {code})"
    raise WorkloadError(f"a process writing synthetic files {how}" + (f": {last}" if last else ""))


def serve(job: dict[str, Any]) -> int:
    """A worker's loop: import the writer, write each file of the job; stop at once when the parent is gone.

    Args:
        job: ``write`` (``module:function``), ``parent`` (its pid), ``files`` (``[path, parameters]`` pairs).

    Returns:
        The exit status: 0 all written, 1 the parent is gone, 3 an OSError (its errno and text are the last line on stderr).
    """
    module, _, name = str(job["write"]).partition(":")
    write = getattr(importlib.import_module(module), name)
    parent = int(job["parent"])
    for path, spec in job["files"]:
        if os.getppid() != parent:  # killed with kill -9: the next generation removes the copy
            return 1
        try:
            write(tuple(spec), Path(path))
        except OSError as exc:
            sys.stderr.write(f"\n{_OSERROR}{exc.errno or 0}:{exc.strerror or exc}\n")
            return 3
    return 0
