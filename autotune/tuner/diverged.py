"""Setups whose training math diverged in some trial: never a finalist, and best.json says why.

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

from autotune.records import TrialRecord, Workload
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


def diverged_math(records: Sequence[TrialRecord]) -> set[tuple[int, int, str, bool]]:
    """The training math of every trial that diverged."""
    return {math_of(r.setup) for r in records if r.result.status == "diverged" and r.ran}


def diverged_note(records: Sequence[TrialRecord], workload: Workload) -> str | None:
    """best.json's note when trials diverged: which, and that no setup of their math was confirmed; None when none did."""
    diverged = [r for r in records if r.result.status == "diverged" and r.ran]  # a repeat of one is not a second
    if not diverged:
        return None
    named = ", ".join(f"#{r.number} {r.setup.describe()}" for r in diverged[:3]) + (", ..." if len(diverged) > 3 else "")
    return (f"{counted(len(diverged), 'trial')} diverged (the loss or the weights became NaN or infinite: {named}); no "
            "setup with the same batch, accumulation and precision was confirmed, as a longer run of it would likely diverge "
            f"too; check the learning rate and the model's numerics{HALF_ADAMW if half_adamw(workload) else ''}")
