"""Signals during a search: SIGTERM acts like Ctrl-C, and storage writes
are never cut in half."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


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
    """Inside the block SIGTERM raises KeyboardInterrupt, as Ctrl-C does."""

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    with signals_handled((signal.SIGTERM,), handler):
        yield


@contextmanager
def interrupts_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then raise KeyboardInterrupt.

    Storage writes (ask, tell, user attributes) run inside it, so an
    interrupt never lands half-way through a database transaction; the
    trial itself runs outside it and stops at once.
    """
    caught: list[int] = []
    # A signal the process ignores (nohup) stays ignored.
    held = tuple(sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not signal.SIG_IGN)
    try:
        with signals_handled(held, lambda signum, frame: caught.append(signum)):
            yield
    finally:
        if caught:
            raise KeyboardInterrupt
