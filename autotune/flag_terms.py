"""A setup refusal in the words of the command line: the knobs it names as the flags (or ``--set``) that set them.

:class:`~autotune.train_setup.TrainSetup` refuses a setup in its knobs' names (``num_workers must be >= 0``); a user
typed ``autotune trial --workers -1`` or ``autotune search --set num_workers=-1``.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from autotune.errors import SetupError
from autotune.train_setup import KNOBS

# A knob's name as a setup refusal writes it, bare or as KNOB=VALUE; not inside another word, a quoted value or torch.compile.
_KNOB = re.compile(r"(?<![\w.'\"=-])(" + "|".join(KNOBS) + r")(?:=([^\s;:,)]+))?(?![\w=-])")


def in_flag_terms(error: SetupError, pinned: Collection[str], flags: Mapping[str, str] | None = None) -> SetupError:
    """``error`` naming the flags that set the knobs it names.

    With ``flags={"num_workers": "--workers"}``, ``num_workers must be >= 0`` becomes ``--workers must be >= 0`` and
    ``num_workers=2`` becomes ``--workers 2``; a knob pinned with ``--set`` (or without a flag of its own) reads
    ``--set KNOB`` or ``--set KNOB=VALUE``.

    Args:
        error: The refusal, worded for the :class:`~autotune.train_setup.TrainSetup`'s knobs.
        pinned: The knobs the command line set with ``--set``.
        flags: The command's own flag of each knob that has one (none: every knob is a ``--set``).

    Returns:
        The refusal in those words, or ``error`` itself when it names no knob.
    """
    own = flags or {}

    def named(found: re.Match[str]) -> str:
        knob, value = found.group(1), found.group(2)
        if knob in own and knob not in pinned:
            return own[knob] if value is None else f"{own[knob]} {value}"
        return f"--set {knob}" if value is None else f"--set {knob}={value}"

    message = _KNOB.sub(named, str(error))
    return error if message == str(error) else type(error)(message)
