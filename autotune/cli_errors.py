"""How an error that ends a command reads on the command line: its one line, its exit code, and with ``--json`` an object."""

from __future__ import annotations

import errno
import functools
import json
import os
import select
import sys
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from typing import Any, TextIO, TypeVar

import typer
from rich.console import Console
from rich.markup import escape

from autotune.errors import AutotuneError, DataError, SetupError, TrialInterrupted, UsageError, interrupted_in
from autotune.flag_terms import in_flag_terms
from autotune.redact import show_controls
from probes.hardware import address_space_note

F = TypeVar("F", bound=Callable[..., Any])


def error_line(exc: Exception) -> tuple[str, int]:
    """The one line and the exit code of an error that reached the command line.

    A line break in the message (a path holding one, a multi-line error of the user's code) is shown as ``\\n``,
    so the error stays one line for the scripts that read it.

    Args:
        exc: The exception that ended the command.

    Returns:
        ``(line, exit code)``: an :class:`AutotuneError`'s own code, 1 for the machine (an ``OSError``, a
        failed import, no memory left), 3 for a bug.
    """
    line, code = _error_text(exc)
    return show_controls(line.strip().replace("\r", "\\r").replace("\n", "\\n")), code


def _error_text(exc: Exception) -> tuple[str, int]:
    if isinstance(exc, AutotuneError):
        return str(exc), exc.exit_code
    if isinstance(exc, OSError) and exc.errno == errno.ENAMETOOLONG and exc.filename is not None:  # a path, not a flag's value
        name = os.fsdecode(exc.filename)
        longest = max((len(os.fsencode(part)) for part in name.split("/")), default=0)
        return (f"a path is too long for the file system: {name[:120]}{'...' if len(name) > 120 else ''} (its longest name is "
                f"{longest} bytes, the path {len(os.fsencode(name))}; most file systems allow 255 and 4096)"), 1
    if isinstance(exc, OSError):  # the machine, not a bug: a full disk, a file another program removed
        return str(exc), 1
    if isinstance(exc, (ImportError, MemoryError)):  # the installation or the machine: a broken wheel, a ulimit -v
        what = f"import failed: {exc}" if isinstance(exc, ImportError) else "out of memory (MemoryError)"
        return what + address_space_note(), 1
    return f"internal error: {type(exc).__name__}: {exc} (rerun as autotune --debug COMMAND ... for the traceback)", 3


def reader_gone(exc: Exception) -> bool:
    """Whether ``exc`` is the broken pipe of a stdout whose reader went away (``autotune probe --json | head -c0``):
    not an error to report, as for the commands without ``--json``. Stdout then points at /dev/null, so that
    nothing more fails writing to it.

    Args:
        exc: The exception that ended the command.
    """
    if not isinstance(exc, BrokenPipeError):
        return False
    try:
        poller = select.poll()
        poller.register(1, select.POLLOUT)  # fd 1 itself: a --json command's sys.stdout is stderr while it runs
        gone = any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))  # a closed pipe or socket peer
        if gone:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 1)
            os.close(devnull)
    except (AttributeError, OSError, ValueError):  # no poll on this platform, no fd 1
        return False
    return gone


#: The failure shape of each command decorated with :func:`json_on_error`, by its function's name.
_ERROR_SHAPES: dict[str, dict[str, Any]] = {}


def json_error_shape(command: str) -> dict[str, Any] | None:
    """The keys of ``command``'s ``--json`` object on failure (see :func:`json_on_error`).

    Args:
        command: The command's function name (``trial``).

    Returns:
        The keys besides ``"error"``, or None for a command that prints no object on failure.
    """
    return _ERROR_SHAPES.get(command)


@dataclass
class _JsonCommand:
    """A ``--json`` command running: its real stdout (``sys.stdout`` is stderr meanwhile), and whether it printed its
    object (a stop that lands after it adds none)."""

    stdout: TextIO
    printed: bool = False


#: The ``--json`` commands running, innermost last.
_JSON_RUNNING: list[_JsonCommand] = []


def echo_json(value: Any) -> None:
    """Print ``value`` as the one JSON object of a ``--json`` command, on the command's real stdout.

    Within a command decorated with :func:`json_on_error` and given ``--json``, anything else written to
    ``sys.stdout`` (a workload factory's or a dataset's ``print``) goes to stderr, so stdout holds this object alone.

    Args:
        value: The object (``json.dumps``-able).
    """
    typer.echo(json.dumps(value), file=_JSON_RUNNING[-1].stdout if _JSON_RUNNING else sys.stdout)
    if _JSON_RUNNING:
        _JSON_RUNNING[-1].printed = True


def echo_error_object(line: str, shape: dict[str, Any]) -> None:
    """Print the one JSON object of a failed ``--json`` command on stdout: ``shape`` and ``"error"``, the line stderr shows.

    Args:
        line: The error's one line, without stderr's ``error:``.
        shape: The command's keys on failure (:func:`json_error_shape`).
    """
    echo_json({**shape, "error": line})


def stopped_line(command: str) -> str:
    """The line of a command that a stop (Ctrl-C, SIGTERM, SIGHUP) ended before it answered the stop itself."""
    return f"interrupted: autotune {command} stopped before it was done"


def json_on_error(**shape: Any) -> Callable[[F], F]:
    """Decorate a command with a ``--json`` option (its ``as_json`` parameter) so that an error ending it also prints
    one JSON object on stdout: ``shape`` with an ``"error"`` key holding the line stderr shows.

    The error itself goes on, to the stderr line and exit code of the command's error handling. A usage error
    found before the command runs (an unknown option) prints the same object from :func:`autotune.cli.main`.
    With ``--json`` the command runs with ``sys.stdout`` sent to stderr (the user's code may print) and prints
    its object with :func:`echo_json`, so that stdout holds one JSON object and nothing else.

    Args:
        **shape: The keys a reader of the command's JSON looks at first, as they read on failure
            (``best=None`` for ``search``).
    """

    def decorate(command: F) -> F:
        _ERROR_SHAPES[command.__name__] = shape

        @functools.wraps(command)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not kwargs.get("as_json"):
                return command(*args, **kwargs)
            running = _JsonCommand(sys.stdout)
            _JSON_RUNNING.append(running)
            try:
                with redirect_stdout(sys.stderr):
                    return command(*args, **kwargs)
            except KeyboardInterrupt:  # one the command did not answer itself
                if not running.printed:
                    echo_error_object(stopped_line(command.__name__), shape)
                raise
            except Exception as exc:
                if not isinstance(exc, (typer.Exit, typer.Abort)) and not running.printed:
                    echo_error_object(error_line(exc)[0], shape)
                raise
            finally:
                _JSON_RUNNING.pop()

        return wrapper  # type: ignore[return-value]

    return decorate


#: ``autotune trial``'s flag of each setup knob that has one; any knob is also ``--set KNOB=VALUE``.
TRIAL_FLAGS: dict[str, str] = {
    "num_workers": "--workers", "prefetch_factor": "--prefetch", "pin_memory": "--pin-memory",
    "persistent_workers": "--persistent-workers", "batch_size": "--batch-size", "accumulation_steps": "--accum",
    "amp": "--amp", "channels_last": "--channels-last",
}


@contextmanager
def trial_flags_named(pinned: Collection[str]) -> Iterator[None]:
    """Within it, a :class:`~autotune.errors.SetupError` names the flags the user typed
    (:func:`autotune.flag_terms.in_flag_terms` with :data:`TRIAL_FLAGS`).

    Args:
        pinned: The knobs the command line set with ``--set``.
    """
    try:
        yield
    except SetupError as error:
        translated = in_flag_terms(error, pinned, TRIAL_FLAGS)
        if translated is error:
            raise
        raise translated from error


@contextmanager
def trial_interrupt_said() -> Iterator[None]:
    """Within it, Ctrl-C (SIGTERM and SIGHUP raise it too, under ``sigterm_as_interrupt``) ends ``autotune trial`` as a
    :class:`~autotune.errors.TrialInterrupted`: one line, exit 130, and with ``--json`` its error object on stdout."""
    try:
        yield
    except KeyboardInterrupt:
        raise TrialInterrupted("interrupted before the trial's result: its processes were stopped and its directory removed; "
                               "nothing was measured") from None


@contextmanager
def search_interrupt_said(as_json: bool, out: Console, err: Console) -> Iterator[None]:
    """Within it, a stopped search (:class:`~autotune.errors.SearchInterrupted`, also behind a second Ctrl-C that landed
    as it unwound) ends ``autotune search`` with its best so far, marked interrupted (with ``--json`` as the object),
    then its one yellow line, exit 130; further stop signals cannot cut them short. Bad data that stopped the
    confirmation (a :class:`~autotune.errors.DataError` holding an outcome) shows its best so far the same way (with
    ``--json`` the object gets the error's line as ``"error"``), then goes on to the error's line."""
    from autotune.tuner import SearchOutcome

    def show(summary: object, as_object: dict[str, Any]) -> None:
        """The best so far: ``summary``'s table, or with ``--json`` its object (``as_object`` where there is none)."""
        from autotune.render import render_search

        if as_json:
            echo_json(summary.to_dict() | as_object if isinstance(summary, SearchOutcome) else as_object)
        elif isinstance(summary, SearchOutcome):
            out.print(render_search(summary), crop=False)

    try:
        yield
    except DataError as bad:
        if not isinstance(bad.outcome, SearchOutcome):
            raise
        show(bad.outcome, {"error": error_line(bad)[0]})
        raise
    except (AutotuneError, KeyboardInterrupt) as caught:
        if (exc := interrupted_in(caught)) is None:
            raise
        from autotune.tuner.signals import stops_ignored

        with stops_ignored():
            try:
                show(exc.outcome, {} if isinstance(exc.outcome, SearchOutcome) else {"best": None, "interrupted": True})
                err.print(escape(str(exc)), style="yellow", highlight=False, soft_wrap=True)
            except OSError as unwritten:  # the terminal closed (its hangup stopped the search: EIO), a reader gone (EPIPE)
                if unwritten.errno not in (errno.EIO, errno.EPIPE):
                    raise
        raise typer.Exit(exc.exit_code) from None  # still a stop's 130, not a failure's 1


def check_flags_agree(ctx: typer.Context, flags: Mapping[str, Any], sets: Sequence[str]) -> None:
    """Refuse a knob's flag typed on the command line together with a ``--set`` of that knob to another value.

    A flag left at its default gives way to the ``--set`` (``--prefetch 2 --set num_workers=2``); one the user typed
    and a ``--set`` that differs would leave one of them silently unused.

    Args:
        ctx: The command's context: which of its options the command line gave.
        flags: Each knob of :data:`TRIAL_FLAGS` at its flag's value.
        sets: The ``--set KNOB=VALUE`` texts, as typed (already checked).

    Raises:
        UsageError: ``--workers 3 and --set num_workers=2 disagree; give one``.
    """
    from autotune.tuner.constraints import parse_constraint

    options = {opt: param.name for param in ctx.command.params for opt in param.opts if param.name}
    for text in sets:
        pin = parse_constraint(text)
        flag = TRIAL_FLAGS.get(pin.knob)
        if flag is None or pin.value == flags[pin.knob]:
            continue
        source = ctx.get_parameter_source(options[flag])
        if source is not None and source.name == "COMMANDLINE":
            value = flags[pin.knob]
            typed = (flag if value else f"--no-{flag[2:]}") if isinstance(value, bool) else f"{flag} {value}"
            raise UsageError(f"{typed} and --set {text} disagree; give one")


#: The options of ``autotune`` itself, given before the command.
ROOT_OPTIONS = ("--debug", "--version")


def usage_error(exc: Exception, words: Sequence[str], commands: Mapping[str, str], err: Console) -> None:
    """Print a usage error (Click's, matched by shape) as one line naming the command's ``--help``; a bare ``autotune``
    gets the help (on stderr, exit 2, as Click gives it).

    Args:
        exc: Click's exception (``format_message``, maybe ``ctx``).
        words: The command line's arguments after ``autotune``.
        commands: Each command's name to its function's name.
        err: The console for stderr.
    """
    if type(exc).__name__ == "NoArgsIsHelpError":
        exc.show()  # type: ignore[attr-defined]
        return
    at = next((i for i, w in enumerate(words) if w in commands), len(words))  # len(words): none named
    named = " ".join(["autotune", *words[at:at + 1]])  # Click gave no context
    ctx = getattr(exc, "ctx", None)
    line = f"{exc.format_message()} (see {ctx.command_path if ctx is not None else named} --help)"  # type: ignore[attr-defined]
    option = getattr(exc, "option_name", None)  # a NoSuchOption's
    if at < len(words) and option in ROOT_OPTIONS:  # Click suggested one of the command's
        example = f"autotune --debug {words[at]} ..." if option == "--debug" else f"autotune {option}"
        line = f"{option} is an option of autotune itself, given before the command: {example} (see autotune --help)"
    err.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
    after = list(words[at + 1:])
    shape = json_error_shape(commands[words[at]]) if at < len(words) else None
    if shape is not None and "--json" in after[:after.index("--") if "--" in after else None]:  # its options, not after --
        echo_error_object(line, shape)  # the object the command prints for its own errors with --json
