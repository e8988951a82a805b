"""Parsing and printing sizes such as ``20GiB``, counts, and numbers given as NumPy's.

Printing has one implementation for the whole project,
:func:`probes.units.format_bytes`, re-exported here.
"""

from __future__ import annotations

import re

from autotune.errors import UsageError
from probes.units import format_bytes

__all__ = ["as_float", "counted", "format_bytes", "parse_size", "plain_float", "plain_int"]

_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
#: Larger than any machine's memory; a bigger number is a typo.
MAX_SIZE = 2**60
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*\Z")


def parse_size(text: str) -> int:
    """Parse ``"20GiB"``, ``"512MB"``, ``"1.5G"`` (decimal units: 1.5e9 bytes) or a plain byte count of 1 MiB or more.

    Raises:
        UsageError: Not a positive size, or a plain number under 1 MiB (a unit left out).
    """
    match = _SIZE.match(text)
    if not match or match.group(2).lower() not in _UNITS:
        raise UsageError(f"not a memory size: {text[:40]!r} (examples: 20GiB, 512MiB, 8G)")
    number = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not number < MAX_SIZE:
        raise UsageError(f"memory size too large: {text[:40]!r} (at most 1 EiB)")
    value = int(number)
    if value <= 0:
        raise UsageError(f"memory size must be > 0, got {text!r}")
    if not match.group(2) and value < 2**20:  # "20" meant 20 GiB: as 20 bytes, it failed after a minute of memory pre-pass
        raise UsageError(f"memory size {text.strip()!r} has no unit, so it is {counted(value, 'byte')}: write one (20GiB, 512MiB)")
    return value


_INT = re.compile(r"\s*[+-]?[0-9]+\s*\Z")


def plain_int(text: str) -> int | None:
    """``text`` as an integer where it is written in ASCII digits with an optional sign, else None (``int()`` would also
    read ``1_0`` as 10, and other scripts' digits)."""
    return int(text) if _INT.match(text) else None


def plain_float(text: str) -> float | None:
    """``text`` as a float where ``float()`` reads it and it holds no ``_`` and only ASCII (``float()`` would read ``1_0``
    as 10.0, and other scripts' digits), else None; ``nan`` and ``inf`` read, for the option's own range check to refuse."""
    try:
        return float(text) if text.isascii() and "_" not in text else None
    except ValueError:
        return None


def counted(count: int, noun: str) -> str:
    """``1 sample``, ``2 samples``: ``count`` and ``noun``, plural unless the count is one (the noun takes an ``s``)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def as_float(number: object) -> float:
    """A real number (Python's, NumPy's, a Fraction) as Python's float, through its text where that reads back: NumPy's
    float32 0.01 is 0.01, as the caller wrote it and best.json shows it, not 0.009999999776482582 (a Fraction's text,
    1/100, does not read back: its value then)."""
    if isinstance(number, (int, float)):
        return float(number)
    try:
        return float(str(number))
    except ValueError:
        return float(number)  # type: ignore[arg-type]
