"""Where the wall time of a search went: :class:`TimeSpent`.

A plain record beside :mod:`autotune.records`: the search accounts every
trial process to its part (``autotune.tuner.config.Timing``), stores each
run's in the study, and report.html draws their sum over the resumed runs and
the workers of a shared study.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from autotune.records import TrialRecord, TrialResult

#: The step of a search a trial process belongs to.
Phase = Literal["calibration", "search", "confirmation", "ceilings"]


@dataclass(frozen=True)
class TimeSpent:
    """Where the wall time of a search went, in seconds (every run of a resumed study).

    Attributes:
        wall_s: Wall time of the search runs.
        calibration_s: Trial processes of the memory pre-pass and the calibration ceilings.
        warmup_s: Start-up and warm-up of the search trials measured in full.
        measured_s: Measured windows of the search trials measured in full.
        launch_s: The rest of those trials' processes: fork, first import, teardown.
        pruned_s: Trial processes the pruner stopped early.
        infeasible_s: Trial processes that ended oom, timeout, error or diverged.
        interrupted_s: Search trial processes a stop of the search cut short (Ctrl-C, a signal).
        confirmation_s: Trial processes of the interleaved re-measurement.
        ceilings_s: Trial processes measuring the winner's own ceilings after it.
        waiting_s: A worker of a shared study waiting for the others (their calibration, confirmation or last trials).
        runs: Trial runs (a finalist held between confirmation rounds counts each round; its process started once).
        searches: Runs of the search summed here (resumed runs, the workers of a shared study; a study of an older
            version stored its runs as one).
    """

    wall_s: float = 0.0
    calibration_s: float = 0.0
    warmup_s: float = 0.0
    measured_s: float = 0.0
    launch_s: float = 0.0
    pruned_s: float = 0.0
    infeasible_s: float = 0.0
    interrupted_s: float = 0.0
    confirmation_s: float = 0.0
    ceilings_s: float = 0.0
    waiting_s: float = 0.0
    runs: int = 0
    searches: int = 1

    #: The parts of the wall time, in the order a search spends them, with their labels.
    PARTS = (("calibration_s", "calibration"), ("warmup_s", "warm-ups"), ("measured_s", "measured windows"),
             ("launch_s", "trial start/stop"), ("pruned_s", "pruned trials"), ("infeasible_s", "infeasible trials"),
             ("interrupted_s", "trials cut short by a stop"),
             ("confirmation_s", "confirmation"), ("ceilings_s", "winner's ceilings"), ("waiting_s", "waiting for other workers"))

    @property
    def other_s(self) -> float:
        """Wall time outside trial processes: sampler, storage, files, the report."""
        return max(0.0, self.wall_s - sum(getattr(self, name) for name, _ in self.PARTS))

    def breakdown(self) -> list[tuple[str, float]]:
        """(label, seconds) per part, then the rest of the wall time when it is known."""
        parts = [(label, float(getattr(self, name))) for name, label in self.PARTS]
        return parts + [("other (sampler, storage, files)", self.other_s)] if self.wall_s else parts

    def with_trial(self, phase: Phase, result: TrialResult, wall_s: float) -> TimeSpent:
        """This record plus one trial process of ``phase`` that took ``wall_s`` seconds."""
        add: dict[str, float] = {}
        if phase == "calibration":
            add["calibration_s"] = wall_s
        elif phase in ("confirmation", "ceilings"):
            add[f"{phase}_s"] = wall_s
        elif result.status == "interrupted":
            add["interrupted_s"] = wall_s
        elif result.status == "pruned":
            add["pruned_s"] = wall_s
        elif not result.ok:
            add["infeasible_s"] = wall_s
        else:
            warm, measured = result.warmup_s or 0.0, result.measured_s or 0.0
            add = {"warmup_s": warm, "measured_s": measured, "launch_s": max(0.0, wall_s - warm - measured)}
        changes = {name: getattr(self, name) + value for name, value in add.items()}
        return replace(self, runs=self.runs + 1, **changes)

    def __add__(self, other: TimeSpent) -> TimeSpent:
        return TimeSpent(**{k: v + getattr(other, k) for k, v in asdict(self).items()})

    @classmethod
    def from_records(cls, records: list[TrialRecord]) -> TimeSpent:
        """What the records alone tell: search trials' warm-up and measured time, no wall time."""
        spent = cls()
        for r in records:
            if r.reused_from is None:
                spent = spent.with_trial("search", r.result, (r.result.warmup_s or 0.0) + (r.result.measured_s or 0.0))
        return spent

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TimeSpent:
        """Inverse of ``asdict`` (unknown keys are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
