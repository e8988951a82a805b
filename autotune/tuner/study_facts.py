"""What a stored study says of its search: its ``--set``, workload, memory budget and world size from the signature,
the winner a shared study's confirming worker published, and the confirmation rounds, labelled as the search labels them.

Read by ``autotune report``, ``autotune status`` and a rerun; nothing here writes to the study.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from optuna.trial import FrozenTrial

from autotune.errors import AutotuneError
from autotune.output.best import Best
from autotune.records import TrialRecord
from autotune.rounds import DIVERGED_STOP, Candidate, Confirmed
from autotune.train_setup import TrainSetup
from autotune.tuner.budget import STUDY_BUDGET
from autotune.tuner.constraints import Constraint, excluding
from autotune.tuner.diverged import math_of
from autotune.tuner.finalists import TIMED_OUT, TWIN, finalist_label
from autotune.tuner.identity import described_workload, stored_constraints
from autotune.tuner.stores import Rounds
from autotune.tuner.study import ATTR_WORKER, ROLE_DEFAULTS, STUDY_SIGNATURE, STUDY_WINNER, SearchStudy


def stored_set(study: SearchStudy) -> dict[str, Constraint]:
    """The search's ``--set`` constraints as the study stored them in its signature (none: none stored or readable)."""
    return stored_constraints(study.study.user_attrs.get(STUDY_SIGNATURE)) or {}


def stored_workload(study: SearchStudy) -> str | None:
    """What the study's search trains, in one line, from its stored signature (None: none stored or readable)."""
    return described_workload(study.study.user_attrs.get(STUDY_SIGNATURE))


def stored_max_memory(study: SearchStudy) -> int | None:
    """The search's ``--max-memory`` in bytes, from its stored signature (None: none given, stored or readable)."""
    return _stored_count(study, "max_memory")


def stored_world_size(study: SearchStudy) -> int:
    """The search's ``--nproc-per-node`` from its stored signature (1: none given, stored or readable)."""
    return _stored_count(study, "nproc_per_node") or 1


def _stored_count(study: SearchStudy, key: str) -> int | None:
    value = (study.study.user_attrs.get(STUDY_SIGNATURE) or {}).get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def baseline_only(records: Sequence[TrialRecord], constraints: dict[str, Constraint]) -> frozenset[int]:
    """The trials whose setup the search's ``--set`` (:func:`stored_set`) excludes: the PyTorch defaults it measured as the baseline."""
    return frozenset(r.number for r in records if excluding(constraints, r.setup) is not None)


def run_by_workers(trials: Sequence[FrozenTrial]) -> bool:
    """Whether workers of a shared study (``--storage`` with several workers) ran these trials; a lone search names none."""
    return any(ATTR_WORKER in t.user_attrs for t in trials)


def published_winner(study: SearchStudy) -> tuple[Best, str] | None:
    """The winner a shared study's confirming worker stored, and who wrote it where; None for none.

    Any worker's ``autotune status`` and ``autotune report`` read it, whichever
    directory holds that worker's best.json and train.py.
    """
    stored = study.study.user_attrs.get(STUDY_WINNER)
    if not isinstance(stored, dict) or not isinstance(stored.get("best"), dict):
        return None
    budget = study.study.user_attrs.get(STUDY_BUDGET)
    if isinstance(budget, int) and stored.get("trials") != budget:  # an earlier budget's: a rerun with more --trials is not confirmed yet
        return None
    try:
        best = Best.from_dict(stored["best"])
    except AutotuneError:  # written by another version: no winner to show
        return None
    return best, f"{stored.get('by')} (best.json and train.py in {stored.get('out')})"


def stored_confirmed(study: SearchStudy, records: list[TrialRecord], rounds: Rounds | None = None,
                     peaks: dict[str, int] | None = None) -> tuple[Confirmed, ...]:
    """The stored confirmation rounds (or ``rounds``, whose runs measured ``peaks`` by key), labelled like the search labels them."""
    found = []
    for key, (values, failures, failed_rounds) in (study.stored_confirmation() if rounds is None else rounds).items():
        setup = TrainSetup.from_json(key)
        # The trials that measured it, as the search picked its finalists from (a pruned twin stays "a finalist in fp32").
        same = sorted((r for r in records if r.setup == setup and r.result.ok and r.result.samples_per_s),
                      key=lambda r: -(r.result.samples_per_s or 0.0))
        timed_out = [r for r in records if r.setup == setup and r.result.status == "timeout"]  # the defaults' trial, say
        label = finalist_label(same) if same else finalist_label(timed_out) + TIMED_OUT if timed_out else setup.describe() + TWIN
        found.append(Confirmed(Candidate(key, setup, label, twin=not same and not timed_out, timed_out=not same and bool(timed_out)),
                               tuple(values), tuple(failures), peak_bytes=(peaks or {}).get(key),
                               failed_rounds=tuple(failed_rounds)))
    # A finalist of training math that diverged in a confirmation run stopped there, as the search said (the defaults ran on).
    unstable = {math_of(c.candidate.setup) for c in found if any(f.startswith("diverged") for f in c.failures)}
    defaults = {r.setup for r in records if r.role == ROLE_DEFAULTS}
    return tuple(replace(c, stopped=DIVERGED_STOP) if math_of(c.candidate.setup) in unstable and c.candidate.setup not in defaults else c
                 for c in found)
