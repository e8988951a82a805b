"""Measuring primitives: throughput windows, memory peaks, device sync.

Used inside the trial child process. Nothing here decides anything; it only
measures.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil


def sync(device_type: str) -> None:
    """Wait for queued device work so the clock reads real time (CUDA only)."""
    if device_type == "cuda":
        import torch

        torch.cuda.synchronize()


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


def tree_rss(process: psutil.Process) -> int:
    """Resident memory of a process plus all its descendants, in bytes.

    Shared pages are counted once per process, so this is an upper bound of
    what the tree really holds; a vanished child counts as zero.
    """
    total = 0
    try:
        procs = [process, *process.children(recursive=True)]
    except psutil.Error:
        return 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


class MemoryMonitor:
    """Samples the RSS of this process and its loader workers in a thread.

    Attributes:
        peak_bytes: Highest sampled total so far.
        over_budget: Set once the total exceeded ``budget_bytes``.
    """

    def __init__(self, budget_bytes: int | None = None, interval_s: float = 0.05) -> None:
        self.budget_bytes = budget_bytes
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.over_budget = threading.Event()
        self._stop = threading.Event()
        self._process = psutil.Process()
        self._thread = threading.Thread(target=self._run, name="autotune-memory", daemon=True)

    def start(self) -> MemoryMonitor:
        """Start sampling."""
        self.sample()
        self._thread.start()
        return self

    def sample(self) -> int:
        """Take one sample now; return it."""
        value = tree_rss(self._process)
        if value > self.peak_bytes:
            self.peak_bytes = value
        if self.budget_bytes is not None and value > self.budget_bytes:
            self.over_budget.set()
        return value

    def reset_peak(self) -> None:
        """Forget the peak (the next sample starts it anew)."""
        self.peak_bytes = 0
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> int:
        """Stop sampling; return the peak."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=1.0)
        self.sample()
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
