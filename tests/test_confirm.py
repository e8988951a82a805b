"""Confirmation with a fake runner: interleaved order, resume, storage after every measurement."""

from __future__ import annotations

from dataclasses import replace

import pytest

from autotune.records import TrialOptions, TrialRecord, TrialResult, Workload
from autotune.rounds import DIVERGED_STOP, Candidate, Confirmed
from autotune.train_setup import TrainSetup
from autotune.tuner.confirm import confirm
from autotune.tuner.finalists import pick_candidates

WORKLOAD = Workload(model="resnet18", image_size=32, device="cpu")
A, B, C = (TrainSetup(batch_size=b) for b in (16, 64, 128))


def candidates() -> list[Candidate]:
    return [Candidate(s.to_json(), s, f"bs={s.batch_size}") for s in (A, B, C)]


def test_rounds_are_interleaved_and_each_measurement_is_stored() -> None:
    order: list[int] = []
    stored: list[tuple[str, int]] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        order.append(setup.batch_size)
        if setup is C and len([b for b in order if b == 128]) == 2:
            return TrialResult(status="timeout", error="slow")
        return TrialResult(status="ok", samples_per_s=float(1000 + setup.batch_size + len(order)))

    result = confirm(
        candidates(), WORKLOAD, TrialOptions(), rounds=3, known={}, min_rounds=3,
        store=lambda key, runs: stored.append((key, len(runs[0]) + len(runs[1]))), runner=runner,
    )
    assert order == [16, 64, 128] * 3  # A B C A B C A B C
    assert len(stored) == 9 and stored[-1] == (C.to_json(), 3)
    by_size = {c.candidate.setup.batch_size: c for c in result}
    assert by_size[16].values == (1017.0, 1020.0, 1023.0) and by_size[16].median == 1020.0 and by_size[16].spread == 6.0
    assert by_size[128].failures == ("timeout: slow",) and len(by_size[128].values) == 2


def test_known_measurements_are_reused_and_only_the_missing_run() -> None:
    ran: list[int] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        ran.append(setup.batch_size)
        return TrialResult(status="ok", samples_per_s=6.5)

    known = {A.to_json(): ([5.0, 6.0], [], []), B.to_json(): ([7.0], ["oom: x"], [1])}
    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=2, known=known, store=lambda *a: None, runner=runner)
    assert ran == [128, 128]


def _record(number: int, setup: TrainSetup, rate: float) -> TrialRecord:
    return TrialRecord(number, "search", setup, TrialResult(status="ok", samples_per_s=rate))


def test_finalists_are_distinct_fastest_then_the_defaults() -> None:
    defaults = TrainSetup(batch_size=32)
    feasible = [_record(0, defaults, 50.0), _record(1, B, 300.0), _record(2, B, 290.0), _record(3, C, 200.0), _record(4, A, 100.0)]
    picked = pick_candidates(feasible, defaults, top=2)
    assert [c.setup for c in picked] == [B, C, defaults]
    assert picked[0].label.startswith("#1 ")
    # The defaults among the top are not added twice; unmeasured defaults are not added at all.
    assert [c.setup for c in pick_candidates(feasible, defaults, top=5)] == [B, C, A, defaults]
    assert [c.setup for c in pick_candidates(feasible[1:], defaults, top=1)] == [B]


def test_a_setup_whose_training_math_diverged_in_another_trial_is_no_finalist() -> None:
    """A float16 model under the default AdamW (a probe): #2 bs=64 w=0 diverged, its loader twin bs=64 w=1 finished and
    won at 6.97x, and its train.py stopped at step 4 on a NaN. The same math (batch, accumulation, precision) is out."""
    from autotune.records import Workload
    from autotune.tuner.diverged import diverged_note

    defaults = TrainSetup(batch_size=32)
    lucky, other = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2), TrainSetup(batch_size=128, amp="bf16")
    records = [_record(0, defaults, 100.0), _record(1, lucky, 700.0), _record(3, other, 300.0),
               TrialRecord(2, "guess", lucky.replace(num_workers=0, prefetch_factor=None),
                           TrialResult(status="diverged", error="the loss became NaN or infinite"))]
    picked = pick_candidates(records, defaults, top=2, fp32_twin=True)
    assert [c.setup for c in picked] == [other, defaults, other.replace(amp="off")]
    # The twin of a finalist is out too where its math diverged; the defaults stay the baseline whatever diverged.
    diverged_fp32 = [*records, TrialRecord(4, "search", other.replace(amp="off", num_workers=1, prefetch_factor=2),
                                           TrialResult(status="diverged", error="the loss became NaN or infinite")),
                     TrialRecord(5, "search", defaults.replace(num_workers=1, prefetch_factor=2),
                                 TrialResult(status="diverged", error="the loss became NaN or infinite"))]
    assert [c.setup for c in pick_candidates(diverged_fp32, defaults, top=2, fp32_twin=True)] == [other, defaults]
    half = Workload(model="m:f", task="m:f", precision="float16")
    note = diverged_note(records, half) or ""
    assert note.startswith(f"1 trial diverged (the loss or the weights became NaN or infinite: #2 {records[3].setup.describe()}); no "
                           "setup with the same batch, accumulation and precision was confirmed") and "AdamW's eps (1e-8)" in note
    assert "AdamW" not in (diverged_note(records, Workload(model="resnet18")) or "")
    repeat = replace(records[3], number=6, reused_from=2)  # proposed again, not run: its figures are #2's
    assert (diverged_note([*records, repeat], half) or "").startswith("1 trial diverged")
    assert diverged_note(records[:3], half) is None


def test_a_finalist_that_diverged_in_a_confirmation_run_stops_with_its_math_and_cannot_win() -> None:
    """A bf16 finalist's confirmation run diverged (one rare sample its trial had not met): it stayed the winner,
    best.json `confirmed`, noted as a lost measurement (`1 of 3 confirmation runs of the winner failed`), and its
    train.py stopped at a NaN; a loader twin of the same math went on being measured. Neither wins now, none of that
    math runs again, and the note says it diverged."""
    from types import SimpleNamespace

    from autotune.tuner.winner import make_best

    defaults = TrainSetup(batch_size=32)
    lucky = TrainSetup(batch_size=64, amp="bf16", num_workers=2, prefetch_factor=2)
    twin, steady = lucky.replace(num_workers=0, prefetch_factor=None), TrainSetup(batch_size=32, num_workers=1, prefetch_factor=2)
    records = [_record(0, defaults, 100.0), _record(1, lucky, 500.0), _record(2, twin, 480.0), _record(3, steady, 200.0)]
    picked = pick_candidates(records, defaults, top=3)
    ran: list[str] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
        ran.append(setup.to_json())
        if setup == lucky and ran.count(setup.to_json()) == 2:
            return TrialResult(status="diverged", error="the loss became NaN or infinite")
        return TrialResult(status="ok", samples_per_s={lucky: 500.0, twin: 480.0, steady: 200.0}.get(setup, 100.0))

    confirmed = confirm(picked, WORKLOAD, TrialOptions(), rounds=4, known={}, min_rounds=2, store=lambda *a: None, runner=runner,
                        baseline=defaults.to_json())
    assert ran.count(twin.to_json()) == 1 and ran.count(lucky.to_json()) == 2  # the twin's second round never ran
    # Both say why they stopped (--json's "stopped", report.html's table); the others do not.
    why = {c.candidate.setup: c.to_dict()["stopped"] for c in confirmed}
    assert why[lucky] == why[twin] == DIVERGED_STOP and why[steady] is None and why[defaults] is None, why
    assert next(c for c in confirmed if c.candidate.setup == twin).remarks() == f"stopped: {DIVERGED_STOP}"
    # A loader twin of the defaults' own math diverged: the defaults, kept as the baseline, are returned, and said to train it.
    recipe_twin = defaults.replace(num_workers=1, prefetch_factor=2)
    rounds = [Confirmed(Candidate(recipe_twin.to_json(), recipe_twin, "#6"), (150.0,), ("diverged: the loss became NaN",), failed_rounds=(1,)),
              Confirmed(Candidate(defaults.to_json(), defaults, "#0"), (100.0, 101.0), ())]
    own = make_best(workload=WORKLOAD, hardware=SimpleNamespace(to_dict=lambda: {}), feasible=records, confirmed=rounds,
                    defaults=defaults, effective_batch=None, command="autotune search", tried=records)
    assert own.setup == defaults and f"the PyTorch defaults ({defaults.describe()}), returned as the baseline, are the exception: the " \
        "same batch, accumulation and precision as a run that diverged, so your recipe itself would likely diverge in a longer run" \
        in own.notes, own.notes
    assert own.notes[0].startswith("every other finalist trains math that diverged (the note on it names them): the PyTorch "
                                   "defaults are returned"), own.notes  # not "the only setup the confirmation measured"
    # Resumed with those rounds stored, neither runs again.
    ran.clear()
    known = {c.candidate.key: (list(c.values), list(c.failures), list(c.failed_rounds)) for c in confirmed}
    again = confirm(picked, WORKLOAD, TrialOptions(), rounds=4, known=known, min_rounds=3, store=lambda *a: None, runner=runner,
                    baseline=defaults.to_json())
    assert lucky.to_json() not in ran and twin.to_json() not in ran, ran
    assert {c.candidate.setup for c in again if c.stopped == DIVERGED_STOP} == {lucky, twin}  # a resumed one says so too
    from autotune.tuner.study_facts import stored_confirmed  # and a reader of the stored rounds (autotune report, status)

    stored = stored_confirmed(None, records, known)  # type: ignore[arg-type]  # the rounds are given: no study is read
    assert {c.candidate.setup for c in stored if c.stopped == DIVERGED_STOP} == {lucky, twin}, stored
    best = make_best(workload=WORKLOAD, hardware=SimpleNamespace(to_dict=lambda: {}), feasible=records, confirmed=confirmed,
                     defaults=defaults, effective_batch=None, command="autotune search", tried=records)
    assert best.setup == steady and best.confirmed, best.notes
    assert any(note.startswith(f"a confirmation run of #1 {lucky.describe()} diverged; no setup with the same batch, accumulation "
                               "and precision was confirmed") for note in best.notes), best.notes


def test_a_reduced_precision_that_diverged_at_several_batches_is_no_finalist_unless_pinned() -> None:
    """bf16 diverged at batch 8 and 16 (a rare sample its autocast cannot hold), and bf16 at batch 64, whose trial had
    not met it, won: its train.py stopped at step 40. Two batches in one precision, and none in float32, leave the
    precision out; where every setup allowed is in it (--set amp=bf16), its other batches stay."""
    from autotune.tuner.diverged import diverged_math, diverged_note

    defaults = TrainSetup(batch_size=32)
    nan = TrialResult(status="diverged", error="the loss became NaN or infinite")
    bf16 = [TrainSetup(batch_size=b, amp="bf16") for b in (8, 16, 64)]
    fp32 = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2)
    records = [_record(0, defaults, 100.0), TrialRecord(1, "search", bf16[0], nan), TrialRecord(2, "search", bf16[1], nan),
               _record(3, bf16[2], 400.0), _record(4, fp32, 200.0)]
    assert diverged_math(records).precisions == {"bf16"} and diverged_math(records[:2]).precisions == set()
    assert [c.setup for c in pick_candidates(records, defaults, top=2)] == [fp32, defaults]
    note = diverged_note(records, WORKLOAD, unstable=diverged_math(records)) or ""
    assert "; bf16 diverged at several batches and float32 at none, so no bf16 setup was either;" in note, note
    pinned = [r for r in records if r.setup.amp == "bf16" or r.setup == defaults]
    assert [c.setup for c in pick_candidates(pinned, defaults, top=2, fp32_allowed=False)] == [bf16[2], defaults]  # --set amp=bf16
    assert [c.setup for c in pick_candidates(pinned, defaults, top=2)] == [defaults]  # no --set: none of bf16, though only it ran
    from types import SimpleNamespace

    from autotune.tuner.constraints import parse_constraint
    from autotune.tuner.winner import make_best

    rounds = [Confirmed(Candidate(s.to_json(), s, s.describe()), (v, v + 1.0, v - 1.0), ()) for s, v in ((bf16[2], 400.0), (defaults, 100.0))]
    kept = make_best(workload=WORKLOAD, hardware=SimpleNamespace(to_dict=lambda: {}), feasible=pinned, confirmed=rounds, defaults=defaults,
                     effective_batch=None, command="x", tried=pinned, amp_pin=parse_constraint("amp=bf16"), excluded_by="--set amp=bf16")
    assert kept.setup == bf16[2] and any("; bf16 diverged at several batches and float32 at none: --set amp=bf16 keeps it, so its "
                                         "other batches stayed, though a longer run of them may diverge too;" in n for n in kept.notes), kept.notes
    # Its one finalist diverged in the rounds too: the defaults the --set excludes come back, and the line says why.
    every = [Confirmed(Candidate(bf16[2].to_json(), bf16[2], "#3"), (400.0,), ("diverged: the loss became NaN",), failed_rounds=(1,)),
             rounds[1]]
    none_left = make_best(workload=WORKLOAD, hardware=SimpleNamespace(to_dict=lambda: {}), feasible=pinned, confirmed=every,
                          defaults=defaults, effective_batch=None, command="x", tried=pinned, amp_pin=parse_constraint("amp=bf16"),
                          excluded_by="--set amp=bf16")
    assert none_left.setup == defaults and "no setup within --set amp=bf16 measured a throughput without diverging (the note on it " \
        "names them): the PyTorch defaults, which it excludes, are returned" in none_left.notes, none_left.notes
    assert not any("failed in every confirmation run" in note for note in none_left.notes)  # said as a divergence, not a lost run
    first = [Confirmed(Candidate(bf16[2].to_json(), bf16[2], "#3"), (), ("diverged: the loss became NaN",), failed_rounds=(0,)), rounds[1]]
    none_left = make_best(workload=WORKLOAD, hardware=SimpleNamespace(to_dict=lambda: {}), feasible=pinned, confirmed=first,
                          defaults=defaults, effective_batch=None, command="x", tried=pinned, amp_pin=parse_constraint("amp=bf16"),
                          excluded_by="--set amp=bf16")  # diverged in its first run: nothing measured in the rounds
    assert any(note.startswith("no setup within --set amp=bf16 measured a throughput without diverging") for note in none_left.notes)
    stopped = make_best(workload=WORKLOAD, hardware=SimpleNamespace(to_dict=lambda: {}), feasible=[r for r in pinned if r.result.ok],
                        confirmed=[], defaults=defaults, effective_batch=None, command="x", interrupted=True, tried=pinned,
                        partial=tuple(first), excluded_by="--set amp=bf16", amp_pin=parse_constraint("amp=bf16"))
    assert stopped.setup == defaults and "every setup within --set amp=bf16 that measured trains math that diverged: the PyTorch " \
        "defaults, which it excludes, are returned" in stopped.notes, stopped.notes
    # Stopped before its confirmation (Ctrl-C, bad data): the best so far is no setup the finalists left out either.
    stopped = make_best(workload=WORKLOAD, hardware=SimpleNamespace(to_dict=lambda: {}), feasible=[r for r in records if r.result.ok],
                        confirmed=[], defaults=defaults, effective_batch=None, command="x", interrupted=True, tried=records)
    assert stopped.setup == fp32 and not stopped.confirmed, stopped.notes
    diverged_round = (Confirmed(Candidate(fp32.to_json(), fp32, "#4"), (), ("diverged: the loss became NaN or infinite",), failed_rounds=(0,)),)
    stopped = make_best(workload=WORKLOAD, hardware=SimpleNamespace(to_dict=lambda: {}), feasible=[r for r in records[:3] if r.result.ok]
                        + [records[4]], confirmed=[], defaults=defaults, effective_batch=None, command="x", interrupted=True,
                        tried=records[:3] + [records[4]], partial=diverged_round)  # #4 diverged in the round before the stop
    assert stopped.setup == defaults and any("a confirmation run of #4 diverged" in n for n in stopped.notes), stopped.notes
    fp32_too = [*records, TrialRecord(5, "search", TrainSetup(batch_size=256), nan)]  # the batch's, or the lr's: not bf16's
    assert diverged_math(fp32_too).precisions == set()
    assert [c.setup for c in pick_candidates(fp32_too, defaults, top=2)] == [bf16[2], fp32, defaults]


def test_defaults_whose_trial_timed_out_are_confirmed_for_the_speedup() -> None:
    """The defaults' trial timed out on a busy machine: the search had no baseline and gave no speedup. They join the
    confirmation's rounds (a reader of the stored rounds names them alike); a trial that failed otherwise does not."""
    from autotune.tuner.stores import Rounds
    from autotune.tuner.study_facts import stored_confirmed

    defaults = TrainSetup(batch_size=32)
    timed_out = TrialRecord(0, "defaults", defaults, TrialResult(status="timeout", error="no result within 20 s"))
    feasible = [timed_out, _record(1, B, 300.0), _record(2, C, 200.0)]
    picked = pick_candidates(feasible, defaults, top=1)
    assert [(c.setup, c.label, c.twin) for c in picked] == [
        (B, f"#1 {B.describe()}", False), (defaults, f"#0 {defaults.describe()} (defaults) (timed out in its trial)", False)]
    rounds: Rounds = {c.key: ([1.0], [], []) for c in picked}
    assert stored_confirmed(None, feasible, rounds) == tuple(  # type: ignore[arg-type]  # the rounds are given
        Confirmed(c, (1.0,), ()) for c in picked)
    failed = [replace(timed_out, result=TrialResult(status="error", error="ValueError: x")), *feasible[1:]]
    assert [c.setup for c in pick_candidates(failed, defaults, top=1)] == [B]
    # Defaults that time out again in the rounds run once there: not a timeout per round (120 s each by default).
    ran: list[int] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
        ran.append(setup.batch_size)
        return TrialResult(status="timeout", error="slow") if setup == defaults else TrialResult(status="ok", samples_per_s=300.0)

    confirmed = confirm(picked, WORKLOAD, TrialOptions(), rounds=4, known={}, min_rounds=2, store=lambda *a: None, runner=runner,
                        baseline=defaults.to_json())
    assert ran.count(32) == 1 and [c.failures for c in confirmed if c.candidate.setup == defaults] == [("timeout: slow",)]


def test_defaults_the_set_excludes_take_no_finalist_place() -> None:
    """--set num_workers=1 --confirm-top 1: the fastest setup within the --set is confirmed, not the defaults alone."""
    defaults = TrainSetup(batch_size=32)
    feasible = [_record(0, defaults, 500.0), _record(1, B, 300.0), _record(2, C, 200.0)]
    assert [c.setup for c in pick_candidates(feasible, defaults, top=1)] == [defaults]
    assert [c.setup for c in pick_candidates(feasible, defaults, top=1, baseline_only=True)] == [B, defaults]
    assert [c.setup for c in pick_candidates(feasible, defaults, top=2, baseline_only=True)] == [B, C, defaults]


def test_the_search_and_a_reader_of_the_stored_rounds_name_the_finalists_alike() -> None:
    """The confirming worker's console and a waiting worker's (or the report's) table show the same labels."""
    from autotune.tuner.stores import Rounds
    from autotune.tuner.study_facts import stored_confirmed

    defaults = TrainSetup(batch_size=32)
    feasible = [TrialRecord(0, "defaults", defaults, TrialResult(status="ok", samples_per_s=50.0)), _record(1, B, 300.0),
                _record(2, B, 310.0), _record(3, C, 200.0)]
    picked = pick_candidates(feasible, defaults, top=2)
    assert [c.label for c in picked] == [f"#2 {B.describe()}", f"#3 {C.describe()}", f"#0 {defaults.describe()} (defaults)"]
    rounds: Rounds = {c.key: ([1.0], [], []) for c in picked}
    stored = stored_confirmed(None, feasible, rounds)  # type: ignore[arg-type]  # the rounds are given: no study is read
    assert [c.candidate.label for c in stored] == [c.label for c in picked]


def _runner_with(rates: dict[int, list[float]], order: list[int]):
    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        order.append(setup.batch_size)
        values = rates[setup.batch_size]
        return TrialResult(status="ok", samples_per_s=values[min(len(values) - 1, order.count(setup.batch_size) - 1)])

    return runner


def test_a_clear_leader_settles_after_the_minimum_rounds() -> None:
    order: list[int] = []
    runner = _runner_with({16: [250.0, 240.0], 64: [260.0, 250.0], 128: [300.0, 290.0]}, order)
    result = confirm(candidates(), WORKLOAD, TrialOptions(), rounds=5, known={}, store=lambda *a: None, runner=runner)
    assert order == [16, 64, 128] * 2
    assert all(len(c.values) == 2 for c in result)


def test_an_fp32_twin_far_behind_the_leader_stops_after_one_round_but_no_finalist_does() -> None:
    """A twin no trial ran, below 0.8x the leader in the first round: a second round of it could not make it win. A
    finalist as far behind keeps its second round (its trial put it near the top: one slow run may be a stall), and
    so does the baseline (the speedup is the median of paired rounds)."""
    from autotune.tuner.finalists import TWIN

    twin = Candidate(B.to_json(), B, f"bs=64{TWIN}", twin=True)
    order: list[int] = []
    rates = {16: [100.0, 90.0], 64: [150.0, 140.0], 128: [300.0, 280.0]}
    result = confirm([candidates()[0], twin, candidates()[2]], WORKLOAD, TrialOptions(), rounds=5, known={},
                     store=lambda *a: None, runner=_runner_with(rates, order), baseline=A.to_json())
    assert order == [16, 64, 128, 16, 128]
    assert [len(c.values) for c in result] == [2, 1, 2]
    order.clear()
    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=5, known={}, store=lambda *a: None,
            runner=_runner_with(rates, order), baseline=A.to_json())
    assert order == [16, 64, 128] * 2  # the same rates, 64 a finalist: two rounds
    order.clear()
    close = {16: [100.0, 90.0], 64: [241.0, 250.0, 260.0], 128: [300.0, 280.0, 270.0]}  # 0.803x: not far enough behind
    confirm([candidates()[0], twin, candidates()[2]], WORKLOAD, TrialOptions(), rounds=5, known={}, store=lambda *a: None,
            runner=_runner_with(close, order), baseline=A.to_json())
    assert order[:6] == [16, 64, 128] * 2


def test_finalists_within_noise_get_more_rounds_up_to_the_maximum() -> None:
    order: list[int] = []
    # 128 and 64 swap places round by round: neither beats the other, and they differ by more than 3 %.
    runner = _runner_with({16: [170.0], 64: [200.0, 180.0, 200.0, 180.0], 128: [180.0, 200.0, 180.0, 200.0]}, order)
    result = confirm(candidates(), WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None, runner=runner)
    # 16 is beaten after the minimum rounds and measured no more; the two within noise go on.
    assert order == [16, 64, 128] * 2 + [64, 128] * 2
    assert [len(c.values) for c in result] == [2, 4, 4]


def test_the_baseline_stops_only_once_every_remaining_finalist_beats_it() -> None:
    # 128 leads and beats 16; 64 is within noise of 128 but not clearly faster than 16.
    rates = {16: [175.0, 160.0], 64: [210.0, 150.0, 200.0, 150.0], 128: [200.0, 190.0, 180.0, 200.0]}
    order: list[int] = []
    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=3, known={}, store=lambda *a: None,
            runner=_runner_with(rates, order), baseline=A.to_json())
    assert order == [16, 64, 128] * 3  # 16 stays: 64 is still measured and does not beat it
    order.clear()
    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=3, known={}, store=lambda *a: None,
            runner=_runner_with(rates, order))
    assert order == [16, 64, 128] * 2 + [64, 128]  # without a baseline 16 stops once beaten by the leader


def test_the_baseline_stays_while_the_leaders_ratios_over_it_disagree() -> None:
    """Beaten in both rounds, but by 1.7x in one and by 350x in the other (a stalled round): the median of two such
    rounds is a speedup neither measured, so the baseline and the leader go on until a third round outvotes it."""
    from autotune.tuner.noise import paired_speedup

    rates = {16: [30762.4, 78.4, 30000.0, 31000.0], 64: [100.0], 128: [52300.8, 27434.9, 51000.0, 52000.0]}
    order: list[int] = []
    result = confirm(candidates(), WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None,
                     runner=_runner_with(rates, order), baseline=A.to_json())
    assert order == [16, 64, 128] * 2 + [16, 128]
    assert paired_speedup(result[2], result[0]) == pytest.approx(52300.8 / 30762.4)  # the median of 1.70, 350 and 1.70
    steady = {16: [30762.4, 20000.0], 64: [100.0], 128: [52300.8, 27434.9]}  # 1.70x and 1.37x: they agree
    order.clear()
    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None,
            runner=_runner_with(steady, order), baseline=A.to_json())
    assert order == [16, 64, 128] * 2


def test_the_baseline_stays_while_any_setup_still_measured_has_ratios_over_it_that_disagree() -> None:
    """A probe's defaults left after round 2, where the leader's ratios over them agreed; the setup still measured beside
    it, whose two ratios (137x, 551x on a loaded machine) did not, won later: its speedup was their median, 275x."""
    # 128 leads (median 145) with agreeing ratios (2.0x, 2.25x); 64 (median 142.5) is not beaten by it, its ratios 1.2x and 4.1x.
    rates = {16: [100.0, 40.0, 100.0, 100.0], 64: [120.0, 165.0, 190.0, 190.0], 128: [200.0, 90.0, 190.0, 185.0]}
    order: list[int] = []
    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None,
            runner=_runner_with(rates, order), baseline=A.to_json())
    assert order[6:9] == [16, 64, 128], order  # the defaults run in round 3 too


def test_a_finalist_that_never_measured_stops_after_the_minimum_rounds() -> None:
    order: list[int] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        order.append(setup.batch_size)
        if setup.batch_size == 128:
            return TrialResult(status="oom", error="out of memory")
        return TrialResult(status="ok", samples_per_s={16: 100.0, 64: 100.0 + len(order) % 2 * 20}[setup.batch_size])

    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None, runner=runner)
    assert 128 not in order[6:]


def test_a_lone_setup_is_measured_once() -> None:
    """--trials 1: the defaults are the only candidate; a second round would compare them with themselves."""
    from autotune.tuner.confirm import confirmation_plan

    order: list[int] = []
    confirm(candidates()[:1], WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None,
            runner=_runner_with({16: [100.0, 50.0]}, order), baseline=A.to_json())
    assert order == [16]
    assert "1 setup in interleaved rounds of 5 s (1 round;" in confirmation_plan(candidates()[:1], 5.0, 4)


def test_a_twin_as_slow_as_its_own_finalist_keeps_its_second_round() -> None:
    """The twin is there to be compared with its own finalist: 0.78x the leader in round 1, but 0.95x its finalist
    (slow in that round too), it runs again; a second round of both decides the precision, not one."""
    from autotune.tuner.finalists import TWIN

    lead, bf16 = TrainSetup(batch_size=128), TrainSetup(batch_size=64, amp="bf16")
    fp32 = bf16.replace(amp="off")
    pool = [Candidate(lead.to_json(), lead, "lead"), Candidate(bf16.to_json(), bf16, "bf16"),
            Candidate(fp32.to_json(), fp32, f"fp32{TWIN}", twin=True)]
    rates = {lead: [100.0, 100.0], bf16: [82.0, 101.0], fp32: [78.0, 101.0]}
    ran: list[TrainSetup] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        ran.append(setup)
        return TrialResult(status="ok", samples_per_s=rates[setup][ran.count(setup) - 1])

    result = confirm(pool, WORKLOAD, TrialOptions(), rounds=2, known={}, store=lambda *a: None, runner=runner)
    assert [len(c.values) for c in result] == [2, 2, 2]


def test_a_lone_setup_runs_again_while_its_runs_fail() -> None:
    order: list[int] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        order.append(setup.batch_size)
        return TrialResult(status="timeout", error="slow") if len(order) == 1 else TrialResult(status="ok", samples_per_s=9.0)

    result = confirm(candidates()[:1], WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None, runner=runner)
    assert order == [16, 16] and result[0].values == (9.0,) and result[0].failures == ("timeout: slow",)


def test_finalists_equal_within_the_floor_do_not_need_more_rounds() -> None:
    order: list[int] = []
    runner = _runner_with({16: [190.0], 64: [200.0, 201.0], 128: [201.0, 200.0]}, order)
    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None, runner=runner)
    assert order == [16, 64, 128] * 2


def test_a_finalist_equal_to_the_leader_goes_on_while_another_is_unresolved() -> None:
    """The README's search (2026-12-05): after two rounds 16 and 128 were equal within the floor (201.5/200.8,
    168.1/168.3), 128 led by its own median, and 64 was within noise of it: 16 stopped as settled, 64 then overtook 128
    and won, though it trailed 16 by a paired -6 % in the rounds they shared; the choice, among those measured to the
    last round, never weighed 16 again. Now 16 goes on while 64 does."""
    order: list[int] = []
    runner = _runner_with({16: [200.8, 168.3, 178.0, 176.0], 64: [165.3, 181.2, 178.9, 170.6],
                           128: [201.5, 168.1, 173.4, 173.1]}, order)
    result = confirm(candidates(), WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None, runner=runner)
    assert order == [16, 64, 128] * 4
    assert [len(c.values) for c in result] == [4, 4, 4]  # equal with nobody else open, it stops (the test above)


def test_a_finalist_behind_the_leader_in_every_round_stops_when_the_rounds_left_cannot_lift_its_median() -> None:
    """Within the noise floor of the leader (neither beaten nor equal) but slower in all of 3 paired rounds with one
    left: the last round cannot lift its median paired ratio to 1, so it does not run (the same math as the leader,
    which no rule of the winner's choice prefers). With 3 rounds left, or fewer than 3 lost, it runs on."""
    lead, close, slow = (TrainSetup(batch_size=64, num_workers=w) for w in (1, 2, 0))  # one pass, other loader knobs
    finalists = [Candidate(s.to_json(), s, f"w={s.num_workers}") for s in (slow, lead, close)]
    rates = {0: [150.0], 1: [200.0, 210.0, 200.0, 200.0], 2: [198.0, 201.0, 196.0, 208.0]}

    def run(rounds: int, values: dict[int, list[float]] = rates) -> list[int]:
        order: list[int] = []

        def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
            order.append(setup.num_workers)
            got = values[setup.num_workers]
            return TrialResult(status="ok", samples_per_s=got[min(len(got) - 1, order.count(setup.num_workers) - 1)])

        confirm(finalists, WORKLOAD, TrialOptions(), rounds=rounds, known={}, store=lambda *a: None, runner=runner)
        return order

    assert run(4) == [0, 1, 2] * 2 + [1, 2]  # 0.99x, 0.96x, 0.98x: three rounds lost, one left
    assert run(6)[6:10] == [1, 2] * 2  # three lost, three left: it runs a fourth round (and wins it)
    won_one = {**rates, 2: [190.0, 214.0, 196.0, 196.0]}  # 1.02x in round 2
    assert run(4, won_one) == [0, 1, 2] * 2 + [1, 2] * 2


def test_a_finalist_behind_in_every_round_runs_on_where_the_winner_s_rules_may_still_prefer_it() -> None:
    """The same rounds, the runner-up in float32 behind a bf16 leader: a fourth round could make the leader beat it
    beyond the noise, else the fp32 one is returned (reduced precision must win beyond noise); it runs on."""
    lead, fp32 = TrainSetup(batch_size=64, amp="bf16"), TrainSetup(batch_size=64)
    finalists = [Candidate(s.to_json(), s, s.amp) for s in (lead, fp32)]
    rates = {"bf16": [200.0, 210.0, 200.0, 200.0], "off": [198.0, 201.0, 196.0, 208.0]}
    order: list[str] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        order.append(setup.amp)
        return TrialResult(status="ok", samples_per_s=rates[setup.amp][order.count(setup.amp) - 1])

    confirm(finalists, WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None, runner=runner)
    assert order == ["bf16", "off"] * 4


def test_the_confirmation_line_says_its_rounds_plainly() -> None:
    from autotune.tuner.confirm import confirmation_plan

    twin = TrainSetup(batch_size=64, num_workers=1)
    four = [*candidates(), Candidate(twin.to_json(), twin, "twin", twin=True)]
    assert confirmation_plan(four, 3.0, 4) == (
        "confirmation: 4 setups in interleaved rounds of 3 s (2 to 4 rounds; a setup stops once the leader beats or equals it, "
        "an fp32 twin after one round below 0.8x the leader)"
    )
    # No twin among them (--set amp=bf16, or fp32 finalists only): the line promises no twin rule.
    assert confirmation_plan(four[:3], 3.0, 4).endswith("(2 to 4 rounds; a setup stops once the leader beats or equals it)")
    assert "1 setup in interleaved rounds of 0.5 s (1 round;" in confirmation_plan(four[:1], 0.5, 1)  # not "(2 to 1"
    assert "(2 rounds;" in confirmation_plan(four[:2], 5.0, 2)
    # Two bf16 finalists with the same pass (other loader knobs), each with its twin: a sibling pair may settle one twin.
    bf16 = [TrainSetup(batch_size=64, amp="bf16", num_workers=w) for w in (1, 2)]
    pairs = [Candidate(s.to_json(), s, str(s.num_workers)) for s in bf16]
    pairs += [Candidate(s.replace(amp="off").to_json(), s.replace(amp="off"), "twin", twin=True) for s in bf16]
    assert confirmation_plan(pairs, 5.0, 4).startswith("confirmation: 3 to 4 setups in interleaved rounds of 5 s")  # one twin runs
    assert confirmation_plan([pairs[0], pairs[2]], 5.0, 4).startswith("confirmation: 2 setups")
    ran = [*pairs[:3], replace(pairs[3], twin=False)]  # the second twin is a finalist itself (a trial ran it): it answers
    assert confirmation_plan(ran, 5.0, 4).startswith("confirmation: 3 to 4 setups")


def test_a_pair_s_median_margin_is_the_same_read_from_either_side() -> None:
    """Four paired rounds: the median of a/b is the inverse of that of b/a (two middle ratios averaged geometrically)."""
    from autotune.rounds import Confirmed
    from autotune.tuner.noise import margin

    a_values, b_values = (272.0, 100.0, 90.0, 300.0), (100.0, 100.0, 100.0, 100.0)
    a = Confirmed(Candidate("a", TrainSetup(batch_size=64), "a"), a_values, ())
    b = Confirmed(Candidate("b", TrainSetup(), "b"), b_values, ())
    ab, ba = margin(a, b), margin(b, a)
    assert ab is not None and ba is not None and ab.won == 2
    assert (1 + ab.median_gain) * (1 + ba.median_gain) == pytest.approx(1.0)
    assert ab.median_gain == pytest.approx((1.0 * 2.72) ** 0.5 - 1)


def test_a_failed_run_pairs_nothing_and_the_other_rounds_stay_paired() -> None:
    """A run that fails takes its round with it: the pairs are the rounds both measured, never the k-th success of one
    with the k-th of the other (A failing in round 1 and B in round 2 share no round at all)."""
    from autotune.rounds import Confirmed
    from autotune.tuner.noise import margin, paired_ratios

    def confirmed(key: str, runs: list[float | None]) -> Confirmed:
        values = tuple(v for v in runs if v is not None)
        failed = tuple(r for r, v in enumerate(runs) if v is None)
        return Confirmed(Candidate(key, TrainSetup(), key), values, tuple("error: x" for _ in failed), failed_rounds=failed)

    a = confirmed("a", [200.0, None, 300.0, 330.0])
    b = confirmed("b", [100.0, 150.0, None, 110.0])
    assert paired_ratios(a, b) == [2.0, 3.0]  # rounds 0 and 3
    disjoint = confirmed("c", [None, 400.0]), confirmed("d", [100.0, None])
    assert paired_ratios(*disjoint) == [] and margin(*disjoint) is None
    # Rounds stored by an older version did not say which rounds failed: the medians only.
    old = Confirmed(Candidate("e", TrainSetup(), "e"), (300.0,), ("error: x",))
    assert old.by_round() is None and paired_ratios(old, b) == [300.0 / 110.0]


def test_the_confirmation_records_the_rounds_its_failures_took() -> None:
    """The defaults fail in round 2, the finalist in round 1: they share no round, so no speedup rests on them."""
    fast, defaults = TrainSetup(batch_size=64), TrainSetup(batch_size=32)
    pool = [Candidate(fast.to_json(), fast, "#1"), Candidate(defaults.to_json(), defaults, "#0 (defaults)")]
    calls: list[int] = []
    stored: dict[str, tuple[list[float], list[str], list[int]]] = {}

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        calls.append(setup.batch_size)
        failing = (setup is fast and len(calls) == 1) or (setup is defaults and len(calls) == 4)
        return TrialResult(status="error", error="flaky") if failing else TrialResult(status="ok", samples_per_s=100.0 + len(calls))

    result = confirm(pool, WORKLOAD, TrialOptions(), rounds=2, known={}, store=lambda key, runs: stored.update({key: runs}),
                     runner=runner, baseline=defaults.to_json())
    by_size = {c.candidate.setup.batch_size: c for c in result}
    assert calls == [64, 32, 64, 32]
    assert by_size[64].by_round() == {1: 103.0} and by_size[32].by_round() == {0: 102.0}
    assert stored[fast.to_json()] == ([103.0], ["error: flaky"], [0]) and stored[defaults.to_json()][2] == [1]
    from autotune.tuner.noise import paired_speedup

    assert paired_speedup(by_size[64], by_size[32]) is None


def test_a_leader_in_reduced_precision_meets_its_fp32_twin_in_the_confirmation() -> None:
    """bf16 changes the numerics: it must win against the same setup in float32, not against whatever fp32 finalist there is."""
    from autotune.tuner.finalists import TWIN

    defaults = TrainSetup(batch_size=32)
    bf16 = TrainSetup(batch_size=64, num_workers=1, prefetch_factor=2, persistent_workers=True, amp="bf16")
    other = TrainSetup(batch_size=64, num_workers=2, prefetch_factor=1, persistent_workers=True)
    feasible = [_record(0, defaults, 50.0), _record(1, bf16, 300.0), _record(2, other, 250.0)]
    picked = pick_candidates(feasible, defaults, top=2, fp32_twin=True)
    twin = bf16.replace(amp="off")
    assert [c.setup for c in picked] == [bf16, other, twin, defaults]
    assert picked[2].label == twin.describe() + TWIN
    # Not when --set pins the precision (fp32_twin=False), nor when the twin is a finalist already (then labelled as its trial).
    assert [c.setup for c in pick_candidates(feasible, defaults, top=2)] == [bf16, other, defaults]
    with_twin = [*feasible, _record(3, twin, 240.0)]
    assert [c.label for c in pick_candidates(with_twin, defaults, top=3, fp32_twin=True)][:3] == [
        f"#1 {bf16.describe()}", f"#2 {other.describe()}", f"#3 {twin.describe()}"]


def test_every_finalist_in_reduced_precision_meets_its_fp32_twin_not_only_the_leader() -> None:
    """The rounds may crown a bf16 finalist that was not the search's leader (or an fp32 leader such as the defaults):
    its own twin must be there to beat."""
    defaults = TrainSetup(batch_size=32)
    bf16 = TrainSetup(batch_size=32, num_workers=1, prefetch_factor=1, persistent_workers=True, amp="bf16")
    fp32_leader = TrainSetup(batch_size=8)
    other = bf16.replace(batch_size=64)
    feasible = [_record(0, defaults, 4221.0), _record(1, fp32_leader, 355.0), _record(2, bf16, 300.0), _record(3, other, 290.0)]
    picked = [c.setup for c in pick_candidates(feasible, defaults, top=3, fp32_twin=True)]
    assert picked == [defaults, fp32_leader, bf16, bf16.replace(amp="off")]
    picked = [c.setup for c in pick_candidates(feasible[1:], defaults, top=3, fp32_twin=True)]
    assert picked == [fp32_leader, bf16, other, bf16.replace(amp="off"), other.replace(amp="off")]


def test_the_fp32_twin_stays_out_when_its_trials_did_not_finish() -> None:
    """A twin the search already stopped early (clearly slower) or that ran out of memory would cost two runs to say it
    again; a twin whose trial was interrupted from outside says nothing about its setup and still joins."""
    defaults = TrainSetup(batch_size=32)
    bf16 = TrainSetup(batch_size=256, amp="bf16", channels_last=True)
    twin = bf16.replace(amp="off")
    base = [_record(0, defaults, 50.0), _record(1, bf16, 300.0)]
    for status in ("pruned", "oom", "error", "timeout"):
        records = [*base, TrialRecord(2, "search", twin, TrialResult(status=status, samples_per_s=120.0 if status == "pruned" else None))]
        assert [c.setup for c in pick_candidates(records, defaults, top=1, fp32_twin=True)] == [bf16, defaults], status
    stopped = [*base, TrialRecord(2, "search", twin, TrialResult(status="interrupted"))]
    assert [c.setup for c in pick_candidates(stopped, defaults, top=1, fp32_twin=True)] == [bf16, twin, defaults]
    finished_later = [*base, TrialRecord(2, "search", twin, TrialResult(status="pruned")), _record(3, twin, 200.0)]
    assert [c.setup for c in pick_candidates(finished_later, defaults, top=1, fp32_twin=True)] == [bf16, twin, defaults]


def _calibration(points: dict[tuple[str, bool], float]):
    from autotune.records import Calibration, PrecisionPoint

    return Calibration(budget_bytes=None, max_batch=512, memory_points=(), probe_batch=64, compute_setup=TrainSetup(),
                       compute_samples_per_s=max(points.values()), loader=(), max_workers=2,
                       precisions=tuple(PrecisionPoint(amp, cl, "ok", rate) for (amp, cl), rate in points.items()))


def test_no_fp32_twin_joins_a_compute_bound_finalist_whose_precision_the_calibration_measured_clearly_faster() -> None:
    """The figures of a real search (resnet18, 64 px, 2026-12-03): bf16 computed 1.57x fp32 contiguous and 1.34x with
    channels_last, the bf16 finalists waited on the loader under 1 % of the time; in the rounds the contiguous twin ran
    0.68x its finalist and the channels_last one 0.77x. The first needs no round; the second (within the calibration's
    own noise of 0.8x) does, and so does any finalist that waits on the loader, compiles or has no figure to go by."""
    defaults = TrainSetup(batch_size=32)
    plain = TrainSetup(batch_size=512, num_workers=2, prefetch_factor=1, persistent_workers=True, amp="bf16")
    cl = plain.replace(channels_last=True)
    calibration = _calibration({("off", False): 228.0, ("off", True): 266.7, ("bf16", False): 358.9, ("bf16", True): 357.1})

    def record(number: int, setup: TrainSetup, rate: float, wait: float | None = 0.001) -> TrialRecord:
        return TrialRecord(number, "search", setup, TrialResult(status="ok", samples_per_s=rate, data_wait_fraction=wait))

    records = [record(0, defaults, 184.0, 0.23), record(1, cl, 295.6), record(2, plain, 282.3, 0.0014)]
    picked = pick_candidates(records, defaults, top=2, fp32_twin=True, calibration=calibration)
    assert [c.setup for c in picked] == [cl, plain, cl.replace(amp="off"), defaults]
    assert picked[1].no_twin == ("the calibration measured bf16 1.57x float32 computing alone (contiguous, batch 64) and "
                                 "its trial waited on the loader 0% of the time")
    assert picked[0].no_twin is None and picked[2].twin
    # Without the calibration's figures every twin joins, as before.
    assert [c.setup for c in pick_candidates(records, defaults, top=2, fp32_twin=True)] == [
        cl, plain, cl.replace(amp="off"), plain.replace(amp="off"), defaults]
    for other in (plain.replace(compile="default"), plain.replace(batch_size=256)):
        waits = {plain.replace(batch_size=256): 0.06}.get(other, 0.0)  # a loop 6 % on the loader: float32 may hide there
        found = pick_candidates([records[0], record(1, other, 300.0, waits)], defaults, top=1, fp32_twin=True, calibration=calibration)
        assert [c.setup for c in found] == [other, other.replace(amp="off"), defaults], other
    unknown = _calibration({("off", False): 228.0, ("bf16", True): 357.1})  # no like-for-like pair for the contiguous layout
    found = pick_candidates([records[0], records[2]], defaults, top=1, fp32_twin=True, calibration=unknown)
    assert [c.setup for c in found] == [plain, plain.replace(amp="off"), defaults]
    unmeasured = pick_candidates([records[0], record(2, plain, 282.3, None)], defaults, top=1, fp32_twin=True, calibration=calibration)
    assert [c.setup for c in unmeasured] == [plain, plain.replace(amp="off"), defaults]
    small = plain.replace(batch_size=32)  # below the probe batch: a CPU's bf16 units may idle there, the calibration says nothing
    assert [c.setup for c in pick_candidates([records[0], record(2, small, 282.3)], defaults, top=1, fp32_twin=True,
                                             calibration=calibration)] == [small, small.replace(amp="off"), defaults]
    # The other layout's pair says the opposite (bf16 0.26x float32 with channels_last, a loaded machine's figures for
    # a depthwise model): the contiguous pair alone is no evidence, and the twin joins.
    contrary = _calibration({("off", False): 228.0, ("off", True): 266.7, ("bf16", False): 358.9, ("bf16", True): 69.0})
    found = pick_candidates([records[0], records[2]], defaults, top=1, fp32_twin=True, calibration=contrary)
    assert [c.setup for c in found] == [plain, plain.replace(amp="off"), defaults] and found[0].no_twin is None
    # A trial of the twin that finished is a measurement of it: it joins whatever the calibration said (0.99x here).
    measured = [records[0], record(2, plain, 282.3), record(3, plain.replace(amp="off"), 280.0)]
    found = pick_candidates(measured, defaults, top=1, fp32_twin=True, calibration=calibration)
    assert [c.setup for c in found] == [plain, plain.replace(amp="off"), defaults] and found[0].no_twin is None


def test_a_twin_shared_by_two_precisions_stays_unless_the_calibration_answers_for_both() -> None:
    """bf16 and fp16 finalists with the same other knobs share one fp32 twin: it is left out only when the calibration
    speaks for both (otherwise it runs, and neither finalist may claim it did not)."""
    defaults = TrainSetup(batch_size=32)
    bf16 = TrainSetup(batch_size=256, amp="bf16")
    fp16 = bf16.replace(amp="fp16")
    records = [TrialRecord(i, "search", s, TrialResult(status="ok", samples_per_s=r, data_wait_fraction=0.01))
               for i, (s, r) in enumerate([(defaults, 100.0), (bf16, 300.0), (fp16, 290.0)])]
    weak = _calibration({("off", False): 200.0, ("bf16", False): 320.0, ("fp16", False): 250.0})  # fp16 1.25x only
    for order in (records, [records[0], records[2], records[1]]):
        found = pick_candidates(order, defaults, top=2, fp32_twin=True, calibration=weak)
        assert bf16.replace(amp="off") in [c.setup for c in found] and not any(c.no_twin for c in found)
    strong = _calibration({("off", False): 200.0, ("bf16", False): 320.0, ("fp16", False): 300.0})
    found = pick_candidates(records, defaults, top=2, fp32_twin=True, calibration=strong)
    assert [c.setup for c in found] == [bf16, fp16, defaults] and all(c.no_twin for c in found[:2])


def test_the_progress_total_is_the_runs_still_possible_and_the_last_line_reads_n_of_n() -> None:
    """Five rounds planned, settled after two (a clear leader) and a twin stopped after one: the total shrinks as setups
    stop, never below the runs done, and the confirmation's last line is 7/7, not 7/20."""
    twin_setup = TrainSetup(batch_size=96)
    pool = [*candidates(), Candidate(twin_setup.to_json(), twin_setup, "twin", twin=True)]
    rates = {16: [100.0, 90.0], 64: [150.0, 140.0], 96: [140.0], 128: [300.0, 280.0]}
    order: list[int] = []
    seen: list[tuple[int, int]] = []
    confirm(pool, WORKLOAD, TrialOptions(), rounds=5, known={}, store=lambda *a: None, runner=_runner_with(rates, order),
            baseline=A.to_json(), on_measure=lambda done, total, *_: seen.append((done, total)))
    assert seen[:3] == [(1, 20), (2, 20), (3, 20)]
    assert seen[3] == (4, 4 + 3 * 4)  # round 1 whole: the twin (0.47x) stops, the other three may run 4 more
    assert seen[-1] == (len(order), len(order)) == (7, 7)
    assert all(total >= done for done, total in seen)
    seen.clear()
    order.clear()
    swapping = {16: [100.0, 90.0, 95.0], 64: [200.0, 215.0, 190.0], 128: [215.0, 200.0, 205.0]}  # within the noise: 3 rounds
    confirm(candidates(), WORKLOAD, TrialOptions(), rounds=3, known={}, store=lambda *a: None, runner=_runner_with(swapping, order),
            baseline=A.to_json(), on_measure=lambda done, total, *_: seen.append((done, total)))
    assert order == [16, 64, 128, 16, 64, 128, 64, 128]
    assert [total for _, total in seen] == [9, 9, 9, 9, 9, 8, 8, 8]  # never grows: the last round's runs are 2, then 1


def test_a_twin_whose_sibling_pair_already_answered_does_not_run() -> None:
    """A real confirmation's first round (resnet18, 64 px, 2026-12-03): three bf16 finalists at batch 512 differing only
    in loader knobs, each waiting on the loader under 1 % of the time; the first twin ran 0.67x its finalist. The other
    two twins would ask the same question of the same training step: they do not run, and their finalists say why.
    A finalist that waits on the loader, or that trains another step (channels_last), still meets its own twin."""
    from autotune.tuner.finalists import TWIN

    defaults = TrainSetup(batch_size=32)
    first = TrainSetup(batch_size=512, num_workers=1, prefetch_factor=5, persistent_workers=True, amp="bf16", optimizer_impl="fused")
    second, third = first.replace(num_workers=2, prefetch_factor=2), first.replace(num_workers=2, prefetch_factor=1)
    finalists = [first, second, third]

    def pool(members: list[TrainSetup]) -> list[Candidate]:
        named = [Candidate(s.to_json(), s, f"#{i}") for i, s in enumerate(members)]
        twins = [Candidate(s.replace(amp="off").to_json(), s.replace(amp="off"), f"{i}{TWIN}", twin=True) for i, s in enumerate(members)]
        return [*named, *twins, Candidate(defaults.to_json(), defaults, "defaults")]

    def run(members: list[TrainSetup], rates: dict[TrainSetup, list[float]], waits: dict[TrainSetup, float]):
        ran: list[TrainSetup] = []

        def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
            ran.append(setup)
            return TrialResult(status="ok", samples_per_s=rates[setup][min(ran.count(setup), len(rates[setup])) - 1],
                               data_wait_fraction=waits.get(setup, 0.001))

        result = confirm(pool(members), WORKLOAD, TrialOptions(), rounds=4, known={}, store=lambda *a: None, runner=runner,
                         baseline=defaults.to_json())
        return ran, result

    rates = {first: [274.1, 248.2], second: [245.7, 257.2], third: [278.5, 274.2], first.replace(amp="off"): [184.0],
             second.replace(amp="off"): [181.7], third.replace(amp="off"): [179.0], defaults: [157.3, 170.5]}
    ran, result = run(finalists, rates, {defaults: 0.23})
    assert ran[:5] == [first, second, third, first.replace(amp="off"), defaults]
    assert second.replace(amp="off") not in ran and third.replace(amp="off") not in ran
    assert [c.candidate.setup for c in result] == [first, second, third, first.replace(amp="off"), defaults]
    assert result[0].candidate.no_twin is None
    assert result[1].candidate.no_twin == result[2].candidate.no_twin == (
        "the twin of #0 (the same forward and backward pass) ran at most 0.67x that finalist, "
        "and both waited on the loader at most 5% of their runs until then")
    ran, _ = run(finalists, rates, {defaults: 0.23, third: 0.3})  # the third waits on its loader: float32 may hide there
    assert third.replace(amp="off") in ran and second.replace(amp="off") not in ran
    close = {**rates, first.replace(amp="off"): [233.0, 220.0]}  # 0.85x: not far enough behind to answer for the others
    ran, _ = run(finalists, close, {defaults: 0.23})
    assert first.replace(amp="off") in ran and second.replace(amp="off") in ran  # the second pair (0.74x) answers
    assert third.replace(amp="off") not in ran
    ran, _ = run(finalists, {**close, second.replace(amp="off"): [226.0, 236.0]}, {defaults: 0.23})
    assert {s.replace(amp="off") for s in finalists} <= set(ran)
    kernels = [first, second.replace(optimizer_impl="foreach"), third.replace(accumulation_steps=4)]  # the same pass
    for setup, source in zip(kernels[1:], finalists[1:], strict=True):
        rates[setup], rates[setup.replace(amp="off")] = rates[source], rates[source.replace(amp="off")]
    ran, _ = run(kernels, rates, {defaults: 0.23})
    assert ran[:5] == [*kernels, first.replace(amp="off"), defaults]
    assert not {s.replace(amp="off") for s in kernels[1:]} & set(ran)
    ran, result = run(finalists, rates, {defaults: 0.23, first: 0.001})
    assert result[1].data_wait == 0.001  # the runs' wait, for the verdict beside the ceilings
    other_step = [first, second, third.replace(channels_last=True)]
    rates[other_step[2]], rates[other_step[2].replace(amp="off")] = [278.5, 274.2], [215.0]
    ran, _ = run(other_step, rates, {defaults: 0.23})
    assert other_step[2].replace(amp="off") in ran and second.replace(amp="off") not in ran


def test_the_defaults_as_a_twin_always_run_they_are_the_baseline() -> None:
    """The defaults join as the fp32 twin of a bf16 finalist with default knobs when their own trial did not finish; a
    sibling pair may answer for that finalist's precision, but the defaults still run: the speedup needs them."""
    from autotune.tuner.finalists import TWIN

    defaults = TrainSetup()
    first = defaults.replace(amp="bf16")
    second = first.replace(optimizer_impl="foreach")
    pool = [Candidate(first.to_json(), first, "#1"), Candidate(second.to_json(), second, "#2"),
            Candidate(second.replace(amp="off").to_json(), second.replace(amp="off"), "twin" + TWIN, twin=True),
            Candidate(defaults.to_json(), defaults, "defaults" + TWIN, twin=True)]
    rates = {first: 300.0, second: 300.0, second.replace(amp="off"): 200.0, defaults: 200.0}
    ran: list[TrainSetup] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        ran.append(setup)
        return TrialResult(status="ok", samples_per_s=rates[setup], data_wait_fraction=0.0)

    result = confirm(pool, WORKLOAD, TrialOptions(), rounds=3, known={}, store=lambda *a: None, runner=runner, baseline=defaults.to_json())
    assert defaults in ran and defaults in [c.candidate.setup for c in result]


def test_the_ceilings_train_once_more_only_when_the_rounds_give_no_median_or_wait() -> None:
    """Beside the winner's confirmed median and wait, two runs (computing and loading alone); rounds of an earlier
    process carry no wait (it is not stored), so a run trains it first, as an interrupted and resumed search needs."""
    from autotune.tuner.confirm import measure_ceilings

    modes: list[str] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        modes.append(options.mode)
        return TrialResult(status="ok", samples_per_s={"train": 90.0, "compute": 300.0, "loader": 500.0}[options.mode],
                           data_wait_fraction=0.4)

    found = measure_ceilings(B, WORKLOAD, TrialOptions(), together=100.0, wait=0.02, runner=runner)
    assert modes == ["compute", "loader"] and (found.together, found.compute, found.loader, found.data_wait_fraction) == (
        100.0, 300.0, 500.0, 0.02)
    modes.clear()
    found = measure_ceilings(B, WORKLOAD, TrialOptions(), together=100.0, wait=None, runner=runner)
    assert modes == ["train", "compute", "loader"] and (found.together, found.data_wait_fraction) == (100.0, 0.4)
