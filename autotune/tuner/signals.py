"""Signals during a search: SIGTERM and SIGHUP act like Ctrl-C, and storage
writes are never cut in half."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: Signals that stop a search as Ctrl-C does: a supervisor's stop, a closed terminal.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


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
def sigterm_as_interrupt() -> Iterator[None]:
    """Inside the block SIGTERM and SIGHUP raise KeyboardInterrupt, as Ctrl-C does."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    with signals_handled(_not_ignored((signal.SIGTERM, signal.SIGHUP)), handler):
        yield


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends, then raise KeyboardInterrupt.

    Storage writes (ask, tell, user attributes) run inside it, so an
    interrupt never lands half-way through a database transaction; the
    trial itself runs outside it and stops at once.
    """
    caught: list[int] = []
    held = _not_ignored(STOP_SIGNALS)
    try:
        with signals_handled(held, lambda signum, frame: caught.append(signum)):
            yield
    finally:
        if caught:
            raise KeyboardInterrupt


def runs_to_the_end(step: Callable[[], object]) -> bool:
    """Run ``step`` with SIGTERM acting like Ctrl-C; False when either stopped it."""
    try:
        with sigterm_as_interrupt():
            step()
    except KeyboardInterrupt:
        return False
    return True
