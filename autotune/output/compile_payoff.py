"""When ``torch.compile`` pays off: compile time against the step time it saves.

A compiled trial's first step carries the compilation (``compile_s``). When
the same setup was also measured eagerly, the break-even is
``compile_s / (eager step time - compiled step time)`` optimizer steps: a run
shorter than that is faster without compiling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.output.sections import Section, Table
from autotune.records import TrialRecord
from autotune.train_setup import TrainSetup


@dataclass(frozen=True)
class Payoff:
    """A compiled trial beside the same setup run eagerly.

    Attributes:
        setup: The compiled setup.
        compile_s: Its first step, compilation included.
        eager_step_s: Step time of the same setup eager (``None``: not measured).
        compiled_step_s: Step time compiled.
        break_even_steps: Steps after which compiling has paid off; ``None``
            when it saves no time per step (or nothing to compare with).
    """

    setup: TrainSetup
    compile_s: float
    eager_step_s: float | None
    compiled_step_s: float
    break_even_steps: int | None


def payoffs(records: Sequence[TrialRecord]) -> list[Payoff]:
    """Every ok compiled trial with its break-even against the same setup eager (when measured)."""
    eager: dict[str, float] = {}
    for r in records:
        if r.result.ok and r.result.step_time_s and r.setup.compile == "off":
            eager.setdefault(r.setup.to_json(), r.result.step_time_s)
    found = []
    for r in records:
        if not (r.result.ok and r.result.step_time_s and r.result.compile_s is not None and r.setup.compile != "off"):
            continue
        base = eager.get(r.setup.replace(compile="off").to_json())
        saved = base - r.result.step_time_s if base is not None else 0.0
        steps = max(1, round(r.result.compile_s / saved)) if saved > 0 else None
        found.append(Payoff(r.setup, r.result.compile_s, base, r.result.step_time_s, steps))
    return found


def payoff_note(records: Sequence[TrialRecord], winner: TrainSetup) -> str | None:
    """The note for best.json when the winner compiles: what compiling costs and when it pays off."""
    if winner.compile == "off":
        return None
    found = payoffs(records)
    mine = [p for p in found if p.setup == winner]
    kin = [p for p in found if p.setup.compile == winner.compile]
    if not mine and kin:  # a float32 twin of a compiled finalist ran in the confirmation only: its sibling's cost is the measure
        p = kin[0]
        paid = f", where it paid off after {p.break_even_steps} steps" if p.break_even_steps else ""
        return (f"compile={winner.compile}: the first step compiles the model; the winner ran no trial of its own (its "
                f"float32 twin was measured in the confirmation), and compiling took {p.compile_s:.0f} s in the first step of "
                f"{p.setup.describe()}'s trial{paid}, the nearest measure of its cost")
    if not mine:
        return f"compile={winner.compile}: the first step compiles the model (warm-up the measurement excludes)"
    p = mine[0]
    if p.break_even_steps:
        when = f"it pays off after {p.break_even_steps} steps"
    elif p.eager_step_s is not None:
        when = (
            f"its search trial was not faster per step than the same setup eager "
            f"({p.compiled_step_s * 1000:.0f} ms against {p.eager_step_s * 1000:.0f} ms)"
        )
    else:
        when = "the same setup eager was not measured"
    return f"compile={winner.compile}: compiling took {p.compile_s:.0f} s in the first step; {when}"


def compile_section(records: Sequence[TrialRecord]) -> Section | None:
    """The report's compile table; ``None`` when no trial compiled."""
    tried = [r for r in records if r.setup.compile != "off"]
    if not tried:
        return None
    ok = {id(p.setup): p for p in payoffs(records)}
    rows = []
    for p in ok.values():
        rows.append((
            p.setup.describe(), f"{p.compile_s:.1f}",
            f"{p.eager_step_s * 1000:.1f}" if p.eager_step_s else "-", f"{p.compiled_step_s * 1000:.1f}",
            str(p.break_even_steps) if p.break_even_steps else "never" if p.eager_step_s else "-",
        ))
    for r in tried:
        if not r.result.ok:
            rows.append((r.setup.describe(), "-", "-", "-", f"{r.result.status}: {r.result.error or ''}"[:200]))
    return Section(
        "compile", "torch.compile on the leading setup",
        "Compiling is warm-up: the measurement excludes it, and it is paid again at every start of training. "
        "Break-even is compile seconds over the step time saved against the same setup run eagerly; "
        "a training run shorter than that many steps is faster without compiling.",
        None,
        (Table("compiled trials", ("setup", "compile s", "eager step ms", "compiled step ms", "break-even steps"), tuple(rows)),),
    )
