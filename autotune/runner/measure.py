"""Measuring primitives: throughput windows, memory peaks, device sync.

Used inside the trial child process. Nothing here decides anything; it only
measures.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

from autotune.errors import CUDA_START, DeviceError


def sync(device_type: str) -> None:
    """Wait for queued device work so the clock reads real time (CUDA only)."""
    if device_type == "cuda":
        import torch

        torch.cuda.synchronize()


def start_cuda(device: Any) -> None:
    """Make ``device`` current and reset its peak counter: CUDA's first use in the trial, where a driver older than
    torch's CUDA build fails. Said as the device's failure, not the model's (it read "model resnet18 fails: ...
    Found no NVIDIA driver ... (at --image-size 32)").

    Raises:
        DeviceError: CUDA does not start.
    """
    import torch

    try:
        torch.cuda.set_device(device)
        torch.cuda.reset_peak_memory_stats(device)
    except Exception as exc:  # torch.AcceleratorError, RuntimeError, AssertionError ("Torch not compiled with CUDA")
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        raise DeviceError(f"{CUDA_START} {device} (torch {torch.__version__}, built for CUDA {torch.version.cuda}): "
                          f"{type(exc).__name__}: {first}") from exc


@dataclass(frozen=True)
class WindowStats:
    """Summary of steady-state windows (samples/s each)."""

    median: float
    spread: float
    count: int


def summarize(windows: Sequence[float]) -> WindowStats:
    """Median and range (max - min) of window throughputs.

    Raises:
        ValueError: No windows.
    """
    if not windows:
        raise ValueError("no measured windows")
    return WindowStats(
        median=float(statistics.median(windows)),
        spread=float(max(windows) - min(windows)),
        count=len(windows),
    )


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its descendants, found from the process itself.

    On Linux ``/proc/PID/task/TID/children`` lists each thread's children, so
    the walk reads only this tree; without it psutil scans every process.
    """
    if not os.path.exists(f"/proc/{pid}/task/{pid}/children"):
        return [pid, *(c.pid for c in _psutil_children(pid))]
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        try:
            tasks = os.listdir(f"/proc/{current}/task")
        except OSError:  # gone meanwhile
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{current}/task/{tid}/children", encoding="ascii") as fh:
                    queue.extend(int(child) for child in fh.read().split())
            except (OSError, ValueError):
                continue
    return found


def _psutil_children(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


#: Memory this process holds without having loaded it: in a trial forked by the trial server, the server's RSS at the
#: fork (the imports a run of its own loads itself); in a DDP rank, its trial process's figure at the fork. 0 in a
#: process started afresh, whose RSS holds its imports.
inherited_bytes = 0


def process_memory(pid: int, *, whole: bool) -> int:
    """One process's memory: its RSS (``whole``), else its USS, the pages no other process maps (a forked loader
    worker's own; RSS where the platform gives no USS); 0 once it is gone."""
    try:
        process = psutil.Process(pid)
        if not whole:
            try:
                uss = getattr(process.memory_full_info(), "uss", None)
            except (psutil.AccessDenied, NotImplementedError):
                uss = None
            if uss is not None:
                return int(uss)
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0


def tree_memory(pids: Sequence[int], root: int, inherited: int = 0) -> int:
    """Memory a process tree (a trial process ``root`` and its loader workers, :func:`tree_pids`) would hold as a run of
    its own, in bytes: the root's RSS and each other process's USS (a page a forked worker shares with the root counts
    once, not once per worker as RSS would). A root that inherited ``inherited`` bytes from the process that forked it
    counts them and its own USS: RSS would miss the inherited pages it never touched, and PSS would give the forking
    process its share of them (a trial forked by the trial server read 755 MiB where the same setup's train.py, which
    loads its imports itself, holds 1,110 MiB)."""
    return inherited + sum(process_memory(p, whole=p == root and not inherited) for p in pids)


_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss(pid: int) -> int:
    """One process's resident set size, cheaply (``/proc/PID/statm`` on Linux); 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * _PAGE_SIZE
    except (OSError, ValueError, IndexError):
        try:
            return int(psutil.Process(pid).memory_info().rss)
        except psutil.Error:
            return 0


class MemoryMonitor:
    """Samples the memory of this process and its loader workers in a thread.

    The figure is what the tree would hold as a run of its own (see
    :func:`tree_memory`), but USS is dear: the kernel walks every mapping,
    about 15-20 ms for a trial process holding torch, per process. Read 20
    times a second it would take a quarter of a core per process from the
    training it measures (on 2 cores, with 2 workers, about a quarter of the
    machine). So most samples read the cheap RSS (microseconds) and correct
    it by what the last exact sample read beside it (the pages the processes
    share, the pages the process inherited), and an exact sample re-reads
    that whenever the set of processes changes and otherwise at most every
    :data:`EXACT_EVERY_S` seconds, spaced so that it costs at most
    :data:`EXACT_SHARE` of one core. Private memory, what grows during
    training, counts the same in both.

    Disabled (``enabled=False``, on CUDA, where the device's allocator gives
    the figure) it samples nothing and costs nothing.

    Attributes:
        peak_bytes: Highest sampled total so far.
        over_budget: Set once the total exceeded ``budget_bytes``.
    """

    #: Most seconds between exact (USS) samples.
    EXACT_EVERY_S = 1.0
    #: Most share of one core the exact samples may take.
    EXACT_SHARE = 0.02

    def __init__(self, budget_bytes: int | None = None, interval_s: float = 0.05, *, enabled: bool = True) -> None:
        self.enabled = enabled
        self.budget_bytes = budget_bytes
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.over_budget = threading.Event()
        self._stop = threading.Event()
        self._pid = os.getpid()
        self._thread = self._sampler(self._stop)
        self._pids: list[int] = []
        self._offset = 0  # RSS less the exact figure at the last exact sample
        self._next_exact = 0.0

    def start(self) -> MemoryMonitor:
        """Start sampling."""
        if self.enabled:
            self.sample(exact=True)
            self._thread.start()
        return self

    def restart(self) -> None:
        """Sample again after :meth:`stop` (a held trial's next round) in a thread of its own (the last one, told to
        stop, may still be ending); the peak so far stays."""
        if self.enabled:
            self._stop = threading.Event()
            self._thread = self._sampler(self._stop)
            self._thread.start()

    def _sampler(self, stop: threading.Event) -> threading.Thread:
        """The sampling thread, until ``stop`` is set (not started)."""
        return threading.Thread(target=self._run, args=(stop,), name="autotune-memory", daemon=True)

    def sample(self, *, exact: bool = False) -> int:
        """Take one sample now (``exact``: a USS reading, see the class docstring); return it (0 when disabled)."""
        if not self.enabled:
            return 0
        pids = sorted(tree_pids(self._pid))
        now = time.monotonic()
        rss = sum(process_rss(p) for p in pids)
        if exact or pids != self._pids or now >= self._next_exact:
            began = time.perf_counter()
            value = tree_memory(pids, self._pid, inherited_bytes)
            cost = time.perf_counter() - began
            self._pids, self._offset = pids, rss - value
            self._next_exact = now + max(self.EXACT_EVERY_S, cost / self.EXACT_SHARE)
        else:
            value = max(0, rss - self._offset)
        if value > self.peak_bytes:
            self.peak_bytes = value
        if self.budget_bytes is not None and value > self.budget_bytes:
            self.over_budget.set()
        return value

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> int:
        """Stop sampling; return the peak."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        self.sample(exact=True)
        return self.peak_bytes


class Stopwatch:
    """Accumulates the time spent inside ``with`` blocks."""

    def __init__(self) -> None:
        self.total_s = 0.0
        self._start = 0.0

    def __enter__(self) -> Stopwatch:
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.total_s += time.perf_counter() - self._start


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of ``pid``'s tree, reaped children included (each process's ``children_*`` times)."""
    return _cpu_s(tree_pids(pid))


def _cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds of the processes ``pids`` and of their reaped children (each process's ``children_*`` times)."""
    total = 0.0
    for p in pids:
        try:
            t = psutil.Process(p).cpu_times()
        except psutil.Error:  # gone meanwhile: its parent's children_* times hold it once reaped
            continue
        total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
    return total


def _busy_s(cpus: Sequence[int]) -> float:
    """Seconds the CPUs in ``cpus`` were busy (neither idle nor waiting on I/O; hypervisor steal counts as busy)."""
    per_cpu = psutil.cpu_times(percpu=True)
    busy = 0.0
    for index in cpus:
        t = per_cpu[index]
        busy += sum(t) - t.idle - getattr(t, "iowait", 0.0)
    return busy


#: Cores kept busy by other processes (:class:`LoadMeter`) from which a figure says the machine was busy ...
BUSY_CORES = 0.25
#: ... and the share of the usable cores, where that is more: 0.6 of 16 cores busy (as an idle H200 host read, cause
#: not traced) perturbs a trial no more than the run-to-run noise does.
BUSY_SHARE = 0.1


def busy_threshold(usable_cores: int, floor: float = BUSY_CORES) -> float:
    """Other processes' cores from which a measurement says the machine was busy: ``floor``, or :data:`BUSY_SHARE` of
    the usable cores where that is more (the search's note, a timeout's line and the trial table share the rule)."""
    return max(floor, BUSY_SHARE * usable_cores)


class LoadMeter:
    """Cores that something other than this trial kept busy while it measured.

    The busy time of the CPUs the trial may run on, less the CPU time of the
    trial's own processes (the tree of ``root``), over the wall time. ``None`` where the CPUs the trial
    competes on are not known: no affinity mask (not Linux), or a cgroup CPU
    quota below it (a container on a larger host, whose other tenants would
    count).
    """

    def __init__(self, usable_cores: int, root: int) -> None:
        """Start measuring; ``root`` is the process whose tree is the trial's own."""
        affinity = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        self._cpus = affinity if affinity and len(affinity) <= usable_cores else []
        self._root = root
        self._start = self._sample()

    def _sample(self) -> tuple[float, float, float] | None:
        if not self._cpus:
            return None
        try:
            return time.perf_counter(), _busy_s(self._cpus), _tree_cpu_s(self._root)
        except (OSError, IndexError, psutil.Error):
            return None

    def other_cores(self) -> float | None:
        """Mean cores used by others since construction (never negative), or ``None``."""
        end = self._sample()
        if self._start is None or end is None or end[0] <= self._start[0]:
            return None
        wall, busy, own = (b - a for a, b in zip(self._start, end, strict=True))
        return max(0.0, (busy - own) / wall)


#: Seconds without CPU time after which a trial that timed out is said to wait rather than compute (or half its timeout).
IDLE_SAID_S = 10.0


class IdleMeter:
    """The CPU time of a trial's process tree, sampled about once a second: how long it has used none (a step or a
    dataset item that waits on a lock, a read or the network), which a timeout's line says instead of a busy machine."""

    def __init__(self, root: int) -> None:
        """Start following the tree of ``root``."""
        self._root = root
        self._samples: list[tuple[float, float, int]] = []

    def sample(self) -> None:
        """Read the tree's CPU time and its processes, where a second has passed since the last reading."""
        now = time.monotonic()
        if not self._samples or now - self._samples[-1][0] >= 1.0:
            try:
                pids = tree_pids(self._root)
                self._samples.append((now, _cpu_s(pids), len(pids)))
            except (OSError, psutil.Error):
                return
            self._samples = self._samples[-600:]

    def idle_s(self) -> float:
        """Seconds up to the last reading in which the tree used under 3 % of a core per process (a waiting DDP rank's
        threads poll at about 2 %), 0.0 where it computed."""
        if not self._samples:
            return 0.0
        last_t, last_cpu, processes = self._samples[-1]
        idle = 0.0
        for t, cpu, _ in reversed(self._samples[:-1]):
            if last_cpu - cpu > 0.03 * max(1, processes) * (last_t - t):
                break
            idle = last_t - t
        return idle
