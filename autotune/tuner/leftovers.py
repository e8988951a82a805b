"""What a search that failed before measuring anything leaves behind: nothing.

A model that fails in its first calibration run, or a ``--max-memory`` that
fits no batch, is found only by running it, after the study was opened (and
``--out`` made). Its error tells the user what to change; an empty study kept
in ``--out`` would then make ``autotune report`` ask which of several studies
to read, though none holds anything, and a changed ``--image-size`` on that
``--out`` would be refused. The runs of a calibration that stopped there are
kept only when the error says to rerun the same command (:class:`DataError`:
the data fixed in place); a study whose storage failed is left untouched.
The synthetic JPEGs are written after the study is opened (its signature may
refuse the workload first): a failure or an interrupt while they are written
leaves no empty study either.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autotune.errors import AutotuneError, DataError, SearchInterrupted, StorageError
from autotune.tuner.storage import CONNECTION_ERRORS
from autotune.tuner.study import SearchStudy
from autotune.workloads.scan import LIST_FILE


@contextmanager
def nothing_left_if_nothing_measured(study: SearchStudy, made_out: Path | None, shared: bool) -> Iterator[None]:
    """On an :class:`AutotuneError`, remove the study if it holds no calibration and no trial.

    An interrupt (Ctrl-C) leaves it: its message says to rerun the same command; so does a :class:`DataError` when
    calibration runs were kept. A :class:`StorageError` leaves the storage alone.

    Args:
        study: The search's study.
        made_out: The output directory when this search made it (removed whole then), else None.
        shared: A study shared by several workers stays: another may be calibrating it.
    """
    try:
        yield
    except AutotuneError as exc:
        if isinstance(exc, (SearchInterrupted, StorageError)) or shared:
            raise
        empty, held = False, True
        try:
            empty = study.measured_nothing() if isinstance(exc, DataError) else study.holds_nothing()
            held = not study.holds_nothing()  # a finished calibration or a trial: the data's size is the study's
            if empty and made_out is not None:
                _remove_all_but_the_list(made_out)
            elif empty:
                study.delete()
        except CONNECTION_ERRORS:  # the storage failed meanwhile: the error already raised is the one to say
            pass
        if isinstance(exc, DataError) and exc.alone != str(exc) and not held:
            # No study is left whose data size a rerun must keep, or only an unfinished calibration's runs, which a
            # rerun for another size drops (SearchStudy.check_signature): the same --out takes the data without the file.
            raise DataError(exc.alone + ("" if empty else exc.if_recalibrated)) from None
        raise


@contextmanager
def nothing_left_if_stopped(study: SearchStudy, shared: bool) -> Iterator[None]:
    """On any error or interrupt (Ctrl-C too), remove the study if it holds nothing measured.

    For the steps between opening the study and its first measurement, whose
    interruption leaves nothing to resume (the synthetic JPEGs being written).

    Args:
        study: The search's study, claimed by this search.
        shared: A study shared by several workers stays: another may be calibrating it.
    """
    try:
        yield
    except BaseException:
        if not shared and study.measured_nothing():
            study.release()  # before it is gone (releasing again later does nothing)
            study.delete()
        raise


def _remove_all_but_the_list(out: Path) -> None:
    """Remove the directory this search made, but for the list of bad images a stop wrote there (named in its line)."""
    if not (out / LIST_FILE).is_file():
        shutil.rmtree(out, ignore_errors=True)
        return
    for entry in out.iterdir():
        if entry.name == LIST_FILE:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                entry.unlink()
