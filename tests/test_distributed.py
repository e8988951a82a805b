"""DDP trials (2 gloo ranks on the CPU) and parallel trials on several devices (``--devices cpu,cpu``)."""

from __future__ import annotations

import csv
import dataclasses
import os
import runpy
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest

from autotune.errors import SetupError, UsageError
from autotune.output.best import Best
from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner import run_trial
from autotune.runner.ranks import share
from autotune.train_setup import TrainSetup, load_setup
from autotune.tuner.config import SearchConfig
from autotune.tuner.placement import place, usable_core_ids
from autotune.tuner.progress import SilentReporter
from autotune.tuner.run import run_search
from autotune.tuner.study import SearchStudy
from autotune.workloads.tasks import build_task_workload

TESTS = Path(__file__).resolve().parent


def cpu_hardware(cores: int = 2, gpus: int = 0) -> SimpleNamespace:
    gpu_list = [SimpleNamespace(name=f"GPU {i}", uuid=f"GPU-{i}", bf16=True, memory_total_bytes=2**30,
                                memory_free_bytes=2**30) for i in range(gpus)]
    return SimpleNamespace(cpu=SimpleNamespace(model="Test CPU", bf16=True, usable_cores=cores), gpus=gpu_list,
                           gpu_error=None, cuda_visible_devices=None)


def task_workload(name: str = "good") -> Any:
    return build_task_workload(f"task_factories:{name}", device="cpu", workers=True)


def two_cores() -> tuple[int, ...]:
    """Two usable cores for a real two-rank world; CI (CI=true, set by .ci/run on its 2-core machine) fails without them."""
    cores = usable_core_ids(2)
    if len(cores) < 2:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true but only {len(cores)} usable CPU core(s): the real two-rank DDP tests would not run")
        pytest.skip("needs 2 usable CPU cores")
    return cores


# ------------------------------------------------------------------ pure rules
def test_cores_split_into_disjoint_shares() -> None:
    cores = (0, 1, 2, 3, 4)
    shares = [share(cores, 2, k) for k in range(2)]
    assert shares == [(0, 1, 2), (3, 4)]
    assert [share((0, 1), 2, k) for k in range(2)] == [(0,), (1,)]


def test_each_gpu_s_share_of_the_cores_is_drawn_from_its_near_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """A host of two sockets (CPUs 0-7 and 8-15) whose GPU 0 hangs off the second: the plain split gave GPU 0's trial
    the first socket's cores, so each batch crossed the socket link."""
    monkeypatch.setattr("autotune.tuner.placement.usable_core_ids", lambda usable: tuple(range(usable)))
    hardware = cpu_hardware(16, gpus=4)
    second, first = tuple(range(8, 16)), tuple(range(8))
    for gpu, near in zip(hardware.gpus, (second, second, first, first), strict=True):
        gpu.cpu_affinity = near
    slots = place("auto", "cuda:0,cuda:1,cuda:2,cuda:3", 1, hardware).slots
    assert [(s.device, s.cores) for s in slots] == [("cuda:0", (8, 9, 10, 11)), ("cuda:1", (12, 13, 14, 15)),
                                                     ("cuda:2", (0, 1, 2, 3)), ("cuda:3", (4, 5, 6, 7))]
    hardware.gpus[1].cpu_affinity = first
    (world,) = place("cuda", None, 2, hardware).slots  # a trial's ranks: rank K on cuda:K, on its share
    assert [share(world.cores, 2, k) for k in range(2)] == [second, first]
    hardware.gpus[1].cpu_affinity = second
    # Three GPUs on the first socket: the third's share is what is left, of the same size as the plain split's.
    for gpu, near in zip(hardware.gpus, (first, first, first, second), strict=True):
        gpu.cpu_affinity = near
    slots = place("auto", "all", 1, hardware).slots
    assert [s.cores for s in slots] == [(0, 1, 2, 3), (4, 5, 6, 7), (12, 13, 14, 15), (8, 9, 10, 11)]
    for gpu in hardware.gpus:  # one socket, or NVML naming nothing: the plain split
        gpu.cpu_affinity = tuple(range(16))
    plain = [share(tuple(range(16)), 4, k) for k in range(4)]
    assert [s.cores for s in place("auto", "all", 1, hardware).slots] == plain
    for gpu in hardware.gpus:
        gpu.cpu_affinity = None
    assert [s.cores for s in place("auto", "all", 1, hardware).slots] == plain


def test_ddp_knobs_default_to_pytorch_and_old_setups_load(tmp_path: Path) -> None:
    setup = TrainSetup()
    assert (setup.bucket_cap_mb, setup.gradient_as_bucket_view, setup.static_graph) == (25, False, False)
    old = tmp_path / "setup.json"
    old.write_text('{"num_workers": 0, "batch_size": 8, "amp": "off"}')  # written before the DDP knobs
    assert load_setup(old) == TrainSetup(batch_size=8)
    with pytest.raises(SetupError, match="static_graph"):
        TrainSetup(static_graph=True, accumulation_steps=2)
    best = Best.from_dict({k: v for k, v in _best_dict().items() if k != "world_size"})
    assert best.world_size == 1


def _best_dict() -> dict[str, Any]:
    return {
        "schema": 1, "setup": TrainSetup().to_dict(), "workload": {"model": "resnet18"}, "samples_per_s": 1.0,
        "samples_per_s_spread": 0.0, "defaults_samples_per_s": None, "speedup": None, "peak_memory_bytes": None,
        "effective_batch": 32, "reference_batch": 32, "lr": 1e-3, "world_size": 2,
    }


@pytest.mark.parametrize(
    ("device", "devices", "nproc", "gpus", "match"),
    [
        ("auto", "cuda:7", 1, 2, "only 2 GPU"),
        ("auto", "all", 1, 0, "list cpu,cpu"),
        ("auto", "tpu:0", 1, 0, "bad device"),
        ("cuda:1", "cuda:0,cuda:1", 1, 2, "conflicts"),
        ("auto", "cuda:0,cuda:0", 1, 2, "twice"),
        ("auto", "cpu,cuda:0", 1, 2, "mixes"),
        ("auto", "cpu,cpu", 2, 0, "cannot be combined"),
        ("cpu", None, 3, 0, "only 2 CPU core"),
        ("cuda", None, 3, 2, "only 2 GPU"),
        ("cpu", None, 0, 0, ">= 1"),
        ("cuda:1", None, 2, 2, "CUDA_VISIBLE_DEVICES"),  # rank K trains on cuda:K: cuda:1 would be dropped silently
    ],
)
def test_bad_placements_are_one_line_errors(device: str, devices: str | None, nproc: int, gpus: int, match: str) -> None:
    with pytest.raises(UsageError, match=match) as caught:
        place(device, devices, nproc, cpu_hardware(2, gpus))
    assert "\n" not in str(caught.value)


def test_data_with_fewer_samples_than_ranks_is_refused_before_the_calibration(tiny_workload) -> None:
    """A 1-sample Task under --nproc-per-node 2 was called 1 sample per rank, calibrated, then failed every trial with
    "rank 1: the dataset is empty", which it was not."""
    from autotune.errors import WorkloadError

    placed = place("cpu", None, 2, cpu_hardware(2, 0))
    with pytest.raises(WorkloadError, match=r"^the data holds 1 sample, fewer than the 2 ranks of --nproc-per-node 2: each rank "
                                            r"reads its own share of them, so one would read none; run fewer processes"):
        placed.rank_workload(dataclasses.replace(tiny_workload, images=1))
    assert placed.rank_workload(dataclasses.replace(tiny_workload, images=2)).images == 1
    assert placed.rank_workload(dataclasses.replace(tiny_workload, images=None)).images is None  # a stream: its length unknown


def test_the_memory_budget_of_trials_on_several_gpus_holds_on_the_busiest() -> None:
    """--devices cuda:0,cuda:1 (or a DDP trial's ranks) sized every trial's batch by cuda:0's free memory: a busier
    cuda:1 ran out of memory at batches the budget allowed."""
    host = cpu_hardware(2, 2)
    host.gpus[1].memory_free_bytes = 2**28  # a quarter of cuda:0's
    for placement in (place("auto", "cuda:0,cuda:1", 1, host), place("cuda", None, 2, host)):
        assert placement.device.name == "cuda:0" and placement.device.memory_free_bytes == 2**28
    assert place("cuda:0", None, 1, host).device.memory_free_bytes == 2**30  # one GPU: its own
    host.gpus[1].memory_free_bytes = None  # NVML could not say: the known one stands
    assert place("auto", "cuda:0,cuda:1", 1, host).device.memory_free_bytes == 2**30


def test_placements_split_the_cores() -> None:
    cores = two_cores()
    ddp = place("cpu", None, 2, cpu_hardware(2))
    assert (ddp.world_size, ddp.rank_cores, ddp.slots[0].cores) == (2, 1, cores)
    assert ddp.rank_batch(64) == 32 and ddp.processes == 2  # two ranks share the host's RAM
    assert ddp.describe().endswith("1/2 of the samples per rank")
    assert "an iterable dataset each rank iterates itself, unsharded" in ddp.describe(iterable=True)  # it said 1/2 of the samples there too
    # A Task's sample count under DDP trials is a rank's share: said so on the report's line as on the search's (it read
    # "256 samples" for a dataset of 512).
    task = Workload(model="m:f", task="m:f", images=256)
    assert task.describe(2).endswith(", 256 samples per rank") and task.describe().endswith(", 256 samples")
    parallel = place("auto", "cpu,cpu", 1, cpu_hardware(2))
    assert parallel.parallel and [s.cores for s in parallel.slots] == [cores[:1], cores[1:]] and parallel.processes == 2
    plain = place("cpu", None, 1, cpu_hardware(2))
    assert plain.rank_cores == 2 and plain.runner(fake_runner) is fake_runner  # a plain search is not pinned
    gpus = place("auto", "all", 1, cpu_hardware(2, gpus=2))
    assert [s.device for s in gpus.slots] == ["cuda:0", "cuda:1"]
    with pytest.raises(UsageError, match="multiple of --nproc-per-node"):
        SearchConfig(model="resnet18", trials=1, effective_batch=33, nproc_per_node=2).validate()


# ------------------------------------------------------------------ real ranks
@pytest.mark.slow
def test_two_rank_trial_counts_the_samples_of_both_ranks() -> None:
    cores = two_cores()
    setup = TrainSetup(batch_size=4, accumulation_steps=2, bucket_cap_mb=1)
    result = run_trial(setup, task_workload(), TrialOptions(trial_seconds=1.0, windows=3, world_size=2, cores=cores))
    assert result.ok, result.error
    # One optimizer step is 4 x 2 samples on each of the 2 ranks: the world's samples are counted.
    assert result.step_time_s is not None and result.samples_per_s is not None
    assert round(result.step_time_s * result.samples_per_s) == 4 * 2 * 2
    assert result.samples % 16 == 0 and len(result.windows) == 3
    assert result.peak_memory_bytes and result.data_wait_fraction is not None


def test_an_iterable_dataset_with_a_length_is_read_whole_by_each_rank_not_indexed() -> None:
    """A sized IterableDataset was sharded as map-style data (it has __len__, and Dataset's __getitem__ that raises):
    every DDP trial ended in error, NotImplementedError: Subclasses of Dataset should implement __getitem__."""
    from task_factories import SizedStream

    from autotune.runner.ranks import Rank

    result = run_trial(TrainSetup(batch_size=4), task_workload("sized_iterable"),
                       TrialOptions(trial_seconds=1.0, windows=3, world_size=2, cores=two_cores()))
    assert result.ok, result.error
    stream = SizedStream()
    assert Rank(rank=1, world_size=2).shard(stream) is stream


@pytest.mark.slow
def test_a_crashed_rank_ends_the_trial_and_leaves_no_process() -> None:
    from task_factories import RANK_PIDS

    shutil.rmtree(RANK_PIDS, ignore_errors=True)
    result = run_trial(
        TrainSetup(batch_size=4), task_workload("crash_rank_one"),
        TrialOptions(trial_seconds=1.0, windows=2, world_size=2, cores=two_cores(), timeout_s=60),
    )
    assert result.status == "error"
    assert result.error is not None and "rank 1 died of SIGSEGV" in result.error
    pids = [int(p.name) for p in RANK_PIDS.iterdir()]
    shutil.rmtree(RANK_PIDS, ignore_errors=True)
    assert len(pids) == 2  # both ranks trained before rank 1 crashed
    deadline = time.monotonic() + 20
    while (alive := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive, f"orphan ranks: {alive}"


def _broken_collective_first(then: str, ready: Path) -> Any:
    """A rank body: rank 0 fails with the error a collective raises when its peer is gone, once rank 1 is about to
    ``then`` (its ``ready`` file made: no race between the two ranks' start-ups on a loaded machine)."""
    import signal

    from task_factories import no_core_dump

    def body(rank: Any) -> TrialResult:
        if rank.rank == 0:
            deadline = time.monotonic() + 60
            while not ready.exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            return TrialResult(status="error", error="RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:29500")
        ready.touch()
        if then == "sigterm":  # earlyoom's first signal, or a supervisor's, to one rank
            os.kill(os.getpid(), signal.SIGTERM)
        if then == "segfault":
            no_core_dump()  # a dump piped to a handler would hold its death for seconds
            os.kill(os.getpid(), signal.SIGSEGV)
        if then == "oom":
            return TrialResult(status="oom", error="RuntimeError: CPU out of memory")
        time.sleep(600)  # never ends by itself: run_world must kill it
        return TrialResult(status="ok", samples_per_s=1.0)

    return body


@pytest.mark.slow
def test_a_rank_s_own_failure_is_named_not_the_collective_it_broke_on_its_peer(tmp_path: Path) -> None:
    """Whichever rank the supervisor reaps first, the trial's error is the cause: rank 1's death or its own failure,
    not rank 0's broken collective; a rank that merely blocks is killed after a short grace, not waited for."""
    from autotune.runner.ranks import run_world

    options = TrialOptions(trial_seconds=1.0, windows=2, world_size=2, cores=two_cores(), timeout_s=60)
    assert run_world(options, _broken_collective_first("segfault", tmp_path / "segfault")).error == "rank 1 died of SIGSEGV"
    # A SIGTERM from outside says nothing of the setup (a DDP trial stored it as an infeasible error): interrupted, as
    # one process's trial is, so the search stops as on Ctrl-C and stores nothing for it.
    stopped = run_world(options, _broken_collective_first("sigterm", tmp_path / "sigterm"))
    assert (stopped.status, stopped.error) == ("interrupted", "rank 1 was terminated from outside (SIGTERM)")
    oom = run_world(options, _broken_collective_first("oom", tmp_path / "oom"))
    assert (oom.status, oom.error) == ("oom", "rank 1: RuntimeError: CPU out of memory")
    began = time.monotonic()
    blocked = run_world(options, _broken_collective_first("block", tmp_path / "block"))
    assert blocked.error is not None and blocked.error.startswith("rank 0: RuntimeError: [gloo] Connection closed by peer")
    assert time.monotonic() - began < 300  # killed after the grace (2 s), not after its 600-s sleep


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.slow
def test_devices_cpu_cpu_runs_two_trials_at_once(tmp_path: Path) -> None:
    two_cores()
    # The first two trials run from the slots' threads meet at a barrier before they start: the search goes on only if
    # both are under way at once (a search that ran one trial at a time breaks the barrier). Wall-clock order is no
    # proof on a loaded machine, a meeting is.
    meeting = threading.Barrier(2, timeout=240)
    met: list[str] = []

    def meeting_runner(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
        if threading.current_thread() is not threading.main_thread() and len(met) < 2:
            met.append(threading.current_thread().name)
            meeting.wait()  # BrokenBarrierError (the test fails) when no second trial comes while this one waits
        return run_trial(setup, workload, options, on_window=on_window)

    config = SearchConfig(model="ignored", trials=4, device="cpu", devices="cpu,cpu", trial_seconds=1.0,
                          out=tmp_path / "out", confirm_top=1, confirm_rounds=1, workload="task_factories:good",
                          ceilings=False)
    outcome = run_search(config, runner=meeting_runner)
    assert outcome.best is not None and (tmp_path / "out" / "best.json").exists()
    assert outcome.study and sum(not r.free for r in outcome.records) == 4
    assert len(met) == 2 and len(set(met)) == 2  # two slots' threads, both of them past the meeting
    # Each trial ran on one of the two cores; train.py runs on both: the figures are said to be the share's.
    assert any(note.startswith("measured with --devices: every trial, the PyTorch defaults' too, ran pinned to 1 core beside "
                               "1 other trial, and the confirmation's rounds on those cores alone; train.py runs one process on "
                               "every core") for note in outcome.best.notes)
    assert outcome.best.torch_threads is None  # the pinned trials' one thread is no count train.py's own could match


def fake_runner(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
    """Deterministic results; every trial must be a 2-rank world on the CPU cores."""
    options = options or TrialOptions()
    assert options.world_size == 2 and len(options.cores) >= 2 and workload.device == "cpu"
    rate = 100.0 * setup.batch_size**0.5 * (1.1 if setup.bucket_cap_mb == 50 else 1.0)
    return TrialResult(status="ok", samples_per_s=rate, samples_per_s_spread=0.0, windows=(rate,),
                       peak_memory_bytes=2**20, data_wait_fraction=0.1)


def test_a_ddp_search_emits_train_py_for_its_world_size(tmp_path: Path) -> None:
    two_cores()
    config = SearchConfig(model="ignored", trials=6, device="cpu", nproc_per_node=2, effective_batch=32,
                          trial_seconds=1.0, out=tmp_path / "out", confirm_top=1, confirm_rounds=1,
                          workload="task_factories:good")
    outcome = run_search(config, runner=fake_runner)
    best = outcome.best
    assert best is not None and best.world_size == 2 and best.effective_batch == 32
    assert all(r.setup.effective_batch(2) == 32 for r in outcome.records)  # pinned across both ranks
    assert len({r.setup.bucket_cap_mb for r in outcome.records}) > 1  # the DDP knobs are searched
    assert "# Run: torchrun --nproc_per_node 2 " in (tmp_path / "out" / "train.py").read_text()
    assert '"world_size": 2' in (tmp_path / "out" / "best.json").read_text()
    rows = list(csv.DictReader((tmp_path / "out" / "trials.csv").open()))
    assert rows and {row["effective_batch"] for row in rows} == {"32"}  # every rank counted, as in best.json
    from rich.console import Console

    from autotune.render import render_search

    console = Console(record=True, width=200)
    console.print(render_search(outcome))
    lines = console.export_text().splitlines()
    assert any(line.startswith("run it: torchrun --nproc_per_node 2 ") and line.endswith("train.py") for line in lines)


@pytest.mark.slow
def test_a_model_with_unused_parameters_names_the_fix_in_trials_and_in_train_py(tmp_path: Path) -> None:
    """DDP's 'Expected to have finished reduction' says nothing of the model: the trial hints at requires_grad=False,
    and train.py under torchrun stops in one line naming --find-unused-parameters, with which it trains."""
    cores = two_cores()
    result = run_trial(TrainSetup(batch_size=4), task_workload("unused_parameter"),
                       TrialOptions(trial_seconds=1.0, windows=2, world_size=2, cores=cores, timeout_s=120))
    assert result.status == "error" and result.error is not None
    assert "Expected to have finished reduction" in result.error and "set requires_grad=False on those it never uses" in result.error
    config = SearchConfig(model="ignored", trials=2, device="cpu", nproc_per_node=2, trial_seconds=1.0, out=tmp_path / "out",
                          confirm_top=1, confirm_rounds=1, workload="task_factories:unused_parameter")
    said: list[str] = []

    class Said(SilentReporter):
        def message(self, text: str) -> None:
            said.append(text)

    run_search(config, Said(), runner=fake_runner)
    assert any(line.startswith("workload task_factories:unused_parameter on cpu, 20 samples per rank (") for line in said), said
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(tmp_path / "out" / "train.py"),
               "--max-steps", "2", "--workers", "0", "--output-dir", str(tmp_path / "run")]
    failed = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert failed.returncode != 0
    assert ("error: under DDP, some of the model's parameters got no gradient in a step (not used in its forward): rerun with "
            "--find-unused-parameters, or set requires_grad=False on them") in failed.stderr.splitlines()
    # The flag reaches DistributedDataParallel (a second torchrun world here, on a loaded 2-core machine, once aborted in
    # gloo's teardown: the run with the flag is in docs/emit.md, not repeated in CI).
    parser = runpy.run_path(str(tmp_path / "out" / "train.py"), run_name="emitted")["get_args_parser"]()
    assert parser.parse_args(["--find-unused-parameters"]).find_unused_parameters is True
    assert parser.parse_args([]).find_unused_parameters is False
    assert "find_unused_parameters=args.find_unused_parameters," in (tmp_path / "out" / "train.py").read_text()


def test_cli_refuses_devices_all_on_a_cpu_host_in_one_line(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    if place("auto", None, 1, __import__("probes").collect()).device.type == "cuda":
        pytest.skip("a GPU host")
    result = CliRunner().invoke(app, ["search", "--devices", "all", "--workload", "task_factories:good",
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    assert "list cpu,cpu" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_empty_devices_entry_names_the_form_this_host_takes() -> None:
    """`--devices cpu,` on a CPU host was told to use cuda:0,cuda:1,... or all, neither of which it has."""
    from dataclasses import replace

    from autotune.errors import UsageError

    hardware = __import__("probes").collect()
    cpu_host = replace(hardware, gpus=[])
    for text in ("cpu,", ",cpu", ""):
        with pytest.raises(UsageError, match=r"an empty entry; use cpu,cpu,\.\.\. \(one trial per share of the cores\)$"):
            place("cpu", text, 1, cpu_host)
    gpu_host = replace(hardware, gpus=[object()])
    with pytest.raises(UsageError, match=r"an empty entry; use cuda:0,cuda:1,\.\.\. or all$"):
        place("auto", "cuda:0,", 1, gpu_host)
    with pytest.raises(UsageError, match=r"an empty entry; use cpu,cpu,\.\.\."):  # CPU trials on a GPU host
        place("cpu", "cpu,", 1, gpu_host)


def test_cli_refuses_static_graph_with_accumulation_before_the_calibration(tmp_path: Path) -> None:
    """The pair was refused after the calibration, leaving a study the corrected command in the same --out could not
    reuse (its --set differed)."""
    from typer.testing import CliRunner

    from autotune.cli import app

    result = CliRunner().invoke(app, ["search", "--workload", "task_factories:good", "--device", "cpu", "--nproc-per-node", "2",
                                      "--set", "static_graph=true", "--set", "accumulation_steps=2", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.strip().endswith("and --set accumulation_steps=2 allows no step of one micro-batch")
    assert not (tmp_path / "out").exists()


def test_parallel_trials_refused_for_a_study_of_other_choices_leave_no_trial_running(tmp_path: Path) -> None:
    """A probe's rerun of a finished study with `--devices cpu,cpu` (its knob choices differ) was refused in one line
    that named no knob, and left the trial it had asked RUNNING: `autotune status` then showed `1 running: #4 (search)
    on an unknown worker` for good. The refusal names the knob, and the trial is failed as the sequential loop fails it."""
    from optuna.trial import TrialState

    from autotune.errors import StorageError
    from autotune.train_setup import KNOBS
    from autotune.tuner.explore import Exploration, setup_for
    from autotune.tuner.parallel import explore_placed
    from autotune.tuner.space import Space
    from autotune.tuner.study import SearchStudy

    def plan(batches: tuple[int, ...]) -> Exploration:
        fixed = {k: (getattr(TrainSetup(), k),) for k in KNOBS}
        return Exploration(Space({**fixed, "batch_size": batches}), TrainSetup(), Workload(model="resnet18"), TrialOptions(), 3,
                           tmp_path / "trials.csv")

    def never_run(*args: Any, **kwargs: Any) -> TrialResult:
        raise AssertionError("no trial runs")

    study = SearchStudy.open(f"sqlite:///{tmp_path / 'study.db'}", "s", trials=3)
    trial, role = study.ask()
    setup_for(trial, role, plan((8, 16, 32)))
    study.tell(trial, TrialResult(status="ok", samples_per_s=1.0))
    reporter = SimpleNamespace(message=lambda text: None, trial_started=lambda *a: None, trial_finished=lambda *a: None)
    with pytest.raises(StorageError, match=r"other choices of a knob than this search offers \(batch_size=8\|16\|32 in the study's "
                                           r"trials, batch_size=8\|16 in this search; its data"):
        explore_placed(place("auto", "cpu,cpu", 1, cpu_hardware(2)), study, plan((8, 16)), reporter, never_run)
    assert study.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)) == []


@pytest.mark.parametrize("storage", ["postgresql://tuner:secret@db.example.org/autotune", "journal:///{tmp}/study.log"])
def test_cli_refuses_devices_in_a_worker_of_a_shared_study_in_one_line(tmp_path: Path, storage: str) -> None:
    """A shared study's worker runs one trial at a time on its first slot. Before, `--devices cpu,cpu --storage URL`
    printed `parallel trials: 2 at a time` and then ran every trial alone on the first slot's share of the cores."""
    from typer.testing import CliRunner

    from autotune.cli import app

    result = CliRunner().invoke(app, ["search", "--devices", "cpu,cpu", "--device", "cpu", "--workload", "task_factories:good",
                                      "--storage", storage.format(tmp=tmp_path), "--study", "s1", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert "start one worker per device" in result.output and len(result.output.strip().splitlines()) == 1
    assert "secret" not in result.output
    assert not (tmp_path / "out").exists()


def test_cli_trial_refuses_more_ranks_than_cores_in_one_line() -> None:
    from typer.testing import CliRunner

    from autotune.cli import app

    result = CliRunner().invoke(app, ["trial", "--workload", "task_factories:good", "--device", "cpu",
                                      "--nproc-per-node", "4096"])
    assert result.exit_code == 2
    assert "each rank needs one" in result.output and len(result.output.strip().splitlines()) == 1


def test_a_ddp_trial_says_its_ranks(monkeypatch) -> None:
    import autotune
    import autotune.runner
    from autotune.records import TrialResult

    monkeypatch.setattr(autotune.runner, "prestart", lambda: None)
    monkeypatch.setattr(autotune.runner, "run_trial", lambda setup, workload, options: TrialResult(status="ok", samples_per_s=1.0))
    lines: list[str] = []
    autotune.trial("task_factories:good", device="cpu", nproc_per_node=2, announce=lines.append)
    assert lines and lines[0].endswith("; 2 DDP ranks, samples/s counts them all)")


@pytest.mark.parametrize(("value", "threads"), [(None, 1), ("3", 3), ("4,2", 4), ("0", None), ("", None), ("many", None)])
def test_torchrun_threads_read_omp_num_threads_as_torch_does(value: str | None, threads: int | None, monkeypatch) -> None:
    from autotune.runner.ranks import torchrun_threads

    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert torchrun_threads() == threads  # None: no count named, torch's own (one per core of the rank's share)


@pytest.mark.slow
def test_ddp_ranks_get_the_threads_torchrun_gives_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun sets OMP_NUM_THREADS=1 for several ranks per node unless the environment names it: the
    emitted script's `--threads auto` runs so, and a trial must measure what the script will do (not one
    thread per core of the rank's share). Each trial runs with the environment of its call."""
    import subprocess
    import sys

    import autotune

    two_cores()
    own = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "0"}, check=True).stdout.strip()
    monkeypatch.chdir(TESTS)  # the workload's module is imported from the working directory, as a user's own is
    for omp, threads in (("2", 2), (None, 1), ("0", int(own))):  # 0 names no count: torch's own, as the unpinned script gets
        if omp is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", omp)
        done = autotune.trial("task_factories:good", setup=autotune.TrainSetup(batch_size=4), nproc_per_node=2, trial_seconds=0.5,
                              device="cpu")
        assert done.result.status == "ok", done.result.error
        assert done.result.num_threads == threads, omp  # each rank's share is one core


@pytest.mark.slow
def test_a_ddp_trial_of_the_classifier_on_its_own_folder_measures(cache_dir) -> None:
    """`autotune trial --nproc-per-node 2` counts the whole folder (a search counts a rank's share): the check that the
    data did not change while a search ran took it for a folder that had lost half its images."""
    import autotune

    result = autotune.trial(model="resnet18", image_size=32, device="cpu", nproc_per_node=2, cache_dir=cache_dir,
                            synthetic_images=64, setup=autotune.TrainSetup(batch_size=4), trial_seconds=1.0)
    assert result.result.status == "ok", result.result.error


def test_a_stop_while_a_parallel_slot_asks_its_trial_leaves_no_trial_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--devices cpu,cpu: a Ctrl-C held while a slot asked its next trial was raised as the ask's block ended, before the
    trial was the slot's: the stop failed the other running trials but left that one RUNNING "on an unknown worker",
    and the rerun called it a dead search's."""
    import signal

    from autotune.errors import SearchInterrupted

    two_cores()
    asked = {"n": 0}
    ask = SearchStudy.ask

    def ask_then_stop(self: SearchStudy, *args: Any, **kwargs: Any) -> Any:
        asked["n"] += 1
        if asked["n"] == 3:  # inside fill()'s held block: the stop waits for it to end
            os.kill(os.getpid(), signal.SIGINT)
        return ask(self, *args, **kwargs)

    def steady(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
        time.sleep(0.2)
        return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(100.0,), peak_memory_bytes=2**20)

    monkeypatch.setattr(SearchStudy, "ask", ask_then_stop)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        config = SearchConfig(model="ignored", trials=6, device="cpu", devices="cpu,cpu", trial_seconds=1.0, out=tmp_path / "out",
                              confirm_top=1, confirm_rounds=1, workload="task_factories:good")
        with pytest.raises(SearchInterrupted):
            run_search(config, runner=steady)
    finally:
        signal.signal(signal.SIGINT, previous)
    import optuna

    storage = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    (name,) = optuna.get_all_study_names(storage)
    trials = optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)
    assert asked["n"] >= 3 and not [t.number for t in trials if t.state == optuna.trial.TrialState.RUNNING], trials
