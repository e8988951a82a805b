"""autotune: measure, don't guess, the fastest training setup for a PyTorch model.

Public API::

    from autotune import TrainSetup, load_setup
"""

from __future__ import annotations

from autotune.config import TrainSetup, load_setup
from autotune.errors import AutotuneError

__version__ = "0.1.0"

__all__ = ["AutotuneError", "TrainSetup", "__version__", "load_setup"]
