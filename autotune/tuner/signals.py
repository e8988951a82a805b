"""Signals during a search: SIGTERM and SIGHUP act like Ctrl-C, storage
writes are never cut in half, and no stop signal is lost.

Python raises the KeyboardInterrupt of a signal wherever the main thread is,
and one raised inside a finalizer or a weakref callback (run by the garbage
collector) is printed as "Exception ignored" and dropped: the search went on
to the end after a Ctrl-C. Each stop signal is therefore also remembered, and
every trial of a search starts and ends with :func:`raise_if_stopped`.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Signals that stop a search as Ctrl-C does: a supervisor's stop, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

#: Whether a stop signal arrived since clear_stop(). A plain flag, not a threading.Event: a signal's handler runs on the
#: main thread wherever it is, and an Event's set() takes the lock that the main thread may hold just then inside the
#: same Event's wait() or set(), a deadlock (the search hung on a Ctrl-C during a storage retry's pause).
_stop = [False]
_why: list[str] = []  # what stopped it, where it was no signal to this process (a trial terminated from outside)


def clear_stop() -> None:
    """Forget earlier stop signals (a new search in the same process begins)."""
    _stop[0] = False
    _why.clear()


def remember_stop(why: str | None = None) -> None:
    """Remember a stop whose KeyboardInterrupt a step caught to end early (a real signal's handler remembers its own);
    ``why``: what stopped it, where the user pressed nothing (a trial's process or rank terminated from outside)."""
    if why is not None and not _why:
        _why.append(why)
    _stop[0] = True


def stop_reason() -> str | None:
    """What stopped the search where no signal reached this process (:func:`remember_stop`'s ``why``), or None."""
    return _why[0] if _why else None


def stop_requested() -> bool:
    """Whether a stop signal arrived since :func:`clear_stop` (one a step caught and ended early on counts too)."""
    return _stop[0]


def wait_unless_stopped(seconds: float) -> bool:
    """Wait ``seconds``, less when a stop signal arrives meanwhile (one :func:`interrupts_held` holds too); True if one did."""
    deadline = time.monotonic() + seconds
    while not _stop[0] and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))  # a signal's handler runs between the sleeps' slices
    return _stop[0]


def raise_if_stopped() -> None:
    """Raise KeyboardInterrupt if a stop signal arrived whose own KeyboardInterrupt may have been dropped."""
    if _stop[0]:
        raise KeyboardInterrupt


def _not_ignored(signals: tuple[int, ...]) -> tuple[int, ...]:
    """The signals this process does not ignore: one ignored on purpose (nohup) stays ignored."""
    return tuple(sig for sig in signals if signal.getsignal(sig) is not signal.SIG_IGN)


@contextmanager
def signals_handled(signals: tuple[int, ...], handler: Callable[[int, Any], None]) -> Iterator[None]:
    """Run the block with ``handler`` on ``signals``; restore the previous handlers after.

    Outside the main thread signals cannot be handled: the block runs as is.
    """
    try:
        previous = {sig: signal.signal(sig, handler) for sig in signals}
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def stops_ignored() -> Iterator[None]:
    """Inside the block Ctrl-C, SIGTERM and SIGHUP do nothing: what is said after a stop (the summary, its line) is
    said whole."""
    with signals_handled(_not_ignored(STOP_SIGNALS), lambda signum, frame: None):
        yield


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does; each of the three is remembered."""

    def handler(signum: int, frame: Any) -> None:
        _stop[0] = True
        raise KeyboardInterrupt

    with signals_handled(_not_ignored(STOP_SIGNALS), handler):
        yield


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends, then raise KeyboardInterrupt (an error the block raised
    goes on instead; the stop stays remembered for :func:`raise_if_stopped`).

    Storage writes (ask, tell, user attributes) run inside it, so an
    interrupt never lands half-way through a database transaction; the
    trial itself runs outside it and stops at once.
    """
    caught: list[int] = []
    held = _not_ignored(STOP_SIGNALS)

    def hold(signum: int, frame: Any) -> None:
        _stop[0] = True
        caught.append(signum)

    with signals_handled(held, hold):
        yield
    if caught:  # only once the block ended normally: an error it raised is not replaced (the stop stays remembered)
        raise KeyboardInterrupt


#: What a Python caller's first search or trial imports lazily: torch's optimizers import torch._dynamo (sympy, triton),
#: the storage SQLAlchemy's error classes.
LAZY_IMPORTS = ("optuna.storages", "sqlalchemy.exc", "torch._dynamo")


def imported_whole(modules: tuple[str, ...] = LAZY_IMPORTS) -> None:
    """Import ``modules`` with stops held, then raise a stop that came meanwhile (:func:`interrupts_held`).

    A notebook's interrupt in the first seconds of a session's first ``autotune.search()`` landed inside one of
    these imports and left a half-made module in ``sys.modules``: every later call in that kernel failed (``module
    'sympy' has no attribute 'logic'``, said as the Task's optimizer factory failing), and so did the user's own
    optimizers, until a restart. Each import is whole or not begun.
    """
    import importlib

    with interrupts_held():
        for name in modules:
            importlib.import_module(name)


def runs_to_the_end(step: Callable[[], object]) -> bool:
    """Run ``step`` with SIGTERM acting like Ctrl-C; False when either stopped it."""
    try:
        with sigterm_as_interrupt():
            step()
    except KeyboardInterrupt:
        return False
    return True
