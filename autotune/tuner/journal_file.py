"""Optuna's journal file, whose appends never build on a torn record.

A write cut short (a full disk, a process killed in the middle of one)
leaves the file's last line without its newline. Optuna's reader skips such
a last line, but its next append wrote onto it: the two records made one
line that is no JSON, inside the file, and from then on no reader could
read the study (its calibration and finished trials lost to a hand edit).
Here each append, under Optuna's own lock of the file, first cuts a torn
last line back to the last whole record, and so does a write that fails
(the whole records it wrote stay: another worker may have read them): the
file holds whole records only, and a rerun reads everything the study
measured. A file with no whole record that does not begin as one (a wrong
path to a file of one's own) is left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

__all__ = ["JournalFile", "journal_begins", "whole_size"]


class JournalFile(JournalFileBackend):
    """:class:`~optuna.storages.journal.JournalFileBackend` (its reader, its symlink lock, its records) whose appends
    keep the file to whole records (see the module docstring)."""

    def __init__(self, file_path: str) -> None:
        self._path = file_path
        self._held = JournalFileSymlinkLock(file_path)
        super().__init__(file_path, lock_obj=self._held)

    def append_logs(self, logs: list[dict[str, Any]]) -> None:
        """Append ``logs``, one JSON record a line, as Optuna does, after any torn last line is cut away.

        Raises:
            OSError: The write failed (a full disk); a record it left torn is cut away first, whole ones stay.
        """
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode("utf-8")
        self._held.acquire()
        try:
            _cut_torn_line(self._path)
            try:
                with open(self._path, "ab") as file:
                    file.write(text)
                    file.flush()
                    os.fsync(file.fileno())
            except OSError:  # whole records that made it stay (a reader may have read them); a torn one goes
                with contextlib.suppress(OSError):
                    _cut_torn_line(self._path)
                raise
        finally:
            self._held.release()


def _cut_torn_line(path: str) -> None:
    """Cut the file's last line back when it has no newline: a record a full disk or a kill cut short (Optuna's reader
    never yielded it). A file that holds no whole record and does not begin as one is no journal: left alone."""
    size = os.path.getsize(path)
    whole = whole_size(path, size)
    if whole == size:
        return
    if whole == 0:
        with open(path, "rb") as file:
            if file.read(len(_RECORD_START)) != _RECORD_START[:size]:
                return
    os.truncate(path, whole)


#: How every Optuna journal record begins (``json.dumps`` of a dict whose first key is the operation's code).
_RECORD_START = b'{"op_code":'


def whole_size(path: str, size: int | None = None) -> int:
    """The size of the file at ``path`` (``size`` bytes, read when not given) up to and including its last newline
    (0 when it holds none)."""
    with open(path, "rb") as file:
        position = os.path.getsize(path) if size is None else size
        if position:  # the usual end, a newline: one byte read
            file.seek(position - 1)
            if file.read(1) == b"\n":
                return position
        while position > 0:
            step = min(1 << 16, position)
            file.seek(position - step)
            found = file.read(step).rfind(b"\n")
            if found >= 0:
                return position - step + found + 1
            position -= step
    return 0


def journal_begins(path: str) -> bool:
    """Whether the file at ``path`` begins with an Optuna journal record (a JSON object with an ``op_code``), whole or
    cut short (a full disk, a kill on the first append: :class:`JournalFile` reads past it)."""
    try:
        with open(path, "rb") as file:
            line = file.readline(1 << 20)
        record = json.loads(line)
    except OSError:
        return False
    except ValueError:
        return line.startswith(b'{"op_code":')
    return isinstance(record, dict) and "op_code" in record
