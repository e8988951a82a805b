"""One study, many workers: real ``autotune search`` workers (processes, and this process beside them) on a real PostgreSQL
server and on a journal file."""

from __future__ import annotations

import csv
import itertools
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import in_process
import optuna
import psutil
import pytest
import sqlalchemy
import studies
from optuna.trial import TrialState

from autotune.errors import StorageError, StudyMismatch
from autotune.records import TrialResult
from autotune.time_spent import TimeSpent
from autotune.train_setup import TrainSetup
from autotune.tuner.budget import counted_toward_budget
from autotune.tuner.heartbeats import heartbeats
from autotune.tuner.lock import Holder
from autotune.tuner.storage import with_retries
from autotune.tuner.storage_urls import is_shared, journal_path
from autotune.tuner.study import SearchStudy
from autotune.tuner.workers import ATTR_WORKER, Crew

TESTS = Path(__file__).parent
WAIT_S = 600.0
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(scope="session")
def postgres() -> Iterator[object]:
    """A PostgreSQL server for the session. It must start in CI; elsewhere its absence skips the tests."""
    from postgres_server import PostgresServer

    try:
        server = PostgresServer()
        server.start()
    except Exception as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"PostgreSQL server could not be started in CI: {exc}")
        pytest.skip(f"no PostgreSQL server: {exc}")
    try:
        yield server
    finally:
        server.remove()


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)]), **extra}


def worker_cmd(out: Path, storage: str, study: str, trials: int) -> list[str]:
    """One worker: a tiny Task (a linear model), 1-s trials, one finalist measured in one round, no winner's ceilings.

    Not shorter: the kill test must catch a trial RUNNING and beating by polling, and a loaded machine polls slowly."""
    return [sys.executable, "-m", "autotune", "search", "--workload", "task_factories:good", "--trial-seconds", "1",
            "--device", "cpu", "--trials", str(trials), "--confirm-top", "1", "--confirm-rounds", "1", "--no-ceilings", "--out", str(out),
            "--storage", storage, "--study", study]


def start(cmd: list[str], **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env(**extra), text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        stdout, stderr = proc.communicate(timeout=WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        stdout, stderr = proc.communicate()
    return proc.returncode, stdout, stderr


def two_workers(first: list[str], second: list[str]) -> list[tuple[int, str, str]]:
    """Two ``autotune search`` workers at once: ``first`` as a process (its output read as it comes), ``second`` in
    this process meanwhile (its trial server is warm: seconds saved). Their exit codes, stdout and stderr, in order.

    The second starts once the first made its --out, just before it joins the study: both join before either has
    calibrated, as two workers started together do (a warm worker started at once could finish before the other joined).
    """
    proc = start(first)
    ran: list[tuple[int, str, str]] = []
    reader = threading.Thread(target=lambda: ran.append(finish(proc)), daemon=True)
    reader.start()
    joining, deadline = Path(first[first.index("--out") + 1]), time.monotonic() + WAIT_S
    while not joining.exists() and reader.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        here = in_process.cli(second[3:], TESTS)
    finally:
        reader.join(WAIT_S)
    assert ran, "the worker process did not end"
    return [ran[0], here]


def load(storage: str, study: str) -> optuna.Study:
    return SearchStudy.load(storage, study).study


def check_one_study(storage: str, study: str, trials: int, outs: list[Path], runs: list[tuple[int, str, str]]) -> None:
    """Exactly ``trials`` counted trials, no setup of the defaults or a guess run twice, one confirmation."""
    for code, _, stderr in runs:
        assert code == 0, stderr[-2000:]
    found = load(storage, study).get_trials(deepcopy=False)
    finished = [t for t in found if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]
    assert counted_toward_budget(finished, trials) == trials
    assert not [t for t in found if t.state == TrialState.RUNNING]
    first = [(t.user_attrs["role"], json.dumps(t.user_attrs["setup"], sort_keys=True)) for t in finished
             if t.user_attrs.get("role") in ("defaults", "guess")]
    assert [role for role, _ in first].count("defaults") == 1
    assert len(first) == len(set(first)) >= 2  # the defaults and at least one guess, each once
    # One worker confirmed; every worker's --out holds that winner (not a stale best.json of its own).
    copies = [json.loads((out / "best.json").read_text()) for out in outs]
    assert all((out / "train.py").is_file() for out in outs) and all(c["confirmed"] for c in copies)
    assert len({json.dumps(c["setup"], sort_keys=True) for c in copies}) == 1
    assert sum(any(n.startswith("confirmed by the worker") for n in c["notes"]) for c in copies) == len(outs) - 1
    written = copies[0]
    winner = f"winner: {TrainSetup.from_dict(written['setup']).describe()}:"
    for _, stdout, _ in runs:  # every worker prints that winner
        assert winner in " ".join(stdout.split()), stdout[-1500:]
    for out in outs:  # each worker keeps the study's trials in its own --out
        assert len(list(csv.DictReader((out / "trials.csv").open()))) == len(finished)


@dataclass(frozen=True)
class Shared:
    """A study two workers searched on the session's PostgreSQL server."""

    storage: str
    study: str
    outs: list[Path]
    runs: list[tuple[int, str, str]]


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, postgres) -> Shared:
    """Two real workers on one study, 4 trials in total. The later tests go on with this study
    (its calibration is reused), so each calibration is paid once."""
    root = tmp_path_factory.mktemp("workers")
    outs = [root / "w1", root / "w2"]
    return Shared(postgres.url, "two", outs, two_workers(*(worker_cmd(out, postgres.url, "two", trials=4) for out in outs)))


@pytest.mark.slow
def test_two_workers_share_one_budget_on_postgresql(shared: Shared) -> None:
    check_one_study(shared.storage, shared.study, 4, shared.outs, shared.runs)
    waited = [stderr for _, _, stderr in shared.runs if "waiting for" in stderr]
    assert waited, "one worker waits for the other's calibration or confirmation"
    status = subprocess.run([sys.executable, "-m", "autotune", "status", "--storage", shared.storage, "--study", shared.study],
                            capture_output=True, text=True, env=env(), timeout=120)
    assert status.returncode == 0, status.stderr
    assert "4/4 trials finished" in status.stdout and ", 0 running\n" in status.stdout and "winner:" in status.stdout
    # Each worker's run keeps its own time: the study's breakdown holds the calibration and the confirmation, whoever ran them.
    stored = SearchStudy.load(shared.storage, shared.study)
    runs = [TimeSpent.from_dict(v) for k, v in stored.study.user_attrs.items() if k.startswith("time_spent:")]
    total = stored.time_spent()
    assert len(runs) >= 2 and total is not None and total.wall_s == pytest.approx(sum(r.wall_s for r in runs))
    assert total.calibration_s > 0 and total.confirmation_s > 0


@pytest.mark.slow
def test_any_directory_reports_the_shared_winner_without_the_password(shared: Shared, tmp_path) -> None:
    """``autotune report`` from a directory without best.json shows the winner a worker stored, and no password."""
    written = next(json.loads((out / "best.json").read_text()) for out in shared.outs if (out / "best.json").exists())
    url = shared.storage.replace("postgres@", "postgres:S3cret-pw@")  # the test server trusts: the password goes unused
    from typer.testing import CliRunner

    from autotune.cli import app

    report = CliRunner().invoke(app, ["report", str(tmp_path), "--storage", url, "--study", shared.study])  # in this process: fast
    assert report.exit_code == 0, report.output
    html = (tmp_path / "report.html").read_text()
    assert "S3cret-pw" not in html and "postgres:***@" in html
    assert "finished: confirmed by" in html and "in progress" not in html
    assert TrainSetup.from_dict(written["setup"]).describe() in html
    # Its train.py is in the confirming worker's directory: the page sends the reader there, not beside itself.
    use = " ".join(html.split("Use it:", 1)[1].split("</p>", 1)[0].split())
    assert "in the directory of pid " in use and "not beside this page" in use, use
    # A directory whose best.json is an interrupted run's unconfirmed pick of this study shows the stored winner.
    stale = {**written, "confirmed": False, "notes": ["not confirmed: the search was interrupted before the interleaved re-measurement"]}
    (tmp_path / "best.json").write_text(json.dumps(stale))
    again = CliRunner().invoke(app, ["report", str(tmp_path), "--storage", url, "--study", shared.study])
    assert again.exit_code == 0, again.output
    html = (tmp_path / "report.html").read_text()
    assert "finished: confirmed by" in html and "not confirmed" not in html
    # A rerun with more --trials, interrupted before its confirmation: the earlier budget's winner is not this one's.
    study = load(shared.storage, shared.study)
    budget = study.user_attrs["trials"]
    study.set_user_attr("trials", budget + 2)
    try:
        (tmp_path / "later").mkdir()
        later = CliRunner().invoke(app, ["report", str(tmp_path / "later"), "--storage", url, "--study", shared.study])
        assert later.exit_code == 0, later.output
        assert "finished: confirmed by" not in (tmp_path / "later" / "report.html").read_text()
        # A budget whose trials all finished, with no winner stored for it and no live worker confirming it
        # (its confirming worker was killed): said so, not "being confirmed" for ever.
        study.set_user_attr("trials", budget - 1)
        from autotune.tuner.status import study_status

        assert "winner: none confirmed: the worker confirming it stopped; rerun a worker's search command" in study_status(
            shared.storage, shared.study).lines()
    finally:
        study.set_user_attr("trials", budget)


@pytest.mark.slow
def test_a_worker_with_another_fingerprint_is_refused(shared: Shared, tmp_path) -> None:
    study = load(shared.storage, shared.study)
    stored = dict(study.user_attrs["signature"])
    study.set_user_attr("signature", {**stored, "cpu_model": "Some Other CPU"})
    try:
        code, _, stderr = in_process.cli(worker_cmd(tmp_path / "w3", shared.storage, shared.study, trials=4)[3:], TESTS)
    finally:
        study.set_user_attr("signature", stored)
    assert code == 2  # a usage error, as every study made for a different search
    assert "CPU: 'Some Other CPU' there" in stderr
    assert len(stderr.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.time_limit(600)  # several real searches in a row: slow on a loaded machine
def test_journal_file_workers_share_one_budget(tmp_path) -> None:
    storage = f"journal://{tmp_path / 'study.log'}"
    studies.seed_calibration(storage, "journal", trials=3, shared=True)  # calibrating once is the PostgreSQL test's
    outs = [tmp_path / "w1", tmp_path / "w2"]
    check_one_study(storage, "journal", 3, outs, two_workers(*(worker_cmd(out, storage, "journal", trials=3) for out in outs)))


def beating_trials(storage: optuna.storages.RDBStorage) -> set[int]:
    """Ids of the trials whose heartbeat Optuna recorded (its ``trial_heartbeats`` table)."""
    with storage.engine.connect() as connection:
        return {row[0] for row in connection.execute(sqlalchemy.text("SELECT trial_id FROM trial_heartbeats"))}


@pytest.mark.slow
@pytest.mark.time_limit(600)  # several real searches in a row: slow on a loaded machine
def test_a_worker_killed_mid_trial_is_recovered_by_another(tmp_path, shared: Shared, monkeypatch) -> None:
    storage = optuna.storages.RDBStorage(shared.storage)
    study = optuna.load_study(study_name=shared.study, storage=storage)
    held = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    budget = next(b for b in itertools.count(1) if b - counted_toward_budget(held, b) >= 2)  # at least two more trials to count
    # Its trials wait at a gate (task_factories.good): one stays RUNNING until it is killed, however slowly this polls.
    gate = tmp_path / "gate"
    gate.touch()
    victim = start(worker_cmd(tmp_path / "w1", shared.storage, shared.study, trials=budget), AUTOTUNE_HEARTBEAT_S="1",
                   TASK_FACTORIES_GATE=str(gate))
    deadline, number = time.monotonic() + WAIT_S, None
    while number is None and time.monotonic() < deadline:
        assert victim.poll() is None, victim.communicate()[1][-2000:]
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        beating = beating_trials(storage)  # a trial beats once its setup is sampled and its process runs
        seen = next((t.number for t in running
                     if t.user_attrs.get(ATTR_WORKER, {}).get("pid") == victim.pid and t._trial_id in beating), None)
        if seen is not None:
            # Freeze the worker, then look again: a frozen worker tells nothing, so what is RUNNING now stays RUNNING.
            victim.send_signal(signal.SIGSTOP)
            while psutil.Process(victim.pid).status() != psutil.STATUS_STOPPED:
                time.sleep(0.01)
            if study.get_trials(deepcopy=False)[seen].state == TrialState.RUNNING:
                number = seen
            else:
                victim.send_signal(signal.SIGCONT)
        time.sleep(0.05)
    assert number is not None, "the first worker never ran a trial"
    children = psutil.Process(victim.pid).children(recursive=True)
    victim.send_signal(signal.SIGKILL)
    victim.communicate()
    for child in children:  # its trial process would finish on its own; do not leave it behind
        try:
            child.kill()
        except psutil.Error:
            pass
    assert study.get_trials(deepcopy=False)[number].state == TrialState.RUNNING  # killed mid-trial
    gate.unlink()  # (the next worker runs in this process, whose environment names no gate)
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")
    code, _, stderr = in_process.cli(worker_cmd(tmp_path / "w2", shared.storage, shared.study, trials=budget)[3:], TESTS)  # warm
    assert code == 0, stderr[-2000:]
    assert f"left running by a search that died, marked failed: trial #{number}" in stderr
    trials = study.get_trials(deepcopy=False)
    assert trials[number].state == TrialState.FAIL
    assert not [t for t in trials if t.state == TrialState.RUNNING]
    rerun = [t for t in trials if t.system_attrs.get("failed_trial") == number]
    assert rerun and rerun[0].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert rerun[0].params == trials[number].params
    assert counted_toward_budget(trials, budget) == budget


def test_a_stale_heartbeat_fails_the_trial_and_queues_it_again(postgres, monkeypatch) -> None:
    """Optuna's heartbeat: a trial of a worker on another host that stopped beating is failed and re-queued."""
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "1")  # a grace period of 3 s
    study = SearchStudy.open(postgres.url, "stale", shared=True)
    trial = study.study.ask()
    trial.suggest_int("batch_size", 8, 64)
    trial.set_user_attr(ATTR_WORKER, Holder(1, "elsewhere", 0.0, time.time()).to_dict())
    with heartbeats(study.study, trial._trial_id):
        time.sleep(0.5)  # one beat, then the worker "dies"
    crew = Crew(study, wait_s=10)
    study.study._storage.record_heartbeat(trial._trial_id)  # a last beat right before the check, so no load can age it
    assert crew.fail_stale() == []  # beat just now: still alive
    time.sleep(4.0)  # more than the grace period without a beat
    assert crew.fail_stale() == [trial.number]
    waiting = study.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert [t.params for t in waiting] == [trial.params]


@pytest.mark.slow
def test_a_lost_database_is_retried_then_one_line_and_nothing_measured_lost(tmp_path, shared: Shared, postgres) -> None:
    out = tmp_path / "w1"
    before = len(load(shared.storage, shared.study).get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))
    proc = start(worker_cmd(out, shared.storage, shared.study, trials=30), AUTOTUNE_STORAGE_RETRIES="3")
    deadline, rows = time.monotonic() + WAIT_S, 0
    try:
        while rows < before + 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            time.sleep(0.3)
            if (out / "trials.csv").exists():
                rows = len(list(csv.DictReader((out / "trials.csv").open())))
        assert rows >= before + 2  # the study's trials and 2 of this worker
        postgres.stop()
        code, _, stderr = finish(proc)
    finally:
        postgres.start()
    assert code == 1, stderr[-2000:]
    lines = [line for line in stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "lost the study storage" in lines[0] and "3 attempts" in lines[0], stderr[-2000:]
    assert "Traceback" not in stderr
    kept = len(list(csv.DictReader((out / "trials.csv").open())))
    stored = load(shared.storage, shared.study).get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
    assert kept >= max(rows, len(stored))  # every trial the study holds, and any measured after the loss


#: A pause longer than any stop takes to arrive (0.2 s after it begins), on any machine.
PAUSE_S = 120.0


def test_a_pause_ends_on_a_stop_from_a_signal_or_another_thread_and_the_handler_takes_no_lock() -> None:
    """The pause between storage retries ends at a stop, not at its end, whether a held signal or a trial's thread
    remembers it (the pause is long: only a missed stop waits it out, however slow the machine). The stop is a plain
    flag: a threading.Event's set() in the signal's handler took the lock the main thread could hold just then inside
    the same Event's wait(), and the search hung on that Ctrl-C."""
    import autotune.tuner.signals as signals

    assert not isinstance(signals._stop, threading.Event)
    signals.clear_stop()
    try:
        threading.Timer(0.2, signals.remember_stop, ("a trial was terminated from outside",)).start()
        began = time.monotonic()
        assert signals.wait_unless_stopped(PAUSE_S) and time.monotonic() - began < PAUSE_S
        signals.clear_stop()
        assert not signals.wait_unless_stopped(0.05)
        began = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            with signals.interrupts_held():
                threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
                assert signals.wait_unless_stopped(PAUSE_S) and time.monotonic() - began < PAUSE_S
    finally:
        signals.clear_stop()


@pytest.mark.parametrize("when", ["attempt", "pause"])
def test_a_stop_while_a_lost_storage_is_retried_ends_the_retries(monkeypatch, when: str) -> None:
    """Ctrl-C while a step held by interrupts_held (the calibration's and confirmation's stores, a worker's ask and tell)
    is retried against a storage that is gone: the retries end at once, in the one line of a lost storage. Before, the
    stop waited out every pause (31 s by default), then said only that the storage was lost."""
    import autotune.tuner.storage as storage_module
    from autotune.tuner.signals import clear_stop, interrupts_held

    monkeypatch.setenv("AUTOTUNE_STORAGE_RETRIES", "3")
    monkeypatch.setattr(storage_module, "FIRST_PAUSE_S", 200.0)  # without the stop: 160-240 s, which no slow machine explains
    calls: list[float] = []
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT))
    pause = storage_module.wait_unless_stopped

    def paused(seconds: float) -> bool:  # the Ctrl-C 0.2 s into the pause (160-240 s), whenever the pause begins
        timer.start()
        return pause(seconds)

    if when == "pause":
        monkeypatch.setattr(storage_module, "wait_unless_stopped", paused)

    def step() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1 and when == "attempt":  # a Ctrl-C during the first attempt
            os.kill(os.getpid(), signal.SIGINT)
        raise sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("server closed the connection unexpectedly"))

    clear_stop()
    began = time.monotonic()
    try:
        with pytest.raises(StorageError, match=r"unexpectedly \(\d attempts, then the stop\); finished trials are kept"):
            with interrupts_held():
                with_retries(step, "postgresql://u:***@db/x")
    finally:
        timer.cancel()
        clear_stop()
    assert time.monotonic() - began < 150.0 and len(calls) == (1 if when == "attempt" else 2), calls  # the stop comes at 0.2 s


def _dropping(times: int) -> tuple[Callable[[], str], list[int]]:
    """A storage step whose connection drops ``times`` times, then stores; and the drops left."""
    drops = [times]

    def step() -> str:
        if drops[0]:
            drops[0] -= 1
            raise sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("server closed the connection unexpectedly"))
        return "stored"

    return step, drops


def test_a_stop_before_a_step_leaves_its_retries_as_they_were(monkeypatch) -> None:
    """A stopped search still writes what it measured: a stop that came before the step does not end its retries."""
    import autotune.tuner.storage as storage_module
    from autotune.tuner.signals import clear_stop, remember_stop

    monkeypatch.setattr(storage_module, "FIRST_PAUSE_S", 0.0)
    step, drops = _dropping(2)
    remember_stop()
    try:
        assert with_retries(step, "postgresql://u:***@db/x") == "stored" and drops == [0]
    finally:
        clear_stop()


def test_a_lost_storage_is_said_once_while_it_is_retried(monkeypatch, capsys) -> None:
    """A database down for 13 s mid-search: both workers waited out the retries (up to 31 s) without a word, which read
    as a hung trial. The first retry of an outage says so, once, on stderr, the password hidden."""
    import autotune.tuner.storage as storage_module

    monkeypatch.setattr(storage_module, "FIRST_PAUSE_S", 0.0)
    step, _ = _dropping(3)
    assert with_retries(step, "postgresql://u:secret@db/x") == "stored"
    err = capsys.readouterr().err
    assert err.count("autotune: lost the study storage postgresql://u:***@db/x (") == 1 and "retrying for up to" in err, err
    assert "secret" not in err
    assert with_retries(lambda: "stored", "postgresql://u:secret@db/x") == "stored" and capsys.readouterr().err == ""


@pytest.mark.slow
def test_a_study_opened_while_its_server_restarts_is_retried_not_refused(postgres, monkeypatch, capfd) -> None:
    """The server restarts (a failover, a restart of PostgreSQL) right after a worker reached it, while it opens the
    study: the opening is retried like every other storage step. Before, the worker stopped at once with `cannot open
    study storage ...: server closed the connection unexpectedly` (or Optuna's guess at invalid data), after Optuna
    printed its query and parameters in a 9-line notice."""
    import threading

    import autotune.tuner.study as study_module
    from autotune.tuner.storage import open_storage

    url = postgres.url
    backend = open_storage(url)  # the server reached, as the worker's first step does
    monkeypatch.setattr(study_module, "open_storage", lambda _url: backend)
    monkeypatch.setenv("AUTOTUNE_STORAGE_RETRIES", "10")  # minutes of retries: a slow restart on a loaded machine is waited for
    SearchStudy.open(url, "restarted", shared=True).study.set_user_attr("before", 1)  # a connection in the pool; the server goes
    postgres.stop()
    restart = threading.Timer(2.0, postgres.start)
    restart.start()
    try:
        study = SearchStudy.open(url, "restarted", shared=True)
    finally:
        restart.join()
    assert study.name == "restarted" and study.study.user_attrs["before"] == 1
    assert "Caught an error from sqlalchemy" not in capfd.readouterr().err


def test_a_study_file_that_refuses_writes_fails_at_once_not_after_the_retries_of_a_lost_server(tmp_path, monkeypatch) -> None:
    """A study.db on a read-only mount: SQLite's refusal stays, so the opening is not retried (a second reading measured
    33 s of retries, then `lost the study storage ...; rerun to resume`, which reran into the same refusal)."""
    import autotune.tuner.study as study_module

    url = f"sqlite:///{tmp_path}/study.db"
    SearchStudy.open(url, "kept")  # the tables exist: the refusal comes when the study is written

    def read_only(**kwargs: Any) -> None:
        refused = sqlalchemy.exc.OperationalError("INSERT", {}, Exception("attempt to write a readonly database"))
        raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from refused

    monkeypatch.setattr(study_module.optuna, "create_study", read_only)
    monkeypatch.setattr(study_module, "with_retries", lambda *a, **k: pytest.fail("retried a refusal that stays"))
    with pytest.raises(StorageError, match=r"cannot open study storage '.*study\.db': .*attempt to write a readonly database"):
        SearchStudy.open(url, "kept")
    # A server's lost connection is retried (the test above, with a real one): the same error of a server URL is.
    from autotune.tuner.storage import connection_lost

    lost = optuna.exceptions.StorageInternalError("commit")
    lost.__cause__ = sqlalchemy.exc.OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))
    assert connection_lost("postgresql://u@db/x", lost) and not connection_lost(url, lost)
    denied = optuna.exceptions.StorageInternalError("commit")
    denied.__cause__ = sqlalchemy.exc.ProgrammingError("INSERT", {}, Exception("permission denied for table studies"))
    assert not connection_lost("postgresql://u@db/x", denied)


def test_a_lost_database_names_its_own_error_not_optuna_s_guess_at_invalid_data(monkeypatch) -> None:
    """Optuna wraps a commit on a dropped connection in StorageInternalError, whose words blame invalid data."""
    monkeypatch.setenv("AUTOTUNE_STORAGE_RETRIES", "1")

    def step() -> None:
        refused = sqlalchemy.exc.OperationalError("COMMIT", {}, Exception("connection failed: Connection refused"))
        raise optuna.exceptions.StorageInternalError(
            "An exception is raised during the commit. This typically happens due to invalid data in the commit"
        ) from refused

    with pytest.raises(StorageError) as raised:
        with_retries(step, "postgresql://u:***@db/x")
    assert "Connection refused" in str(raised.value) and "invalid data" not in str(raised.value)
    assert "1 attempts" in str(raised.value)


def test_storage_urls() -> None:
    assert journal_path("journal:///tmp/a/study.log") == "/tmp/a/study.log"
    assert journal_path("runs/study.log") == "runs/study.log"
    assert journal_path("sqlite:///x.db") is None
    assert is_shared("postgresql://u@h/db") and is_shared("journal:///x.log") and is_shared("x.log")
    assert not is_shared("sqlite:///out/study.db") and not is_shared(None)


def test_a_server_at_its_connection_limit_is_said_as_such() -> None:
    """A third worker started beside two on a server at max_connections quit with PostgreSQL's own line alone
    (`remaining connection slots are reserved ...`), which says nothing of what to do."""
    from autotune.tuner.storage import cause_said

    for said in ('connection failed: connection to server at "127.0.0.1", port 55871 failed: FATAL:  remaining connection slots '
                 "are reserved for non-replication superuser connections", "FATAL:  sorry, too many clients already"):
        assert cause_said("postgresql://u@h/db", RuntimeError(said)) == (
            f"{said}; the server has no connection slot free: each search (and `autotune status`) keeps connections open to it, "
            "so raise its max_connections or run fewer searches on it at once")
    assert cause_said("postgresql://u@h/db", RuntimeError("Connection refused")) == "Connection refused"


def test_storages_that_cannot_open_say_why(tmp_path) -> None:
    from autotune.tuner.storage import open_storage
    from autotune.tuner.storage_urls import check_storage_url

    with pytest.raises(StorageError, match=r"directory .*missing does not exist"):
        open_storage(f"sqlite:///{tmp_path}/missing/study.db")
    with pytest.raises(StorageError, match=r"'mysql://u:\*\*\*@localhost/db': no database driver for mysql is installed"):
        open_storage("mysql://u:secret@localhost/db")  # no MySQL driver among autotune's dependencies
    from optuna.storages import RDBStorage

    sqlite = open_storage(f"sqlite:///{tmp_path}/study.db")
    assert isinstance(sqlite, RDBStorage) and sqlite.url == f"sqlite:///{tmp_path}/study.db"
    # A journal URL naming that database, or a text file: said so (before: "'utf-8' codec can't decode byte 0xfb ...").
    optuna.create_study(storage=sqlite, study_name="made")
    with pytest.raises(StorageError, match=rf"{tmp_path}/study.db is not an Optuna journal file \(a JSON record per line\): it is an "
                                           rf"SQLite database; pass sqlite:///{tmp_path}/study.db$"):
        open_storage(f"journal:///{tmp_path}/study.db")
    for text in ("hello\nworld\n", '{"a": 1}\n{"b": 2}\n', "42\n43\n", "hi\n"):  # text; another tool's JSON lines; numbers
        (tmp_path / "notes.log").write_text(text)
        with pytest.raises(StorageError, match=r"notes.log is not an Optuna journal file \(a JSON record per line\); it is left "
                                               r"as it is: pass a new file's path for a new study$"):
            check_storage_url(f"journal:///{tmp_path}/notes.log")  # before the workload is built: nothing written to it
        with pytest.raises(StorageError, match=r"notes.log is not an Optuna journal file"):
            open_storage(f"journal:///{tmp_path}/notes.log")
        assert (tmp_path / "notes.log").read_text() == text  # a search appended its first record to a one-line file
    # Where the file cannot be: said as for SQLite (before: "[Errno 2] No such file or directory", "[Errno 21] Is a directory").
    with pytest.raises(StorageError, match=rf"directory {tmp_path}/missing does not exist$"):
        check_storage_url(f"journal:///{tmp_path}/missing/x.log")
    with pytest.raises(StorageError, match=rf"{tmp_path} is a directory; name a journal file in it \({tmp_path}/study.log\)$"):
        check_storage_url(f"journal:///{tmp_path}")
    (tmp_path / "a-file").write_text("x")  # a file on the path: said so (before: "directory .../a-file does not exist")
    with pytest.raises(StorageError, match=rf"{tmp_path}/a-file is not a directory$"):
        check_storage_url(f"journal:///{tmp_path}/a-file/deeper/x.log")
    with pytest.raises(StorageError, match=rf"{tmp_path}/a-file is not a directory$"):
        open_storage(f"sqlite:///{tmp_path}/a-file/study.db")
    journal = tmp_path / "real.log"  # a real journal with one record cut short (two writers on NFS): damaged, not foreign
    open_storage(f"journal:///{journal}")
    optuna.create_study(storage=open_storage(f"journal:///{journal}"), study_name="s").ask()
    lines = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(lines[:-1]) + lines[-1][: len(lines[-1]) // 2] + "\n" + lines[-1])
    with pytest.raises(StorageError, match=rf"{journal} is a damaged Optuna journal \(.*\): restore it from a backup"):
        open_storage(f"journal:///{journal}")
    with pytest.raises(StorageError, match=r"write journal:///ABSOLUTE/PATH.log"):
        open_storage("journal://")  # no path: SQLAlchemy would look for a "journal" dialect
    with pytest.raises(StorageError, match=r"'jornal:///tmp/s.log': no storage kind jornal://; write postgresql://USER@HOST/DB, "
                                           r"sqlite:///ABSOLUTE/PATH.db or journal:///ABSOLUTE/PATH.log$"):
        open_storage("jornal:///tmp/s.log")  # before: SQLAlchemy's "Can't load plugin: sqlalchemy.dialects:jornal"
    # An '@' left in the password: the driver read its tail as the host and named it ("failed to resolve host 'ss9Q@...'").
    with pytest.raises(StorageError, match=r"'postgresql://u:\*\*\*@127.0.0.1:1/db': more than one '@' before the host; "
                                           r"percent-encode an '@' in the user name or password as %40") as raised:
        open_storage("postgresql://u:pa@ss9Q@127.0.0.1:1/db")
    assert "ss9Q" not in str(raised.value)
    # Python's and SQLAlchemy's words for a port that is no number and a URL pasted with a space.
    with pytest.raises(StorageError, match=r"'postgresql://u:\*\*\*@localhost:abc/db': its port 'abc' is not a number$"):
        open_storage("postgresql://u:pw@localhost:abc/db")  # before: "invalid literal for int() with base 10: 'abc'"
    with pytest.raises(StorageError, match=r"' postgresql://u@localhost/db': it begins or ends with a space$"):
        open_storage(" postgresql://u@localhost/db")  # before: "Could not parse SQLAlchemy URL from given URL string"
    with pytest.raises(StorageError, match=r"'postgresql://u:\*\*\*@localhost/db ': it begins or ends with a space$"):
        open_storage("postgresql://u:pw@localhost/db ")  # before: it connected to the database "db "
    # A password given as a query parameter is hidden too.
    with pytest.raises(StorageError) as raised:
        open_storage("postgresql://u@127.0.0.1:1/db?connect_timeout=1&password=s3cr3tQ")
    assert "s3cr3tQ" not in str(raised.value) and "password=***" in str(raised.value), str(raised.value)
    for path in (f"{tmp_path}/study.db", "study.db"):  # before: "Could not parse SQLAlchemy URL from given URL string"
        with pytest.raises(StorageError, match=rf"not a storage URL; write sqlite:///{os.path.abspath(path)} for an SQLite file"):
            open_storage(path)
    for typo in ("postgresql:tuner:secret@db.example.org/autotune", "sqlite:study.db"):  # a URL without its //, not a path
        with pytest.raises(StorageError, match=r"its (postgresql|sqlite): is not followed by //; write postgresql://USER@HOST/DB") as raised:
            open_storage(typo)
        assert "secret" not in str(raised.value) and "sqlite:////" not in str(raised.value)
    for memory in ("sqlite://", "sqlite:///:memory:", "sqlite:///file:x?mode=memory&uri=true"):  # nothing would be kept to resume
        with pytest.raises(StorageError, match="in-memory database, lost when the search ends"):
            open_storage(memory)
    # SQLite URI filenames: the path inside them is checked like a plain one, and an existing directory opens.
    with pytest.raises(StorageError, match=r"directory .*missing does not exist"):
        open_storage(f"sqlite:///file:{tmp_path}/missing/study.db?uri=true")
    uri = f"sqlite:///file:{tmp_path}/study2.db?uri=true"
    sqlite = open_storage(uri)
    assert isinstance(sqlite, RDBStorage) and sqlite.url == uri
    from autotune.tuner.storage_urls import storage_file

    assert storage_file(uri) == tmp_path / "study2.db"  # status and report find the file the search wrote



class _Clock:
    """The waits' clock: one poll of the study takes a minute."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += 60.0


class _Watched(Crew):
    """A waiting worker that sees the elected one at work: ``progress`` stored runs, one per poll, then its result."""

    kind = "calibrate"
    progress = 0
    polls = 0

    def _attrs(self) -> dict[str, Any]:
        from autotune.tuner.stores import STUDY_CALIBRATION_RUNS, STUDY_CONFIRMATION
        from autotune.tuner.workers import STUDY_READY, STUDY_WINNER

        self.polls += 1
        if self.polls <= self.progress:
            self.study.study.set_user_attr(STUDY_CALIBRATION_RUNS if self.kind == "calibrate" else STUDY_CONFIRMATION, {"run": self.polls})
        elif self.progress:
            key = STUDY_READY if self.kind == "calibrate" else STUDY_WINNER
            self.study.study.set_user_attr(key, {"trials": 4, "best": {}})
        return super()._attrs()


@pytest.mark.parametrize("kind", ["calibrate", "confirm"])
@pytest.mark.parametrize("progress", [30, 0])
def test_a_waiting_worker_waits_while_the_elected_one_stores_progress(postgres, monkeypatch, kind: str, progress: int) -> None:
    """A live elected worker on this host that keeps storing calibration runs (or confirmation measurements) is
    waited for however long it takes (30 minutes here); one that stores nothing for the whole wait is not. Before,
    the others stopped 10 minutes after they began to wait (`did not finish calibrating within 600 s`), while a
    resnet50 calibration or a long confirmation on a CPU was still running and storing its runs."""
    from types import SimpleNamespace

    from autotune.tuner import workers
    from autotune.tuner.progress import SilentReporter
    from autotune.tuner.workers import MARKER_CALIBRATE, confirm_marker

    clock = _Clock()
    monkeypatch.setattr(workers, "time", SimpleNamespace(monotonic=clock.monotonic, sleep=clock.sleep, time=time.time))
    leader = subprocess.Popen(["sleep", "600"])  # the elected worker: a live process on this host
    try:
        holder = Holder(leader.pid, Holder.me().host, psutil.Process(leader.pid).create_time(), time.time())
        study = SearchStudy.open(postgres.url, f"wait-{kind}-{progress}", shared=True)
        election = MARKER_CALIBRATE if kind == "calibrate" else confirm_marker(4)
        study.study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={"marker": election, ATTR_WORKER: holder.to_dict()}))
        crew = _Watched(study, wait_s=600.0, poll_s=1.0)
        crew.kind, crew.progress = kind, progress
        wait = (lambda: crew.once(lambda: "calibrated here", SilentReporter())) if kind == "calibrate" else (
            lambda: crew.confirm_or_wait(4, SilentReporter()))
        if progress:
            assert wait() in (None, {"trials": 4, "best": {}})  # the leader's calibration, or its winner
            assert crew.polls == progress + 1
        else:
            with pytest.raises(StorageError, match=f"pid {leader.pid} on .* stored no (calibration run|confirmation measurement) for 600 s"
                               ) as raised:
                wait()
            if kind == "confirm":  # the way on: a rerun takes over once that worker is gone
                assert str(raised.value).endswith("; rerun a worker's search command to confirm it once that worker has ended"), raised.value
            assert 10 <= crew.polls <= 12  # 600 s without progress, a minute per poll
    finally:
        leader.kill()
        leader.wait()


@pytest.mark.slow
@pytest.mark.time_limit(600)  # several real searches in a row: slow on a loaded machine
def test_the_last_stored_winner_stands_for_the_study_whatever_budget_a_later_worker_started_with(tmp_path, postgres,
                                                                                                  monkeypatch) -> None:
    """Workers of one study started with different --trials: the one still searching (--trials 3) confirms last, and
    `autotune status` shows its winner. Before, a worker of --trials 2 that started after it left the study's budget
    at 2, and status counted `3/2 trials finished` and said `winner: none confirmed: the worker confirming it stopped`."""
    from autotune.tuner.budget import STUDY_BUDGET
    from autotune.tuner.status import study_status

    storage, name = postgres.url, "budgets"
    studies.seed_calibration(storage, name, trials=3, shared=True)
    slow_beats = {"AUTOTUNE_HEARTBEAT_S": "600"}  # a frozen worker's trial is not failed as stale meanwhile
    monkeypatch.setenv("AUTOTUNE_HEARTBEAT_S", "600")
    # The workers that run alone run in this process (its trial server is warm); the one frozen mid-trial is a process.
    code, _, stderr = in_process.cli(worker_cmd(tmp_path / "a", storage, name, trials=2)[3:], TESTS)
    assert code == 0, stderr[-2000:]
    # Its trials wait at a gate (task_factories.good): the one it runs stays RUNNING until worker c is done, however
    # slowly this polls (CI, 2026-12-05: a polling test saw none of a pruned 1-s trial and two not run).
    gate = tmp_path / "gate"
    gate.touch()
    searching = start(worker_cmd(tmp_path / "b", storage, name, trials=3), **slow_beats, TASK_FACTORIES_GATE=str(gate))
    study = load(storage, name)
    deadline = time.monotonic() + WAIT_S
    while not (study.user_attrs.get(STUDY_BUDGET) == 3 and study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))):
        assert searching.poll() is None, searching.communicate()[1][-2000:]  # until it stored its budget and runs a trial
        if time.monotonic() > deadline:
            searching.kill()
            pytest.fail("the worker of --trials 3 never ran a trial")
        time.sleep(0.2)
    searching.send_signal(signal.SIGSTOP)  # a worker of --trials 2 starts (and ends) while it searches
    try:
        code, _, stderr = in_process.cli(worker_cmd(tmp_path / "c", storage, name, trials=2)[3:], TESTS)
        assert code == 0, stderr[-2000:]
    finally:
        gate.unlink()
        searching.send_signal(signal.SIGCONT)
    code, stdout, stderr = finish(searching)
    assert code == 0, stderr[-2000:]
    status = study_status(storage, name)
    assert status.wanted == 3 and status.finished == 3
    assert status.winner is not None and f"winner: {status.winner.setup.describe()}:" in " ".join(stdout.split())
    assert not [line for line in status.lines() if line.startswith("winner: none")], status.lines()


class _SignalOnWait:
    """A reporter that sends this process ``signum`` when the worker says it waits."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.said: list[str] = []

    def message(self, text: str) -> None:
        self.said.append(text)
        if "waiting for" in text:
            os.kill(os.getpid(), self.signum)


def _elected(tmp_path: Path, name: str, kind: str, leader: subprocess.Popen[bytes]) -> SearchStudy:
    """A journal study in which the live process ``leader`` (on this host) won the election ``kind`` (calibrate or
    confirm, for a budget of 4)."""
    from autotune.tuner.workers import MARKER_CALIBRATE, confirm_marker

    holder = Holder(leader.pid, Holder.me().host, psutil.Process(leader.pid).create_time(), time.time())
    study = SearchStudy.open(f"journal:///{tmp_path}/study.log", name, shared=True)
    election = MARKER_CALIBRATE if kind == "calibrate" else confirm_marker(4)
    study.study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={"marker": election, ATTR_WORKER: holder.to_dict()}))
    return study


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("kind", ["calibrate", "confirm"])
def test_a_stop_while_a_worker_waits_for_the_elected_one_is_one_line(tmp_path, kind: str, signum: int) -> None:
    """Ctrl-C or SIGTERM while a worker waits for another's calibration or confirmation. Before, SIGTERM there killed
    the worker silently (exit 143) and Ctrl-C ended it as a bare KeyboardInterrupt (exit 130, nothing said)."""
    from autotune.errors import SearchInterrupted
    from autotune.tuner.signals import signals_handled

    def unhandled(signum: int, frame: object) -> None:
        raise RuntimeError(f"signal {signum} reached the test: the wait does not handle it")

    leader = subprocess.Popen(["sleep", "600"])  # the elected worker: a live process on this host
    try:
        study = _elected(tmp_path, "waits", kind, leader)
        crew, reporter = Crew(study, wait_s=600.0, poll_s=0.01), _SignalOnWait(signum)
        with signals_handled((signum,), unhandled), pytest.raises(SearchInterrupted) as raised:
            if kind == "calibrate":
                crew.once(lambda: "calibrated here", reporter)
            else:
                crew.confirm_or_wait(4, reporter)
    finally:
        leader.kill()
        leader.wait()
    said = str(raised.value)
    assert said.startswith(f"interrupted while pid {leader.pid} on ") and "\n" not in said, said
    assert ("this worker measured nothing" if kind == "calibrate" else "finished trials are kept in journal:") in said


def test_the_first_trials_of_a_shared_study_are_queued_through_a_lost_connection(tmp_path, cache_dir, monkeypatch) -> None:
    """The elected worker queues the defaults and the guesses after its calibration: a connection lost then is
    retried like every other step of a worker. Before, it stopped that worker with `cannot write to the study storage`
    right after a calibration of minutes."""
    import autotune.tuner.storage as storage_module
    from autotune.tuner import SearchConfig, run_search

    monkeypatch.setattr(storage_module, "FIRST_PAUSE_S", 0.0)
    real_enqueue, real_empty, drops = SearchStudy.enqueue, SearchStudy.is_empty, {"enqueue": 2, "is_empty": 1}

    def dropped(name: str, real: Any) -> Any:
        def step(self: SearchStudy, *args: Any) -> Any:
            if drops[name]:
                drops[name] -= 1
                raise sqlalchemy.exc.OperationalError("INSERT", {}, Exception("server closed the connection unexpectedly"))
            return real(self, *args)
        return step

    monkeypatch.setattr(SearchStudy, "enqueue", dropped("enqueue", real_enqueue))
    monkeypatch.setattr(SearchStudy, "is_empty", dropped("is_empty", real_empty))
    storage = f"journal:///{tmp_path}/study.log"

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                          cache_dir=cache_dir, synthetic_images=64, storage=storage, study="first")
    outcome = run_search(config, runner=runner)
    assert drops == {"enqueue": 0, "is_empty": 0}
    roles = [t.user_attrs.get("role") for t in SearchStudy.load(storage, "first").study.get_trials(deepcopy=False)
             if t.state == TrialState.COMPLETE]
    assert roles[:3] == ["defaults", "guess", "guess"] and outcome.best is not None, roles


def test_a_worker_whose_trial_another_failed_while_it_stalled_says_so_and_goes_on(tmp_path, cache_dir) -> None:
    """A worker paused past the heartbeat grace (kill -STOP, a suspended VM): another worker failed its running trial as
    stale and queued it again. When it resumed, storing its result raised UpdateFinishedTrialError, giving the trial back
    raised "Cannot tell a FAIL trial", and the worker ended with exit 3 (internal error) holding nothing in --out. It
    says so in one line and goes on; the budget is still filled."""
    from autotune.tuner import SearchConfig, run_search

    storage, failed = f"journal:///{tmp_path}/study.log", []

    class Said(_Said):
        def trial_started(self, *args: Any) -> None: ...
        def trial_finished(self, *args: Any) -> None: ...
        def confirm_progress(self, *args: Any) -> None: ...

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        if not failed and options.mode == "train":  # as the worker that found this trial's heartbeat stale does
            other = SearchStudy.load(storage, "stalled").study
            running = other.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            if running:
                other.tell(running[0].number, state=TrialState.FAIL)
                failed.append(running[0].number)
        return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                          cache_dir=cache_dir, synthetic_images=64, storage=storage, study="stalled")
    reporter = Said()
    outcome = run_search(config, reporter, runner=runner)
    assert failed and outcome.best is not None
    assert any(line.startswith(f"trial #{failed[0]} was failed and queued again by another worker while this one stalled")
               for line in reporter.said), reporter.said
    trials = SearchStudy.load(storage, "stalled").study.get_trials(deepcopy=False)
    assert trials[failed[0]].state == TrialState.FAIL and sum(t.state == TrialState.COMPLETE for t in trials) >= 3


def test_a_worker_with_another_trials_budget_says_so_as_it_joins(tmp_path, cache_dir) -> None:
    """A worker started with --trials 4 on a study of 6: nothing said, both budgets confirmed winners of their own, and
    the one stored last stood for the study (a typo on one node changed the study's result without a word)."""
    from autotune.tuner import SearchConfig, run_search

    class Said(_Said):
        def trial_started(self, *args: Any) -> None: ...
        def trial_finished(self, *args: Any) -> None: ...
        def confirm_progress(self, *args: Any) -> None: ...

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(100.0,), peak_memory_bytes=2**20)

    said: dict[int, list[str]] = {}
    for trials, out in ((3, "a"), (3, "b"), (2, "c")):
        config = SearchConfig(model="resnet18", trials=trials, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / out,
                              cache_dir=cache_dir, synthetic_images=64, storage=f"journal:///{tmp_path}/study.log", study="budgets")
        reporter = Said()
        run_search(config, reporter, runner=runner)
        said[len(said)] = reporter.said
    line = ("the study's budget was --trials 3; this worker's --trials 2 replaces it: workers of both budgets may each "
            "confirm a winner, and the one stored last stands for the study")
    assert line in said[2] and not any("budget was" in s for s in said[0] + said[1]), said


def test_a_rerun_in_the_out_of_the_worker_that_confirmed_says_so_not_another_worker(tmp_path, cache_dir) -> None:
    """The same command run again on a journal study it had confirmed read "confirmed by the worker pid N on vm, which
    wrote best.json and train.py to OUT; this worker wrote the same to OUT", as if another worker had run beside it."""
    from autotune.tuner import SearchConfig, run_search

    def runner(setup, workload, options=None, *, on_window=None) -> TrialResult:
        return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(100.0,), peak_memory_bytes=2**20)

    notes = []
    for out in ("a", "a", "b"):
        config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / out,
                              cache_dir=cache_dir, synthetic_images=64, storage=f"journal:///{tmp_path}/study.log", study="again")
        outcome = run_search(config, runner=runner)
        assert outcome.best is not None
        notes.append(outcome.best.notes[0])
    me = f"pid {os.getpid()} on "
    assert notes[1].startswith(f"confirmed by an earlier run of this search in {tmp_path / 'a'} ({me}") and "wrote the same" not in notes[1]
    assert notes[2].startswith(f"confirmed by the worker {me}") and notes[2].endswith(f"; this worker wrote the same to {tmp_path / 'b'}")


def test_the_calibration_and_confirmation_stores_of_a_shared_study_retry_a_lost_connection(tmp_path, monkeypatch) -> None:
    """Every storage step of a shared study is retried, the calibration's and the confirmation's too. Before, a
    PostgreSQL server restarting for a few seconds while a worker calibrated or confirmed stopped it at once
    (`cannot write to the study storage ...: connection failed`), while the same outage during its trials was retried."""
    import autotune.tuner.storage as storage_module
    from autotune.tuner.kept_runs import KeptRun
    from autotune.tuner.stores import STUDY_CALIBRATION_RUNS

    monkeypatch.setattr(storage_module, "FIRST_PAUSE_S", 0.0)
    study = SearchStudy.open(f"journal:///{tmp_path}/study.log", "flaky", shared=True)
    set_attr, drops = study.study.set_user_attr, [2]

    def dropped_once(key: str, value: Any) -> None:
        if drops[0]:
            drops[0] -= 1
            raise sqlalchemy.exc.OperationalError("UPDATE", {}, Exception("server closed the connection unexpectedly"))
        set_attr(key, value)

    monkeypatch.setattr(study.study, "set_user_attr", dropped_once)
    run = KeptRun(TrialResult(status="ok", samples_per_s=10.0), None)
    study.store_calibration_runs({"run": [run]})
    study.store_confirmation("#1", ([10.0], [], []))
    assert drops == [0]
    assert study.study.user_attrs[STUDY_CALIBRATION_RUNS] == {"run": [run.to_dict()]}
    assert study.confirmation() == {"#1": ([10.0], [], [])}


def test_a_worker_joining_with_other_settings_is_refused_while_the_first_lives(tmp_path) -> None:
    """Two workers started at the same moment with different --image-size both joined a study that held nothing yet
    (each took it as a fresh one) and mixed their measurements. Joining is an election: while the first live worker
    runs, one with other settings is refused in one line; the same settings join; once it is gone, and the study
    still holds nothing, the corrected command takes the study over."""
    from autotune.tuner.workers import MARKER_JOIN

    storage = f"journal://{tmp_path / 'study.log'}"
    study = SearchStudy.open(storage, "race", shared=True)
    at_32 = {"model": "resnet18", "image_size": 32, "device": "cpu", "constraints": []}
    first = subprocess.Popen(["sleep", "600"])  # the first worker: a live process on this host
    try:
        holder = Holder(first.pid, Holder.me().host, psutil.Process(first.pid).create_time(), time.time())
        study.study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={
            "marker": MARKER_JOIN, ATTR_WORKER: holder.to_dict(), "signature": at_32}))
        study.study.set_user_attr("signature", at_32)
        # A usage error (exit 2), as where the study already stores the other settings: not a storage failure (exit 1).
        with pytest.raises(StudyMismatch, match=rf"^study 'race' in {storage} is being searched by pid {first.pid} on .* for a different "
                                               r"search \(--image-size: 32 there, 48 now\); start this worker with the same settings"):
            Crew(study, wait_s=60.0).join({**at_32, "image_size": 48})
        assert study.study.user_attrs["signature"] == at_32  # the first worker's search stands
        Crew(study, wait_s=60.0).join({**at_32, "device": "cpu"})  # the same search joins
    finally:
        first.kill()
        first.wait()
    Crew(study, wait_s=60.0).join({**at_32, "image_size": 48})  # the first is gone and nothing was measured
    assert SearchStudy.load(storage, "race").study.user_attrs["signature"]["image_size"] == 48


def test_status_never_counts_more_finished_trials_than_their_budget() -> None:
    """A worker of --trials 3 stored its winner and budget while one of --trials 5 searched on: `5/3 trials finished`
    read as a miscount; the line says what the 3 is."""
    from autotune.tuner.status import StudyStatus

    line = StudyStatus(study="s", storage="postgresql://u:***@h/db", wanted=3, finished=5, failed=0, running=(), best=None,
                       winner=None, winner_by=None, shared=True, largest=5).lines()[0]
    assert "5 trials finished (the study's last stored --trials: 3; a worker with a larger one searched past it)" in line
    assert "5/3" not in line
    # No worker stored a larger budget (a kept trial counted twice by an earlier version): no such worker is named.
    line = StudyStatus(study="s", storage="postgresql://u:***@h/db", wanted=3, finished=4, failed=0, running=(), best=None,
                       winner=None, winner_by=None, shared=True, largest=3).lines()[0]
    assert line.endswith(": 4 trials finished (the study's --trials: 3; 1 more stored past it), 0 running"), line
    line = StudyStatus(study="s", storage="x", wanted=3, finished=3, failed=0, running=(), best=None, winner=None, winner_by=None).lines()[0]
    assert line.endswith(": 3/3 trials finished, 0 running")
    line = StudyStatus(study="s", storage="x", wanted=3, finished=3, failed=1, running=(), best=None, winner=None, winner_by=None).lines()[0]
    assert line.endswith(": 3/3 trials finished, 0 running, 1 cut short (a search stopped or died during it; not counted)")


class _Said:
    """A reporter that keeps what the worker says."""

    def __init__(self) -> None:
        self.said: list[str] = []

    def message(self, text: str) -> None:
        self.said.append(text)


class _OnWait(_Said):
    """A reporter that calls ``act`` (on the elected worker) when this worker says ``words`` (that it waits for it)."""

    def __init__(self, words: str, act: Callable[[], object]) -> None:
        super().__init__()
        self.words, self.act = words, act

    def message(self, text: str) -> None:
        super().message(text)
        if self.words in text:
            self.act()


@pytest.mark.parametrize("kind", ["calibrate", "confirm"])
def test_a_worker_that_takes_over_from_a_dead_elected_one_says_so(tmp_path, kind: str) -> None:
    """The elected worker dies while another waits for its calibration or confirmation: the waiting one is elected and
    says whose work it takes over (before, its next line was its own calibration or confirmation, unexplained)."""

    leader = subprocess.Popen(["sleep", "600"])  # the elected worker: a live process on this host
    try:
        study = _elected(tmp_path, "takeover", kind, leader)
        crew, reporter = Crew(study, wait_s=600.0, poll_s=0.01), _OnWait("wait", lambda: (leader.kill(), leader.wait()))
        if kind == "calibrate":
            assert crew.once(lambda: "calibrated here", reporter) == "calibrated here"
        else:
            assert crew.confirm_or_wait(4, reporter) is None  # this worker confirms
    finally:
        leader.kill()
        leader.wait()
    assert reporter.said[-1].startswith(f"pid {leader.pid} on ") and reporter.said[-1].endswith(
        " is gone before it was done; this worker takes over"), reporter.said
    assert crew.waited_s > 0  # the report's "waiting for other workers"


def freeze_outside_the_journal_lock(proc: subprocess.Popen[str], journal: Path) -> None:
    """SIGSTOP ``proc`` at a moment it holds no lock of the journal file: frozen inside one, it would block every other
    writer of the journal for Optuna's 30-s grace, which then breaks the lock under it (its release fails at SIGCONT)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        proc.send_signal(signal.SIGSTOP)
        while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
            time.sleep(0.005)
        if not os.path.lexists(f"{journal}.lock") or time.monotonic() > deadline:
            return
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.01)


def test_a_worker_interrupted_while_it_confirms_leaves_the_election_to_a_worker_on_another_host_at_once(tmp_path, monkeypatch) -> None:
    """Ctrl-C on the worker confirming a study shared with a worker on another host. Before, the other worker counted
    the interrupted one's election marker alive for 30 minutes (its heartbeat): it waited 10 minutes, stopped without a
    winner, and every rerun within those 30 minutes did the same. A worker leaving the search stamps itself gone: the
    waiting worker takes the confirmation over as soon as the interrupted one has ended."""
    import socket

    from autotune.tuner.lock import GONE
    from autotune.tuner.study import STUDY_WINNER
    from autotune.tuner.workers import confirm_marker

    storage, name, here = f"journal:///{tmp_path}/study.log", "withdraws", socket.gethostname()
    studies.seed_calibration(storage, name, trials=2, shared=True)
    cmd = worker_cmd(tmp_path / "a", storage, name, trials=2)
    cmd[cmd.index("--confirm-rounds") + 1] = "3"  # a confirmation of several measurements: frozen in it, not after it
    # Its items read slowly (a lone finalist's confirmation is one run: seconds, not one) and, once the gate exists, its
    # confirmation's trial waits there (task_factories.good): the freeze lands before a winner is stored.
    gate = tmp_path / "gate"
    elected = start(cmd, TASK_FACTORIES_SLOW_ITEM_S="0.02", TASK_FACTORIES_GATE=str(gate))
    try:
        study, deadline = load(storage, name), time.monotonic() + WAIT_S
        while not [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if t.user_attrs.get("marker") == confirm_marker(2)]:
            assert elected.poll() is None and time.monotonic() < deadline, elected.communicate()[1][-2000:]
            time.sleep(0.02)
        gate.touch()
        freeze_outside_the_journal_lock(elected, tmp_path / "study.log")  # elected (it entered first, alone) and confirming
        assert STUDY_WINNER not in load(storage, name).user_attrs
        monkeypatch.setattr(socket, "gethostname", lambda: "another-host")  # this process: a worker on another host
        interrupt = lambda: (elected.send_signal(signal.SIGINT), elected.send_signal(signal.SIGCONT))  # noqa: E731  (then thawed)
        crew, reporter = Crew(SearchStudy.open(storage, name, shared=True), wait_s=WAIT_S, poll_s=0.05), _OnWait("waiting for its winner", interrupt)
        assert crew.confirm_or_wait(2, reporter) is None  # this worker confirms
        code, _, stderr = finish(elected)
    finally:
        elected.send_signal(signal.SIGCONT)
        elected.kill()
        elected.wait()
    assert code == 130 and "interrupted" in stderr, stderr[-2000:]
    assert reporter.said[-1] == f"pid {elected.pid} on {here} is gone before it was done; this worker takes over", reporter.said
    assert [v for k, v in load(storage, name).user_attrs.items() if k.startswith(f"alive:{here}:{elected.pid}:")] == [GONE]


def test_a_searching_worker_says_when_it_fails_a_dead_worker_s_trial(tmp_path) -> None:
    """A worker already searching finds the trial of a worker that died mid-trial: it fails it, queues it again and
    says so (before, only a worker joining afterwards said it; one already searching re-ran the trial silently)."""
    from types import SimpleNamespace

    dead = subprocess.Popen(["true"])
    dead.wait()
    holder = Holder(dead.pid, Holder.me().host, time.time() - 5, time.time() - 5)  # this host, no such process now
    study = SearchStudy.open(f"journal:///{tmp_path}/study.log", "stale", shared=True)
    trial = study.study.ask()
    trial.set_user_attr(ATTR_WORKER, holder.to_dict())
    crew, reporter = Crew(study, wait_s=600.0, poll_s=0.01), _Said()
    plan = SimpleNamespace(wanted=0, workload=SimpleNamespace(device="cpu"), options=SimpleNamespace(cores=()))
    crew.explore(study, plan, reporter, runner=None)  # type: ignore[arg-type]
    assert f"left running by a worker that is gone, marked failed and queued again: trial #{trial.number}" in reporter.said
    assert study.study.get_trials(deepcopy=False)[trial.number].state == TrialState.FAIL


def test_an_election_marker_carries_the_time_it_was_entered(tmp_path) -> None:
    """On another host a marker older than 30 minutes is passed over: stamped with the worker's start, every worker of
    a search that ran longer than that was passed over at the confirmation, and each elected itself."""
    study = SearchStudy.open(f"journal:///{tmp_path}/study.log", "stamped", shared=True)
    started_long_ago = replace(Holder.me(), heartbeat=time.time() - 3600)
    entering = time.time()
    Crew(study, wait_s=600.0, me=started_long_ago).leads("confirm-4")
    marker = next(t for t in study.study.get_trials(deepcopy=False) if t.user_attrs.get("marker") == "confirm-4")
    stamped = Holder.from_dict(marker.user_attrs[ATTR_WORKER])
    assert stamped is not None and stamped.same_process(started_long_ago) and stamped.heartbeat >= entering
    assert replace(stamped, host="another-host").alive()  # as a worker on another host sees it


def test_an_elected_worker_on_another_host_stays_elected_while_it_stores_its_work(tmp_path) -> None:
    """A calibration or confirmation longer than 30 minutes: the elected worker's marker, entered that long ago, was
    passed over by every worker on another host, each of which then elected itself and did the same work again. The
    elected worker now stamps the study with each calibration run and confirmation measurement it stores, and a
    worker on another host counts its marker alive from the last stamp."""
    study = SearchStudy.open(f"journal:///{tmp_path}/study.log", "stamps", shared=True)
    waiting = Crew(study, wait_s=600.0)
    remote = Holder(4242, "another-host", time.time() - 7200, time.time() - 3600)  # entered its marker an hour ago
    study.study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={"marker": "confirm@4", ATTR_WORKER: remote.to_dict()}))
    assert waiting.is_me(waiting.leads("confirm@4"))  # nothing from it for an hour: passed over, as before

    study.study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={"marker": "calibrate", ATTR_WORKER: remote.to_dict()}))
    study.study.set_user_attr(remote.alive_key(), time.time() - 60)  # it stored a calibration run a minute ago
    leader = waiting.leads("calibrate")
    assert leader.same_process(remote) and not waiting.is_me(leader)
    # One run longer than 30 minutes (--trial-seconds 600: the wait for the next stored run is 3600 s): still elected
    # while its last stamp is younger than that wait.
    study.study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={"marker": "confirm@8", ATTR_WORKER: remote.to_dict()}))
    study.study.set_user_attr(remote.alive_key(), time.time() - 2400)
    assert Crew(study, wait_s=3600.0).leads("confirm@8").same_process(remote)
    assert Crew(study, wait_s=600.0).is_me(Crew(study, wait_s=600.0).leads("confirm@8"))  # 40 minutes: gone for a 10-minute wait

    # What stamps it: a shared study's worker storing a confirmation measurement or a calibration run.
    before = time.time()
    study.store_confirmation("#1", ([10.0], [], []))
    stamp = study.study.user_attrs[Holder.me().alive_key()]
    study.store_calibration_runs({})
    assert before <= stamp <= study.study.user_attrs[Holder.me().alive_key()] <= time.time()
    alone = SearchStudy.open(f"sqlite:///{tmp_path}/alone.db", "alone")  # a search of its own stamps nothing
    alone.store_confirmation("#1", ([10.0], [], []))
    assert not any(key.startswith("alive:") for key in alone.study.user_attrs)


def test_a_worker_that_withdrew_is_passed_over_at_once_and_a_later_search_of_its_process_is_not(tmp_path) -> None:
    """A worker on another host that stamped itself gone (it left the search) loses its elections at once, not 30
    minutes later; a search that starts later in the process of one that withdrew (the API, in-process tests) enters
    its elections alive again."""
    from autotune.tuner import elections
    from autotune.tuner.lock import GONE

    study = SearchStudy.open(f"journal:///{tmp_path}/study.log", "left", shared=True)
    remote = Holder(4242, "another-host", time.time() - 60, time.time())  # entered its marker just now
    study.study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={"marker": "confirm@4", ATTR_WORKER: remote.to_dict()}))
    waiting = Crew(study, wait_s=600.0)
    assert waiting.leads("confirm@4").same_process(remote)
    elections.withdraw(study.study, remote)
    assert study.study.user_attrs[remote.alive_key()] == GONE
    assert waiting.is_me(waiting.leads("confirm@4"))
    elections.withdraw(study.study, waiting.me)  # this process's search ended; the next one joins
    assert waiting.is_me(Crew(study, wait_s=600.0).leads("join"))
    assert isinstance(study.study.user_attrs[waiting.me.alive_key()], float)


def test_status_says_no_winner_is_being_confirmed_when_the_elected_worker_stopped_and_the_other_waits_for_it(tmp_path) -> None:
    """The worker elected to confirm was killed on this host while one on another host waits for it (its marker lives
    there for 30 minutes). Before, `autotune status` said `winner: being confirmed` as long as any worker that entered
    the election lived, the waiting one too; it looks at the worker the election picks, as that worker sees it."""
    from autotune.records import TrialResult
    from autotune.tuner import elections
    from autotune.tuner.budget import STUDY_BUDGET
    from autotune.tuner.status import study_status
    from autotune.tuner.workers import confirm_marker

    storage, name = f"journal:///{tmp_path}/study.log", "confirming"
    study = SearchStudy.open(storage, name, shared=True)
    study.check_signature({"model": "resnet18"})  # an autotune search's study
    me = Holder.me()
    for batch in (8, 16):  # the budget's two trials, finished by a worker
        trial = study.study.ask()
        trial.set_user_attr(ATTR_WORKER, me.to_dict())
        result = TrialResult(status="ok", samples_per_s=100.0 + batch)
        study.record(trial, "search", TrainSetup(batch_size=batch), result, None)
        study.tell(trial, result)
    study.study.set_user_attr(STUDY_BUDGET, 2)
    killed = subprocess.Popen(["true"])
    killed.wait()
    elected = Holder(killed.pid, me.host, time.time() - 5, time.time())  # this host, its process gone; entered first
    waiting = Holder(4242, "another-host", time.time() - 60, time.time())  # alive by its fresh heartbeat
    for holder in (elected, waiting):
        study.study.add_trial(optuna.create_trial(state=TrialState.FAIL, user_attrs={"marker": confirm_marker(2), ATTR_WORKER: holder.to_dict()}))

    def winner_line() -> str:
        return next(line for line in study_status(storage, name).lines() if line.startswith("winner:"))

    assert winner_line() == "winner: none confirmed: the worker confirming it stopped; rerun a worker's search command"
    elections.withdraw(study.study, elected)  # one that withdrew is passed over by the waiting one too: it confirms
    assert winner_line() == "winner: being confirmed"
    elections.withdraw(study.study, waiting)
    assert winner_line() == "winner: none confirmed: the worker confirming it stopped; rerun a worker's search command"


def test_status_names_the_shared_study_s_worker_that_calibrates(tmp_path) -> None:
    """Before, `autotune status` named the calibrating search of a lone study only: a shared study's read "calibration
    not finished, and no search runs it now" while its elected worker measured."""
    from autotune.tuner import elections
    from autotune.tuner.status import study_status
    from autotune.tuner.workers import MARKER_CALIBRATE

    storage, name = f"journal:///{tmp_path}/study.log", "calibrating"
    study = SearchStudy.open(storage, name, shared=True)
    study.check_signature({"model": "resnet18"})  # an autotune search's study
    me = Holder.me()
    elections.enter(study.study, me, MARKER_CALIBRATE)  # as the elected worker does before its first run
    status = study_status(storage, name)
    assert status.shared and status.calibrating == me.describe()
    assert any(line.startswith(f"  calibrating now ({me.describe()}): 0 of its runs") for line in status.lines()), status.lines()
    elections.withdraw(study.study, me)  # the worker left before it finished: nobody calibrates
    status = study_status(storage, name)
    assert status.calibrating is None
    gone = "  calibration not finished, and no worker runs it now: 0 of its runs measured and kept; rerun a worker's search command"
    assert any(line.startswith(gone) for line in status.lines()), status.lines()


class _SaidSharing(_Said):
    """Stops the worker's loop at its warning about shared cores (said before it asks for its next trial)."""

    def message(self, text: str) -> None:
        super().message(text)
        if "runs trials of this study on cores" in text:
            raise LookupError(text)


def test_a_worker_says_once_when_another_worker_on_this_host_runs_trials_on_its_cores(tmp_path, monkeypatch) -> None:
    """Two workers of one study on one CPU host without ``taskset`` slow each other's every measurement; before, neither
    said a word. A live process of this host holding a running trial on this worker's cores is named once; the worker's
    own trials, a GPU worker's and a worker pinned to other cores are not."""
    from autotune.tuner.cohosts import CoreSharing

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two usable cores to pin a worker apart")
    other = subprocess.Popen(["sleep", "600"])  # another worker: a live process on this host
    try:
        me = Holder.me()
        study = SearchStudy.open(f"journal:///{tmp_path}/study.log", "cores", shared=True)
        for holder in (me, Holder(other.pid, me.host, psutil.Process(other.pid).create_time(), time.time())):
            study.study.ask().set_user_attr(ATTR_WORKER, holder.to_dict())
        sharing = CoreSharing(me, "cpu")
        said = sharing.check(study)
        assert said is not None and said.startswith(f"warning: worker pid {other.pid} on this host runs trials of this study on cores ")
        assert said.endswith("give each worker its own cores (taskset -c, docs/distributed.md)")
        assert sharing.check(study) is None  # once per worker
        assert CoreSharing(me, "cuda:0").check(study) is None
        os.sched_setaffinity(other.pid, {cores[-1]})  # taskset -c LAST for the other, the rest for this one
        assert CoreSharing(me, "cpu", cores[:-1]).check(study) is None
        said = CoreSharing(me, "cpu", cores).check(study)
        assert said is not None and f"on cores {cores[-1]}, which" in said
        # The searching worker's loop says it before its next trial.
        from types import SimpleNamespace

        monkeypatch.setattr("autotune.tuner.workers.queue_refinements", lambda study, plan: None)
        plan = SimpleNamespace(wanted=5, workload=SimpleNamespace(device="cpu"), options=SimpleNamespace(cores=tuple(cores)))
        with pytest.raises(LookupError, match=f"worker pid {other.pid} on this host"):
            Crew(study, wait_s=600.0, poll_s=0.01, me=me).explore(study, plan, _SaidSharing(), runner=None)  # type: ignore[arg-type]
        assert len(study.study.get_trials(deepcopy=False)) == 2  # said before it asked: a stop there strands no trial of its own
    finally:
        other.kill()
        other.wait()
    assert CoreSharing(me, "cpu").check(study) is None  # a worker that is gone measures nothing


def test_a_trial_given_back_as_the_others_filled_the_budget_is_not_cut_short(tmp_path) -> None:
    """Two workers ask for a trial as the budget's last one runs: one gives its trial back, failed, not run. `autotune
    status` counted it `1 cut short (a search stopped or died during them)`: no search stopped (CI, 2026-12-05)."""
    from autotune.tuner.status import study_status

    storage = f"journal:///{tmp_path}/study.log"
    study = SearchStudy.open(storage, "back", shared=True)
    study.check_signature({"model": "resnet18"})
    crew = Crew(study, wait_s=WAIT_S, poll_s=0.05)
    trial, _ = study.ask()
    crew._give_back(study, trial)
    assert study.study.get_trials(deepcopy=False)[trial.number].state == TrialState.FAIL
    assert study_status(storage, "back").failed == 0
    # One a stop (Ctrl-C, SIGTERM) ended as it measured is given back too, and is cut short: status says so, as documented.
    stopped, _ = study.ask()
    crew._give_back(study, stopped, unrun=False)
    assert study_status(storage, "back").failed == 1


def test_a_stop_while_a_worker_asks_its_trial_gives_it_back(tmp_path, monkeypatch) -> None:
    """A Ctrl-C held while a shared study's worker asked its trial was raised as the ask's block ended: the trial was
    left RUNNING under this worker's name, which a worker on another host fails only once its marker is 30 min old."""
    from autotune.tuner.study import SearchStudy
    from autotune.tuner.workers import Crew

    study = SearchStudy.open(f"{tmp_path / 'shared.log'}", "asked", shared=True)
    counts = SearchStudy.counts

    def counted_then_stopped(self: SearchStudy, *args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)  # held: raised as the block that asked ends
        return counts(self, *args, **kwargs)

    monkeypatch.setattr(SearchStudy, "counts", counted_then_stopped)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            Crew(study, wait_s=10)._ask(study, 5)
    finally:
        signal.signal(signal.SIGINT, previous)
    trials = study.study.get_trials(deepcopy=False)
    assert len(trials) >= 1 and not [t.number for t in trials if t.state == TrialState.RUNNING], trials
