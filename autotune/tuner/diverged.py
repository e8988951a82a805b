"""Setups whose training math diverged in some trial or confirmation run: never a finalist, and best.json says why.

A trial ends ``diverged`` when the loss or the weights become NaN or
infinite. Another setup that trains the same math (the same micro-batch,
accumulation, precision and TF32) differs only in how fast it runs, so its
finishing trial was luck over a few seconds: a longer run would meet the same
NaN (a float16 model under the default AdamW diverged at batch 32 in the
memory pre-pass and in a trial at batch 64, yet a loader twin of that trial
won at 6.97x, and its train.py stopped at step 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.records import TrialRecord, Workload
from autotune.rounds import Confirmed
from autotune.train_setup import TrainSetup
from autotune.units import counted

#: Said of a model with float16 parameters trained by the default AdamW that diverged.
HALF_ADAMW = ("; the default AdamW's eps (1e-8) is 0 in float16, so a step where a gradient's square underflows divides by "
              "zero: keep the parameters in float32 (autocast, which the search tries, computes in 16 bits)")


def half_adamw(workload: Workload) -> bool:
    """Whether ``workload`` trains float16 parameters with autotune's default AdamW (whose eps is 0 in float16)."""
    return "float16" in (workload.precision or "").split("+") and not workload.own_optimizer


def math_of(setup: TrainSetup) -> tuple[int, int, str, bool]:
    """What a setup changes of the training's numbers: micro-batch, accumulation, precision, TF32."""
    return setup.batch_size, setup.accumulation_steps, setup.amp, setup.tf32


#: A reduced precision that diverged at this many batches (micro-batch and accumulation), while float32 never did, is
#: unstable at any batch: what diverged is its numbers, not a batch's (one rare sample met by chance in a few seconds).
PRECISION_AFTER = 2


@dataclass(frozen=True)
class Unstable:
    """The training math that diverged: exact (micro-batch, accumulation, precision, TF32) and whole reduced precisions
    (:data:`PRECISION_AFTER`). A setup is ``in`` it when its math, or its precision, is."""

    maths: frozenset[tuple[int, int, str, bool]] = frozenset()
    precisions: frozenset[str] = frozenset()

    def __contains__(self, setup: object) -> bool:
        return isinstance(setup, TrainSetup) and (math_of(setup) in self.maths or setup.amp in self.precisions)

    def exact(self) -> Unstable:
        """Only the exact maths: where a ``--set`` leaves float32 out (``--set amp=bf16``), the other batches of an
        unstable precision stay, and :func:`diverged_note` names it as kept by that ``--set``."""
        return Unstable(self.maths)


def diverged_in_rounds(confirmed: Sequence[Confirmed]) -> list[Confirmed]:
    """The confirmation's candidates with a run that diverged."""
    return [c for c in confirmed if any(f.startswith("diverged") for f in c.failures)]


def diverged_math(records: Sequence[TrialRecord], confirmed: Sequence[Confirmed] = ()) -> Unstable:
    """The training math of every trial, and confirmation run, that diverged."""
    maths = frozenset({math_of(r.setup) for r in records if r.result.status == "diverged" and r.ran}
                      | {math_of(c.candidate.setup) for c in diverged_in_rounds(confirmed)})
    precisions = frozenset(amp for amp in {m[2] for m in maths} - {"off"} if not any(m[2] == "off" for m in maths)
                           and len({m[:2] for m in maths if m[2] == amp}) >= PRECISION_AFTER)
    return Unstable(maths, precisions)


def diverged_note(records: Sequence[TrialRecord], workload: Workload, confirmed: Sequence[Confirmed] = (),
                  unstable: Unstable | None = None, kept_by: str | None = None) -> str | None:
    """best.json's note when trials or confirmation runs diverged: which, and that no setup of their math was
    confirmed, nor one of a precision ``unstable`` holds whole, unless the ``--set`` ``kept_by`` names keeps it;
    None when none diverged."""
    diverged = [f"#{r.number} {r.setup.describe()}" for r in records if r.result.status == "diverged" and r.ran]  # a repeat of one is not a second
    rounds = list(dict.fromkeys(c.candidate.label for c in diverged_in_rounds(confirmed)))  # a candidate in both lists once
    if not diverged and not rounds:
        return None
    named = ", ".join(diverged[:3]) + (", ..." if len(diverged) > 3 else "")
    said = [f"{counted(len(diverged), 'trial')} diverged (the loss or the weights became NaN or infinite: {named})"] if diverged else []
    said += [f"{'a confirmation run' if len(rounds) == 1 else 'confirmation runs'} of {' and '.join(rounds)} diverged"] if rounds else []
    whole = ""
    if unstable is not None and unstable.precisions:
        precisions = sorted(unstable.precisions)
        which = f"{' and '.join(precisions)} diverged at several batches and float32 at none"
        whole = (f"; {which}: {kept_by} keeps it, so its other batches stayed, though a longer run of them may diverge too" if kept_by
                 else f"; {which}, so no {' or '.join(precisions)} setup was either")
    return (f"{' and '.join(said)}; no setup with the same batch, accumulation and precision was confirmed, as a longer run of it "
            f"would likely diverge too{whole}; check the learning rate and the model's numerics{HALF_ADAMW if half_adamw(workload) else ''}")
