"""How a failure inside a trial becomes a status: oom, diverged, bad_data or error.

Nothing is raised to the parent: :func:`classify` maps any exception to a
:class:`~autotune.records.TrialResult`.
"""

from __future__ import annotations

import os
import re
import signal
from dataclasses import replace

from autotune.errors import SHM_FULL, AutotuneError, is_out_of_memory, is_shm_full, raised_in, raised_in_multiprocessing
from autotune.records import TrialResult
from autotune.workloads.batches import hinted
from autotune.workloads.data import BadData
from probes.cgroup import oom_kills
from probes.hardware import SHM_MIN_BYTES, open_files_note
from probes.memory import SHM_PATH, collect_shm, open_files_limit
from probes.units import format_bytes


class BudgetExceeded(AutotuneError):
    """Peak memory went above the user's --max-memory."""


class ShmTooSmall(AutotuneError):
    """A setup's batches in flight (workers x prefetch x batch) are larger than /dev/shm: it fails once its queue fills."""


class CompileFailed(AutotuneError):
    """torch.compile could not compile the model (status ``error``, the reason in one line)."""


def compile_reason(exc: BaseException) -> str:
    """A dynamo or inductor error in one line: its first line, its ``Explanation:`` where it gives one (a custom op's
    ``register_fake`` advice is there), and the first frame of the user's code it names (``from user code:``)."""
    lines = [line.strip() for line in str(exc).strip().splitlines()]
    first = lines[0] if lines else ""
    said = next((line[len("Explanation:"):].strip() for line in lines[1:] if line.startswith("Explanation:")), "")
    after = lines[lines.index("from user code:") + 1:] if "from user code:" in lines else []
    where = next((line for line in after if line.startswith('File "')), "")
    return clipped(first + (f" ({said})" if said else "") + (f", at {where}" if where else ""), 600)


def compile_fix(text: str) -> str:
    """What to do about a failed torch.compile whose error ``text`` names the machine's part: inductor's C++ compiler, or
    its cache; "" where it names the model's."""
    if "C++ compiler" in text:
        return "; install a C++ compiler (g++) or set CXX to one, or --set compile=off"
    if "Read-only file system" in text or "Permission denied" in text:
        return "; inductor's cache must be writable (TORCHINDUCTOR_CACHE_DIR), or --set compile=off"
    return ""


class Diverged(AutotuneError):
    """The loss became NaN or infinite."""


def _one_line(exc: BaseException) -> str:
    """The first line of the message, after the exception's type (the user's or a library's: it says
    what failed); autotune's own errors are worded for the user and keep their message alone."""
    text = str(exc).strip().splitlines()
    first = next((ln.strip() for ln in text if ln.strip()), "")
    if isinstance(exc, AutotuneError) and first:
        return clipped(first)
    return clipped(f"{type(exc).__name__}: {first}") if first else type(exc).__name__


def clipped(text: str, limit: int = 300) -> str:
    """``text`` cut to ``limit`` characters at a word's end, marked `...` (not mid-word before a hint: `` to `t; ``)."""
    if len(text) <= limit:
        return text
    cut = text[:limit - 4]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit - 60 else cut) + " ..."  # a long path or word: cut inside it, not all of it


def classify(exc: BaseException) -> TrialResult:
    """Map an exception raised in a trial to its result status."""
    if isinstance(exc, BudgetExceeded):
        return TrialResult(status="oom", error=str(exc))
    if isinstance(exc, Diverged):
        return TrialResult(status="diverged", error=str(exc))
    if isinstance(exc, (CompileFailed, ShmTooSmall)):  # whole: ShmTooSmall's /dev/shm size leads the search's skips
        return TrialResult(status="error", error=str(exc))
    if isinstance(exc, BadData):
        # Re-raised from a loader worker, the message is the worker's whole
        # traceback; its last line is the original one, naming the file or item.
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        last = lines[-1] if lines else ""
        return TrialResult(status="bad_data", error=last.split(f"{type(exc).__name__}: ", 1)[-1][:400])
    if broken_hand_over(exc):  # a worker out of file descriptors ends so too: the limit is named where it is low
        return TrialResult(status="error", error=f"a DataLoader worker {HAND_OVER_BROKE} ({type(exc).__name__}): it was "
                                                 f"killed, or ended by a signal{open_files_note(open_files_limit())}")
    message = str(exc)
    if "DataLoader worker" in message:
        # PyTorch re-raises a worker's exception with the original traceback as text: keep its last line.
        lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
        cause = lines[-1] if len(lines) > 1 else _one_line(exc)
        said = hinted(clipped(f"failed in a DataLoader worker, not in the training loop: {cause}"))
        return TrialResult(status="error", error=said + shm_hint(message) + limit_hint(exc))
    if is_out_of_memory(exc):
        return TrialResult(status="oom", error=_one_line(exc))
    if isinstance(exc, OSError) and is_shm_full(exc):  # no room for the workers' queue lock: said as PyTorch says a full one
        said = f"{SHM_FULL[0]} for the loader workers' queue lock ({_one_line(exc)})"
        return TrialResult(status="error", error=said + shm_hint(said))
    return TrialResult(status="error", error=hinted(_one_line(exc)) + shm_hint(message) + limit_hint(exc))


#: Where a failure to start a thread or process is raised (a BlockingIOError of non-blocking I/O is no limit met).
_STARTERS = ("popen_fork.py", "subprocess.py", "threading.py")


def limit_hint(exc: BaseException) -> str:
    """The process limit an error met, named: ``ulimit -n`` (this process's open files), the system's file table, or
    ``ulimit -u`` (no thread or process to be had where one was started: torch's threads and the loader's workers count
    against it); empty for any other error."""
    import errno
    import resource

    text, code = str(exc), getattr(exc, "errno", None)
    if code == errno.ENFILE:
        return " (the system's table of open files is full: fs.file-max)"
    if code == errno.EMFILE or "Too many open files" in text:
        limit = open_files_limit()
        if limit is None:
            return ""
        more = f"raise it, ulimit -n {max(4096, 4 * limit)}" if limit < 65536 else "does something keep its files open?"
        return f" (ulimit -n allows this process {limit} open files: {more})"
    started = isinstance(exc, BlockingIOError) and code == errno.EAGAIN and any(f.endswith(_STARTERS) for f in raised_in(exc))
    if "can't start new thread" in text or started:
        soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
        if soft != resource.RLIM_INFINITY:
            return (f" (ulimit -u allows this user {soft} processes and threads, every one of theirs counted: torch's threads "
                    "and the loader's workers need more; raise it, or a container's pids.max)")
    return ""


#: How a loader worker's death reads when it came while the worker handed a batch over (:func:`broken_hand_over`).
HAND_OVER_BROKE = "exited unexpectedly while it handed a batch over"

#: The DataLoader's own module: a frame in it shows that an error came from fetching a batch.
_DATALOADER_FILE = os.path.join("torch", "utils", "data", "dataloader.py")


def broken_hand_over(exc: BaseException) -> bool:
    """Whether ``exc`` is a loader worker that ended while it handed a batch over in shared memory: the hand-over's
    connection closes (EOFError, ConnectionError, raised by multiprocessing) inside the DataLoader's fetch before
    PyTorch has seen the worker end, so its own "DataLoader worker (pid ...) exited unexpectedly" is never raised.
    Not a dataset's own EOFError (a truncated pickle, a network read): raised in the dataset's code, or by a worker
    and raised again with its traceback in the message."""
    if not isinstance(exc, (EOFError, ConnectionError)) or "in DataLoader worker" in str(exc):
        return False
    return any(f.endswith(_DATALOADER_FILE) for f in raised_in(exc)) and raised_in_multiprocessing(exc)


#: The words of a trial whose loader workers found /dev/shm too small (:func:`shm_hint`): the search skips larger queues.
SHM_TOO_SMALL = "is too small for this setup's batches in flight"
#: What only the count of a setup's batches in flight says (:mod:`autotune.runner.shm_fit`): they outgrow /dev/shm by
#: their size alone, where an allocation that failed may have met a /dev/shm that others filled.
SHM_COUNTED = re.compile(r"\b\d+ batches of [\d.]+ \w+ in flight")


def shm_hint(message: str) -> str:
    """``; /dev/shm (64.0 MiB, 0 B free) is too small ...`` where ``message`` says the loader's workers found it full
    (a worker's SIGBUS says so where /dev/shm is under 1 GiB; above, it may be a memory-mapped file cut short); ""
    otherwise."""
    full, bus = (words in message for words in SHM_FULL)
    shm = collect_shm() if full or bus or SHM_PATH in message else None
    refused = "Read-only file system" in message or "Permission denied" in message  # Errno 30 or 13 on a worker's file there
    if shm is not None and shm.total_bytes is not None and not shm.writable and refused:
        return f"; {shm.path} is read-only to this process: loader workers hand every batch over through it (mount a writable tmpfs there)"
    if shm is None or (not full and not bus):
        return ""
    size = f" ({format_bytes(shm.total_bytes)}, {format_bytes(shm.free_bytes)} free)" if shm.total_bytes is not None else ""
    if not full and (shm.total_bytes is None or shm.total_bytes >= SHM_MIN_BYTES):
        return (f"; a worker's bus error (SIGBUS) means {shm.path}{size} ran full for a moment, or a memory-mapped file the "
                "dataset reads was cut short")
    return (f"; {shm.path}{size} {SHM_TOO_SMALL} (workers x prefetch x batch): fewer "
            "workers, a smaller prefetch or batch fit it; to search them all, give the container more shared memory "
            "(docker run --shm-size=8g or --ipc=host)")


#: The words of a SIGKILL the kernel's OOM killer did not send (:func:`killed`).
KILLED_FROM_OUTSIDE = "was killed (SIGKILL) from outside"

#: Said of a trial that timed out without using CPU time lately (:func:`autotune.runner.launch.supervise`): no batch helps.
WAITING = "so it waits rather than computes"


#: Deaths that come from outside the trial (a supervisor, a closed terminal, Ctrl-C, earlyoom's first signal).
EXTERNAL_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGQUIT)


def interrupted(why: str) -> TrialResult:
    """The result of a trial stopped from outside: says nothing about its setup."""
    return TrialResult(status="interrupted", error=why)


def killed(who: str, oom_before: int | None) -> TrialResult:
    """The result of ``who`` killed by SIGKILL: ``oom`` unless the kernel's OOM kill counters, read before it started
    (``oom_before``), show the OOM killer did not act since (then someone else killed it: it says nothing of the setup's
    memory, and a memory pre-pass must not shrink the batch range for it)."""
    if oom_before is not None and oom_kills() == oom_before:  # counters read both times, and unchanged
        return TrialResult(status="error", error=f"{who} {KILLED_FROM_OUTSIDE}; not by the kernel's out-of-memory killer "
                                                 "(its oom_kill counters did not change): by a user, a supervisor or a "
                                                 "user-space OOM daemon (earlyoom, systemd-oomd)")
    return TrialResult(status="oom", error=f"{who} was killed (SIGKILL), most likely by the kernel's out-of-memory killer")


def killed_from_outside(result: TrialResult) -> bool:
    """Whether ``result`` is a SIGKILL the kernel's OOM killer did not send (:func:`killed`): a user's, a supervisor's or
    a user-space OOM daemon's, which says nothing of the setup the first time."""
    return result.status == "error" and KILLED_FROM_OUTSIDE in (result.error or "")


#: How PyTorch says a loader worker died: killed by a signal (SIGKILL says "Killed"), or gone without a word.
WORKER_DEATHS = ("killed by signal: Killed", "exited unexpectedly")  # HAND_OVER_BROKE says the second too


def worker_oom(result: TrialResult, oom_before: int | None) -> TrialResult:
    """``result`` as ``oom`` where it is the error of a loader worker that died while the kernel's out-of-memory killer
    acted (its counters, read before the trial started as ``oom_before``, rose): a worker's memory counts against the
    machine's or the container's limit too. Any other result is returned as it is."""
    error = result.error or ""
    if result.status != "error" or "DataLoader worker" not in error or not any(d in error for d in WORKER_DEATHS):
        return result
    now = oom_kills() if oom_before is not None else None
    if now is None or now == oom_before:
        return result
    return replace(result, status="oom", error=f"a loader worker was killed, most likely by the kernel's out-of-memory killer "
                                              f"(its oom_kill counters rose during the trial): {error}"[:400])
