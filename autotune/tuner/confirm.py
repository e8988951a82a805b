"""Confirmation: re-measure the best candidates interleaved (A B C A B C).

A single measurement on a shared machine varies by 20-30 %; ranking close
setups by one run picks noise. The finalists (and the PyTorch defaults, for
the speedup) are measured again in rounds, each round running every
candidate once, and compared by their paired ratios round by round
(:mod:`autotune.tuner.noise`); the leader is the highest median.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from autotune.records import Mode, TrialOptions, TrialResult, Workload
from autotune.rounds import DIVERGED_STOP, Candidate, Ceilings, Confirmed, Runs
from autotune.runner import TrialRunner, run_trial
from autotune.train_setup import TrainSetup
from autotune.tuner.choice import never_preferred
from autotune.tuner.diverged import math_of
from autotune.tuner.finalists import COMPUTE_BOUND, autocasts_as
from autotune.tuner.noise import beats, behind_throughout, disagree, equivalent, leader, paired_ratios, resolved

Store = Callable[[str, Runs], None]


#: Rounds every candidate runs (but a twin far behind, :data:`CLEARLY_SLOWER`) before any stops.
MIN_ROUNDS = 2

#: Before :data:`MIN_ROUNDS`, an fp32 twin no trial ran stops when below this fraction of the leader and of its own
#: finalist in every paired round so far (the search's screening stops a trial at this gap after its second window,
#: :data:`autotune.tuner.pruning.CHECKPOINTS`). A finalist does not: its trial put it near the top, and one slow run (a
#: stall) is not enough to overrule that.
CLEARLY_SLOWER = 0.8

def confirmation_plan(candidates: Sequence[Candidate], seconds: float, rounds: int, min_rounds: int = MIN_ROUNDS) -> str:
    """The line announcing the confirmation: how many setups (a range where a sibling pair may settle twins that have not
    run, :func:`_settled_by_siblings`), how long a run, how many rounds."""
    setups = len(candidates)
    rounds = lone_rounds(setups, rounds)
    floor = min(min_rounds, rounds)
    span = f"{rounds} round{'s' if rounds > 1 else ''}" if floor == rounds else f"{floor} to {rounds} rounds"
    twins = floor > 1 and any(c.twin for c in candidates)
    early = f", an fp32 twin after one round below {CLEARLY_SLOWER:g}x the leader" if twins else ""
    spared = _may_be_settled(candidates)
    count = f"{setups - spared} to {setups} setups" if spared else f"{setups} setup{'s' if setups != 1 else ''}"
    return f"confirmation: {count} in interleaved rounds of {seconds:g} s ({span}; a setup stops once the leader beats or equals it{early})"


def _may_be_settled(candidates: Sequence[Candidate]) -> int:
    """How many twins no trial ran a sibling pair may settle before they run (:func:`_settled_by_siblings`): among the
    fp32 twins of finalists with one forward and backward pass (:func:`_pass`), all but one when each of them is such a
    twin, all when another is measured anyway (a finalist or the defaults)."""
    groups: dict[str, list[Candidate]] = {}
    for fp32 in candidates:
        if any(autocasts_as(c.setup, fp32.setup) for c in candidates):
            groups.setdefault(_pass(fp32.setup).to_json(), []).append(fp32)
    return sum(max(0, sum(c.twin for c in group) - all(c.twin for c in group)) for group in groups.values())


def lone_rounds(setups: int, rounds: int) -> int:
    """The rounds a confirmation of ``setups`` plans: one for a lone setup (``--trials 1``: the defaults), which has
    nothing to be ranked against (it runs again only while its runs fail)."""
    return rounds if setups > 1 else min(rounds, 1)


def confirm(
    candidates: Sequence[Candidate],
    workload: Workload,
    options: TrialOptions,
    *,
    rounds: int,
    known: dict[str, Runs],
    store: Store,
    on_measure: Callable[[int, int, Candidate, TrialResult], None] = lambda *_: None,
    runner: TrialRunner = run_trial,
    min_rounds: int = MIN_ROUNDS,
    baseline: str | None = None,
) -> list[Confirmed]:
    """Measure the candidates in interleaved rounds until more rounds could not change the choice.

    Every candidate runs in the first ``min_rounds`` rounds (or ``rounds``,
    if fewer). After that, a candidate the leader already beats or equals
    beyond the noise (:func:`autotune.tuner.noise.resolved`) is no longer
    measured: more rounds of it could not change the choice. The rounds go
    on with the leader and the candidates still within the noise of it, and
    stop once none is left, at the latest after ``rounds`` rounds. Before
    ``min_rounds``, an fp32 twin no trial ran (:data:`TWIN`) below
    :data:`CLEARLY_SLOWER` times the leader and its own finalist in every
    paired round so far stops already, and one not measured yet does not
    run once a sibling pair answers for it (the same forward and backward
    pass with other loader knobs, both compute-bound, its twin that far behind:
    :func:`_settled_by_siblings`; the finalist's ``no_twin`` then says so);
    a lone candidate stops once it measured (nothing to rank it against). The
    ``baseline`` candidate (the defaults, whose key it is) stops only once
    every other candidate still measured beats it, so whichever wins in the
    end has paired rounds against it, and while the paired ratios over it of
    the leader or of any candidate still measured disagree by more than
    :data:`~autotune.tuner.noise.SPREAD` times (a load spike in one round
    would make the speedup of whichever wins).

    A run that diverges (here or in ``known``) stops every candidate of its training math but the ``baseline``
    (:func:`~autotune.tuner.diverged.math_of`): none of them can win.

    Measurements already in ``known`` (from an interrupted run) count; only
    the missing ones run. ``store`` is called after every measurement so none
    is lost.
    """
    pool = list(candidates)  # a finalist whose twin a sibling pair settles is marked there (Candidate.no_twin)
    kept = {c.key: known.get(c.key, ([], [], [])) for c in candidates}
    values = {key: list(runs[0]) for key, runs in kept.items()}
    failures = {key: list(runs[1]) for key, runs in kept.items()}
    failed_rounds = {key: list(runs[2]) for key, runs in kept.items()}
    peaks: dict[str, int] = {}
    waits: dict[str, float] = {}  # the highest share of a run spent waiting on the loader, per candidate (this process's runs)
    foregone: set[str] = set()
    planned, done = lone_rounds(len(candidates), rounds), 0

    def runs(key: str) -> int:
        return len(values[key]) + len(failures[key])

    def results() -> list[Confirmed]:
        return [Confirmed(c, tuple(values[c.key]), tuple(failures[c.key]), peaks.get(c.key), waits.get(c.key),
                          tuple(failed_rounds[c.key]), stopped.get(c.key)) for c in pool if c.key not in foregone]

    def settle(next_round: int, active: set[str]) -> set[str]:
        """Who runs in round ``next_round``, from the rounds so far (nobody: the confirmation ends)."""
        if next_round >= rounds or (len(candidates) == 1 and values[candidates[0].key]):
            return set()
        if next_round >= min(min_rounds, rounds):
            active = _unresolved(results(), active, baseline, rounds - next_round)
            return active if len(active) > 1 else set()
        return active - _clearly_slower(results(), active, baseline) if next_round > 0 else active

    def at_most(active: set[str]) -> int:  # the progress's total: the runs done and those still possible
        left = sum(max(0, planned - runs(key)) for key in active)
        return done + (left or len(active))  # a lone candidate whose runs failed runs again

    unstable = {math_of(c.setup) for c in candidates if any(f.startswith("diverged") for f in failures[c.key])}  # a resumed one's
    stopped = {c.key: DIVERGED_STOP for c in candidates if math_of(c.setup) in unstable and c.key != baseline}
    active = settle(0, {c.key for c in candidates} - set(stopped))
    for round_index in range(rounds):
        queue = [c.key for c in pool if c.key in active and runs(c.key) <= round_index]
        if not queue:
            active = settle(round_index + 1, active)
        for position, key in enumerate(queue):
            if key not in active:  # a twin a sibling pair settled meanwhile
                continue
            candidate = next(c for c in pool if c.key == key)
            result = runner(candidate.setup, workload, options)
            if result.ok and result.samples_per_s is not None:
                values[key].append(result.samples_per_s)
                if result.peak_memory_bytes:
                    peaks[key] = max(peaks.get(key, 0), result.peak_memory_bytes)
                if result.data_wait_fraction is not None:
                    waits[key] = max(waits.get(key, 0.0), result.data_wait_fraction)
            else:
                failed_rounds[key].append(runs(key))
                failures[key].append(f"{result.status}: {result.error}")
                if candidate.timed_out and not values[key]:  # their trial timed out and so did this run: no more timeouts
                    active.discard(key)
                if result.status == "diverged":  # its math is unstable: none of it can win (autotune.tuner.diverged)
                    same = {c.key for c in pool if math_of(c.setup) == math_of(candidate.setup) and c.key != baseline}
                    active -= same
                    stopped.update({other: DIVERGED_STOP for other in same})
            store(key, (values[key], failures[key], failed_rounds[key]))
            done += 1
            for twin, finalists in _settled_by_siblings(results(), active, waits, baseline).items():
                active.discard(twin)
                foregone.add(twin)
                pool = [replace(c, no_twin=finalists[c.key]) if c.key in finalists else c for c in pool]
            if not active.intersection(queue[position + 1:]):  # the round is whole: who runs next is known before the line shows
                active = settle(round_index + 1, active)
            on_measure(done, at_most(active), candidate, result)
    return results()


def _pass(setup: TrainSetup) -> TrainSetup:
    """``setup`` with its loader and optimizer knobs at their defaults: the forward and backward pass it runs, which is
    what autocast changes (the optimizer updates float32 weights either way, every ``accumulation_steps`` micro-batches)."""
    return setup.replace(num_workers=0, prefetch_factor=None, pin_memory=False, persistent_workers=False, optimizer_impl=None,
                         accumulation_steps=1)


def _settled_by_siblings(confirmed: Sequence[Confirmed], active: set[str], waits: dict[str, float],
                         baseline: str | None) -> dict[str, dict[str, str]]:
    """The twins no trial ran, not measured yet, whose every finalist a measured sibling pair already answers; per twin,
    why each of its finalists needs it no more.

    A sibling pair is another finalist with the same forward and backward pass (only loader and optimizer knobs
    differ, :func:`_pass`) and its twin, measured below :data:`CLEARLY_SLOWER` times that finalist in every paired
    round. When both finalists waited on the loader at most :data:`COMPUTE_BOUND` of every run, the pass is the loop's
    limit in both, and the same pass in float32 would be as much slower in this one.
    """
    found: dict[str, dict[str, str]] = {}
    for twin in confirmed:
        key = twin.candidate.key
        if not twin.candidate.twin or key not in active or twin.values or twin.failures or key == baseline:
            continue
        own = [c for c in confirmed if autocasts_as(c.candidate.setup, twin.candidate.setup)]
        reasons: dict[str, str] = {}
        for finalist in own:
            if waits.get(finalist.candidate.key, 1.0) > COMPUTE_BOUND:
                continue
            for sibling in confirmed:
                if (sibling is finalist or _pass(sibling.candidate.setup) != _pass(finalist.candidate.setup)
                        or waits.get(sibling.candidate.key, 1.0) > COMPUTE_BOUND):
                    continue
                pair = next((c for c in confirmed if c.values and autocasts_as(sibling.candidate.setup, c.candidate.setup)), None)
                ratios = paired_ratios(pair, sibling) if pair is not None else []
                if ratios and max(ratios) < CLEARLY_SLOWER:
                    reasons[finalist.candidate.key] = (
                        f"the twin of {sibling.candidate.label} (the same forward and backward pass) ran at most "
                        f"{max(ratios):.2f}x that finalist, and both waited on the loader at most {COMPUTE_BOUND:.0%} of their runs until then")
                    break
        if own and len(reasons) == len(own):
            found[key] = reasons
    return found


def _clearly_slower(confirmed: Sequence[Confirmed], active: set[str], baseline: str | None) -> set[str]:
    """The measured twins no trial ran below :data:`CLEARLY_SLOWER` times the leader and every finalist they are the
    twin of, in every paired round (never the baseline: the speedup needs its rounds)."""
    measured = [c for c in confirmed if c.candidate.key in active]
    top = leader(measured)
    if top is None:
        return set()
    slower = set()
    for other in measured:
        if other is top or not other.candidate.twin or other.candidate.key == baseline:
            continue
        own = [c for c in measured if autocasts_as(c.candidate.setup, other.candidate.setup)]
        ratios = [ratio for against in (top, *own) for ratio in paired_ratios(other, against)]
        if ratios and max(ratios) < CLEARLY_SLOWER:
            slower.add(other.candidate.key)
    return slower


def _unresolved(confirmed: Sequence[Confirmed], active: set[str], baseline: str | None, left: int) -> set[str]:
    """The leader and the still-measured candidates it neither beats nor equals yet (one that never measured is dropped),
    but those behind it in every paired round, more than the ``left`` rounds to run, that the choice's rules would never
    prefer to it (:func:`~autotune.tuner.noise.behind_throughout`, :func:`~autotune.tuner.choice.never_preferred`);
    while any such candidate goes on, those the leader equals go on too."""
    measured = [c for c in confirmed if c.candidate.key in active]
    top = leader(measured)
    if top is None:
        return active

    def settled(other: Confirmed) -> bool:
        return resolved(top, other) or (behind_throughout(top, other, left) and never_preferred(other.candidate.setup, top.candidate.setup))

    keep = {c.candidate.key for c in measured if c is top or (c.median is not None and not settled(c))}
    if len(keep) > 1:  # the leader may yet change: one equal to it goes on, or the choice (among those measured to the
        # last round) lost it to a later leader never compared with it round for round (the README's search: -6 %)
        keep |= {c.candidate.key for c in measured if c.median is not None and equivalent(top, c)}
    base = next((c for c in measured if c.candidate.key == baseline), None)
    others = [c for c in measured if c.candidate.key in keep - {baseline}]
    if base is not None and base.median is not None and (
        not all(beats(c, base) for c in others) or any(disagree(c, base) for c in [top, *others])
    ):  # the speedup is the median of the winner's paired ratios over the baseline, and any setup still measured may
        # win: rounds that disagree need more (a probe's winner led only after the defaults stopped: 137x and 551x)
        keep.add(base.candidate.key)
    return keep


def measure_ceilings(setup: TrainSetup, workload: Workload, options: TrialOptions, *, together: float | None = None,
                     wait: float | None = None, runner: TrialRunner = run_trial) -> Ceilings:
    """The winner's setup computing alone and loading alone, one run each in a row, right after its confirmation.

    The bottleneck verdict then compares like with like: the compute-only
    and loader-only rates at the winner's batch, precision, layout and
    workers, beside ``together``, its real loop's median in the rounds just
    measured (one more run of it would say the same), and ``wait``, the
    highest share of those runs it waited on the loader. Without either
    (rounds of an earlier process), one run trains it first and gives them.
    A mode that fails has no figure.
    """
    modes: tuple[Mode, ...] = ("compute", "loader") if together is not None and wait is not None else ("train", "compute", "loader")
    results = {mode: runner(setup, workload, replace(options, mode=mode)) for mode in modes}
    rates = {mode: result.samples_per_s if result.ok else None for mode, result in results.items()}
    if "train" in results:
        together = together if together is not None else rates["train"]
        wait = wait if wait is not None else results["train"].data_wait_fraction if results["train"].ok else None
    return Ceilings(together, rates["compute"], rates["loader"], wait)
