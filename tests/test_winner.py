"""The winner and the bottleneck verdict, from records alone."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from autotune.devices import DeviceInfo
from autotune.errors import AutotuneError
from autotune.records import Calibration, LoaderPoint, TrialRecord, TrialResult, Workload
from autotune.rounds import Candidate, Confirmed
from autotune.train_setup import TrainSetup
from autotune.tuner.verdict import bottleneck_verdict
from autotune.tuner.winner import make_best

CPU = DeviceInfo("cpu", bf16=True, memory_total_bytes=None, memory_free_bytes=None, label="test CPU")
WORKLOAD = Workload(model="resnet18", image_size=32, device="cpu", lr=1e-3)
HARDWARE = SimpleNamespace(to_dict=lambda: {"software": {"torch": "x"}})
DEFAULTS = TrainSetup(batch_size=32)
FAST = TrainSetup(batch_size=128, accumulation_steps=2, amp="bf16")
MID = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2, persistent_workers=True)


def _record(number: int, setup: TrainSetup, rate: float, wait: float = 0.05) -> TrialRecord:
    result = TrialResult(status="ok", samples_per_s=rate, data_wait_fraction=wait, peak_memory_bytes=2**30 + number)
    return TrialRecord(number, "search", setup, result)


FEASIBLE = [_record(0, DEFAULTS, 100.0), _record(1, FAST, 260.0), _record(2, MID, 240.0)]


def _confirmed(setup: TrainSetup, values: tuple[float, ...]) -> Confirmed:
    return Confirmed(Candidate(setup.to_json(), setup, setup.describe()), values, ())


def _best(confirmed: list[Confirmed], effective_batch: int | None = None, workload: Workload = WORKLOAD):
    return make_best(
        workload=workload, hardware=HARDWARE, feasible=FEASIBLE, confirmed=confirmed, defaults=DEFAULTS,
        effective_batch=effective_batch, command="autotune search",
    )


def test_an_iterable_dataset_under_ddp_says_each_rank_iterates_it_unsharded() -> None:
    stream = dataclasses.replace(WORKLOAD, task="m:f", iterable=True)
    confirmed = [_confirmed(MID, (200.0,)), _confirmed(DEFAULTS, (100.0,))]

    def notes(world_size: int) -> list[str]:
        best = make_best(workload=stream, hardware=HARDWARE, feasible=FEASIBLE, confirmed=confirmed, defaults=DEFAULTS,
                         effective_batch=None, command="autotune search", world_size=world_size)
        return [n for n in best.notes if "IterableDataset" in n]

    assert len(notes(2)) == 1 and "each of the 2 ranks iterates itself (autotune shards no stream)" in notes(2)[0]
    assert notes(1) == []


def test_under_a_swinging_load_the_paired_rounds_rank_not_the_own_medians() -> None:
    """Neither beats the other, a's own median is higher, but b led a round by round (a's paired median -1 %): b wins.
    Before, the higher own median won, and the note read 'the winner won 2 of 4 paired rounds, median -29%'."""
    a = TrainSetup(batch_size=32, num_workers=1, prefetch_factor=2, persistent_workers=True)
    b = TrainSetup(batch_size=32, num_workers=2, prefetch_factor=2, persistent_workers=True)
    confirmed = [_confirmed(a, (300.0, 50.0, 60.0, 290.0)), _confirmed(b, (320.0, 60.0, 55.0, 280.0)),
                 _confirmed(DEFAULTS, (100.0, 20.0, 25.0, 100.0))]
    assert confirmed[0].median > confirmed[1].median  # type: ignore[operator]
    best = _best(confirmed)
    assert best.setup == b
    assert any("against the runner-up" in n and "the winner won 2 of 4 paired rounds, median +1%" in n for n in best.notes), best.notes


def test_the_confirmed_median_picks_the_winner_and_the_speedup() -> None:
    best = _best([_confirmed(FAST, (200.0, 210.0, 190.0)), _confirmed(MID, (230.0, 220.0, 250.0)), _confirmed(DEFAULTS, (110.0, 100.0, 90.0))])
    assert best.setup == MID  # one fast trial does not beat three interleaved rounds
    assert best.samples_per_s == 230.0 and best.samples_per_s_spread == 30.0
    assert best.defaults_samples_per_s == 100.0
    assert best.speedup == pytest.approx(2.2)  # the median of 230/110, 220/100, 250/90, as the note's margin
    assert best.peak_memory_bytes == 2**30 + 2
    assert best.confirmed and not any("not confirmed" in n for n in best.notes)


def test_the_winner_records_the_thread_count_its_trials_ran_where_its_threads_are_torch_s_own() -> None:
    """The emitted script compares torch's count with the one the trials ran (a variable above the cores gives fewer)."""
    ran = dataclasses.replace(FEASIBLE[2], result=dataclasses.replace(FEASIBLE[2].result, num_threads=2))
    best = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=[FEASIBLE[0], ran], confirmed=[_confirmed(MID, (230.0,))],
                     defaults=DEFAULTS, effective_batch=None, command="autotune search")
    assert best.setup == MID and best.torch_threads == 2 and best.to_dict()["torch_threads"] == 2
    pinned = dataclasses.replace(MID, num_threads=2)  # a count the setup sets: the script sets it too, nothing to compare
    record = dataclasses.replace(ran, setup=pinned)
    best = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=[FEASIBLE[0], record], confirmed=[_confirmed(pinned, (230.0,))],
                     defaults=DEFAULTS, effective_batch=None, command="autotune search")
    assert best.setup == pinned and best.torch_threads is None


def test_without_confirmation_the_fastest_trial_wins_unconfirmed() -> None:
    best = _best([])
    assert best.setup == FAST and best.samples_per_s == 260.0
    assert best.defaults_samples_per_s == 100.0
    assert not best.confirmed and any("not confirmed" in n for n in best.notes)


def test_a_changed_effective_batch_scales_the_learning_rate_and_says_so() -> None:
    best = _best([_confirmed(FAST, (300.0,)), _confirmed(DEFAULTS, (100.0,))])
    assert best.effective_batch == 256 and best.reference_batch == 32
    assert best.lr == pytest.approx(1e-3 * 8**0.5)  # AdamW: the square-root rule
    assert any("effective batch 256 differs" in n and "square root" in n for n in best.notes)
    assert any(n.endswith("; pass --effective-batch 32 to keep the math") for n in best.notes)  # the search then tries batches <= 32
    assert any("amp=bf16 changes the numerics" in n for n in best.notes)


def test_the_keep_the_math_hint_is_one_the_search_can_follow() -> None:
    """--effective-batch R searches micro-batches dividing R: with --set batch_size=48 it cannot keep 32; with 8..48 it can."""
    from autotune.tuner.constraints import parse_constraint

    pinned = TrainSetup(batch_size=48)

    def note(pin: str, workload: Workload = WORKLOAD) -> str:
        best = make_best(workload=workload, hardware=HARDWARE, feasible=[*FEASIBLE, _record(3, pinned, 250.0)],
                         confirmed=[_confirmed(pinned, (300.0,)), _confirmed(DEFAULTS, (100.0,))], defaults=DEFAULTS,
                         effective_batch=None, command="autotune search", batch_pin=parse_constraint(pin))
        assert best.setup == pinned
        return next(n for n in best.notes if n.startswith("effective batch 48 differs"))

    assert note("batch_size=48").endswith(
        "to keep the math, pass --effective-batch 32 with a --set batch_size that divides it (--set batch_size=48 allows none)")
    assert note("batch_size=8..48").endswith("; pass --effective-batch 32 to keep the math")
    kept = dataclasses.replace(WORKLOAD, lr_scaling="none")  # a rate kept at every batch: the same hint
    assert note("batch_size=48", kept).endswith("(--set batch_size=48 allows none)")


def test_an_effective_batch_other_than_the_tasks_batch_says_the_lr_is_taken_as_its_own() -> None:
    """--effective-batch 256 with a Task's batch_size 32: the Task's lr applies at 256 unscaled, and the note says so."""
    task_workload = dataclasses.replace(WORKLOAD, reference_batch=32)
    best = make_best(workload=task_workload, hardware=HARDWARE, feasible=FEASIBLE, confirmed=[_confirmed(FAST, (300.0,))],
                     defaults=DEFAULTS, effective_batch=256, command="autotune search")
    assert best.lr == pytest.approx(1e-3) and best.reference_batch == 256
    assert "your lr 0.001 is taken as tuned for --effective-batch 256, as given, not for the Task's batch_size 32: train.py uses " \
           "it unscaled (scale it yourself if it was tuned for 32)" in best.notes
    same = make_best(workload=dataclasses.replace(WORKLOAD, reference_batch=256), hardware=HARDWARE, feasible=FEASIBLE,
                     confirmed=[_confirmed(FAST, (300.0,))], defaults=DEFAULTS, effective_batch=256, command="autotune search")
    assert not any("is taken as tuned for" in n for n in same.notes)
    assert not any("is taken as tuned for" in n for n in _best([_confirmed(FAST, (300.0,))], effective_batch=256).notes)  # no Task


def test_the_speedup_pairs_rounds_under_drifting_load() -> None:
    # The machine slows down round by round; the defaults stopped after two rounds (already beaten).
    # The ratio of the medians (150 / 110 = 1.36) would set the winner's slow late rounds against the defaults' fast early ones.
    best = _best([_confirmed(MID, (240.0, 200.0, 150.0, 120.0, 100.0)), _confirmed(DEFAULTS, (120.0, 100.0))])
    assert best.setup == MID and best.samples_per_s == 150.0
    assert best.speedup == pytest.approx(2.0)  # 240/120 and 200/100, the rounds both ran
    assert any("won 2 of 2 paired rounds, median +100%" in n for n in best.notes)


def test_unmeasured_defaults_give_no_speedup() -> None:
    best = _best([_confirmed(MID, (200.0,))])
    assert best.speedup is None
    assert any("could not be measured: their trial ended without a throughput (trials.csv gives its status" in n for n in best.notes)
    # A recipe that cannot train (BatchNorm at batch 1, say) still sets the rate the winner's is scaled from: said so.
    assert any(n.endswith("no speedup is given; the learning rate is still scaled from their batch 32, your recipe's, which did "
                          "not train here") for n in best.notes), best.notes


def _calibration(compute: float, loader: float) -> Calibration:
    return Calibration(
        budget_bytes=None, max_batch=256, memory_points=(), probe_batch=64, compute_setup=TrainSetup(),
        compute_samples_per_s=compute, loader=(LoaderPoint(1, "ok", loader),), max_workers=2,
    )


@pytest.mark.parametrize(
    ("wait", "compute", "loader", "verdict"),
    [(0.5, 1000.0, 1000.0, "input-bound"), (0.05, 1000.0, 1000.0, "CPU-shared"), (0.05, 250.0, 1000.0, "compute-bound"),
     # Training at 240 samples/s against 50 computing alone: the figures name no limit...
     (0.05, 50.0, 1000.0, "unclear: training measured faster than computing alone"),
     # Faster than its loader alone: a loader run measured low (DDP ranks' on a busy machine), no compute bound.
     (0.05, 1000.0, 50.0, "unclear: training measured faster than loading alone"),
     # ... but the calibration's ceiling was measured at another batch or precision: the winner's own wait still tells.
     (0.38, 50.0, 1000.0, "input-bound")],
)
def test_the_bottleneck_verdict(wait: float, compute: float, loader: float, verdict: str) -> None:
    best = _best([_confirmed(MID, (240.0,))])
    records = [_record(2, MID, 240.0, wait=wait)]
    said = bottleneck_verdict(best, _calibration(compute, loader), records, CPU)
    assert said.startswith(verdict)
    # A workload without images gets no advice about decoding images.
    tensors = dataclasses.replace(best, workload=dataclasses.replace(best.workload, image_input=False))
    other = bottleneck_verdict(tensors, _calibration(compute, loader), records, CPU)
    assert other.startswith(verdict) and "decoding" not in other and "images" not in other
    if verdict == "input-bound":
        assert "Cheaper decoding" in said and "__getitem__" in other
        # A Task's image tensors are not files the loader decodes: its advice is about its dataset, not decoding.
        task = dataclasses.replace(best, workload=dataclasses.replace(best.workload, task="m:make_task"))
        assert "__getitem__" in bottleneck_verdict(task, _calibration(compute, loader), records, CPU)
        stream = dataclasses.replace(tensors, workload=dataclasses.replace(tensors.workload, iterable=True))
        assert "A cheaper dataset __iter__ or collate_fn" in bottleneck_verdict(stream, _calibration(compute, loader), records, CPU)


def test_an_unclear_verdict_names_another_batch_only_where_the_batches_differ() -> None:
    """An interrupted confirmation (no ceilings of the winner's own) said "compute alone was measured at another batch"
    for a winner at the calibration's own batch."""
    records = [_record(2, MID, 240.0, wait=0.05)]
    for batch, why in ((MID.batch_size, "the steps are too short or too noisy to compare."),
                       (MID.batch_size * 2, "compute alone was measured at another batch.")):
        calibration = dataclasses.replace(_calibration(50.0, 1000.0), probe_batch=batch)
        said = bottleneck_verdict(_best([_confirmed(MID, (240.0,))]), calibration, records, CPU)
        assert said.startswith("unclear: training measured faster than computing alone") and said.endswith(why), said


def test_a_winner_without_loader_workers_is_called_serial_not_cpu_shared() -> None:
    """A probe's --trials 1 winner, bs=32 w=0: "CPU-shared: decoding and training compete for the same cores", where one
    process decodes and then trains, each in turn."""
    alone = TrainSetup(batch_size=64)
    best = _best([_confirmed(alone, (240.0,))])
    calibration = dataclasses.replace(_calibration(1000.0, 1000.0), loader=(LoaderPoint(0, "ok", 900.0), LoaderPoint(1, "ok", 1000.0)))
    said = bottleneck_verdict(best, calibration, [_record(2, alone, 240.0, wait=0.05)], CPU)
    assert said.startswith("serial: without loader workers the training process decodes each batch and then trains on it (")
    assert said.endswith("so their times add up; workers would overlap the two on spare cores (no setup with workers was measured).")
    measured = [_record(2, alone, 240.0, wait=0.05), _record(3, MID, 200.0, wait=0.05)]
    assert "(the setups with workers the search measured were not faster here)" in bottleneck_verdict(best, calibration, measured, CPU)
    # Waiting on its own loading (a probe: 28 % at bs=32 w=0): more CPU cores would not feed one process; workers would.
    waiting = bottleneck_verdict(best, calibration, [_record(2, alone, 240.0, wait=0.3)], CPU)
    assert waiting.startswith("input-bound") and "more CPU cores" not in waiting and waiting.endswith(
        "or loader workers, which overlap loading with training on spare cores (no setup with workers was measured) would help.")
    # Workers that cannot run here (a full /dev/shm: every loader-only run with them failed) are not advised as if they could.
    broken = dataclasses.replace(calibration, loader=(LoaderPoint(0, "ok", 900.0), LoaderPoint(1, "error", None)))
    assert bottleneck_verdict(best, broken, [_record(2, alone, 240.0, wait=0.05)], CPU).endswith(
        "(but they failed here in the calibration's loader-only runs, so the search tried none: its lines say why).")
    # A /dev/shm too small for the calibration's batches in flight keeps workers in the space: the trials that had them
    # failed too (before: "so the search tried none", of a search that had tried them).
    failed = TrialRecord(3, "search", MID, TrialResult(status="error", error="/dev/shm (4 MiB, 4 MiB free) is too small ..."))
    assert bottleneck_verdict(best, broken, [_record(2, alone, 240.0, wait=0.05), failed], CPU).endswith(
        "(but they failed here in the calibration's loader-only runs, and so did every search trial that had them: its lines "
        "say why).")
    assert bottleneck_verdict(best, calibration, [_record(2, alone, 240.0, wait=0.05), failed], CPU).endswith(
        "(but every search trial that had them failed: its lines say why).")


def test_an_input_bound_winner_held_to_few_workers_by_a_small_dataset_is_told_so() -> None:
    """resnet50 on 2000 images on a GPU (2026-12-04): 7 workers x batch 256 fill an epoch, so the advice to add
    cores misleads; the verdict names the data's size as what held the loader. Not where one more worker fits."""
    best = _best([_confirmed(MID, (240.0,))])
    records = [_record(2, MID, 240.0, wait=0.5)]
    small = dataclasses.replace(best, workload=dataclasses.replace(best.workload, images=100))  # 2 x 64 > 100
    said = bottleneck_verdict(small, _calibration(1000.0, 1000.0), records, CPU)
    assert said.startswith("input-bound") and said.endswith(
        "; here the data's size held the loader to 1 worker: a queue of 2 workers x batch 64 would hold more than one epoch "
        "of its 100 samples, so a larger dataset (or a smaller batch) lets more workers feed it.")
    assert "more CPU cores" not in said  # more cores would feed no more workers there
    for images in (None, 128):  # unknown, or room for a second worker's batch
        roomy = dataclasses.replace(best, workload=dataclasses.replace(best.workload, images=images))
        told = bottleneck_verdict(roomy, _calibration(1000.0, 1000.0), records, CPU)
        assert "data's size" not in told and "or more CPU cores would help." in told
    every_core = dataclasses.replace(_calibration(1000.0, 1000.0), max_workers=1)  # the space offered no more workers
    assert "data's size" not in bottleneck_verdict(small, every_core, records, CPU)
    # Under DDP each rank's loader reads its share: 200 samples over 2 ranks hold no second worker's batch of 64.
    ranks = dataclasses.replace(best, workload=dataclasses.replace(best.workload, images=200), world_size=2)
    assert bottleneck_verdict(ranks, _calibration(1000.0, 1000.0), records, CPU).endswith(
        "would hold more than one epoch of one rank's 100 samples (200 over 2 ranks), so a larger dataset (or a smaller "
        "batch) lets more workers feed it.")


def test_an_input_bound_winner_whose_workers_deliver_less_than_loading_in_process_is_pointed_to_no_workers() -> None:
    """Small items (a dict batch of token ids, a probe of 2026-12-05): one worker delivered 12,030 samples/s, the training
    process alone 34,900; the advice named a cheaper __getitem__ or more cores, never loading without workers."""
    best = _best([_confirmed(MID, (240.0,))])
    records = [_record(2, MID, 240.0, wait=0.5)]
    handover = dataclasses.replace(_calibration(1000.0, 12030.0), loader=(LoaderPoint(0, "ok", 34900.0), LoaderPoint(1, "ok", 12030.0)))
    said = bottleneck_verdict(best, handover, records, CPU)
    assert said.startswith("input-bound") and said.endswith(
        " Loading in the training process measured faster than the winner's workers deliver (34900 against 12030 samples/s: "
        "handing the items over costs more than making them), so --set num_workers=0 searches that side."), said
    slower = dataclasses.replace(handover, loader=(LoaderPoint(0, "ok", 600.0), LoaderPoint(1, "ok", 12030.0)))
    assert "training process" not in bottleneck_verdict(best, slower, records, CPU)
    lost = [*records, TrialRecord(3, "guess", MID.replace(num_workers=0, prefetch_factor=None, persistent_workers=False),
                                  TrialResult(status="ok", samples_per_s=200.0))]  # no workers tried beyond the defaults, and slower
    assert "training process" not in bottleneck_verdict(best, handover, lost, CPU)


def test_a_compute_ceiling_at_or_just_below_the_loop_s_rate_is_said_to_be_within_noise() -> None:
    """The README's command, 2026-12-03: compute alone 245 samples/s, together 274 (1.12x, below the 1.25x of "unclear"):
    compute-bound, and the verdict says why a ceiling below the rate reached is not a contradiction."""
    from autotune.rounds import Ceilings

    best = _best([_confirmed(MID, (274.0,))])
    records = [_record(2, MID, 274.0, wait=0.0)]
    said = bottleneck_verdict(best, _calibration(245.0, 1000.0), records, CPU, Ceilings(274.0, 245.0, 1096.0, 0.0))
    assert said.startswith("compute-bound") and "as fast as computing alone, within the noise of these runs" in said
    clear = bottleneck_verdict(best, _calibration(320.0, 1000.0), records, CPU, Ceilings(274.0, 320.0, 1096.0, 0.0))
    assert clear.startswith("compute-bound") and "within the noise" not in clear


def test_without_the_winner_s_ceilings_the_verdict_takes_the_calibration_s_figures_nearest_its_setup() -> None:
    """--set amp=off --set num_workers=0: not the bf16 compute figure nor the 2-worker loader's, which it excludes."""
    from autotune.records import PrecisionPoint

    plain = TrainSetup(batch_size=32)
    calibration = dataclasses.replace(
        _calibration(620.0, 0.0), loader=(LoaderPoint(0, "ok", 400.0), LoaderPoint(2, "ok", 1435.0)),
        precisions=(PrecisionPoint("off", False, "ok", 300.0), PrecisionPoint("bf16", True, "ok", 620.0)))
    best = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=[_record(0, plain, 185.0, wait=0.05)],
                     confirmed=[_confirmed(plain, (185.0,))], defaults=plain, effective_batch=None, command="")
    said = bottleneck_verdict(best, calibration, [_record(0, plain, 185.0, wait=0.05)], CPU)
    assert "compute alone 300 samples/s (calibration, batch 64); loader alone 400 samples/s (0 workers)" in said, said
    assert "620" not in said and "1435" not in said
    # The loader's best point within the winner's workers, named by its own worker count (1 worker was slower).
    slower = dataclasses.replace(calibration, loader=(LoaderPoint(0, "ok", 500.0), LoaderPoint(1, "ok", 450.0)))
    one = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=[_record(0, MID, 185.0, wait=0.05)],
                    confirmed=[_confirmed(MID, (185.0,))], defaults=plain, effective_batch=None, command="")
    assert "loader alone 500 samples/s (0 workers)" in bottleneck_verdict(one, slower, [_record(0, MID, 185.0, wait=0.05)], CPU)


def test_a_winner_within_the_noise_of_the_defaults_returns_the_defaults() -> None:
    # Faster at the median, but not in every paired round: not beyond the noise.
    best = _best([_confirmed(FAST, (130.0, 95.0, 125.0)), _confirmed(DEFAULTS, (100.0, 100.0, 100.0))])
    assert best.setup == DEFAULTS and best.speedup == pytest.approx(1.0) and best.defaults_won
    # The rounds it had to win, of those it shared (three quarters): it said "3 of 4" whatever ran.
    assert any("nothing measurably faster" in n and "noise floor in 3 of 3 paired rounds (won 2 of 3" in n for n in best.notes), best.notes
    two = _best([_confirmed(FAST, (130.0, 95.0)), _confirmed(DEFAULTS, (100.0, 100.0))])
    assert any("noise floor in 2 of 2 paired rounds (won 1 of 2" in n for n in two.notes), two.notes
    apart = _best([Confirmed(Candidate(FAST.to_json(), FAST, FAST.describe()), (130.0,), ("failed",), failed_rounds=(1,)),
                   Confirmed(Candidate(DEFAULTS.to_json(), DEFAULTS, DEFAULTS.describe()), (100.0,), ("failed",), failed_rounds=(0,))])
    assert any("did not beat them by the 3% noise floor (no shared round)" in n for n in apart.notes), apart.notes  # not "0 of 0"
    # Faster in every round, but by less than the 3 % floor at the median.
    best = _best([_confirmed(FAST, (101.0, 102.0, 101.5)), _confirmed(DEFAULTS, (100.0, 100.0, 100.0))])
    assert best.setup == DEFAULTS


def test_defaults_that_the_set_excludes_are_the_baseline_not_the_winner() -> None:
    """--set num_workers=1: the user asked for a worker; defaults without one win only when nothing within the --set ran."""
    rounds = [_confirmed(MID, (90.0, 85.0, 95.0)), _confirmed(DEFAULTS, (100.0, 100.0, 100.0))]
    best = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=FEASIBLE, confirmed=rounds, defaults=DEFAULTS,
                     effective_batch=None, command="", excluded_by="--set num_workers=1")
    assert best.setup == MID and best.speedup == pytest.approx(0.9)  # slower than the defaults, and said so
    assert any(n.startswith("the fastest setup within --set num_workers=1 did not beat the PyTorch defaults") for n in best.notes)
    assert any("against the PyTorch defaults it won 0 of 3 paired rounds, median -10%" in n for n in best.notes)  # the evidence
    only_defaults = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=FEASIBLE[:1], confirmed=rounds[1:], defaults=DEFAULTS,
                              effective_batch=None, command="", excluded_by="--set num_workers=1")
    assert only_defaults.setup == DEFAULTS
    assert any(n.startswith("no setup within --set num_workers=1 measured a throughput") for n in only_defaults.notes)
    failing = TrialRecord(5, "search", MID, TrialResult(status="error", error="torch.compile (mode default) failed: InvalidCxxCompiler: x"))
    named = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=FEASIBLE[:1], confirmed=rounds[1:], defaults=DEFAULTS,
                      effective_batch=None, command="", excluded_by="--set num_workers=1", tried=[*FEASIBLE[:1], failing])
    assert "1 trial within it failed, the first so: #5 torch.compile (mode default) failed: InvalidCxxCompiler: x" in named.notes  # not
    # only "trials.csv says why": one cause for all of them (no C++ compiler on the machine) reads in the notes
    # Unconfirmed (interrupted), the fastest trial within the --set is shown, not the defaults.
    slow = [_record(0, DEFAULTS, 300.0), _record(2, MID, 240.0)]
    interrupted = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=slow, confirmed=[], defaults=DEFAULTS,
                            effective_batch=None, command="", interrupted=True, excluded_by="--set num_workers=1")
    assert interrupted.setup == MID
    # Without a --set that excludes them, the same rounds return the defaults.
    assert _best(rounds).setup == DEFAULTS


def test_one_lost_round_in_four_does_not_undo_a_clear_gain() -> None:
    defaults = _confirmed(DEFAULTS, (100.0, 100.0, 100.0, 100.0))
    assert _best([_confirmed(FAST, (130.0, 95.0, 125.0, 128.0)), defaults]).setup == FAST
    # Two lost rounds in four are not a clear gain, whatever the median.
    assert _best([_confirmed(FAST, (130.0, 95.0, 125.0, 98.0)), defaults]).setup == DEFAULTS


def test_a_setup_that_keeps_the_math_is_preferred_when_the_faster_one_is_within_noise() -> None:
    keeps = TrainSetup(batch_size=32, num_workers=1, prefetch_factor=2, persistent_workers=True)
    confirmed = [
        _confirmed(FAST, (300.0, 280.0, 310.0)),  # bf16 and effective batch 256: changes the math
        _confirmed(keeps, (290.0, 290.0, 300.0)),
        _confirmed(DEFAULTS, (100.0, 100.0, 100.0)),
    ]
    best = _best(confirmed)
    assert best.setup == keeps and best.effective_batch == 32 and best.lr == pytest.approx(1e-3)
    assert any("keeps the training math" in n for n in best.notes)
    # Beyond the noise, the faster setup wins.
    confirmed[0] = _confirmed(FAST, (400.0, 380.0, 410.0))
    assert _best(confirmed).setup == FAST


def test_among_setups_that_all_change_the_batch_the_nearer_one_is_preferred_within_noise() -> None:
    """A search's two bf16 finalists at 1024 and 512 tied (2 of 4 rounds, median +1 %): 1024 would leave 952 of 3,000
    images out of each epoch and scale the learning rate further on a rule's word, for no measured gain."""
    far, near = (TrainSetup(batch_size=b, accumulation_steps=4, amp="bf16", channels_last=True) for b in (256, 128))
    confirmed = [
        _confirmed(far, (264.6, 285.2, 321.1, 321.1)),
        _confirmed(near, (255.2, 278.9, 325.9, 323.9)),
        _confirmed(DEFAULTS, (175.9, 179.6)),
    ]
    best = _best(confirmed)
    assert best.setup == near and best.effective_batch == 512
    assert f"{near.describe()} keeps an effective batch nearer the reference and is within the noise of {far.describe()}" in best.notes[0]
    # Beyond the noise, the farther batch wins; a setup that keeps the batch is not pushed aside by this rule.
    confirmed[0] = _confirmed(far, (400.0, 410.0, 420.0, 405.0))
    assert _best(confirmed).setup == far
    same = _confirmed(TrainSetup(batch_size=32, amp="bf16"), (330.0, 330.0, 330.0, 330.0))
    assert _best([same, _confirmed(near, (329.0, 331.0, 330.0, 329.0)), _confirmed(DEFAULTS, (175.9, 179.6))]).setup == same.candidate.setup


def test_the_nearer_batch_never_trades_away_what_an_earlier_rule_guaranteed() -> None:
    """The nearer batch must meet every rule the farther one met: a math-changing pick that does not beat the
    fastest math-keeping finalist, or a bf16 one that does not beat its own fp32 twin, is not returned."""
    far, near = TrainSetup(batch_size=256), TrainSetup(batch_size=128)
    keeps = TrainSetup(batch_size=32, num_workers=1, prefetch_factor=2, persistent_workers=True)
    confirmed = [_confirmed(far, (110.0, 110.0, 110.0)), _confirmed(near, (108.0, 99.0, 108.0)),
                 _confirmed(keeps, (100.0, 100.0, 100.0)), _confirmed(DEFAULTS, (50.0, 50.0, 50.0))]
    assert _best(confirmed).setup == far  # 128 is within noise of 256 but does not beat the math-keeping 32
    far16, near16 = far.replace(amp="bf16"), near.replace(amp="bf16")
    confirmed = [_confirmed(far16, (100.0, 100.0)), _confirmed(near16, (97.5, 97.5)), _confirmed(near, (96.0, 96.0)),
                 _confirmed(DEFAULTS, (50.0, 50.0))]
    assert _best(confirmed).setup == far16  # bf16 at 128 is 1.6 % over its own fp32 twin: not beyond the noise


def test_a_setup_that_stopped_after_one_round_does_not_lead_on_a_median_of_other_minutes() -> None:
    """The machine grew 25 % busier after round 1: the rounds' leader and runner-up fell to medians of 75-76, and an
    fp32 twin stopped at 79 in round 1 must not win on that older figure."""
    lead, other = TrainSetup(batch_size=64, amp="bf16"), TrainSetup(batch_size=32, amp="bf16", num_workers=1, prefetch_factor=2)
    confirmed = [_confirmed(lead, (100.0, 75.0, 75.0, 75.0)), _confirmed(other, (95.0, 76.0, 77.0, 76.0)),
                 _confirmed(lead.replace(amp="off"), (79.0,)), _confirmed(DEFAULTS, (50.0, 38.0))]
    best = _best(confirmed)
    assert best.setup.amp == "bf16" and best.setup != lead.replace(amp="off")


def test_the_highest_median_gives_way_to_a_setup_that_beats_it_in_the_paired_rounds() -> None:
    """A tester's rounds: A beat B in 3 of 4 paired rounds by a median 10 %, B's median is higher (110.9 against 108.7)."""
    a, b = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2), TrainSetup(batch_size=16)
    best = _best([_confirmed(a, (102.0, 115.3, 93.8, 148.0)), _confirmed(b, (115.1, 111.5, 79.4, 110.2)),
                  _confirmed(DEFAULTS, (50.0, 50.0, 40.0, 50.0))])
    assert best.setup == a


def test_a_preferred_setup_must_beat_the_defaults_and_one_that_does_is_not_lost_behind_a_leader_that_does_not() -> None:
    """A tester's rounds: the float32 setup the precision rule prefers won 1 of 2 rounds against the defaults (it is not
    returned); and a math-keeping finalist beat the defaults 4 of 4 while the highest median did not (it is returned)."""
    bf16, fp32 = TrainSetup(batch_size=32, amp="bf16"), TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2)
    best = _best([_confirmed(bf16, (98.0, 126.2)), _confirmed(fp32, (90.5, 133.1)), _confirmed(DEFAULTS, (96.7, 106.6))])
    assert best.setup == bf16 and best.speedup is not None and best.speedup > 1.03
    x, y = TrainSetup(batch_size=32, num_workers=1, prefetch_factor=2), TrainSetup(batch_size=64)
    # y leads x and the defaults by paired median but beat the defaults in 2 of 4 rounds only; x in all 4.
    best = _best([_confirmed(x, (106.8, 133.4, 83.1, 134.1)), _confirmed(y, (101.5, 200.1, 124.7, 120.7)),
                  _confirmed(DEFAULTS, (106.4, 127.8, 73.5, 127.5))])
    assert best.setup == x and any("beat the PyTorch defaults beyond the noise" in n for n in best.notes)


def test_only_the_defaults_measured_say_so() -> None:
    best = _best([_confirmed(DEFAULTS, (100.0,))])
    assert best.setup == DEFAULTS and "the PyTorch defaults were the only setup the confirmation measured: no speedup to report" in best.notes
    assert best.speedup is None and best.defaults_samples_per_s == 100.0  # not "1.00x ... median of the paired rounds"


def test_the_notes_say_how_the_confirmation_settled() -> None:
    best = _best([_confirmed(MID, (230.0, 240.0)), _confirmed(FAST, (200.0, 205.0)), _confirmed(DEFAULTS, (100.0, 100.0))])
    note = next(n for n in best.notes if n.startswith("confirmation:"))
    assert "2 interleaved rounds" in note and "won 2 of 2 paired rounds" in note
    # The speedup's own evidence: the winner against the defaults, round by round.
    assert note.endswith("; against the PyTorch defaults it won 2 of 2 paired rounds, median +135%")
    two = _best([_confirmed(MID, (230.0, 240.0)), _confirmed(DEFAULTS, (100.0, 100.0))])
    # The runner-up is the defaults: named as such once (it read 'against the runner-up bs=32 w=0 fp32 the winner ...').
    said = next(n for n in two.notes if n.startswith("confirmation:"))
    assert said.count("PyTorch defaults") == 1 and f"runner-up {DEFAULTS.describe()} (the PyTorch defaults) the winner won" in said


def test_an_sgd_workload_scales_the_learning_rate_linearly() -> None:
    import dataclasses

    sgd = dataclasses.replace(WORKLOAD, lr_scaling="linear")
    best = make_best(
        workload=sgd, hardware=HARDWARE, feasible=FEASIBLE, confirmed=[_confirmed(FAST, (300.0,)), _confirmed(DEFAULTS, (100.0,))],
        defaults=DEFAULTS, effective_batch=None, command="",
    )
    assert best.lr == pytest.approx(1e-3 * 8)
    assert any("linearly with the batch" in n and "Goyal" in n for n in best.notes)
    kept = make_best(
        workload=dataclasses.replace(WORKLOAD, lr_scaling="none"), hardware=HARDWARE, feasible=FEASIBLE,
        confirmed=[_confirmed(FAST, (300.0,)), _confirmed(DEFAULTS, (100.0,))], defaults=DEFAULTS, effective_batch=None, command="",
    )
    assert kept.lr == pytest.approx(1e-3) and any(n.startswith(f"effective batch {kept.effective_batch} differs from the reference 32: "
                                                               "the learning rate is kept at 0.001") for n in kept.notes), kept.notes


def test_a_stream_that_does_not_split_among_workers_is_named_in_the_notes() -> None:
    """The search kept num_workers <= 1 for such a stream and said so once, in a progress line: result.notes, best.json
    and report.html never did, and a Python API user (no progress shown) never learnt it."""
    hardware = SimpleNamespace(to_dict=HARDWARE.to_dict, cpu=SimpleNamespace(usable_cores=2))

    def notes(unsharded: bool) -> list[str]:
        workload = dataclasses.replace(WORKLOAD, unsharded=unsharded)
        return list(make_best(workload=workload, hardware=hardware, feasible=FEASIBLE, confirmed=[], defaults=DEFAULTS,
                              effective_batch=None, command="autotune search").notes)

    said = [n for n in notes(True) if n.startswith("the dataset: this IterableDataset does not split its stream")]
    assert len(said) == 1 and said[0].endswith("to let more workers load it") and "num_workers <= 1" in said[0], said
    assert not [n for n in notes(False) if "does not split its stream" in n]


def test_a_search_on_a_busy_machine_says_how_busy() -> None:
    def loaded(number: int, other: float | None) -> TrialRecord:
        record = _record(number, DEFAULTS if number == 0 else MID, 100.0 + number)
        return dataclasses.replace(record, result=dataclasses.replace(record.result, other_cores=other))

    hardware = SimpleNamespace(to_dict=HARDWARE.to_dict, cpu=SimpleNamespace(usable_cores=2))

    def notes(loads: list[float | None]) -> list[str]:
        feasible = [loaded(i, other) for i, other in enumerate(loads)]
        return list(make_best(workload=WORKLOAD, hardware=hardware, feasible=feasible, confirmed=[], defaults=DEFAULTS,
                              effective_batch=None, command="autotune search").notes)

    busy = [n for n in notes([0.9, 1.2, 0.1, None]) if n.startswith("other processes")]
    assert busy == [busy[0]] and "kept 0.9 of the 2 usable cores busy" in busy[0] and "median over 3 trials, up to 1.2" in busy[0]
    assert not any(n.startswith(("other processes", "the load changed")) for n in notes([0.0, 0.1, 0.3]))  # under a quarter core
    # A load that came and went: a backup job during one trial of four, idle otherwise (no note before).
    changed = [n for n in notes([0.05, 0.05, 1.9, 0.05]) if n.startswith("the load changed")]
    assert changed == ["the load changed during the search: other processes kept up to 1.9 of the 2 usable cores busy during 1 trial "
                       "of the 4 measured to the end (#2: 1.9), against a median of 0.1 (trials.csv column other_cores): their "
                       "figures read low, so a setup they measured may be missing from the finalists; run the search again on an "
                       "idle machine to compare every setup alike"], changed
    assert not any(n.startswith("other processes") for n in notes([None, None]))  # not known (a quota below the affinity)
    from autotune.tuner.winner import load_note

    feasible = [loaded(i, 0.6) for i in range(3)]
    assert "kept 0.6 of the 1 usable core busy" in (load_note(feasible, 1) or "")
    assert "kept 0.6 cores busy" in (load_note(feasible, 0) or "")  # the usable count unknown
    assert load_note(feasible, 16) is None  # under a tenth of 16 cores: within the noise (the H200 host read 0.6 idle)
    assert "kept 2.0 of the 16 usable cores busy" in (load_note([loaded(i, 2.0) for i in range(3)], 16) or "")
    # A repeat (its earlier trial's figures) ran nothing: not counted, nor weighting its trial's load twice.
    repeats = [dataclasses.replace(loaded(3 + i, 1.9), reused_from=0, free=i == 0) for i in range(2)]
    assert "median over 2 trials, up to 0.9" in (load_note([loaded(0, 0.9), loaded(1, 0.8), *repeats], 2) or "")


def test_a_finalist_whose_rounds_disagree_with_its_trial_beyond_twice_is_named() -> None:
    """The defaults' trial ran at 100 samples/s; rounds at 40 (the machine got busy) inflate the speedup: the note says so."""
    drifted = _best([_confirmed(MID, (230.0, 220.0, 250.0)), _confirmed(DEFAULTS, (40.0, 45.0, 38.0))])
    assert drifted.setup == MID and drifted.speedup == pytest.approx(5.75)
    drift = [n for n in drifted.notes if n.startswith("the confirmation rounds and the trials disagree")]
    assert len(drift) == 1 and f"{DEFAULTS.describe()}: 40.0 samples/s in the rounds, 100.0 in its trial" in drift[0]
    assert MID.describe() not in drift[0]  # 230 against 240: noise
    steady = _best([_confirmed(MID, (230.0, 220.0, 250.0)), _confirmed(DEFAULTS, (60.0, 55.0, 52.0))])  # 0.55x its trial: noise
    assert not any("disagree" in n for n in steady.notes)
    faster = _best([_confirmed(MID, (530.0, 520.0, 550.0)), _confirmed(DEFAULTS, (110.0, 100.0, 90.0))])  # the trial ran busy
    assert any(f"{MID.describe()}: 530.0 samples/s in the rounds, 240.0 in its trial" in n for n in faster.notes)


def test_a_speedup_whose_paired_rounds_disagree_is_said_to_be_no_figure_to_rely_on() -> None:
    """The defaults' torch-chosen thread count collapsed whenever another process took a core (27,098 samples/s, then
    432, 374, 27,104): the paired ratios ran from 0.078x to 59.9x, and their median 2.63x sat beside two medians 1.02x
    apart with no word (a probe on a shared 2-core machine). The note says the speedup cannot be relied on."""
    defaults = (27098.0, 432.0, 374.0, 27104.0)
    swung = _best([_confirmed(MID, tuple(r * d for r, d in zip((1.19, 59.9, 5.8, 0.078), defaults, strict=True))),
                   _confirmed(DEFAULTS, defaults)])
    assert swung.setup == MID and swung.speedup == pytest.approx(2.627, abs=0.01)
    (note,) = [n for n in swung.notes if n.startswith("the winner's paired rounds against the PyTorch defaults disagree")]
    # The ratios the decision compared: the round farthest from their median (0.078x) left out, as the decision does.
    assert note == ("the winner's paired rounds against the PyTorch defaults disagree (ratios 1.19x to 59.9x over 3 of 4 rounds, "
                    "the one farthest from their median left out): "
                    "the load on the machine changed within rounds, which pairing does not cancel, so the 2.63x speedup is no "
                    "figure to rely on; run the search again on an idle machine")
    steady = _best([_confirmed(MID, (230.0, 220.0, 250.0)), _confirmed(DEFAULTS, (100.0, 105.0, 98.0))])
    assert not any("paired rounds against the PyTorch defaults disagree" in n for n in steady.notes)


def test_reduced_precision_that_gains_nothing_over_its_fp32_twin_gives_way() -> None:
    """A bf16 leader within the noise of the same setup in float32: the float32 one wins (the numerics stay); a clear gain keeps bf16."""
    bf16 = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2, persistent_workers=True, amp="bf16")  # batch 64: both change the math
    twin = Confirmed(Candidate(bf16.replace(amp="off").to_json(), bf16.replace(amp="off"), "twin"), (199.0, 201.0, 200.0, 198.0), (), 3 * 2**30)
    base = _confirmed(DEFAULTS, (100.0, 100.0, 100.0, 100.0))
    tie = _best([_confirmed(bf16, (202.0, 200.0, 201.0, 199.0)), twin, base])
    assert tie.setup == bf16.replace(amp="off") and tie.peak_memory_bytes == 3 * 2**30  # measured in the confirmation only
    said = [n for n in tie.notes if "trains in float32 (no autocast) and is within the noise" in n]
    assert len(said) == 1 and f"within the noise of {bf16.describe()} (against it, it won 1 of 4 paired rounds, median -1%)" in said[0]
    assert not any("changes the numerics" in n for n in tie.notes)
    clear = _best([_confirmed(bf16, (260.0, 255.0, 262.0, 258.0)), twin, base])
    assert clear.setup == bf16 and any("amp=bf16 changes the numerics" in n for n in clear.notes)


def test_a_task_batch_larger_than_its_data_gives_way_to_the_batch_a_dataloader_makes_of_it() -> None:
    """Task(batch_size=64, lr=1e-3) over 50 samples: the user's own loop trains batches of all 50 at lr 1e-3, as the
    defaults ran; a winner that runs them too keeps that rate (it was scaled to batch 50 from 64, the defaults winning)."""
    workload = dataclasses.replace(WORKLOAD, task="m:make_task", reference_batch=64, images=50)
    all50 = TrainSetup(batch_size=50)
    best = make_best(workload=workload, hardware=HARDWARE, feasible=[_record(0, all50, 100.0)],
                     confirmed=[_confirmed(all50, (100.0,))], defaults=all50, effective_batch=None, command="autotune search")
    assert best.reference_batch == 50 and best.effective_batch == 50 and best.lr == pytest.approx(1e-3)
    assert not any(n.startswith("effective batch") for n in best.notes), best.notes
    assert ("the data holds 50 samples, fewer than your recipe's batch 64: a DataLoader's batch holds them all, as the defaults "
            "ran, so your lr 0.001 is taken as the rate for batch 50") in best.notes
    # A stream of 5 items (no length) under batch_size 32: "the data holds 0 samples" said a probe's note.
    stream, four = dataclasses.replace(workload, images=None, iterable=True, reference_batch=32), TrainSetup(batch_size=4)
    short = make_best(workload=stream, hardware=HARDWARE, feasible=[_record(0, four, 100.0)], confirmed=[_confirmed(four, (100.0,))],
                      defaults=four, effective_batch=None, command="autotune search")
    assert ("a pass of the stream yields no full batch of your recipe's batch 32: the defaults ran its largest full batch, so "
            "your lr 0.001 is taken as the rate for batch 4") in short.notes, short.notes
    # A smaller batch than all 50 scales from 50.
    b16 = TrainSetup(batch_size=16)
    smaller = make_best(workload=workload, hardware=HARDWARE, feasible=[_record(0, all50, 100.0), _record(1, b16, 200.0)],
                        confirmed=[_confirmed(b16, (200.0, 201.0, 199.0)), _confirmed(all50, (100.0, 101.0, 99.0))], defaults=all50,
                        effective_batch=None, command="autotune search")
    assert smaller.setup == b16 and smaller.lr == pytest.approx(1e-3 * (16 / 50) ** 0.5)
    assert any(n.startswith("effective batch 16 differs from the reference 50") for n in smaller.notes), smaller.notes


def test_a_winner_whose_steps_leave_much_of_a_small_dataset_out_says_so() -> None:
    workload = dataclasses.replace(WORKLOAD, task="m:make_task", reference_batch=16, images=50)
    b32 = TrainSetup(batch_size=32)
    best = make_best(workload=workload, hardware=HARDWARE, feasible=[_record(0, b32, 100.0)], confirmed=[_confirmed(b32, (100.0,))],
                     defaults=TrainSetup(batch_size=16), effective_batch=None, command="autotune search")
    assert any(n.startswith("an epoch holds whole optimizer steps of 32 only: each skips 18 of the 50 training samples") for n in best.notes)
    many = make_best(workload=dataclasses.replace(workload, images=2000), hardware=HARDWARE, feasible=[_record(0, b32, 100.0)],
                     confirmed=[_confirmed(b32, (100.0,))], defaults=TrainSetup(batch_size=16), effective_batch=None, command="x")
    assert not any("skips" in n for n in many.notes)  # 16 of 2000 left out: no note


def test_the_winners_own_ceilings_below_its_speed_name_no_limit_whatever_its_wait() -> None:
    """Measured like for like, compute alone at 6772 against 42342 together: no side is named."""
    from autotune.rounds import Ceilings

    best = _best([_confirmed(MID, (42342.0,))])
    said = bottleneck_verdict(best, _calibration(1000.0, 1000.0), [_record(2, MID, 42342.0, wait=0.38)], CPU,
                              Ceilings(together=42342.0, compute=6772.0, loader=117205.0, data_wait_fraction=0.38))
    assert said.startswith("unclear: training measured faster than computing alone (at the winner's setup: compute alone 6772")
    assert said.endswith("the steps are too short or too noisy to compare.")


def test_a_winner_that_trains_at_its_loader_s_rate_is_input_bound() -> None:
    """Large JPEGs cropped to 64 px, measured like for like: a short loader-only run read below training (33 against 44
    samples/s) while training waited on the DataLoader 44 % of the time, and the verdict said "unclear"; with resnet18,
    computing alone 66, loading alone 34, training 40 at a 10 % wait, it said "compute-bound". The training's own wait,
    or its rate at the loader's and far below computing alone, names the loader."""
    from autotune.rounds import Ceilings

    best = _best([_confirmed(MID, (44.0,))])
    waited = bottleneck_verdict(best, _calibration(1000.0, 1000.0), [_record(2, MID, 44.0, wait=0.44)], CPU,
                                Ceilings(together=44.0, compute=175.0, loader=33.0, data_wait_fraction=0.44))
    assert waited.startswith("input-bound: the winner waits on the DataLoader 44% of the time (at the winner's setup: compute alone 175")
    rate = bottleneck_verdict(best, _calibration(1000.0, 1000.0), [_record(2, MID, 40.0, wait=0.1)], CPU,
                              Ceilings(together=40.0, compute=66.0, loader=34.0, data_wait_fraction=0.1))
    assert rate.startswith("input-bound: training runs at about the loader's own rate, well below computing alone, though it "
                           "waited on the DataLoader only 10% of the time (at the winner's setup: compute alone 66"), rate
    # Without loader workers the two add up in one process: serial, as before.
    serial = bottleneck_verdict(_best([_confirmed(DEFAULTS, (40.0,))]), _calibration(1000.0, 1000.0), [_record(2, DEFAULTS, 40.0, wait=0.1)],
                                CPU, Ceilings(together=40.0, compute=66.0, loader=34.0, data_wait_fraction=0.1))
    assert not serial.startswith("input-bound"), serial


def test_a_finalist_that_failed_every_confirmation_run_is_named_in_the_notes() -> None:
    """In an 8 MiB /dev/shm the search's fastest trial (2 workers x prefetch 6) failed in both confirmation rounds:
    best.json named another winner and said nothing of why the fastest trial was not it."""
    full = "error: failed in a DataLoader worker: unable to allocate shared memory(shm)"
    lost = Confirmed(Candidate(MID.to_json(), MID, "#3 " + MID.describe()), (), (full, full))
    best = _best([lost, _confirmed(DEFAULTS, (100.0, 101.0)), _confirmed(FAST := MID.replace(num_workers=2), (150.0, 151.0))])
    assert best.setup == FAST
    assert f"the finalist #3 {MID.describe()} failed in every confirmation run ({full}): the figure its trial measured is not what " \
           "it sustains, so it is not the winner" in best.notes, best.notes


def test_a_later_preference_never_brings_back_a_cost_an_earlier_one_removed() -> None:
    """A compiled bf16 leader gives way to its eager twin; its compiled fp32 twin, as fast, is not then preferred."""
    compiled = TrainSetup(batch_size=32, amp="bf16", compile="default")
    eager = compiled.replace(compile="off")
    fp32_compiled = compiled.replace(amp="off")
    best = _best([_confirmed(compiled, (1000.0, 1001.0, 999.0, 1000.0)), _confirmed(eager, (995.0, 996.0, 994.0, 995.0)),
                  _confirmed(fp32_compiled, (990.0, 991.0, 989.0, 990.0)), _confirmed(DEFAULTS, (500.0, 500.0, 500.0, 500.0))])
    assert best.setup == eager
    assert any("runs eagerly" in n for n in best.notes) and not any("trains in float32" in n for n in best.notes)


def test_defaults_below_the_recipe_batch_under_a_pinned_effective_batch_say_why() -> None:
    """--effective-batch 7 with a Task batch of 4: the defaults run 1 x 7 (4 does not divide 7), and the note says so."""
    task = dataclasses.replace(WORKLOAD, task="m:make_task", reference_batch=4, images=100)
    odd = TrainSetup(batch_size=1, accumulation_steps=7)

    def notes(workload: Workload, defaults: TrainSetup, effective: int, world_size: int = 1) -> list[str]:
        feasible = [_record(0, defaults, 50.0), _record(1, MID, 90.0)]
        return [n for n in make_best(workload=workload, hardware=HARDWARE, feasible=feasible, confirmed=[], defaults=defaults,
                                     effective_batch=effective, command="", world_size=world_size).notes if "PyTorch defaults ran" in n]

    said = notes(task, odd, 7)
    assert said == ["the PyTorch defaults ran batch 1 x 7 accumulation steps, the largest batch up to your recipe's 4 that divides "
                    "--effective-batch 7: the math every setup keeps"]
    assert notes(task, TrainSetup(batch_size=4, accumulation_steps=2), 8) == []  # the recipe's batch itself
    ddp = notes(WORKLOAD, TrainSetup(batch_size=24, accumulation_steps=2), 96, 2)
    assert "the default's 32 that divides --effective-batch 96 (48 per rank)" in ddp[0]


def test_a_winner_without_its_fp32_twin_says_what_stood_in_for_it() -> None:
    """A bf16 finalist whose twin the calibration's figures made needless (confirm.autocast_evident): best.json names
    that evidence, and no fp32 round is claimed. A winner that met its twin, or an fp32 winner, says nothing of it."""
    why = "the calibration measured bf16 1.57x float32 computing alone (contiguous, batch 64) and its trial waited on the loader 0% of the time"
    fast = Confirmed(Candidate(FAST.to_json(), FAST, FAST.describe(), no_twin=why), (300.0, 310.0), ())
    best = _best([fast, _confirmed(MID, (230.0, 220.0)), _confirmed(DEFAULTS, (110.0, 100.0))])
    assert best.setup == FAST
    assert f"the winner's float32 twin was not re-measured: {why}, so the same setup in float32 would be clearly slower" in best.notes
    plain = _best([_confirmed(FAST, (300.0, 310.0)), _confirmed(MID, (230.0, 220.0)), _confirmed(DEFAULTS, (110.0, 100.0))])
    assert not any("twin" in n for n in plain.notes)
    beaten = _best([fast, _confirmed(MID, (330.0, 340.0)), _confirmed(DEFAULTS, (110.0, 100.0))])
    assert beaten.setup == MID and not any("twin" in n for n in beaten.notes)


@pytest.mark.parametrize(("leader", "other"), [
    (TrainSetup(batch_size=64, amp="bf16", num_workers=1, prefetch_factor=2), TrainSetup(batch_size=64, amp="bf16", channels_last=True)),
    (TrainSetup(batch_size=64), TrainSetup(batch_size=64, amp="bf16")),
    (TrainSetup(batch_size=64, amp="bf16"), TrainSetup(batch_size=64)),
    (TrainSetup(batch_size=64, compile="default"), TrainSetup(batch_size=64)),
    (TrainSetup(batch_size=128, num_workers=1, prefetch_factor=2), TrainSetup(batch_size=64)),
    (TrainSetup(batch_size=32, accumulation_steps=4), TrainSetup(batch_size=128)),
])
def test_a_setup_never_preferred_to_a_leader_within_noise_is_never_returned_instead_of_it(leader: TrainSetup, other: TrainSetup) -> None:
    """The confirmation ends the rounds of a finalist behind the leader in every round only where the winner's rules
    would not return it anyway (choice.never_preferred): that must agree with what choose_winner does with the same rounds
    (the leader 1-4 % ahead, never 3 % at the median: within the noise)."""
    from autotune.tuner.choice import never_preferred

    best = _best([_confirmed(leader, (200.0, 210.0, 200.0)), _confirmed(other, (198.0, 201.0, 196.0)),
                  _confirmed(DEFAULTS, (100.0, 100.0, 100.0))])
    assert never_preferred(other, leader) == (best.setup == leader)


def test_defaults_not_run_yet_are_not_said_to_have_failed() -> None:
    """A search stopped before the defaults' trial (a resumed one runs them again, last): no speedup, and the note
    says they were not measured yet, not that their trial ended without a throughput (trials.csv has no such row)."""
    best = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=FEASIBLE[1:], confirmed=[], defaults=DEFAULTS,
                     effective_batch=None, command="", interrupted=True, defaults_ran=False)
    assert best.speedup is None and best.defaults_samples_per_s is None
    assert any(n.startswith("the PyTorch defaults (bs=32 w=0 fp32) were not measured yet") for n in best.notes), best.notes
    assert not any("ended without a throughput" in n for n in best.notes)
    failed = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=FEASIBLE[1:], confirmed=[], defaults=DEFAULTS,
                       effective_batch=None, command="", interrupted=True)
    assert any("could not be measured: their trial ended without a throughput" in n for n in failed.notes)



def test_an_unconfirmed_speedup_takes_the_defaults_median_over_their_trials() -> None:
    """The defaults measured in three trials, the first beside a load (3.7 samples/s). Before, the best so far was divided
    by that first trial alone: 24.9x the defaults, where their other trials put it at 5x."""
    feasible = [_record(0, DEFAULTS, 3.7), _record(1, FAST, 92.0), _record(5, DEFAULTS, 18.0), _record(6, DEFAULTS, 20.0)]
    best = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=feasible, confirmed=[], defaults=DEFAULTS,
                     effective_batch=None, command="", interrupted=True)
    assert best.setup == FAST and best.defaults_samples_per_s == 18.0 and best.speedup == pytest.approx(92.0 / 18.0)
    # Repeats of the slowed trial (a resumed search's same setup, not run again) carry its figure: counted once.
    repeats = [dataclasses.replace(_record(n, DEFAULTS, 3.7), reused_from=0, free=True) for n in (7, 8)]
    best = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=feasible + repeats, confirmed=[], defaults=DEFAULTS,
                     effective_batch=None, command="", interrupted=True)
    assert best.defaults_samples_per_s == 18.0, best.defaults_samples_per_s


def test_an_interrupted_confirmation_s_rounds_give_the_speedup_where_the_pick_and_the_defaults_shared_one() -> None:
    """Under a swamped machine the defaults' single trial read 4.9 samples/s and best.json said 27x; the rounds the
    interrupted confirmation measured side by side said about 1.1x. The pick stays the fastest single trial
    (unconfirmed); its speedup over the defaults is their paired ratio there, and both rates are theirs there."""
    feasible = [_record(0, DEFAULTS, 4.9), _record(1, FAST, 132.0), _record(2, MID, 120.0)]
    partial = (_confirmed(FAST, (210.0,)), _confirmed(DEFAULTS, (190.0,)), _confirmed(MID, ()))

    def best(rounds: tuple[Confirmed, ...]):
        return make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=feasible, confirmed=[], defaults=DEFAULTS,
                         effective_batch=None, command="autotune search", interrupted=True, partial=rounds)

    paired = best(partial)
    assert paired.setup == FAST and not paired.confirmed
    assert paired.speedup == pytest.approx(210.0 / 190.0) and paired.defaults_samples_per_s == 190.0
    assert paired.samples_per_s == 210.0  # its rate from the same rounds: never a speedup beside a lower rate
    assert paired.speedup_basis == "paired rounds of an interrupted confirmation, unconfirmed"
    assert any("their paired ratio in the rounds both ran" in note for note in paired.notes)
    single = best(partial[1:])  # the pick measured no round: the single trials' ratio, as before
    assert single.speedup == pytest.approx(132.0 / 4.9) and single.speedup_basis == "single trials, unconfirmed"


def test_an_interrupted_confirmation_s_rounds_rank_the_single_trials_they_ran_side_by_side() -> None:
    """A probe's Ctrl-C at the second run of the confirmation: the defaults' single trial (63.3 samples/s in a quiet
    minute) was the pick, written to best.json and train.py, though the round just measured ran them at 12.2 and trial
    #5's setup at 82.0, side by side. A setup ahead of the fastest single trial's in the rounds both ran leads."""
    feasible = [_record(0, DEFAULTS, 63.3), _record(1, FAST, 60.0), _record(2, MID, 50.0)]
    partial = (_confirmed(DEFAULTS, (12.2,)), _confirmed(FAST, (82.0,)), _confirmed(MID, ()))
    best = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=feasible, confirmed=[], defaults=DEFAULTS,
                     effective_batch=None, command="autotune search", interrupted=True, partial=partial)
    assert best.setup == FAST and not best.confirmed
    assert best.samples_per_s == 82.0 and best.speedup == pytest.approx(82.0 / 12.2)
    # The note said the rounds were "too few to rank" beside a pick they ranked.
    assert any("(its rounds so far are shown, #1 ran ahead of the fastest trial #0 in the rounds both ran;" in n for n in best.notes)
    behind = (_confirmed(DEFAULTS, (81.0,)), _confirmed(FAST, (82.0,)), _confirmed(MID, ()))  # within the noise floor: kept
    kept = make_best(workload=WORKLOAD, hardware=HARDWARE, feasible=feasible, confirmed=[], defaults=DEFAULTS,
                     effective_batch=None, command="autotune search", interrupted=True, partial=behind)
    assert kept.setup == DEFAULTS
    assert any("(its rounds so far are shown, too few to rank;" in n for n in kept.notes)


def test_a_speedup_far_from_the_ratio_of_the_medians_beside_it_says_both() -> None:
    """A probe's line: "2871.3 samples/s, 2.19x the PyTorch defaults (2564.8 samples/s; median of the paired rounds)":
    2871.3 / 2564.8 is 1.12; the rounds paired 2.19x, 1.01x and 3.22x, and no note said why the figures differ."""
    winner = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2)
    best = _best([_confirmed(winner, (5625.4, 2871.3, 2732.7)), _confirmed(DEFAULTS, (2564.8, 2837.4, 848.5))])
    assert best.setup == winner and best.speedup == pytest.approx(5625.4 / 2564.8)
    assert ("the 2.19x speedup is the median of the paired rounds' ratios (1.01x, 2.19x, 3.22x); the two medians (2871.3 "
            "against 2564.8 samples/s) are 1.12x apart: each comes from its own runs (the load changed between rounds, or one "
            "of them ran fewer rounds), which the pairing of each round's two runs cancels") in best.notes
    steady = _best([_confirmed(winner, (200.0, 210.0, 205.0)), _confirmed(DEFAULTS, (100.0, 104.0, 101.0))])
    assert not any("median of the paired rounds' ratios" in note for note in steady.notes)
    # The line itself points at the note (a probe's "1810.4 samples/s, 2.15x the PyTorch defaults (18503.9 samples/s; ...)").
    assert best.speedup_basis == "median of 3 paired rounds, 1.01x to 3.22x; the two medians were measured apart: see the note"
    assert steady.speedup_basis == "median of 3 paired rounds, 2.00x to 2.03x"


def test_the_speedup_says_how_many_paired_rounds_it_is_the_median_of_and_their_range() -> None:
    """A harness's search printed "1.91x the PyTorch defaults (96.9 samples/s; median of the paired rounds)" from 2 rounds
    (1.90x and 1.92x), where fresh rounds of the same pair measured 1.55x to 2.02x: the line gives the rounds and their
    range, best.json keeps the ratios, and a best.json written before the field still reads."""
    from autotune.output.best import Best

    winner = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2)
    best = _best([_confirmed(winner, (190.0, 192.0)), _confirmed(DEFAULTS, (100.0, 100.0))])
    assert best.speedup_rounds == pytest.approx((1.90, 1.92)) and best.speedup == pytest.approx((1.90 * 1.92) ** 0.5)
    assert best.speedup_basis == "median of 2 paired rounds, 1.90x to 1.92x"
    assert Best.from_dict(best.to_dict()) == best
    one = _best([_confirmed(winner, (190.0,)), _confirmed(DEFAULTS, (100.0,))])
    assert one.speedup_basis == "one paired round" and one.speedup_rounds == pytest.approx((1.9,))
    older = best.to_dict()
    del older["speedup_rounds"]
    assert Best.from_dict(older).speedup_basis == "median of the paired rounds"
    alike = _best([_confirmed(winner, (190.0, 380.0)), _confirmed(DEFAULTS, (100.0, 200.0))])  # "1.90x to 1.90x"
    assert alike.speedup_basis == "median of 2 paired rounds, all 1.90x"
    kept = _best([_confirmed(DEFAULTS, (100.0, 100.0)), _confirmed(winner, (90.0, 95.0))])  # the defaults won: nothing paired
    assert kept.setup == DEFAULTS and kept.speedup == 1.0 and kept.speedup_rounds == () and kept.defaults_won
    assert not best.defaults_won and not one.defaults_won
    with pytest.raises(AutotuneError, match="'speedup_rounds' must be a list of positive numbers"):
        Best.from_dict({**best.to_dict(), "speedup_rounds": [1.9, -1]})


def test_a_winner_that_accumulates_says_batch_norm_sees_the_micro_batch() -> None:
    """--effective-batch 64 won as 16 x 4: the optimizer's math is kept, a BatchNorm layer's statistics are not."""
    accumulating = TrainSetup(batch_size=16, accumulation_steps=4)
    best = _best([_confirmed(accumulating, (300.0, 310.0)), _confirmed(DEFAULTS, (100.0, 101.0))], effective_batch=64)
    assert ("accumulation keeps the optimizer's step of 64 samples, but a BatchNorm layer (where the model has one) computes "
            "its statistics over each micro-batch of 16: check your accuracy once, or --set accumulation_steps=1") in best.notes
    plain = _best([_confirmed(TrainSetup(batch_size=64), (300.0, 310.0)), _confirmed(DEFAULTS, (100.0, 101.0))])
    assert not any("BatchNorm" in note for note in plain.notes)
    # Where the model is known to hold BatchNorm layers, said plainly; where it holds none (a ViT, an MLP), not said.
    said = {}
    for batch_norm in (True, False):
        known = dataclasses.replace(WORKLOAD, batch_norm=batch_norm)
        notes = _best([_confirmed(accumulating, (300.0, 310.0)), _confirmed(DEFAULTS, (100.0, 101.0))], effective_batch=64,
                      workload=known).notes
        said[batch_norm] = [note for note in notes if "BatchNorm" in note]
    assert said[True] == ["accumulation keeps the optimizer's step of 64 samples, but the model's BatchNorm layers compute their "
                          "statistics over each micro-batch of 16: check your accuracy once, or --set accumulation_steps=1"]
    assert said[False] == []
    from autotune.workloads import build_workload

    for model, holds in (("resnet18", True), ("vit_b_16", False), ("alexnet", False)):
        assert build_workload(model=model, image_size=32, data=None, device="cpu", write_data=False).batch_norm is holds, model
    assert Workload.from_dict(dataclasses.replace(WORKLOAD, batch_norm=True).to_dict()).batch_norm is True
    assert "batch_norm" not in WORKLOAD.to_dict()  # not known: left out, as files before the field


def test_a_ddp_winner_says_batch_norm_sees_each_rank_s_batch() -> None:
    """Under DDP a BatchNorm layer normalises over one rank's batch, not the step's samples: said, where the model may hold one."""
    confirmed = [_confirmed(MID, (200.0,)), _confirmed(DEFAULTS, (100.0,))]

    def said(world_size: int, batch_norm: bool | None) -> list[str]:
        best = make_best(workload=dataclasses.replace(WORKLOAD, batch_norm=batch_norm), hardware=HARDWARE, feasible=FEASIBLE,
                         confirmed=confirmed, defaults=DEFAULTS, effective_batch=None, command="autotune search",
                         world_size=world_size)
        return [n for n in best.notes if "BatchNorm" in n]

    assert said(2, True) == [f"under DDP the model's BatchNorm layers compute their statistics over each rank's batch of "
                             f"{MID.batch_size}, not the step's {MID.batch_size * 2} samples (torch.nn.SyncBatchNorm would, "
                             "at a cost these trials did not measure)"]
    assert "a BatchNorm layer (where the model has one)" in said(2, None)[0]
    assert said(2, False) == [] and said(1, True) == []


def test_a_winner_whose_step_is_a_large_part_of_a_small_epoch_says_how_few_updates_an_epoch_makes() -> None:
    """256 samples and a pick of 128 x 2: one optimizer step an epoch, where the recipe's 32 makes 8; said nowhere."""
    from autotune.epochs import epoch_notes

    small = dataclasses.replace(WORKLOAD, images=256)
    whole = TrainSetup(batch_size=128, accumulation_steps=2)
    best = _best([_confirmed(whole, (300.0, 310.0)), _confirmed(DEFAULTS, (100.0, 101.0))], workload=small)
    assert best.setup == whole
    assert ("an epoch of the 256 training images is 1 optimizer step of 256, where the reference batch of 32 makes 8: the "
            "same epochs make 8x fewer updates, so check the accuracy per epoch once") in best.notes, best.notes
    assert epoch_notes(2000, 128, 32, "images") == []  # 15 steps an epoch: nothing to say
    assert epoch_notes(256, 32, 32, "samples") == []  # the reference's own step (--effective-batch keeps it)
    assert epoch_notes(None, 256, 32, "samples") == []  # a stream: no epoch length
    assert len(epoch_notes(300, 128, 32, "samples", " of a rank")) == 2  # 44 of 300 skipped, and 2 steps against 9


def test_a_failed_confirmation_run_of_the_winner_or_the_defaults_is_said() -> None:
    """A probe's defaults run killed by the kernel in the second round: the summary read '1.74x the PyTorch defaults ...
    won 1 of 1 paired rounds', the kill unsaid."""
    from dataclasses import replace

    killed = "oom: the trial process was killed (SIGKILL), most likely by the kernel's out-of-memory killer"
    defaults = replace(_confirmed(DEFAULTS, (100.0,)), failures=(killed,), failed_rounds=(1,))
    best = _best([_confirmed(FAST, (174.0, 170.0)), defaults])
    assert best.setup == FAST
    assert f"1 of 2 confirmation runs of the PyTorch defaults failed ({killed}): the figures count the rounds it measured in" in best.notes
    clean = _best([_confirmed(FAST, (174.0, 170.0)), _confirmed(DEFAULTS, (100.0, 101.0))])
    assert not any("confirmation runs of" in note for note in clean.notes)


def test_the_runner_up_named_is_one_that_ran_as_many_rounds_as_the_winner() -> None:
    """A probe's note: "against the runner-up bs=512 w=0 bf16 ... the winner won 1 of 2 paired rounds, median -27%": that
    setup stopped after two rounds (another beat it there) and its median, of other minutes, read highest."""
    from autotune.tuner.choice import choose_winner

    winner = TrainSetup(batch_size=32, num_workers=2, prefetch_factor=2, persistent_workers=True)
    second = TrainSetup(batch_size=32, num_workers=1, prefetch_factor=2, persistent_workers=True)
    stopped = _confirmed(MID, (300.0, 290.0))  # beaten in round 2 by the second, which the winner then beat
    chosen, notes = choose_winner([_confirmed(winner, (250.0, 252.0, 251.0, 249.0)), _confirmed(second, (240.0, 241.0, 239.0, 238.0)),
                                   stopped, _confirmed(DEFAULTS, (100.0, 101.0, 99.0, 100.0))], DEFAULTS.to_json(), 32)
    assert chosen.candidate.setup == winner
    line = next(n for n in notes if n.startswith("confirmation: 4 interleaved rounds"))
    assert f"against the runner-up {second.describe()}" in line and MID.describe() not in line, line


def test_a_twin_that_wins_with_no_peak_measured_alone_says_its_peak_was_not_measured() -> None:
    """An fp32 twin no trial ran has peaks from its confirmation rounds only; a round run beside held finalists gives
    none (their shared pages make it read low): best.json then has no peak and says why, and one measured alone counts."""
    twin = FAST.replace(amp="off")
    rounds = [Confirmed(Candidate(twin.to_json(), twin, twin.describe(), twin=True), (300.0, 310.0), ()),
              _confirmed(FAST, (200.0, 210.0)), _confirmed(DEFAULTS, (100.0, 100.0))]
    best = _best(rounds)
    assert best.setup == twin and best.peak_memory_bytes is None
    assert any(n.startswith("peak memory not measured: no trial of this setup measured it") for n in best.notes)
    alone = _best([dataclasses.replace(rounds[0], peak_bytes=3 * 2**30), *rounds[1:]])
    assert alone.peak_memory_bytes == 3 * 2**30 and not any(n.startswith("peak memory not measured") for n in alone.notes)
