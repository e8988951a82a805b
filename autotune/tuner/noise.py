"""Telling setups apart on a noisy machine: paired comparisons over interleaved rounds.

Confirmation measures every finalist once per round (A B C A B C), so the
i-th measurements of two setups ran seconds apart under the same machine
load. Their ratio cancels most of that load; a ranking built on these paired
ratios holds where one built on single measurements picks noise.

Two rules decide, both on the paired ratios of ``a`` over ``b``:

* ``a`` *beats* ``b`` when it was faster by at least :data:`NOISE_FLOOR` at
  the median (3 %, the noise floor a published measurement-driven tuner,
  pytorch-autotune 2.0, also uses) and faster in at least 3 of every 4
  paired rounds: in every round up to three rounds, one loss allowed from
  four (a round with a load spike on one side must not undo a clear gain);
* ``a`` and ``b`` are *equivalent* when every paired ratio lies within
  :data:`NOISE_FLOOR` of 1: which one wins makes no difference worth a round.

A third rule says when more rounds are not worth running although neither
holds: ``b`` was *behind throughout* when it was slower than ``a`` in every
paired round, in more rounds than are left to run (and at least
:data:`BEHIND_ROUNDS`): whatever the rounds left measure, the median of its
paired ratios over ``a`` stays below 1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.rounds import Confirmed

#: Smallest median gain that counts as faster (3 %).
NOISE_FLOOR = 0.03


def paired_ratios(a: Confirmed, b: Confirmed) -> list[float]:
    """``a / b`` per round, over the rounds both measured (in round order): a round in which either failed pairs
    nothing. Rounds stored by an older version without the rounds of their failures compare the medians only."""
    a_rounds, b_rounds = a.by_round(), b.by_round()
    if a_rounds is None or b_rounds is None:
        return [a.median / b.median] if a.median and b.median else []
    return [a_rounds[r] / b_rounds[r] for r in sorted(a_rounds.keys() & b_rounds.keys()) if b_rounds[r] > 0]


def median_ratio(ratios: list[float]) -> float:
    """The median of ratios, the two middle ones of an even count averaged geometrically, so that
    the median of ``b / a`` is exactly the inverse of that of ``a / b`` (an arithmetic mean is not)."""
    if min(ratios) <= 0:  # a zero rate has no logarithm
        return statistics.median(ratios)
    return math.exp(statistics.median(math.log(r) for r in ratios))


def paired_speedup(winner: Confirmed, defaults: Confirmed) -> float | None:
    """The winner over the defaults: the median of their per-round ratios (1.0 when the defaults won).

    Each round measured both seconds apart, so the ratio cancels the load they
    shared; the ratio of the two medians does not where the defaults stopped
    early or the load drifted. This is the figure the confirmation note's
    ``median +N%`` gives.
    """
    if winner is defaults:
        return 1.0
    ratios = paired_ratios(winner, defaults)
    return median_ratio(ratios) if ratios else None


def wins_needed(shared: int) -> int:
    """The paired rounds of ``shared`` that a setup must win to beat another (:func:`beats`): three quarters."""
    return math.ceil(0.75 * shared)


def beats(a: Confirmed, b: Confirmed, floor: float = NOISE_FLOOR) -> bool:
    """Whether ``a`` is faster than ``b`` beyond the noise (see the module docstring)."""
    ratios = paired_ratios(a, b)
    wins = sum(r > 1.0 for r in ratios)
    return bool(ratios) and wins >= wins_needed(len(ratios)) and median_ratio(ratios) >= 1.0 + floor


def equivalent(a: Confirmed, b: Confirmed, floor: float = NOISE_FLOOR) -> bool:
    """Whether ``a`` and ``b`` are within the noise floor of each other in every paired round."""
    ratios = paired_ratios(a, b)
    return bool(ratios) and all(abs(r - 1.0) <= floor for r in ratios)


#: Paired ratios further apart than this factor disagree: a load spike hit one round, and more rounds are needed.
SPREAD = 2.0


def compared_ratios(a: Confirmed, b: Confirmed) -> list[float]:
    """``a``'s positive paired ratios over ``b``, sorted, that :func:`disagree` compares: from three rounds on, the
    one farthest from the median is left out (a single stalled round among agreeing ones no longer moves the median)."""
    ratios = sorted(r for r in paired_ratios(a, b) if r > 0)
    if len(ratios) > 2:
        middle = median_ratio(ratios)
        ratios.remove(max(ratios, key=lambda r: abs(math.log(r / middle))))
    return ratios


def disagree(a: Confirmed, b: Confirmed) -> bool:
    """Whether ``a``'s paired ratios over ``b`` (:func:`compared_ratios`) lie more than :data:`SPREAD` times apart
    (1.7x in one round, 350x in the other: a median of two such rounds is a figure neither round measured)."""
    ratios = compared_ratios(a, b)
    return len(ratios) > 1 and ratios[-1] / ratios[0] > SPREAD


def leader(confirmed: Sequence[Confirmed]) -> Confirmed | None:
    """The candidate with the highest median, or None when none measured."""
    measured = [c for c in confirmed if c.median is not None]
    return max(measured, key=lambda c: c.median or 0.0) if measured else None


def paired_leader(confirmed: Sequence[Confirmed]) -> Confirmed | None:
    """The candidate whose paired median leads the most others (ratio above 1 over the rounds both measured), the
    highest median among those leading as many; None when none measured. Under a load that swings between rounds, a
    setup's own median can lead while it lost to the other round by round (a -29 % paired median); the paired
    ratios cancel the load their two runs shared, so they rank first."""
    measured = [c for c in confirmed if c.median is not None]

    def leads(c: Confirmed) -> int:
        return sum(bool(ratios := paired_ratios(c, o)) and median_ratio(ratios) > 1.0 for o in measured if o is not c)

    return max(measured, key=lambda c: (leads(c), c.median or 0.0)) if measured else None


#: Fewest paired rounds, all lost, that end a setup's rounds by :func:`behind_throughout` (3 of 3 by chance: 1 in 8).
BEHIND_ROUNDS = 3


def behind_throughout(top: Confirmed, other: Confirmed, left: int) -> bool:
    """Whether ``other`` was slower than ``top`` in every paired round, at least :data:`BEHIND_ROUNDS` of them and more
    than the ``left`` rounds still to run: even if it is faster in all of those, most of its paired ratios over ``top``
    stay below 1, and so does their median."""
    ratios = paired_ratios(other, top)
    return len(ratios) >= max(BEHIND_ROUNDS, left + 1) and max(ratios) < 1.0


def resolved(top: Confirmed, other: Confirmed) -> bool:
    """Whether more rounds of ``other`` could not change the choice: ``top`` beats it or equals it."""
    return beats(top, other) or equivalent(top, other)


@dataclass(frozen=True)
class Margin:
    """How clearly one candidate led another in the paired rounds.

    Attributes:
        won: Paired rounds the first was faster.
        rounds: Paired rounds compared.
        median_gain: Median paired ratio minus 1 (0.12 = 12 % faster).
    """

    won: int
    rounds: int
    median_gain: float

    def describe(self) -> str:
        """``won 3 of 3 paired rounds, median +12 %``."""
        return f"won {self.won} of {self.rounds} paired rounds, median {self.median_gain:+.0%}"


def margin(a: Confirmed, b: Confirmed) -> Margin | None:
    """``a``'s paired margin over ``b``; None when they share no round."""
    ratios = paired_ratios(a, b)
    if not ratios:
        return None
    return Margin(sum(r > 1.0 for r in ratios), len(ratios), median_ratio(ratios) - 1.0)
