"""The trial runner: one isolated, measured training trial per call.

Public entry points: :func:`run_trial` and the :class:`TrialRunner` protocol
that calibration, the search loop, confirmation and the benchmarks accept,
so tests hand in a fake runner instead of starting processes.

Inside: :mod:`.launch` (start, supervise, timeout), :mod:`.zygote` (the
client of the warm fork server and its file protocol), :mod:`.server` (that
server), :mod:`.child` (what runs in the trial process), :mod:`.failures`
(an exception -> a status), :mod:`.windows` (when a window may close),
:mod:`.ranks` (DDP trials), :mod:`.measure` (memory, stopwatch, summaries),
:mod:`.entry` (a request in, a result out), :mod:`.held` and :mod:`.pause`
(the confirmation's finalists kept, stopped, between rounds) and
:mod:`._preload` (what the warm server imports once).
"""

from __future__ import annotations

from typing import Protocol

from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner.launch import WindowCallback, run_trial
from autotune.runner.zygote import prestart
from autotune.train_setup import TrainSetup

__all__ = ["TrialRunner", "WindowCallback", "prestart", "run_trial"]


class TrialRunner(Protocol):
    """Anything that runs one trial the way :func:`run_trial` does."""

    def __call__(
        self,
        setup: TrainSetup,
        workload: Workload,
        options: TrialOptions | None = None,
        *,
        on_window: WindowCallback | None = None,
    ) -> TrialResult:
        """Train ``workload`` with ``setup`` and return what was measured."""
        ...
