"""CUDA paths: run only where a GPU is present (skipped elsewhere)."""

from __future__ import annotations

import dataclasses

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
    assert "fp16" in outcome.records[1].setup.amp or "bf16" in outcome.records[1].setup.amp  # the guess uses AMP


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

    placement = place("auto", "all", 1, probes.collect())
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
