"""autotune: measure, don't guess, the fastest training setup for a PyTorch model.

Public API::

    import autotune

    def make_task() -> autotune.Task:            # in an importable module
        return autotune.Task(model, dataset, loss=..., batch_size=64, lr=3e-4)

    result = autotune.search(workload="mypkg.train:make_task", trials=30)
    setup = autotune.load_setup(result.best_json)
    best = autotune.load_best(result.best_json)    # all of it: best.lr, the learning rate scaled for its batch

Also: ``autotune.trial(...)`` (one measured trial), ``TrainSetup``,
``run_search`` with ``SearchConfig`` (the lower-level entry point).
"""

from __future__ import annotations

import importlib
import importlib.util
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune._version import __version__
from autotune.errors import AutotuneError

if TYPE_CHECKING:
    from autotune.api import SearchResult, TrialOutcome, search, trial
    from autotune.errors import SearchStopped
    from autotune.output.best import Best, load_best
    from autotune.train_setup import TrainSetup, load_setup
    from autotune.tuner import SearchConfig, SearchOutcome, run_search
    from autotune.workloads.task import Task

#: Where each public name lives. They are imported on first use, so ``autotune probe``, ``status`` and
#: ``import autotune`` for ``load_setup`` do not pay for the tuner's imports (optuna, SQLAlchemy: about 0.6 s).
_LAZY = {
    "SearchResult": "autotune.api",
    "TrialOutcome": "autotune.api",
    "search": "autotune.api",
    "trial": "autotune.api",
    "TrainSetup": "autotune.train_setup",
    "Best": "autotune.output.best",
    "load_best": "autotune.output.best",
    "load_setup": "autotune.train_setup",
    "SearchConfig": "autotune.tuner",
    "SearchOutcome": "autotune.tuner",
    "SearchStopped": "autotune.errors",
    "run_search": "autotune.tuner",
    "Task": "autotune.workloads.task",
}


def foreign_probes() -> str | None:
    """Where a ``probes`` module other than autotune's own hardware probes would be imported from, or None.

    autotune's ``probes`` package is a top-level one beside ``autotune``; a user's ``probes.py`` or ``probes/`` earlier
    on ``sys.path`` (the working directory of ``python -m autotune`` or of a notebook) would shadow it.
    """
    found = sys.modules.get("probes")
    spec = found.__spec__ if found is not None else importlib.util.find_spec("probes")
    origin = getattr(spec, "origin", None) or next(iter(getattr(spec, "submodule_search_locations", None) or ()), None)
    if origin is None:  # none found (a broken install: the import says so), or a namespace package without a file
        return None if spec is None else str(spec.name)
    ours = Path(__file__).resolve().parent.parent / "probes"
    return None if Path(origin).resolve() in (ours, ours / "__init__.py") else str(origin)


def shadowed_probes_line(where: str) -> str:
    """The one line that says a foreign ``probes`` module shadows autotune's (``where``: its file)."""
    return (f"autotune cannot import its own 'probes' package: {where} shadows it (a module of that name earlier on "
            "sys.path, such as the working directory's): rename yours, or run from another directory")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'autotune' has no attribute {name!r}")
    if where := foreign_probes():  # the user's own probes imported already too
        raise ImportError(shadowed_probes_line(where))
    caught: list[int] = []
    previous = None
    try:  # Ctrl-C held while the module is imported (a notebook's interrupt left a half-made one for the session)
        if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, None):  # ignored on purpose, or set outside Python: kept
            previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    except ValueError:  # not the main thread
        pass
    try:
        value = getattr(importlib.import_module(module), name)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)  # the public names (tab completion), not the imports this module uses


__all__ = [
    "AutotuneError",
    "Best",
    "SearchConfig",
    "SearchOutcome",
    "SearchResult",
    "SearchStopped",
    "Task",
    "TrainSetup",
    "TrialOutcome",
    "__version__",
    "load_best",
    "load_setup",
    "run_search",
    "search",
    "trial",
]
