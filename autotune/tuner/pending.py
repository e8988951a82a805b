"""A measured trial the study storage could not take, kept beside the search's output until a rerun adds it.

When storing a trial that was already measured fails (a shared storage lost for longer than
:func:`~autotune.tuner.storage.with_retries` waits, a stop during those retries, a full disk under ``study.db``), the
measurement is written to ``OUT/pending-trials.json`` (:func:`kept_pending`) with everything needed to tell it later:
its params and their Optuna distributions, its user attributes, setup and result. The rerun of the same command adds
each one to the study before any new trial starts (:func:`add_pending`), fails the trial it ran as if that is still
running, then removes it from the file: nothing measured is measured twice or lost. Where another worker measured
a queued copy of that trial meanwhile (or measures it now), the copy counts instead and the record is not added:
both counted toward ``--trials``.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import distribution_to_json, json_to_distribution
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import AutotuneError, PendingTrialsError, StorageError
from autotune.files import atomic_write_text, read_json
from autotune.records import TrialResult
from autotune.redact import hide_url_password
from autotune.train_setup import TrainSetup
from autotune.tuner.budget import ATTR_FREE, FINISHED
from autotune.tuner.storage import storage_failures_said, with_retries
from autotune.tuner.storage_urls import is_shared
from autotune.tuner.stored_records import UnreadableRecord, stored_result, stored_setup
from autotune.tuner.study import ATTR_MARKER, ATTR_RESULT, ATTR_REUSED_FROM, ATTR_ROLE, ATTR_SETUP, ATTR_WORKER, SearchStudy

#: The file, in ``--out``, of the measured trials a rerun adds to the study.
PENDING_FILE = "pending-trials.json"
#: Version of the file's layout.
FORMAT = 1
#: System attribute of a trial added from the file: its :attr:`PendingTrial.key`, so it is never added twice.
SYSTEM_PENDING = "pending_trial"
#: System attribute Optuna and :class:`~autotune.tuner.workers.Crew` put on a failed trial's queued copy.
SYSTEM_FAILED_TRIAL = "failed_trial"


@dataclass(frozen=True)
class PendingTrial:
    """One measured trial the study could not store.

    Attributes:
        study: The study's name.
        storage: Its storage URL, password hidden.
        number: The trial's number in the study (left running there, or failed).
        params: Its Optuna params.
        distributions: Each param's Optuna distribution, as Optuna's JSON.
        fixed_params: The params it was queued with (a defaults or guess trial), empty when sampled.
        intermediate_values: The windows it reported to the pruner, as ``[step, samples/s]`` pairs.
        attrs: Its user attributes before the record (its worker, a neighbour move's or a parallel trial's start and end).
        role: What the trial was for (``defaults``, ``guess``, ``search``, ...).
        setup: The setup it ran (:meth:`TrainSetup.to_dict`).
        result: What it measured (:meth:`TrialResult.to_dict`).
        reused_from: The trial whose measurement it reused, if any.
        free: Whether it uses up no trial of ``--trials``.
        key: This record's own id: a rerun adds it once, even if removing it from the file failed.
    """

    study: str
    storage: str
    number: int
    params: dict[str, Any]
    distributions: dict[str, str]
    fixed_params: dict[str, Any]
    intermediate_values: list[list[float]]
    attrs: dict[str, Any]
    role: str
    setup: dict[str, Any]
    result: dict[str, Any]
    reused_from: int | None = None
    free: bool = False
    key: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def of(cls, study: SearchStudy, trial: optuna.Trial, role: str, setup: TrainSetup, result: TrialResult,
           reused_from: int | None, free: bool, **attrs: Any) -> PendingTrial:
        """The record of ``trial``, read from what this process holds of it (the storage is not asked: it is gone).

        Args:
            study: The trial's study.
            trial: The trial, asked from it.
            role: As for :meth:`SearchStudy.record`.
            setup: The same.
            result: The same.
            reused_from: The same.
            free: The same.
            **attrs: User attributes to add to those the trial holds (a parallel trial's start and end).
        """
        frozen = trial._cached_frozen_trial
        return cls(
            study=study.name, storage=hide_url_password(study.storage), number=trial.number, params=dict(frozen.params),
            distributions={name: distribution_to_json(d) for name, d in frozen.distributions.items()},
            fixed_params=dict(frozen.system_attrs.get("fixed_params", {})),
            intermediate_values=[[step, value] for step, value in sorted(frozen.intermediate_values.items())],
            attrs={**frozen.user_attrs, **attrs}, role=role, setup=setup.to_dict(), result=result.to_dict(),
            reused_from=reused_from, free=free,
        )

    @classmethod
    def from_dict(cls, data: Any) -> PendingTrial:
        """A record read back from the file.

        Raises:
            ValueError: Not a record this module wrote (a field missing, unknown or of the wrong type).
        """
        if not isinstance(data, dict):
            raise ValueError("not an object")
        try:
            entry = cls(**data)
        except TypeError as exc:
            raise ValueError(str(exc).replace("__init__() ", "")) from None
        texts, objects = (entry.study, entry.storage, entry.role, entry.key), (entry.params, entry.distributions, entry.attrs)
        if not all(isinstance(t, str) for t in texts) or not all(isinstance(o, dict) for o in (*objects, entry.fixed_params)):
            raise ValueError("a field of the wrong type")
        if not isinstance(entry.number, int) or not isinstance(entry.free, bool) or not isinstance(entry.intermediate_values, list):
            raise ValueError("a field of the wrong type")
        try:
            stored_setup(entry.number, entry.setup)
            stored_result(entry.number, entry.result)
            entry.frozen()
        except (UnreadableRecord, TypeError, ValueError, KeyError) as exc:
            raise ValueError(str(exc)) from None
        return entry

    def user_attrs(self) -> dict[str, Any]:
        """The user attributes of the trial as :meth:`SearchStudy.record` stores them."""
        attrs = {k: v for k, v in self.attrs.items() if k not in (ATTR_REUSED_FROM, ATTR_FREE, ATTR_ROLE, ATTR_SETUP, ATTR_RESULT)}
        if self.reused_from is not None:
            attrs[ATTR_REUSED_FROM] = self.reused_from
        if self.free:
            attrs[ATTR_FREE] = True
        return {**attrs, ATTR_ROLE: self.role, ATTR_SETUP: self.setup, ATTR_RESULT: self.result}

    def frozen(self) -> FrozenTrial:
        """The finished trial to add: as :meth:`SearchStudy.tell` tells it (pruned, or complete with its samples/s)."""
        result = TrialResult.from_dict(self.result)
        pruned = result.status == "pruned"
        system: dict[str, Any] = {SYSTEM_PENDING: self.key}
        if self.fixed_params:
            system["fixed_params"] = self.fixed_params
        return optuna.trial.create_trial(
            state=TrialState.PRUNED if pruned else TrialState.COMPLETE,
            value=None if pruned else (result.samples_per_s if result.ok and result.samples_per_s else 0.0),
            params=self.params, distributions={n: json_to_distribution(d) for n, d in self.distributions.items()},
            user_attrs=self.user_attrs(), system_attrs=system,
            intermediate_values={int(step): float(value) for step, value in self.intermediate_values},
        )


def pending_file(out: Path) -> Path:
    """Where the search of ``out`` keeps its measured trials the study could not store."""
    return out / PENDING_FILE


def read_pending(out: Path) -> list[PendingTrial]:
    """The records in ``out``'s pending file; none when there is no file.

    Raises:
        PendingTrialsError: The file cannot be read or is not one autotune wrote, in one line.
    """
    file = pending_file(out)
    if not file.exists():
        return []
    advice = (": it holds trials measured before the study storage was lost; restore it (or move it away to give those "
              "trials up, a rerun then measures them again) and rerun the same command")
    try:
        data = read_json(file, PendingTrialsError)
    except PendingTrialsError as exc:
        raise PendingTrialsError(f"{exc}{advice}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("trials"), list):
        raise PendingTrialsError(f"{file}: not a file of pending trials autotune wrote (format {FORMAT}){advice}")
    entries = []
    for index, item in enumerate(data["trials"]):
        try:
            entries.append(PendingTrial.from_dict(item))
        except ValueError as exc:
            raise PendingTrialsError(f"{file}: entry {index + 1} is unreadable ({str(exc)[:200]}){advice}") from None
    return entries


def _write(out: Path, entries: list[PendingTrial]) -> None:
    """Replace the pending file with ``entries`` (removed when none), durably: a temporary file, fsync, rename, the
    directory synced."""
    file = pending_file(out)
    if entries:
        atomic_write_text(file, json.dumps({"format": FORMAT, "trials": [asdict(e) for e in entries]}, indent=1) + "\n")
    else:
        file.unlink(missing_ok=True)
    directory = os.open(out, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def kept_pending(out: Path, entry: PendingTrial, error: AutotuneError) -> StorageError:
    """Keep ``entry`` in ``out``'s pending file (after any kept before); the error to raise: ``error``'s line saying so.

    Args:
        out: The search's output directory.
        entry: The measured trial the study could not store.
        error: What storing it met (one line).
    """
    file = pending_file(out)
    try:
        _write(out, [*read_pending(out), entry])
    except (OSError, PendingTrialsError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return StorageError(f"{error}; trial #{entry.number}, measured meanwhile, could not be kept in {file} ({why}): a rerun "
                            "measures it again")
    return StorageError(f"{error}; trial #{entry.number}, measured meanwhile, is kept in {file} and added to the study on rerun")


def add_pending(study: SearchStudy, out: Path, say: Callable[[str], None]) -> list[int]:
    """Add the measured trials ``out``'s pending file holds for ``study`` to it; then remove them from the file.

    Call it before any new trial starts. The trial each one ran as is failed if it is still running and was this
    search's (the same worker); a queued copy of it (a worker or Optuna's heartbeat check failed it meanwhile) is
    failed too while it waits, so it is not measured again. A record added before (its file not rewritten then) is not
    added twice, nor one whose trial the study holds finished, nor one whose queued copy another worker measured
    meanwhile or measures now (that copy counts toward ``--trials``; said in one line): before, both counted.

    Returns:
        The numbers of the trials added.

    Raises:
        PendingTrialsError: The file cannot be read (nothing is added then).
        StorageError: The storage failed meanwhile (the file is kept).
    """
    entries = read_pending(out)
    mine = [e for e in entries if e.study == study.name and e.storage == hide_url_password(study.storage)]
    for other in sorted({(e.study, e.storage) for e in entries if e not in mine}):
        numbers = ", ".join(f"#{e.number}" for e in entries if (e.study, e.storage) == other)
        say(f"note: {pending_file(out)} also keeps trial(s) {numbers} of study {other[0]!r} in {other[1]}, not this search's: "
            "the search that measured them adds them when it is rerun with its own command")
    if not mine:
        return []
    added: list[int] = []
    for entry in mine:
        if is_shared(study.storage):
            number, copy = with_retries(partial(_add, study, entry), study.storage)
        else:
            with storage_failures_said(study.storage):
                number, copy = _add(study, entry)
        kept = f"trial #{entry.number}, measured before the study storage was lost (kept in {pending_file(out)}),"
        if number is not None:
            added.append(number)
            say(f"{kept} added to the study as trial #{number}")
        elif copy is not None:  # it counts once: a second measurement of one setup would overshoot --trials
            say(f"{kept} not added: its copy queued again when it was marked failed, trial #{copy.number}, "
                + ("is measuring it now" if copy.state == TrialState.RUNNING else "measured it meanwhile"))
    _write(out, [e for e in entries if e not in mine])
    return added


def _add(study: SearchStudy, entry: PendingTrial) -> tuple[int | None, FrozenTrial | None]:
    """Add one record (failing the trial it ran as and its waiting copies). Its new number, or None when the study holds
    it already or a copy of it queued again (or a copy's copy) finished or runs: then that copy, which counts instead."""
    trials = study.study.get_trials(deepcopy=False)
    if any(t.system_attrs.get(SYSTEM_PENDING) == entry.key for t in trials):
        return None, None
    ran = next((t for t in trials if t.number == entry.number), None)
    if ran is not None and ran.state in FINISHED and ATTR_RESULT in ran.user_attrs:  # told after all (a reply lost)
        return None, None
    copies, numbers = [], {entry.number}
    for t in sorted(trials, key=lambda t: t.number):  # a copy comes after the trial it copies
        if t.system_attrs.get(SYSTEM_FAILED_TRIAL) in numbers:
            copies.append(t)
            numbers.add(t.number)
    if measuring := next((t for t in copies if t.state in (*FINISHED, TrialState.RUNNING)), None):
        return None, measuring
    # Failed below, each marked: the measurement is kept as the trial added last, the copies never ran, so `autotune
    # status` counts none of them as cut short (its measurement counted twice, or an unrun copy as lost).
    storage = study.study._storage
    if ran is not None and ran.state == TrialState.RUNNING and ran.user_attrs.get(ATTR_WORKER) == entry.attrs.get(ATTR_WORKER):
        storage.set_trial_user_attr(ran._trial_id, ATTR_MARKER, "kept in pending-trials.json")
        study.study.tell(entry.number, state=TrialState.FAIL)
    for copy in copies:
        if copy.state == TrialState.WAITING:
            storage.set_trial_user_attr(copy._trial_id, ATTR_MARKER, "given back")
            storage.set_trial_state_values(copy._trial_id, TrialState.FAIL)
    study.study.add_trial(entry.frozen())
    return next(t.number for t in study.study.get_trials(deepcopy=False) if t.system_attrs.get(SYSTEM_PENDING) == entry.key), None
