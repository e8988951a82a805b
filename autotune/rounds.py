"""The confirmation's records: a finalist to re-measure (:class:`Candidate`), its rounds (:class:`Confirmed`) and the
winner's ceilings (:class:`Ceilings`). The study stores the rounds as JSON user attributes; reports are built from these."""

from __future__ import annotations

import itertools
import statistics
from dataclasses import asdict, dataclass
from typing import Any

from autotune.train_setup import TrainSetup

#: One candidate's confirmation runs as stored: the samples/s of the runs that measured, the failed runs' lines, and
#: the rounds (0-based) those failed in. A candidate's k-th run is its k-th round: the rounds are interleaved, and a
#: candidate once left out is never measured again.
Runs = tuple[list[float], list[str], list[int]]


@dataclass(frozen=True)
class Candidate:
    """A setup to confirm, with the roles it played in the search.

    Attributes:
        key: The setup's JSON, the key its rounds are stored under.
        setup: The setup.
        label: Its name in the console and the report (the fastest trial of it, or ``(a finalist in fp32)``).
        twin: A finalist's float32 twin that no trial ran (nothing in the search speaks for it).
        no_twin: Why this finalist in reduced precision has no float32 twin beside it (the calibration's evidence), if so.
        timed_out: The PyTorch defaults whose trial timed out: a run of them that fails too ends their rounds.
    """

    key: str
    setup: TrainSetup
    label: str
    twin: bool = False
    no_twin: str | None = None
    timed_out: bool = False


#: :attr:`Confirmed.stopped` of a finalist whose training math diverged in a confirmation run (its own or a sibling's).
DIVERGED_STOP = "a confirmation run of its training math (batch, accumulation, precision) diverged: it cannot win"


@dataclass(frozen=True)
class Confirmed:
    """A candidate's confirmation measurements.

    Attributes:
        candidate: What was measured.
        values: Samples/s of the runs that measured, in round order.
        failures: The failed runs' lines.
        peak_bytes: The highest peak memory of its runs in this process (not stored: None after a resume).
        data_wait: The highest share of a run it waited on the loader, in this process (not stored either).
        failed_rounds: The rounds (0-based) the failures happened in; fewer than ``failures`` when not known (stored
            by an older version), and then :meth:`by_round` cannot place its measurements.
        stopped: Why it cannot win whatever its figures, and is measured no more: a confirmation run of its training
            math diverged (:data:`DIVERGED_STOP`); None otherwise (not stored: derived from the stored failures).
    """

    candidate: Candidate
    values: tuple[float, ...]
    failures: tuple[str, ...]
    peak_bytes: int | None = None
    data_wait: float | None = None
    failed_rounds: tuple[int, ...] = ()
    stopped: str | None = None

    @property
    def median(self) -> float | None:
        """Median of the successful measurements."""
        return float(statistics.median(self.values)) if self.values else None

    def by_round(self) -> dict[int, float] | None:
        """Each measurement by the round (0-based) it ran in; None when the rounds its failures took are unknown."""
        if len(self.failed_rounds) != len(self.failures):
            return None
        failed = set(self.failed_rounds)
        return dict(zip((r for r in itertools.count() if r not in failed), self.values, strict=False))

    @property
    def spread(self) -> float | None:
        """Range (max - min) of the successful measurements."""
        return float(max(self.values) - min(self.values)) if self.values else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (the ``confirmation`` entries of ``--json``)."""
        return {"setup": self.candidate.setup.to_dict(), "label": self.candidate.label, "samples_per_s": self.median,
                "samples_per_s_spread": self.spread, "measurements": list(self.values), "failures": list(self.failures),
                "stopped": self.stopped}

    def remarks(self) -> str:
        """Its failures and why it stopped early, for a table's column."""
        return "; ".join((*self.failures, *((f"stopped: {self.stopped}",) if self.stopped else ())))


@dataclass(frozen=True)
class Ceilings:
    """The winner's setup computed alone and loaded alone, one run each right after its confirmation, and its real loop.

    Attributes:
        together: Samples/s of the real loop: the winner's median in the confirmation rounds.
        compute: Samples/s with one batch already on the device (no loader).
        loader: Samples/s of the DataLoader alone (no model).
        data_wait_fraction: Share of the real loop's time blocked on the loader (in the winner's trial).
    """

    together: float | None
    compute: float | None
    loader: float | None
    data_wait_fraction: float | None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return asdict(self)
