"""Tests of the hardware probe (``probes``) and ``autotune probe``.

Everything runs without a GPU: NVML is replaced by a fake ``pynvml`` module
put into ``sys.modules``, and cgroup files come from tests/fixtures/cgroup.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import io
import json
import os
import platform
import resource
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pytest
from rich.console import Console
from typer.testing import CliRunner

import probes
import probes.software
from autotune.cli import app
from probes.cgroup import cpu_limit, memory_headroom, memory_limit, parse_cfs_quota, parse_cpu_max, parse_memory_limit
from probes.cpu import collect_cpu, env_threads, quota_to_cores, read_cpuinfo, usable_cores
from probes.gpu import GpuInfo, collect_gpus
from probes.hardware import Hardware, hardware_warnings
from probes.memory import MemoryInfo, ShmInfo, address_space_limit
from probes.software import format_cudnn_version, torch_cuda_build
from probes.units import GIB, MIB

FIXTURES = Path(__file__).parent / "fixtures" / "cgroup"
AFFINITY = len(os.sched_getaffinity(0))


def fixture(name: str) -> tuple[Path, str]:
    """The (cgroup root, /proc/self/cgroup text) of one fixture tree."""
    base = FIXTURES / name
    return base / "sys", (base / "proc_self_cgroup").read_text()


# --------------------------------------------------------------------------- the JSON contract


@pytest.fixture(scope="module")
def probed() -> dict[str, Any]:
    return probes.collect().to_dict()


CONTRACT: dict[str, dict[str, tuple[type, ...]]] = {
    "cpu": {
        "model": (str, type(None)),
        "logical_cores": (int,),
        "physical_cores": (int, type(None)),
        "usable_cores": (int,),
        "bf16": (bool,),
    },
    "memory": {"total_bytes": (int,), "available_bytes": (int,)},
    "shm": {"path": (str,), "total_bytes": (int, type(None)), "free_bytes": (int, type(None))},
    "software": {
        name: (str, type(None)) for name in ("python", "torch", "torchvision", "cuda", "cudnn", "optuna", "autotune")
    },
}
GPU_KEYS = {
    "index": (int,),
    "name": (str, type(None)),
    "memory_total_bytes": (int, type(None)),
    "memory_free_bytes": (int, type(None)),
    "compute_capability": (str, type(None)),
    "bf16": (bool, type(None)),
    "tf32": (bool, type(None)),
    "driver_version": (str, type(None)),
    "pcie_generation": (int, type(None)),
    "pcie_width": (int, type(None)),
}


def test_contract_keys_and_types(probed: dict[str, Any]) -> None:
    for section, keys in CONTRACT.items():
        for key, types_ in keys.items():
            assert key in probed[section], f"{section}.{key} missing"
            value = probed[section][key]
            assert isinstance(value, types_), f"{section}.{key} = {value!r}"
            if bool not in types_:  # bool is an int subclass: keep counts honest
                assert not isinstance(value, bool), f"{section}.{key} = {value!r}"
    assert isinstance(probed["gpus"], list)
    assert isinstance(probed["gpu_error"], (str, type(None)))
    assert isinstance(probed["warnings"], list) and all(isinstance(w, str) for w in probed["warnings"])
    json.loads(json.dumps(probed))  # JSON-serialisable as it is


def test_contract_values_on_this_machine(probed: dict[str, Any]) -> None:
    cpu, memory = probed["cpu"], probed["memory"]
    assert cpu["logical_cores"] == os.cpu_count()
    assert cpu["usable_cores"] == AFFINITY
    assert cpu["physical_cores"] == psutil.cpu_count(logical=False)
    total = psutil.virtual_memory().total
    assert abs(memory["total_bytes"] - total) <= 0.01 * total
    assert 0 < memory["available_bytes"] <= memory["total_bytes"]
    assert probed["shm"]["path"] == "/dev/shm"
    assert probed["software"]["python"] == platform.python_version()
    assert probed["software"]["torch"] == importlib.metadata.version("torch")
    assert probed["software"]["autotune"] == importlib.metadata.version("autotune")


def test_no_gpu_here_gives_empty_list_and_a_reason(probed: dict[str, Any]) -> None:
    assert probed["gpus"] == []
    assert isinstance(probed["gpu_error"], str) and probed["gpu_error"].strip()
    assert "\n" not in probed["gpu_error"]
    # Without a driver, CUDA and cuDNN are not reported even for a CUDA build of torch.
    assert probed["software"]["cuda"] is None
    assert probed["software"]["cudnn"] is None


def test_cpu_bf16_matches_cpuinfo_flags(probed: dict[str, Any]) -> None:
    words = set(Path("/proc/cpuinfo").read_text().split())
    expected = {"avx512_bf16", "amx_bf16"} & words
    assert probed["cpu"]["bf16"] == bool(expected)
    assert expected <= set(probed["cpu"]["bf16_flags"])


def test_collect_imports_neither_torch_nor_cuda_without_a_driver() -> None:
    code = "import sys, probes; probes.collect(); print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"


def test_usable_cores_public_function_on_this_machine() -> None:
    assert probes.usable_cores() == AFFINITY


# --------------------------------------------------------------------------- cgroups


@pytest.mark.parametrize(
    ("text", "expected"),
    [("150000 100000", 1.5), ("max 100000", None), ("max", None), ("200000 50000\n", 4.0), ("", None), ("x y", None)],
)
def test_parse_cpu_max(text: str, expected: float | None) -> None:
    assert parse_cpu_max(text) == expected


@pytest.mark.parametrize(
    ("quota", "period", "expected"),
    [("-1", "100000", None), ("50000", "100000", 0.5), ("200000\n", "100000\n", 2.0), ("junk", "100000", None)],
)
def test_parse_cfs_quota(quota: str, period: str, expected: float | None) -> None:
    assert parse_cfs_quota(quota, period) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("max", None), ("8589934592\n", 8 * GIB), ("9223372036854771712", None), ("", None)]
)
def test_parse_memory_limit(text: str, expected: int | None) -> None:
    assert parse_memory_limit(text) == expected


@pytest.mark.parametrize(
    ("name", "cpus", "memory"),
    [
        ("v2_quota", 1.5, 8 * GIB),
        ("v2_max", None, None),
        ("v2_nested", 1.0, None),  # the parent's 1 CPU caps the child's 3
        ("v2_namespace", 2.5, None),  # host path in /proc, container cgroup at the mount root
        ("v1_quota", 2.0, 4 * GIB),
        ("v1_none", None, None),
        ("hybrid", 3.0, 2 * GIB),  # cpu on v1, memory on the unified (v2) hierarchy
    ],
)
def test_cgroup_limits_from_fixtures(name: str, cpus: float | None, memory: int | None) -> None:
    root, proc = fixture(name)
    assert cpu_limit(root, proc) == cpus
    assert memory_limit(root, proc) == memory


@pytest.mark.parametrize(
    ("name", "headroom"),
    [
        ("hybrid", 2 * GIB - 512 * MIB - 100 * MIB),  # v2: the limit less anon and shmem; page cache (file) is reclaimable
        ("v1_quota", 4 * GIB - GIB - 256 * MIB),  # v1: less total_rss and total_shmem (the group's and its children's)
        ("v1_old", GIB - 256 * MIB),  # a v1 kernel before total_shmem: total_rss alone
        ("v2_quota", 8 * GIB),  # no memory.stat to read: the whole limit
        ("v1_none", None),  # no limit
    ],
)
def test_the_memory_a_cgroup_limit_leaves_is_the_limit_less_what_the_group_holds(name: str, headroom: int | None) -> None:
    root, proc = fixture(name)
    assert memory_headroom(root, proc) == headroom


def test_a_container_s_memory_limit_bounds_the_usable_ram_and_is_a_warning() -> None:
    """A search sizes its batches to half the usable RAM: in a 2 GiB container on a 24 GiB host that is what the
    limit leaves, not the host's available RAM (before, a search in such a container sized batches to 9 GiB)."""
    shm = ShmInfo("/dev/shm", 8 * GIB, 8 * GIB)
    cpu = collect_cpu()
    host = MemoryInfo(total_bytes=24 * GIB, available_bytes=22 * GIB)
    boxed = MemoryInfo(total_bytes=24 * GIB, available_bytes=22 * GIB, cgroup_limit_bytes=2 * GIB, cgroup_available_bytes=GIB + GIB // 2)
    roomy = MemoryInfo(total_bytes=24 * GIB, available_bytes=22 * GIB, cgroup_limit_bytes=64 * GIB, cgroup_available_bytes=60 * GIB)
    assert (host.usable_bytes(), boxed.usable_bytes(), roomy.usable_bytes()) == (22 * GIB, GIB + GIB // 2, 22 * GIB)
    said = [w for w in hardware_warnings(cpu, shm, (), boxed) if w.startswith("the cgroup memory limit")]
    assert said == ["the cgroup memory limit is 2.0 GiB (1.5 GiB of it free; docker --memory, Kubernetes limits.memory) while "
                    "the host has 22.0 GiB available: training, its DataLoader workers and their shared memory all count "
                    "against the limit, and a process over it is killed; a search sizes its batches to what the limit leaves."]
    assert not [w for w in hardware_warnings(cpu, shm, (), roomy) if "cgroup memory" in w]


def _new_memory_cgroup(limit: int) -> Path | None:
    """A fresh memory cgroup limited to ``limit`` bytes (v1's memory hierarchy, or v2 where its root delegates the
    memory controller); None where this process may not make one (not root, cgroups read-only)."""
    name = f"autotune-test-{os.getpid()}"
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    if (v1 / "cgroup.procs").exists():
        group, limit_file = v1 / name, "memory.limit_in_bytes"
    elif "memory" in (v2 / "cgroup.subtree_control").read_text(errors="replace").split() if (v2 / "cgroup.subtree_control").exists() else False:
        group, limit_file = v2 / name, "memory.max"
    else:
        return None
    try:
        group.mkdir()
        (group / limit_file).write_text(str(limit))
    except OSError:
        return None
    return group


def test_a_process_in_a_memory_limited_cgroup_sees_the_limit_and_what_it_leaves(request: pytest.FixtureRequest) -> None:
    """A real memory cgroup (as docker --memory makes), the probe run in it as a second process: the kernel's own
    limit and memory.stat files give the limit, what it leaves (less than the limit: the probe's own Python holds some)
    and the warning."""
    group = _new_memory_cgroup(GIB)
    if group is None:
        pytest.skip("this process may not make a memory cgroup (the fixture trees above cover the reading)")

    def remove() -> None:
        for _ in range(600):  # the exited probe leaves the group a moment later (60 s at most, on a loaded machine)
            try:
                group.rmdir()
                return
            except OSError:
                time.sleep(0.1)

    request.addfinalizer(remove)
    probe = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json"], capture_output=True, text=True, timeout=120,
                           preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())))
    assert probe.returncode == 0, probe.stderr
    data = json.loads(probe.stdout)
    memory = data["memory"]
    assert memory["cgroup_limit_bytes"] == GIB
    assert 0 < memory["cgroup_available_bytes"] < GIB, memory
    assert any(w.startswith("the cgroup memory limit is 1.0 GiB (") for w in data["warnings"]), data["warnings"]


def test_cgroup_limits_without_cgroup_files(tmp_path: Path) -> None:
    assert cpu_limit(tmp_path, "0::/\n") is None
    assert cpu_limit(tmp_path / "missing", "") is None
    assert memory_limit(tmp_path, "garbage line\n") is None


@pytest.mark.parametrize(("limit", "cores"), [(1.5, 1), (0.5, 1), (2.0, 2), (3.99, 3), (16.0, 16)])
def test_quota_rounds_down_but_never_below_one(limit: float, cores: int) -> None:
    assert quota_to_cores(limit) == cores


def test_quota_below_affinity_caps_usable_cores() -> None:
    root, proc = fixture("v2_quota")  # 1.5 CPUs
    assert usable_cores(root, proc, affinity=8) == 1
    root, proc = fixture("v1_quota")  # 2 CPUs
    assert usable_cores(root, proc, affinity=8) == 2


def test_quota_above_affinity_does_not_raise_usable_cores() -> None:
    root, proc = fixture("hybrid")  # 3 CPUs
    assert usable_cores(root, proc, affinity=2) == 2
    root, proc = fixture("v2_max")  # no quota
    assert usable_cores(root, proc, affinity=5) == 5


def test_collect_cpu_with_a_quota_warns_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # a warning of their own
        monkeypatch.delenv(name, raising=False)
    root, proc = fixture("v2_quota")
    cpu = collect_cpu(cgroup_root=root, proc_cgroup=proc)
    assert cpu.cgroup_cpu_limit == 1.5
    assert cpu.usable_cores == 1
    assert cpu.to_dict()["usable_cores"] == 1
    assert cpu.logical_cores == os.cpu_count()
    if cpu.logical_cores > 1:
        (warning,) = hardware_warnings(cpu, ShmInfo("/dev/shm", 8 * GIB, 8 * GIB), ())
        assert "cgroup CPU quota is 1.5 CPUs" in warning
        assert f"only 1 of {cpu.logical_cores} logical cores" in warning


def test_affinity_mask_smaller_than_the_machine_warns(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):  # a warning of their own
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    root, proc = fixture("v2_max")
    cpu = collect_cpu(cgroup_root=root, proc_cgroup=proc)
    assert (cpu.logical_cores, cpu.affinity_cores, cpu.usable_cores) == (4, 1, 1)
    (warning,) = hardware_warnings(cpu, ShmInfo("/dev/shm", 8 * GIB, 8 * GIB), ())
    assert "affinity mask allows 1" in warning
    assert "cgroup" not in warning
    # A quota of half a core inside a one-core mask throttles it too: named beside the mask (the table named both).
    half = dataclasses.replace(cpu, cgroup_cpu_limit=0.5)
    (warning,) = hardware_warnings(half, ShmInfo("/dev/shm", 8 * GIB, 8 * GIB), ())
    assert "affinity mask allows 1" in warning and "the cgroup CPU quota is 0.5 CPUs" in warning


@pytest.mark.parametrize(("env", "warned"), [
    ({"OMP_NUM_THREADS": "1"}, "OMP_NUM_THREADS=1 is set in the environment: torch's own thread count (threads auto, as the "
                               "PyTorch defaults run) is 1, set by it, not the 4 usable cores"),
    ({"OMP_NUM_THREADS": "4", "MKL_NUM_THREADS": "2"}, "OMP_NUM_THREADS=4 and MKL_NUM_THREADS=2 are set"),  # MKL's first
    ({"OMP_NUM_THREADS": "4"}, None),  # the usable cores: torch's own count anyway
    ({"OMP_NUM_THREADS": "abc"}, None),  # no count: torch ignores it (libgomp says so) and counts the cores
    ({"OMP_NUM_THREADS": "0", "MKL_NUM_THREADS": ""}, None),
    ({}, None),
])
def test_thread_variables_that_set_torch_s_own_count_are_recorded_and_a_warning(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], warned: str | None
) -> None:
    """A search under OMP_NUM_THREADS=1 measured torch's own count as 1 thread without a word; its best.json said `auto`."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    root, proc = fixture("v2_max")
    cpu = collect_cpu(cgroup_root=root, proc_cgroup=proc)
    assert cpu.to_dict()["thread_env"] == env
    said = hardware_warnings(cpu, ShmInfo("/dev/shm", 8 * GIB, 8 * GIB), ())
    assert said == () if warned is None else (len(said) == 1 and said[0].startswith(warned)), said


def test_a_thread_variable_above_the_cores_is_the_count_torch_runs_not_the_one_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """OMP_NUM_THREADS=8 on a 2-core machine: torch 2.14 ran 2 threads, and the probe warned that torch's count
    "follows it, not the 2 usable cores". Above the logical cores the count is what a fresh torch process reports."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    cores = os.cpu_count() or 1
    asked = {"OMP_NUM_THREADS": str(cores + 6)}
    fresh = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], capture_output=True, text=True,
                           env={**os.environ, **asked}, check=True).stdout.split()[-1]
    assert env_threads(asked, cores) == int(fresh)  # measured, whatever this machine's OpenMP runtime makes of it
    assert env_threads({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "2,1"}, cores) == 2 and env_threads({"OMP_NUM_THREADS": "0"}, cores) is None
    monkeypatch.setenv("OMP_NUM_THREADS", asked["OMP_NUM_THREADS"])
    cpu = collect_cpu()
    assert cpu.env_threads == int(fresh)
    said = [w for w in hardware_warnings(cpu, ShmInfo("/dev/shm", 8 * GIB, 8 * GIB), ()) if "OMP_NUM_THREADS" in w]
    assert (said == []) if int(fresh) == cpu.usable_cores else (f"is {fresh}, set by it, not the" in said[0])
    monkeypatch.setattr("probes.cpu.subprocess.run", lambda *a, **k: (_ for _ in ()).throw(OSError("no fork")))
    assert env_threads(asked, cores) == cores + 6  # torch cannot be asked: the variable's count


def test_read_cpuinfo(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text(
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
        "flags\t\t: fpu sse2 avx512f avx512_bf16 amx_bf16 amx_tile\n\nprocessor\t: 1\n"
    )
    model, flags = read_cpuinfo(path)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert flags is not None and {"avx512_bf16", "amx_bf16"} <= flags
    assert read_cpuinfo(tmp_path / "missing") == (None, None)


def test_cpu_without_bf16_flags(tmp_path: Path) -> None:
    path = tmp_path / "cpuinfo"
    path.write_text("model name\t: Old CPU\nflags\t\t: fpu sse2 avx2 avx512f\n")
    cpu = collect_cpu(cpuinfo=path)
    assert (cpu.model, cpu.bf16, cpu.bf16_flags) == ("Old CPU", False, ())
    path.write_text("model name\t: New CPU\nflags\t\t: fpu avx512f amx_bf16 avx512_bf16\n")
    cpu = collect_cpu(cpuinfo=path)
    assert cpu.bf16 is True
    assert cpu.bf16_flags == ("amx_bf16", "avx512_bf16")


# --------------------------------------------------------------------------- /dev/shm


def test_small_shm_warns_with_the_fix() -> None:
    cpu = collect_cpu()
    (warning,) = hardware_warnings(cpu, ShmInfo("/dev/shm", 64 * MIB, 60 * MIB), ())
    assert "64 MiB" in warning
    assert "--shm-size" in warning
    assert "bus error" in warning
    assert hardware_warnings(cpu, ShmInfo("/dev/shm", 2 * GIB, 2 * GIB), ()) == ()


def _address_space(limit: int) -> Any:
    """A ``preexec_fn`` giving the child process a ``ulimit -v`` of ``limit`` bytes."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))


def test_an_address_space_limit_is_reported_and_warned_of() -> None:
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    assert address_space_limit() == (None if soft == resource.RLIM_INFINITY else soft)
    probed = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json"], capture_output=True, text=True, timeout=120,
                            preexec_fn=_address_space(16 * GIB))
    data = json.loads(probed.stdout)
    assert data["memory"]["address_space_limit_bytes"] == 16 * GIB
    assert [w for w in data["warnings"] if w.startswith("ulimit -v limits this process to 16.0 GiB of address space")]
    tables = subprocess.run([sys.executable, "-m", "autotune", "probe"], capture_output=True, text=True, timeout=120,
                            preexec_fn=_address_space(16 * GIB))
    assert "(ulimit -v 16.0 GiB)" in tables.stdout


def test_a_command_the_address_space_limit_breaks_ends_in_one_line_naming_it() -> None:
    # Under 1 GiB, torch's libraries cannot even be mapped: one line, not a traceback, naming the limit.
    ran = subprocess.run([sys.executable, "-m", "autotune", "trial", "--model", "resnet18", "--device", "cpu"],
                         capture_output=True, text=True, timeout=120, preexec_fn=_address_space(GIB))
    lines = ran.stderr.strip().splitlines()
    assert ran.returncode == 1 and len(lines) == 1, ran.stderr
    assert lines[0].startswith(("error: import failed: ", "error: out of memory")), lines[0]
    assert lines[0].endswith("(ulimit -v limits this process to 1.0 GiB of address space)"), lines[0]


def test_missing_shm_gives_null_sizes(tmp_path: Path) -> None:
    shm = probes.collect_shm(str(tmp_path / "no-such-dir"))
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert shm.to_dict() == {"path": str(tmp_path / "no-such-dir"), "total_bytes": None, "free_bytes": None, "writable": False,
                             "open_files_limit": None if limit == resource.RLIM_INFINITY else limit}


def _open_files(limit: int) -> Any:
    """A ``preexec_fn`` giving the child process a ``ulimit -n`` of ``limit`` (soft and hard, as the shell's ulimit -n)."""
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


@pytest.mark.slow
def test_a_low_open_files_limit_is_warned_of_and_named_where_a_loader_worker_meets_it() -> None:
    """Under `ulimit -n 32` nothing said so, and a trial with 2 workers read `a DataLoader worker exited unexpectedly ...:
    it was killed, or ended by a signal`, where plain torch says `Too many open files`."""
    cpu = collect_cpu()
    (warning,) = hardware_warnings(cpu, ShmInfo("/dev/shm", 8 * GIB, 8 * GIB, open_files_limit=64), ())
    assert warning.startswith("ulimit -n allows this process 64 open files: DataLoader workers") and "ulimit -n 4096" in warning
    assert hardware_warnings(cpu, ShmInfo("/dev/shm", 8 * GIB, 8 * GIB, open_files_limit=1024), ()) == ()
    ran = subprocess.run([sys.executable, "-m", "autotune", "trial", "--model", "resnet18", "--image-size", "32", "--batch-size", "4",
                          "--workers", "2", "--prefetch", "8", "--trial-seconds", "2", "--device", "cpu", "--synthetic-images", "64",
                          "--json"], capture_output=True, text=True, timeout=300, preexec_fn=_open_files(32))
    result = json.loads(ran.stdout)
    assert ran.returncode == 1 and result["status"] == "error", ran.stdout
    # Which side meets the limit first is the machine's timing: a worker ending as it hands a batch over (the line says
    # how workers hand batches over) or torch's own `Too many open files` in the parent. Either names the limit and its fix.
    said = result["error"]
    assert "(ulimit -n allows this process 32 open files" in said and said.endswith("raise it, ulimit -n 4096)"), said
    assert "exited unexpectedly while it handed a batch over" not in said or "and loader workers hand each batch over" in said, said


def test_an_error_of_a_process_limit_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """`ulimit -u` reached: `RuntimeError: can't start new thread` or a bare `BlockingIOError: [Errno 11] Resource
    temporarily unavailable`; run out of descriptors: `Too many open files`. Each now names its limit."""
    import errno

    from autotune.runner import failures

    monkeypatch.setattr(failures, "open_files_limit", lambda: 32)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (8, 8) if which == resource.RLIMIT_NPROC else (32, 32))
    said = failures.classify(OSError(errno.EMFILE, "Too many open files")).error or ""
    assert said.endswith("(ulimit -n allows this process 32 open files: raise it, ulimit -n 4096)"), said
    monkeypatch.setattr(failures, "open_files_limit", lambda: 65536)  # a high limit met: no advice to lower it
    assert failures.limit_hint(OSError(errno.EMFILE, "x")) == " (ulimit -n allows this process 65536 open files: does something keep its files open?)"
    assert failures.limit_hint(OSError(errno.ENFILE, "x")) == " (the system's table of open files is full: fs.file-max)"

    def raised(exc: BaseException, where: str) -> BaseException:  # ``exc`` as raised by code of the file ``where``
        try:
            exec(compile("raise exc", where, "exec"), {"exc": exc})
        except BaseException as caught:
            return caught
        raise AssertionError

    started = raised(BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable"), "/usr/lib/python3/multiprocessing/popen_fork.py")
    for exc in (RuntimeError("can't start new thread"), started):
        said = failures.classify(exc).error or ""
        assert said.endswith("(ulimit -u allows this user 8 processes and threads, every one of theirs counted: torch's threads "
                             "and the loader's workers need more; raise it, or a container's pids.max)"), said
    # Non-blocking I/O's own EAGAIN (a lock another worker holds): no limit met.
    assert failures.limit_hint(raised(BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable"), "/data/cache.py")) == ""
    assert failures.limit_hint(ValueError("x")) == ""


# --------------------------------------------------------------------------- NVML (fake pynvml)


class FakeNvml:
    """Builds a fake ``pynvml`` module from a list of device descriptions."""

    def __init__(self, devices: list[dict[str, Any]], init_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.failing: set[tuple[int, str]] = set()
        self.calls: list[str] = []

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("pynvml")

        class NVMLError(Exception):
            def __init__(self, value: int) -> None:
                super().__init__(value)
                self.value = value

            def __str__(self) -> str:
                return {3: "Not Supported", 9: "Driver Not Loaded", 12: "NVML Shared Library Not Found"}.get(
                    self.value, f"error {self.value}"
                )

        class NVMLError_LibraryNotFound(NVMLError):
            pass

        mod.NVMLError = NVMLError
        mod.NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
        mod.NVML_ERROR_NOT_SUPPORTED = 3
        mod.NVML_ERROR_DRIVER_NOT_LOADED = 9
        mod.NVML_ERROR_LIBRARY_NOT_FOUND = 12

        def init() -> None:
            self.calls.append("init")
            if self.init_error == 12:
                raise NVMLError_LibraryNotFound(12)
            if self.init_error is not None:
                raise NVMLError(self.init_error)

        def shutdown() -> None:
            self.calls.append("shutdown")

        def per_device(fn: str, getter: Any) -> Any:
            def call(handle: int, *args: Any) -> Any:
                if (handle, fn) in self.failing:
                    raise NVMLError(3)
                return getter(self.devices[handle], *args)

            return call

        mod.nvmlInit = init
        mod.nvmlShutdown = shutdown
        def count() -> int:
            if (-1, "nvmlDeviceGetCount") in self.failing:
                raise NVMLError(999)
            return len(self.devices)

        mod.nvmlDeviceGetCount = count
        mod.nvmlSystemGetDriverVersion = lambda: "580.95.05"
        mod.nvmlDeviceGetHandleByIndex = lambda i: i
        getters = {
            "nvmlDeviceGetName": lambda d: d["name"],
            "nvmlDeviceGetUUID": lambda d: d.get("uuid", "GPU-0000"),
            "nvmlDeviceGetMemoryInfo": lambda d: types.SimpleNamespace(
                total=d["total"], free=d["free"], used=d["total"] - d["free"]
            ),
            "nvmlDeviceGetCudaComputeCapability": lambda d: d["cc"],
            "nvmlDeviceGetCurrPcieLinkGeneration": lambda d: d["gen"],
            "nvmlDeviceGetCurrPcieLinkWidth": lambda d: d["width"],
            "nvmlDeviceGetMaxPcieLinkGeneration": lambda d: d["gen"],
            "nvmlDeviceGetMaxPcieLinkWidth": lambda d: d["width"],
            "nvmlDeviceGetComputeRunningProcesses": lambda d: [
                types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in d.get("procs", [])
            ],
            "nvmlDeviceGetGraphicsRunningProcesses": lambda d: [],
            # NVML's mask: 64 CPUs a word, as many words as asked for (those beyond the device's are 0).
            "nvmlDeviceGetCpuAffinity": lambda d, words: (list(d.get("near", [0xFF])) + [0] * words)[:words],
        }
        for fn, getter in getters.items():
            setattr(mod, fn, per_device(fn, getter))
        return mod


def h100(**overrides: Any) -> dict[str, Any]:
    device = {"name": b"NVIDIA H100 80GB HBM3", "uuid": "GPU-aaaa", "total": 80 * GIB, "free": 79 * GIB,
              "cc": (9, 0), "gen": 5, "width": 16}
    return device | overrides


def t4(**overrides: Any) -> dict[str, Any]:
    device = {"name": "Tesla T4", "uuid": "GPU-bbbb", "total": 16 * GIB, "free": 15 * GIB,
              "cc": (7, 5), "gen": 3, "width": 8}
    return device | overrides


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    """Install a FakeNvml as ``pynvml``; tests change its devices / errors afterwards."""
    fake = FakeNvml([h100(), t4()])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    # cuDNN would need a real torch import (slow); the lookup itself is tested separately.
    monkeypatch.setattr(probes.software, "cudnn_version", lambda: "9.24.0")
    return fake


def test_nvml_is_read_without_a_thread_where_none_can_be_started(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    """`ulimit -u` reached: the reader thread's start raised `can't start new thread`, an internal error (exit 3)."""
    import threading

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(threading.Thread, "start", refused)
    assert [gpu.name for gpu in collect_gpus().gpus] == ["NVIDIA H100 80GB HBM3", "Tesla T4"]

    def interrupted() -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sys.modules["pynvml"], "nvmlInit", interrupted)
    with pytest.raises(KeyboardInterrupt):  # read inline, a Ctrl-C (or SIGTERM) stops the command: it is no "NVML failed"
        collect_gpus()


def test_nvml_two_gpus_full_data(fake_nvml: FakeNvml) -> None:
    report = collect_gpus()
    assert report.error is None and report.driver_loaded
    first, second = report.gpus
    assert first.to_dict() | {"query_errors": {}} == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",  # bytes from NVML decoded
        "uuid": "GPU-aaaa",
        "memory_total_bytes": 80 * GIB,
        "memory_free_bytes": 79 * GIB,
        "memory_used_by_others_bytes": 1 * GIB,
        "other_processes": 0,
        "compute_capability": "9.0",
        "bf16": True,
        "tf32": True,
        "driver_version": "580.95.05",
        "pcie_generation": 5,
        "pcie_width": 16,
        "pcie_max_generation": 5,
        "pcie_max_width": 16,
        "cpu_affinity": [0, 1, 2, 3, 4, 5, 6, 7],
        "query_errors": {},
    }
    assert first.query_errors == ()
    assert (second.index, second.name, second.compute_capability) == (1, "Tesla T4", "7.5")
    assert (second.bf16, second.tf32) == (False, False)
    assert (second.pcie_generation, second.pcie_width) == (3, 8)
    assert fake_nvml.calls == ["init", "shutdown"]


@pytest.mark.parametrize(
    ("cc", "text", "tensor_cores"),
    [
        ((7, 0), "7.0", False),
        ((7, 5), "7.5", False),
        ((8, 0), "8.0", True),
        ((8, 9), "8.9", True),
        ((10, 0), "10.0", True),
    ],
)
def test_nvml_compute_capability_decides_bf16_and_tf32(
    fake_nvml: FakeNvml, cc: tuple[int, int], text: str, tensor_cores: bool
) -> None:
    fake_nvml.devices = [h100(cc=cc)]
    (gpu,) = collect_gpus().gpus
    assert (gpu.compute_capability, gpu.bf16, gpu.tf32) == (text, tensor_cores, tensor_cores)


def test_nvml_cpu_affinity_reads_the_mask_s_words_as_cpu_ids(fake_nvml: FakeNvml, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(probes.gpu, "_CPU_SET_WORDS", 2)  # a machine of up to 128 CPUs
    fake_nvml.devices = [h100(near=[0, 0b101]), h100(near=[0xF0]), h100(near=[0, 0])]
    first, second, third = collect_gpus().gpus
    assert first.cpu_affinity == (64, 66) and second.cpu_affinity == (4, 5, 6, 7)
    assert third.cpu_affinity is None  # an empty mask names no CPU: nothing to prefer
    fake_nvml.failing = {(0, "nvmlDeviceGetCpuAffinity")}
    first = collect_gpus().gpus[0]
    assert first.cpu_affinity is None and dict(first.query_errors) == {"cpu_affinity": "Not Supported"}
    assert first.name == "NVIDIA H100 80GB HBM3"


def test_nvml_one_failing_query_keeps_the_other_fields(fake_nvml: FakeNvml) -> None:
    fake_nvml.failing = {(0, "nvmlDeviceGetCurrPcieLinkGeneration"), (1, "nvmlDeviceGetCudaComputeCapability")}
    first, second = collect_gpus().gpus
    assert first.pcie_generation is None
    assert first.pcie_width == 16
    assert first.name == "NVIDIA H100 80GB HBM3"
    assert (first.compute_capability, first.memory_total_bytes) == ("9.0", 80 * GIB)
    assert dict(first.query_errors) == {"pcie_generation": "Not Supported"}
    assert (second.compute_capability, second.bf16, second.tf32) == (None, None, None)
    assert second.memory_total_bytes == 16 * GIB
    assert fake_nvml.calls == ["init", "shutdown"]


def test_nvml_library_missing(fake_nvml: FakeNvml) -> None:
    fake_nvml.init_error = 12
    report = collect_gpus()
    assert report.gpus == () and not report.driver_loaded
    assert report.error is not None and "NVML library not found" in report.error
    hw = probes.collect()
    assert hw.gpus == () and hw.gpu_error == report.error
    assert hw.to_dict()["gpus"] == []
    assert hw.software.cuda is None and hw.software.cudnn is None


def test_nvml_driver_not_loaded(fake_nvml: FakeNvml) -> None:
    fake_nvml.init_error = 9
    report = collect_gpus()
    assert report.gpus == ()
    assert report.error is not None and "driver not loaded" in report.error


def test_nvml_failure_after_init_still_shuts_down(fake_nvml: FakeNvml) -> None:
    fake_nvml.failing = {(-1, "nvmlDeviceGetCount")}
    report = collect_gpus()
    assert report.gpus == () and report.driver_loaded
    assert report.error == "NVML could not count the GPUs: error 999"
    assert fake_nvml.calls == ["init", "shutdown"]


def test_nvidia_ml_py_not_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    report = collect_gpus()
    assert report.gpus == () and report.error is not None and "nvidia-ml-py" in report.error


def test_a_pynvml_that_raises_as_it_loads_leaves_the_rest_of_the_probe(tmp_path: Path) -> None:
    """A broken build (an undefined symbol) or a shim that raises at import: `autotune probe` failed whole, and a CPU
    search ended in an internal error (exit 3), though it needs no NVML."""
    (tmp_path / "pynvml.py").write_text('raise RuntimeError("broken pynvml build: undefined symbol nvmlFoo")\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["gpu_error"] == "nvidia-ml-py failed to import: broken pynvml build: undefined symbol nvmlFoo" and report["cpu"]["usable_cores"] >= 1


def test_an_nvml_that_never_answers_leaves_the_rest_of_the_probe(tmp_path: Path) -> None:
    """A hung NVIDIA driver blocks nvmlInit (and nvidia-smi) for good: `autotune probe`, and every search, which starts
    with it, hung with it. The probe gives up on NVML after NVML_TIMEOUT_S, says so, and exits."""
    (tmp_path / "pynvml.py").write_text("import time\n\ndef nvmlInit():\n    time.sleep(3600)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    code = "import runpy, probes.gpu; probes.gpu.NVML_TIMEOUT_S = 1; runpy.run_module('autotune', run_name='__main__')"
    done = subprocess.run([sys.executable, "-c", code, "probe", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["gpu_error"] == ("NVML did not answer within 1 s (a hung NVIDIA driver or GPU: nvidia-smi would hang too), so "
                                   "the GPUs are unknown")
    assert report["gpus"] == [] and report["cpu"]["usable_cores"] >= 1
    # --device auto on such a host ran an hours-long CPU search of a GPU machine without a word: refused in one line.
    search = [sys.executable, "-c", code, "search", "--model", "resnet18", "--trials", "2", "--out", str(tmp_path / "out")]
    refused = subprocess.run(search, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "error: --device auto cannot tell whether this machine has a GPU: NVML did not answer within 1 s (a hung NVIDIA driver "
        "or GPU: nvidia-smi would hang too), so the GPUs are unknown; pass --device cpu to search the CPU, or --device cuda "
        "once nvidia-smi answers"), refused.stderr
    assert not (tmp_path / "out").exists()


def test_an_nvml_whose_reading_dies_is_said_as_such_not_as_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading thread's death (a shim's SystemExit) read as `NVML did not answer within 30 s`, after the 30 s."""
    shim = types.ModuleType("pynvml")

    def exits() -> None:
        raise SystemExit(3)

    shim.nvmlInit = exits  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pynvml", shim)
    report = collect_gpus()  # a hang's line would say "did not answer" (after the timeout): the words tell, not a clock
    assert report.gpus == () and report.error is not None and report.error.startswith("NVML failed: "), report.error


def test_gpu_mostly_used_by_others_warns(fake_nvml: FakeNvml) -> None:
    # GPU 0: 80 % taken by another process; GPU 1: 60 % taken, but by us.
    fake_nvml.devices = [
        h100(free=16 * GIB, procs=[(424242, 64 * GIB)]),
        t4(free=6 * GIB, procs=[(os.getpid(), 10 * GIB)]),
    ]
    hw = probes.collect()
    gpu0, gpu1 = hw.gpus
    assert gpu0.memory_used_by_others_bytes == 64 * GIB and gpu0.other_processes == 1
    assert gpu1.memory_used_by_others_bytes == 0 and gpu1.other_processes == 0
    gpu_warnings = [w for w in hw.warnings if w.startswith("GPU")]
    assert len(gpu_warnings) == 1
    assert gpu_warnings[0].startswith("GPU 0 (NVIDIA H100 80GB HBM3): 80%")
    # With a driver, the CUDA version torch was built with is reported.
    assert hw.software.cuda == torch_cuda_build() and hw.software.cudnn == "9.24.0"


# --------------------------------------------------------------------------- software


def test_torch_cuda_build_matches_torch_version_without_importing_torch() -> None:
    code = (
        "import sys, probes.software as s; build = s.torch_cuda_build(); assert 'torch' not in sys.modules; "
        "import torch; print(repr(build), repr(torch.version.cuda))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    ours, theirs = result.stdout.split()
    assert ours == theirs


def test_autotune_s_version_is_read_from_a_checkout_run_in_place(tmp_path, monkeypatch) -> None:
    """A checkout on the import path without an installed distribution (the GPU machine's PYTHONPATH=.): its
    _version.py, read without importing autotune, where the probe showed '-' before."""
    import importlib.metadata

    import probes.software as software
    from autotune import __version__

    assert software.autotune_version() == __version__  # installed (editable) here
    real = importlib.metadata.version

    def not_installed(name: str) -> str:
        if name == "autotune":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert software.package_version("autotune") is None
    assert software.autotune_version() == __version__
    (tmp_path / "autotune").mkdir()
    (tmp_path / "autotune" / "__init__.py").write_text("")
    (tmp_path / "autotune" / "_version.py").write_text('__version__ = "9.9.9"\n')
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import importlib.metadata as m; m.version = lambda n: "
            "(_ for _ in ()).throw(m.PackageNotFoundError(n)); import probes.software as s; v = s.autotune_version(); "
            "assert 'autotune' not in sys.modules, 'imported'; print(v)")
    shown = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60, check=True)
    assert shown.stdout.strip() == "9.9.9"


@pytest.mark.parametrize(("raw", "text"), [(92400, "9.24.0"), (90100, "9.1.0"), (8902, "8.9.2"), (8700, "8.7.0")])
def test_format_cudnn_version(raw: int, text: str) -> None:
    assert format_cudnn_version(raw) == text


# --------------------------------------------------------------------------- rendering


def _render_text(hw: Hardware, width: int = 120) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(probes.render(hw))
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_render_with_gpus_and_warnings(fake_nvml: FakeNvml) -> None:
    fake_nvml.devices = [h100(free=16 * GIB, procs=[(424242, 64 * GIB)])]
    text = _render_text(probes.collect())
    assert "NVIDIA H100 80GB HBM3" in text
    assert "9.0" in text and "gen5 x16" in text
    assert "64.0 GiB / 80.0 GiB" in text
    assert "warnings" in text and "80%" in text


def test_render_in_a_narrow_terminal_keeps_every_version_whole() -> None:
    """Too narrow for the one-row Software table (COLUMNS=40), each version goes on its own line instead of
    being cut to ``2.1…``; where the row fits, it stays one row."""
    hw = probes.collect()
    versions = [hw.software.python, hw.software.torch, hw.software.torchvision, hw.software.optuna, hw.software.autotune]
    for width in (40, 120):
        lines = _render_text(hw, width).splitlines()
        software = lines[next(i for i, line in enumerate(lines) if line.strip() == "Software"):]
        for name, version in zip(("python", "torch", "torchvision", "optuna", "autotune"), versions, strict=True):
            assert version is not None and any(version in line for line in software), (width, version, software)
            row = any(line.split() == [name, version] for line in software)
            assert row is (width == 40), (width, name, software)
        assert "…" not in "".join(software)


def test_render_without_gpu_shows_the_reason() -> None:
    hw = probes.collect()
    text = _render_text(hw)
    assert hw.gpu_error is not None and hw.gpu_error in text
    assert f"{hw.cpu.usable_cores} usable of {hw.cpu.logical_cores} logical" in text
    assert "GiB" in text


# --------------------------------------------------------------------------- CLI


runner = CliRunner()


def test_cli_probe_json_is_one_json_object() -> None:
    result = runner.invoke(app, ["probe", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # raises on anything but exactly one JSON document
    assert isinstance(data, dict)
    assert data["cpu"]["logical_cores"] == os.cpu_count()
    assert data["gpus"] == [] and data["gpu_error"]


def test_a_closed_stdout_ends_the_command_quietly_and_other_broken_pipes_are_errors() -> None:
    """``autotune probe --json | head -c0``: the reader went away, which is no error to report (exit 1, nothing said),
    as without --json; a broken pipe elsewhere, with stdout still read, stays an error."""
    from autotune.cli_errors import reader_gone

    for args in (["probe", "--json"], ["probe"]):
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            done = subprocess.run([sys.executable, "-m", "autotune", *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
        finally:
            os.close(write_end)
        assert done.returncode == 1 and done.stderr == "", (args, done.stderr)
    saved = os.dup(1)
    try:  # fd 1 a pipe, its reader alive: another broken pipe stays an error; its reader gone: the command ends quietly
        read_end, write_end = os.pipe()
        os.dup2(write_end, 1)
        os.close(write_end)
        assert not reader_gone(BrokenPipeError(32, "Broken pipe"))
        assert not reader_gone(OSError(28, "No space left on device"))
        os.close(read_end)
        assert reader_gone(BrokenPipeError(32, "Broken pipe"))
        assert os.write(1, b"x") == 1  # stdout now goes to /dev/null
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def test_a_closed_stderr_leaves_the_progress_lines_to_dev_null_and_the_work_goes_on(tmp_path: Path) -> None:
    """``autotune search ... 2>&1 | head -3``: the search's progress on stderr met the closed pipe mid-calibration and
    the search ended, exit 1, without a word; its lines now go to /dev/null and the search goes on, also while the
    progress bar of a terminal (FORCE_COLOR here) holds sys.stderr in Rich's proxy."""
    code = ("import sys, time\n"
            "from autotune.render import RichReporter, console\n"
            "with RichReporter(console(stderr=True)) as reporter:\n"
            "    reporter._bar('trials', 10)  # the progress display: Rich proxies sys.stderr on a terminal\n"
            "    for i in range(100):\n"
            "        reporter.message(f'calibration line {i} ' + 'x' * 200)\n"
            "        time.sleep(0.01)\n"
            "open(sys.argv[1], 'w').write('went on')\n")
    for terminal in ("", "1"):  # a pipe; and one Rich takes for a terminal
        done = tmp_path / f"done{terminal}"
        read_end, write_end = os.pipe()
        child = subprocess.Popen([sys.executable, "-c", code, str(done)], stdout=write_end, stderr=write_end,
                                 env={**os.environ, "FORCE_COLOR": terminal} if terminal else None)
        os.close(write_end)
        os.read(read_end, 100)  # the reader takes its first lines, then goes away (head)
        os.close(read_end)
        assert child.wait(timeout=120) == 0 and done.read_text() == "went on", terminal
    # A process without stderr (pythonw): Rich's stand-in, as before, not an AttributeError at the first line.
    from autotune.render import console

    saved = sys.stderr
    try:
        sys.stderr = None  # type: ignore[assignment]
        console(stderr=True).print("nowhere")
    finally:
        sys.stderr = saved


def test_cli_probe_prints_tables() -> None:
    result = runner.invoke(app, ["probe"])
    assert result.exit_code == 0, result.output
    assert "System" in result.stdout and "Software" in result.stdout
    assert f"usable of {os.cpu_count()} logical" in result.stdout
    with pytest.raises(json.JSONDecodeError):
        json.loads(result.stdout)


def test_cli_probe_failure_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> Hardware:
        raise RuntimeError("cannot read /proc")

    monkeypatch.setattr(probes, "collect", broken)
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    result = runner.invoke(app, ["probe"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert "probe failed" in lines[0] and "RuntimeError: cannot read /proc" in lines[0]
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_cli_version_and_help() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"autotune {importlib.metadata.version('autotune')}"
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "probe" in result.stdout


def test_gpu_info_is_immutable_and_hashable() -> None:
    gpu = GpuInfo(index=0, query_errors=(("name", "Not Supported"),))
    with pytest.raises(AttributeError):
        gpu.name = "x"  # type: ignore[misc]
    hash(gpu)
    assert gpu.to_dict()["query_errors"] == {"name": "Not Supported"}


def test_render_says_an_unread_pcie_generation_as_unknown(fake_nvml: FakeNvml) -> None:
    """A GPU whose link generation NVML cannot read (some vGPUs) rendered as "genn/a x16"."""
    fake_nvml.failing = {(0, "nvmlDeviceGetCurrPcieLinkGeneration")}
    text = _render_text(probes.collect())
    assert "gen ? x16" in text and "genn/a" not in text


def test_cpus_in_topology_order_keep_a_core_s_hyperthreads_and_a_socket_together(tmp_path: Path) -> None:
    """Linux numbers a two-socket SMT host's CPUs socket 0's cores, socket 1's, then their second hyperthreads (as a DGX
    H100 does, 0-55, 56-111, 112-223): parallel trials' contiguous shares in that order put cuda:k+4's trial on the
    hyperthreads of cuda:k's cores and cuda:2's on the far socket. In topology order each share is whole cores of one
    socket. Here 2 sockets x 2 cores x 2 threads, written as sysfs does."""
    from autotune.runner.ranks import share
    from probes.cpu import in_topology_order

    for cpu in range(8):  # cpu -> (socket, core): 0,1 on socket 0; 2,3 on socket 1; 4-7 their second threads
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text(f"{(cpu % 4) // 2}\n")
        (topology / "core_id").write_text(f"{cpu % 2}\n")
    order = in_topology_order(list(range(8)), tmp_path)
    assert order == (0, 4, 1, 5, 2, 6, 3, 7)
    assert [share(order, 2, k) for k in range(2)] == [(0, 4, 1, 5), (2, 6, 3, 7)]  # a socket each
    assert [share(order, 4, k) for k in range(4)] == [(0, 4), (1, 5), (2, 6), (3, 7)]  # a whole core each
    assert in_topology_order([5, 1], tmp_path) == (1, 5)  # an affinity mask's subset: the same order
    # A CPU quota of 4 below the mask of 8: one hyperthread of each of the 4 cores (they were 2 cores' pairs), in order.
    assert in_topology_order(list(range(8)), tmp_path, keep=4) == (0, 1, 2, 3)
    assert in_topology_order(list(range(8)), tmp_path, keep=6) == (0, 4, 1, 5, 2, 3)
    (tmp_path / "cpu3" / "topology" / "core_id").unlink()  # sysfs partly hidden: the numbers' order
    assert in_topology_order([3, 0, 4], tmp_path) == (0, 3, 4)
