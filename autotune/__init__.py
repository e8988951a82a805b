"""autotune: measure, don't guess, the fastest training setup for a PyTorch model.

Public API::

    import autotune

    def make_task() -> autotune.Task:            # in an importable module
        return autotune.Task(model, dataset, loss=..., batch_size=64, lr=3e-4)

    result = autotune.search(workload="mypkg.train:make_task", trials=30)
    setup = autotune.load_setup(result.best_json)

Also: ``autotune.trial(...)`` (one measured trial), ``TrainSetup``,
``run_search`` with ``SearchConfig`` (the lower-level entry point).
"""

from __future__ import annotations

from autotune._version import __version__
from autotune.api import SearchResult, TrialOutcome, search, trial
from autotune.errors import AutotuneError
from autotune.train_setup import TrainSetup, load_setup
from autotune.tuner import SearchConfig, SearchOutcome, run_search
from autotune.workloads.task import Task

__all__ = [
    "AutotuneError",
    "SearchConfig",
    "SearchOutcome",
    "SearchResult",
    "Task",
    "TrainSetup",
    "TrialOutcome",
    "__version__",
    "load_setup",
    "run_search",
    "search",
    "trial",
]
