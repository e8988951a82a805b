"""A held trial between its rounds, on the trial's side: it stops its whole process group, then runs the next round.

The confirmation measures each finalist in several interleaved rounds
(:mod:`autotune.tuner.confirm`). A fresh process per round pays the model's
build, the loader's first batches and the warm-up every time, seconds before
its windows (``python -m benchmarks.trial_startup``). A held trial
(:class:`autotune.runner.held.HeldTrials`) keeps its process instead: after
each round's result it stops itself and its loader workers with one
``SIGSTOP`` to its process group, so nothing of it runs while the other
candidates measure, and its pipeline resumes where it was, neither drained
nor filled by the pause. The parent continues it (``SIGCONT``) for its next
round, which warms up with :data:`RESUMED_WARMUP_STEPS` and measures as the
first did.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from typing import Any

from autotune.records import TrialResult
from autotune.runner.child import Send, TrialLoop
from autotune.teardown import die_with_parent

#: Warm-up steps of a resumed round: the pipeline is where the last round left it; one step brings the caches back.
RESUMED_WARMUP_STEPS = 1


_parent: int | None = None  # the trial's parent when it was armed: a held trial whose parent changed since does not stop


def arm(compiles: bool) -> None:
    """Prepare a trial started with ``hold``, before it builds anything: it dies with its parent from now on
    (:func:`~autotune.teardown.die_with_parent`; a stopped process runs no code that could notice), and where it
    ``compiles``, inductor compiles in the trial itself (its pool of compile workers, started in the trial's group,
    would be stopped with it and has no such signal)."""
    global _parent
    _parent = os.getppid()
    die_with_parent()
    if compiles:
        import torch._inductor.config

        torch._inductor.config.compile_threads = 1


def pause(loop: TrialLoop, send: Send, result: TrialResult) -> bool:
    """Send ``result`` as a held round's, stop the trial's process group until the parent continues it, and prepare the
    next round.

    Returns:
        False, having sent nothing, where stopping is not safe, and the trial ends as any trial does: it does not
        lead its own process group (a trial forked by the trial server calls ``setsid()``; one run in an interpreter
        of its own is started in a new session), so stopping the group would stop whoever leads it; its parent is
        gone (:func:`arm`: nobody would continue it); or its loader workers are not forked (Python's ``forkserver``
        or ``spawn`` start method: their parent, a server process, has no parent-death signal).
    """
    import multiprocessing

    if os.getpgrp() != os.getpid() or _parent is None or os.getppid() != _parent:
        return False
    if loop.setup.num_workers > 0 and multiprocessing.get_start_method() != "fork":  # the workers' (fixed by now)
        return False
    if loop.clock is not None:
        loop.clock.pause()
    event: dict[str, Any] = {"event": "result", "result": result.to_dict(), "held": True}
    send(event)
    os.killpg(os.getpgrp(), signal.SIGSTOP)
    # Continued: the next round.
    if loop.clock is not None:
        loop.clock.resume()
    loop.started = time.perf_counter()
    assert loop.work is not None  # run() built it
    loop.work = replace(loop.work, warmup_steps=RESUMED_WARMUP_STEPS)
    loop.monitor.restart()
    return True
