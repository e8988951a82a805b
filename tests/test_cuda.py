"""CUDA paths: run only where a GPU is present (skipped elsewhere)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from autotune.records import TrialOptions
from autotune.runner import run_trial
from autotune.train_setup import TrainSetup

pytestmark = [pytest.mark.cuda, pytest.mark.slow]

QUICK = TrialOptions(trial_seconds=1.0, windows=2, timeout_s=120)


def test_probe_sees_the_gpu() -> None:
    import probes

    hardware = probes.collect()
    assert hardware.gpus, hardware.gpu_error
    gpu = hardware.gpus[0]
    assert gpu.memory_total_bytes > 2**30
    assert gpu.compute_capability is not None
    # NVML's near CPUs (the cores the GPU's trials and ranks are pinned to first): CPUs of this machine, if named.
    assert gpu.cpu_affinity is None or set(gpu.cpu_affinity) <= set(range(os.cpu_count() or 1)), gpu.cpu_affinity
    print(f"near CPUs of GPU 0: {gpu.cpu_affinity}; query errors {gpu.query_errors}")


def test_check_device_asked_without_facts_reads_the_gpus_here() -> None:
    import torch

    from autotune.errors import SetupError

    TrainSetup(amp="fp16", pin_memory=True).check_device("cuda")  # present: the knobs' checks alone
    count = torch.cuda.device_count()
    with pytest.raises(SetupError, match=f"this machine has {count} CUDA GPU"):
        TrainSetup().check_device(f"cuda:{count}")


def test_bf16_is_checked_by_the_capability_of_the_gpu_asked_for() -> None:
    """Native bf16 (compute capability 8.0+), not torch.cuda.is_bf16_supported(), which also counts emulation."""
    import torch

    from autotune.errors import SetupError

    for index in range(torch.cuda.device_count()):
        native = torch.cuda.get_device_capability(index) >= (8, 0)
        if native:
            TrainSetup(amp="bf16").check_device(f"cuda:{index}")
        else:
            with pytest.raises(SetupError, match="does not support bf16"):
                TrainSetup(amp="bf16").check_device(f"cuda:{index}")


@pytest.mark.parametrize("amp", ["off", "fp16", "bf16"])
def test_cuda_trial_precisions(tiny_workload, amp: str) -> None:
    import torch

    if amp == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("GPU without bf16")
    workload = dataclasses.replace(tiny_workload, device="cuda:0")
    setup = TrainSetup(batch_size=32, num_workers=2, prefetch_factor=2, pin_memory=True, amp=amp, channels_last=True)
    result = run_trial(setup, workload, QUICK)
    assert result.status == "ok", result.error
    assert result.peak_memory_bytes > 0  # reserved by the caching allocator


def test_cuda_memory_budget_is_oom(tiny_workload) -> None:
    workload = dataclasses.replace(tiny_workload, device="cuda:0")
    result = run_trial(TrainSetup(batch_size=64), workload, dataclasses.replace(QUICK, max_memory_bytes=2**20))
    assert result.status == "oom"


def test_cuda_compute_ceiling_beats_cpu_loader(tiny_workload) -> None:
    workload = dataclasses.replace(tiny_workload, device="cuda:0")
    compute = run_trial(TrainSetup(batch_size=128, amp="fp16"), workload, dataclasses.replace(QUICK, mode="compute"))
    assert compute.status == "ok" and compute.data_wait_fraction == 0.0


def test_tiny_cuda_search(tmp_path, cache_dir) -> None:
    from autotune.output.best import read_best
    from autotune.tuner import SearchConfig, run_search

    outcome = run_search(
        SearchConfig(model="resnet18", trials=4, image_size=32, device="cuda", trial_seconds=1.0,
                     out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64, confirm_top=2, confirm_rounds=2)
    )
    best = read_best(tmp_path / "out" / "best.json")
    assert best.workload.device == "cuda:0"
    assert outcome.best is not None and best.samples_per_s > 0
    guess, fastest = outcome.records[1].setup, outcome.calibration.fastest_precision()
    assert {p.amp for p in outcome.calibration.precisions} >= {"off", "bf16"}  # measured like for like
    assert fastest is not None and (guess.amp, guess.channels_last) == (fastest.amp, fastest.channels_last)  # the guess follows them


# ------------------------------------------------------------- torch knobs
def test_cuda_flags_apply_through_the_precision_api() -> None:
    import torch

    before = (torch.backends.cudnn.benchmark, torch.get_float32_matmul_precision(), torch.backends.cudnn.conv.fp32_precision)
    try:
        tf32 = torch.cuda.get_device_capability(0) >= (8, 0)
        TrainSetup(cudnn_benchmark=True, tf32=tf32).configure_torch("cuda:0")
        assert torch.backends.cudnn.benchmark is True
        if tf32:
            assert torch.backends.cuda.matmul.fp32_precision == "tf32"
            assert torch.backends.cudnn.conv.fp32_precision == "tf32"
            assert torch.get_float32_matmul_precision() == "high"  # readable: inductor's autotuning reads it
        TrainSetup(cudnn_benchmark=False, tf32=False).configure_torch("cuda:0")  # off undoes on
        assert torch.backends.cudnn.benchmark is False and torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.backends.cudnn.benchmark = before[0]
        torch.set_float32_matmul_precision(before[1])
        torch.backends.cudnn.conv.fp32_precision = before[2]


def test_cuda_max_autotune_compiles_with_tf32(tiny_workload) -> None:
    """compile=max-autotune-no-cudagraphs autotunes its matmuls, which reads the matmul precision TF32 set."""
    import torch

    if torch.cuda.get_device_capability(0) < (8, 0):
        pytest.skip("GPU without TF32")
    workload = dataclasses.replace(tiny_workload, device="cuda:0", model="factories:tiny_cnn")  # autotuning stays short
    setup = TrainSetup(batch_size=16, tf32=True, compile="max-autotune-no-cudagraphs")
    result = run_trial(setup, workload, TrialOptions(trial_seconds=1.0, timeout_s=150.0))
    assert result.status == "ok", result.error


@pytest.mark.parametrize("impl", ["for-loop", "foreach", "fused"])
def test_cuda_trial_with_cudnn_tf32_and_optimizer_kernels(tiny_workload, impl: str) -> None:
    import torch

    workload = dataclasses.replace(tiny_workload, device="cuda:0")
    tf32 = torch.cuda.get_device_capability(0) >= (8, 0)
    setup = TrainSetup(batch_size=32, amp="off", cudnn_benchmark=True, tf32=tf32, optimizer_impl=impl)
    result = run_trial(setup, workload, QUICK)
    assert result.status == "ok", result.error


def test_gpu_decode_matches_the_cpu_pipeline(cache_dir) -> None:
    import torch

    from autotune.workloads.data import ensure_synthetic
    from autotune.workloads.gpu_decode import GpuDecoder, byte_folder, collate_bytes

    dataset = byte_folder(str(ensure_synthetic(cache_dir, 64)))
    files, labels, paths = collate_bytes([dataset[i] for i in range(8)])
    assert files[0].dtype == torch.uint8 and files[0].device.type == "cpu"  # bytes cross the bus, not pixels
    images, targets = GpuDecoder(32, "cuda:0")((files, labels, paths), channels_last=True)
    assert images.shape == (8, 3, 32, 32) and images.device.type == "cuda" and images.dtype == torch.float32
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert targets.device.type == "cuda" and torch.equal(targets.cpu(), labels)
    assert -3.0 < float(images.mean()) < 3.0  # normalized


def test_gpu_decode_falls_back_for_a_png(tmp_path) -> None:
    import torch
    from PIL import Image

    from autotune.workloads.gpu_decode import GpuDecoder, byte_folder, collate_bytes

    (tmp_path / "a").mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "a" / "x.png")
    Image.new("RGB", (40, 30), (10, 200, 10)).save(tmp_path / "a" / "y.jpg", quality=90)
    Image.new("RGB", (40, 30), (10, 10, 200)).save(tmp_path / "a" / "z.bmp")  # torchvision's decoder refuses it: PIL
    dataset = byte_folder(str(tmp_path))
    images, _ = GpuDecoder(16, "cuda:0")(collate_bytes([dataset[i] for i in range(3)]))
    assert images.shape == (3, 3, 16, 16) and torch.isfinite(images).all() and images.device.type == "cuda"


def test_cuda_trial_with_gpu_decode(tiny_workload) -> None:
    workload = dataclasses.replace(tiny_workload, device="cuda:0")
    setup = TrainSetup(batch_size=32, num_workers=2, prefetch_factor=2, pin_memory=True, decode="gpu", amp="fp16")
    result = run_trial(setup, workload, QUICK)
    assert result.status == "ok", result.error
    assert result.samples_per_s * result.step_time_s == pytest.approx(32)  # images per step, not bytes
    compute = run_trial(setup, workload, dataclasses.replace(QUICK, mode="compute"))  # random pixels, no decoder
    assert compute.status == "ok", compute.error


def _task_on_cuda(name: str):  # type: ignore[no-untyped-def]
    """The workload of tests/task_factories.py's ``name``, checked in this process, on cuda:0."""
    import pathlib
    import sys

    from autotune.workloads.tasks import build_task_workload

    here = str(pathlib.Path(__file__).parent)
    sys.path.insert(0, here)
    try:
        return dataclasses.replace(build_task_workload(f"task_factories:{name}", device="cpu"), device="cuda:0")
    finally:
        sys.path.remove(here)


def test_a_file_nvjpeg_and_the_fallback_refuse_is_bad_data_named(tmp_path) -> None:
    """decode=gpu on the GPU: an empty file among the JPEGs is a BadImage naming it (the CPU test runs the decoder on the
    CPU; here nvjpeg refuses first)."""
    from PIL import Image

    from autotune.workloads.data import BadImage
    from autotune.workloads.gpu_decode import GpuDecoder, byte_folder, collate_bytes

    (tmp_path / "a").mkdir()
    Image.new("RGB", (40, 30), (200, 10, 10)).save(tmp_path / "a" / "0.jpg", quality=90)
    (tmp_path / "a" / "1.jpg").write_bytes(b"")
    dataset = byte_folder(str(tmp_path))
    with pytest.raises(BadImage, match=r"1.jpg: cannot decode"):
        GpuDecoder(16, "cuda:0")(collate_bytes([dataset[0], dataset[1]]))


def test_a_task_reading_with_torchvision_io_in_loader_workers_runs_on_cuda() -> None:
    """torchvision.io.read_file never returned in a loader worker forked after CUDA started (the first GPU run, with
    the classifier's own reader, since replaced): a user's Task that reads its files so must not hang every trial with
    workers (a timeout here says it does)."""
    workload = _task_on_cuda("reads_with_torchvision_io")
    result = run_trial(TrainSetup(batch_size=8, num_workers=2, prefetch_factor=2), workload, dataclasses.replace(QUICK, timeout_s=90))
    assert result.status == "ok", result.error


def test_cuda_graphs_with_accumulation_and_fp16() -> None:
    """compile=reduce-overhead (CUDA graphs) with accumulation and the fp16 GradScaler: no other test combines them."""
    work = _task_on_cuda("good")
    setup = TrainSetup(batch_size=16, accumulation_steps=2, amp="fp16", compile="reduce-overhead")
    result = run_trial(setup, work, dataclasses.replace(QUICK, timeout_s=300))
    assert result.status == "ok", result.error


def test_tf32_off_leaves_convolutions_as_torch_sets_them() -> None:
    """tf32=false sets float32 matmuls to full precision and leaves cuDNN's convolutions at torch's default (TF32 on
    CUDA): the PyTorch defaults' trial runs what a plain script runs (docs/search.md, the torch knobs)."""
    import torch

    from autotune.torch_knobs import configure_torch

    before = torch.backends.cudnn.conv.fp32_precision
    configure_torch("cuda:0", num_threads=None, cudnn_benchmark=False, tf32=False)
    assert torch.get_float32_matmul_precision() == "highest" and torch.backends.cudnn.conv.fp32_precision == before


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_cuda_compiled_trial(tiny_workload, mode: str) -> None:
    workload = dataclasses.replace(tiny_workload, device="cuda:0", model="factories:tiny_cnn")
    result = run_trial(TrainSetup(batch_size=32, compile=mode, optimizer_impl="fused"), workload, QUICK)
    assert result.status == "ok", result.error
    assert result.compile_s is not None and result.compile_s > 0


def test_cuda_space_offers_the_cuda_knobs() -> None:
    import probes
    from autotune.devices import resolve_device
    from autotune.records import Calibration, MemoryPoint
    from autotune.tuner.space import build_space

    device = resolve_device("cuda", probes.collect())
    calibration = Calibration(budget_bytes=2**33, max_batch=64, memory_points=(MemoryPoint(64, "ok", 2**28, 100.0),),
                              probe_batch=64, compute_setup=TrainSetup(), compute_samples_per_s=None, loader=(), max_workers=2)
    values = build_space(device=device, calibration=calibration, usable_cores=4, effective_batch=None, constraints={}).values
    assert values["cudnn_benchmark"] == (False, True) and values["decode"] == ("cpu", "gpu")
    assert "fused" in values["optimizer_impl"] and "reduce-overhead" in values["compile"]
    assert values["tf32"] == ((False, True) if device.tf32 else (False,))


def _gpus() -> int:
    import torch

    return torch.cuda.device_count()


def test_nccl_two_rank_trial(tiny_workload) -> None:
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    from autotune.tuner.placement import usable_core_ids

    workload = dataclasses.replace(tiny_workload, device="cuda:0")
    options = dataclasses.replace(QUICK, world_size=2, cores=usable_core_ids(2))
    result = run_trial(TrainSetup(batch_size=32, num_workers=1, prefetch_factor=2, amp="fp16"), workload, options)
    assert result.status == "ok", result.error
    assert round(result.step_time_s * result.samples_per_s) == 2 * 32  # both ranks' samples


def test_devices_all_places_one_trial_per_gpu() -> None:
    import probes
    from autotune.tuner.placement import place

    hardware = probes.collect()
    if _gpus() > int(hardware.cpu.usable_cores):  # --devices refuses more devices than cores (one each): checked elsewhere
        pytest.skip(f"{_gpus()} GPUs but {hardware.cpu.usable_cores} usable CPU cores")
    placement = place("auto", "all", 1, hardware)
    assert [s.device for s in placement.slots] == [f"cuda:{k}" for k in range(_gpus())]
    assert all(s.cores for s in placement.slots)


def test_parallel_cuda_search(tmp_path, cache_dir) -> None:
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study import ATTR_ENDED, ATTR_STARTED

    outcome = run_search(
        SearchConfig(model="resnet18", trials=4, image_size=32, devices="cuda:0,cuda:1", trial_seconds=1.0,
                     out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64, confirm_top=1, confirm_rounds=1,
                     ceilings=False)
    )
    assert outcome.best is not None
    trials = [t for t in outcome_study_trials(tmp_path) if ATTR_STARTED in t.user_attrs]
    spans = sorted((t.user_attrs[ATTR_STARTED], t.user_attrs[ATTR_ENDED]) for t in trials)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))


def outcome_study_trials(tmp_path):  # type: ignore[no-untyped-def]
    from autotune.tuner.study import SearchStudy

    return SearchStudy.load(f"sqlite:///{tmp_path / 'out' / 'study.db'}").study.trials


def test_a_batch_object_with_its_own_to_method_reaches_the_gpu() -> None:
    """A collate_fn's ``Batch`` with ``to(device)``: it stayed on the CPU while the model sat on the GPU."""
    import torch
    from test_task import MovesItself

    from autotune.workloads.batches import to_device

    moved = to_device({"batch": MovesItself(torch.zeros(4, 3), torch.zeros(4))}, "cuda")
    assert moved["batch"].x.is_cuda and moved["batch"].y.is_cuda


# ------------------------------------------------------------- a user's Task on the GPU
def test_a_task_search_on_cuda_and_its_train_py_plain_and_under_torchrun(tmp_path) -> None:
    """A Task with step= and dict batches (examples/text_classifier.py) tuned on the GPU, then its emitted train.py run
    plain and under torchrun (DDP on NCCL, one rank): the batches reach the GPU in both."""
    import subprocess
    import sys
    from pathlib import Path

    import autotune

    examples = Path(__file__).resolve().parent.parent / "examples"
    sys.path.insert(0, str(examples))
    try:
        result = autotune.search(workload="text_classifier:make_task", trials=3, device="cuda", trial_seconds=1.0,
                                 confirm_top=1, confirm_rounds=1, ceilings=False, out=tmp_path / "out")
    finally:
        sys.path.remove(str(examples))
    assert result.outcome.best is not None and result.outcome.best.workload.device == "cuda:0"
    assert result.samples_per_s and result.samples_per_s > 0
    env = {**__import__("os").environ, "PYTHONPATH": f"{examples}:{Path(autotune.__file__).parent.parent}"}
    for launcher in ([sys.executable], [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1"]):
        ran = subprocess.run([*launcher, str(result.train_py), "--max-steps", "3", "--print-freq", "1", "--output-dir", "train-out"],
                             cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
        assert ran.returncode == 0, ran.stderr[-3000:]
        assert "step 3 loss" in ran.stdout and "cuda" in ran.stdout, ran.stdout[-2000:]
        assert ("DDP:" in ran.stdout) == (len(launcher) > 1), ran.stdout[-2000:]  # NCCL under torchrun, one rank too
    # The GPU named (as a search on cuda:K > 0 emits it), and one process more than the GPUs under torchrun: one line.
    named = subprocess.run([sys.executable, str(result.train_py), "--device", "cuda:0", "--max-steps", "1", "--output-dir", "named"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert named.returncode == 0, named.stderr[-3000:]
    gpus = __import__("torch").cuda.device_count()
    over = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus + 1}",
                           str(result.train_py), "--max-steps", "1", "--output-dir", "over"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert over.returncode != 0 and f"error: process LOCAL_RANK={gpus} of this node has no GPU: {gpus} visible" in over.stderr


def test_a_stream_task_script_under_torchrun_on_nccl_ends_its_epochs(tmp_path) -> None:
    """The emitted Task script's per-micro-batch flag of an IterableDataset epoch, all-reduced on NCCL (one rank)."""
    import subprocess
    import sys
    from pathlib import Path

    import autotune
    from autotune.output.best import Best
    from autotune.output.emit import write_script
    from autotune.workloads.tasks import build_task_workload

    tests = Path(__file__).resolve().parent
    sys.path.insert(0, str(tests))
    try:
        work = dataclasses.replace(build_task_workload("task_factories:uneven_shards", device="cpu", workers=True), device="cuda:0")
    finally:
        sys.path.remove(str(tests))
    setup = autotune.TrainSetup(batch_size=4)
    best = Best(setup=setup, workload=work, samples_per_s=100.0, samples_per_s_spread=1.0, defaults_samples_per_s=None,
                speedup=None, peak_memory_bytes=None, effective_batch=setup.effective_batch(),
                reference_batch=work.reference_batch or 32, lr=work.lr)
    script = write_script(best, tmp_path / "train.py")
    env = {**__import__("os").environ, "PYTHONPATH": f"{tests}:{Path(autotune.__file__).parent.parent}"}
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(script),
                          "--epochs", "2", "--workers", "0", "--print-freq", "1", "--output-dir", "out"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "epoch 1 done at step" in ran.stdout and "DDP:" in ran.stdout, ran.stdout[-2000:]
