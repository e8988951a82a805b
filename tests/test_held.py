"""Held trials: a finalist's process kept, stopped, between the confirmation's rounds (real processes and signals)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil
import pytest

from autotune.records import TrialOptions
from autotune.runner import run_trial
from autotune.runner.held import HeldTrials, stopped
from autotune.train_setup import TrainSetup
from autotune.workloads.production import ProductionClock

QUICK = TrialOptions(trial_seconds=0.6, windows=3, timeout_s=120)
WORKERS = TrainSetup(batch_size=8, num_workers=1, prefetch_factor=2)


def _tree(pid: int) -> list[int]:
    try:
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return []


def _gone(pids: list[int], timeout: float = 60.0) -> bool:
    """Whether every pid ended (a zombie left to its parent counts as ended) within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                pass
        if not alive:
            return True
        time.sleep(0.05)
    return False


def _only_held(held: HeldTrials) -> tuple[int, Path]:
    assert len(held._held) == 1, held._held
    (entry,) = held._held.values()
    return entry.proc.pid, Path(entry.made.name)


def test_a_held_trial_runs_its_rounds_in_one_process_stopped_between_them(tiny_workload) -> None:
    """Between rounds the trial and its loader worker are stopped (SIGSTOP: nothing of it runs while others measure);
    the next call for the same setup continues the same process, another setup runs beside it; the end of the block
    kills both and removes their directories."""
    held = HeldTrials()
    with held.holding():
        first = held(WORKERS, tiny_workload, QUICK)
        assert first.status == "ok", first.error
        pid, directory = _only_held(held)
        tree = _tree(pid)
        assert len(tree) >= 2 and stopped(pid), tree  # the trial and its worker
        assert all(psutil.Process(p).status() == psutil.STATUS_STOPPED for p in tree)
        other = held(TrainSetup(batch_size=8), tiny_workload, QUICK)
        assert other.status == "ok", other.error
        assert len(held._held) == 2 and stopped(pid)
        again = held(WORKERS, tiny_workload, QUICK)
        assert again.status == "ok" and again.samples_per_s, again.error
        assert held._held[next(k for k, v in held._held.items() if v.proc.pid == pid)].proc.pid == pid
        events = (directory / "events.jsonl").read_text(encoding="utf-8")
        assert events.count('"event": "result"') == 2  # both rounds' results came from this process
        pids = [pid, *(v.proc.pid for v in held._held.values())]
    assert not held._held
    assert _gone(pids), [_tree(p) for p in pids]
    assert not directory.exists()


def test_outside_the_block_and_for_a_watched_trial_every_call_is_a_fresh_process(tiny_workload) -> None:
    """Search trials (pruned through their windows) and anything outside the confirmation run as run_trial runs them."""
    held = HeldTrials()
    assert held(TrainSetup(batch_size=8), tiny_workload, QUICK).status == "ok"
    assert not held._held
    with held.holding():
        result = held(TrainSetup(batch_size=8), tiny_workload, QUICK, on_window=lambda index, value: False)
        assert result.status == "ok" and not held._held


def test_once_a_trial_finds_no_room_in_memory_no_trial_is_held(tiny_workload, monkeypatch) -> None:
    """Twice the largest held peak must stay available. With room for the first setup only, the first is held and the
    second is not: both are then measured in fresh processes, neither warmer than the other."""
    import autotune.runner.held as held_module

    probe = run_trial(TrainSetup(batch_size=8), tiny_workload, QUICK)
    assert probe.status == "ok" and probe.peak_memory_bytes, probe.error
    room = [10 * probe.peak_memory_bytes]

    class Memory:
        def usable_bytes(self) -> int:
            return room[0]

    monkeypatch.setattr(held_module, "collect_memory", Memory)
    held = HeldTrials()
    with held.holding():
        assert held(TrainSetup(batch_size=8), tiny_workload, QUICK).status == "ok"
        (first,) = held._held.values()
        room[0] = first.peak  # under twice the peaks now held
        assert held(TrainSetup(batch_size=4), tiny_workload, QUICK).status == "ok"
        assert not held._held
        assert _gone(_tree(first.proc.pid) or [first.proc.pid])
        room[0] = 10 * probe.peak_memory_bytes
        assert held(TrainSetup(batch_size=8), tiny_workload, QUICK).status == "ok"
        assert not held._held
    with held.holding():  # the next block starts afresh
        assert held(TrainSetup(batch_size=8), tiny_workload, QUICK).status == "ok"
        assert len(held._held) == 1


def test_a_run_beside_held_trials_gives_no_peak_and_nothing_is_held_under_a_memory_budget(tiny_workload) -> None:
    """A held process shares the pages the trial server left to every trial, so a trial measured beside it reads a
    lower summed PSS: that run returns no peak (the first, alone, does), and under --max-memory, whose check that
    lower figure would pass, every call is a fresh process with its own peak."""
    held = HeldTrials()
    with held.holding():
        alone = held(WORKERS, tiny_workload, QUICK)
        beside = held(TrainSetup(batch_size=8), tiny_workload, QUICK)
        again = held(WORKERS, tiny_workload, QUICK)
        assert [r.status for r in (alone, beside, again)] == ["ok"] * 3
        assert alone.peak_memory_bytes and beside.peak_memory_bytes is None and again.peak_memory_bytes is None
        assert len(held._held) == 2
    budget = TrialOptions(trial_seconds=0.6, windows=3, timeout_s=120, max_memory_bytes=64 * 2**30)
    with held.holding():
        first = held(WORKERS, tiny_workload, budget)
        second = held(TrainSetup(batch_size=8), tiny_workload, budget)
        assert first.peak_memory_bytes and second.peak_memory_bytes and not held._held


def test_a_held_trial_killed_between_rounds_is_started_afresh_and_nothing_is_held_after(tiny_workload) -> None:
    """The OOM killer's pick between rounds: the next round runs in a new process, no worker of the killed one is
    left stopped, and the other rounds run fresh."""
    held = HeldTrials()
    with held.holding():
        assert held(WORKERS, tiny_workload, QUICK).status == "ok"
        pid, _ = _only_held(held)
        workers = _tree(pid)[1:]
        assert workers
        assert held(TrainSetup(batch_size=8), tiny_workload, QUICK).status == "ok"
        other = next(v.proc.pid for v in held._held.values() if v.proc.pid != pid)
        os.kill(pid, signal.SIGKILL)  # the trial alone: its stopped workers die with it (their parent-death signal)
        assert _gone(workers), [psutil.Process(p).status() for p in workers if psutil.pid_exists(p)]
        result = held(WORKERS, tiny_workload, QUICK)
        assert result.status == "ok", result.error
        # Run fresh, and from now on every round is fresh: the other finalist is released too, none measures warm
        # beside one measured cold.
        assert not held._held and _gone([other])
        assert held(TrainSetup(batch_size=8), tiny_workload, QUICK).status == "ok" and not held._held


def test_a_held_trial_dies_with_its_trial_server(tiny_workload) -> None:
    """SIGKILL to the trial server (and the search with it) leaves no stopped trial behind: the trial and its workers
    die with their parents."""
    held = HeldTrials()
    with held.holding():
        assert held(WORKERS, tiny_workload, QUICK).status == "ok"
        pid, _ = _only_held(held)
        tree = _tree(pid)
        server = psutil.Process(pid).ppid()
        if server == os.getpid():
            pytest.fail("the trial ran without the trial server")
        os.kill(server, signal.SIGKILL)
        assert _gone(tree), [(p, psutil.Process(p).status()) for p in tree if psutil.pid_exists(p)]


def test_a_stop_inside_the_block_kills_the_held_trials(tiny_workload) -> None:
    held = HeldTrials()
    with pytest.raises(KeyboardInterrupt), held.holding():
        assert held(WORKERS, tiny_workload, QUICK).status == "ok"
        tree = _tree(_only_held(held)[0])
        raise KeyboardInterrupt
    assert _gone(tree)


def test_a_batch_made_across_a_pause_is_left_out_of_the_workers_time() -> None:
    """A worker stopped mid-batch with its trial would count the whole pause as that batch's time."""
    clock = ProductionClock(1)
    clock.record(0, 0.5, started=time.perf_counter() - 0.5)
    clock.record(0, 0.5, started=time.perf_counter() - 0.5)
    before = clock.batches_per_s()
    began = time.perf_counter()
    clock.pause()
    clock.record(0, 30.0, started=began - 0.1)  # began before the pause, ended after it
    assert clock.batches_per_s() == before == pytest.approx(2.0)
    began = time.perf_counter()  # begun after the note, before the stop, ended after the trial went on
    clock.resume()
    clock.record(0, time.perf_counter() - began + 20.0, started=began)
    assert clock.batches_per_s() == pytest.approx(2.0)
    clock.record(0, 0.25, started=time.perf_counter())  # a batch after the pause counts
    assert clock.batches_per_s() == pytest.approx(1 / ((0.5 + 0.25) / 2))


def test_without_the_trial_server_a_held_trial_is_the_search_s_own_child(tiny_workload, monkeypatch) -> None:
    """A trial run in an interpreter of its own (the fallback) leads a new session too: it is held the same way, and
    killed when the block ends."""
    from autotune.runner import zygote

    fresh = zygote.Zygote()
    monkeypatch.setattr(fresh, "_start", lambda: False)  # a server that never said it was ready
    monkeypatch.setattr(zygote, "_ZYGOTE", fresh)
    held = HeldTrials()
    with held.holding():
        assert held(TrainSetup(batch_size=8), tiny_workload, QUICK).status == "ok"
        pid, _ = _only_held(held)
        assert fresh.disabled and psutil.Process(pid).ppid() == os.getpid() and stopped(pid)
        again = held(TrainSetup(batch_size=8), tiny_workload, QUICK)
        assert again.status == "ok" and _only_held(held)[0] == pid, again.error
    assert _gone([pid])


def test_on_a_gpu_and_for_ddp_trials_every_round_is_a_fresh_process(tiny_workload, monkeypatch) -> None:
    """A stopped process keeps its device memory (the next finalist's round would find less); DDP ranks are not held."""
    import dataclasses

    from autotune.records import TrialResult
    from autotune.runner import held as held_module

    fresh: list[tuple[str, int]] = []

    def run_trial(setup, workload, options=None, *, on_window=None):  # type: ignore[no-untyped-def]
        fresh.append((workload.device, options.world_size))
        return TrialResult(status="ok", samples_per_s=1.0)

    monkeypatch.setattr(held_module, "run_trial", run_trial)
    monkeypatch.setattr(held_module, "start_trial", lambda *a, **k: pytest.fail("a trial was held"))
    held = HeldTrials()
    with held.holding():
        held(TrainSetup(batch_size=8), dataclasses.replace(tiny_workload, device="cuda:0"), QUICK)
        held(TrainSetup(batch_size=8), tiny_workload, dataclasses.replace(QUICK, world_size=2))
    assert fresh == [("cuda:0", 1), ("cpu", 2)]


def test_a_held_trial_whose_trial_server_dies_in_its_first_round_dies_too(tiny_workload) -> None:
    """Armed as it starts (not at its first stop): killed with the search and its server mid-round, it would otherwise
    finish the round, stop, and stay stopped for good."""
    from autotune.runner.launch import start_trial

    made, proc, _ = start_trial(WORKERS, tiny_workload, TrialOptions(trial_seconds=20, windows=3, timeout_s=120), hold=True)
    try:
        deadline = time.monotonic() + 120  # the trial's own timeout
        while len(tree := _tree(proc.pid)) < 2:  # its loader worker started: mid-round, 20 s of windows ahead
            assert time.monotonic() < deadline and proc.exitcode() is None
            time.sleep(0.1)
        server = psutil.Process(proc.pid).ppid()
        assert server != os.getpid()
        os.kill(server, signal.SIGKILL)
        assert _gone(tree), [(p, psutil.Process(p).status()) for p in tree if psutil.pid_exists(p)]
    finally:
        proc.kill()
        made.cleanup()


def test_nothing_is_held_where_dev_shm_is_small(tiny_workload, monkeypatch) -> None:
    """A stopped trial keeps its loader's queued batches in /dev/shm: on a container's 64 MiB the next finalist's
    workers could find it full."""
    from autotune.runner import held as held_module
    from probes.memory import ShmInfo

    monkeypatch.setattr(held_module, "collect_shm", lambda: ShmInfo(path="/dev/shm", total_bytes=64 << 20, free_bytes=60 << 20))
    held = HeldTrials()
    with held.holding():
        assert held(TrainSetup(batch_size=8), tiny_workload, QUICK).status == "ok"
        assert not held._held


def test_the_memory_monitor_samples_again_in_a_held_trial_s_next_round() -> None:
    """A held round enforces the memory budget as the first did, even where the last round's sampler is still ending."""
    from autotune.runner.measure import MemoryMonitor

    monitor = MemoryMonitor(interval_s=0.01).start()
    first = monitor._thread
    monitor.stop()
    monitor.restart()
    assert monitor._thread is not first and monitor._thread.is_alive() and not monitor._stop.is_set()
    ending = monitor._thread
    monitor._stop.set()  # told to stop, not joined yet: the next round's sampler does not wait for it
    monitor.restart()
    assert monitor._thread is not ending and monitor._thread.is_alive()
    assert monitor.stop() > 0
