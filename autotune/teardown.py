"""The end of a command: once its work is written, the process need not wait for the interpreter's teardown.

Tearing down an interpreter that imported torch (and torch._dynamo, matplotlib) takes a second or more
on a 2-core machine: every ``autotune`` command paid it after its last line. :func:`exit_now` runs what
the interpreter would run at exit (the ``atexit`` callbacks: the trial server's shutdown, logging,
temporary directories) and then ends the process without the module teardown.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import signal
import sys
import threading
from typing import Any, NoReturn, Protocol


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed pipe: nothing more can be said
            pass


def exit_at_once_on_interrupt(code: int) -> None:
    """From now on a Ctrl-C (or a SIGTERM or SIGHUP, which the ``autotune`` command turns into one) ends this process at
    once with ``code``.

    For a command whose work is done and written: a Ctrl-C in an atexit
    callback was printed as a traceback.
    """

    def leave(signum: int, frame: Any) -> None:
        _flush()
        os._exit(code)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, leave)


def status_of(code: str | int | None) -> int:
    """The exit status the interpreter gives ``sys.exit(code)`` (a message is printed to stderr first, as it does)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def exit_now(code: str | int | None) -> NoReturn:
    """End the program as ``sys.exit(code)`` would, without the interpreter's teardown of its modules.

    A thread other than the main one that is still alive and not a daemon is waited for by the
    interpreter at exit: then this is ``sys.exit(code)`` itself.
    """
    main = threading.main_thread()
    if threading.current_thread() is not main or any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not main):
        sys.exit(code)
    status = status_of(code)
    exit_at_once_on_interrupt(status)
    try:
        atexit._run_exitfuncs()
    finally:
        _flush()
        os._exit(status)


class Main(Protocol):
    """A command line's entry point: ``main(argv)``; None reads ``sys.argv``."""

    def __call__(self, argv: list[str] | None = None) -> None: ...


def without_teardown(main: Main) -> Main:
    """``main(argv)``, which ends in ``sys.exit``, run as the program (``argv`` None) ends by :func:`exit_now`.

    A caller in Python (``argv`` given) gets the ``SystemExit`` as before.
    """

    @functools.wraps(main)
    def program(argv: list[str] | None = None) -> None:
        try:
            main(argv)
        except SystemExit as done:
            if argv is None:
                exit_now(done.code)
            raise

    return program


#: ``prctl``'s option that sends a signal to this process when its parent ends (Linux).
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent ends (Linux; elsewhere nothing).

    A stopped process runs no code of its own: a held trial (:mod:`autotune.runner.pause`) whose trial server was
    killed (SIGKILL to the search and the server at once) would stay stopped for good, and so would its loader
    workers, which call it too (:func:`autotune.workloads.pipeline.endless_batches`).
    """
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def worker_dies_with_trial(worker_id: int) -> None:
    """A loader worker's ``worker_init_fn``: it ends with the trial process (:func:`die_with_parent`)."""
    die_with_parent()
