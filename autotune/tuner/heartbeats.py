"""A shared study's trial heartbeats: each running trial records one every :func:`heartbeat_s` seconds, and a trial
whose heartbeat is older than three intervals is failed by the next worker that looks and queued again."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import optuna

#: Seconds between a running trial's heartbeats (``AUTOTUNE_HEARTBEAT_S`` overrides it).
HEARTBEAT_S = 10


def heartbeat_s() -> int:
    """The heartbeat interval in whole seconds (Optuna takes an int)."""
    try:
        return max(1, int(os.environ.get("AUTOTUNE_HEARTBEAT_S", HEARTBEAT_S)))
    except ValueError:
        return HEARTBEAT_S


def supports_heartbeat(study: optuna.Study) -> bool:
    """Whether the study's storage records trial heartbeats."""
    return optuna.storages._heartbeat.is_heartbeat_enabled(study._storage)


def stale_trial_ids(study: optuna.Study) -> set[int]:
    """Running trials with a stale heartbeat: what ``optuna.storages.fail_stale_trials`` fails next (none without)."""
    return set(study._storage._get_stale_trial_ids(study._study_id)) if supports_heartbeat(study) else set()  # type: ignore[attr-defined]


def failed_elsewhere(study: optuna.Study, number: int) -> bool:
    """Whether trial ``number``, which this worker still ran, is finished in the storage: another worker failed it as
    stale and queued it again while this one stalled past the grace (a paused VM, a suspend, ``kill -STOP``)."""
    return study.get_trials(deepcopy=False)[number].state.is_finished()


def stalled_line(number: int) -> str:
    """What a worker says of a trial :func:`failed_elsewhere`: nothing of it is stored, and why."""
    return (f"trial #{number} was failed and queued again by another worker while this one stalled (no heartbeat for "
            f"{3 * heartbeat_s()} s: a paused VM, a suspend, kill -STOP): what it measured here is not stored, as the stall "
            "may lie in its windows; the queued copy measures it again")


@contextmanager
def heartbeats(study: optuna.Study, trial_id: int) -> Iterator[None]:
    """Record the trial's heartbeat in a thread while the block runs (a no-op without heartbeats).

    A heartbeat that fails (a lost connection) is skipped: the worker's next
    storage call finds the loss and retries.
    """
    if not supports_heartbeat(study):
        yield
        return
    storage: Any = study._storage
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                storage.record_heartbeat(trial_id)
            except Exception:  # the main loop reports a lost storage
                pass
            if stop.wait(storage.get_heartbeat_interval()):
                return

    thread = threading.Thread(target=beat, name="autotune-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
