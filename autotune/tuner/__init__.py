"""The search: from a workload to a confirmed winner.

:func:`run_search` (in :mod:`.run`) reads as its steps: prepare, calibrate
(:mod:`.calibrate`), build the space (:mod:`.space`, :mod:`.constraints`),
explore (:mod:`.explore`, pruned by :mod:`.pruning`), confirm
(:mod:`.confirm`, :mod:`.choice`), finish (:mod:`.winner`). The Optuna study is opened and
read through :mod:`.study`'s ``SearchStudy``; each module that keeps
something in it names its own keys (see :mod:`.study`).
"""

from __future__ import annotations

from autotune.tuner.config import SearchConfig, SearchOutcome, Timing
from autotune.tuner.progress import Reporter, SilentReporter
from autotune.tuner.run import run_search

__all__ = ["Reporter", "SearchConfig", "SearchOutcome", "SilentReporter", "Timing", "run_search"]
