"""Held trials, the parent's side: one process per finalist across the confirmation's rounds.

A fresh trial process pays the model's build, the loader's first batches and
the warm-up before its windows; the confirmation paid them again in every
round of every finalist. While :meth:`HeldTrials.holding`, a trial on the CPU
is started with ``hold`` instead: after each round's result it stops its own
process group (:mod:`autotune.runner.pause`, the trial's side), and the next
call for the same setup continues it (``SIGCONT``) for a round that warms up
with one step and measures as the first did. Nothing of a stopped trial runs
while the others measure, and its loader resumes as full or as empty as it
was, so the rounds stay interleaved and independent of each other's
pipelines.

Trials are held only while the memory available to this process (a
container's limit included) stays at least twice the largest held peak.
A held process shares the pages the trial server's import left to every
trial it forks, so a trial measured beside held ones read a lower summed
PSS, the memory figure then (0.90-0.95x beside the defaults held, 0.76-0.80x beside them and two
finalists: ``python -m benchmarks.held_peaks``, docs/benchmarks.md): such a run
returns no peak (the search's trial of the same setup gives it, measured
alone), and nothing is held under a memory budget (``--max-memory``), whose
check would pass a setup that exceeds it alone. Once a
trial cannot be held or kept (no room, a failed round, one that did not
stop, one gone between rounds), every held trial is released and the block's
other calls run fresh processes: held rounds measure nearer a long run's
steady state (finalists with loader workers -1 to +7 % against fresh ones,
``python -m benchmarks.held_rounds``), and a finalist measured cold beside
warm ones is confined to the round where that happened. Nothing is held
where /dev/shm is small (a container's 64 MiB: the stopped trials' loader
queues stay in it), on a GPU (a stopped process keeps its device memory),
with several ranks, or when a caller watches the windows: every call runs a
fresh process (:func:`~autotune.runner.launch.run_trial`).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import psutil

from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner import zygote
from autotune.runner.launch import WindowCallback, run_trial, start_trial, supervise, with_compile_allowance
from autotune.runner.shm_leftovers import may_have_left, process_group, remove_failed_allocations
from autotune.train_setup import TrainSetup
from probes.cgroup import oom_kills
from probes.hardware import SHM_MIN_BYTES
from probes.memory import collect_memory, collect_shm


@dataclass
class Held:
    """A held trial between its rounds: its process, its directory, how far its events were read, its peak memory."""

    proc: zygote.TrialProcess
    made: tempfile.TemporaryDirectory[str]
    offset: int = 0
    peak: int = 0

    def close(self) -> None:
        """Kill the trial's process group (a stopped process dies of SIGKILL too) and remove its directory."""
        self.proc.kill()
        self.proc.wait_reaped(timeout=2.0)
        self.made.cleanup()


def stopped(pid: int) -> bool:
    """Whether the process ``pid`` is stopped, and every process of its group under it (those that exited count)."""
    try:
        process = psutil.Process(pid)
        if process.status() != psutil.STATUS_STOPPED:  # a zombie: killed, not reaped yet
            return False
        members = [p for p in process.children(recursive=True) if process_group(p.pid) == pid]
        return all(p.status() in (psutil.STATUS_STOPPED, psutil.STATUS_ZOMBIE) for p in members)
    except psutil.Error:
        return False


def wait_stopped(proc: zygote.TrialProcess, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for :func:`stopped`; whether it is (not where the trial exited meanwhile). A held
    trial stops right after its result; ``timeout`` is the trial's own, so a busy machine does not make it a failure."""
    deadline = time.monotonic() + timeout
    while not stopped(proc.pid):
        if proc.exitcode() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class HeldTrials:
    """A trial runner that keeps each setup's process between its calls while :meth:`holding` (module docstring)."""

    def __init__(self) -> None:
        self._held: dict[str, Held] = {}
        self._on = False
        self._full = False  # a trial could not be held (or kept): the block's other calls run fresh processes too

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Hold trials inside the block; every held process is killed when it ends (a stop included). Where /dev/shm
        is small (a container's 64 MiB), nothing is held: the stopped trials' loader queues would stay in it."""
        shm = collect_shm().total_bytes
        self._on, self._full = True, shm is not None and shm < SHM_MIN_BYTES
        try:
            yield
        finally:
            self._on = False
            self.close()

    def close(self) -> None:
        """Kill every held trial (every group first, then the waits for their ends)."""
        held, self._held = list(self._held.values()), {}
        for each in held:
            each.proc.kill()
        for each in held:
            each.close()

    def __call__(
        self,
        setup: TrainSetup,
        workload: Workload,
        options: TrialOptions | None = None,
        *,
        on_window: WindowCallback | None = None,
    ) -> TrialResult:
        """Run the trial as :func:`~autotune.runner.launch.run_trial` does, in the process this setup's last call held
        where there is one."""
        options = options or TrialOptions()
        if (not self._on or self._full or on_window is not None or workload.device != "cpu" or options.world_size > 1
                or options.max_memory_bytes is not None):
            return run_trial(setup, workload, options, on_window=on_window)
        timed = with_compile_allowance(setup, options, workload)
        key = json.dumps([setup.to_dict(), workload.to_dict(), asdict(options)], sort_keys=True)
        held = self._held.pop(key, None)
        kept, began, failed = False, time.time(), True
        try:
            if held is not None and not stopped(held.proc.pid):  # gone meanwhile (the OOM killer's pick): a fresh process
                held.close()
                held = None
                self._full = True  # this round fresh beside resumed ones; the next rounds all fresh
            if held is None:
                made, proc, oom_before = start_trial(setup, workload, timed, hold=True)
                held = Held(proc, made)
            else:
                oom_before = oom_kills()
                os.killpg(held.proc.pid, signal.SIGCONT)
            beside = bool(self._held)  # other held processes share pages with this one (its PSS read lower)
            seen = supervise(held.proc, Path(held.made.name), timed, None, oom_before, held.offset)
            held.offset = seen.offset
            failed = may_have_left(seen.result)
            held.peak = max(held.peak, seen.result.peak_memory_bytes or 0)
            kept = seen.held and not self._full and self._room(held) and wait_stopped(held.proc, timed.effective_timeout_s)
            if kept:
                self._held[key] = held
            else:  # failed, out of room, or not stopped: every round from now on in fresh processes, none warmer
                self._full = True
                self.close()
            return replace(seen.result, peak_memory_bytes=None) if beside else seen.result
        finally:
            if held is not None and not kept:
                held.close()
                if failed:  # or stopped by an exception (Ctrl-C)
                    remove_failed_allocations(began, group=held.proc.pid)

    def _room(self, held: Held) -> bool:
        """Whether ``held`` may stay: at least twice the largest held peak (``held``'s included) available."""
        largest = max([h.peak for h in self._held.values()] + [held.peak])
        return bool(largest) and collect_memory().usable_bytes() >= 2 * largest  # the host's available RAM, or a container's room


@contextmanager
def holding(runner: object) -> Iterator[None]:
    """``runner.holding()`` where ``runner`` is :class:`HeldTrials`; nothing for any other runner (a test's fake)."""
    if isinstance(runner, HeldTrials):
        with runner.holding():
            yield
    else:
        yield
