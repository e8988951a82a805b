"""A trial measured while the study storage was lost is kept in ``OUT/pending-trials.json`` and added by the rerun.

Real searches (the tiny resnet18 workload, a fake runner: every setup the same figures every run) on a real study:
``study.db`` in ``--out``, or a journal file shared as workers share one. Storing trial #1's record or tell fails as a
full disk or a journal file out of reach does; the rerun adds the measurement, and measures it no second time.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
import sqlalchemy.exc
from optuna.trial import TrialState

from autotune.cli_errors import error_line
from autotune.errors import PendingTrialsError, StorageError
from autotune.records import TrialResult
from autotune.tuner import SearchConfig, SilentReporter, run_search
from autotune.tuner.budget import counted_toward_budget
from autotune.tuner.lock import Holder
from autotune.tuner.pending import PENDING_FILE, add_pending
from autotune.tuner.status import study_status
from autotune.tuner.study import ATTR_WORKER, SearchStudy
from autotune.tuner.workers import Crew

LOST = 1  # the trial whose record the storage does not take


class Runner:
    """A fake trial: every setup ok, faster with a larger batch, the same every run; each setup it ran, in order."""

    def __init__(self) -> None:
        self.ran: list[dict[str, Any]] = []

    def __call__(self, setup, workload, options=None, *, on_window=None) -> TrialResult:
        self.ran.append(setup.to_dict())
        return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(100.0,), peak_memory_bytes=2**20)


class Said(SilentReporter):
    """The search's progress lines."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def message(self, text: str) -> None:
        self.lines.append(text)


def config(tmp_path: Path, cache_dir: Path, storage: str | None = None, devices: str | None = None) -> SearchConfig:
    return SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                        cache_dir=cache_dir, synthetic_images=64, storage=storage, study="pending" if storage else None, devices=devices)


def full_disk() -> Exception:
    full = sqlalchemy.exc.OperationalError("INSERT INTO trial_user_attributes ...", {}, Exception("database or disk is full"))
    try:
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from full
    except optuna.exceptions.StorageInternalError as exc:
        return exc


def lose_storage_at(monkeypatch: pytest.MonkeyPatch, method: str, error: Exception, lost: int = LOST) -> None:
    """``SearchStudy.<method>`` raises ``error`` for trial ``lost`` (the measurement is made; only storing it fails)."""
    original = getattr(SearchStudy, method)

    def failing(self, trial, *args, **kwargs):
        if trial.number == lost:
            raise error
        return original(self, trial, *args, **kwargs)

    monkeypatch.setattr(SearchStudy, method, failing)


def check_kept_then_added(monkeypatch: pytest.MonkeyPatch, cfg: SearchConfig, first: Runner, storage: str, lost: int = LOST) -> None:
    """The pending file holds trial ``lost``'s measurement; the rerun adds it (complete, its samples/s), fails the trial it
    ran as, removes the file, and never runs that setup again; trials.csv holds it."""
    out = Path(cfg.out)
    kept = json.loads((out / PENDING_FILE).read_text())["trials"]
    assert [(e["number"], e["study"]) for e in kept] == [(lost, cfg.study or kept[0]["study"])]
    setup, result = kept[0]["setup"], kept[0]["result"]
    assert setup in first.ran and result["samples_per_s"] == 100.0 + setup["batch_size"] and kept[0]["distributions"] is not None
    monkeypatch.undo()
    waiting = study_status(storage, cfg.study, out)  # autotune status OUT names what the rerun will add
    assert waiting.pending is not None and f"measured but not in the study: trial #{lost}, kept in {out / PENDING_FILE}" in waiting.pending
    assert any(waiting.pending in line for line in waiting.lines())
    said = Said()
    outcome = run_search(cfg, said, runner=Runner())
    lines = said.lines
    assert not (out / PENDING_FILE).exists() and study_status(storage, cfg.study, out).pending is None
    assert any(f"trial #{lost}, measured before the study storage was lost" in line for line in lines), lines
    trials = SearchStudy.load(storage, cfg.study).study.get_trials(deepcopy=False)
    assert trials[lost].state == TrialState.FAIL  # the trial it ran as, left running
    assert "marker" in trials[lost].user_attrs  # not "cut short" in `autotune status`: its measurement is the one added
    added = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("setup") == setup and "reused_from" not in t.user_attrs]
    assert len(added) == 1 and added[0].number > lost  # measured once, in the first run (a trial of it since reuses that)
    assert added[0].value == result["samples_per_s"] and added[0].user_attrs["result"] == result
    assert added[0].user_attrs["role"] == kept[0]["role"] and added[0].params == kept[0]["params"]
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    assert any(r.setup.to_dict() == setup for r in outcome.records)  # counts toward --trials, in trials.csv
    assert str(result["samples_per_s"]) in (out / "trials.csv").read_text()


@pytest.mark.parametrize(("lost", "devices"), [(0, None), (1, None), (1, "cpu,cpu")], ids=["defaults", "guess", "guess-devices"])
def test_a_trial_measured_while_study_db_fails_is_kept_and_added_by_the_rerun(tmp_path, cache_dir, monkeypatch, lost: int,
                                                                             devices: str | None) -> None:
    """A full disk under study.db as a trial is stored (one at a time, or one per device of --devices): the one line says
    where the measurement is kept; the rerun adds it (the defaults are not queued again). Before, the measurement was
    lost and the rerun measured its setup again."""
    cfg = config(tmp_path, cache_dir, devices=devices)
    lose_storage_at(monkeypatch, "record", full_disk(), lost)
    first = Runner()
    with pytest.raises(StorageError) as caught:
        run_search(cfg, runner=first)
    said = str(caught.value)
    assert said.startswith("cannot write to the study storage sqlite:///") and "database or disk is full" in said and "\n" not in said
    assert said.endswith(f"; trial #{lost}, measured meanwhile, is kept in {cfg.out / PENDING_FILE} and added to the study on rerun")
    check_kept_then_added(monkeypatch, cfg, first, f"sqlite:///{cfg.out / 'study.db'}", lost)


def test_a_worker_that_loses_its_journal_file_after_a_trial_keeps_it_for_the_rerun(tmp_path, cache_dir, monkeypatch) -> None:
    """A worker of a shared study (a journal file) whose tell of a measured trial gives up its retries: the line of a
    lost storage says the trial is kept; the rerun adds it and fails the trial the worker left running."""
    storage = f"journal://{tmp_path / 'study.log'}"
    cfg = config(tmp_path, cache_dir, storage)
    monkeypatch.setenv("AUTOTUNE_STORAGE_RETRIES", "1")  # gives up at once: no pauses
    lost = LOST + 1  # a shared study's trial #0 is the worker's join marker (joining is an election)
    lose_storage_at(monkeypatch, "tell", PermissionError(13, "Permission denied", str(tmp_path / "study.log")), lost)
    first = Runner()
    with pytest.raises(StorageError) as caught:
        run_search(cfg, runner=first)
    said = str(caught.value)
    assert said.startswith(f"lost the study storage {storage}: ") and "finished trials are kept, rerun to resume" in said, said
    assert f"trial #{lost}, measured meanwhile, is kept in {cfg.out / PENDING_FILE}" in said
    running = SearchStudy.load(storage, "pending").study.get_trials(deepcopy=False)[lost]
    assert running.state == TrialState.RUNNING  # as a worker that lost its storage leaves it
    check_kept_then_added(monkeypatch, cfg, first, storage, lost)


def kept_after_a_full_disk(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SearchConfig, Path]:
    """A lone search whose study.db takes no record of trial #1 (a full disk): its config and the pending file kept."""
    cfg = config(tmp_path, cache_dir)
    lose_storage_at(monkeypatch, "record", full_disk())
    with pytest.raises(StorageError):
        run_search(cfg, runner=Runner())
    monkeypatch.undo()
    return cfg, Path(cfg.out) / PENDING_FILE


@pytest.mark.parametrize("damage", ["{\"format\": 1, \"trials\": [", "{\"format\": 1, \"trials\": [{\"number\": 1}]}"])
def test_a_damaged_pending_file_stops_the_rerun_in_one_line_and_is_kept(tmp_path, cache_dir, monkeypatch, damage: str) -> None:
    """The rerun cannot read the measurements it should add: one line, exit 1, the file left as it is (never dropped)."""
    cfg, file = kept_after_a_full_disk(tmp_path, cache_dir, monkeypatch)
    file.write_text(damage)
    again = Runner()
    with pytest.raises(PendingTrialsError) as caught:
        run_search(cfg, runner=again)
    line, code = error_line(caught.value)
    assert code == 1 and "\n" not in line and line.startswith(f"{file}: "), line
    assert "it holds trials measured before the study storage was lost" in line and ("entry 1 is unreadable" in line) == ("number" in damage)
    assert file.read_text() == damage and not again.ran
    assert study_status(f"sqlite:///{cfg.out / 'study.db'}", None, Path(cfg.out)).pending == str(caught.value)  # said, not raised


def test_a_pending_trial_of_another_study_is_named_and_kept(tmp_path, cache_dir, monkeypatch) -> None:
    """A kept trial whose study is not the rerun's (another search wrote to the same --out): the rerun says so in one
    note, does not add it, and leaves it in the file for its own search; autotune status of this study does not count it."""
    cfg, file = kept_after_a_full_disk(tmp_path, cache_dir, monkeypatch)
    data = json.loads(file.read_text())
    data["trials"][0]["study"] = "another-search"
    file.write_text(json.dumps(data))
    said = Said()
    run_search(cfg, said, runner=Runner())
    notes = [line for line in said.lines if str(file) in line]
    assert notes == [f"note: {file} also keeps trial(s) #{LOST} of study 'another-search' in {data['trials'][0]['storage']}, not "
                     "this search's: the search that measured them adds them when it is rerun with its own command"], said.lines
    assert json.loads(file.read_text())["trials"] == data["trials"]
    assert study_status(f"sqlite:///{cfg.out / 'study.db'}", None, Path(cfg.out)).pending is None


def lost_by_a_worker_now_gone(tmp_path: Path, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[SearchConfig, str, int]:
    """A worker of a shared study (a journal file) that gave up storing a measured trial (kept in its pending file) and
    is gone, its trial left running: its config, the storage and that trial's number."""
    storage = f"journal://{tmp_path / 'study.log'}"
    cfg = config(tmp_path, cache_dir, storage)
    monkeypatch.setenv("AUTOTUNE_STORAGE_RETRIES", "1")
    lost = LOST + 1  # a shared study's trial #0 is the worker's join marker
    lose_storage_at(monkeypatch, "tell", PermissionError(13, "Permission denied", str(tmp_path / "study.log")), lost)
    with pytest.raises(StorageError):
        run_search(cfg, runner=Runner())
    monkeypatch.undo()
    dead = subprocess.Popen(["true"])
    dead.wait()
    study = SearchStudy.load(storage, "pending").study
    left = study.get_trials(deepcopy=False)[lost]
    assert left.state == TrialState.RUNNING
    # Its process is gone, as a worker's that lost the storage ends (this process stands in for it).
    study._storage.set_trial_user_attr(left._trial_id, ATTR_WORKER, Holder(dead.pid, socket.gethostname(), time.time() - 5).to_dict())
    return cfg, storage, lost


def test_a_kept_trial_another_worker_measured_again_meanwhile_is_not_counted_twice(tmp_path, cache_dir, monkeypatch) -> None:
    """Two workers lost the storage; the one rerun first failed the other's left-running trial, queued it again and
    measured that copy. Before, the other's rerun added its kept measurement of the same trial too: the study held one
    more trial than --trials, two of one setup, and `autotune status` blamed a worker with a larger budget."""
    cfg, storage, lost = lost_by_a_worker_now_gone(tmp_path, cache_dir, monkeypatch)
    code = run_search(replace(cfg, out=tmp_path / "b"), Said(), runner=Runner())  # the other worker, rerun first
    assert code.best is not None
    copy = next(t for t in SearchStudy.load(storage, "pending").study.get_trials(deepcopy=False) if t.system_attrs.get("failed_trial") == lost)
    assert copy.state == TrialState.COMPLETE
    said = Said()
    run_search(cfg, said, runner=Runner())
    file = Path(cfg.out) / PENDING_FILE
    assert (f"trial #{lost}, measured before the study storage was lost (kept in {file}), not added: its copy queued again when it "
            f"was marked failed, trial #{copy.number}, measured it meanwhile") in said.lines, said.lines
    assert not file.exists()
    trials = SearchStudy.load(storage, "pending").study.get_trials(deepcopy=False)
    assert counted_toward_budget(trials, cfg.trials) == cfg.trials
    status = study_status(storage, "pending")
    assert status.finished == cfg.trials and not any("past it" in line for line in status.lines()), status.lines()


def test_a_kept_trial_whose_copy_another_worker_measures_now_is_not_added(tmp_path, cache_dir, monkeypatch) -> None:
    """The same, the copy still running in the other worker: its measurement counts; the kept one is not added."""
    cfg, storage, lost = lost_by_a_worker_now_gone(tmp_path, cache_dir, monkeypatch)
    study = SearchStudy.open(storage, "pending", shared=True)
    Crew(study, wait_s=600.0).fail_stale()  # another worker fails the gone worker's trial and queues it again ...
    running = next(t for t in study.study.get_trials(deepcopy=False) if t.system_attrs.get("failed_trial") == lost)
    study.study._storage.set_trial_state_values(running._trial_id, TrialState.RUNNING)  # ... and runs that copy (as its ask does)
    said: list[str] = []
    assert add_pending(study, Path(cfg.out), said.append) == []
    assert said == [f"trial #{lost}, measured before the study storage was lost (kept in {Path(cfg.out) / PENDING_FILE}), not added: its "
                    f"copy queued again when it was marked failed, trial #{running.number}, is measuring it now"]
    assert not (Path(cfg.out) / PENDING_FILE).exists()
    assert study.study.get_trials(deepcopy=False)[running.number].state == TrialState.RUNNING
