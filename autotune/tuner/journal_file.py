"""Optuna's journal file, whose appends never build on a torn record.

A write cut short (a full disk, a process killed in the middle of one)
leaves the file's last line without its newline. Optuna's reader skips such
a last line, but its next append wrote onto it: the two records made one
line that is no JSON, inside the file, and from then on no reader could
read the study (its calibration and finished trials lost to a hand edit).
Here each append, under Optuna's own lock of the file, first cuts a torn
last line back to the last whole record, and a write that fails is cut back
to where it began: the file holds whole records only, and a rerun reads
everything the study measured.
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
            OSError: The write failed (a full disk); the file is cut back to its whole records first.
        """
        text = "".join(json.dumps(log, separators=(",", ":")) + "\n" for log in logs).encode("utf-8")
        self._held.acquire()
        try:
            whole = whole_size(self._path)
            if whole != os.path.getsize(self._path):
                os.truncate(self._path, whole)
            try:
                with open(self._path, "ab") as file:
                    file.write(text)
                    file.flush()
                    os.fsync(file.fileno())
            except OSError:
                with contextlib.suppress(OSError):
                    os.truncate(self._path, whole)
                raise
        finally:
            self._held.release()


def whole_size(path: str) -> int:
    """The size of the file at ``path`` up to and including its last newline (0 when it holds none)."""
    with open(path, "rb") as file:
        end = file.seek(0, os.SEEK_END)
        position = end
        while position > 0:
            step = min(1 << 16, position)
            file.seek(position - step)
            found = file.read(step).rfind(b"\n")
            if found >= 0:
                return position - step + found + 1
            position -= step
    return 0


def journal_begins(path: str) -> bool:
    """Whether the file at ``path`` begins with an Optuna journal record (a JSON object with an ``op_code``)."""
    try:
        with open(path, "rb") as file:
            record = json.loads(file.readline(1 << 20))
    except (OSError, ValueError):
        return False
    return isinstance(record, dict) and "op_code" in record
