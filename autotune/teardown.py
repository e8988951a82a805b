"""The end of a command: once its work is written, a Ctrl-C need not wait for the interpreter's teardown."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any


def exit_at_once_on_interrupt(code: int) -> None:
    """From now on a Ctrl-C ends this process at once with ``code``.

    For a command whose work is done and written: the interpreter's teardown
    of torch takes a second or more, and a Ctrl-C there was printed as a
    traceback from an atexit callback.
    """

    def leave(signum: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed pipe: nothing more can be said
                pass
        os._exit(code)

    signal.signal(signal.SIGINT, leave)
