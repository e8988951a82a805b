"""The ``autotune`` command's entry point: a stop (Ctrl-C, SIGTERM, SIGHUP) while the CLI's modules are imported ends it
as a later one does.

Importing the CLI (Typer, Rich, the error handling) takes about half a second; a Ctrl-C in it printed
a ``KeyboardInterrupt`` traceback through those imports, and ``--json`` commands then printed no object.
"""

from __future__ import annotations

import io
import os
import signal
import sys
from typing import Any

from autotune import foreign_probes, shadowed_probes_line
from autotune.errors import BEFORE_START


def _stopped_while_importing(signum: int, frame: Any) -> None:
    try:
        print(f"error: {BEFORE_START}", file=sys.stderr, flush=True)
    finally:
        os._exit(130)


def _stop_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _working_directory() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # removed meanwhile: every command that needs none still runs
        return None


def main() -> None:
    """Run the CLI (:func:`autotune.cli.main`): a Ctrl-C, SIGTERM or SIGHUP during its imports is answered with one line
    and exit 130; after them SIGTERM and SIGHUP raise KeyboardInterrupt as Ctrl-C does, so that a stop from outside ends
    every command as Ctrl-C does (one line, exit 130; before, a silent exit 143 until a command handled it). A signal
    the process was started to ignore (nohup, a shell's background job) stays ignored. A closed standard output (``>&-``)
    is refused in one line, exit 1: the output would be lost, and a file the command opens next would take its
    descriptor, where a trial process's prints would land."""
    if sys.stdout is None:
        if sys.stderr is not None:
            print("error: standard output is closed: redirect it instead (> /dev/null discards the output)", file=sys.stderr)
        sys.exit(1)
    # ``python -m autotune`` puts the working directory first on sys.path, where a user's probes.py would shadow
    # autotune's own package: there it leaves, as the ``autotune`` command has it (a factory is imported from there
    # still). Only then: in a checkout run uninstalled the working directory is where autotune's own probes are.
    if (where := foreign_probes()) and sys.path and sys.path[0] in ("", _working_directory()):
        del sys.path[0]
        where = foreign_probes()
    if where:
        print(f"error: {shadowed_probes_line(where)}", file=sys.stderr)
        sys.exit(1)
    for stream in (sys.stdout, sys.stderr):  # an encoding that cannot write a path's characters (PYTHONIOENCODING=ascii,
        if isinstance(stream, io.TextIOWrapper):  # a latin-1 locale) escapes them: no internal error once the work is done
            stream.reconfigure(errors="backslashreplace")
    stops = tuple(sig for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if signal.getsignal(sig) is not signal.SIG_IGN)
    before = {sig: signal.signal(sig, _stopped_while_importing) for sig in stops}
    from autotune.cli import main as cli_main

    for sig, handler in before.items():
        signal.signal(sig, handler if sig == signal.SIGINT else _stop_as_interrupt)
    cli_main()
