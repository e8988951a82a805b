"""autotune: measure, don't guess, the fastest training setup for a PyTorch model.

Public API::

    from autotune import TrainSetup, load_setup, run_search, SearchConfig
"""

from __future__ import annotations

from autotune._version import __version__
from autotune.errors import AutotuneError
from autotune.train_setup import TrainSetup, load_setup
from autotune.tuner import SearchConfig, SearchOutcome, run_search

__all__ = ["AutotuneError", "SearchConfig", "SearchOutcome", "TrainSetup", "__version__", "load_setup", "run_search"]
