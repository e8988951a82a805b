"""The ``autotune`` command's entry point: a Ctrl-C while the CLI's modules are imported ends it as a later one does.

Importing the CLI (Typer, Rich, the error handling) takes about half a second; a Ctrl-C in it printed
a ``KeyboardInterrupt`` traceback through those imports, and ``--json`` commands then printed no object.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

#: What an interrupted command says (the search's and the trial's own stops say more).
INTERRUPTED = "interrupted"


def _stopped_while_importing(signum: int, frame: Any) -> None:
    try:
        print(f"error: {INTERRUPTED} (before the command started)", file=sys.stderr, flush=True)
    finally:
        os._exit(130)


def main() -> None:
    """Run the CLI (:func:`autotune.cli.main`), a Ctrl-C during its imports answered with one line and exit 130."""
    before = signal.signal(signal.SIGINT, _stopped_while_importing) if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN else None
    from autotune.cli import main as cli_main

    if before is not None:
        signal.signal(signal.SIGINT, before)
    cli_main()
