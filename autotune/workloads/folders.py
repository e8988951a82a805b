"""What an ImageFolder directory given as ``--data`` holds, checked with the loader's own rules before any trial.

torchvision's ``ImageFolder`` takes every sub-directory as a class, hidden ones too, and finds images recursively by
extension. :func:`check_image_folder` runs its own ``find_classes`` and ``make_dataset``, refuses what would fail or
train on the wrong data (no class, an empty class, a link loop, the macOS metadata an archive made on a Mac unpacks),
and says what looks wrong but is allowed (one class, split folders or hidden folders taken as classes) and what the
folder holds.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import WorkloadError
from autotune.redact import shell_quote
from autotune.units import counted

__all__ = ["SPLITS", "FolderInfo", "check_image_folder", "folder_warning"]


@dataclass(frozen=True)
class FolderInfo:
    """What an ImageFolder directory holds.

    Attributes:
        classes: Class folders with at least one image.
        images: Image files over all class folders.
        warning: What looks wrong but is allowed (see :func:`folder_warning`), or None.
        summary: What it holds, in one line: images, classes, the files ImageFolder skips ("" where not counted).
    """

    classes: int
    images: int
    warning: str | None = None
    summary: str = ""


#: Folder names of dataset splits: as the only class folders, --data most likely names the level above the split.
SPLITS = frozenset({"train", "training", "val", "valid", "validation", "test", "testing"})


def folder_warning(root: Path, classes: list[str], samples: list[tuple[str, int]] | None = None) -> str | None:
    """What looks wrong with an ImageFolder's classes: one class only, split folders taken as classes, and hidden or
    system folders (``.thumbnails``, Synology's ``@eaDir``) read as classes or as images of a class."""
    said = []
    if classes and all(name.lower() in SPLITS for name in classes):
        split = next((n for n in classes if n.lower() in ("train", "training")), classes[0])
        said.append(f"the class folders of {root} are {', '.join(classes)}, which look like dataset splits: "
                    f"did you mean --data {shell_quote(str(root / split))}?")
    elif len(classes) == 1:
        said.append(f"{root} holds one class folder ({classes[0]}): every image gets the same label")
    twins = _same_folders(root, classes)
    if twins:
        said.append(f"class folders {' and '.join(twins[0])} of {root} are one directory (a symbolic link): its images are read "
                    f"twice, under {len(twins[0])} labels{'' if len(twins) == 1 else f' ({len(twins) - 1} more such group(s))'}")
    hidden = _hidden_warning(root, classes, samples or [])
    return "; ".join([*said, hidden] if hidden else said) or None


def _same_folders(root: Path, classes: list[str]) -> list[list[str]]:
    """Groups of class folders that resolve to one directory (``cats`` and a link ``cat`` to it)."""
    found: dict[str, list[str]] = {}
    for name in classes:
        found.setdefault(os.path.realpath(os.path.join(os.path.expanduser(os.fspath(root)), name)), []).append(name)
    return [names for names in found.values() if len(names) > 1]


#: Folders that file servers and operating systems add beside the user's (a NAS's thumbnails, a recycle bin).
SYSTEM_FOLDERS = frozenset({"@eaDir", "@Recycle", "@Recently-Snapshot", "#recycle", "#snapshot", "$RECYCLE.BIN",
                            "System Volume Information", "lost+found"})


def _hidden(name: str) -> bool:
    """A hidden folder (``.thumbnails``) or a system folder (Synology's ``@eaDir``, :data:`SYSTEM_FOLDERS`)."""
    return (name.startswith(".") and name not in (".", "..")) or name in SYSTEM_FOLDERS


def _relative_parts(root: Path, samples: list[tuple[str, int]], marks: re.Pattern[str]) -> list[list[str]]:
    """The paths below ``root``, split into their parts, of the samples whose path ``marks`` finds something in (a
    string search first: a million files in a fraction of a second, where splitting them all took over a second)."""
    prefix = os.path.join(os.path.expanduser(os.fspath(root)), "")  # as make_dataset joined them
    found = [path for path, _ in samples if marks.search(path)]
    return [(path[len(prefix):] if path.startswith(prefix) else os.path.relpath(path, root)).split(os.sep) for path in found]


_SEP = re.escape(os.sep)
#: A path with a hidden or system folder or file in it, or macOS metadata.
_HIDDEN_MARK = re.compile(f"{_SEP}(?:\\.|{'|'.join(re.escape(name) + _SEP for name in SYSTEM_FOLDERS)})")
_MACOS_MARK = re.compile(f"{_SEP}\\._|__MACOSX")


def _hidden_warning(root: Path, classes: list[str], samples: list[tuple[str, int]]) -> str | None:
    said = []
    hidden = [name for name in classes if _hidden(name)]
    if hidden:
        one = len(hidden) == 1
        said.append(f"{'a hidden or system folder' if one else 'hidden or system folders'} of {root} {'is' if one else 'are'} read "
                    f"as {'a class' if one else 'classes'} ({', '.join(hidden[:4])}{', ...' if len(hidden) > 4 else ''})")
    inside = [parts for parts in _relative_parts(root, samples, _HIDDEN_MARK) if not _hidden(parts[0]) and any(map(_hidden, parts[1:-1]))]
    if inside:
        one = len(inside) == 1
        said.append(f"{counted(len(inside), 'image')} in hidden or system folders inside class folders "
                    f"{'is read as an image of its class' if one else 'are read as images of their class'} "
                    f"({'/'.join(inside[0])}{'' if one else ', ...'})")
    if not said:
        return None
    return "; ".join(said) + ": ImageFolder takes them as any other; thumbnails or copies would train as data, so move them out"


#: The extensions of the files ImageFolder skipped, most common first, in a summary.
SHOWN_EXTENSIONS = 4


def _summary(root: Path, classes: list[str], images: int, skipped: Counter[str]) -> str:
    """``data: DIR: 78 images in 2 classes (cat, dog); 12 other files skipped, as ImageFolder skips them (.gif 4, ...)``
    (``skipped``: the extensions of the files that are no image's, counted)."""
    shown = ", ".join(classes[:6]) + (f", ... ({len(classes) - 6} more)" if len(classes) > 6 else "")
    line = f"data: {root}: {counted(images, 'image')} in {len(classes)} class{'es' if len(classes) != 1 else ''} ({shown})"
    if skipped:
        kinds = ", ".join(f"{ext} {n}" for ext, n in skipped.most_common(SHOWN_EXTENSIONS))
        more = ", ..." if len(skipped) > SHOWN_EXTENSIONS else ""
        line += f"; {counted(sum(skipped.values()), 'other file')} skipped, as ImageFolder skips them ({kinds}{more})"
    return line


def _macos_metadata(root: Path, classes: list[str], samples: list[tuple[str, int]]) -> None:
    """Refuse the AppleDouble files (``._name.jpg``) and ``__MACOSX`` folder that unpacking an archive made on a Mac
    leaves: ImageFolder reads them as images and fails on the first, one rerun per file."""
    junk = [parts for parts in _relative_parts(root, samples, _MACOS_MARK) if parts[-1].startswith("._") or "__MACOSX" in parts]
    folder = "__MACOSX" in classes
    if not junk and not folder:
        return
    parts = ([f"{counted(len(junk), 'macOS metadata file')} ('._' files such as {'/'.join(junk[0])})"]
             if junk else []) + (["a __MACOSX folder"] if folder else [])
    # -L: into linked class folders too (a link loop was refused before); quoted: a path with spaces must not split.
    nested = folder or any("__MACOSX" in parts for parts in junk)  # a class of its own, or inside a class
    where = shell_quote(f"./{root}" if str(root).startswith("-") else str(root))  # find reads -name... as a predicate
    removal = "; ".join(([f"find -L {where} -name '._*' -delete"] if junk else [])
                        + ([f"find -L {where} -name __MACOSX -prune -exec rm -rf {{}} +"] if nested else []))
    raise WorkloadError(f"data directory {root} holds {' and '.join(parts)}, which unpacking an archive made on a Mac leaves: not "
                        f"images, but ImageFolder reads them as images (or a class) and fails on them; remove them ({removal}) "
                        "and rerun")


def check_data_path(path: str | Path) -> Path:
    """``path`` as a Path once it names a directory: checked before anything is imported or listed (a mistyped
    ``--data`` is said at once, not after torchvision's import, seconds on a busy machine).

    Raises:
        WorkloadError: Missing, or not a directory.
    """
    root = Path(path)
    if not root.exists():
        raise WorkloadError(f"data directory {root} does not exist")
    if not root.is_dir():
        raise WorkloadError(f"data path {root} is not a directory")
    return root


def check_image_folder(path: str | Path) -> FolderInfo:
    """Check an ImageFolder directory with the rules of the loader itself; count its classes and images.

    torchvision's ``ImageFolder`` (whose own ``find_classes`` and
    ``make_dataset`` run here) takes every sub-directory as a class, hidden
    ones too, finds images recursively by extension and fails on a class
    without one; so does this check, before any trial runs.

    Raises:
        WorkloadError: Missing, not a directory, no class directory, or a
            class directory without images (named).
    """
    root = check_data_path(path)
    loop = _symlink_loop(root)
    if loop is not None:
        raise WorkloadError(f"data directory {root}: {loop} links to {loop.resolve()}, which holds the link itself: ImageFolder "
                            "follows it and reads the same images again, round after round; remove the link")
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

    try:
        classes, class_to_idx = find_classes(root)
        skipped: Counter[str] = Counter()

        def image(file: str) -> bool:  # ImageFolder's rule (an image extension); the files it skips, counted
            if file.lower().endswith(IMG_EXTENSIONS):
                return True
            skipped[Path(file).suffix.lower() or "no extension"] += 1
            return False

        samples = make_dataset(root, class_to_idx, is_valid_file=image, allow_empty=True)
    except FileNotFoundError:
        loose = sum(1 for entry in os.scandir(root) if entry.name.lower().endswith(IMG_EXTENSIONS))
        here = (f": its {loose} image{'' if loose == 1 else 's'} lie in it directly; move them into one folder per class"
                if loose else "")
        raise WorkloadError(
            f"data directory {root} holds no class directory (ImageFolder layout: DIR/<class>/<image>.jpg){here}"
        ) from None
    except OSError as exc:
        raise WorkloadError(f"data directory {root} cannot be read: {exc.strerror or exc}") from None
    _macos_metadata(root, classes, samples)
    used = {index for _, index in samples}
    empty = [name for name in classes if class_to_idx[name] not in used]
    if empty:
        more = f" (and {len(empty) - 1} more)" if len(empty) > 1 else ""
        raise WorkloadError(
            f"class directory {root / empty[0]}{more} holds no images ({', '.join(IMG_EXTENSIONS)}); "
            "torchvision's ImageFolder takes every sub-directory of --data as a class, hidden ones too: "
            "remove it or move it out"
        )
    return FolderInfo(classes=len(classes), images=len(samples), warning=folder_warning(root, classes, samples),
                      summary=_summary(root, classes, len(samples), skipped))


def _symlink_loop(root: Path) -> Path | None:
    """A directory link under ``root`` that leads back to a directory on its own path, or None: to itself or a directory
    that holds it, through one link or several (two folders linking to each other; a loop inside a linked class folder).

    ImageFolder walks the tree following links: through such a link it enters
    the same directories again until the path is too long (14 files counted
    574 times in one tree, docs/faults.md). This walk follows links as it
    does, but ends at the first directory met again on its own path.
    """
    chains: dict[str, frozenset[str]] = {str(root): frozenset({os.path.realpath(root)})}
    for directory, names, _ in os.walk(root, followlinks=True, onerror=lambda _: None):
        chain = chains.pop(directory, frozenset())
        for name in names:
            path = os.path.join(directory, name)
            real = os.path.realpath(path)
            if any(seen == real or seen.startswith(real.rstrip(os.sep) + os.sep) for seen in chain):  # or above --data
                return Path(path)
            chains[path] = chain | {real}
    return None
