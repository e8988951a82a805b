"""Workers of one shared study on this host whose trials share CPU cores: each measures the other.

Two workers started on one CPU host without ``taskset`` (the docs' advice) run their trials on the same
cores at the same time, and every measurement of both is slowed by the other by an amount neither sees.
Before each of its trials a worker on the CPU looks at the study's running trials: one held by another
live process of this host whose CPU affinity overlaps this worker's cores is said once per process.
Workers on other hosts, on GPUs (their compute does not share cores) and on disjoint cores are not.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Collection

import psutil
from optuna.trial import TrialState

from autotune.tuner.lock import Holder
from autotune.tuner.study import ATTR_WORKER, SearchStudy


def _span(cores: Collection[int]) -> str:
    """``0-3,6`` for cores 0, 1, 2, 3 and 6."""
    ordered, parts = sorted(cores), []
    start = prev = ordered[0]
    for core in [*ordered[1:], None]:
        if core is not None and core == prev + 1:
            prev = core
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if core is not None:
            start = prev = core
    return ",".join(parts)


def _affinity(pid: int) -> set[int]:
    """The CPU cores process ``pid`` may run on; empty when it cannot be read (gone, another user's, no affinity)."""
    try:
        return set(psutil.Process(pid).cpu_affinity() or ())
    except (psutil.Error, AttributeError, OSError):  # AttributeError: no cpu_affinity on macOS
        return set()


class CoreSharing:
    """Says once per process which other worker of the study on this host runs its trials on this worker's cores."""

    def __init__(self, me: Holder, device: str, cores: Collection[int] = ()) -> None:
        """Args:
        me: This worker.
        device: Its trials' device; only ``cpu`` is checked.
        cores: Its trials' cores (empty: this process's affinity).
        """
        self.me = me
        self.on_cpu = device == "cpu"
        self.cores = set(cores) or _affinity(os.getpid())
        self.said: set[int] = set()

    def check(self, study: SearchStudy) -> str | None:
        """A warning naming a new worker that shares cores with this one, or None."""
        if not self.on_cpu or not self.cores:
            return None
        host = socket.gethostname()
        for trial in study.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            other = Holder.from_dict(trial.user_attrs.get(ATTR_WORKER))
            if other is None or other.host != host or other.pid in self.said or other.same_process(self.me) or not other.alive():
                continue
            shared = self.cores & _affinity(other.pid)
            if shared:
                self.said.add(other.pid)
                return (f"warning: worker pid {other.pid} on this host runs trials of this study on cores {_span(shared)}, which this "
                        "worker's trials use too: each measures the other slower; give each worker its own cores "
                        "(taskset -c, docs/distributed.md)")
        return None
