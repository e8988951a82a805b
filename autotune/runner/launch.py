"""Launch and supervise one isolated, measured training trial.

:func:`run_trial` starts a fresh process (forked from a warm, clean server,
see :mod:`autotune.runner.zygote`, into its own session and process group)
that trains the workload with the setup for a few seconds and reports
steady-state throughput. The parent enforces the timeout by killing the whole
process group, DataLoader workers included. Whatever happens in the child
(OOM, a crash, a hang, a NaN) comes back as a :class:`TrialResult` status,
never as an exception.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import psutil

from autotune.errors import AutotuneError
from autotune.files import maker_is_gone
from autotune.records import MAX_SECONDS, TrialOptions, TrialResult, Workload
from autotune.runner import zygote
from autotune.runner.failures import EXTERNAL_SIGNALS, WAITING, interrupted, killed, worker_oom
from autotune.runner.measure import IDLE_SAID_S, IdleMeter, LoadMeter, busy_threshold
from autotune.runner.shm_leftovers import may_have_left, remove_failed_allocations
from autotune.train_setup import TrainSetup
from autotune.units import format_bytes
from probes.cgroup import oom_kills
from probes.cpu import usable_cores

#: Seconds added to a trial's timeout when it compiles the model (tens of seconds on a CPU, minutes for large models).
COMPILE_ALLOWANCE_S = 300.0
#: Called with (window index, window samples/s); return True to stop the trial.
WindowCallback = Callable[[int, float], bool]
#: A trial directory is ``PREFIX<pid of the search>-<random>`` in the temporary directory.
PREFIX = "autotune-trial-"
#: Free space a trial's files need in the temporary directory: its log, its events, the exit status the server writes.
TRIAL_FILES_MIN_BYTES = 256 * 1024
#: A dead search's trial directory untouched this long is removed (a live one is written every window).
STALE_AFTER_S = 3600.0
_swept: set[str] = set()


def remove_stale_trial_dirs(root: Path) -> None:
    """Remove the trial directories of searches that were killed (``kill -9``) and left them.

    A directory is removed only when the search that made it is gone and
    nothing in it changed for :data:`STALE_AFTER_S`.
    """
    now = time.time()
    for stale in root.glob(f"{PREFIX}*-*"):
        if not maker_is_gone(stale.name[len(PREFIX) :].partition("-")[0]):
            continue
        try:
            newest = max([stale.stat().st_mtime, *(f.stat().st_mtime for f in stale.iterdir())])
        except OSError:
            continue
        if now - newest > STALE_AFTER_S:
            shutil.rmtree(stale, ignore_errors=True)


def _stopped(pid: int) -> str:
    """Said of a timed-out trial whose process was stopped (SIGSTOP, a debugger, a shell's job control), not slow."""
    try:
        state = psutil.Process(pid).status()
    except psutil.Error:
        return ""
    return f": its process was stopped ({state}: SIGSTOP, a debugger or job control), not slow" if state in (
        psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP) else ""


def _last_line(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if not line.startswith(("warnings.warn", "File ", "^")):
            return line[:300]
    return ""


def _signal_death(returncode: int, log_path: Path, oom_before: int | None) -> TrialResult:
    if returncode < 0 and -returncode in EXTERNAL_SIGNALS:
        name = signal.Signals(-returncode).name
        return interrupted(f"the trial process was terminated from outside ({name})")
    if returncode == -signal.SIGKILL:
        return killed("the trial process", oom_before)
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return TrialResult(status="error", error=f"the trial process died of {name}")
    tail = _last_line(log_path)
    return TrialResult(status="error", error=tail or f"the trial process exited with code {returncode} and no result")


def run_trial(
    setup: TrainSetup,
    workload: Workload,
    options: TrialOptions | None = None,
    *,
    on_window: WindowCallback | None = None,
) -> TrialResult:
    """Train ``workload`` with ``setup`` in a fresh process and measure it.

    Args:
        setup: The knobs to apply.
        workload: What to train (device already resolved).
        options: Measurement length, timeout, memory budget, mode.
        on_window: Called after each measured window; returning True stops the
            trial, which then ends with status ``pruned``.

    Returns:
        The measured result; failures are statuses, not exceptions.
    """
    options = with_compile_allowance(setup, options or TrialOptions(), workload)
    began = time.time()
    made, proc, oom_before = start_trial(setup, workload, options)
    result: TrialResult | None = None
    with made as tmp:
        try:
            result = supervise(proc, Path(tmp), options, on_window, oom_before).result
        finally:
            proc.kill()
            proc.wait_reaped(timeout=2.0)
            if result is None or may_have_left(result):  # Ctrl-C during the trial, too
                remove_failed_allocations(began, group=proc.pid)
    return result


def start_trial(
    setup: TrainSetup, workload: Workload, options: TrialOptions, *, hold: bool = False
) -> tuple[tempfile.TemporaryDirectory[str], zygote.TrialProcess, int | None]:
    """Write the trial's request in a directory of its own and start its process (``hold``: it stops after each
    round's result until continued, :mod:`autotune.runner.pause`); ``options`` as :func:`with_compile_allowance` returns them.

    Returns:
        The directory (removed when closed: after the process is reaped), the process, and the kernel's OOM kills
        before it started.

    Raises:
        AutotuneError: The temporary directory cannot hold the trial's files.
    """
    request = {"setup": setup.to_dict(), "workload": workload.to_dict(), "options": asdict(options), "hold": hold}
    # The zygote writes the exit file when it reaps the trial, possibly while
    # the directory is being removed: cleanup errors must not fail the trial.
    root = tempfile.gettempdir()
    if root not in _swept:  # once per process and temporary directory
        _swept.add(root)
        remove_stale_trial_dirs(Path(root))
    try:
        made = tempfile.TemporaryDirectory(prefix=f"{PREFIX}{os.getpid()}-", ignore_cleanup_errors=True)
    except OSError as exc:
        raise _no_room(root, exc.strerror or str(exc)) from None
    directory = Path(made.name)
    try:
        (directory / zygote.REQUEST).write_text(json.dumps(request), encoding="utf-8")
        free = shutil.disk_usage(directory).free
    except OSError as exc:
        made.cleanup()
        raise _no_room(root, exc.strerror or str(exc)) from None
    if free < TRIAL_FILES_MIN_BYTES:  # the trial's log and events, the exit status: unwritten, the trial looked killed from outside
        made.cleanup()
        raise _no_room(root, f"{format_bytes(free)} free")
    oom_before = oom_kills()
    try:
        return made, zygote.launch(directory), oom_before
    except BaseException:
        made.cleanup()
        raise


def with_compile_allowance(setup: TrainSetup, options: TrialOptions, workload: Workload | None = None) -> TrialOptions:
    """``options`` with room in the timeout for compiling the model, where the setup compiles it, or the ``workload``'s
    Task factory does (compilation is warm-up, but it can take minutes)."""
    if setup.compile == "off" and not (workload is not None and workload.compiled):
        return options
    return replace(options, timeout_s=min(MAX_SECONDS, options.effective_timeout_s + COMPILE_ALLOWANCE_S))


def _no_room(root: str, why: str) -> AutotuneError:
    """The error of a temporary directory that cannot hold a trial's files: every trial would fail alike."""
    return AutotuneError(f"cannot write a trial's files in the temporary directory {root} ({why}): free space there, or point "
                         "TMPDIR at a directory with room")


def _read_events(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Complete JSON lines appended to ``path`` since ``offset``."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            data = fh.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    events = []
    for line in data[:end].splitlines():
        try:
            events.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return events, offset + end


def _pruned(window: dict[str, Any], measured: float, windows: tuple[float, ...], options: TrialOptions) -> TrialResult:
    """A trial stopped after ``window``: the median of its windows so far (what the screening judged), what they waited,
    peaked and used."""
    wait = window.get("wait_s")
    return TrialResult(
        status="pruned",
        samples_per_s=statistics.median(windows),
        measured_s=measured,
        data_wait_fraction=min(1.0, float(wait) / measured) if wait is not None and measured > 0 else None,
        peak_memory_bytes=int(window["peak_bytes"]) if "peak_bytes" in window else None,
        warmup_s=window.get("warmup_s"),
        num_threads=window.get("threads"),
        windows=windows,
        mode=options.mode,
        error="stopped early: clearly slower than the best so far",
    )


@dataclass(frozen=True)
class Supervised:
    """What :func:`supervise` saw: the result, how far the events were read, and whether the trial is held (it sent a
    held round's result and stops itself now, :mod:`autotune.runner.pause`)."""

    result: TrialResult
    offset: int = 0
    held: bool = False


#: Cores (and :data:`~autotune.runner.measure.BUSY_SHARE` of the usable ones) that others kept busy during a trial
#: that timed out, from which its line says so: the machine may be the cause.
BUSY_TIMEOUT_CORES = 0.5


def _busy(load: LoadMeter, cores: int) -> str:
    """``" (other processes kept 1.8 cores busy meanwhile: ...)"`` where the machine was busy during a trial that timed
    out (a trial starved by a backup job read only `no result within 102 s`); "" otherwise."""
    other = load.other_cores()
    if other is None or other < busy_threshold(cores, BUSY_TIMEOUT_CORES):  # half a core of 64 is a host's daemons
        return ""
    return (f" (other processes kept {other:.1f} cores busy meanwhile: a busy machine slows a trial past its timeout; rerun "
            "on an idle one, or raise --timeout)")


def _waiting(idle: IdleMeter, timeout_s: float) -> str:
    """Said of a timed-out trial whose processes used no CPU time lately: it waits, and a busy machine is not why."""
    seconds = idle.idle_s()
    if seconds < min(IDLE_SAID_S, timeout_s / 2):
        return ""
    return (f": its processes used no CPU time in its last {seconds:.0f} s, {WAITING} (a lock, a "
            "blocking read or network call in a step or a dataset item; on a GPU, a kernel that long), not slow")


def supervise(
    proc: zygote.TrialProcess,
    directory: Path,
    options: TrialOptions,
    on_window: WindowCallback | None,
    oom_before: int | None,
    offset: int = 0,
) -> Supervised:
    """Follow a started (or continued) trial's events from ``offset`` until its result, its death or its timeout
    (``options``' own: pass them through :func:`with_compile_allowance`), killing it on a timeout or a prune."""
    deadline = time.monotonic() + options.effective_timeout_s
    windows: list[float] = []
    measured = 0.0
    cores = usable_cores()
    load = LoadMeter(cores, proc.pid)  # what else kept the cores busy, for a timeout's line
    idle = IdleMeter(proc.pid)  # whether the trial itself computed lately, for that line
    while True:
        exitcode = proc.exitcode()  # read before the events: no event is lost
        events, offset = _read_events(directory / zygote.EVENTS, offset)
        for event in events:
            kind = event.get("event")
            if kind == "result":
                return Supervised(worker_oom(TrialResult.from_dict(event["result"]), oom_before), offset, event.get("held") is True)
            if kind == "window":
                value = float(event["samples_per_s"])
                windows.append(value)
                measured += float(event.get("seconds", 0.0))
                if on_window is not None and on_window(int(event["index"]), value):
                    proc.kill()
                    return Supervised(_pruned(event, measured, tuple(windows), options), offset)
        if exitcode is None and (server := proc.lost()) is not None:
            if server == -signal.SIGKILL:  # the next trial starts another server: the search goes on, as after a trial's SIGKILL
                result = killed("the trial server, and its trial with it,", oom_before)
                return Supervised(replace(result, windows=tuple(windows), mode=options.mode), offset)
            if server <= 0:  # a signal; or 0, the end of its input: this search closed it (a stop, a reply never read)
                return Supervised(interrupted("the trial server was terminated from outside; its trial is gone"), offset)
            free = format_bytes(shutil.disk_usage(directory).free) if directory.is_dir() else "gone"
            return Supervised(TrialResult(status="error", mode=options.mode, error=f"the trial server ended (exit {server}) without "
                                          f"the trial's exit status, which it writes in {directory.parent} ({free} free there)"), offset)
        if exitcode is not None:
            result = _signal_death(exitcode, directory / zygote.OUTPUT, oom_before)
            return Supervised(replace(result, windows=tuple(windows), mode=options.mode), offset)
        if time.monotonic() > deadline:
            stopped = _stopped(proc.pid) or _waiting(idle, options.effective_timeout_s) or _busy(load, cores)
            proc.kill()
            return Supervised(TrialResult(
                status="timeout",
                windows=tuple(windows),
                mode=options.mode,
                error=f"no result within {options.effective_timeout_s:g} s{stopped}; the process group was killed",
            ), offset)
        idle.sample()
        time.sleep(0.05)
