"""The search's trial runner: every trial's time accounted, and the trial
outcomes that stop a search (an interrupted trial, bad data) turned into the
exceptions that stop it."""

from __future__ import annotations

import re
import time
from pathlib import Path

from autotune.errors import DataError
from autotune.records import TrialOptions, TrialResult, Workload
from autotune.runner import TrialRunner, WindowCallback
from autotune.train_setup import TrainSetup
from autotune.tuner.config import Timing
from autotune.tuner.signals import raise_if_stopped, remember_stop
from autotune.workloads.data import MISSING, synthetic_dir
from autotune.workloads.scan import names_a_file, others_of, write_list


class TimedRunner:
    """Wraps a trial runner to account the measured time of a search, and to stop it: a trial that ended
    ``interrupted`` raises ``KeyboardInterrupt``, one that found the data gone or bad raises
    :class:`~autotune.errors.DataError` (the same command resumes once the data is fixed)."""

    def __init__(self, runner: TrialRunner, timing: Timing) -> None:
        self.runner = runner
        self.timing = timing
        #: The search's --out, once prepared: where many bad images are listed (:func:`~autotune.workloads.scan.write_list`).
        self.out: Path | None = None

    def __call__(
        self,
        setup: TrainSetup,
        workload: Workload,
        options: TrialOptions | None = None,
        *,
        on_window: WindowCallback | None = None,
    ) -> TrialResult:
        """Run the trial and account its process time to the current phase.

        Raises:
            KeyboardInterrupt: Something outside terminated the trial: the
                search stops as on Ctrl-C and stores nothing for it.
            DataError: The data directory is gone (:func:`data_gone`), a data file cannot be decoded, or a dataset item
                raises while a batch is assembled: the search stops naming it
                (every setup fast enough to reach it would fail).
        """
        raise_if_stopped()
        began = time.monotonic()
        try:
            result = self.runner(setup, workload, options, on_window=on_window)
        except BaseException:  # Ctrl-C met while the trial ran: its time is the stop's, not the sampler's or the storage's
            self.timing.add(TrialResult(status="interrupted"), time.monotonic() - began)
            raise
        self.timing.add(result, time.monotonic() - began)
        if result.status == "interrupted":  # the search stops as on Ctrl-C, and its line says what stopped the trial
            remember_stop(result.error or "a trial was terminated from outside")
            raise KeyboardInterrupt
        raise_if_stopped()  # a Ctrl-C whose KeyboardInterrupt was dropped during the trial
        if result.status not in ("ok", "pruned") and (gone := data_gone(workload)) is not None:
            raise DataError(gone)  # not the setup's failure: stop before it is stored as one
        if result.status == "bad_data":
            found = others_of(workload, result.error or "")
            listed = write_list(self.out, found, workload.data) if self.out is not None and workload.data is not None else ""
            advice, if_kept = bad_data_advice(workload, result.error, several=bool(found.bad))
            raise DataError(f"bad data: {result.error}{found.words()}{listed}; {advice}", if_kept=if_kept,
                            if_recalibrated=_them(RECALIBRATE_NOTE, bool(found.bad)) if if_kept else "")
        return result


def data_gone(workload: Workload) -> str | None:
    """Why every trial from now on fails, when the data directory it reads is no longer there (removed or unmounted
    while the search ran); None while it is (a Task reads its own data)."""
    if workload.task is not None:
        return None
    root = Path(workload.data) if workload.data is not None else synthetic_dir(workload.cache_dir, workload.synthetic_images)
    if root.is_dir():
        return None
    if workload.data is None:
        return (f"the synthetic JPEGs in {root} are gone (removed while the search ran): rerun the same command "
                "(it writes them again, the same files; finished trials are kept)")
    return (f"data directory {root} is gone (removed, moved or unmounted while the search ran): put it back and rerun the "
            "same command (finished trials are kept)")


def bad_data_advice(workload: Workload, error: str | None = None, *, several: bool = False) -> tuple[str, str]:
    """What to do about a file or record that cannot be read (``error``, the trial's words), and what to add while the
    study holds a measurement: the user's own is fixed in place (removed, the data's size changes, which that study was
    made for: :data:`SIZE_NOTE`), or put back where it was removed while the search ran; the synthetic JPEGs autotune
    wrote are written again. ``several``: other files of the folder fail too (:mod:`autotune.workloads.scan`)."""
    if workload.task is None and workload.data is None:
        where = synthetic_dir(workload.cache_dir, workload.synthetic_images)
        return (f"the synthetic JPEGs in {where} are damaged: remove that directory and rerun the same command "
                "(it writes them again, the same files; finished trials are kept)"), ""
    if workload.task is None and MISSING in (error or ""):  # listed by the trial, gone as it read it
        return "files were removed while the search ran: put them back and rerun the same command (finished trials are kept)", ""
    if workload.task is None and workload.data is not None and not names_a_file(error or "", workload.data):  # its count changed
        return "then rerun the same command (finished trials are kept)", ""
    return f"fix or replace {_them('it', several)} in place and rerun the same command (finished trials are kept)", _them(SIZE_NOTE, several)


def _them(words: str, several: bool) -> str:
    """``words`` of one file said of several (``it`` as ``them``)."""
    return re.sub(r"\bit\b", "them", words) if several else words


#: Said of bad user data while the study holds a measurement: its signature counts the samples.
SIZE_NOTE = ("; removing it changes the number of samples the study was made for, so a rerun without it needs another --out "
             "(with --storage: another --study)")
#: Said instead while the study holds only runs of an unfinished calibration: a rerun for another size drops them.
RECALIBRATE_NOTE = "; removing it works too: the same command then measures the calibration again"
