"""Which confirmed finalist wins: the fastest, unless what it costs does not pay for itself.

The leader among the setups measured to the last round that no other beats in the paired rounds (ahead of most by
paired median: :func:`~autotune.tuner.noise.paired_leader`) must beat the PyTorch
defaults beyond the noise (:mod:`autotune.tuner.noise`), or a finalist that
does is returned; a compiled
one must beat the fastest eager finalist, one that changes the training math
the fastest that keeps it, one in reduced precision the fastest in float32,
and one whose effective batch lies further from the reference the fastest
nearer it. Otherwise the other is returned, and a note says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from autotune.rounds import Confirmed
from autotune.train_setup import TrainSetup
from autotune.tuner.noise import NOISE_FLOOR, beats, leader, margin, paired_leader, paired_ratios, wins_needed

#: A cost a setup may carry (a predicate) and, in words, the virtue of a setup without it.
Rule = tuple[Callable[[TrainSetup], bool], str]


def changes_math(setup: TrainSetup, reference: int) -> bool:
    """Whether ``setup`` trains other math than the reference recipe (reduced precision or another effective batch)."""
    return setup.amp != "off" or setup.effective_batch() != reference


def batch_change(setup: TrainSetup, reference: int) -> float:
    """How far ``setup``'s effective batch lies from the reference, as a factor's logarithm (0 when they are equal)."""
    return abs(math.log(setup.effective_batch() / reference))


def cost_rules(reference: int) -> list[Rule]:
    """The costs a winner must pay for beyond the noise, in the order :func:`choose_winner` weighs them (a later rule
    never brings back a cost an earlier one removed: the fp32 twin of a compiled leader is compiled too)."""
    return [
        (lambda s: s.compile != "off", "runs eagerly (no compilation at every start)"),
        (lambda s: changes_math(s, reference), "keeps the training math"),
        (lambda s: s.amp != "off", "trains in float32 (no autocast)"),
    ]


def never_preferred(setup: TrainSetup, over: TrainSetup) -> bool:
    """Whether no rule of :func:`choose_winner` can return ``setup`` instead of ``over`` when ``over`` leads within the
    noise: the same effective batch (the batch rule ties, and the math rule's reference cancels out), and every cost
    of :func:`cost_rules` that ``over`` carries ``setup`` carries too (the rules return a setup free of a cost the
    leader carries, never one with more)."""
    batch = setup.effective_batch()
    return batch == over.effective_batch() and not any(costly(over) and not costly(setup) for costly, _ in cost_rules(batch))


def choose_winner(
    measured: list[Confirmed], default_key: str, reference: int, excluded_by: str | None = None, diverged: bool = False
) -> tuple[Confirmed, list[str]]:
    """The confirmed winner and the notes that explain the choice.

    The fastest median wins only when it beats, beyond the noise
    (:func:`autotune.tuner.noise.beats`), the PyTorch defaults, the fastest
    finalist in float32 when it autocasts (each autocast finalist's fp32 twin is one,
    :func:`autotune.tuner.finalists.pick_candidates`), the fastest setup that
    keeps the training math and the fastest whose effective batch lies nearer
    the reference; otherwise the defaults (or that setup) are returned and
    the notes say why. Defaults that the user's
    ``--set`` excludes (``excluded_by``) are the baseline only: the fastest
    setup within it wins, unless none measured a throughput (``diverged``: others did, whose training math diverged,
    left out of ``measured``).
    """
    notes: list[str] = []
    defaults = next((c for c in measured if c.candidate.key == default_key), None)
    baseline = defaults  # the speedup's evidence, also where --set excludes the defaults from winning
    if excluded_by is not None and defaults is not None:
        within = leader([c for c in measured if c is not defaults])
        if within is None:
            why = "without diverging (the note on it names them)" if diverged else "(trials.csv says why)"
            notes.append(f"no setup within {excluded_by} measured a throughput {why}: the PyTorch defaults, which it excludes, are returned")
            return defaults, notes
        if not beats(within, defaults):
            notes.append(f"the fastest setup within {excluded_by} did not beat the PyTorch defaults (which it excludes) by the "
                         f"{NOISE_FLOOR:.0%} noise floor ({_margin_text(within, defaults)}); it is returned as you asked")
        measured = [c for c in measured if c is not defaults]
        defaults = None
    last = to_the_last_round(measured)
    # Among the setups measured as long that none beats in the paired rounds, the one ahead of most by paired median.
    top = paired_leader([c for c in last if not any(beats(other, c) for other in last)]) or leader(last)
    assert top is not None
    chosen = top
    if top is defaults:
        notes.append(("every other finalist trains math that diverged (the note on it names them): the PyTorch defaults are returned, "
                      "with no speedup to report" if diverged else
                      "the PyTorch defaults were the only setup the confirmation measured: no speedup to report") if len(measured) == 1 else
                     "nothing measurably faster than the PyTorch defaults was found: they led the confirmation")
    elif defaults is not None and not beats(top, defaults):
        clear = leader([c for c in measured if c is not defaults and beats(c, defaults) and not beats(top, c)])
        if clear is None:
            chosen = defaults
            notes.append(
                f"nothing measurably faster than the PyTorch defaults was found: the fastest finalist "
                f"({top.candidate.setup.describe()}, {top.median:.1f} samples/s) did not beat them by the "
                f"{NOISE_FLOOR:.0%} noise floor{_rounds_needed(top, defaults)} ({_margin_text(top, defaults)}); "
                "the defaults are kept"
            )
        else:
            chosen = clear
            notes.append(f"{clear.candidate.setup.describe()} beat the PyTorch defaults beyond the noise "
                         f"({_margin_text(clear, defaults)}) and is not beaten by the leader, "
                         f"{top.candidate.setup.describe()}, which did not ({_margin_text(top, defaults)}): it is returned")
    if chosen is not defaults:
        rules = cost_rules(reference)  # costs the fastest finalist may carry must pay for themselves beyond the noise
        chosen = _nearer_batch(measured, _rule_chain(measured, chosen, defaults, rules, notes), defaults, rules, reference, notes)
    rounds = max(_runs(c) for c in measured)
    # Among the setups that ran as many rounds first: one that stopped sooner was beaten there, and its median is of
    # other minutes (it could read as ahead of a winner that beat the setup that beat it).
    runner_up = leader([c for c in last if c is not chosen]) or leader([c for c in measured if c is not chosen])
    text = f"confirmation: {rounds} interleaved round{'s' if rounds != 1 else ''}"
    if runner_up is not None:
        named = " (the PyTorch defaults)" if runner_up is baseline else ""
        text += f"; against the runner-up {runner_up.candidate.setup.describe()}{named} the winner {_margin_text(chosen, runner_up)}"
    if baseline is not None and chosen is not baseline and runner_up is not baseline:  # the speedup's own evidence
        text += f"; against the PyTorch defaults it {_margin_text(chosen, baseline)}"
    notes.append(text)
    for who, confirmed in (("the winner", chosen), ("the PyTorch defaults", baseline)):
        if confirmed is not None and confirmed.failures and (who == "the winner" or confirmed is not chosen):
            runs = len(confirmed.failures)
            notes.append(f"{runs} of {runs + len(confirmed.values)} confirmation runs of {who} failed ({confirmed.failures[0]}): the "
                         "figures count the rounds it measured in")
    return chosen, notes


def _rule_chain(measured: list[Confirmed], chosen: Confirmed, defaults: Confirmed | None, rules: Sequence[Rule],
                notes: list[str]) -> Confirmed:
    """``chosen``, or what each rule in turn prefers to it (:func:`_prefer_within_noise`)."""
    for index, (costly, virtue) in enumerate(rules):
        chosen = _prefer_within_noise(measured, chosen, defaults, notes, costly, virtue, [rule for rule, _ in rules[:index]])
    return chosen


def _nearer_batch(measured: list[Confirmed], chosen: Confirmed, defaults: Confirmed | None, rules: Sequence[Rule],
                  reference: int, notes: list[str]) -> Confirmed:
    """Among setups that all change the batch, the smaller change (fewer samples left out of a short epoch, a smaller
    learning-rate change taken on a rule's word): the fastest finalist whose effective batch lies nearer the reference,
    when ``chosen`` does not beat it and it meets every rule ``chosen`` met (it beats the defaults, and the rules would
    keep it as it is: a cost it carries pays for itself)."""
    farther = batch_change(chosen.candidate.setup, reference)
    if not farther:
        return chosen
    setup = chosen.candidate.setup
    keeper = leader([c for c in measured if c is not defaults and batch_change(c.candidate.setup, reference) < farther
                     and not any(rule(c.candidate.setup) and not rule(setup) for rule, _ in rules) and not beats(chosen, c)
                     and (defaults is None or beats(c, defaults)) and _rule_chain(measured, c, defaults, rules, []) is c])
    if keeper is None:
        return chosen
    notes.append(f"{keeper.candidate.setup.describe()} keeps an effective batch nearer the reference and is within the noise of "
                 f"{setup.describe()} (against it, it {_margin_text(keeper, chosen)}): it is preferred")
    return keeper


def to_the_last_round(measured: Sequence[Confirmed]) -> list[Confirmed]:
    """The candidates measured in the most rounds, among whom the leader is: one that stopped sooner was beaten or
    equalled by the leader of its round, and its median is from other minutes (a load that grew since would make it lead)."""
    most = max(_runs(c) for c in measured)
    return [c for c in measured if _runs(c) == most]


def _runs(confirmed: Confirmed) -> int:
    """The rounds a candidate ran in, failed runs included."""
    return len(confirmed.values) + len(confirmed.failures)


def _prefer_within_noise(
    measured: list[Confirmed],
    chosen: Confirmed,
    defaults: Confirmed | None,
    notes: list[str],
    costly: Callable[[TrainSetup], bool],
    virtue: str,
    earlier: Sequence[Callable[[TrainSetup], bool]] = (),
) -> Confirmed:
    """The fastest finalist without ``costly``'s cost when ``chosen`` has it and does not beat that one.

    The defaults are not such an alternative: ``chosen`` already beat them; nor is a finalist that does not beat
    them too, or one with a cost of an ``earlier`` rule that ``chosen`` is free of.
    """
    if not costly(chosen.candidate.setup):
        return chosen
    setup = chosen.candidate.setup
    keeper = leader([c for c in measured if c is not chosen and not costly(c.candidate.setup)
                     and not any(rule(c.candidate.setup) and not rule(setup) for rule in earlier)
                     and c is not defaults and (defaults is None or beats(c, defaults))])
    if keeper is None or beats(chosen, keeper):
        return chosen
    notes.append(
        f"{keeper.candidate.setup.describe()} {virtue} and is within the noise of "
        f"{chosen.candidate.setup.describe()} (against it, it {_margin_text(keeper, chosen)}): it is preferred"
    )
    return keeper


def _margin_text(a: Confirmed, b: Confirmed) -> str:
    found = margin(a, b)
    return found.describe() if found is not None else "no shared round"


def _rounds_needed(a: Confirmed, b: Confirmed) -> str:
    """`` in 3 of 4 paired rounds``: how many of the rounds ``a`` and ``b`` shared it must win to beat ``b``
    (:func:`beats`); "" where they shared none."""
    shared = len(paired_ratios(a, b))
    return f" in {wins_needed(shared)} of {shared} paired rounds" if shared else ""  # none shared: the margin says so
