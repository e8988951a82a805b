"""Calibration runs kept one by one, so an interrupted calibration resumes where it stopped.

The calibration is a fixed sequence of short isolated runs (memory pre-pass,
compute-only and loader-only ceilings) whose next run depends only on the
results so far. :class:`KeptRuns` wraps the trial runner: every result that is
a measurement (a throughput, or running out of memory at a batch) is stored
in the study the moment it returns, and a rerun of the same command gets the
stored results back, in the same order, without running them again. Errors
are not kept: the code may have been fixed since (a rerun runs them again).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner import TrialRunner, WindowCallback
from autotune.train_setup import TrainSetup

#: Statuses a calibration run keeps: measurements a rerun would repeat (an ``error`` may be fixed meanwhile).
KEPT_STATUSES = ("ok", "oom")

#: A memory budget that moved by at most this share since a run was kept still reuses it (the available RAM it
#: derives from moves a little with every other process); beyond it (another ``--max-memory``), the run runs again.
BUDGET_DRIFT = 0.1


@dataclass(frozen=True)
class KeptRun:
    """One stored calibration run: what it measured and the memory budget it ran under."""

    result: TrialResult
    budget: int | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {"result": self.result.to_dict(), "budget": self.budget}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KeptRun:
        """Inverse of :meth:`to_dict`."""
        return cls(TrialResult.from_dict(data["result"]), data.get("budget"))

    def fits(self, budget: int | None) -> bool:
        """Whether the run would end the same under ``budget``: any run within :data:`BUDGET_DRIFT` of its own budget;
        beyond, a run that held (``ok``) and peaked at most ``1 - BUDGET_DRIFT`` of ``budget`` (the available RAM the
        budget derives from moves with every other process: a run far below either budget measures the same), and a run
        over its own budget (``oom``) under a smaller one. Without budgets, only a run without one."""
        if self.budget is None or budget is None:
            return self.budget == budget
        if abs(self.budget - budget) <= BUDGET_DRIFT * budget:
            return True
        if self.result.status == "oom":
            return budget < self.budget
        peak = self.result.peak_memory_bytes
        return self.result.status == "ok" and peak is not None and peak <= (1 - BUDGET_DRIFT) * budget


def run_key(setup: TrainSetup, options: TrialOptions) -> str:
    """What identifies a calibration run: its setup and how it measured (mode, length, windows, ranks), the memory
    budget aside (:meth:`KeptRun.fits` compares it)."""
    return json.dumps({"setup": setup.to_dict(), "options": asdict(replace(options, max_memory_bytes=None))}, sort_keys=True, default=str)


class KeptRuns:
    """A trial runner that replays stored results of the same runs first and stores every new measurement.

    Args:
        runner: The runner that measures.
        stored: Earlier runs per :func:`run_key`, in the order they were measured.
        store: Called with every run kept so far, per key, after each new kept measurement.
    """

    def __init__(self, runner: TrialRunner, stored: dict[str, list[KeptRun]], store: Callable[[dict[str, list[KeptRun]]], None]) -> None:
        self.runner = runner
        self.stored = stored
        self.store = store
        self.calls: Counter[str] = Counter()
        self.reused = 0
        self.earlier = self.measured  # kept by earlier runs of the command

    @property
    def measured(self) -> int:
        """Runs kept so far: those stored by earlier runs of the command and this one's."""
        return sum(len(runs) for runs in self.stored.values())

    @property
    def ran(self) -> int:
        """Runs this command measured (calls not answered by a kept run)."""
        return sum(self.calls.values()) - self.reused

    def opening(self) -> str:
        """What the calibration's first line adds when an interrupted command kept runs (else nothing)."""
        return f" (runs measured before an interruption and kept: {self.earlier})" if self.earlier else ""

    def summary(self) -> str | None:
        """How the runs kept by an earlier, interrupted command were used; None when there were none."""
        if not self.earlier:
            return None
        why = "the memory budget moved too far for them to stand, or they were not asked for this time"
        if not self.reused:
            return (f"calibration: none of the {self.earlier} runs kept from before the interruption could be reused ({why}), "
                    f"measured {self.ran} now")
        rest = self.earlier - self.reused
        other = f" (not the other {rest}: {why})" if rest else ""
        return f"calibration: reused {self.reused} of the {self.earlier} runs kept from before the interruption{other}, measured {self.ran} now"

    def __call__(
        self,
        setup: TrainSetup,
        workload: Workload,
        options: TrialOptions | None = None,
        *,
        on_window: WindowCallback | None = None,
    ) -> TrialResult:
        """The stored result of the n-th call of this run, else a new measurement (stored when it is one)."""
        options = options or TrialOptions()
        key = run_key(setup, options)
        index = self.calls[key]
        self.calls[key] += 1
        earlier = self.stored.get(key, [])
        if index < len(earlier) and earlier[index].fits(options.max_memory_bytes):
            self.reused += 1
            return earlier[index].result
        result = self.runner(setup, workload, options, on_window=on_window)
        if result.status in KEPT_STATUSES:
            self.stored[key] = [*earlier[:index], KeptRun(result, options.max_memory_bytes)]  # a run measured again replaces
            self.store(self.stored)
        return result
