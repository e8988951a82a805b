"""The local search after TPE: one-knob moves from the leading setup."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from autotune.devices import DeviceInfo
from autotune.records import Calibration, LoaderPoint, TrialRecord, TrialResult
from autotune.train_setup import KNOBS, TrainSetup
from autotune.tuner import SearchConfig, run_search
from autotune.tuner.neighbours import ROLE_NEIGHBOUR, moves, neighbour_trials, next_move
from autotune.tuner.space import Space, build_space

CPU = DeviceInfo("cpu", bf16=True, memory_total_bytes=None, memory_free_bytes=None, label="test CPU")


def space(effective_batch: int | None = None, images: int | None = None) -> Space:
    calibration = Calibration(
        budget_bytes=2**33, max_batch=256, memory_points=(), probe_batch=64, compute_setup=TrainSetup(),
        compute_samples_per_s=100.0, loader=(LoaderPoint(0, "ok", 50.0),), max_workers=2,
    )
    return build_space(device=CPU, calibration=calibration, usable_cores=2, effective_batch=effective_batch, constraints={},
                       images=images)


def sampled(**knobs) -> TrainSetup:
    """A setup as the space samples it (an explicit optimizer kernel, not torch's own choice)."""
    return TrainSetup(**{"optimizer_impl": "foreach", **knobs})


def changed(a: TrainSetup, b: TrainSetup) -> set[str]:
    return {k for k in KNOBS if getattr(a, k) != getattr(b, k)}


def test_moves_go_one_step_along_ordered_knobs_and_to_every_other_choice() -> None:
    leader = sampled(batch_size=64, num_workers=1, prefetch_factor=4, persistent_workers=True, amp="bf16", num_threads=1)
    found = {(knob, value) for knob, value, _ in moves(space(), leader)}
    assert ("batch_size", 128) in found and ("batch_size", 32) in found
    assert not any(knob == "batch_size" and value not in (32, 128) for knob, value in found)  # one step, not a jump
    assert {("num_workers", 0), ("num_workers", 2), ("prefetch_factor", 3), ("prefetch_factor", 5)} <= found
    assert {("amp", "off"), ("num_threads", None), ("num_threads", 2), ("channels_last", True)} <= found
    assert not any(knob == "compile" for knob, _ in found)  # compiling is the refinement after these
    for knob, value, setup in moves(space(), leader):
        assert getattr(setup, knob) == value
        # Only the knob moves, and what follows from it (a loader without workers has no queue).
        assert changed(leader, setup) <= {knob, "prefetch_factor", "persistent_workers"}


def test_a_move_to_accumulation_from_a_static_graph_leader_switches_the_static_graph_off() -> None:
    """A DDP search (--nproc-per-node 2) ended `error: static_graph does not work with accumulation_steps > 1` at its
    moves from a static-graph leader, and every rerun of it again: the setup refused the move before it was mended."""
    calibration = Calibration(
        budget_bytes=2**33, max_batch=256, memory_points=(), probe_batch=64, compute_setup=TrainSetup(),
        compute_samples_per_s=100.0, loader=(LoaderPoint(0, "ok", 50.0),), max_workers=1,
    )
    ddp = build_space(device=CPU, calibration=calibration, usable_cores=1, effective_batch=None, constraints={}, world_size=2)
    leader = sampled(batch_size=64, static_graph=True)
    found = {(knob, value): setup for knob, value, setup in moves(ddp, leader)}
    assert found[("accumulation_steps", 2)].static_graph is False and found[("accumulation_steps", 2)].accumulation_steps == 2
    assert ("static_graph", False) in found


def test_a_move_to_workers_starts_a_loader_queue_and_one_to_none_removes_it() -> None:
    by_value = {value: setup for knob, value, setup in moves(space(), sampled(batch_size=64)) if knob == "num_workers"}
    assert by_value[1].prefetch_factor == 2 and by_value[1].persistent_workers
    leader = sampled(batch_size=64, num_workers=1, prefetch_factor=2, persistent_workers=True)
    zero = next(s for k, v, s in moves(space(), leader) if k == "num_workers" and v == 0)
    assert zero.prefetch_factor is None and not zero.persistent_workers


def test_moves_keep_a_pinned_effective_batch_and_the_queue_within_an_epoch() -> None:
    pinned = space(effective_batch=128)
    leader = sampled(batch_size=32, accumulation_steps=4)
    batches = [s for k, _, s in moves(pinned, leader) if k == "batch_size"]
    assert batches and all(s.effective_batch() == 128 for s in batches)
    assert not any(k == "accumulation_steps" for k, _, _ in moves(pinned, leader))
    small = space(images=256)  # 1 worker x prefetch 4 x batch 128 = 512 samples: more than an epoch
    leader = sampled(batch_size=64, num_workers=1, prefetch_factor=4, persistent_workers=True)
    bigger = next(s for k, v, s in moves(small, leader) if k == "batch_size" and v == 128)
    assert bigger.prefetch_factor * bigger.batch_size <= 256


def record(number: int, setup: TrainSetup, rate: float, status: str = "ok") -> TrialRecord:
    return TrialRecord(number, "search", setup, TrialResult(status=status, samples_per_s=rate))


def moved_knob(space_: Space, records, skip=lambda s: False, moved=None) -> str | None:
    found = next_move(space_, records, skip, Counter(moved or {}))
    return found[0] if found else None


def test_moves_go_round_the_knobs_in_priority_order_then_by_evidence() -> None:
    leader = sampled(batch_size=64, amp="bf16", num_threads=2)
    records = [
        record(0, leader, 200.0),
        record(1, sampled(batch_size=32, amp="off", num_threads=1), 190.0),  # fp32, batch 32, 1 thread: near the leader
        record(2, sampled(batch_size=128, num_workers=2, prefetch_factor=2, persistent_workers=True, num_threads=1), 20.0, "pruned"),
    ]
    # The batch first; of its two moves, 32 (190 elsewhere) before 128 (its only trial screened out).
    knob, setup = next_move(space(), records, lambda s: False)
    assert knob == "batch_size" and setup == leader.replace(batch_size=32)
    # Each knob once before any twice, in priority order: the workers next, then the precision.
    assert moved_knob(space(), records, moved={"batch_size": 1}) == "num_workers"
    assert moved_knob(space(), records, moved={"batch_size": 1, "num_workers": 1}) == "amp"
    # A knob whose only other values were screened out waits for every other move.
    bad_batch = [records[0], records[2]]
    not_small = lambda s: s.batch_size == 32  # noqa: E731
    assert moved_knob(space(), bad_batch, skip=not_small) == "num_workers"
    # Within a knob: a value no trial measured before one a trial did (1 thread ran 190; none ran auto).
    knob, setup = next_move(space(), records, lambda s: False, Counter({k: 1 for k in ("batch_size", "num_workers", "amp", "channels_last")}))
    assert knob == "num_threads" and setup.num_threads is None
    assert next_move(space(), records, skip=lambda s: True) is None
    assert next_move(space(), [record(0, leader, 0.0, "oom")], skip=lambda s: False) is None  # no leader yet
    # The PyTorch defaults a --set excludes lead no move (a probe's moves started from them, clipped into the space).
    outside = sampled(batch_size=32, amp="off", num_threads=1)
    knob, setup = next_move(space(), [record(0, outside, 500.0), *records], lambda s: False, allowed=lambda s: s != outside)
    assert knob == "batch_size" and setup == leader.replace(batch_size=32)


def test_a_move_measured_before_is_never_queued() -> None:
    leader = sampled(batch_size=64)
    moved = [s for _, _, s in moves(space(), leader)]
    records = [record(0, leader, 200.0), *(record(i + 1, s, 100.0) for i, s in enumerate(moved[:-1]))]
    assert next_move(space(), records, skip=lambda s: False)[1] == moved[-1]


def test_reserved_share_of_the_budget() -> None:
    assert (neighbour_trials(5), neighbour_trials(8), neighbour_trials(15), neighbour_trials(30)) == (0, 1, 2, 5)


def fast_with_workers(setup: TrainSetup, workload, options=None, *, on_window=None) -> TrialResult:
    """Deterministic: a larger batch and more workers train faster, bf16 is slower."""
    rate = 100.0 * (setup.batch_size**0.5) * (1 + 0.2 * setup.num_workers) * (0.7 if setup.amp == "bf16" else 1.0)
    if options.mode == "loader":
        return TrialResult(status="ok", samples_per_s=10_000.0, windows=(1.0,))
    return TrialResult(status="ok", samples_per_s=rate, samples_per_s_spread=0.0, windows=(rate, rate), step_time_s=0.1,
                       peak_memory_bytes=2**28, data_wait_fraction=0.0)


def test_a_tpe_search_ends_its_sampled_trials_with_moves_from_the_leader(tmp_path: Path, cache_dir: Path) -> None:
    cfg = SearchConfig(model="resnet18", trials=12, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "tpe",
                       cache_dir=cache_dir, synthetic_images=512, confirm_rounds=2, confirm_top=2, seed=3)
    records = sorted(run_search(cfg, runner=fast_with_workers).records, key=lambda r: r.number)
    neighbours = [r for r in records if r.role == ROLE_NEIGHBOUR]
    assert len(neighbours) == neighbour_trials(12) == 2
    assert all(r.number >= 10 for r in neighbours)  # the last trials of the budget
    for move in neighbours:
        before = [r for r in records if r.number < move.number and r.result.ok]
        leader = max(before, key=lambda r: r.result.samples_per_s or 0.0).setup
        moved = changed(leader, move.setup)  # one knob, or the workers with their queue
        assert len(moved) == 1 or moved <= {"num_workers", "prefetch_factor", "persistent_workers"}, moved
    random = run_search(SearchConfig(**{**cfg.__dict__, "sampler": "random", "out": tmp_path / "random"}), runner=fast_with_workers)
    assert not any(r.role == ROLE_NEIGHBOUR for r in random.records)  # the baseline stays random


def test_trials_run_two_at_once_get_the_moves_too(tmp_path: Path, cache_dir: Path) -> None:
    cfg = SearchConfig(model="resnet18", trials=12, image_size=32, device="cpu", devices="cpu,cpu", trial_seconds=1.0,
                       out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=512, confirm_rounds=2, confirm_top=2)
    records = run_search(cfg, runner=fast_with_workers).records
    neighbours = [r for r in records if r.role == ROLE_NEIGHBOUR]
    assert 1 <= len(neighbours) <= neighbour_trials(12)  # a move waits while the other slot's trial may still lead
    assert sum(not r.free for r in records) == 12
