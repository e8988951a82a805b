"""What the Python API's :func:`~autotune.api.search` and :func:`~autotune.api.trial` return."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from autotune.errors import PIN, as_called
from autotune.records import TrialResult, Workload
from autotune.train_setup import TrainSetup
from autotune.tuner.config import SearchOutcome

__all__ = ["SearchResult", "TrialOutcome", "in_api_words"]

#: ``autotune search``'s flags that its notes name, as :func:`autotune.search`'s keywords.
_KEYWORDS = {"effective-batch": "effective_batch", "set": "constraints", "lr": "lr", "trials": "trials", "data": "data",
             "image-size": "image_size", "trial-seconds": "trial_seconds", "confirm-top": "confirm_top",
             "confirm-rounds": "confirm_rounds", "max-memory": "max_memory", "nproc-per-node": "nproc_per_node",
             "devices": "devices", "device": "device", "storage": "storage", "study": "study", "out": "out",
             "synthetic-images": "synthetic_images", "seed": "seed", "timeout": "timeout_s"}
#: A flag and its value: a number, an ``=`` pin (``--set``), an upper-case placeholder (DIR) or a path or URL; a flag
#: the prose names with an ordinary word after it (``a search without --devices measures ...``) is left as written.
_FLAG = re.compile(r"--(" + "|".join(sorted(map(re.escape, _KEYWORDS), key=len, reverse=True)) + r")"
                   r" ((?:[-+]?\d[\w.+-]*|" + PIN + r"|[A-Z][A-Z_]+|[\w.-]*[/:][^\s;,()]*?))(?=[\s;,():]|\.?$|\.\s)")


def in_api_words(note: str) -> str:
    """A note of the search (the CLI's words) with its flags as the Python API's keywords: ``pass --effective-batch 32``
    as ``pass effective_batch=32``, ``--set batch_size=64`` as ``constraints=["batch_size=64"]``, "rerun the same
    command" as "rerun the same call"."""
    def keyword(match: re.Match[str]) -> str:
        name, value = _KEYWORDS[match[1]], match[2]
        if name == "constraints":  # a pin (batch_size=64)
            return f'constraints=["{value}"]'
        plain = value[:1].isdigit() or value[:1] in "+-" or value.isupper()  # a number (1e-4 too), or a placeholder such as DIR
        return f"{name}={value}" if plain else f'{name}="{value}"'

    return as_called(_FLAG.sub(keyword, note))


@dataclass(frozen=True)
class SearchResult:
    """What :func:`search` found.

    Attributes:
        setup: The winner (confirmed unless interrupted; with nothing measured, search raises).
        samples_per_s: Its median throughput in the confirmation rounds.
        speedup: Over the defaults: the median of the per-round ratios of the rounds both ran (``None``: nothing compared
            with them: they were the only setup the confirmation measured, their trial failed, or the search stopped
            before it; ``notes`` says which).
        best_json: The ``best.json`` written (an absolute path).
        train_py: The emitted ``train.py`` (an absolute path).
        verdict: Which side limits training, in words (flags named as this API's keywords, as in ``notes``).
        outcome: Everything else: every trial, calibration, confirmation.
        notes: What qualifies the figures (the CLI's ``note:`` lines): a busy machine, rounds that disagree with the
            trials, a changed precision or effective batch, an interrupted confirmation.
    """

    setup: TrainSetup
    samples_per_s: float
    speedup: float | None
    best_json: Path
    train_py: Path
    verdict: str
    outcome: SearchOutcome = field(repr=False)  # every trial: thousands of characters in a notebook's cell
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrialOutcome:
    """What :func:`trial` measured for one setup.

    Attributes:
        setup: The setup measured.
        workload: The checked workload record.
        result: The measurement (status, samples/s, spread, data wait, peak memory, ...).
    """

    setup: TrainSetup
    workload: Workload
    result: TrialResult

    @property
    def status(self) -> str:
        """``ok``, ``oom``, ``timeout``, ``error``, ``diverged``, ``bad_data`` or ``interrupted``."""
        return self.result.status

    @property
    def samples_per_s(self) -> float | None:
        """Median steady-state throughput (``None`` unless ``ok``)."""
        return self.result.samples_per_s
