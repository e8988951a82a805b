"""Whether a workload factory's cost leaves each run time for its trial.

Every calibration run and trial builds the user's Task again in its own
process, within the run's timeout. A factory that loads or tokenizes a corpus
for longer than that made every run of a search time out, and the error
blamed a busy machine; one that fits still costs each run its time.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import TypeVar

from autotune.errors import WorkloadError
from autotune.records import TrialOptions

#: The share of a run's timeout the factory may take in the parent's check; above it a run has too little time left
#: for its trial (and a loaded machine, or DDP ranks building it at once, make the factory slower still).
FACTORY_SHARE = 0.5
#: A factory that takes this long (or the trial's measured seconds, if longer) is said: every run pays it again.
FACTORY_NOTICE_S = 5.0
#: Seconds after which a factory call that has not returned is said, where no runs' timeout gives the time.
WATCH_S = 60.0

T = TypeVar("T")


def watched(call: Callable[[], T], ref: str, options: TrialOptions | None, warn: Callable[[str], None] | None,
            what: str = "its factory") -> T:
    """``call()``, a part of the parent's check of the workload (``what``: its factory's first call, or the check of
    its first batch), said once where it has not returned after :data:`FACTORY_SHARE` of the runs' timeout
    (:data:`WATCH_S` without their options): one that waits on a lock or the network kept the command silent, whatever
    its ``--timeout`` (which covers the runs, not this check). ``warn`` is then called from a timer thread."""
    if warn is None:
        return call()
    after = FACTORY_SHARE * options.effective_timeout_s if options is not None else WATCH_S
    timer = threading.Timer(after, lambda: warn(
        f"warning: workload {ref}: {what} has not returned after {after:.0f} s in this check; every calibration run and "
        "trial runs it again within its timeout (one that waits on a lock or the network hangs here: Ctrl-C stops)"))
    timer.daemon = True
    timer.start()
    try:
        return call()
    finally:
        timer.cancel()


def check_factory_time(ref: str, took_s: float, options: TrialOptions, warn: Callable[[str], None] | None = None,
                       again: Callable[[], float] | None = None) -> None:
    """Refuse a factory too slow for the run timeout; say one whose cost dominates each run's time.

    Args:
        ref: The workload reference, as the user gave it.
        took_s: Seconds the factory call took in the parent's check.
        options: The runs' options (their timeout: ``--timeout``, or the default).
        warn: Where the notice goes (None: not said).
        again: Calls the factory once more and returns its seconds: a first call over the share may have downloaded or
            cached what the later calls, the runs' among them, read.

    Raises:
        WorkloadError: The factory took over :data:`FACTORY_SHARE` of the timeout (on its second call, where ``again``).
    """
    timeout = options.effective_timeout_s
    if took_s > FACTORY_SHARE * timeout and again is not None:
        first, took_s = took_s, again()
        if warn is not None and took_s <= FACTORY_SHARE * timeout:
            warn(f"the workload's factory took {first:.1f} s on its first call and {took_s:.1f} s on the next (a download or a "
                 "cache, say): the runs' calls are the later ones")
    if took_s > FACTORY_SHARE * timeout:
        which = "--timeout" if options.timeout_s is not None else f"the default, 90 s + 6 x --trial-seconds {options.trial_seconds:g}"
        enough = 10 * math.ceil((timeout + 2 * took_s) / 10)
        raise WorkloadError(
            f"workload {ref}: its factory took {took_s:.1f} s here, and every calibration run and trial calls it again within "
            f"a timeout of {timeout:g} s ({which}): pass --timeout {enough} or more, or make the factory cheaper (prepare the "
            "data once, into files its dataset reads)")
    if warn is not None and took_s >= max(FACTORY_NOTICE_S, options.trial_seconds):
        warn(f"the workload's factory took {took_s:.1f} s here: every calibration run and trial calls it again, on top of "
             f"its {options.trial_seconds:g} measured seconds (prepare the data once, into files its dataset reads, to search faster)")
