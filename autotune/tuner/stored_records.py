"""A trial's setup and result read back from the study, refusing what autotune did not write there.

A study edited by hand (or written by another program) may hold a result that is not a JSON object of
:class:`~autotune.records.TrialResult`'s fields, or whose figures are not numbers: read as is, it failed far
from here, as an internal error, in ``autotune status``, ``autotune report`` or a resumed search.
"""

from __future__ import annotations

from typing import Any

from autotune.errors import AutotuneError
from autotune.records import TrialResult
from autotune.train_setup import TrainSetup

#: Result fields that hold text; every other one is a number or null (``windows``: a list of numbers).
_TEXT = ("status", "error", "mode")


class UnreadableRecord(Exception):
    """A trial's stored setup or result that autotune cannot read; the study turns it into a ``StorageError``."""


def stored_setup(number: int, data: Any) -> TrainSetup:
    """Trial ``number``'s stored setup.

    Raises:
        UnreadableRecord: Not a setup autotune wrote.
    """
    try:
        return TrainSetup.from_dict(data)
    except (AutotuneError, TypeError, ValueError) as exc:
        raise UnreadableRecord(f"trial #{number} holds an unreadable setup ({exc})") from None


def stored_result(number: int, data: Any) -> TrialResult:
    """Trial ``number``'s stored result: a JSON object of :class:`TrialResult`'s fields, its figures numbers or null.

    Raises:
        UnreadableRecord: Not a result autotune wrote.
    """
    try:
        result = TrialResult.from_dict(data)
    except (TypeError, ValueError) as exc:  # not an object, or unknown fields
        raise UnreadableRecord(f"trial #{number} holds an unreadable result ({exc})") from None
    bad = [k for k, v in data.items() if k not in (*_TEXT, "windows") and v is not None and not _number(v)]
    bad += [k for k in _TEXT if not isinstance(data.get(k, ""), (str, type(None))) or (k == "status" and not isinstance(data[k], str))]
    if not isinstance(data.get("windows", ()), (list, tuple)) or not all(_number(w) for w in result.windows):
        bad.append("windows")
    if bad:
        raise UnreadableRecord(f"trial #{number} holds an unreadable result (field {bad[0]!r}: {data.get(bad[0])!r})")
    return result


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
