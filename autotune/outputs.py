"""Files a search writes besides best.json: trials.csv, and the checks that
the output directory is usable before anything is written."""

from __future__ import annotations

import csv
import io
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.config import KNOBS, TrainSetup
from autotune.errors import StorageError
from autotune.files import atomic_write_text
from autotune.trial import TrialResult

RESULT_COLUMNS = (
    "status",
    "samples_per_s",
    "samples_per_s_spread",
    "step_time_s",
    "data_wait_fraction",
    "peak_memory_bytes",
    "warmup_s",
    "measured_s",
)


@dataclass(frozen=True)
class TrialRecord:
    """One finished trial of a study."""

    number: int
    role: str
    setup: TrainSetup
    result: TrialResult
    reused_from: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return {
            "number": self.number,
            "role": self.role,
            "setup": self.setup.to_dict(),
            "result": self.result.to_dict(),
            "reused_from": self.reused_from,
        }


def write_trials_csv(path: Path, records: list[TrialRecord]) -> None:
    """All finished trials, one row each, atomically."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["trial", "role", *KNOBS, *RESULT_COLUMNS, "effective_batch", "reused_from", "error"])
    for r in sorted(records, key=lambda rec: rec.number):
        knobs = [getattr(r.setup, k) for k in KNOBS]
        results = [getattr(r.result, c) for c in RESULT_COLUMNS]
        writer.writerow(
            [r.number, r.role, *knobs, *results, r.setup.effective_batch(), r.reused_from, r.result.error or ""]
        )
    atomic_write_text(path, buffer.getvalue())


def _can_write(directory: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def check_writable(out: Path) -> None:
    """Fail early (leaving nothing behind) when ``out`` cannot be created or written.

    Raises:
        StorageError: ``out`` is a file, or it or its nearest existing parent
            is not a writable directory.
    """
    if out.exists():
        if not out.is_dir():
            raise StorageError(f"--out {out} exists and is not a directory")
        if not _can_write(out):
            raise StorageError(f"--out {out} is not writable")
        return
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise StorageError(f"--out {out} cannot be created: {parent} is not a directory")
    if not _can_write(parent):
        raise StorageError(f"--out {out} cannot be created: {parent} is not writable")
