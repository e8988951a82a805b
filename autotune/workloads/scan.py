"""The other images of a folder that fail to decode, once a trial met one.

A trial stops at the first image it cannot decode, so a folder with two such files took two reruns, each after the
calibration again. When a search stops on one, the rest of the folder is checked in the order ``ImageFolder`` lists it,
for at most :data:`SCAN_SECONDS`: JPEGs decoded at an eighth of their size (libjpeg still reads every byte, so a
truncated file fails as in a trial, about 1 ms a file), other formats whole.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.records import Workload

#: How long the check may take: about 10,000 JPEGs of ImageNet's size on one core.
SCAN_SECONDS = 15.0
#: Files named in the line; the rest are counted, and all listed in :data:`LIST_FILE` in the search's --out.
NAMED = 5
#: Where a search stopped by bad images lists every one it found, one path a line, where the line names only some.
LIST_FILE = "bad-files.txt"


@dataclass(frozen=True)
class Scan:
    """What the check found.

    Attributes:
        bad: The files that fail to decode, the one already named left out.
        checked: The files checked, that one left out.
        total: The folder's image files, that one left out.
        seconds: The time the check was given.
        named: The file the trial named ("" where the folder's listing holds none it names).
    """

    bad: list[str] = field(default_factory=list)
    checked: int = 0
    total: int = 0
    seconds: float = SCAN_SECONDS
    named: str = ""

    def words(self) -> str:
        """The finding as the end of the search's line (``; 2 of the other 63 files also fail to decode: a, b``)."""
        if self.checked == 0:  # nothing else to check, or no time to
            return ""
        others = "the other file" if self.total == 1 else f"the other {self.total:,} files"
        first = "the first" if self.checked == 1 else f"the first {self.checked:,}"
        scope = others if self.checked == self.total else f"{first} of {others} (checked for {self.seconds:g} s)"
        if not self.bad:
            return f"; {scope} decode" if self.checked > 1 else f"; {scope} decodes"
        named = ", ".join(self.bad[:NAMED]) + (f" and {len(self.bad) - NAMED:,} more" if len(self.bad) > NAMED else "")
        which = scope if self.total == 1 else f"{len(self.bad):,} of {scope}"
        return f"; {which} also {'fails' if len(self.bad) == 1 else 'fail'} to decode: {named}"


#: How a DDP trial's error begins: the rank whose loader met the file.
RANK_PREFIX = re.compile(r"^rank \d+: ")


def _unranked(error: str) -> str:
    """The trial's ``error`` without a DDP trial's ``rank N: ``."""
    return RANK_PREFIX.sub("", error, count=1)


def named_first(error: str, path: str) -> bool:
    """Whether the trial's ``error`` begins by naming ``path`` (``PATH: cannot decode ...``, a DDP trial's rank aside)."""
    return _unranked(error).startswith(f"{path}: ")


def names_a_file(error: str, root: str | Path) -> bool:
    """Whether the trial's ``error`` begins with a path inside the folder ``root`` (not the folder's own words, such as
    a count that changed while the search ran)."""
    return _unranked(error).startswith(os.path.join(str(root), ""))


def decodes(path: str) -> bool:
    """Whether the image file at ``path`` decodes as a trial's loader reads it (JPEGs at an eighth of their size)."""
    from PIL import Image

    from autotune.workloads.data import check_regular_file, rgb

    try:
        check_regular_file(path)
        with Image.open(path) as image:
            image.draft("RGB", (1, 1))  # the smallest scale libjpeg offers; other formats ignore it
            image.load()
            rgb(image)
    except Exception:  # whatever PIL, the OS or the check raises: a file a trial cannot read
        return False
    return True


def other_bad_images(root: str | Path, error: str, seconds: float | None = None) -> Scan:
    """The image files under ``root`` (as ``ImageFolder`` lists them) that fail to decode, but for the one ``error``
    names.

    Args:
        root: The data directory.
        error: The trial's words (``PATH: cannot decode (...)``): the file they begin with is not checked again.
        seconds: How long the check may take (None: :data:`SCAN_SECONDS`, read as it is called); the files left are
            counted, not checked.

    Returns:
        What was found; an empty :class:`Scan` where the folder cannot be listed.
    """
    from torchvision.datasets import ImageFolder

    try:
        listed = [path for path, _ in ImageFolder(str(root), loader=str).samples]
    except (OSError, RuntimeError, FileNotFoundError):  # gone or emptied meanwhile: the trial's line says enough
        return Scan()
    named = next((path for path in listed if named_first(error, path)), "")
    paths = [path for path in listed if path != named]
    seconds = SCAN_SECONDS if seconds is None else seconds
    deadline = time.monotonic() + seconds
    bad: list[str] = []
    checked = 0
    for path in paths:
        if time.monotonic() >= deadline:  # 0 s checks none, however coarse the clock
            break
        checked += 1
        if not decodes(path):
            bad.append(path)
    return Scan(bad=bad, checked=checked, total=len(paths), seconds=seconds, named=named)


def others_of(workload: Workload, error: str) -> Scan:
    """The other images of the user's folder that fail to decode, where the trial's ``error`` names one of its files
    (not one removed meanwhile, nor the folder's own words: a count that changed; a Task reads its own data)."""
    from autotune.workloads.data import MISSING

    data = workload.data
    if workload.task is not None or data is None or MISSING in error or not names_a_file(error, data):
        return Scan()
    return other_bad_images(data, error)


def write_list(out: Path, found: Scan, root: str | Path) -> str:
    """Every bad file of the folder ``root`` the trial and the check found (the trial's first), one a line, in
    ``out``/:data:`LIST_FILE` where the line names only :data:`NAMED` of them (a folder of 156 such files took a rerun
    for each five).

    Returns:
        `` (all N listed in PATH)`` to add to the line, or "" where it names them all or the file cannot be written.
    """
    path = out / LIST_FILE
    if len(found.bad) <= NAMED or (path.exists() and not stale_list(out, root)):  # a file of that name the user keeps: left alone
        return ""
    try:
        path.write_text("".join(f"{line}\n" for line in [found.named, *found.bad] if line), encoding="utf-8", errors="surrogateescape")
    except OSError:
        return ""
    listed = len(found.bad) + bool(found.named)
    return f" (all {listed:,} listed in {path})" if found.checked == found.total else f" (the {listed:,} found listed in {path})"


def stale_list(out: Path, root: str | Path | None) -> bool:
    """Whether ``out``/:data:`LIST_FILE` is an earlier stop's list for the folder ``root``: every line a path inside it
    (a file of that name the user keeps there is left alone)."""
    try:
        lines = (out / LIST_FILE).read_text(encoding="utf-8", errors="surrogateescape").splitlines()
    except OSError:
        return False
    inside = os.path.join(str(root), "") if root is not None else None
    return bool(lines) and inside is not None and all(line.startswith(inside) for line in lines)
