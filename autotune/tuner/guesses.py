"""The first guesses: probe-informed setups tried right after the PyTorch defaults."""

from __future__ import annotations

from autotune.devices import DeviceInfo
from autotune.records import Calibration
from autotune.train_setup import TrainSetup
from autotune.tuner.space import Space, probe_batch

#: Throughput gain from the small to the largest pre-pass batch that makes
#: the largest batch worth a first trial of its own.
BATCH_GAIN = 1.10

#: Share of the first guess's expected rate at which loading in the training process (no loader workers) is expected
#: to come close enough to be a guess of its own (:func:`in_process_guess`).
IN_PROCESS_SHARE = 0.8


def guess_setups(space: Space, calibration: Calibration, device: DeviceInfo, usable_cores: int) -> list[TrainSetup]:
    """Probe-informed first trials, after the defaults (clipped into the space by the caller).

    The first guess takes workers from the loader ceiling (the fewest that
    feed the device; where none does, half the cores, or more where more
    loaded the most), a middle batch
    (64 on a CPU, 256 on a GPU), and the precision and layout that computed
    fastest at that batch in the calibration (measured like for like). When the
    memory pre-pass measured throughput still rising with the batch (the
    largest batch at least 10 % faster than the smallest), a second guess
    is the first at the largest batch of the space that its loader workers
    can still feed within one epoch of the data (:func:`_largest_fed_batch`).
    Where the data loads so fast in the training process that handing it over
    from workers costs about as much, the first without workers is a guess
    too (:func:`in_process_guess`).

    On a CPU, where loader workers and training threads share the cores, one
    more guess gives each worker a core of its own: the first guess with at
    most ``usable_cores - 1`` workers and the remaining cores as training
    threads (:func:`core_split`). Which side of that trade wins depends on the
    model (``docs/benchmarks.md``, "The torch knobs on this CPU"), so it is
    measured, not chosen. Where torch's own thread count exceeds the usable
    cores (a CPU quota, which torch does not read), a guess that would leave
    the count to torch names the usable cores instead (:func:`threads_within_cores`).
    """
    first = guess_setup(space, calibration, device, usable_cores)
    guesses = [first]
    in_process = in_process_guess(space, calibration, first, device, usable_cores)
    if in_process is not None:  # ahead of the first where it is expected to be faster
        guesses.insert(0 if in_process[1] >= 1.0 else 1, in_process[0])
    split = core_split(space, first, device, usable_cores, calibration.torch_threads)
    if split is not None:
        guesses.append(split)
    rates = sorted(
        (p.batch_size, p.samples_per_s) for p in calibration.memory_points if p.status == "ok" and p.samples_per_s
    )
    larger = _largest_fed_batch(space, _queue_within_epoch(space, first))
    if len(rates) >= 2 and rates[-1][1] >= BATCH_GAIN * rates[0][1] and larger > first.batch_size:
        guesses.append(first.replace(batch_size=larger))
    return [threads_within_cores(space, _queue_within_epoch(space, guess), calibration, device, usable_cores) for guess in guesses]


def threads_within_cores(space: Space, setup: TrainSetup, calibration: Calibration, device: DeviceInfo, usable_cores: int) -> TrainSetup:
    """``setup`` with as many training threads as there are usable cores where it leaves the count to torch and torch's
    own count in a trial (the calibration's) exceeds them: torch counts the cores it sees, not a container's CPU quota,
    and its threads then wait on the quota's throttling. Under a 1-CPU quota on the 2-core development machine one thread
    trained resnet18 at 64 px 1.24x and mobilenet_v3_small 1.94x as fast as torch's own two, in every round
    (docs/benchmarks.md, "Torch's thread count under a CPU quota"). ``setup`` as it is on a GPU, or where the space does not offer that count."""
    own = calibration.torch_threads
    if device.type != "cpu" or setup.num_threads is not None or own is None or own <= usable_cores:
        return setup
    threads = max(1, usable_cores)
    return setup.replace(num_threads=threads) if threads in space.values["num_threads"] else setup


def in_process_guess(
    space: Space, calibration: Calibration, first: TrainSetup, device: DeviceInfo, usable_cores: int
) -> tuple[TrainSetup, float] | None:
    """``first`` without loader workers, with its expected rate over ``first``'s, where that ratio is at least
    :data:`IN_PROCESS_SHARE`; None otherwise (or where the space offers no 0 workers, or the calibration lacks a rate).

    Without workers the training process loads and computes in turn: ``1 / (1 / loading + 1 / computing)`` from the
    calibration's loader-only rate without workers and its compute-only rate. With ``first``'s workers the two overlap:
    at most the smaller of their loader-only rate and the compute-only rate. On a CPU the workers' loading takes its
    core-seconds from the training threads too: at most ``1 / (1 / computing + 1 / (cores x loading))``, the cores
    doing both. Small items (token ids, tabular rows) load in the training process several times faster than workers
    hand them over (the batches pass through shared memory and a queue), and on a CPU small decoded images may load
    in turn about as fast as beside workers that take cores from the step: there no workers can win, and a search of
    a few trials would otherwise try it only in the PyTorch defaults' setup."""
    if not first.num_workers or 0 not in space.values["num_workers"]:
        return None
    computing, alone, fed = calibration.compute_samples_per_s, calibration.loader_rate(0), calibration.loader_rate(first.num_workers)
    if not computing or not alone or not fed:
        return None
    overlapped = min(fed, computing)
    if device.type == "cpu":
        overlapped = min(overlapped, 1.0 / (1.0 / computing + 1.0 / (max(1, usable_cores) * alone)))
    ratio = (1.0 / (1.0 / alone + 1.0 / computing)) / overlapped
    if ratio < IN_PROCESS_SHARE:
        return None
    return first.replace(num_workers=0, prefetch_factor=None, persistent_workers=False), ratio


def _largest_fed_batch(space: Space, first: TrainSetup) -> int:
    """The largest batch of the space whose loader queue still fits in one epoch with ``first``'s workers (at the
    smallest prefetch depth): the second guess's. On a small dataset the largest batch of all would leave it
    fewer workers than the first guess found it needs, a guess starved by construction (one worker at batch
    1024 fed 278 samples/s where 7 workers at batch 256 fed 1,307, resnet50 at 224 px on an H200 with 2000 images)."""
    depth = min(space.values["prefetch_factor"])
    fed = [b for b in space.values["batch_size"] if not first.num_workers or space.queue_fits(first.num_workers, depth, b)]
    return max(fed, default=first.batch_size)


def core_split(space: Space, setup: TrainSetup, device: DeviceInfo, usable_cores: int, own: int | None = None) -> TrainSetup | None:
    """``setup`` with its loader workers and training threads splitting the CPU's cores between them.

    None on a GPU, without loader workers, on one core, where the space
    does not offer the split (a ``--set`` pin on ``num_workers`` or ``num_threads``), or where it would train with the
    threads ``setup`` already runs: torch's own count ``own`` (the calibration's; 1 under ``OMP_NUM_THREADS=1``) where it
    leaves the count to torch, a trial spent on the same setup twice.
    """
    if device.type != "cpu" or usable_cores < 2 or setup.num_workers == 0:
        return None
    workers = min(setup.num_workers, usable_cores - 1)
    threads = usable_cores - workers
    if workers not in space.values["num_workers"] or threads not in space.values["num_threads"]:
        return None
    if workers == setup.num_workers and threads == (own if setup.num_threads is None else setup.num_threads):
        return None
    return setup.replace(num_workers=workers, num_threads=threads)


def _queue_within_epoch(space: Space, setup: TrainSetup) -> TrainSetup:
    """``setup`` with its prefetch depth lowered until the loader queue fits in one epoch;
    when even the smallest depth does not, with fewer workers too (none at all, as the last resort)."""
    if not setup.num_workers or setup.prefetch_factor is None or space.images is None:
        return setup
    for workers in sorted((w for w in space.values["num_workers"] if 0 < w <= setup.num_workers), reverse=True):
        fitting = [
            p for p in space.values["prefetch_factor"]
            if p <= setup.prefetch_factor and space.queue_fits(workers, p, setup.batch_size)
        ]
        if fitting:
            return setup.replace(num_workers=workers, prefetch_factor=max(fitting))
    if 0 in space.values["num_workers"]:
        return setup.replace(num_workers=0, prefetch_factor=None, persistent_workers=False)
    return setup


def guess_setup(space: Space, calibration: Calibration, device: DeviceInfo, usable_cores: int) -> TrainSetup:
    """A probe-informed first guess (clipped into the space by the caller)."""
    cuda = device.type == "cuda"
    workers = max(1, min(calibration.max_workers, usable_cores // 2 if not cuda else usable_cores))
    enough = calibration.workers_enough()
    loaded_most = calibration.fastest_loader()
    if enough:
        workers = enough
    elif enough is None and loaded_most is not None:  # no count feeds the device: as many as loaded the most, if more
        workers = max(workers, loaded_most.num_workers)  # (a dataset that waits: 2 workers loaded 384 samples/s, 1 loaded 189)
    workers = min(workers, max(space.values["num_workers"]))
    batch = probe_batch(calibration.max_batch, device)
    amp, channels_last = ("bf16" if device.bf16 else ("fp16" if cuda else "off")), True
    fastest = calibration.fastest_precision()
    if fastest is not None:  # measured like for like at this batch: follow the numbers
        amp, channels_last = fastest.amp, fastest.channels_last
    values = space.values
    impls = values["optimizer_impl"]
    return TrainSetup(
        num_workers=workers,
        prefetch_factor=2 if workers else None,
        pin_memory=cuda,
        persistent_workers=workers > 0,
        batch_size=batch,
        amp=amp,  # type: ignore[arg-type]
        channels_last=channels_last,
        cudnn_benchmark=True in values["cudnn_benchmark"],
        tf32=True in values["tf32"],
        # fused on CUDA, foreach on a CPU: the kernels autotune's trials used before the knob existed.
        optimizer_impl="fused" if cuda and "fused" in impls else ("foreach" if "foreach" in impls else None),
    )
