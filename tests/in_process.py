"""Run an emitted ``train.py`` or an example in the test process.

torch is imported already here, so a script run this way skips the seconds of
imports a fresh interpreter pays. Each test file keeps at least one run as a real
process (the standalone script, its own ``sys.path``); the others use this.
"""

from __future__ import annotations

import atexit
import runpy
import signal
import sys
from pathlib import Path

import pytest
import torch


def run_script(script: Path, args: list[str], cwd: Path, capfd: pytest.CaptureFixture[str],
               monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """``python SCRIPT ARGS`` from ``cwd``: the exit code, stdout and stderr (the file descriptors', so
    what a process the script starts prints is there too). A ``sys.exit("message")`` prints the
    message to stderr and exits 1, as the interpreter does."""
    namespace = runpy.run_path(str(script), run_name="in_process")
    return call(lambda: namespace["main"](namespace["get_args_parser"]().parse_args(args)), cwd, capfd, monkeypatch)


def run_main(script: Path, args: list[str], cwd: Path, capfd: pytest.CaptureFixture[str],
             monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """``python SCRIPT ARGS`` through the script's own ``__main__`` block, as :func:`run_script` runs ``main()``:
    the block's one-line errors and exit codes too. The signal handlers it sets are put back."""
    monkeypatch.setattr(sys, "argv", [str(script), *args])
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}

    def main_block() -> None:  # it ends in leave(code), a plain run's sys.exit(code), which call() reads
        runpy.run_path(str(script), run_name="__main__")

    try:
        return call(main_block, cwd, capfd, monkeypatch)
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def refusal(script: Path, args: list[str], cwd: Path, capfd: pytest.CaptureFixture[str],
            monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """``python SCRIPT ARGS``, which must exit 1 with one line on stderr: that line, and stdout."""
    code, out, err = run_script(script, args, cwd, capfd, monkeypatch)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, f"exit {code}\n{out}\n{err}"
    return lines[0], out


def run_example(example: Path, args: list[str], cwd: Path, capfd: pytest.CaptureFixture[str],
                monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    """An example's ``main([path, *args])`` from ``cwd``, as :func:`run_script` runs a script."""
    namespace = runpy.run_path(str(example), run_name="in_process")
    return call(lambda: namespace["main"]([str(example), *args]), cwd, capfd, monkeypatch)


def call(main: object, cwd: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, str, str]:
    monkeypatch.chdir(cwd)
    capfd.readouterr()  # what the test printed before
    threads = torch.get_num_threads()
    at_exit: list[tuple[object, tuple[object, ...]]] = []  # run when the call ends, as a process runs them when it exits
    register = atexit.register
    atexit.register = lambda func, *args: at_exit.append((func, args))  # type: ignore[assignment]
    code, message = 0, ""
    try:
        returned = main()  # type: ignore[operator]
        code = int(returned or 0)
    except SystemExit as exc:
        if isinstance(exc.code, str):
            code, message = 1, exc.code + "\n"
        else:
            code = int(exc.code or 0)
    finally:
        torch.set_num_threads(threads)  # a setup's thread count stays with its run
        atexit.register = register
        for func, args in reversed(at_exit):
            func(*args)  # type: ignore[operator]
    out, err = capfd.readouterr()
    return code, out, err + message


def cli(args: list[str], cwd: Path) -> tuple[int, str, str]:
    """``autotune ARGS`` run in this process from ``cwd``: its exit code, stdout and stderr.

    This process's trial server is warm after the first search (seconds saved per run), and a model
    named ``module:function`` is imported from ``cwd``, as a user's own is.
    """
    import os

    from typer.testing import CliRunner

    from autotune.cli import app

    before = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(before)
    # An exception the CLI let through would be a traceback in a real process.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr
