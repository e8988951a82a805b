"""A local search after TPE: the last sampled trials step from the leader one knob at a time.

TPE spreads its draws over the whole space. With a few dozen trials it
rarely tries the setups next to the best one it found, and where the
optimum is flat the best setups differ by a few per cent in knobs it
samples apart (on the text-transformer benchmark every search pick kept
one knob at a slower value that the grid's pick did not). So about one
trial in six (:func:`neighbour_trials`), just before the compile refinement, goes
to one-knob moves from the leading setup: the next value up and down of
an ordered knob (batch, workers, prefetch depth, accumulation), every
other value of a choice (precision, layout, threads, optimizer kernel).

One move is queued at a time, from the leader of that moment, so a move
that takes the lead is the next centre (a greedy hill climb). Each knob
is moved once before any is moved twice, in :data:`PRIORITY` order (the
knobs with the larger measured effects first); of a knob's moves, a value
no trial has measured goes first, then the value whose fastest trial
elsewhere was fastest. A value whose fastest trial was slower than the
screening's last bar (0.8 x the leader) goes after every other move. A
move to a setup measured before, queued already or that the data cannot
feed is skipped. The moves are ordinary trials of the study (role
``neighbour``): their params are told to TPE, and they are screened
(pruned) like sampled trials. The random sampler, a baseline, gets none.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.errors import SetupError
from autotune.records import TrialRecord
from autotune.train_setup import TrainSetup
from autotune.tuner.budget import FINISHED, progress
from autotune.tuner.pruning import CHECKPOINTS
from autotune.tuner.space import Space
from autotune.tuner.study import ATTR_ROLE, SearchStudy

ROLE_NEIGHBOUR = "neighbour"
#: The move a queued neighbour trial makes: the knob moved and the setup (to skip it while it waits or runs).
ATTR_MOVE = "neighbour_move"
#: One trial in this many of the budget is a neighbour move.
SHARE = 6
#: Knobs whose values are ordered: a move goes to the next value up or down.
ORDERED = ("num_workers", "prefetch_factor", "batch_size", "accumulation_steps", "bucket_cap_mb")
#: The order knobs are moved in, each once before any twice: the knobs with the larger effects in
#: docs/benchmarks.md first (batch, workers, precision, layout, threads), the small ones after.
PRIORITY = (
    "batch_size", "num_workers", "amp", "channels_last", "num_threads", "accumulation_steps", "optimizer_impl",
    "prefetch_factor", "cudnn_benchmark", "tf32", "decode", "pin_memory", "bucket_cap_mb", "gradient_as_bucket_view",
    "static_graph",
)
#: A value whose fastest trial ran below the screening's last bar (x the leader) is moved to last.
BAR = max(CHECKPOINTS.values())


def neighbour_trials(wanted: int) -> int:
    """Trials of a TPE search's budget kept for neighbour moves (2 of 15, 5 of 30, none below 6)."""
    return wanted // SHARE


def moves(space: Space, leader: TrainSetup) -> list[tuple[str, Any, TrainSetup]]:
    """Every one-knob move from ``leader`` inside ``space``: (knob, new value, setup), in knob order."""
    found: list[tuple[str, Any, TrainSetup]] = []
    leader = sampled_as(space, leader) or leader  # torch's own choices as the space names them
    for knob in space.searched():
        if knob == "compile" or (knob in ("prefetch_factor", "persistent_workers") and leader.num_workers == 0):
            continue
        if knob == "accumulation_steps" and space.effective_batch is not None:
            continue
        for value in _next_values(space.values[knob], getattr(leader, knob), knob in ORDERED):
            try:
                setup = _moved(space, leader, knob, value)
            except SetupError:  # a combination no setup may hold: not a move, never the search's end
                continue
            if setup is not None:
                found.append((knob, value, setup))
    return found


def _next_values(options: Sequence[Any], current: Any, ordered: bool) -> list[Any]:
    """The values one move away: up and down an ordered knob, every other value of a choice."""
    if not ordered:
        return [v for v in options if v != current]
    if current is None:  # prefetch without workers: not a move of its own
        return []
    below = [v for v in options if v < current]
    above = [v for v in options if v > current]
    return [*([min(above)] if above else []), *([max(below)] if below else [])]


def _moved(space: Space, leader: TrainSetup, knob: str, value: Any) -> TrainSetup | None:
    """``leader`` with ``knob`` at ``value`` as the space samples it (None: the space cannot hold it)."""
    changes: dict[str, Any] = {knob: value}
    if knob == "num_workers":
        if value == 0:
            changes.update(prefetch_factor=None, persistent_workers=False)
        elif leader.num_workers == 0:
            changes.update(prefetch_factor=2, persistent_workers=True)
    if knob == "batch_size" and space.effective_batch is not None:
        changes["accumulation_steps"] = space.effective_batch // value
    if changes.get("accumulation_steps", leader.accumulation_steps) > 1 and changes.get("static_graph", leader.static_graph):
        changes["static_graph"] = False  # DDP's static graph is only offered without accumulation (replace() refuses both)
    setup = leader.replace(**changes)
    if setup.num_workers and setup.prefetch_factor is not None:  # the loader queue stays within an epoch
        fitting = space.prefetch_within_epoch(setup.num_workers, setup.batch_size)
        if setup.prefetch_factor not in fitting:
            lower = [p for p in fitting if p <= setup.prefetch_factor]
            setup = setup.replace(prefetch_factor=max(lower) if lower else min(fitting))
    if not space.contains(setup):
        return None
    sampled = sampled_as(space, setup)
    return sampled if sampled is not None and getattr(sampled, knob) == value else None


def sampled_as(space: Space, setup: TrainSetup) -> TrainSetup | None:
    """What a trial queued with ``setup``'s params runs (its params back through the space's sampling); None if none can."""
    try:
        return space.suggest(optuna.trial.FixedTrial(space.params_for(setup)))
    except ValueError:
        return None


def evidence(records: Sequence[TrialRecord], knob: str, value: Any) -> float | None:
    """The fastest trial that ran ``knob`` at ``value`` (a pruned one counts the median of its windows so far); None if none did."""
    rates = [
        r.result.samples_per_s
        for r in records
        if not r.free and r.result.samples_per_s and r.result.status in ("ok", "pruned") and getattr(r.setup, knob) == value
    ]
    return max(rates) if rates else None


def _priority(knob: str) -> int:
    return PRIORITY.index(knob) if knob in PRIORITY else len(PRIORITY)


def next_move(
    space: Space, records: Sequence[TrialRecord], skip: Callable[[TrainSetup], bool], moved: Counter[str] | None = None,
    allowed: Callable[[TrainSetup], bool] = lambda setup: True,
) -> tuple[str, TrainSetup] | None:
    """The next neighbour of the fastest eager trial as (knob, setup); None when every move was tried or ``skip``-ped.

    Args:
        space: Where the moves must stay.
        records: The study's finished trials.
        skip: Setups not to propose.
        moved: Moves already made per knob in this search; the knob moved least goes next.
        allowed: Setups that may lead (the PyTorch defaults a ``--set`` excludes are the baseline only).
    """
    eager = [r for r in records if r.result.ok and r.result.samples_per_s and r.setup.compile == "off" and allowed(r.setup)]
    if not eager:
        return None
    leader = max(eager, key=lambda r: r.result.samples_per_s or 0.0)
    best = leader.result.samples_per_s or 0.0
    tried = {_key(sampled_as(space, r.setup) or r.setup) for r in records}  # the defaults' torch choices named
    moved = moved or Counter()
    ranked = []
    for knob, value, setup in moves(space, leader.setup):
        if _key(setup) in tried or skip(setup):
            continue
        seen = evidence(records, knob, value)
        behind = seen is not None and seen < BAR * best  # a value whose fastest trial would have been screened out
        ranked.append(((behind, moved[knob], _priority(knob), -(best if seen is None else seen)), knob, setup))
    if not ranked:
        return None
    _, knob, setup = min(ranked, key=lambda item: item[0])
    return knob, setup


def enqueue_neighbour(study: SearchStudy, space: Space, wanted: int, *, share: int, after: int, skip: Callable[[TrainSetup], bool],
                      allowed: Callable[[TrainSetup], bool] = lambda setup: True) -> None:
    """Queue the next neighbour move while the search is in its neighbour trials (one waits at a time).

    Args:
        study: The search's study.
        space: Where the moves must stay.
        wanted: The trial budget.
        share: Trials of the budget for neighbour moves (:func:`neighbour_trials`; 0: none).
        after: Trials of the budget that come after them (the compile refinement's).
        skip: Setups not to queue (those the data cannot feed).
        allowed: Setups that may lead (:func:`next_move`).
    """
    if share <= 0:
        return
    live = study.study.get_trials(deepcopy=False, states=(*FINISHED, TrialState.WAITING, TrialState.RUNNING))
    done, running = progress(live, wanted)
    if not wanted - after - share <= done + running < wanted - after:
        return
    if any(t.state == TrialState.WAITING for t in live):  # a queued trial goes first; one move at a time
        return
    mine = [t for t in live if ATTR_MOVE in t.user_attrs]
    queued = {_key(TrainSetup.from_dict(t.user_attrs[ATTR_MOVE]["setup"])) for t in mine}
    moved = Counter(str(t.user_attrs[ATTR_MOVE]["knob"]) for t in mine)
    found = next_move(space, study.records(), lambda s: skip(s) or _key(s) in queued, moved, allowed)
    if found is not None:
        knob, setup = found
        move = {"knob": knob, "setup": setup.to_dict()}
        study.study.enqueue_trial(space.params_for(setup), user_attrs={ATTR_ROLE: ROLE_NEIGHBOUR, ATTR_MOVE: move})


def _key(setup: TrainSetup) -> str:
    return json.dumps(setup.to_dict(), sort_keys=True)
