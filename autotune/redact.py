"""Hide secrets before text is shown or stored.

A storage URL such as ``postgresql://user:password@host/db`` is printed in
messages and recorded in ``best.json`` and the ``train.py`` header, files
that get shared. Every URL's password becomes ``***``.
"""

from __future__ import annotations

import inspect
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SCHEME = r"[A-Za-z][A-Za-z0-9+.\-]*://"
#: A URL shown in quotes, as a message shows one (``'URL': why``, Python's repr): the quote it opens with, closed by the
#: same quote where a ``:``, ``,``, ``)``, a space or the line's end follows; inside, the URL is whole, so its password
#: is known exactly, spaces and quotes included.
_QUOTED_URL = re.compile(rf"""(?P<q>['"])(?P<url>{_SCHEME}[^\n]*?)(?P=q)(?=[:\s,)]|$)""", re.MULTILINE)
#: ``scheme://user:password@`` in one URL: the password is whatever lies between the first ``:`` after the user name and
#: the last ``@`` (SQLAlchemy takes spaces and quotes in it, and an ``@`` the user did not percent-encode).
_URL_CREDENTIALS = re.compile(rf"^(?P<head>{_SCHEME}[^:/@]*:)(?P<password>.*)(?P<at>@)", re.DOTALL)
#: The same in running text, where a URL ends at a space: within one word.
_CREDENTIALS = re.compile(rf"(?P<head>{_SCHEME}[^:/@\s]*:)(?P<password>\S*)(?P<at>@)")
#: A password given as a query parameter (``postgresql://me@db/optuna?password=...``, libpq's ``sslpassword`` too): up to
#: the next parameter (in running text also a space or a quote).
_URL_QUERY_PASSWORD = re.compile(r"(?P<head>[?&](?:ssl)?password=)(?P<password>[^&]*)", re.IGNORECASE)
_QUERY_PASSWORD = re.compile(r"""(?P<head>[?&](?:ssl)?password=)(?P<password>[^&\s'"]*)""", re.IGNORECASE)


def hide_url_password(url: str) -> str:
    """The URL ``url`` (one whole URL, as typed) with its password replaced by ``***``.

    >>> hide_url_password("postgresql://me:p s@s@db/x?sslpassword=a b&sslmode=require")
    'postgresql://me:***@db/x?sslpassword=***&sslmode=require'
    """
    url = _URL_CREDENTIALS.sub(lambda m: f"{m.group('head')}***{m.group('at')}", url)
    return _URL_QUERY_PASSWORD.sub(lambda m: f"{m.group('head')}***", url)


def hide_passwords(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``: a URL in quotes whole (its password may hold
    spaces and quotes), any other one up to the next space.

    >>> hide_passwords("--storage postgresql://me:s3cr:et@db:5432/optuna")
    '--storage postgresql://me:***@db:5432/optuna'
    >>> hide_passwords("postgresql://me@db/optuna?sslmode=require&password=s3cret")
    'postgresql://me@db/optuna?sslmode=require&password=***'
    >>> hide_passwords("cannot open study storage 'postgresql://me:p ss@db/x': refused")
    "cannot open study storage 'postgresql://me:***@db/x': refused"
    >>> hide_passwords('cannot open "postgresql://me@db/x?password=ab\\' cd": refused')
    'cannot open "postgresql://me@db/x?password=***": refused'
    """
    text = _QUOTED_URL.sub(lambda m: f"{m.group('q')}{hide_url_password(m.group('url'))}{m.group('q')}", text)
    text = _CREDENTIALS.sub(lambda m: f"{m.group('head')}***{m.group('at')}", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m.group('head')}***", text)


#: Control characters a terminal would act on (ESC begins a sequence that sets the title, clears the screen, moves the
#: cursor; C1's CSI likewise), shown as their escapes; a line break and a tab stay.
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0)) if c not in (0x09, 0x0A)}


def show_controls(text: str) -> str:
    r"""``text`` with its control characters as escapes (``\x1b``), to print names from elsewhere (a class folder of a
    downloaded dataset, a path) on a terminal, which would act on them; a line break and a tab stay.

    >>> show_controls("cat\x1b]0;title\x07")
    'cat\\x1b]0;title\\x07'
    """
    return text.translate(_CONTROLS)


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
    return " ".join(shell_quote(hide_url_password(word)) for word in ["autotune", *argv[1:]])  # each word whole, as typed


def recorded_call(function: Callable[..., Any], given: dict[str, Any]) -> str:
    """The Python API's call to record as a search's command (best.json, the train.py header): ``python:
    autotune.search(workload='mytask:make_task', trials=10) in SCRIPT``, the arguments that differ from the defaults
    (it named none: a notebook's search could not be told from another, or run again from its record), passwords hidden.

    Args:
        function: The API function called (its signature gives the defaults).
        given: Its arguments by name (``locals()`` at its start).
    """
    shown = []
    for key, parameter in inspect.signature(function).parameters.items():
        value = given.get(key, parameter.default)
        try:
            same = value is parameter.default or bool(value == parameter.default)
        except Exception:  # an object whose == is no bool
            same = False
        if same or key in ("reporter", "progress", "command"):
            continue
        if callable(value):  # a factory: as the trial processes import it
            value = f"{getattr(value, '__module__', '?')}:{getattr(value, '__qualname__', '?')}"
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        shown.append(f"{key}={value!r}")
    return hide_passwords(f"python: autotune.{function.__name__}({', '.join(shown)}) in {shell_quote(sys.argv[0] or 'python')}")
