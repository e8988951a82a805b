"""Device resolution against the probe: cpu, cuda:K and CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from autotune.devices import resolve_device, visible_gpus
from autotune.errors import UsageError

GPUS = [
    SimpleNamespace(name=f"GPU {i}", uuid=f"GPU-{c * 8}", bf16=True, memory_total_bytes=(i + 1) * 2**30,
                    memory_free_bytes=(i + 1) * 2**30)
    for i, c in enumerate("abc")
]


def hardware(visible: str | None = None, gpus=GPUS) -> SimpleNamespace:
    return SimpleNamespace(cpu=SimpleNamespace(model="Test CPU", bf16=True), gpus=gpus, gpu_error=None,
                           cuda_visible_devices=visible)


def test_cpu_and_auto() -> None:
    assert resolve_device("cpu", hardware()).name == "cpu"
    assert resolve_device("auto", hardware(gpus=[])).name == "cpu"
    assert resolve_device("auto", hardware()).label == "GPU 0"


@pytest.mark.parametrize(
    ("visible", "names"),
    [
        (None, ["GPU 0", "GPU 1", "GPU 2"]),
        ("2,0", ["GPU 2", "GPU 0"]),
        ("GPU-bbbb", ["GPU 1"]),  # abbreviated UUID
        ("1,-1,0", ["GPU 1"]),  # CUDA stops at the first invalid entry
        ("0,7,1", ["GPU 0"]),
        ("", []),
    ],
)
def test_visible_gpus_follow_cuda_numbering(visible, names) -> None:
    assert [g.name for g in visible_gpus(GPUS, visible)] == names


def test_cuda_index_counts_visible_gpus() -> None:
    device = resolve_device("cuda:1", hardware("2,0"))
    assert device.name == "cuda:1"
    assert device.label == "GPU 0" and device.memory_total_bytes == 2**30
    assert resolve_device("cuda", hardware("2,0")).label == "GPU 2"
    with pytest.raises(UsageError, match=r"only 2 GPU\(s\) visible"):
        resolve_device("cuda:2", hardware("2,0"))


def test_hidden_gpus_and_mig_are_one_line_errors() -> None:
    with pytest.raises(UsageError, match="hides every GPU"):
        resolve_device("cuda", hardware(""))
    with pytest.raises(UsageError, match="MIG instance"):
        resolve_device("cuda", hardware("MIG-1234"))
    with pytest.raises(UsageError, match="bad device"):
        resolve_device("cuda:x", hardware())


def test_a_search_warns_of_a_busy_gpu_only_where_its_trials_run_named_as_it_names_them() -> None:
    """The probe warns of every GPU others hold more than half the memory of, by NVML's index. A search printed them
    all: a busy GPU 0 was reported to a search on an idle cuda:1 (and under CUDA_VISIBLE_DEVICES=1,0, cuda:0 is NVML's
    GPU 1). A search now says only its own GPUs', as cuda:K with NVML's index beside it; the other warnings stay."""
    from autotune.tuner.placement import place
    from autotune.tuner.prepare import search_warnings
    from probes.gpu import GpuInfo
    from probes.hardware import gpu_busy_warning

    gib = 2**30
    gpus = [GpuInfo(index=0, name="H100", memory_total_bytes=80 * gib, memory_used_by_others_bytes=70 * gib),
            GpuInfo(index=1, name="H100", memory_total_bytes=80 * gib, memory_used_by_others_bytes=0)]
    shm = "/dev/shm is small"

    def said(device: str, visible: str | None = None, **kwargs: Any) -> list[str]:
        probe = SimpleNamespace(cpu=SimpleNamespace(model="Test CPU", bf16=True, usable_cores=4), gpus=gpus, gpu_error=None,
                                cuda_visible_devices=visible, warnings=(shm, gpu_busy_warning(gpus[0])))
        return search_warnings(probe, place(device, kwargs.get("devices"), kwargs.get("nproc", 1), probe))

    assert said("cpu") == [shm]
    assert said("cuda:1") == [shm]
    busy = [shm, "cuda:0 (NVML GPU 0, H100): 88% of its memory (70.0 GiB of 80.0 GiB) is already used by other processes; "
                 "the search has less room for batches and measures throughput on a shared GPU. Free the GPU or pick another "
                 "with CUDA_VISIBLE_DEVICES."]
    assert said("cuda:0") == busy
    assert said("cuda", nproc=2) == busy  # rank 0 on cuda:0
    assert said("cuda:0", visible="1,0") == [shm]  # cuda:0 is NVML's idle GPU 1
    assert said("cuda:1", visible="1,0") == [shm, busy[1].replace("cuda:0", "cuda:1")]
    assert said("cuda", devices="cuda:0,cuda:1") == busy
