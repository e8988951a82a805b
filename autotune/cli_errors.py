"""How an error that ends a command reads on the command line: its one line, its exit code, and with ``--json`` an object."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any, TypeVar

import typer

from autotune.errors import AutotuneError
from probes.hardware import address_space_note

F = TypeVar("F", bound=Callable[..., Any])


def error_line(exc: Exception) -> tuple[str, int]:
    """The one line and the exit code of an error that reached the command line.

    Args:
        exc: The exception that ended the command.

    Returns:
        ``(line, exit code)``: an :class:`AutotuneError`'s own code, 1 for the machine (an ``OSError``, a
        failed import, no memory left), 3 for a bug.
    """
    if isinstance(exc, AutotuneError):
        return str(exc), exc.exit_code
    if isinstance(exc, OSError):  # the machine, not a bug: a full disk, a file another program removed
        return str(exc), 1
    if isinstance(exc, (ImportError, MemoryError)):  # the installation or the machine: a broken wheel, a ulimit -v
        what = f"import failed: {exc}" if isinstance(exc, ImportError) else "out of memory (MemoryError)"
        return what + address_space_note(), 1
    return f"internal error: {type(exc).__name__}: {exc} (rerun as autotune --debug COMMAND ... for the traceback)", 3


def json_on_error(**shape: Any) -> Callable[[F], F]:
    """Decorate a command with a ``--json`` option (its ``as_json`` parameter) so that an error ending it also prints
    one JSON object on stdout: ``shape`` with an ``"error"`` key holding the line stderr shows.

    The error itself goes on, to the stderr line and exit code of the command's error handling.

    Args:
        **shape: The keys a reader of the command's JSON looks at first, as they read on failure
            (``best=None`` for ``search``).
    """

    def decorate(command: F) -> F:
        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return command(*args, **kwargs)
            except Exception as exc:
                if kwargs.get("as_json") and not isinstance(exc, (typer.Exit, typer.Abort)):
                    typer.echo(json.dumps({**shape, "error": error_line(exc)[0]}))
                raise

        return wrapper  # type: ignore[return-value]

    return decorate
