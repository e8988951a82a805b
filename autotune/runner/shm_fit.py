"""Whether a setup's batches in flight fit /dev/shm, read from its loader's first batch.

Loader workers hand every batch over through /dev/shm, and the DataLoader keeps up to workers x prefetch of them
there. Where they cannot fit (a container's default 64 MiB), the setup fails once the queue fills, which a short
trial whose training outpaced its loader may never reach: in an 8 MiB /dev/shm a setup of 2 workers x prefetch 6 x
batch 32 at 64 px (18 MiB in flight) measured `ok` at 43 samples/s, then failed in every confirmation round and in
every run alone, and the emitted script would have failed once a slower step (a checkpoint, a validation) let its
queue fill.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from autotune.nested import tensors
from autotune.runner.failures import SHM_TOO_SMALL, ShmTooSmall
from autotune.train_setup import TrainSetup
from autotune.units import format_bytes
from probes.memory import collect_shm

__all__ = ["ShmTooSmall", "batch_bytes", "checked_in_flight"]


def batch_bytes(batch: Any) -> int:
    """Bytes of the tensors' storages in ``batch`` (any nesting :func:`autotune.nested.tensors` reads), each storage
    counted once; a tensor without a plain storage (sparse, jagged nested) is not counted (its dense size would
    count what it does not hold)."""
    seen: dict[int, int] = {}
    for tensor in tensors(batch):
        try:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
        except (NotImplementedError, RuntimeError):  # sparse and nested layouts have no storage to read
            continue
    return sum(seen.values())


def checked_in_flight(batches: Iterator[Any], setup: TrainSetup, ranks: int = 1) -> Iterator[Any]:
    """``batches``, whose first batch from loader workers raises :class:`ShmTooSmall` where workers x prefetch such
    batches (of each of ``ranks`` DDP ranks, whose loaders share this host's /dev/shm) exceed the size of /dev/shm
    (whatever is free: other processes' files come and go)."""
    if setup.num_workers == 0:
        return batches
    shm = collect_shm()
    if shm.total_bytes is None:
        return batches
    total = shm.total_bytes

    def checked() -> Iterator[Any]:
        first = next(batches)
        # Pinning moves each batch out of /dev/shm as it arrives: only those in the workers' hands stay there.
        count = setup.num_workers + 1 if setup.pin_memory else setup.num_workers * (setup.prefetch_factor or 2)
        count *= max(1, ranks)
        try:
            need = count * batch_bytes(first)
        except Exception:  # a check that only advises never fails a trial
            need = 0
        if need > total:
            free = format_bytes(shm.free_bytes) if shm.free_bytes is not None else "?"
            raise ShmTooSmall(
                f"{shm.path} ({format_bytes(total)}, {free} free) {SHM_TOO_SMALL} (workers x prefetch x batch): "
                f"{count} batches of {format_bytes(need // count)} in flight{f' (over {ranks} ranks)' if ranks > 1 else ''} need "
                f"{format_bytes(need)}; fewer workers, a smaller prefetch or batch fit it; to search them all, give the "
                "container more shared memory (docker run --shm-size=8g or --ipc=host)")
        yield first
        yield from batches

    return checked()
