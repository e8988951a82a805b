"""A trial request in, a result out: the entry point of a trial process (see :mod:`autotune.runner.server`).

Every failure becomes a :class:`~autotune.records.TrialResult` with a
status; the parent never parses a traceback.
"""

from __future__ import annotations

from typing import Any

from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner.child import Send, TrialLoop
from autotune.runner.failures import classify
from autotune.runner.pause import arm, pause
from autotune.runner.ranks import Rank, pin, run_world
from autotune.train_setup import TrainSetup


def _quiet(event: dict[str, Any]) -> None:
    """The events of ranks other than 0: rank 0 speaks for the world."""


def execute(request: dict[str, Any], *, started: float, send: Send) -> TrialResult:
    """Run one trial request; every failure is returned as a status."""
    try:
        options = TrialOptions(**request["options"])
        if options.world_size > 1:
            return run_world(options, lambda rank: execute_rank(request, started, send if rank.rank == 0 else _quiet, rank))
        pin(options.cores)
    except BaseException as exc:  # every failure is a result, never a traceback
        return classify(exc)
    return execute_rank(request, started, send, Rank(), hold=request.get("hold") is True)


def execute_rank(request: dict[str, Any], started: float, send: Send, rank: Rank, *, hold: bool = False) -> TrialResult:
    """Run one rank of a trial request (the only one when alone); every failure is returned as a status.

    ``hold``: after each measured round the trial stops until its parent continues it for the next
    (:func:`autotune.runner.pause.pause`); the last round's result (a failure, or where it cannot hold) is returned.
    """
    loop: TrialLoop | None = None
    try:
        setup = TrainSetup.from_dict(request["setup"])
        workload = Workload.from_dict(request["workload"])
        options = TrialOptions(**request["options"])
        if hold:
            arm(setup.compile != "off")
        loop = TrialLoop(setup, workload, options, started=started, send=send, rank=rank)
        result = loop.run()
        while hold and result.ok and pause(loop, send, result):
            result = loop.run()
        return result
    except BaseException as exc:  # every failure is a result, never a traceback
        result = classify(exc)
        if loop is None:
            return result
        try:
            peak: int | None = loop.peak_memory()
        except Exception:
            peak = None
        return TrialResult(**{**result.to_dict(), "peak_memory_bytes": peak, "mode": loop.options.mode})
