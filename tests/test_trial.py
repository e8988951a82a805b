"""The isolated trial runner: real (tiny) training in a child process."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import time

import psutil
import pytest

from autotune.records import TrialOptions, TrialResult
from autotune.runner import run_trial
from autotune.train_setup import TrainSetup
from autotune.workloads.data import ensure_synthetic, synthetic_dir

pytestmark = pytest.mark.slow

QUICK = TrialOptions(trial_seconds=1.0, windows=2, timeout_s=60)
CONTRACT = {
    "status",
    "samples_per_s",
    "samples_per_s_spread",
    "step_time_s",
    "data_wait_fraction",
    "peak_memory_bytes",
    "warmup_s",
    "measured_s",
    "error",
}


def test_resnet18_trial_is_ok_with_sane_fields(tiny_workload) -> None:
    setup = TrainSetup(batch_size=8, num_workers=1, prefetch_factor=2)
    result = run_trial(setup, tiny_workload, QUICK)
    assert result.status == "ok", result.error
    assert CONTRACT <= set(result.to_dict())
    assert result.samples_per_s > 0
    # 64 images in batches of 8: epochs stream on through the endless sampler; one step each unit, valued by the median.
    assert len(result.windows) >= 2
    assert result.samples_per_s == pytest.approx(statistics.median(result.windows))
    assert min(result.windows) <= result.samples_per_s <= max(result.windows)
    assert result.samples_per_s_spread == pytest.approx(max(result.windows) - min(result.windows))
    assert 0.0 <= result.data_wait_fraction <= 1.0
    assert result.measured_s >= 0.9  # at least the asked-for seconds
    assert result.warmup_s > 0
    # One optimizer step of 8 samples at the median throughput.
    assert result.step_time_s == pytest.approx(8 / result.samples_per_s)
    # The trial process and its worker hold at least a few hundred MB.
    assert result.peak_memory_bytes > 100 * 2**20
    assert result.error is None
    # Forked by the trial server, the trial counts the server's imports as the emitted train.py, which loads them
    # itself, holds them: its figure read about 0.68x train.py's when the server's share was left out.
    from autotune.runner.zygote import server_rss

    server = server_rss()
    assert server > 100 * 2**20 and result.peak_memory_bytes > server, (result.peak_memory_bytes, server)


def test_a_trial_tells_the_cores_another_process_kept_busy_from_its_own(tiny_workload) -> None:
    from autotune.runner.measure import LoadMeter
    from probes.cpu import usable_cores

    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # on the same cores as the trial
    try:
        time.sleep(0.5)
        result = run_trial(TrainSetup(batch_size=8), tiny_workload, QUICK)  # no worker: the burner gets more of the cores
    finally:
        burner.kill()
        burner.wait()
    assert result.status == "ok", result.error
    if usable_cores() < len(os.sched_getaffinity(0)):  # a CPU quota below the affinity: other tenants would count
        assert result.other_cores is None
    else:
        # The burner is not in the trial's tree (the trial leads its own session): its share of the cores counts.
        assert result.other_cores is not None and result.other_cores >= 0.3, result.other_cores
    # Measured for a sleeping process, whatever process group or tree pytest runs in: the burner is someone else's load.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        meter = LoadMeter(len(os.sched_getaffinity(0)), sleeper.pid)
        time.sleep(1.5)
        other = meter.other_cores()
    finally:
        for proc in (burner, sleeper):
            proc.kill()
            proc.wait()
    assert other is not None and other >= 0.5, other  # the burner had a core: this process and the sleeper slept


def test_the_load_meter_leaves_out_the_trials_own_cpu_time(monkeypatch) -> None:
    from autotune.runner import measure

    samples = iter([(10.0, 100.0, 50.0), (12.0, 103.0, 52.5)])  # 2 s: 3 core-seconds busy, 2.5 of them the trial's
    monkeypatch.setattr(measure.LoadMeter, "_sample", lambda self: next(samples))
    assert measure.LoadMeter(2, os.getpid()).other_cores() == pytest.approx(0.25)
    samples = iter([(10.0, 100.0, 50.0), (12.0, 101.0, 52.5)])  # the trial's reaped workers counted: never negative
    assert measure.LoadMeter(2, os.getpid()).other_cores() == 0.0
    monkeypatch.undo()
    assert measure.LoadMeter(0, os.getpid()).other_cores() is None  # more CPUs in the mask than usable (a quota): unknown


def test_bf16_accumulation_and_channels_last_run(tiny_workload) -> None:
    setup = TrainSetup(batch_size=4, accumulation_steps=2, amp="bf16", channels_last=True)
    result = run_trial(setup, tiny_workload, QUICK)
    assert result.status == "ok", result.error
    assert result.step_time_s == pytest.approx(8 / result.samples_per_s)
    assert result.samples % 8 == 0  # whole optimizer steps only
    # Windows may close inside a step: the figure counts time over the whole steps.
    assert result.samples_per_s == pytest.approx(result.samples / result.measured_s)


def test_a_long_accumulated_step_costs_no_more_than_its_own_time(tiny_workload) -> None:
    """4 micro-batches of 0.4 s per step: windows close between micro-batches, the trial ends on the step's end.

    Windows closing only between optimizer steps made 3 windows 3 steps (4.8 s) for a 1-s trial.
    """
    workload = dataclasses.replace(tiny_workload, model="factories:slow_step")
    result = run_trial(TrainSetup(batch_size=1, accumulation_steps=4), workload, dataclasses.replace(QUICK, windows=5))
    assert result.status == "ok", result.error
    assert len(result.windows) >= 3
    # One whole step (3 windows of one micro-batch, the last waiting for the step's end); step-wide windows measured 12.
    assert result.samples == 4
    assert result.samples_per_s == pytest.approx(result.samples / result.measured_s)
    assert result.step_time_s == pytest.approx(result.measured_s, rel=0.01)


def test_compute_and_loader_modes(tiny_workload) -> None:
    compute = run_trial(TrainSetup(batch_size=8), tiny_workload, dataclasses.replace(QUICK, mode="compute"))
    loader = run_trial(
        TrainSetup(batch_size=8, num_workers=1, prefetch_factor=2), tiny_workload, dataclasses.replace(QUICK, mode="loader")
    )
    assert compute.status == loader.status == "ok"
    assert compute.data_wait_fraction == 0.0
    assert loader.data_wait_fraction > 0.9
    assert (compute.mode, loader.mode) == ("compute", "loader")


def test_slow_steps_stop_after_three_windows_once_the_trial_length_is_spent(tiny_workload) -> None:
    """A step longer than a window makes each window one step: 3 of them fill a 1-s trial, not 5."""
    workload = dataclasses.replace(tiny_workload, model="factories:slow_step")
    result = run_trial(TrainSetup(batch_size=1), workload, dataclasses.replace(QUICK, windows=5))
    assert result.status == "ok", result.error
    assert len(result.windows) == 3
    assert result.measured_s >= 1.0


def test_the_window_rule_measures_every_window_unless_the_trial_length_is_spent() -> None:
    """Fast steps fill every window; only slow steps stop early, after 3, once the seconds are spent."""
    from autotune.runner.windows import MIN_WINDOWS, more_windows

    options = TrialOptions(trial_seconds=1.0, windows=5)
    # Fast steps: each window about trial_seconds / windows long.
    assert all(more_windows(k, 0.2 * k, options) for k in range(5))
    assert not more_windows(5, 1.0, options)
    # Slow steps: each window one 0.4-s step; 3 of them spend the second.
    assert more_windows(2, 0.8, options)
    assert not more_windows(MIN_WINDOWS, 1.2, options)
    # A window that overran (a loaded machine) never cuts the minimum.
    assert more_windows(1, 5.0, options) and more_windows(2, 5.0, options)


def test_fast_steps_measure_until_the_trial_length_is_spent(tiny_workload) -> None:
    """However loaded the machine, a trial stops early only once its seconds are measured."""
    workload = dataclasses.replace(tiny_workload, model="factories:tiny_cnn")  # steps of milliseconds
    options = dataclasses.replace(QUICK, windows=5)

    result = run_trial(TrainSetup(batch_size=1), workload, options)
    assert result.status == "ok", result.error
    assert 3 <= len(result.windows) <= 5
    if len(result.windows) < 5:
        assert result.measured_s >= options.trial_seconds


def test_the_loader_ceiling_is_the_workers_over_their_mean_time_per_batch_without_the_first() -> None:
    from autotune.workloads.production import ProductionClock

    clock = ProductionClock(3)
    assert clock.batches_per_s() is None
    for seconds in (5.0, 0.5, 0.5):  # worker 0: a slow first batch, then 0.5 s a batch
        clock.record(0, seconds)
    clock.record(1, 0.25)  # worker 1: only its first batch
    assert clock.batches_per_s() == pytest.approx(3 / 0.5)  # worker 1's first only and worker 2's none: as worker 0
    cold = ProductionClock(4)  # three workers at 50 ms a batch, one that made only its cold first batch of 5 s
    for worker in range(3):
        for seconds in (0.05, 0.05, 0.05):
            cold.record(worker, seconds)
    cold.record(3, 5.0)
    assert cold.batches_per_s() == pytest.approx(4 / 0.05)
    lucky = ProductionClock(2)  # a worker whose one batch after its first held only cheap items (1 ms)
    for seconds in (0.2, 0.001):
        lucky.record(0, seconds)
    for seconds in (0.2, 0.2):
        lucky.record(1, seconds)
    assert lucky.batches_per_s() == pytest.approx(2 / ((0.001 + 0.2) / 2))  # about 20 a second, not 1,005 (1/0.001 + 1/0.2)
    # The trial turns batches a second into samples a second (one process: its world is itself).
    from types import SimpleNamespace

    from autotune.runner.child import TrialLoop
    from autotune.runner.ranks import Rank

    loop = SimpleNamespace(clock=cold, rank=Rank())
    assert TrialLoop.loader_ceiling(loop, 32.0) == pytest.approx(4 / 0.05 * 32)  # type: ignore[arg-type]
    assert TrialLoop.loader_ceiling(SimpleNamespace(clock=None, rank=Rank()), 32.0) is None  # type: ignore[arg-type]


def test_timed_workers_keep_the_items_and_count_the_batches_they_make() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from autotune.workloads.production import ProductionClock

    class Batched(TensorDataset):  # a dataset with its own batched read is read through it
        def __getitems__(self, indices):
            return [(self.tensors[0][i] * 10,) for i in indices]

    for data, scale in ((TensorDataset(torch.arange(12)), 1), (Batched(torch.arange(12)), 10)):
        clock = ProductionClock(2)
        dataset, collate = clock.wrap(data, None)
        loader = DataLoader(dataset, batch_size=4, num_workers=2, collate_fn=collate)
        assert sorted(torch.cat([b[0] for b in loader]).tolist()) == [scale * i for i in range(12)]
        means = clock._mean[:]
        assert all(mean > 0 for mean in means), means  # each worker made batches and published its mean


def test_a_window_never_counts_more_than_the_loader_workers_make() -> None:
    """Workers that start together deliver their batches in waves, each at the pace the training consumed the last
    one: a window inside a wave measured the step's 500 samples/s, not the 400 that 8 workers make at most (32 items
    of 20 ms each: 0.64 s a batch), and took a loader-bound setup for up to 1.25x faster than it runs."""
    from autotune.workloads.tasks import build_task_workload

    workload = build_task_workload("task_factories:slow_loader", device="cpu", workers=True)
    setup = TrainSetup(batch_size=32, num_workers=8, prefetch_factor=1)
    result = run_trial(setup, workload, TrialOptions(trial_seconds=1.5, windows=5, timeout_s=120))
    assert result.status == "ok", result.error
    assert max(result.windows) <= 400 * 1.01  # more than the workers can make: the old trial's windows read up to 441
    # The workers' rate as measured: at most what their sleeps allow (a load can only lengthen a sleep, so no bound
    # below: the arithmetic from batches to samples is checked on fixed timings above).
    assert result.loader_samples_per_s is not None and 0 < result.loader_samples_per_s <= 400 * 1.01
    assert result.samples_per_s is not None and result.samples_per_s <= result.loader_samples_per_s
    without = run_trial(dataclasses.replace(setup, num_workers=0, prefetch_factor=None), workload, QUICK)
    assert without.status == "ok" and without.loader_samples_per_s is None  # no workers: nothing to time


def test_loader_starts_after_the_first_step_so_its_queue_starts_empty(tiny_workload, monkeypatch) -> None:
    """With workers, lazy initialisation runs on a random batch before the
    loader exists; warm-up is then one step per worker, not the prefetch queue."""
    from autotune.runner import child, entry

    calls: list[str] = []
    real_synthetic, real_start = child.TrialLoop.synthetic_step, child.TrialLoop.start_loader

    def synthetic(self):
        calls.append("synthetic_step")
        return real_synthetic(self)

    def start(self, dataset):
        calls.append("start_loader")
        return real_start(self, dataset)

    monkeypatch.setattr(child.TrialLoop, "synthetic_step", synthetic)
    monkeypatch.setattr(child.TrialLoop, "start_loader", start)
    setup = TrainSetup(batch_size=4, num_workers=2, prefetch_factor=8, persistent_workers=True)
    request = {"setup": setup.to_dict(), "workload": tiny_workload.to_dict(), "options": dataclasses.asdict(QUICK)}
    runner_units: list[int] = []
    real_units = child.TrialLoop.unit_for_mode

    def units(self):
        work = real_units(self)
        runner_units.append(work.warmup_steps)
        return work

    monkeypatch.setattr(child.TrialLoop, "unit_for_mode", units)
    result = entry.execute(request, started=time.perf_counter(), send=lambda event: None)
    assert result.status == "ok", result.error
    assert calls == ["synthetic_step", "start_loader"]
    assert runner_units == [2]  # one per worker, not 2 x 8 queued batches


def test_user_factory_runs(tiny_workload) -> None:
    workload = dataclasses.replace(tiny_workload, model="factories:tiny_cnn")
    result = run_trial(TrainSetup(batch_size=8), workload, QUICK)
    assert result.status == "ok", result.error


def test_factory_that_raises_is_an_error_with_its_message(tiny_workload) -> None:
    workload = dataclasses.replace(tiny_workload, model="factories:broken")
    result = run_trial(TrainSetup(batch_size=8), workload, QUICK)
    assert result.status == "error"
    assert result.error == "ValueError: factory exploded on purpose"


def test_factory_returning_a_non_module_is_an_error(tiny_workload) -> None:
    workload = dataclasses.replace(tiny_workload, model="factories:not_a_module")
    result = run_trial(TrainSetup(batch_size=8), workload, QUICK)
    assert result.status == "error"
    assert "not a torch.nn.Module" in result.error and not result.error.startswith("WorkloadError")  # worded for the user


def test_nan_model_diverges(tiny_workload) -> None:
    workload = dataclasses.replace(tiny_workload, model="factories:makes_nan")
    result = run_trial(TrainSetup(batch_size=8), workload, QUICK)
    assert result.status == "diverged"
    assert "NaN" in result.error


def test_tiny_memory_budget_is_oom(tiny_workload) -> None:
    options = dataclasses.replace(QUICK, max_memory_bytes=64 * 2**20)
    result = run_trial(TrainSetup(batch_size=8), tiny_workload, options)
    assert result.status == "oom"
    assert "exceeded the budget" in result.error


def _alive_in_group(pgid: int) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _launched_pids(monkeypatch, *, stop: bool = False) -> list[int]:
    """The pids of the trials started from now on (their process groups), as each starts; with ``stop``, each is
    stopped (SIGSTOP) before its launch returns."""
    import signal

    from autotune.runner import zygote

    started: list[int] = []
    real_launch = zygote.launch

    def recording_launch(directory):
        proc = real_launch(directory)
        started.append(proc.pid)
        if stop:
            os.kill(proc.pid, signal.SIGSTOP)
        return proc

    monkeypatch.setattr(zygote, "launch", recording_launch)
    return started


def test_hang_times_out_and_leaves_no_process(tiny_workload, monkeypatch) -> None:
    started = _launched_pids(monkeypatch)
    workload = dataclasses.replace(tiny_workload, model="factories:sleeps_forever")
    begin = time.monotonic()
    setup = TrainSetup(batch_size=8, num_workers=1, prefetch_factor=2)
    result = run_trial(setup, workload, dataclasses.replace(QUICK, timeout_s=3.5))
    assert result.status == "timeout"
    # Not rounded to 4 s; a loaded machine may add what kept its cores busy (the next test).
    assert result.error.startswith("no result within 3.5 s") and result.error.endswith("; the process group was killed"), result.error
    assert time.monotonic() - begin < 90  # the 3.5-s timeout ended it (a sleeping factory never would)
    deadline = time.monotonic() + 30  # the killed group may take a moment to exit on a loaded machine
    while started and _alive_in_group(started[0]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started and not _alive_in_group(started[0])


def test_a_trial_that_waits_without_computing_times_out_saying_so(tiny_workload) -> None:
    """A step that deadlocked read `no result within 20 s (other processes kept 1.9 cores busy meanwhile: a busy machine
    slows a trial ...)`, five times over in the memory pre-pass: the trial itself used no CPU time."""
    workload = dataclasses.replace(tiny_workload, model="factories:sleeps_forever")
    result = run_trial(TrainSetup(batch_size=8), workload, dataclasses.replace(QUICK, timeout_s=10.0))
    assert result.status == "timeout" and result.error is not None
    said = re.search(r"^no result within 10 s: its processes used no CPU time in its last (\d+) s, so it waits rather than computes "
                     r"\(a lock, a blocking read or network call in a step or a dataset item; on a GPU, a kernel that long\), not slow; "
                     r"the process group was killed$", result.error)
    assert said is not None and 5 <= int(said[1]) <= 10, result.error


def test_the_idle_stretch_is_the_trailing_time_without_cpu() -> None:
    from autotune.runner.measure import IdleMeter

    meter = IdleMeter(os.getpid())
    assert meter.idle_s() == 0.0  # nothing read yet
    meter._samples = [(0.0, 1.0, 1), (1.0, 1.5, 1), (2.0, 1.5, 1), (3.0, 1.51, 1), (4.0, 1.51, 1)]  # computed in its first second
    assert meter.idle_s() == 3.0
    meter._samples.append((5.0, 1.8, 1))  # it computes again: no idle stretch
    assert meter.idle_s() == 0.0
    # Two waiting DDP ranks and their parent poll at about 2 % of a core each: still waiting.
    meter._samples = [(0.0, 1.0, 3), (1.0, 1.5, 3), (2.0, 1.56, 3), (3.0, 1.62, 3), (4.0, 1.68, 3)]
    assert meter.idle_s() == 3.0


def test_a_trial_that_times_out_beside_busy_processes_says_so(tiny_workload) -> None:
    """A trial starved by a backup job read only `no result within 102 s`, as if its setup were slow, and the search
    kept it infeasible. Processes spinning beside a hanging trial: its line says what kept the cores busy."""
    from autotune.runner.measure import LoadMeter
    from probes.cpu import usable_cores

    known = LoadMeter(usable_cores(), os.getpid())
    time.sleep(0.2)
    measurable = known.other_cores() is not None  # not where a CPU quota lies below the affinity mask (then no figure)
    # Enough to pass the hint's threshold (half a core, and a tenth of the usable cores) on any host, not only on 2 cores.
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(max(2, usable_cores() // 5 + 1))]
    try:
        workload = dataclasses.replace(tiny_workload, model="factories:spins_forever")  # it computes: not said to wait
        result = run_trial(TrainSetup(batch_size=8), workload, dataclasses.replace(QUICK, timeout_s=3.0))
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert result.status == "timeout" and result.error is not None
    hint = re.search(r"^no result within 3 s \(other processes kept (\d+\.\d) cores busy meanwhile: a busy machine slows a "
                     r"trial past its timeout; rerun on an idle one, or raise --timeout\); the process group was killed$", result.error)
    assert (hint is not None and float(hint[1]) >= 0.5) if measurable else "other processes" not in result.error, result.error


def test_a_trial_stopped_with_sigstop_times_out_saying_it_was_stopped(tiny_workload, monkeypatch) -> None:
    """A probe's SIGSTOP to a trial: `timeout - no result within 25 s`, as if the setup were slow. Stopped as it starts
    (before its launch returns), it cannot finish first, however loaded the machine."""
    started = _launched_pids(monkeypatch, stop=True)
    result = run_trial(TrainSetup(batch_size=8), tiny_workload, dataclasses.replace(QUICK, timeout_s=3.0))
    assert started and result.status == "timeout"
    assert result.error is not None and result.error.startswith("no result within 3 s: its process was stopped (")
    assert result.error.endswith("SIGSTOP, a debugger or job control), not slow; the process group was killed")


def test_fallback_without_the_zygote_runs_a_fresh_interpreter_and_says_so(tiny_workload, monkeypatch, capfd) -> None:
    from autotune.runner import zygote

    fresh = zygote.Zygote()
    monkeypatch.setattr(fresh, "_start", lambda: False)  # a server that never said it was ready
    monkeypatch.setattr(zygote, "_ZYGOTE", fresh)
    result = run_trial(TrainSetup(batch_size=8), dataclasses.replace(tiny_workload, model="factories:tiny_cnn"), QUICK)
    assert result.status == "ok", result.error
    assert fresh.disabled and fresh._proc is None  # no server is used from now on
    assert capfd.readouterr().err.count("each trial now starts its own interpreter") == 1  # disabled: said once, not per trial


def test_user_prints_do_not_reach_our_stdout(tiny_workload, capfd, monkeypatch) -> None:
    """What user code prints goes to the trial's own log file (the last line of a failure comes from there), not to
    the search's console."""
    from autotune.runner import launch, zygote

    logs: list[str] = []
    supervise = launch.supervise

    def reading_the_log(proc, directory, *args):  # type: ignore[no-untyped-def]
        try:
            return supervise(proc, directory, *args)
        finally:
            logs.append((directory / zygote.OUTPUT).read_text(encoding="utf-8"))

    monkeypatch.setattr(launch, "supervise", reading_the_log)
    workload = dataclasses.replace(tiny_workload, model="factories:chatty")
    result = run_trial(TrainSetup(batch_size=8), workload, QUICK)
    assert result.status == "ok", result.error
    captured = capfd.readouterr()
    assert "hello from the factory" not in captured.out + captured.err
    assert len(logs) == 1 and "hello from the factory" in logs[0]


def test_pruning_callback_stops_the_trial(tiny_workload) -> None:
    seen: list[float] = []

    def stop_after_first(index: int, value: float) -> bool:
        seen.append(value)
        return True

    options = dataclasses.replace(QUICK, windows=4, trial_seconds=2.0)
    result = run_trial(TrainSetup(batch_size=8, num_workers=1, num_threads=1), tiny_workload, options, on_window=stop_after_first)
    assert result.status == "pruned"
    assert len(seen) == 1 and result.windows == tuple(seen) and result.samples_per_s == seen[0]
    # What the one window saw is kept for trials.csv: threads, data wait, peak memory, warm-up.
    assert result.num_threads == 1
    assert result.data_wait_fraction is not None and 0.0 <= result.data_wait_fraction <= 1.0
    assert result.peak_memory_bytes and result.peak_memory_bytes > 10 * 2**20
    assert result.warmup_s and result.warmup_s > 0 and result.measured_s and result.measured_s > 0


def test_a_trial_pruned_after_windows_shows_their_median(tiny_workload) -> None:
    """The screening judges the median of the windows so far: the pruned row shows that figure, not the last window."""
    seen: list[float] = []

    def stop_after_third(index: int, value: float) -> bool:
        seen.append(value)
        return index == 2

    options = dataclasses.replace(QUICK, windows=5, trial_seconds=2.5)
    result = run_trial(TrainSetup(batch_size=8, num_threads=1), tiny_workload, options, on_window=stop_after_third)
    assert result.status == "pruned" and result.windows == tuple(seen) and len(seen) == 3
    assert result.samples_per_s == statistics.median(seen)


def test_result_json_round_trip() -> None:
    result = TrialResult(status="ok", samples_per_s=10.0, windows=(9.0, 11.0), samples=20)
    assert TrialResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result


def test_synthetic_data_is_generated_once_and_reused(tmp_path) -> None:
    first = ensure_synthetic(tmp_path, n_images=20)
    assert first == synthetic_dir(tmp_path, 20)
    files = sorted(first.rglob("*.jpg"))
    assert len(files) == 20
    stamp = {f: f.stat().st_mtime_ns for f in files}
    again = ensure_synthetic(tmp_path, n_images=20)
    assert again == first
    assert {f: f.stat().st_mtime_ns for f in sorted(again.rglob("*.jpg"))} == stamp
    from PIL import Image

    with Image.open(files[0]) as image:
        assert image.format == "JPEG"
        assert 400 <= image.width <= 600 and 300 <= image.height <= 450


def test_trial_directory_is_gone_after_a_killed_trial(tiny_workload, monkeypatch) -> None:
    """A pruned (killed) trial leaves no directory behind, and cleanup races do not raise.

    With a loader worker, multiprocessing's socket (its ``pymp-*`` directory, which a killed
    process never removes) is in the trial's directory, so it goes with it.
    """
    from autotune.runner import zygote

    dirs: list = []
    real_launch = zygote.launch

    def recording_launch(directory):
        dirs.append(directory)
        return real_launch(directory)

    sockets: list[list[str]] = []

    def prune(index: int, value: float) -> bool:
        folder = dirs[-1] / "mp"
        sockets.append(sorted(p.name for p in folder.iterdir()) if folder.is_dir() else [])
        return True

    monkeypatch.setattr(zygote, "launch", recording_launch)
    for setup in (TrainSetup(batch_size=8), TrainSetup(batch_size=8, num_workers=1, prefetch_factor=2), TrainSetup(batch_size=8)):
        result = run_trial(setup, tiny_workload, dataclasses.replace(QUICK, windows=4, trial_seconds=2.0), on_window=prune)
        assert result.status == "pruned"
    assert dirs and not any(d.exists() for d in dirs)
    from autotune.runner.server import MP_DIR_MAX

    # Under a TMPDIR so long that the socket's path would not fit, multiprocessing keeps its own directory.
    fits = len(str(dirs[1] / "mp")) <= MP_DIR_MAX
    assert sockets[0] == sockets[2] == [] and [name.split("-")[0] for name in sockets[1]] == (["listener"] if fits else [])


def test_windows_close_inside_a_step_but_the_last_waits_for_its_end() -> None:
    """A window may close mid-step unless it is the last; the measurement ends on a step boundary."""
    from autotune.runner.windows import may_close

    options = TrialOptions(trial_seconds=1.0, windows=5)
    assert may_close(0, 1, 4, 0.4, options)  # window 0 mid-step: more windows follow
    assert not may_close(2, 3, 4, 1.2, options)  # window 2 would be the last: the step ends first
    assert may_close(2, 4, 4, 1.6, options)  # the step is whole
    assert may_close(4, 9, 1, 1.0, options)  # no accumulation: every micro-batch ends a step


def test_a_cuda_library_that_cannot_allocate_on_a_full_device_is_out_of_memory() -> None:
    """Near a full card, cuBLAS, cuDNN and nvjpeg fail to create a handle or workspace without the words "out of memory":
    such a trial was an error and the memory pre-pass stopped the search ("model ... fails") instead of its advice."""
    from autotune.errors import is_out_of_memory

    for message in ("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                    "cuDNN error: CUDNN_STATUS_ALLOC_FAILED", "nvjpeg error: NVJPEG_STATUS_ALLOCATOR_FAILURE",
                    "CUDA out of memory. Tried to allocate 2.00 GiB", "DefaultCPUAllocator: can't allocate memory"):
        assert is_out_of_memory(RuntimeError(message)), message
    assert not is_out_of_memory(RuntimeError("CUDA error: CUBLAS_STATUS_EXECUTION_FAILED"))
    assert not is_out_of_memory(ValueError("CUBLAS_STATUS_ALLOC_FAILED"))  # only a RuntimeError says so


def test_a_trial_runs_with_the_environment_of_its_call_not_of_the_first(tiny_workload, tmp_path, monkeypatch) -> None:
    """Every trial is forked from one server per Python process, which kept the environment it started with: a caller
    that set CUDA_VISIBLE_DEVICES (or TMPDIR, OMP_NUM_THREADS) between two calls ran the second trial with the first
    value, on the GPU the probe no longer described. A changed environment now gets a new server."""
    log = tmp_path / "seen.log"
    monkeypatch.setenv("AUTOTUNE_TEST_MARK_LOG", str(log))
    workload = dataclasses.replace(tiny_workload, model="factories:records_environment")
    for mark in ("first", "second", "second"):
        monkeypatch.setenv("AUTOTUNE_TEST_MARK", mark)
        result = run_trial(TrainSetup(batch_size=8), workload, QUICK)
        assert result.status == "ok", result.error
    trials = [line.split() for line in log.read_text().splitlines() if int(line.split()[0]) != os.getpid()]
    assert [mark for _, mark in trials] == ["first", "second", "second"]
    # pytest's name of the running test changes at every test and phase, and is no change of the caller's: one
    # server per test had started (their start-ups' forks were taken for trials by a test that signals its trial).
    from autotune.runner import zygote

    before = zygote._ZYGOTE._proc
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test (call)")
    assert run_trial(TrainSetup(batch_size=8), workload, QUICK).status == "ok" and zygote._ZYGOTE._proc is before
