"""best.json: the winner of a search, as written to the output directory.

``best.json`` is the contract between ``autotune search`` and its consumers
(``autotune emit``, ``autotune.load_setup``, the user's own tools). Writes are
atomic: a reader never sees a half-written file.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, SetupError
from autotune.files import atomic_write_text, read_json
from autotune.records import Workload
from autotune.train_setup import TrainSetup

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Best:
    """The winning setup of a search and the evidence for it.

    Attributes:
        setup: The winning TrainSetup.
        workload: What was trained (model, image size, data, device).
        samples_per_s: The winner's confirmed median throughput.
        samples_per_s_spread: Range (max - min) of the confirmation rounds.
        defaults_samples_per_s: PyTorch defaults, measured in the same rounds.
        speedup: ``samples_per_s / defaults_samples_per_s`` (None if unknown).
        peak_memory_bytes: Peak memory of the winner's trial.
        effective_batch: micro-batch x accumulation (single process).
        reference_batch: The effective batch the learning rate refers to.
        lr: Learning rate at ``reference_batch`` scaled linearly to
            ``effective_batch`` (what the emitted script uses).
        hardware: The probe summary (``probes`` JSON).
        versions: Software versions.
        command: The command line that produced the result.
        created: ISO-8601 time of writing.
        notes: Things the user must know (changed math, synthetic data, ...).
    """

    setup: TrainSetup
    workload: Workload
    samples_per_s: float
    samples_per_s_spread: float
    defaults_samples_per_s: float | None
    speedup: float | None
    peak_memory_bytes: int | None
    effective_batch: int
    reference_batch: int
    lr: float
    hardware: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    command: str = ""
    created: str = ""
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``schema`` first)."""
        data = asdict(self)
        data["setup"] = self.setup.to_dict()
        data["workload"] = self.workload.to_dict()
        data["notes"] = list(self.notes)
        return {"schema": SCHEMA_VERSION, **data}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Best:
        """Inverse of :meth:`to_dict`.

        Raises:
            AutotuneError: Missing or invalid fields.
        """
        if not isinstance(data, dict):
            raise AutotuneError("best.json must hold a JSON object")
        data = dict(data)
        data.pop("schema", None)
        try:
            data["setup"] = TrainSetup.from_dict(data["setup"])
            data["workload"] = Workload.from_dict(data["workload"])
            data["notes"] = tuple(data.get("notes", ()))
            return cls(**data)
        except KeyError as exc:
            raise AutotuneError(f"best.json lacks the field {exc.args[0]!r}") from None
        except (TypeError, SetupError, AutotuneError) as exc:
            raise AutotuneError(f"best.json is invalid: {exc}") from None


def write_best(path: str | Path, best: Best) -> None:
    """Write ``best.json`` atomically."""
    atomic_write_text(path, json.dumps(best.to_dict(), indent=2) + "\n")


def read_best(path: str | Path) -> Best:
    """Read ``best.json``.

    Raises:
        AutotuneError: The file is missing, unreadable, not JSON or invalid.
    """
    file = Path(path)
    if file.is_dir():
        file = file / "best.json"
    data = read_json(file, AutotuneError, " (run `autotune search` first)")
    try:
        return Best.from_dict(data)
    except AutotuneError as exc:
        raise AutotuneError(f"{file}: {exc}") from None
