"""Hide secrets before text is shown or stored.

A storage URL such as ``postgresql://user:password@host/db`` is printed in
messages and recorded in ``best.json`` and the ``train.py`` header, files
that get shared. Every URL's password becomes ``***``.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

#: ``scheme://user:password@``: the password is whatever lies between the
#: first ``:`` after the scheme and the last ``@`` before the host.
_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^:/@\s]*:)(?P<password>[^\s]*)(?P<at>@)")
#: A password given as a query parameter (``postgresql://me@db/optuna?password=...``, libpq's ``sslpassword`` too).
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:ssl)?password=)(?P<password>[^&\s'\"]*)", re.IGNORECASE)


def hide_passwords(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``.

    >>> hide_passwords("--storage postgresql://me:s3cr:et@db:5432/optuna")
    '--storage postgresql://me:***@db:5432/optuna'
    >>> hide_passwords("postgresql://me@db/optuna?sslmode=require&password=s3cret")
    'postgresql://me@db/optuna?sslmode=require&password=***'
    """
    text = _CREDENTIALS.sub(lambda m: f"{m.group('head')}***{m.group('at')}", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m.group('head')}***", text)


def shell_quote(word: str) -> str:
    """``word`` as a POSIX shell reads it back: :func:`shlex.quote`, or bash's ``$'...'`` where it holds a control
    character (a line break in a directory's name), which shlex.quote kept raw: the recorded command broke across
    two lines, and pasted back it named another directory.
    (``nl<LF>out`` is written ``$'nl\\nout'``).
    """
    if not any(ord(c) < 32 or ord(c) == 127 for c in word):
        return shlex.quote(word)
    escaped = "".join({"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}.get(c) or
                      (f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c) for c in word)
    return f"$'{escaped}'"


def recorded_command(argv: list[str]) -> str:
    """The command line to record in best.json, passwords hidden; empty when
    autotune was not started as a program (a test runner, a notebook)."""
    path = Path(argv[0]) if argv else Path()
    program = f"{path.parent.name}/{path.name}" if path.name == "cli.py" else path.name  # python -m autotune.cli
    if program not in ("autotune", "__main__.py", "autotune/cli.py") or "search" not in argv[1:]:
        return ""
    return hide_passwords(" ".join(shell_quote(word) for word in ["autotune", *argv[1:]]))
