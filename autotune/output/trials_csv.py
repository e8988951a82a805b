"""``trials.csv``: every finished trial of a study, one row each."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from autotune.files import atomic_write_text
from autotune.records import TrialRecord
from autotune.train_setup import KNOBS

#: The result's fields, by column name; the thread count a trial ran with is ``threads_used``
#: (``num_threads`` is the knob's column: empty when the setup leaves it to torch).
RESULT_COLUMNS = (
    "status",
    "samples_per_s",
    "samples_per_s_spread",
    "step_time_s",
    "data_wait_fraction",
    "peak_memory_bytes",
    "warmup_s",
    "measured_s",
    "compile_s",
    "threads_used",
    "other_cores",
    "loader_samples_per_s",
)
_FIELDS = {"threads_used": "num_threads"}


def write_trials_csv(path: Path, records: list[TrialRecord], world_size: int = 1) -> None:
    """All finished trials, one row each, atomically (``effective_batch`` counts every one of ``world_size`` ranks)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["trial", "role", *KNOBS, *RESULT_COLUMNS, "effective_batch", "reused_from", "error"])
    for r in sorted(records, key=lambda rec: rec.number):
        knobs = [getattr(r.setup, k) for k in KNOBS]
        results = [getattr(r.result, _FIELDS.get(c, c)) for c in RESULT_COLUMNS]
        writer.writerow(
            [r.number, r.role, *knobs, *results, r.setup.effective_batch(world_size), r.reused_from, as_text(r.result.error or "")]
        )
    atomic_write_text(path, buffer.getvalue())


#: How a cell that a spreadsheet would evaluate as a formula begins (OWASP's list for CSV injection).
_FORMULA = ("=", "+", "-", "@", "\t", "\r")


def as_text(cell: str) -> str:
    """A text cell that Excel or LibreOffice shows as text: an error message of the user's code that begins like a
    formula (``=HYPERLINK(...)``, which a spreadsheet made a live link) gets a leading ``'``, which they read as "text"."""
    return f"'{cell}" if cell.startswith(_FORMULA) else cell
