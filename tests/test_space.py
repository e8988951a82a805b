"""--set parsing and the search space."""

from __future__ import annotations

import dataclasses

import optuna
import pytest

from autotune.devices import DeviceInfo
from autotune.errors import SetupError, UsageError
from autotune.records import Calibration, LoaderPoint, MemoryPoint
from autotune.train_setup import TrainSetup
from autotune.tuner.batch_sizes import powers_of_two
from autotune.tuner.calibrate import extrapolate_batch
from autotune.tuner.constraints import merge_constraints, parse_constraint
from autotune.tuner.guesses import guess_setups
from autotune.tuner.pins import check_pins_act
from autotune.tuner.space import SPACE_VERSION, build_space, defaults_setup, space_version

CPU = DeviceInfo("cpu", bf16=True, memory_total_bytes=None, memory_free_bytes=None, label="test CPU")
GPU = DeviceInfo("cuda:0", bf16=True, memory_total_bytes=80 * 2**30, memory_free_bytes=80 * 2**30, label="test GPU")


def calibration(max_batch: int = 256, max_workers: int = 4, memory_points: tuple = ()) -> Calibration:
    return Calibration(
        budget_bytes=2**33,
        max_batch=max_batch,
        memory_points=memory_points,
        probe_batch=64,
        compute_setup=TrainSetup(),
        compute_samples_per_s=100.0,
        loader=(LoaderPoint(0, "ok", 50.0), LoaderPoint(1, "ok", 150.0)),
        max_workers=max_workers,
    )


def test_parse_constraint_forms() -> None:
    assert parse_constraint("amp=off").value == "off"
    assert parse_constraint("workers=4").knob == "num_workers"
    assert parse_constraint("NUM_WORKERS=2").knob == "num_workers"  # knob names, like values, in any case
    assert parse_constraint("batch_size=16..128").low == 16
    assert parse_constraint("batch_size=..64").high == 64 and parse_constraint("batch_size=..64").low is None
    assert parse_constraint("amp=off,bf16").choices == ("off", "bf16")
    assert parse_constraint("batch_size=8|16|32").choices == (8, 16, 32)  # as the space: line prints choices
    assert parse_constraint("num_threads=auto|1").choices == (None, 1)
    assert parse_constraint("channels_last=yes").value is True


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("turbo=1", "unknown knob 'turbo'"),
        ("workerz=1", r"short names: workers \(num_workers\), prefetch \(prefetch_factor\), batch \(batch_size\), accum \(accumulation_steps\)"),
        ("amp", "expected KNOB=VALUE"),
        ("amp=fp8", "expected one of off, bf16, fp16"),
        ("batch_size=big", "expected an integer"),
        ("batch_size=0", "must be >= 1"),
        ("batch_size=64..16", "empty range"),
        ("amp=off..bf16", "ranges work for integer knobs only"),
        ("num_workers=1...", "a range is LO..HI"),  # was "expected an integer, got '.'"
        ("num_workers=1,2..3", "a range is LO..HI"),  # was "got '1,2'"
        ("num_threads=auto,1..2", "a range is LO..HI"),
        ("num_workers=..", "a range needs a bound"),  # was a pin to None: an internal error, or num_threads pinned to auto
        ("num_threads= .. ", "a range needs a bound"),
        ("channels_last=maybe", "expected true or false"),
        ("num_workers=1,,2", "an empty value in the list of choices"),  # was taken as 1,2: a typo passed unnoticed
        ("amp=off,bf16,", "an empty value in the list of choices"),
        ("amp=,", "no values"),
        ("num_workers=1_0", r"expected an integer, got '1_0'"),  # int() reads 10: a typo taken as a pin
        ("batch_size=8,1_6", r"expected an integer, got '1_6'"),
        ("num_threads=\u0662", r"expected an integer or auto"),  # int() reads another script's digit 2
    ],
)
def test_parse_constraint_errors(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        parse_constraint(text)


def test_space_from_probe_and_calibration() -> None:
    space = build_space(device=CPU, calibration=calibration(max_workers=2), usable_cores=2, effective_batch=None, constraints={})
    assert space.values["num_workers"] == (0, 1, 2)  # the calibration's count (the usable cores), not os.cpu_count()
    waits = build_space(device=CPU, calibration=calibration(max_workers=8), usable_cores=2, effective_batch=None, constraints={})
    assert waits.values["num_workers"] == tuple(range(9))  # past the cores where the loader measured it waits, not computes
    assert space.values["batch_size"] == (8, 16, 32, 64, 128, 256)
    assert space.values["amp"] == ("off", "bf16")  # no fp16 on a CPU
    assert space.values["pin_memory"] == (False,)
    gpu = build_space(device=GPU, calibration=calibration(max_workers=3), usable_cores=16, effective_batch=None, constraints={})
    assert gpu.values["amp"] == ("off", "bf16", "fp16")
    assert gpu.values["num_workers"] == (0, 1, 2, 3)  # bounded by the loader measurement
    assert gpu.values["pin_memory"] == (False, True)


def test_effective_batch_fixes_accumulation() -> None:
    space = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=96, constraints={})
    assert space.values["batch_size"] == (8, 12, 16, 24, 32, 48, 96)  # every divisor: 96 x 1 too (before: 8, 16, 32 only)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        setup = space.suggest(study.ask())
        assert setup.batch_size * setup.accumulation_steps == 96
    assert defaults_setup(96) == TrainSetup(batch_size=32, accumulation_steps=3)
    assert defaults_setup(20) == TrainSetup(batch_size=20, accumulation_steps=1)


def test_the_data_caps_batch_and_accumulation() -> None:
    """One optimizer step (batch x accumulation) must fit in an epoch of the data."""
    big = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None, constraints={},
                      images=100_000)
    assert big.values["batch_size"] == (8, 16, 32, 64, 128, 256)
    assert big.values["accumulation_steps"] == (1, 2, 4)
    small = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None, constraints={},
                        images=100)
    assert small.values["batch_size"] == (8, 16, 32, 64)
    assert small.values["accumulation_steps"] == (1, 2, 4)
    tiny = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None, constraints={},
                       images=20)
    assert tiny.values["batch_size"] == (8, 16)
    assert tiny.values["accumulation_steps"] == (1, 2)
    with pytest.raises(UsageError, match="larger than the 100 training images"):
        build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=128, constraints={},
                    images=100)


def test_a_pinned_accumulation_or_batch_keeps_only_the_partners_whose_step_fits_the_data() -> None:
    """``--set accumulation_steps=3`` on 64 images: batches 32 and 64 could hold no optimizer step (they would be sampled
    and found infeasible, trial after trial), so the space line shows the batches that can run; ``--set batch_size=32``
    keeps the accumulations that fit. A pin no partner meets is refused in one line."""
    def space(*pins: str, images: int = 64):
        return build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                           constraints=merge_constraints(parse_constraint(p) for p in pins), images=images)

    assert space("accumulation_steps=3").values["batch_size"] == (8, 16)
    assert space("accumulation_steps=2..4").values["batch_size"] == (8, 16, 32)  # the fewest steps allowed decide
    assert space("accumulation_steps=1").values["batch_size"] == (8, 16, 32, 64)
    assert space("batch_size=32").values["accumulation_steps"] == (1, 2)
    assert space().values["accumulation_steps"] == (1, 2, 4) and space().values["batch_size"] == (8, 16, 32, 64)
    with pytest.raises(UsageError, match=r"^--set accumulation_steps=16: the smallest optimizer step it allows, batch 8 x 16 "
                                         r"accumulation, is more than the data's 64 samples"):
        space("accumulation_steps=16")
    with pytest.raises(UsageError, match=r"^--set batch_size=32 --set accumulation_steps=4: the smallest .* batch 32 x 4 "):
        space("accumulation_steps=4", "batch_size=32")


def test_a_second_guess_at_the_largest_batch_when_throughput_still_rises() -> None:
    rising = calibration(memory_points=(MemoryPoint(8, "ok", 2**28, 80.0), MemoryPoint(32, "ok", 2**29, 130.0),
                                        MemoryPoint(256, "ok", 2**31, 170.0)))
    space = build_space(device=CPU, calibration=rising, usable_cores=2, effective_batch=None, constraints={})
    first, _split, second = guess_setups(space, rising, CPU, 2)
    assert (first.batch_size, second.batch_size) == (64, 256)
    assert second == first.replace(batch_size=256)
    flat = calibration(memory_points=(MemoryPoint(8, "ok", 2**28, 13.6), MemoryPoint(32, "ok", 2**29, 13.2)))
    assert [g.batch_size for g in guess_setups(space, flat, CPU, 2)] == [64, 64]  # the first and its core split
    bounded = build_space(device=CPU, calibration=rising, usable_cores=2, effective_batch=None,
                          constraints=merge_constraints([parse_constraint("batch_size=8..64")]))
    assert [g.batch_size for g in guess_setups(bounded, rising, CPU, 2)] == [64, 64]  # nothing larger than the first


def test_the_large_batch_guess_keeps_the_workers_the_first_guess_needs_on_a_small_dataset() -> None:
    """On 2000 images the largest batch (1024) fits only one worker's queue in an epoch: the second guess takes the
    largest batch the first guess's workers still feed (7 x 1 x 256 <= 2000), not 1024 with one worker."""
    rising = dataclasses.replace(  # the loader calibration's one worker does not feed 4000 samples/s: 16 workers wanted
        calibration(memory_points=(MemoryPoint(16, "ok", 2**28, 300.0), MemoryPoint(1024, "ok", 2**33, 4000.0)),
                    max_batch=1024, max_workers=16), compute_samples_per_s=4000.0)
    space = build_space(device=GPU, calibration=rising, usable_cores=16, effective_batch=None, constraints={}, images=2000)
    first, *rest = guess_setups(space, rising, GPU, 16)
    assert first.batch_size == 256 and first.num_workers == 7 and first.prefetch_factor == 1  # 1792 <= 2000
    assert rest == []  # no larger batch keeps 7 workers within an epoch (7 x 1 x 512 > 2000)
    more = build_space(device=GPU, calibration=rising, usable_cores=16, effective_batch=None, constraints={}, images=16384)
    first, second = guess_setups(more, rising, GPU, 16)
    assert second.num_workers == first.num_workers and second.batch_size > first.batch_size
    assert more.queue_fits(second.num_workers, second.prefetch_factor or 1, second.batch_size)


def test_data_that_loads_faster_in_the_training_process_gets_a_guess_without_workers() -> None:
    """Small items (token ids, tabular rows): loading them in the training process (no workers) is several times faster
    than workers hand them over, and as fast as the overlap could be. That setup is a guess of its own (before, a search
    of few trials tried no workers only in the PyTorch defaults' setup), first where it is expected to be faster."""
    def tiny_items(alone: float, one_worker: float, computing: float) -> Calibration:
        return dataclasses.replace(calibration(), compute_samples_per_s=computing,
                                   loader=(LoaderPoint(0, "ok", alone), LoaderPoint(1, "ok", one_worker)))

    close = tiny_items(261_000.0, 38_000.0, 43_000.0)  # in turn 1 / (1/261k + 1/43k) = 36.9k against at most 38k
    space = build_space(device=CPU, calibration=close, usable_cores=2, effective_batch=None, constraints={})
    first, in_process, split = guess_setups(space, close, CPU, 2)
    assert first.num_workers == 1 and in_process == first.replace(num_workers=0, prefetch_factor=None, persistent_workers=False)
    assert split.num_workers == 1 and split.num_threads == 1
    faster = tiny_items(400_000.0, 20_000.0, 43_000.0)  # 38.8k in turn against 20k the one worker delivers
    assert guess_setups(space, faster, CPU, 2)[0].num_workers == 0
    # Small JPEGs on 2 cores (300 computing, 678 loading): 208 in turn, against at most 246 where one worker's
    # decoding takes its core-seconds from the step; measured alike (resnet18 at 64 px, batch 128, bf16: 161.8 samples/s
    # without workers, 146.9 with one, 157.4 with two, medians of 3 interleaved rounds): a guess of its own.
    jpegs = tiny_items(678.0, 655.0, 300.0)
    assert [g.num_workers for g in guess_setups(space, jpegs, CPU, 2)] == [1, 0, 1]
    # The same images on 16 cores, or on a GPU (the workers take nothing from the step), or a decode as slow as the
    # step on 2 cores (150 in turn against 200): the step waits for its data, no guess without workers.
    many = build_space(device=CPU, calibration=jpegs, usable_cores=16, effective_batch=None, constraints={})
    assert all(g.num_workers for g in guess_setups(many, jpegs, CPU, 16))
    gpu = build_space(device=GPU, calibration=jpegs, usable_cores=16, effective_batch=None, constraints={})
    assert all(g.num_workers for g in guess_setups(gpu, jpegs, GPU, 16))
    slow = tiny_items(300.0, 290.0, 300.0)
    assert [g.num_workers for g in guess_setups(space, slow, CPU, 2)] == [1, 1]
    pinned = build_space(device=CPU, calibration=close, usable_cores=2, effective_batch=None,
                         constraints=merge_constraints([parse_constraint("num_workers=1..2")]))
    assert all(g.num_workers for g in guess_setups(pinned, close, CPU, 2))  # no 0 workers in the space


def test_on_a_cpu_a_guess_splits_the_cores_between_loader_workers_and_training_threads() -> None:
    space = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None, constraints={})
    first, split = guess_setups(space, calibration(), CPU, 2)
    assert first.num_workers == 1 and first.num_threads is None  # torch's own choice: both cores, beside the worker
    assert split == first.replace(num_threads=1)  # one core each
    # More workers than cores to spare: the split keeps one core for training.
    many = build_space(device=CPU, calibration=calibration(), usable_cores=8, effective_batch=None, constraints={})
    split = guess_setups(many, calibration(), CPU, 8)[1]
    assert split.num_workers + split.num_threads == 8 and split.num_threads >= 1
    # Not where it cannot differ or is not offered: a GPU, one core, no workers, a pinned thread count.
    gpu = build_space(device=GPU, calibration=calibration(), usable_cores=16, effective_batch=None, constraints={})
    assert len(guess_setups(gpu, calibration(), GPU, 16)) == 1
    one = build_space(device=CPU, calibration=calibration(), usable_cores=1, effective_batch=None, constraints={})
    # (On one core a worker's loading takes the step's only core: the in-process guess comes first, no split.)
    assert [(g.num_workers, g.num_threads) for g in guess_setups(one, calibration(), CPU, 1)] == [(0, None), (1, None)]
    no_workers = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                             constraints=merge_constraints([parse_constraint("num_workers=0")]))
    assert len(guess_setups(no_workers, calibration(), CPU, 2)) == 1
    pinned = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                         constraints=merge_constraints([parse_constraint("num_threads=2")]))
    assert len(guess_setups(pinned, calibration(), CPU, 2)) == 1
    # Under OMP_NUM_THREADS=1 torch's own count is the split's one thread: the same setup, not a second trial of it.
    one_thread = dataclasses.replace(calibration(), torch_threads=1)
    assert [(g.num_workers, g.num_threads) for g in guess_setups(space, one_thread, CPU, 2)] == [(1, None)]


def test_where_no_worker_count_feeds_the_device_the_first_guess_takes_the_count_that_loaded_most() -> None:
    """A dataset that waits (5 ms per item, a network read): the calibration's loader ran 189, 189 and 384 samples/s with
    0, 1 and 2 workers, below the device's 1000; the first guess took half the cores (1 worker) and the search kept a
    setup the emitted train.py beat 2-3x with --workers 2. Where a count feeds the device, the fewest that does."""
    waiting = dataclasses.replace(calibration(max_workers=2), compute_samples_per_s=1000.0,
                                  loader=(LoaderPoint(0, "ok", 189.0), LoaderPoint(1, "ok", 189.4), LoaderPoint(2, "ok", 383.8)))
    space = build_space(device=CPU, calibration=waiting, usable_cores=2, effective_batch=None, constraints={})
    assert guess_setups(space, waiting, CPU, 2)[0].num_workers == 2
    fed = dataclasses.replace(waiting, compute_samples_per_s=100.0)  # 1 worker covers it
    assert guess_setups(space, fed, CPU, 2)[0].num_workers == 1


def test_under_a_cpu_quota_below_torch_s_own_thread_count_the_guesses_name_the_usable_cores() -> None:
    """Torch counts the cores it sees, not a container's CPU quota: under a 1-CPU quota on 2 cores one thread trained
    1.2-1.9x as fast as its own two (docs/benchmarks.md), and every guess left the count to torch, so a short search
    measured 1 thread only where its sampler happened to pick it. The guesses that leave the count to torch name the
    usable cores where the calibration's trials ran more threads than that; not where they ran no more, on a GPU, or
    where the space does not offer the count."""
    quota = dataclasses.replace(calibration(), torch_threads=2)
    one = build_space(device=CPU, calibration=quota, usable_cores=1, effective_batch=None, constraints={})
    assert [(g.num_workers, g.num_threads) for g in guess_setups(one, quota, CPU, 1)] == [(0, 1), (1, 1)]
    four = build_space(device=CPU, calibration=dataclasses.replace(quota, torch_threads=16), usable_cores=4,
                       effective_batch=None, constraints={})
    first, split = guess_setups(four, dataclasses.replace(quota, torch_threads=16), CPU, 4)
    assert first.num_threads == 4 and split.num_workers + split.num_threads == 4  # the split keeps its own count
    two = build_space(device=CPU, calibration=quota, usable_cores=2, effective_batch=None, constraints={})
    assert guess_setups(two, quota, CPU, 2)[0].num_threads is None  # torch's own count is the usable cores' already
    assert guess_setups(one, calibration(), CPU, 1)[0].num_threads is None  # an earlier calibration did not record it
    gpu = build_space(device=GPU, calibration=quota, usable_cores=1, effective_batch=None, constraints={})
    assert guess_setups(gpu, quota, GPU, 1)[0].num_threads is None
    pinned = build_space(device=CPU, calibration=quota, usable_cores=1, effective_batch=None,
                         constraints=merge_constraints([parse_constraint("num_threads=auto")]))
    assert all(g.num_threads is None for g in guess_setups(pinned, quota, CPU, 1))


def test_constraints_pin_and_bound() -> None:
    constraints = merge_constraints(
        [parse_constraint("amp=off"), parse_constraint("num_workers=1..2"), parse_constraint("batch_size=16..64")]
    )
    space = build_space(device=CPU, calibration=calibration(), usable_cores=8, effective_batch=None, constraints=constraints)
    assert space.values["amp"] == ("off",)
    assert space.values["num_workers"] == (1, 2)
    assert space.values["batch_size"] == (16, 32, 64)
    assert "amp" not in space.searched()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        trial = study.ask()
        setup = space.suggest(trial)
        assert space.contains(setup)
        assert "amp" not in trial.params


def test_impossible_constraints_are_errors() -> None:
    with pytest.raises(SetupError, match="fp16 needs a CUDA device"):
        build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                    constraints=merge_constraints([parse_constraint("amp=fp16")]))
    with pytest.raises(UsageError, match="no value left"):
        build_space(device=CPU, calibration=calibration(max_batch=32), usable_cores=2, effective_batch=None,
                    constraints=merge_constraints([parse_constraint("batch_size=64..128")]))
    with pytest.raises(UsageError, match="given twice"):
        merge_constraints([parse_constraint("amp=off"), parse_constraint("amp=bf16")])


def test_params_for_round_trips_through_suggest() -> None:
    space = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None, constraints={})
    wanted = TrainSetup(num_workers=1, prefetch_factor=3, persistent_workers=True, batch_size=64, amp="bf16", channels_last=True,
                        accumulation_steps=2, num_threads=1, optimizer_impl="fused")
    study = optuna.create_study()
    study.enqueue_trial(space.params_for(wanted))
    assert space.suggest(study.ask()) == wanted
    # torch's own thread count is in the space and stays; its own optimizer kernels (not offered) become the for-loop ones.
    study.enqueue_trial(space.params_for(TrainSetup()))
    assert space.suggest(study.ask()) == TrainSetup(optimizer_impl="for-loop")
    # Without torch's own choice in the space (num_threads bounded by --set), it becomes every usable core.
    bounded = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                          constraints=merge_constraints([parse_constraint("num_threads=1..2")]))
    assert bounded.is_range("num_threads")
    other = optuna.create_study()  # a study samples one space: --set is part of its signature
    other.enqueue_trial(bounded.params_for(TrainSetup()))
    assert bounded.suggest(other.ask()) == TrainSetup(num_threads=2, optimizer_impl="for-loop")


def test_extrapolate_batch_and_powers() -> None:
    points = [MemoryPoint(8, "ok", 1000 + 8 * 10, 1.0), MemoryPoint(32, "ok", 1000 + 32 * 10, 1.0)]
    assert extrapolate_batch(points, 1000 + 100 * 10) == 100
    assert extrapolate_batch([MemoryPoint(8, "oom", None, None)], 10**9) is None
    assert powers_of_two(8, 100) == (8, 16, 32, 64)
    assert powers_of_two(1, 1) == (1,)


def test_the_loader_queue_is_kept_within_an_epoch() -> None:
    space = build_space(device=CPU, calibration=calibration(), usable_cores=4, effective_batch=None, constraints={}, images=256)
    assert space.prefetch_within_epoch(1, 32) == tuple(range(1, 9))  # 8 x 32 = 256 fits
    assert space.prefetch_within_epoch(2, 32) == (1, 2, 3, 4)
    assert space.prefetch_within_epoch(4, 128) == (1,)  # nothing fits: the smallest stays, the trial is refused
    no_data = build_space(device=CPU, calibration=calibration(), usable_cores=4, effective_batch=None, constraints={})
    assert no_data.prefetch_within_epoch(4, 128) == tuple(range(1, 9))


def test_setups_the_data_cannot_feed_are_refused_without_running() -> None:
    from autotune.records import Workload
    from autotune.tuner.explore import unrunnable

    workload = Workload(model="resnet18", image_size=32, images=256)
    assert unrunnable(TrainSetup(batch_size=64, accumulation_steps=4), workload) is None
    assert "no optimizer step" in unrunnable(TrainSetup(batch_size=64, accumulation_steps=8), workload).error
    queue = TrainSetup(batch_size=64, num_workers=2, prefetch_factor=4, persistent_workers=True)
    assert "larger than an epoch" in unrunnable(queue, workload).error
    assert unrunnable(queue.replace(prefetch_factor=2), workload) is None
    assert unrunnable(queue, Workload(model="resnet18", image_size=32)) is None  # unknown size: no cap


def test_loader_pins_without_workers_are_refused() -> None:
    for knob in ("prefetch_factor=4", "persistent_workers=true"):
        with pytest.raises(UsageError, match=f"--set {knob.split('=')[0]}: the DataLoader uses it only with workers"):
            build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                        constraints=merge_constraints([parse_constraint("num_workers=0"), parse_constraint(knob)]))
    # With workers allowed, the pin acts on the setups that have them.
    some = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                       constraints=merge_constraints([parse_constraint("num_workers=0..2"), parse_constraint("prefetch_factor=4")]))
    assert some.values["prefetch_factor"] == (4,) and some.values["num_workers"] == (0, 1, 2)


def test_a_loader_pin_excludes_no_setup_without_workers() -> None:
    from autotune.tuner.constraints import excluding

    # prefetch_factor and persistent_workers act on the setups that have workers; one with none (the defaults) is within them.
    for text in ("prefetch_factor=4", "persistent_workers=true"):
        pins = merge_constraints([parse_constraint("num_workers=0..2"), parse_constraint(text)])
        assert excluding(pins, TrainSetup()) is None
        assert excluding(pins, TrainSetup(batch_size=64, num_threads=1)) is None
    pins = merge_constraints([parse_constraint("prefetch_factor=4")])
    assert excluding(pins, TrainSetup(num_workers=1, prefetch_factor=2)) == "--set prefetch_factor=4"
    assert excluding(pins, TrainSetup(num_workers=1, prefetch_factor=4)) is None
    assert excluding(merge_constraints([parse_constraint("num_workers=1")]), TrainSetup()) == "--set num_workers=1"


def test_ddp_knobs_pin_with_several_ranks_and_are_refused_in_one_process() -> None:
    for text in ("bucket_cap_mb=10..20", "bucket_cap_mb=50", "bucket_cap_mb=10,50"):
        pins = merge_constraints([parse_constraint(text)])  # parsed like every integer knob, no internal error
        ddp = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                          constraints=pins, world_size=2)
        assert all(pins["bucket_cap_mb"].allows(v) for v in ddp.values["bucket_cap_mb"])
        with pytest.raises(UsageError, match="--set bucket_cap_mb: a DDP knob; it changes nothing .* --nproc-per-node"):
            build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None, constraints=pins)
    with pytest.raises(UsageError, match="--set static_graph: a DDP knob"):
        build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                    constraints=merge_constraints([parse_constraint("static_graph=true")]))
    # static_graph with every accumulation above 1: the space would drop it silently (a new user's DDP search did).
    both = merge_constraints([parse_constraint("static_graph=true"), parse_constraint("accumulation_steps=2")])
    with pytest.raises(UsageError, match=r"static_graph=true does not work with accumulation_steps > 1 \(DDP's no_sync breaks "
                                         r"its reducer\), and --set accumulation_steps=2 allows no step of one micro-batch$"):
        check_pins_act(both, True, 2)  # the pins alone, before the calibration (after it, a study the fix could not reuse)
    with pytest.raises(UsageError, match="--set static_graph: a DDP knob"):  # one process: that first, not two round trips
        check_pins_act(both, True, 1)
    pinned = merge_constraints([parse_constraint("static_graph=true"), parse_constraint("batch_size=64")])
    with pytest.raises(UsageError, match="and --effective-batch 256 with the batches the --set pins allow leaves no step"):  # 64 x 4
        build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=256, constraints=pinned, world_size=2)
    some = merge_constraints([parse_constraint("static_graph=true"), parse_constraint("accumulation_steps=1,2")])
    assert build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None, constraints=some,
                       world_size=2).values["static_graph"] == (True,)
    # Bounds that allow PyTorch's own value, what one process runs anyway: allowed.
    one = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                      constraints=merge_constraints([parse_constraint("bucket_cap_mb=10..50"),
                                                     parse_constraint("gradient_as_bucket_view=false")]))
    assert one.values["bucket_cap_mb"] == (25,)
    with pytest.raises(UsageError, match="must be <= 65536"):
        parse_constraint("bucket_cap_mb=100000")


def test_a_batch_range_between_the_searched_powers_of_two_keeps_its_bounds() -> None:
    def batches(text: str, images: int | None = None) -> tuple[int, ...]:
        space = build_space(device=CPU, calibration=calibration(), usable_cores=2, effective_batch=None,
                            constraints=merge_constraints([parse_constraint(text)]), images=images)
        return space.values["batch_size"]

    assert batches("batch_size=16..64") == (16, 32, 64)  # the powers of two inside the bounds
    assert batches("batch_size=5..7", images=12) == (5, 7)  # none inside: the bounds, as pins would be
    assert batches("batch_size=2..4") == (2, 4)  # below the searched floor of 8
    assert batches("batch_size=..6", images=12) == (6,)
    assert batches("batch_size=10..12", images=12) == (10, 12)  # above the powers searched, within the data (before: refused)
    with pytest.raises(UsageError, match=r"--set batch_size: no value left \(searched here: 8; no batch above 12: an optimizer "
                                         r"step must fit in the data's 12 samples\)$"):
        batches("batch_size=1000..2000", images=12)
    # A range above the calibration's largest batch says why the search ends there (before: the values searched alone).
    limited = dataclasses.replace(calibration(max_batch=32), batch_limit="one step of a larger one would take over half of a 2-s trial")
    with pytest.raises(UsageError, match=r"\(searched here: 8, 16, 32; no batch above 32: one step of a larger one would take "
                                         r"over half of a 2-s trial\)$"):
        build_space(device=CPU, calibration=limited, usable_cores=2, effective_batch=None,
                    constraints=merge_constraints([parse_constraint("batch_size=128..512")]))


def test_the_space_line_leaves_out_worker_knobs_when_no_worker_is_searched() -> None:
    workers = build_space(device=CPU, calibration=calibration(), usable_cores=4, effective_batch=None, constraints={})
    assert "prefetch_factor=" in workers.describe() and "persistent_workers=" in workers.describe()
    none = build_space(device=CPU, calibration=calibration(), usable_cores=4, effective_batch=None,
                       constraints={"num_workers": parse_constraint("num_workers=0")})
    line = none.describe()
    assert "num_workers=0" in line and "prefetch_factor" not in line and "persistent_workers" not in line


def test_a_precision_that_failed_every_calibration_run_is_left_out() -> None:
    """A model with an op that has no bf16 kernel fails in every bf16 trial: no trial is spent on it."""
    from dataclasses import replace

    from autotune.records import PrecisionPoint

    failing = replace(calibration(), precisions=(
        PrecisionPoint("off", False, "ok", 100.0), PrecisionPoint("off", True, "ok", 110.0),
        PrecisionPoint("bf16", False, "error", None), PrecisionPoint("bf16", True, "diverged", None)))
    space = build_space(device=CPU, calibration=failing, usable_cores=2, effective_batch=None, constraints={})
    assert space.values["amp"] == ("off",)
    assert space.describe().endswith("; amp=bf16 left out: every compute-only run in it ended diverged/error in the calibration")
    with pytest.raises(UsageError, match=r"^--set amp: the model failed in bf16 \(diverged/error\) in every compute-only run"):
        build_space(device=CPU, calibration=failing, usable_cores=2, effective_batch=None,
                    constraints=merge_constraints([parse_constraint("amp=bf16")]))
    # Out of memory in one layout is not a failure of the precision.
    oom = replace(failing, precisions=(*failing.precisions[:2], PrecisionPoint("bf16", False, "oom", None),
                                       PrecisionPoint("bf16", True, "error", None)))
    assert build_space(device=CPU, calibration=oom, usable_cores=2, effective_batch=None, constraints={}).values["amp"] == ("off", "bf16")


def test_a_layout_that_failed_every_calibration_run_is_left_out() -> None:
    """A model that flattens with ``view`` (or holds 5-D weights beside a 4-D input) fails in every channels_last run: the
    calibration said so, and the search still spent trials on it (its one-knob move of the leader among them)."""
    from dataclasses import replace

    from autotune.records import PrecisionPoint

    failing = replace(calibration(), precisions=(
        PrecisionPoint("off", False, "ok", 100.0), PrecisionPoint("off", True, "error", None),
        PrecisionPoint("bf16", False, "ok", 150.0), PrecisionPoint("bf16", True, "error", None)))
    space = build_space(device=CPU, calibration=failing, usable_cores=2, effective_batch=None, constraints={})
    assert space.values["channels_last"] == (False,) and space.values["amp"] == ("off", "bf16")
    assert space.describe().endswith("; channels_last=true left out: every compute-only run in it ended error in the calibration")
    with pytest.raises(UsageError, match=r"^--set channels_last=true: the model failed in channels_last \(error\) in every compute-only"):
        build_space(device=CPU, calibration=failing, usable_cores=2, effective_batch=None,
                    constraints=merge_constraints([parse_constraint("channels_last=true")]))
    # One layout run that ran, or a model that failed in every layout (not the layout's fault), leaves the knob in.
    for precisions in ((*failing.precisions[:3], PrecisionPoint("bf16", True, "ok", 160.0)),
                       (PrecisionPoint("off", False, "error", None), PrecisionPoint("off", True, "error", None))):
        kept = build_space(device=CPU, calibration=replace(failing, precisions=precisions), usable_cores=2, effective_batch=None, constraints={})
        assert kept.values["channels_last"] == (False, True)
    # A loss that turns NaN after some steps diverges in float32 too: not bf16's fault, and bf16 stays (before, it was
    # left out "as every run in it diverged", while the defaults' trial then stopped the search for the same NaN).
    later_nan = replace(failing, precisions=(PrecisionPoint("off", False, "diverged", None), PrecisionPoint("bf16", False, "diverged", None)))
    kept = build_space(device=CPU, calibration=later_nan, usable_cores=2, effective_batch=None, constraints={})
    assert kept.values["amp"] == ("off", "bf16") and "left out" not in kept.describe()


def test_a_pinned_effective_batch_offers_its_divisors_that_fit() -> None:
    """Every batch that divides the effective batch, from 8 up to the largest that fits; its largest divisor when none
    lies in that range. A power of two keeps the powers of two, and the space version of its studies."""
    def batches(effective: int, max_batch: int = 256) -> tuple[int, ...]:
        space = build_space(device=CPU, calibration=calibration(max_batch=max_batch), usable_cores=2, effective_batch=effective,
                            constraints={})
        return space.values["batch_size"]

    assert batches(96, max_batch=64) == (8, 12, 16, 24, 32, 48)
    assert batches(256) == powers_of_two(8, 256) and batches(1000) == (8, 10, 20, 25, 40, 50, 100, 125, 200, 250)
    assert batches(20) == (10, 20) and batches(12) == (12,) and batches(12, max_batch=10) == (6,)
    assert (space_version(None), space_version(256), space_version(96)) == (SPACE_VERSION, SPACE_VERSION, 3)
