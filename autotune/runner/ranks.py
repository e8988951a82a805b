"""A trial of several ranks under torch.distributed, and the cores each rank runs on.

With ``TrialOptions.world_size`` N > 1 the trial process becomes the
supervisor of its world: it picks a free loopback port and forks N rank
processes with the torchrun environment (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``).
Every rank is pinned to its own share of the trial's cores, joins one
process group (gloo on a CPU, nccl on CUDA) and runs the same
:class:`~autotune.runner.child.TrialLoop`; rank 0 sends the window events.
The ranks stay in the trial's process group, so the parent's timeout kills
them all. The first rank to end badly (an exception, a signal, an exit
code) names the trial's status, and the supervisor kills the others.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.records import TrialOptions, TrialResult
from autotune.runner import measure
from autotune.runner.failures import EXTERNAL_SIGNALS, interrupted, killed
from probes.cgroup import oom_kills

#: Exit code of a rank that failed and wrote its result.
RANK_FAILED = 3
#: The address every rank of a trial meets on.
MASTER_ADDR = "127.0.0.1"
#: The gloo group of a CUDA world's host-side figures (None: the default group, gloo on a CPU).
_control: Any = None


def share(cores: Sequence[int], parts: int, index: int) -> tuple[int, ...]:
    """The ``index``-th of ``parts`` disjoint, contiguous shares of ``cores`` (the first shares get the remainder)."""
    size, extra = divmod(len(cores), parts)
    start = index * size + min(index, extra)
    return tuple(cores[start : start + size + (1 if index < extra else 0)])


def pin(cores: Sequence[int], threads: int | None = None) -> None:
    """Run this process (and the loader workers it starts) on ``cores``, with ``threads`` torch threads (default: one per core)."""
    if not cores or not hasattr(os, "sched_setaffinity"):
        return
    import torch

    os.sched_setaffinity(0, set(cores))
    torch.set_num_threads(threads or len(cores))


def torchrun_threads() -> int | None:
    """The intra-op threads a rank gets from ``torchrun --nproc-per-node N`` (N > 1): ``OMP_NUM_THREADS``, which
    torchrun sets to 1 unless the environment already names it (a nested list such as ``4,2``: its first level).
    None where the value names no positive count (``0``, empty, text): torch then keeps its own count, as in
    the script's ranks, which are not pinned. A setup's ``num_threads`` replaces it, as in the emitted script; ``auto`` (torch's
    own choice) is measured as what the script will get."""
    text = os.environ.get("OMP_NUM_THREADS")
    if text is None:
        return 1
    try:
        count = int(text.split(",")[0])
    except ValueError:
        return None
    return count if count > 0 else None


def free_port() -> int:
    """A TCP port free on the loopback interface now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((MASTER_ADDR, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Rank:
    """Where this process stands in its trial's world.

    Attributes:
        rank: This process's rank (0 when alone).
        world_size: Ranks in the trial.
    """

    rank: int = 0
    world_size: int = 1

    @property
    def distributed(self) -> bool:
        """Whether the trial has more than one rank."""
        return self.world_size > 1

    def start(self, device: Any) -> None:
        """Join the process group from the torchrun environment (gloo on a CPU, nccl on CUDA)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        backend = "nccl" if device.type == "cuda" else "gloo"
        extra = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, **extra)
        global _control
        # The loop's own figures (window clocks, flags, counts) travel over gloo, on the host: an nccl
        # all_reduce read back with .tolist() would wait for the GPU's queue at every micro-step.
        _control = dist.new_group(backend="gloo") if backend == "nccl" else None

    def reduce(self, values: Sequence[float], op: str) -> list[float]:
        """``values`` summed (``op="sum"``) or maximised (``"max"``) over the ranks, on the host (never
        waiting for the device's queue); as is when alone."""
        if not self.distributed:
            return [float(v) for v in values]
        import torch
        import torch.distributed as dist

        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=_control)
        return [float(v) for v in tensor.tolist()]

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (every rank gets the same answer)."""
        return self.reduce([1.0 if flag else 0.0], "max")[0] > 0

    def shard(self, dataset: Any) -> Any:
        """This rank's share of a map-style dataset (every ``world_size``-th item); an iterable one as is, a sized one
        too (an ``IterableDataset`` inherits ``Dataset.__getitem__``, which raises: a Subset of it fails every batch)."""
        from torch.utils.data import IterableDataset, Subset

        map_style = hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__") and not isinstance(dataset, IterableDataset)
        if not self.distributed or not map_style:
            return dataset
        return Subset(dataset, range(self.rank, len(dataset), self.world_size))

    def device(self, name: str) -> str:
        """The device of this rank: ``cuda:LOCAL_RANK`` on CUDA, as under torchrun; the CPU stays the CPU."""
        return f"cuda:{self.rank}" if self.distributed and name.startswith("cuda") else name

    def stop(self) -> None:
        """Leave the process group."""
        if self.distributed:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()


Execute = Callable[[Rank], TrialResult]


def _death(rank: int, code: int, oom_before: int | None) -> TrialResult:
    """The result of a rank that died without writing one."""
    if code == -signal.SIGKILL:
        return killed(f"rank {rank}", oom_before)
    if code < 0 and -code in EXTERNAL_SIGNALS:  # as one process's trial: the search stops, nothing is stored for the setup
        return interrupted(f"rank {rank} was terminated from outside ({signal.Signals(-code).name})")
    if code < 0:
        return TrialResult(status="error", error=f"rank {rank} died of {signal.Signals(-code).name}")
    return TrialResult(status="error", error=f"rank {rank} exited with code {code} and no result")


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks)


def run_world(options: TrialOptions, execute: Execute) -> TrialResult:
    """Fork the trial's ranks, wait for them, and return the trial's result.

    Rank 0's result is the trial's, unless a rank ends badly first: then that
    rank's result (its exception classified, or its death) is, and every
    other rank is killed. A rank whose collective broke because a peer ended
    often reports first; a peer's death or own failure within
    :data:`DEATH_GRACE_S` is then the result, since it is the cause.
    """
    port = free_port()
    world = options.world_size
    oom_before = oom_kills()
    ranks: dict[int, tuple[int, int]] = {}  # pid -> (rank, read end of its result pipe)
    inherited = measure.tree_memory([os.getpid()], os.getpid(), measure.inherited_bytes)  # each rank's at the fork
    for rank in range(world):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the rank
            measure.inherited_bytes = inherited
            os.close(read_end)
            _rank_main(rank, world, port, options, execute, write_end)
        os.close(write_end)
        ranks[pid] = (rank, read_end)
    result: TrialResult | None = None
    try:
        while ranks and result is None:
            pid, status = os.wait()
            if pid not in ranks:
                continue
            rank, read_end = ranks.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            payload = _read_all(read_end)
            if code == 0 and rank == 0:
                result = TrialResult.from_dict(json.loads(payload))
            elif code == RANK_FAILED and payload:
                failed = TrialResult.from_dict(json.loads(payload))
                result = TrialResult(**{**failed.to_dict(), "error": f"rank {rank}: {failed.error}"})
                if _collective(failed.error):  # a peer's end broke the collective: the peer's own failure is the cause
                    result = _cause_among(ranks, oom_before) or result
            elif code != 0:
                result = _death(rank, code, oom_before)
    finally:
        for pid, (_, read_end) in ranks.items():
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except OSError:
                pass
            os.close(read_end)
    return result or TrialResult(status="error", error="no rank reported a result")


#: Seconds the peers of a rank whose collective broke are given to show their own failure (the cause) before they are killed.
DEATH_GRACE_S = 2.0
#: Words of the errors a collective raises when a peer is gone (gloo, NCCL): the peer's failure is the cause.
COLLECTIVE_ERRORS = ("connection closed by peer", "connection reset by peer", "broken pipe", "gloo", "nccl", "processgroup")


def _collective(error: str | None) -> bool:
    """Whether a rank's error is a collective broken by a peer's end rather than its own failure."""
    text = (error or "").lower()
    return any(word in text for word in COLLECTIVE_ERRORS)


def _cause_among(ranks: dict[int, tuple[int, int]], oom_before: int | None) -> TrialResult | None:
    """Within :data:`DEATH_GRACE_S`, the first peer in ``ranks`` (reaped and removed) that died of a signal or failed
    with an error of its own (not another broken collective); None if none did."""
    deadline = time.monotonic() + DEATH_GRACE_S
    while ranks and time.monotonic() < deadline:
        for pid in list(ranks):
            done, status = os.waitpid(pid, os.WNOHANG)
            if not done:
                continue
            rank, read_end = ranks.pop(pid)
            payload = _read_all(read_end)
            code = os.waitstatus_to_exitcode(status)
            if code < 0:
                return _death(rank, code, oom_before)
            if code == RANK_FAILED and payload:
                failed = TrialResult.from_dict(json.loads(payload))
                if not _collective(failed.error):
                    return TrialResult(**{**failed.to_dict(), "error": f"rank {rank}: {failed.error}"})
        time.sleep(0.02)
    return None


def _rank_main(rank: int, world: int, port: int, options: TrialOptions, execute: Execute, out: int) -> None:
    """Run one rank in this freshly forked process, write its result to ``out``, then ``_exit``."""
    code = RANK_FAILED
    try:
        os.environ.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            LOCAL_WORLD_SIZE=str(world),
            MASTER_ADDR=MASTER_ADDR,
            MASTER_PORT=str(port),
        )
        import torch

        # None: the environment names no count, so torch keeps its own (the script's ranks are not pinned).
        threads = torchrun_threads() or torch.get_num_threads()
        os.environ.setdefault("OMP_NUM_THREADS", "1")  # as torchrun sets it
        pin(share(options.cores, world, rank), threads)
        result = execute(Rank(rank, world))
        data = json.dumps(result.to_dict()).encode()
        while data:
            data = data[os.write(out, data) :]
        code = 0 if result.ok else RANK_FAILED
    except BaseException:  # pragma: no cover - execute() returns failures as results
        code = RANK_FAILED
    finally:
        os._exit(code)
