"""The benchmark harness: pure helpers, the report, and one real ``--quick`` run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.records import TrialOptions, TrialResult
from autotune.train_setup import TrainSetup
from autotune.tuner.space import Space
from benchmarks import plot, run
from benchmarks.methods import GridSpec, MethodResult, grid_points, measure_interleaved, trials_to_reach

METHODS = ("defaults", "recipe", "max_batch", "random_15", "random", "autotune_15", "autotune", "emitted", "grid")


def _space(workers: int = 2, batches: tuple[int, ...] = (8, 16, 32, 64)) -> Space:
    return Space(
        values={
            "num_workers": tuple(range(workers + 1)),
            "prefetch_factor": tuple(range(1, 9)),
            "pin_memory": (False,),
            "persistent_workers": (True,),
            "batch_size": batches,
            "accumulation_steps": (1, 2, 4),
            "amp": ("off", "bf16"),
            "channels_last": (False, True),
        }
    )


def test_grid_points_discretize_the_space() -> None:
    points = grid_points(_space(), GridSpec())
    assert len(points) == 3 * 3 * 2 * 2
    assert {p.num_workers for p in points} == {0, 1, 2}
    assert {p.batch_size for p in points} == {16, 32, 64}
    assert all(p.prefetch_factor == (2 if p.num_workers else None) for p in points)
    assert all(_space().contains(p) for p in points)
    wide = grid_points(_space(workers=16), GridSpec(workers=3, batches=1, channels_last=(False,)))
    assert {p.num_workers for p in wide} == {0, 8, 16}
    assert len(wide) == 3 * 2


def test_trials_to_reach_counts_in_trial_order() -> None:
    assert trials_to_reach([10.0, None, 96.0, 120.0], 95.0) == 3
    assert trials_to_reach([10.0, None], 95.0) is None


def test_the_grid_reference_is_its_best_confirmed_point() -> None:
    from benchmarks.methods import confirm_grid, grid_method

    rates = {8: 150.0, 16: 120.0, 32: 110.0, 64: 50.0}

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        return TrialResult(status="ok", samples_per_s=rates[setup.batch_size])

    grid = grid_method([TrainSetup(batch_size=b) for b in rates], None, TrialOptions(), runner=runner)  # type: ignore[arg-type]
    assert grid.setup.batch_size == 8 and [d["batch_size"] for d in grid.extra["top"]] == [8, 16, 32]
    # Re-measured, the lucky first point is slower than the second: the reference is the second.
    second = MethodResult("grid_2", TrainSetup(batch_size=16), samples_per_s=125.0, measurements=[125.0])
    third = MethodResult("grid_3", TrainSetup(batch_size=32), samples_per_s=100.0, measurements=[100.0])
    grid.samples_per_s, grid.measurements = 118.0, [118.0]
    confirmed = confirm_grid(grid, [grid, second, third])
    assert confirmed.setup.batch_size == 16 and confirmed.samples_per_s == 125.0
    assert confirmed.extra["confirmed_rank"] == 2 and confirmed.trials == grid.trials


def test_extras_measure_themselves_once_per_round() -> None:
    order: list[str] = []

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        order.append(f"trial{setup.batch_size}")
        return TrialResult(status="ok", samples_per_s=10.0)

    script = MethodResult("emitted", TrainSetup(batch_size=8))
    answers = iter([(12.0, None), (None, "train.py exited with 1: boom"), (14.0, None)])

    def measure() -> tuple[float | None, str | None]:
        order.append("script")
        return next(answers)

    picks = [MethodResult("a", TrainSetup(batch_size=8))]
    measure_interleaved(picks, None, TrialOptions(), 3, runner=runner, extras={"train.py": (script, measure)})  # type: ignore[arg-type]
    assert order == ["trial8", "script"] * 3
    assert script.measurements == [12.0, 14.0] and script.samples_per_s == 13.0
    assert script.failures == ["train.py exited with 1: boom"]


def test_interleaved_rounds_share_identical_picks() -> None:
    calls: list[int] = []

    def runner(setup: TrainSetup, workload: object, options: TrialOptions) -> TrialResult:
        calls.append(setup.batch_size)
        return TrialResult(status="ok", samples_per_s=float(setup.batch_size + len(calls)))

    methods = [MethodResult("a", TrainSetup(batch_size=8)), MethodResult("b", TrainSetup(batch_size=16)),
               MethodResult("c", TrainSetup(batch_size=8))]
    measure_interleaved(methods, None, TrialOptions(trial_seconds=1), 3, runner=runner)  # type: ignore[arg-type]
    assert calls == [8, 16, 8, 16, 8, 16]  # A B A B A B, the shared pick once per round
    assert methods[0].measurements == methods[2].measurements == [9.0, 11.0, 13.0]
    assert methods[1].samples_per_s == 20.0


def test_goals_say_missed_plainly() -> None:
    methods = {m: {"samples_per_s": 100.0, "ratio_to_grid": 1.0} for m in METHODS}
    methods["autotune_15"].update(samples_per_s=90.0, ratio_to_grid=0.9, search_cost={"wall_over_measured": 2.0})
    methods["emitted"].update(samples_per_s=80.0)
    goals = run.check_goals({"methods": methods})
    lines: list[str] = []
    run.print_goals("w", goals, log=lines.append)
    missed = [line for line in lines if line.startswith("MISSED:")]
    assert len(missed) == 5  # autotune_15 vs grid, random_15, random; train.py; search wall
    assert any("train.py/autotune = 0.800" in line for line in missed)
    # With the final rounds on record, a miss says how often each pick led, round by round.
    methods["autotune"].update(setup={"batch_size": 64}, measurements=[101.0, 99.0, 104.0, 98.0, 97.0])
    methods["random"].update(setup={"batch_size": 128}, measurements=[100.0, 100.0, 100.0, 100.0, 100.0])
    detail = next(g["detail"] for g in run.check_goals({"methods": methods}) if g["goal"] == "autotune >= random")
    assert detail.endswith("autotune led in 2 of 5 paired rounds")
    # A failed round is missing from the measurements: the rounds no longer pair up, so none are counted.
    methods["random"].update(measurements=[100.0, 100.0, 100.0, 100.0], failures=["timeout: killed"])
    detail = next(g["detail"] for g in run.check_goals({"methods": methods}) if g["goal"] == "autotune >= random")
    assert detail == "autotune 100.0 vs random 100.0 samples/s"
    methods["random"].update(measurements=[100.0] * 5, failures=[])
    methods["autotune_15"].update(samples_per_s=100.0, ratio_to_grid=1.0, search_cost={"wall_over_measured": 1.2})
    methods["emitted"].update(samples_per_s=96.0)
    assert all(g["ok"] for g in run.check_goals({"methods": methods}))


def test_plot_without_matplotlib_fails_clearly(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import builtins

    real_import = builtins.__import__

    def fake_import(name: str, *args: object, **kwargs: object) -> object:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(plot.MissingMatplotlib, match="matplotlib"):
        plot.write_plot([], tmp_path / "x.png")


@pytest.mark.slow
@pytest.mark.time_limit(600)  # about 115 s beside two other test files; a whole benchmark run slows with the load
def test_quick_run_writes_every_method(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "results"
    assert run.main(["--quick", "--out", str(out), "--cache-dir", str(tmp_path / "cache")]) == 0
    data = json.loads((out / f"{run.QUICK_WORKLOAD.name}.json").read_text())
    assert {"workload", "machine", "date", "command", "methods", "goals"} <= set(data)
    assert set(data["methods"]) == set(METHODS)
    for name, method in data["methods"].items():
        assert method["samples_per_s"] and method["samples_per_s"] > 0, name
        assert method["ratio_to_grid"] and method["ratio_to_grid"] > 0, name
        assert len(method["measurements"]) == run.QUICK_BUDGET.rounds, name
        assert {"setup", "trials", "wall_s"} <= set(method)
        TrainSetup.from_dict(method["setup"])
    assert data["methods"]["grid"]["ratio_to_grid"] == 1.0
    assert data["methods"]["autotune"]["trials"] == run.QUICK_BUDGET.autotune_trials
    assert data["methods"]["random"]["trials"] == run.QUICK_BUDGET.autotune_trials
    cost = data["methods"]["autotune"]["search_cost"]
    assert cost["wall_s"] > cost["measured_s"] > 0
    printed = capsys.readouterr().out
    assert "estimate:" in printed and "| quick-resnet18-32 | autotune |" in printed
    assert any(line.startswith(("OK:", "MISSED:")) for line in printed.splitlines())
    # The report reads what the run wrote (the table needs no matplotlib).
    assert run.main(["--report", "--out", str(out), "--no-plot"]) == 0
    report = capsys.readouterr().out
    assert "| quick-resnet18-32 | grid |" in report
    rounds = ", ".join(f"{v:.1f}" for v in data["methods"]["autotune"]["measurements"])
    assert rounds in report  # the final rounds behind the medians
    first_goal = data["goals"][0]
    assert f"{'OK' if first_goal['ok'] else 'MISSED'} ({first_goal['detail']})" in report


def test_warmup_steps_quick_prints_each_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import warmup_steps

    assert warmup_steps.main(["--quick", "--cache-dir", str(tmp_path)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    ratios = [float(x) for x in line.split("step / steady:")[1].split()]
    assert len(ratios) == 4 and all(r > 0 for r in ratios)
    assert "warm-up 1" in line  # one worker: one warm-up step after the synthetic one


def test_script_vs_trial_refuses_a_directory_without_a_search(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks.script_vs_trial import main

    assert main([str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1


def test_threads_benchmark_names_torchs_own_count_beside_auto() -> None:
    from benchmarks.threads import SETUPS, setups_for

    # Torch's own choice (None) and the same count named explicitly are both measured, once each.
    assert setups_for(2)[:2] == ((0, None), (0, 2)) and len(setups_for(2)) == len(SETUPS) + 1
    assert setups_for(1) == SETUPS  # (0, 1) is already there
