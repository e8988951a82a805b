"""Device resolution against the probe: cpu, cuda:K and CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

from types import SimpleNamespace

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
