"""Choose the screening rule from measured traces.

``record`` runs a real search with pruning switched off, so every search
trial measures all of its windows and the study keeps each window's
samples/s as an intermediate value. ``replay`` then applies each candidate
pruning rule to those traces offline, in trial order, exactly as the rule
would have seen them, and reports what it saves and what it costs:

* **measured**: the fraction of the search trials' window time the rule spends;
* **kept top**: whether the trials that were best on their full measurement
  (the confirmation's candidates) survive the rule;
* **contenders kept**: whether the trials within 10 % of the best full
  measurement survive;
* **regret**: the best full-measurement value among the trials the rule lets
  finish, as a fraction of the best overall.

With several databases, ``window time spent`` is the mean over them and the
counts are summed.

``compare`` runs the new user's command (resnet18 at 64 px, 3,000 JPEGs, 15
trials) twice, once at a reference ``--trial-seconds`` (10, the former
default) and once at today's default, times both, and re-measures both picks
and the defaults in interleaved rounds (10 s each).

Run (a few minutes each on 2 cores)::

    python -m benchmarks.fidelity record --out /tmp/fidelity --trials 24
    python -m benchmarks.fidelity replay /tmp/fidelity/study.db
    python -m benchmarks.fidelity compare --out /tmp/fidelity-compare

"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: A rule sees one trial's windows so far and the finished trials' values; it says whether to stop.
Rule = Callable[[Sequence[float], Sequence[float]], bool]


@dataclass(frozen=True)
class Trace:
    """One search trial's windows, in order."""

    number: int
    windows: tuple[float, ...]

    @property
    def value(self) -> float:
        """The full measurement's median, as a finished trial reports it."""
        return float(statistics.median(self.windows))


def slower_than_best(ratio: float, after: int) -> Rule:
    """Stop once ``after`` windows' median is below ``ratio`` x the best finished value."""

    def rule(windows: Sequence[float], finished: Sequence[float]) -> bool:
        return len(windows) >= after and bool(finished) and statistics.median(windows) < ratio * max(finished)

    return rule


def tightening(steps: dict[int, float]) -> Rule:
    """Stop at the first checkpoint (windows -> ratio) whose ratio the running median misses."""

    def rule(windows: Sequence[float], finished: Sequence[float]) -> bool:
        ratio = steps.get(len(windows))
        return ratio is not None and bool(finished) and statistics.median(windows) < ratio * max(finished)

    return rule


def top_fraction(after: int, keep: float) -> Rule:
    """Successive halving: after ``after`` windows, go on only within the top ``keep`` of the finished values."""

    def rule(windows: Sequence[float], finished: Sequence[float]) -> bool:
        if len(windows) != after or len(finished) < 3:
            return False
        ranked = sorted(finished, reverse=True)
        cutoff = ranked[max(0, int(len(ranked) * keep) - 1)]
        return statistics.median(windows) < cutoff

    return rule


CANDIDATES: dict[str, Rule] = {
    "none (full trials)": lambda windows, finished: False,
    "0.6 x best after 2 (before)": slower_than_best(0.6, 2),
    "0.8 x best after 1": slower_than_best(0.8, 1),
    "0.8 x best after 2": slower_than_best(0.8, 2),
    "0.85 x best after 2": slower_than_best(0.85, 2),
    "0.6 after 1, 0.8 after 2 (chosen)": tightening({1: 0.6, 2: 0.8}),
    "0.7 after 1, 0.85 after 2": tightening({1: 0.7, 2: 0.85}),
    "0.75 after 1, 0.9 after 2": tightening({1: 0.75, 2: 0.9}),
    "0.7 after 1, 0.85 after 2, 0.9 after 3": tightening({1: 0.7, 2: 0.85, 3: 0.9}),
    "top third after 1 window": top_fraction(1, 1 / 3),
    "top third after 2 windows": top_fraction(2, 1 / 3),
}


#: A trial within this fraction of the best full measurement is a contender for the win.
CONTENDER = 0.9


@dataclass(frozen=True)
class Replay:
    """What one rule does to the traces."""

    name: str
    measured_fraction: float
    kept_top: int
    top: int
    contenders_kept: int
    contenders: int
    regret: float
    stopped: int


def replay(traces: Sequence[Trace], name: str, rule: Rule, baseline: Sequence[float], top: int = 3) -> Replay:
    """Apply ``rule`` in trial order; ``baseline`` holds the finished values seen before the first trace (defaults, guesses)."""
    finished = list(baseline)
    spent = full = 0
    survivors: list[Trace] = []
    stopped = 0
    for trace in traces:
        full += len(trace.windows)
        used = len(trace.windows)
        for k in range(1, len(trace.windows) + 1):
            if rule(trace.windows[:k], finished):
                used = k
                break
        spent += used
        if used < len(trace.windows):
            stopped += 1
        else:
            survivors.append(trace)
            finished.append(trace.value)
    best = sorted(traces, key=lambda t: t.value, reverse=True)[:top]
    kept = sum(1 for t in best if t in survivors)
    overall = max([t.value for t in traces] + list(baseline))
    contenders = [t for t in traces if t.value >= CONTENDER * overall]
    best_kept = max([t.value for t in survivors] + list(baseline))
    return Replay(
        name, spent / full if full else 1.0, kept, len(best), sum(t in survivors for t in contenders), len(contenders), best_kept / overall, stopped
    )


def load_traces(db: Path) -> tuple[list[Trace], list[float]]:
    """The search trials' window traces, and the defaults' and guesses' values, from a study database."""
    import optuna

    storage = f"sqlite:///{db}"
    names = optuna.get_all_study_names(storage)
    study = optuna.load_study(study_name=names[0], storage=storage)
    traces, baseline = [], []
    for trial in study.get_trials(deepcopy=False):
        if trial.state != optuna.trial.TrialState.COMPLETE or not trial.value:
            continue
        if trial.user_attrs.get("role", "search") != "search" or not trial.intermediate_values:
            baseline.append(float(trial.value))
            continue
        if trial.user_attrs.get("reused_from") is not None:
            continue
        windows = tuple(trial.intermediate_values[k] for k in sorted(trial.intermediate_values))
        traces.append(Trace(trial.number, windows))
    return traces, baseline


def record(out: Path, trials: int, trial_seconds: float, model: str, image_size: int, images: int) -> None:
    """A real search whose search trials all measure every window."""
    import optuna

    import autotune
    from autotune.tuner import study as study_module

    study_module.ScreeningPruner = lambda: optuna.pruners.NopPruner()  # type: ignore[assignment,misc]
    result = autotune.search(
        model=model,
        image_size=image_size,
        trials=trials,
        device="cpu",
        out=out,
        trial_seconds=trial_seconds,
        synthetic_images=images,
        progress=True,
        command="python -m benchmarks.fidelity record",
    )
    print(f"winner {result.setup} at {result.samples_per_s:.1f} samples/s; traces in {out / 'study.db'}")


def compare(out: Path, trials: int, images: int, rounds: int, reference_seconds: float) -> None:
    """The new user's search at ``reference_seconds`` per trial and at the default, then both picks interleaved."""
    import time

    import autotune
    from autotune.records import DEFAULT_TRIAL_SECONDS, TrialOptions
    from autotune.workloads import build_workload
    from benchmarks.methods import MethodResult, defaults_method, measure_interleaved

    picks, walls = {}, {}
    for name, seconds in (("reference", reference_seconds), ("default", DEFAULT_TRIAL_SECONDS)):
        began = time.monotonic()
        result = autotune.search(
            model="resnet18",
            image_size=64,
            trials=trials,
            device="cpu",
            out=out / name,
            trial_seconds=seconds,
            synthetic_images=images,
            command=f"python -m benchmarks.fidelity compare ({name}: --trial-seconds {seconds:g})",
        )
        walls[name] = time.monotonic() - began
        assert result.setup is not None, f"{name}: no winner"
        picks[name] = MethodResult(name, result.setup, trials=trials, wall_s=walls[name], selection_samples_per_s=result.samples_per_s)
        print(f"{name} (--trial-seconds {seconds:g}): {walls[name]:.0f} s wall, pick {result.setup.describe()} at {result.samples_per_s:.1f} samples/s")
    workload = build_workload(model="resnet18", image_size=64, data=None, device="cpu", cache_dir=None, synthetic_images=images)
    methods = [defaults_method(), picks["reference"], picks["default"]]
    measure_interleaved(methods, workload, TrialOptions(trial_seconds=10.0), rounds, log=print)
    for method in methods:
        print(f"{method.name}: median {method.samples_per_s} samples/s over {method.measurements}")
    if picks["reference"].samples_per_s and picks["default"].samples_per_s:
        ratio = picks["default"].samples_per_s / picks["reference"].samples_per_s
        print(f"default/reference pick: {ratio:.3f} (goal >= 0.95); wall default {walls['default']:.0f} s (goal <= 300 s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fidelity", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run a search without pruning, keeping every window")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--trials", type=int, default=24)
    rec.add_argument("--trial-seconds", type=float, default=10.0)
    rec.add_argument("--model", default="resnet18")
    rec.add_argument("--image-size", type=int, default=64)
    rec.add_argument("--images", type=int, default=3000)
    cmp = sub.add_parser("compare", help="the 15-trial search at a reference --trial-seconds and at the default, picks re-measured")
    cmp.add_argument("--out", type=Path, required=True)
    cmp.add_argument("--trials", type=int, default=15)
    cmp.add_argument("--images", type=int, default=3000)
    cmp.add_argument("--rounds", type=int, default=5)
    cmp.add_argument("--reference-trial-seconds", type=float, default=10.0, help="the reference search's (default 10, the former default)")
    rep = sub.add_parser("replay", help="apply each candidate rule to recorded traces")
    rep.add_argument("db", type=Path, nargs="+")
    args = parser.parse_args(argv)
    if args.command == "record":
        record(args.out, args.trials, args.trial_seconds, args.model, args.image_size, args.images)
        return 0
    if args.command == "compare":
        compare(args.out, args.trials, args.images, args.rounds, args.reference_trial_seconds)
        return 0
    print("| rule | window time spent | top-3 kept | contenders (>= 0.9 x best) kept | regret | trials stopped |")
    print("| --- | --- | --- | --- | --- | --- |")
    sets = [load_traces(db) for db in args.db]
    for name, rule in CANDIDATES.items():
        rows = [replay(traces, name, rule, baseline) for traces, baseline in sets]
        spent = statistics.mean(r.measured_fraction for r in rows)
        kept = sum(r.kept_top for r in rows)
        top = sum(r.top for r in rows)
        regret = min(r.regret for r in rows)
        contenders = f"{sum(r.contenders_kept for r in rows)}/{sum(r.contenders for r in rows)}"
        stopped = sum(r.stopped for r in rows)
        total = sum(len(t) for t, _ in sets)
        print(f"| {name} | {spent:.0%} | {kept}/{top} | {contenders} | {regret:.3f} | {stopped}/{total} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
