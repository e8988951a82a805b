"""Fault injection: real signals, real second processes, real corrupt files.

Each test provokes one fault a long search meets (docs/faults.md lists them
with the command that reproduces each) and checks that nothing measured is
lost and the user gets one clear line. The waits poll an observable event
(a trial RUNNING in the study, a line on stderr), never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import in_process
import optuna
import psutil
import pytest
import studies
from optuna.trial import TrialState

from autotune.errors import StudyMismatch
from autotune.records import TrialResult
from autotune.tuner.status import study_status

TESTS = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
WAIT_S = 240.0
optuna.logging.set_verbosity(optuna.logging.WARNING)


def search_cmd(out: Path, cache_dir: Path, *extra: str, trials: int = 2, model: str = "tiny_cnn") -> list[str]:
    """``autotune search`` of a tiny test model, 1-s trials, one confirmation round, no winner's ceilings."""
    return [sys.executable, "-m", "autotune", "search", "--model", f"factories:{model}", "--image-size", "32",
            "--synthetic-images", "64", "--trial-seconds", "1", "--device", "cpu", "--trials", str(trials),
            "--confirm-top", "1", "--confirm-rounds", "1", "--no-ceilings", "--out", str(out), "--cache-dir", str(cache_dir),
            *extra]


def run_here(cmd: list[str]) -> tuple[int, str, str]:
    """``cmd`` (an ``autotune`` command line) run in this process from the tests' directory (:func:`in_process.cli`),
    for the runs a test only reads the outcome of; the faults themselves hit real processes."""
    assert cmd[:3] == [sys.executable, "-m", "autotune"], cmd
    return in_process.cli(cmd[3:], TESTS)


def start(cmd: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """The command in a child with default signal dispositions (a background shell ignores SIGINT)."""
    def defaults() -> None:
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env or ENV, preexec_fn=defaults)


def wait_running(proc: subprocess.Popen[bytes], out: Path, number: int) -> None:
    """Wait until trial ``number`` is RUNNING in the study of ``out``, and leave ``proc`` frozen (SIGSTOP) with it so.

    A frozen search tells nothing, so the trial stays RUNNING: a signal sent now lands mid-trial (it is delivered at the
    SIGCONT). A trial that can end by itself may end between two looks on a loaded machine (a 1-s trial did, and its
    search finished unseen): searches of :func:`factories.gated_cnn` with its gate in place are waited on.
    """
    storage = f"sqlite:///{out / 'study.db'}"
    deadline = time.monotonic() + WAIT_S

    def running() -> bool:
        try:
            trials = optuna.load_study(study_name=None, storage=storage).get_trials(deepcopy=False)
        except Exception:  # the study is still being created
            trials = []
        return any(t.number == number and t.state == TrialState.RUNNING for t in trials)

    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1].decode()
        if (out / "study.db").exists() and running():
            proc.send_signal(signal.SIGSTOP)
            while psutil.Process(proc.pid).status() != psutil.STATUS_STOPPED:
                time.sleep(0.01)
            if running():
                return
            proc.send_signal(signal.SIGCONT)
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"trial #{number} never ran")


def seed_calibration(out: Path, model: str = "tiny_cnn") -> None:
    """The study of the search on ``out`` already calibrated: the faults under test hit the trials."""
    out.mkdir(parents=True)
    studies.seed_calibration(f"sqlite:///{out / 'study.db'}", f"factories.{model}-32px-cpu", trials=2)


def study_of(out: Path) -> optuna.Study:
    return optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")


@pytest.mark.slow
@pytest.mark.time_limit(600)  # several real searches in a row: slow on a loaded machine
def test_hangup_and_kill9_mid_trial_lose_nothing_and_a_second_search_is_refused(tmp_path, cache_dir) -> None:
    """SIGHUP during the defaults trial, kill -9 during the next: the resumed search still has its baseline.

    While the first search runs, a second one on the same --out is refused in one line naming the holder. The trials
    wait at their gate until the faults are sent (:func:`factories.gated_cnn`); the last search runs ungated.
    """
    from factories import GATE_ENV

    out, gate = tmp_path / "out", tmp_path / "gate"
    gate.touch()
    gated = {**ENV, GATE_ENV: str(gate)}
    seed_calibration(out, "gated_cnn")
    first = start(search_cmd(out, cache_dir, model="gated_cnn"), gated)
    wait_running(first, out, 0)
    first.send_signal(signal.SIGHUP)
    first.send_signal(signal.SIGCONT)  # the hangup is delivered as the search thaws, mid-trial
    _, stderr = first.communicate(timeout=WAIT_S)
    assert first.returncode == 130, stderr.decode()
    assert "Traceback" not in stderr.decode()
    assert study_of(out).trials[0].state == TrialState.FAIL

    resumed = start(search_cmd(out, cache_dir, model="gated_cnn"), gated)
    wait_running(resumed, out, 1)  # frozen mid-trial: it certainly holds --out while the second one starts
    second = run_here(search_cmd(out, cache_dir, model="gated_cnn"))  # this process: the holder is the frozen search's
    storage = f"sqlite:///{out / 'study.db'}"
    live = study_status(storage)
    resumed.kill()  # kill -9: no handler runs, the trial stays RUNNING in the study
    resumed.communicate(timeout=WAIT_S)
    assert second[0] == 1
    line = second[2].strip()
    assert f"pid {resumed.pid} on" in line and "in use by another autotune search" in line
    assert len(line.splitlines()) == 1
    assert study_of(out).trials[1].state == TrialState.RUNNING
    # `autotune status`: running while its search lives, then named as left by a search that died.
    assert [(r.number, r.gone) for r in live.running] == [(1, False)] and f"pid {resumed.pid} on" in live.running[0].worker
    assert live.running[0].role == "guess" and (live.running[0].seconds or -1) >= 0
    dead = study_status(storage)
    assert [(r.number, r.gone) for r in dead.running] == [(1, True)]
    assert ", 0 running," in dead.lines()[0] and "left running by a search that died: #1" in "\n".join(dead.lines())

    gate.unlink()
    code, stdout, stderr = run_here(search_cmd(out, cache_dir, "--json", model="gated_cnn"))
    assert code == 0, stderr
    summary = json.loads(stdout)
    # A speedup, unless the defaults were the top trial and so confirmed alone (a guess that ran slower on a busy machine).
    alone = [c["label"].endswith("(defaults)") for c in summary["confirmation"]] == [True]
    assert summary["best"]["speedup"] is not None or alone, summary["confirmation"]
    assert summary["ceilings"] is None and "its confirmed median" not in summary["verdict"]  # --no-ceilings
    assert summary["best"]["defaults_samples_per_s"] > 0
    study = study_of(out)
    assert study.trials[1].state == TrialState.FAIL  # the dead process's trial
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(finished) == 2
    assert [t.user_attrs["role"] for t in finished].count("defaults") == 1
    assert "left running by a search that died" in stderr


def test_an_out_in_use_is_refused_before_the_workload_is_built(tmp_path) -> None:
    """A second search on a busy --out was refused only once it held the workload (torchvision imported, a Task's
    module run): 8 s on an idle machine, over 60 s on a busy one, where it looked hung. It is refused first now; the
    check takes and makes nothing (no lock file where none was)."""
    from autotune.errors import StorageError
    from autotune.tuner import SearchConfig
    from autotune.tuner.lock import LOCK_FILE, OutputLock
    from autotune.tuner.prepare import prepare
    from autotune.tuner.progress import SilentReporter

    out = tmp_path / "out"
    out.mkdir()
    OutputLock(out).refuse_if_held()
    assert not (out / LOCK_FILE).exists()
    holding = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
               "os.write(fd, b'pid %d on a host' % os.getpid()); print('held', flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", holding, str(out / LOCK_FILE)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as holder:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        # A workload whose module does not exist: building it would fail with its own error, after the lock's.
        config = SearchConfig(model=None, workload="no_such_module_here:make", trials=2, device="cpu", out=out)
        with pytest.raises(StorageError, match=rf"^--out {out} is in use by another autotune search \(pid {holder.pid} on a host\)"):
            prepare(config, SilentReporter())
        holder.stdin.close()  # type: ignore[union-attr]
    OutputLock(out).refuse_if_held()  # its holder gone: the kernel dropped the lock


def test_a_study_held_by_a_live_process_is_refused_and_a_dead_holder_is_taken_over(tmp_path) -> None:
    """The study lock (a search on another --out with the same --storage): real live and dead holders."""
    from autotune.errors import StorageError
    from autotune.tuner.lock import Holder
    from autotune.tuner.study import STUDY_HOLDER, SearchStudy

    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    study = SearchStudy.open(storage, "shared")
    with subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE) as live:
        alive = Holder(live.pid, Holder.me().host, psutil.Process(live.pid).create_time(), time.time())
        study.study.set_user_attr(STUDY_HOLDER, alive.to_dict())
        with pytest.raises(StorageError, match=rf"in use by another autotune search \(pid {live.pid} on "):
            SearchStudy.open(storage, "shared").claim()
        live.stdin.close()  # type: ignore[union-attr]
    # The holder is dead now (and reaped): its claim is taken over.
    other = SearchStudy.open(storage, "shared")
    other.claim()
    assert Holder.from_dict(other.study.user_attrs[STUDY_HOLDER]).same_process(Holder.me())
    other.release()
    assert other.study.user_attrs[STUDY_HOLDER] is None


def test_a_search_in_another_thread_of_the_same_process_is_refused_as_another_process_s(tmp_path) -> None:
    """Two autotune.search calls from two threads of one process, one storage and study, other --outs: both ran into
    the study (4 trials of --trials 3, two best.json that disagreed), where a second process is refused: a holder of
    this process counted as the caller itself. The same --out was refused naming the caller's own pid as "another"."""
    import threading

    from autotune.errors import StorageError
    from autotune.tuner.lock import IN_THIS_PROCESS, OutputLock
    from autotune.tuner.study import SearchStudy

    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    first = SearchStudy.open(storage, "shared")
    first.claim()
    refused: list[BaseException] = []

    def second_search() -> None:
        try:
            SearchStudy.open(f"sqlite:///{tmp_path}/./shared.db", "shared").claim()  # another URL of the same file
        except StorageError as exc:
            refused.append(exc)

    thread = threading.Thread(target=second_search)
    thread.start()
    thread.join()
    assert [str(e) for e in refused] == [f"study 'shared' in {storage} is in use by another autotune search ({IN_THIS_PROCESS}); "
                                         "wait for it to finish or pass --study NEW_NAME".replace(storage, f"sqlite:///{tmp_path}/./shared.db")]
    first.release()
    again = SearchStudy.open(storage, "shared")  # released: the next search of this process takes it
    again.claim()
    again.release()

    (tmp_path / "out").mkdir()
    with OutputLock(tmp_path / "out") as held:
        with pytest.raises(StorageError, match=rf"^--out {tmp_path / 'out'} is in use by another autotune search \({IN_THIS_PROCESS}\)"):
            OutputLock(tmp_path / "out").refuse_if_held()
        with pytest.raises(StorageError, match=rf"\({IN_THIS_PROCESS}\); wait for it to finish or pass another --out"):
            OutputLock(tmp_path / "out").acquire()
        assert held is not None
    with OutputLock(tmp_path / "out"):  # released: taken again
        (tmp_path / "link").symlink_to(tmp_path / "out")  # the same --out through a link: this process's, not "pid N"
        with pytest.raises(StorageError, match=rf"\({IN_THIS_PROCESS}\)"):
            OutputLock(tmp_path / "link").acquire()


def test_a_lock_file_that_cannot_be_written_is_one_line_and_leaves_the_out_free(tmp_path, monkeypatch) -> None:
    """A full disk as the holder's line is written: a bare OSError, and the --out stayed held by this process, every
    later search of it refused as "another search of this process, in another thread"."""
    import errno
    import os

    from autotune.errors import StorageError
    from autotune.tuner import lock

    def full(*args: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(lock.os, "pwrite", full)
        with pytest.raises(StorageError, match=r"^cannot write the lock file .*autotune.lock: No space left on device$"):
            lock.OutputLock(tmp_path).acquire()
    with lock.OutputLock(tmp_path):  # free again, in this process and for others
        assert os.path.getsize(tmp_path / "autotune.lock") > 0


# ------------------------------------------------------- trial launch and supervision
def _never_ending(cache_dir: Path) -> tuple:
    from autotune.records import TrialOptions, Workload
    from autotune.train_setup import TrainSetup

    workload = Workload(model="factories:sleeps_forever", image_size=32, device="cpu", num_classes=10,
                        synthetic_images=64, cache_dir=str(cache_dir), sys_path=(str(TESTS),))
    return TrainSetup(), workload, TrialOptions(trial_seconds=1.0, timeout_s=120.0)


def _trial_pids() -> list[int]:
    """This process's trials: the children of its zygote server that lead their own session, as a trial does from its
    first step (a server's own short-lived forks as it starts, such as a subprocess before its exec, do not)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            parent = child.parent()
            if (parent is not None and parent.pid != os.getpid() and "autotune.runner.server" in " ".join(parent.cmdline())
                    and child.status() != psutil.STATUS_ZOMBIE  # an earlier trial, killed and not yet reaped, is not this one
                    and os.getsid(child.pid) == child.pid):
                found.append(child.pid)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


def _run_and_signal_the_trial(cache_dir: Path, signum: int) -> TrialResult:
    """Run a never-ending trial and send its process ``signum`` from another thread once it is up."""
    import threading

    from autotune.runner import run_trial

    setup, workload, options = _never_ending(cache_dir)
    killed: list[int] = []
    earlier = set(_trial_pids())  # trials of earlier tests still exiting: not this one

    def signal_the_trial() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not killed:
            for pid in set(_trial_pids()) - earlier:
                os.kill(pid, signum)
                killed.append(pid)
                break
            time.sleep(0.1)

    thread = threading.Thread(target=signal_the_trial, daemon=True)
    thread.start()
    result = run_trial(setup, workload, options)
    thread.join()
    assert killed
    return result


@pytest.mark.slow
def test_a_trial_terminated_from_outside_is_interrupted_not_the_setups_failure(cache_dir) -> None:
    result = _run_and_signal_the_trial(cache_dir, signal.SIGTERM)  # as a supervisor stopping every process would
    assert result.status == "interrupted"
    assert "SIGTERM" in (result.error or "")


@pytest.mark.parametrize("oom_killer_acted", [False, True])
def test_a_trial_killed_from_outside_is_an_error_unless_the_oom_killer_acted(cache_dir, monkeypatch, oom_killer_acted) -> None:
    """SIGKILL is the OOM killer's signal, but anyone may send it: the kernel's oom_kill counters tell which.

    An outside kill is no memory limit (a memory pre-pass must not shrink the batch range for it); a kill with the
    counters raised is ``oom``, as before.
    """
    import autotune.runner.failures as failures

    readings = iter([5, 6 if oom_killer_acted else 5])  # before the trial, then after its death
    monkeypatch.setattr(failures, "oom_kills", lambda: next(readings))
    monkeypatch.setattr("autotune.runner.launch.oom_kills", lambda: next(readings))
    result = _run_and_signal_the_trial(cache_dir, signal.SIGKILL)
    if oom_killer_acted:
        assert result.status == "oom" and "most likely by the kernel's out-of-memory killer" in (result.error or "")
    else:
        assert result.status == "error" and failures.KILLED_FROM_OUTSIDE in (result.error or ""), result.error


def test_the_oom_killer_takes_a_trial_or_the_trial_server_before_the_search(cache_dir) -> None:
    """Under a container's memory limit the kernel's OOM killer takes the process of the highest score, by default the
    largest: it took the search itself (exit 137, not a word), which holds torch as a trial does. A trial volunteers
    first (its death is an ``oom`` trial), the trial server next (started again); the search keeps its own score."""
    import threading

    from autotune.runner import run_trial
    from autotune.runner.server import SERVER_OOM_SCORE, TRIAL_OOM_SCORE

    setup, workload, options = _never_ending(cache_dir)
    earlier, seen = set(_trial_pids()), {}

    def read_then_stop() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not seen:
            for pid in set(_trial_pids()) - earlier:
                server = psutil.Process(pid).ppid()
                try:
                    while _oom_score(pid) != TRIAL_OOM_SCORE and time.monotonic() < deadline:  # forked: it sets its own first
                        time.sleep(0.05)
                    seen.update(trial=_oom_score(pid), server=_oom_score(server))
                    os.kill(pid, signal.SIGTERM)
                except OSError as exc:  # the trial ended already: say so, not a timeout with nothing seen
                    seen.update(error=str(exc))
                break
            time.sleep(0.1)

    thread = threading.Thread(target=read_then_stop, daemon=True)
    thread.start()
    run_trial(setup, workload, options)
    thread.join()
    assert seen == {"trial": TRIAL_OOM_SCORE, "server": SERVER_OOM_SCORE} and _oom_score(os.getpid()) < SERVER_OOM_SCORE, seen


def _oom_score(pid: int) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("oom_killer_acted", [False, True])
def test_a_loader_worker_killed_while_the_oom_killer_acted_is_oom(cache_dir, monkeypatch, oom_killer_acted) -> None:
    """A loader worker's memory counts against the machine's (or the container's) limit too, and the OOM killer may pick
    it: its SIGKILL ends the trial with the DataLoader's "killed by signal" error, which is ``oom`` where the kernel's
    counters rose during the trial (before: ``error``, as for a kill from outside, which it stays)."""
    import threading

    import autotune.runner.failures as failures
    from autotune.records import TrialOptions, Workload
    from autotune.runner import run_trial
    from autotune.train_setup import TrainSetup

    killed: list[int] = []

    def readings() -> int:  # the kernel's counters: up by one once the worker is killed, where the OOM killer acted
        return 6 if oom_killer_acted and killed else 5  # (however often read: a trial server replaced under load reads twice)

    monkeypatch.setattr(failures, "oom_kills", readings)
    monkeypatch.setattr("autotune.runner.launch.oom_kills", readings)
    workload = Workload(model="factories:tiny_cnn", image_size=32, device="cpu", num_classes=10, synthetic_images=64,
                        cache_dir=str(cache_dir), sys_path=(str(TESTS),))
    setup = TrainSetup(batch_size=8, num_workers=1, prefetch_factor=2, persistent_workers=True)
    earlier = set(_trial_pids())

    def kill_the_worker() -> None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline and not killed:
            for pid in set(_trial_pids()) - earlier:
                try:  # the loader's worker (torch names it; a forkserver start method adds its server as a child)
                    workers = [c for c in psutil.Process(pid).children() if c.name() == "pt_data_worker"]
                except psutil.Error:
                    continue
                if workers:
                    killed.append(workers[0].pid)  # first: the counters read as risen before the trial can see the death
                    os.kill(workers[0].pid, signal.SIGKILL)
                    break
            time.sleep(0.1)

    thread = threading.Thread(target=kill_the_worker, daemon=True)
    thread.start()
    result = run_trial(setup, workload, TrialOptions(trial_seconds=60.0, timeout_s=WAIT_S))
    thread.join()
    assert killed and "DataLoader worker" in (result.error or ""), result
    if oom_killer_acted:
        assert result.status == "oom" and (result.error or "").startswith(
            "a loader worker was killed, most likely by the kernel's out-of-memory killer (its oom_kill counters rose"), result.error
    else:
        assert result.status == "error" and "out-of-memory killer" not in (result.error or ""), result.error


HAND_OVER_WORDS = "while it handed a batch over"


def test_a_loader_worker_that_ended_while_it_handed_a_batch_over_is_a_worker_death(broken_hand_over, monkeypatch) -> None:
    """A worker killed (by the OOM killer, or kill -9) while it hands a batch over closes the queue's connection before
    PyTorch sees it gone: the trial's error was a bare ``EOFError``, neither named as a loader worker's death nor ``oom``
    where the kernel's counters rose. An EOFError from elsewhere stays what it was."""
    import autotune.runner.failures as failures
    from autotune.runner.failures import classify, worker_oom

    result = classify(broken_hand_over)
    assert result.status == "error" and result.error == ("a DataLoader worker exited unexpectedly while it handed a batch "
                                                         "over (EOFError): it was killed, or ended by a signal"), result
    monkeypatch.setattr(failures, "oom_kills", lambda: 6)
    assert worker_oom(result, 5).status == "oom" and worker_oom(result, 6) == result
    assert classify(EOFError("input ended")) == TrialResult(status="error", error="EOFError: input ended")
    from test_emit import _datasets_own_eof_errors

    for own in _datasets_own_eof_errors():  # a truncated pickle the dataset reads, without workers and through one
        assert not failures.broken_hand_over(own) and HAND_OVER_WORDS not in (classify(own).error or ""), classify(own)


def test_a_loader_worker_that_found_dev_shm_full_names_it_and_the_fix(monkeypatch) -> None:
    """The DataLoader's words for a /dev/shm too small for the batches in flight (a container's 64 MiB default): the
    trial's error names /dev/shm, its size and the fix (before: PyTorch's message alone). A worker's bus error says so
    only where /dev/shm is small: with GiB of it, a memory-mapped file cut short raises it too."""
    import autotune.runner.failures as failures
    from autotune.runner.failures import classify
    from probes.memory import ShmInfo

    monkeypatch.setattr(failures, "collect_shm", lambda: ShmInfo("/dev/shm", 64 * 2**20, 60 * 2**20))

    full = ("Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n  File \"x.py\""
            "\nRuntimeError: unable to allocate shared memory(shm) for file </torch_28891_1_0>: No space left on device (28)")
    bus = ("DataLoader worker (pid 31337) is killed by signal: Bus error. It is possible that dataloader's workers are out of "
           "shared memory. Please try to raise your shared memory limit.")
    for message in (full, bus):
        error = classify(RuntimeError(message)).error or ""
        assert "failed in a DataLoader worker" in error and "; /dev/shm (" in error, error
        assert error.endswith("is too small for this setup's batches in flight (workers x prefetch x batch): fewer workers, a "
                              "smaller prefetch or batch fit it; to search them all, give the container more shared memory "
                              "(docker run --shm-size=8g or --ipc=host)"), error
    assert "/dev/shm" not in (classify(RuntimeError("DataLoader worker (pid 1) exited unexpectedly")).error or "")
    monkeypatch.setattr(failures, "collect_shm", lambda: ShmInfo("/dev/shm", 32 * 2**30, 32 * 2**30))
    assert (classify(RuntimeError(bus)).error or "").endswith(
        "; a worker's bus error (SIGBUS) means /dev/shm (32.0 GiB, 32.0 GiB free) ran full for a moment, or a memory-mapped "
        "file the dataset reads was cut short")
    assert "is too small" in (classify(RuntimeError(full)).error or "")  # that one cannot be a file cut short


def _skip_unless_mounts_are_private(mount: str) -> None:
    """Skip where this process may not run ``mount`` (``sh -c``) in a private mount namespace (``unshare -m``: root)."""
    allowed = subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", "true"], capture_output=True, timeout=60, check=False)
    if allowed.returncode != 0:
        pytest.skip(f"this process may not mount in a private namespace: {allowed.stderr.decode(errors='replace').strip()}")


def _tiny_trial(cache_dir: Path, *extra: str) -> list[str]:
    """``autotune trial`` of a tiny CNN at 32 px for 1 s on the CPU, and ``extra`` flags."""
    return [sys.executable, "-m", "autotune", "trial", "--model", "factories:tiny_cnn", "--image-size", "32", "--synthetic-images",
            "64", "--cache-dir", str(cache_dir), "--device", "cpu", "--trial-seconds", "1", *extra]


#: A private 64 KiB /dev/shm (as a container's may be), and the same filled to its last byte before the command runs.
SMALL_SHM = "mount --make-rprivate / && mount -t tmpfs -o size=64k tmpfs /dev/shm"
FILLED = " && { dd if=/dev/zero of=/dev/shm/fill bs=4k 2>/dev/null; true; }"


@pytest.mark.slow
@pytest.mark.parametrize("filled", [False, True])
def test_a_trial_on_a_real_full_dev_shm_names_it(cache_dir, filled: bool) -> None:
    """``autotune trial`` with a loader worker in a private mount namespace whose /dev/shm is a 64 KiB tmpfs (as a
    container's may be): the trial's error names /dev/shm, its size and the fix. Filled to its last byte, the DataLoader
    fails as it starts its workers (Python's OSError ENOSPC creating their queue's lock): that read as a full disk."""
    mount = SMALL_SHM + (FILLED if filled else "") + " && exec \"$@\""
    _skip_unless_mounts_are_private(mount)
    trial = _tiny_trial(cache_dir, "--batch-size", "16", "--workers", "1", "--json")
    then_list = mount.replace(' && exec "$@"', ' && { "$@"; code=$?; ls -A /dev/shm >&2; exit $code; }')
    result = subprocess.run(["unshare", "-m", "sh", "-c", then_list, "sh", *trial], capture_output=True, text=True,
                            timeout=WAIT_S, cwd=TESTS)
    error = json.loads(result.stdout)["error"]
    said = "unable to allocate shared memory for the loader workers' queue lock" if filled else "failed in a DataLoader worker"
    assert said in error and "; /dev/shm (64 KiB, " in error, error
    assert error.endswith("(docker run --shm-size=8g or --ipc=host)"), error
    # The worker's file of the failed allocation (torch_<pid>_..., named for a worker that ended) is removed, one a
    # search left per such trial; before, nothing removed it.
    assert [name for name in result.stderr.split() if name.startswith("torch_")] == [], result.stderr


@pytest.mark.slow
def test_a_trial_whose_batches_in_flight_exceed_a_real_dev_shm_fails_at_its_first_batch(cache_dir) -> None:
    """A 1 MiB /dev/shm holds one batch of 16 at 32 px (192 KiB) but not 2 workers x prefetch 4 of them: a short trial
    whose training outpaced its loader never filled the queue and measured `ok` (in an 8 MiB one, 43 samples/s), then
    failed in every confirmation round and alone. Its first batch now tells, with the size the search's skips read."""
    mount = "mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs /dev/shm && exec \"$@\""
    _skip_unless_mounts_are_private(mount)
    for workers, prefetch, fits in (("2", "4", False), ("1", "2", True)):
        trial = _tiny_trial(cache_dir, "--batch-size", "16", "--workers", workers, "--prefetch", prefetch, "--synthetic-images", "256", "--json")
        result = subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", *trial], capture_output=True, text=True, timeout=WAIT_S,
                                cwd=TESTS)
        outcome = json.loads(result.stdout)
        if fits:
            assert outcome["status"] == "ok", outcome
            continue
        assert outcome["status"] == "error" and outcome["error"].startswith(
            "/dev/shm (1 MiB, ") and " free) is too small for this setup's batches in flight (workers x prefetch x batch): 8 " \
            "batches of 192 KiB in flight need 2 MiB; fewer workers" in outcome["error"], outcome


def test_only_files_a_failed_allocation_left_are_removed_from_the_dev_shm(tmp_path) -> None:
    """What is removed after a trial that ran out of /dev/shm: PyTorch's files named for a process that ended (a zombie
    counts as ended), holding no block, made since the trial began. A live process's file, one holding data, one older
    than the trial and any other name stay."""
    import os
    import time

    from autotune.runner.shm_leftovers import remove_failed_allocations

    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])  # not reaped: a zombie until this test reaps it
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)  # until it has exited, however loaded the machine
    assert open(f"/proc/{zombie.pid}/stat").read().split(") ")[1].startswith("Z")
    began = time.time() - 1
    files = {
        "gone": f"torch_{ended.pid}_1_0", "zombie": f"torch_{zombie.pid}_2_0", "alive": f"torch_{os.getpid()}_3_0",
        "data": f"torch_{ended.pid}_4_1", "old": f"torch_{ended.pid}_5_2", "other": f"pymp_{ended.pid}_6_0",
    }
    for key, name in files.items():
        with open(tmp_path / name, "wb") as fh:
            fh.truncate(1 << 16)  # sparse, as a failed allocation leaves it
            if key == "data":
                fh.write(b"x" * 4096)
    os.utime(tmp_path / files["old"], (began - 60, began - 60))
    removed = remove_failed_allocations(began, tmp_path)
    zombie.wait()
    assert sorted(p.name for p in removed) == sorted([files["gone"], files["zombie"]])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files[k] for k in ("alive", "data", "old", "other"))
    assert remove_failed_allocations(began, tmp_path / "none") == []  # no such directory: nothing to do
    # A worker of the trial's own group, which its SIGKILL reached, not yet dead on a loaded machine (a CI run left its
    # file): waited for, however long it takes to end; another live process's file beside it is left at once.
    ending = subprocess.Popen(["sleep", "0.3"], start_new_session=True)  # the group of a trial: its own pid
    (tmp_path / "later").mkdir()
    for name in (f"torch_{ending.pid}_7_0", f"torch_{os.getpid()}_8_0"):
        (tmp_path / "later" / name).write_bytes(b"")
    assert [p.name for p in remove_failed_allocations(began, tmp_path / "later", group=ending.pid)] == [f"torch_{ending.pid}_7_0"]
    ending.wait()


def test_the_dev_shm_check_counts_what_stays_there_and_never_fails_on_a_batch_it_cannot_read(monkeypatch) -> None:
    """A sparse or jagged nested tensor has no storage to read: the first version raised on it, failing every setup with
    workers of such a Task. Pinning moves each batch out of /dev/shm as it arrives: only those in the workers' hands stay."""
    import torch

    import autotune.runner.shm_fit as shm_fit
    from autotune.runner.failures import ShmTooSmall
    from autotune.train_setup import TrainSetup
    from probes.memory import ShmInfo

    dense = torch.zeros(4, 256)  # 4 KiB
    jagged = torch.nested.nested_tensor([torch.zeros(3), torch.zeros(5)], layout=torch.jagged)
    assert shm_fit.batch_bytes((dense, dense[1:], {"sparse": torch.eye(4).to_sparse(), "jagged": jagged})) == 4096  # a view: once
    monkeypatch.setattr(shm_fit, "collect_shm", lambda: ShmInfo(path="/dev/shm", total_bytes=20 * 1024, free_bytes=20 * 1024))
    queued = TrainSetup(batch_size=4, num_workers=2, prefetch_factor=4)  # 8 batches of 4 KiB: 32 KiB
    with pytest.raises(ShmTooSmall, match=r"^/dev/shm \(20 KiB, 20 KiB free\) is too small .*: 8 batches of 4 KiB in flight need 32 KiB"):
        next(shm_fit.checked_in_flight(iter([dense]), queued))
    assert next(shm_fit.checked_in_flight(iter([dense]), queued.replace(pin_memory=True))) is dense  # 3 batches: 12 KiB
    with pytest.raises(ShmTooSmall, match=r": 12 batches of 4 KiB in flight \(over 4 ranks\) need 48 KiB"):  # DDP ranks share it
        next(shm_fit.checked_in_flight(iter([dense]), queued.replace(pin_memory=True), ranks=4))
    sparse_only = (torch.eye(4).to_sparse(), jagged)
    assert next(shm_fit.checked_in_flight(iter([sparse_only]), queued)) is sparse_only


def test_a_read_only_dev_shm_is_named_by_the_probe_and_a_trial(cache_dir, tmp_path) -> None:
    """A read-only /dev/shm (a container's read-only tmpfs): the probe showed its free space without a warning, and a
    trial with a loader worker ended `OSError: [Errno 30] Read-only file system: '/dev/shm/pym-...'` with no advice."""
    empty = tmp_path / "empty"
    empty.mkdir()
    mount = f"mount --make-rprivate / && mount --bind {empty} /dev/shm && mount -o remount,bind,ro /dev/shm && exec \"$@\""
    _skip_unless_mounts_are_private(mount)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", sys.executable, "-m", "autotune", "probe", "--json"],
                           capture_output=True, text=True, timeout=WAIT_S, cwd=TESTS)
    report = json.loads(probe.stdout)
    assert report["shm"]["writable"] is False and any(w.startswith("/dev/shm is read-only") for w in report["warnings"]), report
    trial = _tiny_trial(cache_dir, "--batch-size", "16", "--workers", "1", "--json")
    result = subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", *trial], capture_output=True, text=True, timeout=WAIT_S,
                            cwd=TESTS)
    error = json.loads(result.stdout)["error"]
    assert "Read-only file system" in error and error.endswith("; /dev/shm is read-only to this process: loader workers hand every "
                                                                "batch over through it (mount a writable tmpfs there)"), error


def test_a_full_temporary_directory_is_one_line_not_a_server_terminated_from_outside(cache_dir, tmp_path) -> None:
    """TMPDIR on a full filesystem: the trial could not write its files, nor its server the exit status, and the trial
    read `interrupted: the trial server was terminated from outside` (a search stopped as if by Ctrl-C, exit 130)."""
    full = tmp_path / "full"
    full.mkdir()
    mount = f"mount --make-rprivate / && mount -t tmpfs -o size=4k tmpfs {full} && exec \"$@\""
    _skip_unless_mounts_are_private(mount)
    trial = _tiny_trial(cache_dir)
    result = subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", *trial], capture_output=True, text=True, timeout=WAIT_S,
                            cwd=TESTS, env={**os.environ, "TMPDIR": str(full)})
    last = result.stderr.splitlines()[-1] if result.stderr else ""
    assert result.returncode == 1 and last.startswith(f"error: cannot write a trial's files in the temporary directory {full} (") and (
        last.endswith("): free space there, or point TMPDIR at a directory with room")), result.stderr


def test_a_trial_server_that_ended_by_itself_is_no_interrupt(tmp_path, monkeypatch) -> None:
    """The trial's exit status went unwritten and its server ended with a code of its own (its idle exit): that is an
    error of the trial, said with the room left. A server ended by a stop signal, or closed by this search (exit 0), was
    terminated from outside; one the kernel's OOM killer took (its counters rose) is an ``oom`` trial, and one killed
    otherwise (SIGKILL: earlyoom picks it once no trial runs, its oom_score_adj the highest left) an ``error``: the search
    goes on, where it stopped as interrupted (exit 130)."""
    import autotune.runner.failures as failures
    from autotune.records import TrialOptions
    from autotune.runner.launch import supervise

    class Gone:
        def __init__(self, server: int) -> None:
            self.server, self.pid = server, os.getpid()  # a TrialProcess's pid: its supervisor measures the load on its tree

        def exitcode(self) -> None:
            return None

        def lost(self) -> int:
            return self.server

    ended = supervise(Gone(75), tmp_path, TrialOptions(), None, None).result  # type: ignore[arg-type]
    assert ended.status == "error" and ended.error is not None and ended.error.startswith(
        f"the trial server ended (exit 75) without the trial's exit status, which it writes in {tmp_path.parent} ("), ended
    for code in (-signal.SIGTERM, 0):
        terminated = supervise(Gone(code), tmp_path, TrialOptions(), None, 5).result  # type: ignore[arg-type]
        assert terminated.status == "interrupted" and "terminated from outside" in (terminated.error or ""), (code, terminated)
    monkeypatch.setattr(failures, "oom_kills", lambda: 5)  # the kernel's counters as when the trial started: no OOM kill
    killed = supervise(Gone(-signal.SIGKILL), tmp_path, TrialOptions(), None, 5).result  # type: ignore[arg-type]
    assert killed.status == "error" and (killed.error or "").startswith(
        "the trial server, and its trial with it, was killed (SIGKILL) from outside; not by the kernel's out-of-memory killer"), killed
    assert "user-space OOM daemon (earlyoom, systemd-oomd)" in (killed.error or "")
    monkeypatch.setattr(failures, "oom_kills", lambda: 6)  # the counters rose since the trial started (5)
    oom = supervise(Gone(-signal.SIGKILL), tmp_path, TrialOptions(), None, 5).result  # type: ignore[arg-type]
    assert oom.status == "oom" and "by the kernel's out-of-memory killer" in (oom.error or ""), oom


def test_the_oom_kill_counters_are_read_from_vmstat_and_the_memory_cgroup(tmp_path) -> None:
    from probes.cgroup import oom_kills, parse_oom_kills

    assert parse_oom_kills("pgfault 10\noom_kill 3\n") == 3 and parse_oom_kills("low 0\nhigh 0\n") is None
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 2\n")
    v1 = tmp_path / "cg" / "memory" / "job"
    v1.mkdir(parents=True)
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 4\n")
    assert oom_kills(tmp_path / "cg", "4:memory:/job\n", vmstat) == 6
    assert oom_kills(tmp_path / "none", "", tmp_path / "missing") is None  # not Linux: unknown, and a SIGKILL stays oom


@pytest.mark.slow
@pytest.mark.parametrize("safe_path", [True, False], ids=["python -P", "python 3.10's -c"])
def test_a_fresh_trial_server_skips_unread_replies_and_ignores_the_working_directory(
    tmp_path, cache_dir, monkeypatch, safe_path
) -> None:
    """A launch cut off after its request leaves the server's pid reply in the pipe; the next launch skips it.

    The server, started where a user's json.py lies, does not import it (``-P``: the working directory is not
    on its sys.path; on Python 3.10, which has no ``-P``, the ``-c`` command that takes it off).
    """
    from dataclasses import asdict

    import autotune.runner.zygote as zygote_module
    from autotune.runner.zygote import REQUEST, Zygote

    command = zygote_module.server_command
    monkeypatch.setattr(zygote_module, "server_command", lambda: command(safe_path))

    setup, workload, options = _never_ending(cache_dir)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    marker = tmp_path / "imported"
    (cwd / "json.py").write_text(f"open({str(marker)!r}, 'w').close()\nraise SystemExit('shadowed json')\n")
    monkeypatch.chdir(cwd)
    zygote = Zygote()
    zygote.disabled = False
    try:
        first, second = tmp_path / "first", tmp_path / "second"
        for directory in (first, second):
            directory.mkdir()
            request = {"setup": setup.to_dict(), "workload": workload.to_dict(), "options": asdict(options)}
            (directory / REQUEST).write_text(json.dumps(request))
        assert zygote._start()
        assert zygote._proc is not None and zygote._proc.stdin is not None
        zygote._proc.stdin.write(f"{first}\n".encode())  # the interrupted launch: request sent, reply never read
        zygote._proc.stdin.flush()
        proc = zygote.launch(second)
        assert proc.directory == second
        proc.kill()  # must kill the second trial, not the first
        assert proc.wait_reaped(timeout=60.0), "the second trial was not the one killed"
        assert proc.exitcode() == -signal.SIGKILL
        assert not (first / "exit").exists()  # the first one still runs (the server takes it down at close)
    finally:
        zygote.close()
    assert not marker.exists()


def test_the_server_going_away_kills_a_trial_that_has_not_reached_its_setsid_yet(monkeypatch) -> None:
    """A trial forked just before the search went (an interrupt right after the launch) leads no process group until
    its setsid(): the server's killpg at the end of its input missed it, and it ran on orphaned, its directory
    removed under it (a loader trial hung in poll for an hour). A process in this test's group stands in for it."""
    from autotune.runner import server

    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])  # no group of its own, as before setsid
    try:
        monkeypatch.setattr(server, "_children", {orphan.pid: "/nonexistent/trial"})
        server.kill_children()
        assert orphan.wait(timeout=30) == -signal.SIGKILL
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()


def test_a_prestarted_server_serves_the_first_trial_and_an_unused_one_is_killed_not_waited_for(tmp_path, cache_dir) -> None:
    """A search starts the server before its own checks; a bad input found by them must not wait for its imports."""
    from dataclasses import asdict

    from autotune.runner.zygote import REQUEST, Zygote

    setup, workload, options = _never_ending(cache_dir)
    zygote = Zygote()
    zygote.disabled = False
    try:
        zygote.prestart()
        server = zygote._proc
        zygote.prestart()  # a second call starts nothing
        assert server is not None and zygote._proc is server
        request = {"setup": setup.to_dict(), "workload": workload.to_dict(), "options": asdict(options)}
        (tmp_path / REQUEST).write_text(json.dumps(request))
        proc = zygote.launch(tmp_path)
        assert zygote._proc is server  # the prestarted server forked the trial
        proc.kill()
        assert proc.wait_reaped(timeout=60.0) and proc.exitcode() == -signal.SIGKILL
    finally:
        zygote.close()
    assert server.poll() is not None  # no server left behind (it winds down within 5 s, or is killed: load decides which)
    unused = Zygote()
    unused.disabled = False
    unused.prestart()
    importing = unused._proc
    unused.close()
    assert importing is not None and importing.returncode == -signal.SIGKILL and unused._proc is None


@pytest.mark.slow
def test_an_idle_trial_server_ends_and_the_next_trial_starts_another(tmp_path, cache_dir, monkeypatch) -> None:
    """A Python caller's search() or trial() left the server (torch imported: hundreds of MiB) until its own exit. It
    now ends once idle, never while a trial of its own runs, and the next launch starts another, a second time where
    the server ended idle as the request went to it (a stand-in that reads the request and exits with the idle code);
    a server that ended otherwise without answering gets the fresh-interpreter fallback, not a second try."""
    from dataclasses import asdict

    from autotune.runner import zygote as zygote_module
    from autotune.runner.server import IDLE_ENV
    from autotune.runner.zygote import IDLE_EXIT, REQUEST, Zygote

    monkeypatch.setenv(IDLE_ENV, "3")
    setup, workload, options = _never_ending(cache_dir)
    request = json.dumps({"setup": setup.to_dict(), "workload": workload.to_dict(), "options": asdict(options)})
    directories = [tmp_path / name for name in ("a", "b", "c", "d")]
    for directory in directories:
        directory.mkdir()
        (directory / REQUEST).write_text(request)
    zygote = Zygote()
    zygote.disabled = False
    try:
        first = zygote.launch(directories[0])
        server = zygote._proc
        assert server is not None and first._server is server
        time.sleep(7)  # two idle periods while the trial runs: the server stays
        assert server.poll() is None
        first.kill()
        assert first.wait_reaped(timeout=60.0)
        assert server.wait(timeout=120) == IDLE_EXIT  # idle: it ends by itself
        second = zygote.launch(directories[1])
        assert second._server is not None and second._server is not server  # another server, not the fresh-interpreter fallback
        second.kill()
        assert second.wait_reaped(timeout=60.0)
        zygote.close()
        real = zygote_module.server_command()
        answers_nothing = [sys.executable, "-c", "import os, sys; print('ready', flush=True); sys.stdin.readline(); os._exit({})"]
        commands = iter([[*answers_nothing[:2], answers_nothing[2].format(IDLE_EXIT)], real,
                         [*answers_nothing[:2], answers_nothing[2].format(0)], real])
        monkeypatch.setattr(zygote_module, "server_command", lambda: next(commands, real))
        third = zygote.launch(directories[2])
        assert third._server is not None and third._server.args == real  # the second try, on a real server
        third.kill()
        assert third.wait_reaped(timeout=60.0) and third.exitcode() == -signal.SIGKILL
        zygote.close()
        fourth = zygote.launch(directories[3])  # ended, not idle: the fallback, which starts its own interpreter
        assert fourth._server is None and fourth._popen is not None
        fourth.kill()
    finally:
        zygote.close()


def test_the_trial_server_s_idle_time_is_read_before_it_is_ready_and_a_bad_one_is_the_default(monkeypatch) -> None:
    """A bad AUTOTUNE_SERVER_IDLE_S ended the server right after "ready" (a ValueError, or at once for 0)."""
    from autotune.runner.server import IDLE_ENV, IDLE_S, idle_seconds

    for value, seconds in (("5", 5.0), ("abc", IDLE_S), ("0", IDLE_S), ("-3", IDLE_S), ("inf", IDLE_S), ("nan", IDLE_S)):
        monkeypatch.setenv(IDLE_ENV, value)
        assert idle_seconds() == seconds, value


def test_an_interrupted_trial_stops_the_search_and_is_never_stored(tmp_path, cache_dir) -> None:
    from autotune.errors import SearchInterrupted
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search

    calls: list[str] = []

    def runner(setup, workload, options=None, *, on_window=None):
        if options.mode != "train":
            return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)
        calls.append("train")
        if len(calls) == 2:
            return TrialResult(status="interrupted", error="the trial process was terminated from outside (SIGTERM)")
        return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(SearchInterrupted, match=r"^interrupted: 1 finished trial kept in ") as stopped:  # the interrupted one is not kept
        run_search(config, runner=runner)
    # The user pressed nothing (earlyoom's SIGTERM, say): the line says what stopped the search.
    assert str(stopped.value).endswith("(what stopped it: the trial process was terminated from outside (SIGTERM))")
    study = study_of(tmp_path / "out")
    assert [t.state for t in study.trials[:2]] == [TrialState.COMPLETE, TrialState.FAIL]
    assert "result" not in study.trials[1].user_attrs  # not recorded as the setup's failure


def test_defaults_interrupted_then_a_rerun_stopped_before_them_says_they_were_not_measured_yet(tmp_path, cache_dir) -> None:
    """The defaults (#0) interrupted, the rerun runs them again after the guesses; stopped before them, its best.json
    says they were not measured yet, not that their trial ended without a throughput (trials.csv has no row of them)."""
    from autotune.errors import SearchInterrupted
    from autotune.output.best import read_best
    from autotune.tuner import SearchConfig, run_search

    calls: list[str] = []

    def runner(setup, workload, options=None, *, on_window=None):
        if options.mode != "train":
            return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)
        calls.append(setup.describe())
        if len(calls) in (1, 3):  # the defaults in the first run; the rerun's second trial
            return TrialResult(status="interrupted", error="the trial process was terminated from outside (SIGTERM)")
        return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=4, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    for _ in range(2):
        with pytest.raises(SearchInterrupted):
            run_search(config, runner=runner)
    assert calls[0] == "bs=32 w=0 fp32" and "bs=32 w=0 fp32" not in calls[1:], calls
    notes = read_best(tmp_path / "out" / "best.json").notes
    assert any(n.startswith("the PyTorch defaults (bs=32 w=0 fp32) were not measured yet") for n in notes), notes
    assert not any("ended without a throughput" in n for n in notes), notes


def test_a_ctrl_c_while_a_measured_trial_is_stored_keeps_it(tmp_path, cache_dir, monkeypatch) -> None:
    """A real SIGINT that lands while the second trial's result is written waits for the write: the trial counts
    (complete, in trials.csv) and the search stops after it, as docs/search.md promises."""
    import csv

    from autotune.errors import SearchInterrupted
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study import SearchStudy

    record = SearchStudy.record

    def record_then_ctrl_c(self, trial, *args, **kwargs):
        if trial.number == 1:
            os.kill(os.getpid(), signal.SIGINT)
            sum(range(1000))  # the signal's handler runs here, inside the write
        return record(self, trial, *args, **kwargs)

    monkeypatch.setattr(SearchStudy, "record", record_then_ctrl_c)
    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(SearchInterrupted, match=r"^interrupted: 2 finished trials kept in "):
        run_search(config, runner=steady_runner)
    study = study_of(tmp_path / "out")
    assert [t.state for t in study.trials[:2]] == [TrialState.COMPLETE, TrialState.COMPLETE]
    assert TrialState.RUNNING not in [t.state for t in study.trials]
    assert "result" in study.trials[1].user_attrs
    with open(tmp_path / "out" / "trials.csv", newline="", encoding="utf-8") as fh:
        assert [row["trial"] for row in csv.DictReader(fh)] == ["0", "1"]


def test_a_study_storage_that_fails_mid_search_is_one_line_and_keeps_the_trials_stored(tmp_path, cache_dir, monkeypatch) -> None:
    """A full disk under study.db while a trial is stored (SQLite's own error, wrapped by Optuna as on a real full
    tmpfs): one StorageError line naming the cause and the rerun, not an internal error; the trials before stay."""
    import sqlalchemy.exc

    from autotune.errors import StorageError
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study import SearchStudy

    record = SearchStudy.record

    def record_on_a_full_disk(self, trial, *args, **kwargs):
        if trial.number == 1:
            full = sqlalchemy.exc.OperationalError("INSERT INTO trial_user_attributes ...", {}, Exception("database or disk is full"))
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from full
        return record(self, trial, *args, **kwargs)

    monkeypatch.setattr(SearchStudy, "record", record_on_a_full_disk)
    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(StorageError, match=r"^cannot write to the study storage sqlite:///.*study.db: .*database or disk is full; "
                                           r".*rerun the same command") as caught:
        run_search(config, runner=steady_runner)
    assert "\n" not in str(caught.value)
    assert study_of(tmp_path / "out").trials[0].state == TrialState.COMPLETE  # measured before the disk filled: kept


def test_a_storage_failure_says_what_to_do_for_its_cause(tmp_path) -> None:
    """Every failure said `free disk space or bring the storage back`: a read-only mount was told to free space, and an
    --out removed whole was pointed at its trials.csv, gone with it."""
    import sqlalchemy.exc

    from autotune.tuner.storage import storage_failure

    def said(storage: str, text: str) -> str:
        cause = sqlalchemy.exc.OperationalError("INSERT ...", {}, Exception(text))
        return str(storage_failure(storage, cause))

    out = tmp_path / "out"
    out.mkdir()
    (out / "study.db").write_bytes(b"")
    sqlite = f"sqlite:///{out / 'study.db'}"
    assert said(sqlite, "database or disk is full").endswith("(finished trials, calibration): free disk space, then rerun the same "
                                                             "command to resume")
    assert ": make it writable again, then rerun" in said(sqlite, "attempt to write a readonly database")
    assert ": make it writable again, then rerun" in said(sqlite, "unable to open database file")
    assert ": bring the storage back, then rerun" in said("postgresql://u:secret@db/x", "server closed the connection unexpectedly")
    (out / "study.db").unlink()
    assert "study.db was removed or moved while the search ran" in said(sqlite, "unable to open database file")
    out.rmdir()
    assert said(sqlite, "unable to open database file").endswith(
        f"{out} was removed or moved during the search, with the study.db and trials.csv in it: put it back, or search "
        "again with another --out or --storage")
    assert ", with runs.db in it: put it back" in said(f"sqlite:///{tmp_path / 'gone' / 'runs.db'}", "unable to open database file")
    assert ": bring the storage back, then rerun" in said("postgresql://db/x", "connection successfully closed by the server")


@pytest.mark.parametrize("damage", ["removed", "truncated"])
def test_a_study_db_removed_or_damaged_mid_search_is_said_as_such(tmp_path, cache_dir, monkeypatch, damage: str) -> None:
    """study.db deleted (or cut short) while the search runs: the line said `what it stored before this is kept ...: free
    disk space`, both untrue; it names the file and what happened to it."""
    from autotune.errors import StorageError
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study import SearchStudy

    record, db = SearchStudy.record, tmp_path / "out" / "study.db"

    def record_after_the_damage(self, trial, *args, **kwargs):
        if trial.number == 1:
            if damage == "removed":
                db.unlink()
            else:
                with open(db, "r+b") as fh:
                    fh.truncate(8192)
                    fh.seek(100)
                    fh.write(b"\xff" * 4000)
        return record(self, trial, *args, **kwargs)

    monkeypatch.setattr(SearchStudy, "record", record_after_the_damage)
    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    said = f"{db} was removed or moved while the search ran" if damage == "removed" else f"{db} was damaged while the search ran"
    with pytest.raises(StorageError, match=r"^cannot write to the study storage sqlite:///") as caught:
        run_search(config, runner=steady_runner)
    assert said in str(caught.value) and "free disk space" not in str(caught.value) and "\n" not in str(caught.value), caught.value


@pytest.mark.parametrize("file", ["train.py", "best.json"])
def test_a_full_disk_while_the_winner_is_written_says_what_is_kept_and_to_rerun(tmp_path, cache_dir, monkeypatch, file: str) -> None:
    """train.py or best.json (written after it) cannot be written (ENOSPC) after the confirmation: the line says the
    trials are kept and the rerun writes the winner; the rerun does (before: `cannot write OUT/train.py: No space left on
    device`, no advice; for best.json a bare `[Errno 28] No space left on device`, naming no file)."""
    import errno

    import autotune.output.best
    import autotune.output.emit
    from autotune.errors import AutotuneError
    from autotune.tuner import SearchConfig, run_search

    module = autotune.output.emit if file == "train.py" else autotune.output.best
    write = module.atomic_write_text

    def full(path, text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module, "atomic_write_text", full)
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(AutotuneError, match=rf"^cannot write .*{file}: No space left on device; 2 finished trials kept in "
                                            r"sqlite:///.*: fix that \(a full disk: free some space\) and rerun the same command"):
        run_search(config, runner=steady_runner)
    monkeypatch.setattr(module, "atomic_write_text", write)
    assert run_search(config, runner=steady_runner).best is not None and (tmp_path / "out" / "best.json").is_file()
    if file == "train.py":  # the same script again is left as it is: a disk without room for its copy is no failure
        from autotune.output.best import read_best

        best = read_best(tmp_path / "out")
        monkeypatch.setattr(module, "atomic_write_text", full)
        assert module.write_script(best, tmp_path / "out" / "train.py") == tmp_path / "out" / "train.py"
        with pytest.raises(AutotuneError, match="No space left on device"):  # another script still needs the room
            module.write_script(replace(best, lr=best.lr * 2), tmp_path / "out" / "train.py")


def steady_runner(setup, workload, options=None, *, on_window=None):
    """A fake trial: every setup ok, faster with a larger batch, the same every run."""
    from autotune.records import TrialResult

    return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(100.0,), peak_memory_bytes=2**20)


def test_an_interrupt_during_the_winner_s_ceilings_keeps_the_confirmed_winner(tmp_path, cache_dir, monkeypatch) -> None:
    """The confirmation finished: best.json holds the confirmed winner, and the message says so (not 'unconfirmed')."""
    import autotune.tuner.run
    from autotune.errors import SearchInterrupted
    from autotune.output.best import read_best
    from autotune.tuner import SearchConfig, run_search

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(autotune.tuner.run, "measure_ceilings", interrupted)
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, confirm_rounds=2,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(SearchInterrupted, match="the confirmed winner is in .*best.json; only its ceilings were skipped") as info:
        run_search(config, runner=steady_runner)
    assert "unconfirmed" not in str(info.value) and read_best(tmp_path / "out" / "best.json").confirmed


def _terminated_before(step: Any) -> Any:
    """``step`` that first sends this process SIGTERM (the search's handler, where it has one, runs before ``step`` does)."""

    def terminated(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGTERM)
        sum(range(1000))  # the handler runs on this thread's next bytecodes
        return step(*args, **kwargs)

    return terminated


class _Stopped(Exception):
    """What this test's own SIGTERM handler raises where the search has none (before: the process died, exit 143)."""


def _search_stopped(out: Path, cache_dir: Path) -> BaseException | None:
    """A tiny search in this process with a SIGTERM handler of the test's own (:class:`_Stopped`) where the search
    installs none; what it raised (a bare KeyboardInterrupt fails the test instead of stopping the session)."""
    from autotune.tuner import SearchConfig, run_search

    def refused(signum, frame):  # type: ignore[no-untyped-def]
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, refused)
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, confirm_rounds=2,
                          out=out, cache_dir=cache_dir, synthetic_images=64)
    try:
        run_search(config, runner=steady_runner)
    except BaseException as exc:
        return exc
    finally:
        signal.signal(signal.SIGTERM, previous)
    return None


@pytest.mark.parametrize("stop", ["sigterm", "ctrl-c"])
def test_a_stop_while_the_report_is_drawn_ends_as_interrupted_with_the_winner_written(tmp_path, cache_dir, monkeypatch, stop) -> None:
    """Drawing report.html takes seconds after the last measurement. A SIGTERM there killed the search silently (exit 143,
    no summary) and a Ctrl-C ended it as a bare KeyboardInterrupt ('Aborted!', exit 1): now either ends it as interrupted
    (exit 130), with the confirmed winner in best.json and train.py, and the page left to `autotune report`."""
    import autotune.tuner.study_report
    from autotune.errors import SearchInterrupted
    from autotune.output.best import read_best
    from autotune.tuner.study_report import report_study

    def drawn(data):
        if stop == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)  # delivered at once: the handler runs on this thread's next bytecode
            sum(range(1000))
        raise KeyboardInterrupt

    monkeypatch.setattr(autotune.tuner.study_report, "render_report", drawn)
    out = tmp_path / "out"
    caught = _search_stopped(out, cache_dir)
    assert isinstance(caught, SearchInterrupted), repr(caught)
    assert caught.exit_code == 130 and "interrupted while report.html was written" in str(caught)
    assert caught.outcome is not None and caught.outcome.best is not None and caught.outcome.ceilings is not None
    assert read_best(out / "best.json").confirmed and (out / "train.py").exists() and not (out / "report.html").exists()
    monkeypatch.undo()
    report_study(out)  # the page the message names
    assert "Winner:" in (out / "report.html").read_text()


def test_a_stop_while_the_report_s_files_are_written_waits_for_them_and_says_they_are(tmp_path, cache_dir, monkeypatch) -> None:
    """A Ctrl-C as report.html and its PNG copies were written left a new page beside an earlier run's PNGs, and the
    search said "report.html not written". The files of one report are written whole (a stop waits milliseconds for
    them), and the search's line says they are."""
    import autotune.tuner.study_report
    from autotune.errors import SearchInterrupted
    from autotune.output.best import read_best

    real = autotune.tuner.study_report.write_rendered
    stale = [p for p in (tmp_path / "out" / f"report-{n}.png" for n in ("summary", "history"))]

    def written(out, page, images):
        os.kill(os.getpid(), signal.SIGINT)  # a Ctrl-C as the first file is written
        sum(range(1000))
        return real(out, page, images)

    monkeypatch.setattr(autotune.tuner.study_report, "write_rendered", written)
    out = tmp_path / "out"
    out.mkdir()
    for path in stale:
        path.write_bytes(b"an earlier run's plot, autotune report")  # marked as the report's PNGs are
    caught = _search_stopped(out, cache_dir)
    assert isinstance(caught, SearchInterrupted), repr(caught)
    assert caught.exit_code == 130 and "interrupted as report.html was written; it is written" in str(caught)
    assert read_best(out / "best.json").confirmed and "Winner:" in (out / "report.html").read_text()
    assert not any(p.exists() and p.read_bytes() == b"an earlier run's plot, autotune report" for p in stale)


def test_a_stop_while_the_winner_is_written_waits_for_best_json_and_skips_only_the_ceilings(tmp_path, cache_dir, monkeypatch) -> None:
    """A SIGTERM after the confirmation, while the winner is chosen and best.json and train.py are written: before, the
    search died there (exit 143), possibly between the two files; now they are written whole, the confirmed winner
    stands, and the search ends as interrupted (exit 130) with its report."""
    import autotune.tuner.run
    from autotune.errors import SearchInterrupted
    from autotune.output.best import read_best

    monkeypatch.setattr(autotune.tuner.run, "finish", _terminated_before(autotune.tuner.run.finish))
    out = tmp_path / "out"
    caught = _search_stopped(out, cache_dir)  # _Stopped before: the search had no handler there
    assert isinstance(caught, SearchInterrupted), repr(caught)
    assert caught.exit_code == 130 and "only its ceilings were skipped" in str(caught)
    assert read_best(out / "best.json").confirmed and (out / "train.py").exists() and (out / "report.html").exists()


def test_a_rerun_interrupted_before_its_confirmation_keeps_the_earlier_confirmed_winner(tmp_path, cache_dir, monkeypatch) -> None:
    """Rerunning a finished search re-confirms; a Ctrl-C then must not replace the confirmed best.json with a guess."""
    import autotune.tuner.run
    from autotune.errors import SearchInterrupted
    from autotune.tuner import SearchConfig, run_search

    out = tmp_path / "out"
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, confirm_rounds=2,
                          out=out, cache_dir=cache_dir, synthetic_images=64, ceilings=False)
    run_search(config, runner=steady_runner)
    before = {name: (out / name).read_bytes() for name in ("best.json", "train.py")}

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(autotune.tuner.run, "confirm_finalists", interrupted)
    with pytest.raises(SearchInterrupted, match=r"the confirmed winner of an earlier run stays in .*best.json \(this run's best so far "
                                                r"is not confirmed\); rerun the same command to resume"):
        run_search(config, runner=steady_runner)
    assert {name: (out / name).read_bytes() for name in before} == before
    page = (out / "report.html").read_text()
    assert "Winner:" in page and "Best so far (not confirmed)" not in page and "an earlier run's confirmed winner kept" in page
    # With --trials raised the rerun draws a new trial first, and the earlier winner is still kept.
    with pytest.raises(SearchInterrupted, match="the confirmed winner of an earlier run stays in"):
        run_search(replace(config, trials=3), runner=steady_runner)
    assert (out / "best.json").read_bytes() == before["best.json"]


def status_line(out: Path) -> str:
    """The last line of ``autotune status OUT``."""
    return study_status(f"sqlite:///{out / 'study.db'}", None, out=out).lines()[-1]


def test_another_study_on_an_output_directory_is_refused_and_a_broken_best_json_blocks_nothing(tmp_path, cache_dir) -> None:
    from autotune.errors import UsageError
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study_report import report_study

    out = tmp_path / "out"
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, confirm_rounds=1,
                          out=out, cache_dir=cache_dir, synthetic_images=64, ceilings=False)
    run_search(config, runner=steady_runner)
    best = (out / "best.json").read_bytes()
    with pytest.raises(UsageError, match=r"holds the search of study 'resnet18-32px-cpu' \(its best.json, train.py and report.html\): "
                                         r"study 'resnet18-48px-cpu' would overwrite them; pass another --out"):
        run_search(replace(config, image_size=48), runner=steady_runner)
    assert (out / "best.json").read_bytes() == best and study_of(out).study_name == "resnet18-32px-cpu"
    # Read by URL with another directory, as `autotune report` is shown doing: the winner is in the search's own --out
    # (report said so; status said "the search stopped before it wrote one; rerun the search's command").
    other = tmp_path / "some-dir"
    other.mkdir()
    assert study_status(f"sqlite:///{out / 'study.db'}", None, out=other).lines()[-1] == (
        f"winner: confirmed, in the best.json of the search's own directory ({out}), not in {other} (it holds none): "
        "autotune status THAT_DIR shows it")
    moved = tmp_path / "db"  # a study file elsewhere (--storage), beside no best.json: no search directory to name
    moved.mkdir()
    shutil.copy(out / "study.db", moved / "study.db")
    assert study_status(f"sqlite:///{moved / 'study.db'}", None, out=other).lines()[-1].startswith(f"winner: none confirmed ({other} holds")
    (out / "best.json").write_bytes(best[:300])  # truncated: status and report still read the study
    status = study_status(f"sqlite:///{out / 'study.db'}", None, out=out)
    assert status.winner is None and status.lines()[-1].startswith(f"winner: not shown: {out / 'best.json'}: not valid JSON")
    truncated = (out / "best.json").read_bytes()
    (out / "best.json").unlink()  # a search killed before it wrote one: no file is named that is not there
    assert status_line(out) == (f"winner: none confirmed ({out} holds no best.json: the search stopped before it wrote one); "
                                "rerun the search's command to confirm one")
    (out / "best.json").symlink_to(tmp_path / "gone.json")  # a link whose target was removed is named, not read as no file
    assert status_line(out) == (f"winner: not shown: {out / 'best.json'}: a symbolic link to {tmp_path / 'gone.json'}, which does "
                                "not exist; rerun the search's command to write best.json again")
    (out / "best.json").unlink()
    (out / "best.json").write_bytes(truncated)
    warned: list[str] = []
    report_study(out, warn=warned.append)
    assert "winner not shown: " in (out / "report.html").read_text()
    assert len(warned) == 1 and warned[0].startswith(f"winner not shown: {out / 'best.json'}: not valid JSON"), warned  # and on stderr
    from typer.testing import CliRunner

    from autotune.cli import app

    said = CliRunner().invoke(app, ["report", str(out)])
    assert said.exit_code == 0 and f"warning: {warned[0]}" in " ".join(said.output.split()), said.output
    # An emptied or removed study.db beside the trials.csv it wrote: a new search would overwrite the only record left.
    trials = (out / "trials.csv").read_bytes()
    for lost in ("empty", "missing"):
        (out / "study.db").write_bytes(b"") if lost == "empty" else (out / "study.db").unlink()
        with pytest.raises(UsageError, match=f"holds the trials.csv of an earlier search but its study.db is {lost}: "):
            run_search(config, runner=steady_runner)
        assert (out / "trials.csv").read_bytes() == trials


class _DropsItsInterrupt:
    """Sends this process SIGINT from a finalizer: the handler runs there, and Python prints and drops its KeyboardInterrupt."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        sum(range(1000))  # the pending signal's handler runs here


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the dropped interrupt, reported by pytest
def test_a_ctrl_c_whose_interrupt_python_dropped_still_stops_the_search(tmp_path, cache_dir) -> None:
    """A KeyboardInterrupt raised inside a garbage-collector callback is lost; the search still stops after the trial."""
    from autotune.errors import SearchInterrupted
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search

    calls: list[str] = []

    def runner(setup, workload, options=None, *, on_window=None):
        if options.mode == "train":
            calls.append("train")
            if len(calls) == 2:
                _DropsItsInterrupt()  # collected at once: the interrupt is raised and dropped in __del__
        return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(SearchInterrupted):
        run_search(config, runner=runner)
    assert len(calls) == 2  # nothing ran after it
    assert [t.state for t in study_of(tmp_path / "out").trials[:2]] == [TrialState.COMPLETE, TrialState.FAIL]
    # A later search in the same process starts afresh.
    run_search(SearchConfig(**{**config.__dict__, "out": tmp_path / "again", "trials": 1}), runner=runner)


# --------------------------------------------------------------- bad data, broken models
def test_data_check_uses_the_loaders_rules_and_names_the_directory(tmp_path) -> None:
    """Hidden and empty sub-directories are classes to ImageFolder: refused up front, by name."""
    from autotune.errors import WorkloadError
    from autotune.workloads.folders import check_image_folder

    data = tmp_path / "photos"
    (data / "cats").mkdir(parents=True)
    (data / "cats" / "a.jpg").write_bytes(b"x")
    (data / "dogs" / "nested").mkdir(parents=True)
    (data / "dogs" / "nested" / "b.JPG").write_bytes(b"x")  # found recursively, case-insensitively
    assert check_image_folder(data).classes == 2
    (data / ".thumbnails").mkdir()
    with pytest.raises(WorkloadError, match=r"class directory .*photos/\.thumbnails holds no images"):
        check_image_folder(data)
    (data / ".thumbnails").rmdir()
    (data / "empty").mkdir()
    with pytest.raises(WorkloadError, match=r"photos/empty holds no images"):
        check_image_folder(data)
    (data / "empty").rmdir()
    # A link to a directory that holds it: ImageFolder would read the tree again and again through it.
    (data / "cats" / "again").symlink_to("..")
    with pytest.raises(WorkloadError, match=r"cats/again links to .*photos, which holds the link itself"):
        check_image_folder(data)
    (data / "cats" / "again").unlink()
    (data / "cats" / "dogs").symlink_to(data / "dogs")  # a link elsewhere in the tree is no loop
    assert check_image_folder(data).images == 3
    (data / "cats" / "dogs").unlink()
    # Loops through more than one link, which a walk that follows none missed: two folders linking to each other, and a
    # loop inside a class folder that is itself a link (ImageFolder follows both, round after round).
    (data / "cats" / "to_dogs").symlink_to(data / "dogs")
    (data / "dogs" / "to_cats").symlink_to(data / "cats")
    with pytest.raises(WorkloadError, match=r"(cats/to_dogs/to_cats links to .*photos/cats|dogs/to_cats/to_dogs links to "
                                            r".*photos/dogs), which holds the link itself"):  # whichever the walk meets first
        check_image_folder(data)
    (data / "cats" / "to_dogs").unlink()
    (data / "dogs" / "to_cats").unlink()
    elsewhere = tmp_path / "birds"
    (elsewhere / "inner").mkdir(parents=True)
    (elsewhere / "c.jpg").write_bytes(b"x")
    (elsewhere / "inner" / "back").symlink_to(elsewhere)
    (data / "birds").symlink_to(elsewhere)
    with pytest.raises(WorkloadError, match=r"photos/birds/inner/back links to .*/birds, which holds the link itself"):
        check_image_folder(data)
    (data / "birds").unlink()
    # A link to a folder above --data (its parent, /): named at once, not after a walk of every tree beside --data.
    (data / "cats" / "top").symlink_to(tmp_path)
    with pytest.raises(WorkloadError, match=r"photos/cats/top links to .*, which holds the link itself"):
        check_image_folder(data)


def test_split_folders_or_one_class_are_allowed_with_a_warning(tmp_path) -> None:
    """--data one level too high: train/ and val/ become the classes, or one class gets every image."""
    from autotune.workloads.folders import check_image_folder

    data = tmp_path / "imagenet"
    for split in ("train", "val"):
        (data / split / "n01440764").mkdir(parents=True)
        (data / split / "n01440764" / "a.jpg").write_bytes(b"x")
    folder = check_image_folder(data)
    assert folder.classes == 2 and folder.warning is not None
    assert "train, val, which look like dataset splits" in folder.warning and f"--data {data / 'train'}?" in folder.warning
    single = check_image_folder(data / "train")
    assert single.classes == 1 and single.warning == f"{data / 'train'} holds one class folder (n01440764): every image gets the same label"
    (data / "train" / "n01443537").mkdir()
    (data / "train" / "n01443537" / "b.jpg").write_bytes(b"x")
    assert check_image_folder(data / "train").warning is None
    # A class folder that links to another: its images are read twice, under two labels, without a word before.
    (data / "train" / "tench").symlink_to(data / "train" / "n01440764")
    assert check_image_folder(data / "train").warning == (f"class folders n01440764 and tench of {data / 'train'} are one "
                                                          "directory (a symbolic link): its images are read twice, under 2 labels")


def test_a_folder_unpacked_from_a_mac_archive_is_refused_in_one_line_listing_its_metadata_files(tmp_path) -> None:
    """AppleDouble files (cat/._a.jpg) and a __MACOSX folder end in image extensions: ImageFolder reads them and fails
    on the first, so a probe's folder of 40 needed 40 reruns, one file named each time. One line names them all."""
    from autotune.errors import WorkloadError
    from autotune.workloads.folders import check_image_folder

    data = tmp_path / "pets"
    for name in ("cat", "dog", "__MACOSX/cat", "__MACOSX/dog"):
        (data / name).mkdir(parents=True)
    for name in ("cat/a.jpg", "dog/b.jpg", "cat/._a.jpg", "dog/._b.jpg", "__MACOSX/cat/._a.jpg", "__MACOSX/dog/._b.jpg"):
        (data / name).write_bytes(b"x")
    with pytest.raises(WorkloadError, match=rf"^data directory {data} holds 4 macOS metadata files \('\._' files such as "
                                            rf"__MACOSX/cat/\._a\.jpg\) and a __MACOSX folder, which unpacking .*; remove them "
                                            rf"\(find -L {data} -name '\._\*' -delete; find -L {data} -name __MACOSX -prune "
                                            rf"-exec rm -rf \{{\}} \+\) and rerun$"):
        check_image_folder(data)
    import shutil

    shutil.rmtree(data / "__MACOSX")
    with pytest.raises(WorkloadError, match=r"holds 2 macOS metadata files .*; remove them \(find -L \S+ -name '\._\*' -delete\) and rerun$"):
        check_image_folder(data)
    for junk in data.glob("*/._*"):
        junk.unlink()
    assert check_image_folder(data).images == 2
    flat = tmp_path / "flat"  # images with no class folder: the layout, and what to do
    flat.mkdir()
    for name in ("a.jpg", "b.png", "notes.txt"):
        (flat / name).write_bytes(b"x")
    with pytest.raises(WorkloadError, match=r"holds no class directory \(ImageFolder layout: DIR/<class>/<image>\.jpg\): its 2 "
                                            r"images lie in it directly; move them into one folder per class$"):
        check_image_folder(flat)


def test_a_link_to_an_image_that_is_gone_is_named_as_such(tmp_path) -> None:
    """A symbolic link whose target was moved read as "cannot decode (FileNotFoundError ...)"."""
    from autotune.workloads.data import BadImage, load_image

    (tmp_path / "cat").mkdir()
    link = tmp_path / "cat" / "a.jpg"
    link.symlink_to(tmp_path / "moved.jpg")
    with pytest.raises(BadImage, match=rf"^{link}: a symbolic link to {tmp_path}/moved\.jpg, which does not exist$"):
        load_image(str(link))
    chained = tmp_path / "cat" / "b.jpg"  # b.jpg -> a.jpg -> moved.jpg: a.jpg is there (ls lists it), its end is not
    chained.symlink_to("a.jpg")
    with pytest.raises(BadImage, match=rf"^{chained}: a symbolic link to a\.jpg, a chain of links that ends at {tmp_path}/moved\.jpg, "
                                       "which does not exist$"):
        load_image(str(chained))


def test_an_image_the_os_refuses_to_read_is_said_unreadable_not_undecodable(tmp_path, monkeypatch) -> None:
    """A file without read permission (the suite runs as root, which reads it anyway: open() is made to refuse it) read
    "cannot decode (PermissionError: [Errno 13] Permission denied: ...)", blaming the image for what the OS refused."""
    import autotune.workloads.data as data
    from autotune.workloads.data import BadImage, load_image

    image = tmp_path / "a.jpg"
    image.write_bytes(b"\xff\xd8")

    def refused(path: str, mode: str = "r") -> None:
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(data, "open", refused, raising=False)
    with pytest.raises(BadImage, match=rf"^{image}: cannot read \(Permission denied\)$"):
        load_image(str(image))


def test_hidden_and_system_folders_read_as_classes_or_images_are_a_warning_and_the_summary_counts_what_is_skipped(tmp_path, monkeypatch) -> None:
    """A .thumbnails folder of images became a class and Synology's @eaDir thumbnails images of their class, without a
    word (a probe: 85 images in 3 classes where 40 in 2 were meant). Both are said; the summary line counts the images,
    names the classes and the files ImageFolder skips (GIFs, .jfif: a user may expect them read)."""
    from autotune.workloads.folders import check_image_folder

    data = tmp_path / "pets"
    for name in ("cat/@eaDir/a.jpg", "dog", ".thumbnails"):
        (data / name).mkdir(parents=True)
    for name in ("cat/a.jpg", "cat/@eaDir/a.jpg/a_THUMB.jpg", "dog/b.jpg", "dog/c.gif", "dog/d.jfif", "dog/e.gif", ".thumbnails/t.jpg"):
        (data / name).write_bytes(b"x")
    folder = check_image_folder(data)
    assert (folder.images, folder.classes) == (4, 3)
    assert folder.warning == (f"a hidden or system folder of {data} is read as a class (.thumbnails); 1 image in hidden or system "
                              "folders inside class folders is read as an image of its class (cat/@eaDir/a.jpg/a_THUMB.jpg): "
                              "ImageFolder takes them as any other; thumbnails or copies would train as data, so move them out")
    assert folder.summary == (f"data: {data}: 4 images in 3 classes (.thumbnails, cat, dog); 3 other files skipped, as "
                              "ImageFolder skips them (.gif 2, .jfif 1)")
    # A class named like a handle (@alice) is no system folder; split folders and a hidden one are both said.
    people = tmp_path / "people"
    for name in ("@alice/a.jpg", "@bob/b.jpg", "spaced out/c.txt"):
        (people / name).parent.mkdir(parents=True, exist_ok=True)
        (people / name).write_bytes(b"x")
    (people / "spaced out" / "c.jpg").write_bytes(b"x")
    named = check_image_folder(people)
    assert named.warning is None and named.summary.endswith("; 1 other file skipped, as ImageFolder skips them (.txt 1)")
    splits = tmp_path / "splits"
    for name in ("train/a.jpg", "val/b.jpg", "train/.cache/c.jpg"):
        (splits / name).parent.mkdir(parents=True, exist_ok=True)
        (splits / name).write_bytes(b"x")
    warned = check_image_folder(splits).warning or ""
    assert warned.startswith(f"the class folders of {splits} are train, val, which look like dataset splits") and (
        "; 1 image in hidden or system folders inside class folders is read as an image of its class (train/.cache/c.jpg)" in warned)
    # A path with a space: the removal command quotes it.
    mac = tmp_path / "cats and dogs"
    (mac / "cat").mkdir(parents=True)
    (mac / "cat" / "a.jpg").write_bytes(b"x")
    (mac / "cat" / "._a.jpg").write_bytes(b"x")
    with pytest.raises(Exception, match=r"find -L '.*/cats and dogs' -name"):
        check_image_folder(mac)
    # A relative path that begins with '-': find read it as a predicate ("unknown predicate `-mac'").
    (tmp_path / "-mac").symlink_to(mac)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Exception, match=r"\(find -L \./-mac -name '\._\*' -delete\)") as raised:
        check_image_folder(Path("-mac"))
    removal = str(raised.value).split("remove them (", 1)[1].split(") and rerun")[0]
    subprocess.run(["bash", "-c", removal], check=True, cwd=tmp_path, capture_output=True)
    assert not (mac / "cat" / "._a.jpg").exists() and (mac / "cat" / "a.jpg").exists()


def _truncated_data(tmp_path: Path, synthetic_data: Path) -> Path:
    """A copy of the synthetic data in which one JPEG is cut in half."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    victim = sorted(data.glob("class_00/*.jpg"))[0]
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    return victim


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_a_truncated_jpeg_is_bad_data_naming_the_file(tmp_path, synthetic_data, workers) -> None:
    from autotune.records import TrialOptions, Workload
    from autotune.runner import run_trial
    from autotune.train_setup import TrainSetup

    victim = _truncated_data(tmp_path, synthetic_data)
    workload = Workload(model="factories:tiny_cnn", image_size=32, device="cpu", num_classes=10, images=64,
                        data=str(victim.parent.parent), sys_path=(str(TESTS),))
    setup = TrainSetup(batch_size=64, num_workers=workers, prefetch_factor=2 if workers else None)
    result = run_trial(setup, workload, TrialOptions(trial_seconds=1.0, mode="loader"))
    assert result.status == "bad_data", result
    assert str(victim) in (result.error or "") and "cannot decode" in (result.error or "")


@pytest.mark.slow
def test_a_fifo_named_like_an_image_is_bad_data_not_a_timeout(tmp_path, synthetic_data) -> None:
    """open() of a FIFO waits for a writer that never comes: the trial ran into its timeout. It is bad data, named."""
    import os

    from autotune.records import TrialOptions, Workload
    from autotune.runner import run_trial
    from autotune.train_setup import TrainSetup

    victim = _truncated_data(tmp_path, synthetic_data)
    victim.unlink()
    os.mkfifo(victim)
    workload = Workload(model="factories:tiny_cnn", image_size=32, device="cpu", num_classes=10, images=64,
                        data=str(victim.parent.parent), sys_path=(str(TESTS),))
    result = run_trial(TrainSetup(batch_size=64), workload, TrialOptions(trial_seconds=1.0, mode="loader", timeout_s=60.0))
    assert result.status == "bad_data", result
    assert f"{victim}: not a regular file" in (result.error or "")


def test_an_image_over_pils_pixel_limit_is_bad_data_naming_the_file(tmp_path, monkeypatch) -> None:
    """PIL refuses an enormous image with DecompressionBombError, not an OSError: it was a setup's ``error``
    that named no file (the search said only 'loading the data fails'), and fast setups failed where slow ones did not."""
    from PIL import Image

    from autotune.runner.failures import classify
    from autotune.workloads.data import BadImage, load_image

    victim = tmp_path / "huge.png"
    Image.new("RGB", (20, 20)).save(victim)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 400 pixels is over twice the limit: refused
    with pytest.raises(BadImage) as caught:
        load_image(str(victim))
    result = classify(caught.value)
    assert result.status == "bad_data" and str(victim) in (result.error or "") and "too large" in (result.error or "")


@pytest.fixture
def whole_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check for a folder's other bad images reads every file of these small folders, however loaded the machine:
    its 15 s would otherwise bound what a test's line says."""
    from autotune.workloads import scan

    monkeypatch.setattr(scan, "SCAN_SECONDS", 1e6)


def test_bad_data_in_a_trial_stops_the_search_naming_the_file(tmp_path, cache_dir) -> None:
    from autotune.errors import WorkloadError
    from autotune.records import TrialResult
    from autotune.train_setup import TrainSetup
    from autotune.tuner import SearchConfig, run_search

    trained: list[TrainSetup] = []

    def runner(setup, workload, options=None, *, on_window=None):
        trained.extend([setup] if options.mode == "train" else [])
        if len(trained) == 2:  # the faster guess reaches the bad file; the defaults did not
            return TrialResult(status="bad_data", error="/data/cats/7.jpg: cannot decode (OSError: image file is truncated)")
        return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=4, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(WorkloadError, match=r"bad data: /data/cats/7.jpg: cannot decode"):
        run_search(config, runner=runner)
    study = study_of(tmp_path / "out")
    assert study.trials[0].state == TrialState.COMPLETE  # the defaults are kept
    assert study.trials[1].state == TrialState.FAIL and "result" not in study.trials[1].user_attrs


def _bad_data_in_the_second_trial(victim: Path):  # type: ignore[no-untyped-def]
    """A runner whose second search trial meets ``victim`` truncated; every other run measures 100 samples/s."""
    from autotune.records import TrialResult

    trained: list[int] = []

    def runner(setup, workload, options=None, *, on_window=None):  # type: ignore[no-untyped-def]
        trained.extend([1] if options.mode == "train" else [])
        if len(trained) == 2:
            return TrialResult(status="bad_data", error=f"{victim}: cannot decode (OSError: image file is truncated)")
        return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)

    return runner


def test_bad_data_met_in_the_confirmation_writes_the_best_trial_unconfirmed_first(tmp_path, cache_dir) -> None:
    """A file went bad while the finalists were re-measured: the search stopped without best.json (status: `winner:
    none confirmed ... holds no best.json`), where a Ctrl-C at that point writes the fastest trial, unconfirmed."""
    from autotune.errors import DataError
    from autotune.output.best import read_best
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search

    trained: list[int] = []

    def confirmation_meets_it(setup, workload, options=None, *, on_window=None):  # type: ignore[no-untyped-def]
        trained.extend([1] if options is not None and options.mode == "train" else [])
        if len(trained) > 3:  # the 3 trials of the budget ran; the confirmation's first run meets the file
            return TrialResult(status="bad_data", error="/data/cats/7.jpg: cannot decode (OSError: image file is truncated)")
        return steady_runner(setup, workload, options, on_window=on_window)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0,
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(DataError, match=r"^bad data: /data/cats/7.jpg: cannot decode") as caught:
        run_search(config, runner=confirmation_meets_it)
    best = read_best(tmp_path / "out" / "best.json")
    # Said as what it is, not "interrupted", in best.json (train.py's header and report.html take its notes) and the line.
    assert not best.confirmed and any(note.startswith("not confirmed: the search was stopped by bad data") for note in best.notes), best.notes
    assert not any("interrupted" in note for note in best.notes), best.notes
    assert f"; best so far written to {tmp_path / 'out' / 'best.json'} (unconfirmed)" in str(caught.value), str(caught.value)
    assert "stopped by bad data (winner not confirmed)" in (tmp_path / "out" / "report.html").read_text()
    assert caught.value.outcome.best.setup == best.setup  # the Python API's caller gets the best written, as after a stop


@pytest.mark.parametrize("as_json", [True, False])
def test_bad_data_met_in_the_confirmation_shows_the_best_it_wrote(tmp_path, cache_dir, monkeypatch, as_json: bool) -> None:
    """`search --json` printed `{"best": null, "error": ...}` (and the table none) where the error's own line said
    `best so far written to OUT/best.json (unconfirmed)`: its object now holds that best and the line as "error"."""
    from typer.testing import CliRunner

    import autotune.api
    from autotune.cli import app
    from autotune.output.best import read_best
    from autotune.records import TrialResult
    from autotune.tuner import run_search

    runs: list[int] = []

    def confirmation_meets_it(setup, workload, options=None, *, on_window=None):  # type: ignore[no-untyped-def]
        runs.extend([1] if options is not None and options.mode == "train" else [])
        if len(runs) > 3:
            return TrialResult(status="bad_data", error="/data/cats/7.jpg: cannot decode (OSError: image file is truncated)")
        return steady_runner(setup, workload, options, on_window=on_window)

    monkeypatch.setattr(autotune.api, "run_search", lambda config, reporter=None: run_search(config, reporter, runner=confirmation_meets_it))
    out = tmp_path / "out"
    said = CliRunner().invoke(app, ["search", "--model", "resnet18", "--trials", "3", "--image-size", "32", "--device", "cpu",
                                    "--trial-seconds", "1", "--out", str(out), "--cache-dir", str(cache_dir),
                                    "--synthetic-images", "64", *(["--json"] if as_json else [])])
    assert said.exit_code == 1, said.output
    line = said.stderr.strip().splitlines()[-1]
    assert line.startswith("error: bad data: /data/cats/7.jpg") and line.endswith(f"best so far written to {out / 'best.json'} (unconfirmed)"), line
    best = read_best(out / "best.json")
    if as_json:
        shown = json.loads(said.stdout)
        assert shown["best"]["setup"] == best.setup.to_dict() and shown["interrupted"] is True
        assert shown["error"] == line.removeprefix("error: ")
    else:
        assert "not confirmed: the search was stopped by bad data" in said.stdout.replace("\n", " "), said.stdout


def test_an_image_removed_as_a_trial_read_it_is_advised_back_not_fixed_in_place(tmp_path) -> None:
    """A probe removed two images mid-search; the next trial, which had listed them, read one gone: the line advised to
    "fix or replace it in place", and that removing it needs another --out, for a file the user had just removed."""
    from autotune.records import Workload
    from autotune.tuner.timed import bad_data_advice

    own = Workload(model="resnet18", data=str(tmp_path))
    advice, if_kept = bad_data_advice(own, f"{tmp_path}/a/1.jpg: cannot read (No such file or directory)")
    assert advice.startswith("files were removed while the search ran: put them back") and if_kept == ""
    assert bad_data_advice(own, f"{tmp_path}/a/1.jpg: cannot decode (OSError: truncated)")[0].startswith("fix or replace it in place")


def test_bad_data_advice_matches_what_a_rerun_accepts(tmp_path, synthetic_data) -> None:
    """The bad-data line found in a trial says to fix the file in place: a rerun after removing it is refused (the
    study was made for that many samples), so its advice names another --out for that (before: "fix or remove it and
    rerun (finished trials are kept)", and the rerun after removing it said "made for a different search")."""
    import shutil

    from autotune.errors import WorkloadError
    from autotune.tuner import SearchConfig, run_search

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    victim = next(iter(sorted((data / "class_03").iterdir())))
    runner = _bad_data_in_the_second_trial(victim)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out", data=data)
    with pytest.raises(WorkloadError) as caught:
        run_search(config, runner=runner)
    advice = str(caught.value)
    assert advice.startswith(f"bad data: {victim}: cannot decode") and "rerun the same command" in advice
    assert "fix or remove it and rerun" not in advice and "another --out" in advice, advice
    victim.unlink()  # what the advice says a rerun on the same --out does not take
    with pytest.raises(StudyMismatch, match=r"made for a different search \(samples in the data: 64 there, 63 now\)"):
        run_search(config, runner=runner)
    assert study_of(tmp_path / "out").trials[0].state == TrialState.COMPLETE


def test_bad_data_met_before_anything_was_measured_leaves_no_study_and_says_nothing_of_another_out(tmp_path, synthetic_data, whole_scan) -> None:
    """The first calibration run meets the file: the study measured nothing and is removed, so a rerun on the same
    --out without the file is a new search, and the line does not send the user to another --out."""
    import shutil

    from autotune.errors import DataError
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    victim = next(iter(sorted((data / "class_03").iterdir())))

    def at_once(setup, workload, options=None, *, on_window=None):  # type: ignore[no-untyped-def]
        return TrialResult(status="bad_data", error=f"{victim}: cannot decode (OSError: image file is truncated)")

    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out", data=data)
    with pytest.raises(DataError) as caught:
        run_search(config, runner=at_once)
    assert str(caught.value) == (f"bad data: {victim}: cannot decode (OSError: image file is truncated); the other 63 files "
                                 "decode; fix or replace it in place and rerun the same command (finished trials are kept)")
    victim.unlink()
    outcome = run_search(config, runner=steady_runner)  # the same --out takes the smaller data
    assert outcome.best is not None


def test_bad_data_met_after_calibration_runs_were_kept_says_the_same_out_takes_the_data_without_the_file(
    tmp_path, synthetic_data, capsys, whole_scan) -> None:
    """The loader-only calibration runs meet the file after the compute-only ones were kept: a rerun for fewer samples
    drops those runs and calibrates again on the same --out, so the line says that, not "needs another --out" (which
    it said, while the same --out took the data without the file)."""
    import shutil

    from autotune.errors import DataError
    from autotune.tuner import SearchConfig, run_search

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    victim = next(iter(sorted((data / "class_03").iterdir())))

    def loader_meets_it(setup, workload, options=None, *, on_window=None):  # type: ignore[no-untyped-def]
        if options is not None and options.mode == "loader":
            return TrialResult(status="bad_data", error=f"{victim}: cannot decode (OSError: image file is truncated)")
        return steady_runner(setup, workload, options, on_window=on_window)

    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out", data=data)
    with pytest.raises(DataError) as caught:
        run_search(config, runner=loader_meets_it)
    assert str(caught.value) == (f"bad data: {victim}: cannot decode (OSError: image file is truncated); the other 63 files "
                                 "decode; fix or replace it in place and rerun the same command (finished trials are kept); "
                                 "removing it works too: the same command then measures the calibration again")
    assert (tmp_path / "out" / "study.db").exists()  # its kept runs stay for a fix in place
    victim.unlink()
    outcome = run_search(config, runner=steady_runner)  # the same --out takes the smaller data
    assert outcome.best is not None and outcome.best.workload.images == 63


def test_a_search_stopped_by_a_bad_image_names_the_folder_s_other_bad_images(tmp_path, synthetic_data, whole_scan) -> None:
    """A folder with three bad files took three reruns, each after the calibration, one file named at a time: the line
    names the other two as well (one truncated, one not an image), each found by decoding the folder's files, and its
    advice speaks of them all."""
    import shutil

    from autotune.errors import DataError
    from autotune.tuner import SearchConfig, run_search

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    victim, truncated, junk = (sorted((data / name).iterdir())[0] for name in ("class_03", "class_05", "class_07"))
    for path in (victim, truncated):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    junk.write_bytes(b"not an image")
    runner = _bad_data_in_the_second_trial(victim)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out", data=data)
    with pytest.raises(DataError) as caught:
        run_search(config, runner=runner)
    assert str(caught.value) == (
        f"bad data: {victim}: cannot decode (OSError: image file is truncated); 2 of the other 63 files also fail to decode: "
        f"{truncated}, {junk}; fix or replace them in place and rerun the same command (finished trials are kept); removing "
        "them changes the number of samples the study was made for, so a rerun without them needs another --out (with "
        "--storage: another --study)")


def test_a_trial_stopped_by_a_bad_image_names_the_folder_s_other_bad_images_too(tmp_path, synthetic_data, whole_scan) -> None:
    """`autotune trial` named the one file its loader met, where the search names the folder's others as well: a user
    checking a folder with a trial fixed one file per run."""
    import shutil

    import autotune

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    bad = {str(sorted((data / name).iterdir())[0]) for name in ("class_03", "class_05", "class_07")}
    for path in map(Path, bad):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    result = autotune.trial(model="resnet18", image_size=32, data=data, device="cpu", trial_seconds=1.0,  # the first batch holds
                            setup=autotune.TrainSetup(batch_size=64)).result  # all 64: it meets one however few it reads
    assert result.status == "bad_data" and result.error is not None, result
    first, _, rest = result.error.partition(": cannot decode")
    assert first in bad and "; 2 of the other 63 files also fail to decode: " in rest, result.error
    assert set(rest.split("also fail to decode: ")[1].split(", ")) == bad - {first}, result.error


def test_a_ddp_trial_s_bad_image_is_not_counted_among_the_others_and_a_count_that_changed_starts_no_check(
    tmp_path, synthetic_data, whole_scan) -> None:
    """A DDP trial's error begins `rank 1: PATH: ...`: the check named PATH again among "3 of the other 64" (the whole
    folder). A count that changed while the search ran names no file: the check ran for nothing, and the line said
    "the other 64 files decode; fix or replace it in place"."""
    import shutil

    from autotune.errors import DataError
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search
    from autotune.workloads.scan import other_bad_images

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    victim, other = (sorted((data / name).iterdir())[0] for name in ("class_03", "class_05"))
    for path in (victim, other):
        path.write_bytes(b"not an image")
    found = other_bad_images(data, f"rank 1: {victim}: cannot decode (UnidentifiedImageError: ...)")
    assert found.bad == [str(other)] and found.total == 63, found

    count = f"{data}: 63 images now, 64 at the start: files were removed or added while it ran; put them back"

    def changed(setup, workload, options=None, *, on_window=None):  # type: ignore[no-untyped-def]
        return TrialResult(status="bad_data", error=count)

    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out", data=data)
    with pytest.raises(DataError) as caught:
        run_search(config, runner=changed)
    assert str(caught.value) == f"bad data: {count}; then rerun the same command (finished trials are kept)"


def test_more_bad_images_than_the_line_names_are_all_listed_in_the_out_directory(tmp_path, synthetic_data, whole_scan) -> None:
    """156 bad files in a folder: the line named five and counted the rest, listed nowhere, so fixing them took a rerun
    for each five. All are listed in OUT/bad-files.txt, which stays where the search removes the --out it made (it
    measured nothing), and goes once a rerun starts."""
    import shutil

    from autotune.errors import DataError
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search
    from autotune.workloads.scan import LIST_FILE

    data, kept = tmp_path / "data", tmp_path / "kept"
    shutil.copytree(synthetic_data, data)
    shutil.copytree(synthetic_data, kept)
    bad = sorted(data.rglob("*.jpg"))[::8]  # 8 of the 64
    for path in bad:
        path.write_bytes(b"not an image")
    victim = bad[3]

    def at_once(setup, workload, options=None, *, on_window=None):  # type: ignore[no-untyped-def]
        return TrialResult(status="bad_data", error=f"{victim}: cannot decode (UnidentifiedImageError: ...)")

    out = tmp_path / "out"
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, out=out, data=data)
    with pytest.raises(DataError) as caught:
        run_search(config, runner=at_once)
    assert f"7 of the other 63 files also fail to decode: {', '.join(map(str, [p for p in bad if p != victim][:5]))} and 2 more " \
           f"(all 8 listed in {out / LIST_FILE}); fix or replace them" in str(caught.value), str(caught.value)
    assert [p.name for p in out.iterdir()] == [LIST_FILE]  # the rest of the --out it made is gone: nothing was measured
    assert (out / LIST_FILE).read_text().splitlines() == [str(victim), *(str(p) for p in bad if p != victim)]
    for path in bad:
        shutil.copy(kept / path.relative_to(data), path)
    assert run_search(config, runner=steady_runner).best is not None
    assert not (out / LIST_FILE).exists()
    # A file of that name the user keeps in an --out is theirs: neither removed nor written over.
    (out / LIST_FILE).write_text("my own notes\n")
    assert run_search(config, runner=steady_runner).best is not None and (out / LIST_FILE).read_text() == "my own notes\n"
    from autotune.workloads.scan import Scan, write_list

    found = Scan(bad=[str(p) for p in bad[1:]], checked=40, total=63, named=str(bad[0]))
    assert write_list(out, found, data) == "" and (out / LIST_FILE).read_text() == "my own notes\n"
    (out / LIST_FILE).unlink()
    assert write_list(out, found, data) == f" (the 8 found listed in {out / LIST_FILE})"  # the check ran out of time: not "all"


def test_the_check_for_other_bad_images_stops_at_its_time_and_says_how_far_it_got(tmp_path, synthetic_data) -> None:
    """A folder too large to check in the time given: the files checked are counted against the others, and what was
    found among them is named, at most five, the rest counted."""
    import shutil

    from autotune.workloads.scan import Scan, other_bad_images

    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    assert other_bad_images(data, "", seconds=0.0) == Scan(bad=[], checked=0, total=64, seconds=0.0)
    assert other_bad_images(data, "", seconds=0.0).words() == ""  # nothing checked: nothing to say
    assert Scan(checked=10, total=64, seconds=0.5).words() == "; the first 10 of the other 64 files (checked for 0.5 s) decode"
    assert Scan(checked=1, total=64).words() == "; the first of the other 64 files (checked for 15 s) decodes"
    named = sorted(str(path) for path in data.rglob("*.jpg"))
    found = Scan(bad=named[:7], checked=700, total=1_000_000)
    assert found.words() == (f"; 7 of the first 700 of the other 1,000,000 files (checked for 15 s) also fail to decode: "
                             f"{', '.join(named[:5])} and 2 more")
    assert Scan(bad=named[:1], checked=1, total=1).words() == f"; the other file also fails to decode: {named[0]}"


def test_bad_data_in_the_synthetic_jpegs_says_to_remove_their_directory(tmp_path, synthetic_data) -> None:
    """A damaged file among the synthetic JPEGs autotune wrote (no --data): the line says to remove their directory,
    which the rerun of the same command writes again, the same files, and resumes (before: "fix or remove it", a
    file the user never made and cannot fix; removed alone, the rerun was refused for its sample count)."""
    import shutil

    from autotune.errors import WorkloadError
    from autotune.tuner import SearchConfig, run_search

    cache = tmp_path / "cache"
    shutil.copytree(synthetic_data, cache / synthetic_data.name)
    victim = cache / synthetic_data.name / "class_03" / "img_000003.jpg"
    runner = _bad_data_in_the_second_trial(victim)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                          cache_dir=cache, synthetic_images=64)
    with pytest.raises(WorkloadError) as caught:
        run_search(config, runner=runner)
    assert str(caught.value).startswith(f"bad data: {victim}: cannot decode") and "fix or replace" not in str(caught.value)
    assert f"synthetic JPEGs in {cache / synthetic_data.name} are damaged: remove that directory" in str(caught.value)
    shutil.rmtree(cache / synthetic_data.name)  # as the line says
    outcome = run_search(config, runner=steady_runner)
    assert outcome.best is not None and (cache / synthetic_data.name / "class_03" / "img_000003.jpg").is_file()
    assert study_of(tmp_path / "out").trials[0].state == TrialState.COMPLETE


def test_a_data_directory_removed_mid_search_stops_it_without_blaming_the_setups(tmp_path, synthetic_data) -> None:
    """--data removed (or unmounted) after the first trial: the search stops at once in one line, the failed trial is
    not stored as its setup's failure, and the rerun with the data back goes on. Before, every later trial and every
    confirmation run ended `error` (FileNotFoundError), their setups were stored as failing, and the search ended with
    exit 0 and the defaults as an unconfirmed winner."""
    import shutil

    from autotune.errors import WorkloadError
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search

    data, kept = tmp_path / "data", tmp_path / "kept"
    shutil.copytree(synthetic_data, data)
    trained: list[int] = []

    def runner(setup, workload, options=None, *, on_window=None):
        trained.extend([1] if options.mode == "train" else [])
        if len(trained) == 2:
            data.rename(kept)  # gone while the trial ran
        if not data.is_dir():
            return TrialResult(status="error", error=f"FileNotFoundError: [Errno 2] No such file or directory: '{data}'")
        return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out", data=data)
    with pytest.raises(WorkloadError, match=rf"^data directory {data} is gone .*put it back and rerun the same command"):
        run_search(config, runner=runner)
    study = study_of(tmp_path / "out")
    assert study.trials[0].state == TrialState.COMPLETE
    assert study.trials[1].state == TrialState.FAIL and "result" not in study.trials[1].user_attrs
    kept.rename(data)
    assert run_search(config, runner=runner).best is not None
    assert len([t for t in study_of(tmp_path / "out").trials if t.state == TrialState.COMPLETE]) == 3


def test_the_first_error_of_the_pre_pass_ends_calibration_naming_the_model(tiny_workload) -> None:
    from autotune.devices import DeviceInfo
    from autotune.errors import WorkloadError
    from autotune.records import TrialResult
    from autotune.tuner.calibrate import calibrate

    calls: list[int] = []

    def broken(setup, workload, options=None, *, on_window=None):
        calls.append(setup.batch_size)
        return TrialResult(status="error", error="ValueError: factory exploded on purpose")

    cpu = DeviceInfo("cpu", True, None, None, "test CPU")
    with pytest.raises(WorkloadError, match="model resnet18 fails: ValueError: factory exploded on purpose"):
        calibrate(tiny_workload, cpu, usable_cores=2, available_bytes=2**34, max_memory=None, trial_seconds=1.0,
                  bf16_ok=True, runner=broken)
    assert calls == [8]  # one trial, not halved through the pre-pass


@pytest.mark.slow
@pytest.mark.parametrize("factory", ["wrong_shape"])
def test_a_broken_model_ends_the_search_at_once(tmp_path, cache_dir, factory) -> None:
    cmd = search_cmd(tmp_path / "out", cache_dir, trials=30)
    cmd[cmd.index("factories:tiny_cnn")] = f"factories:{factory}"
    code, _, stderr = run_here(cmd)
    assert code == 1
    lines = [ln for ln in stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"model factories:{factory} fails:" in lines[0], stderr
    assert "Traceback" not in stderr
    assert "memory pre-pass: verify" not in stderr  # not halved through the pre-pass


# --------------------------------------------------------------- the memory figure
def _forked_tree(tmp_path: Path) -> subprocess.Popen[bytes]:
    """A process holding 200 MB that three forked children share, ready when this returns (kill its group)."""
    script = tmp_path / "tree.py"
    script.write_text(
        "import os, time\n"
        "block = bytearray(200 * 2**20)\n"
        "for i in range(0, len(block), 4096): block[i] = 1\n"
        "for _ in range(3):\n"
        "    if os.fork() == 0:\n"
        "        time.sleep(120); os._exit(0)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def test_memory_of_a_forked_tree_counts_shared_pages_once(tmp_path) -> None:
    """Three forked workers sharing 200 MB with their parent: RSS says ~800 MB, the monitor ~200 MB."""
    from autotune.runner.measure import tree_memory, tree_pids

    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    proc = _forked_tree(tmp_path)
    try:
        pids = tree_pids(proc.pid)
        assert len(pids) == 4 and unrelated.pid not in pids
        rss = sum(psutil.Process(p).memory_info().rss for p in pids)
        measured = tree_memory(pids, proc.pid)  # what the trial's memory monitor reads in its exact samples
        assert rss > 700 * 2**20
        assert 190 * 2**20 < measured < 400 * 2**20
        # Forked from a process that held 1 GiB (as the trial server forks a trial): those pages are counted once,
        # whether or not the tree touched them, as a run of its own would hold them.
        inherited = tree_memory(pids, proc.pid, 2**30)
        assert 2**30 < inherited < 2**30 + 400 * 2**20
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        unrelated.kill()
        unrelated.wait()


def test_the_monitor_reads_uss_rarely_and_corrects_cheap_rss_samples_by_it(monkeypatch) -> None:
    """USS costs ~15-20 ms per torch process: read it at start, when the processes change and about once a second."""
    from autotune.runner import measure

    rss = {1: 1000, 2: 500}
    uss = {1: 700, 2: 100}  # the worker shares most of its pages with the trial process
    tree = [1]
    exact: list[int] = []
    now = [100.0]
    monkeypatch.setattr(measure, "tree_pids", lambda pid: list(tree))
    monkeypatch.setattr(measure, "process_rss", lambda pid: rss[pid])
    monkeypatch.setattr(measure, "process_memory", lambda pid, whole: exact.append(pid) or (rss if whole else uss)[pid])
    monkeypatch.setattr(measure.time, "monotonic", lambda: now[0])
    monitor = measure.MemoryMonitor(budget_bytes=1850)
    monitor._pid = 1
    assert monitor.sample(exact=True) == 1000 and exact == [1]  # the trial process's RSS: it loaded its imports itself
    rss[1], uss[1] = 1300, 1000  # training allocates 300 private bytes: RSS and USS grow alike
    assert [monitor.sample() for _ in range(50)] == [1300] * 50
    assert exact == [1]  # no USS read within the second
    tree.append(2)  # a loader worker starts: read USS at once, else its shared pages would count in full
    assert monitor.sample() == 1300 + 100 and exact == [1, 1, 2]
    rss[2] = 900  # the worker touches 400 private bytes
    assert monitor.sample() == 1800 and not monitor.over_budget.is_set()
    now[0] += monitor.EXACT_EVERY_S  # a second later: exact again
    uss[2], rss[2] = 600, 1000
    assert monitor.sample() == 1900 and len(exact) == 5 and monitor.over_budget.is_set()
    assert monitor.peak_bytes == 1900
    # A trial forked by the trial server: the server's RSS at the fork, its imports, and the tree's own pages.
    monkeypatch.setattr(measure, "inherited_bytes", 5000)
    forked = measure.MemoryMonitor()
    forked._pid = 1
    assert forked.sample(exact=True) == 5000 + 1000 + 600
    rss[1] += 50  # cheap samples go on from there
    assert forked.sample() == 5000 + 1000 + 600 + 50


def test_the_monitor_s_cheap_samples_count_a_forked_tree_s_shared_pages_once(tmp_path) -> None:
    """The real thing: three forked workers sharing 200 MB, between two exact readings."""
    from autotune.runner.measure import MemoryMonitor

    proc = _forked_tree(tmp_path)
    try:
        monitor = MemoryMonitor()
        monitor._pid = proc.pid
        monitor.sample(exact=True)
        cheap = monitor.sample()
        assert 190 * 2**20 < cheap < 400 * 2**20
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_the_monitor_does_not_sample_on_cuda() -> None:
    from autotune.runner.measure import MemoryMonitor

    monitor = MemoryMonitor(budget_bytes=1, enabled=False).start()
    assert not monitor._thread.is_alive()
    assert monitor.stop() == 0 and not monitor.over_budget.is_set()


# --------------------------------------------------------------- leftovers
@pytest.mark.parametrize("fault", ["ctrl-c", "disk full"])
def test_interrupted_data_generation_leaves_no_hidden_copy(tmp_path, fault) -> None:
    import errno
    import random

    from autotune.errors import WorkloadError
    from autotune.workloads.data import generate_image_folder

    def make_image(rng: random.Random, path: Path) -> None:
        if path.name == "img_000005.jpg":
            if fault == "ctrl-c":
                os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, delivered here
                time.sleep(1)
            raise OSError(errno.ENOSPC, "No space left on device")
        path.write_bytes(b"x" * 1000)

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt if fault == "ctrl-c" else WorkloadError):
            generate_image_folder(tmp_path / "synthetic", 20, make_image, seed=0, note="test")
    finally:
        signal.signal(signal.SIGINT, before)
    assert list(tmp_path.iterdir()) == []


def test_a_sigterm_whose_interrupt_a_finalizer_swallowed_still_stops_the_generation(tmp_path, monkeypatch) -> None:
    """SIGTERM in a search raises KeyboardInterrupt from its handler; when the handler runs inside a finalizer
    (``__del__``, a weakref callback: seen in SQLAlchemy's registry), Python prints "Exception ignored" and drops it.
    The stop is remembered: the generation looks at it before each file and stops, leaving no copy."""
    import random

    from autotune.tuner.signals import clear_stop, sigterm_as_interrupt, stop_requested
    from autotune.workloads.data import generate_image_folder

    class SignalledInFinalizer:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            deadline = time.monotonic() + 5
            while not stop_requested() and time.monotonic() < deadline:  # the handler runs here, inside __del__
                pass

    made: list[str] = []
    swallowed: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: swallowed.append(unraisable.exc_type))  # Python's "Exception ignored"

    def make_image(rng: random.Random, path: Path) -> None:
        if len(made) == 5:
            SignalledInFinalizer()  # dropped at once: its finalizer runs the handler
        made.append(path.name)
        path.write_bytes(b"x")

    clear_stop()
    try:
        with sigterm_as_interrupt(), pytest.raises(KeyboardInterrupt):
            generate_image_folder(tmp_path / "synthetic", 40, make_image, seed=0, note="t", stop=stop_requested)
    finally:
        clear_stop()
    assert swallowed == [KeyboardInterrupt]  # dropped there, as in the search
    assert len(made) == 6 and list(tmp_path.iterdir()) == []


def test_copies_left_by_a_killed_generation_are_removed(tmp_path) -> None:
    from autotune.workloads.data import generate_image_folder

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    leftover = tmp_path / f".synthetic.tmp-{dead.pid}"
    (leftover / "class_00").mkdir(parents=True)
    generate_image_folder(tmp_path / "synthetic", 10, lambda rng, path: path.write_bytes(b"x"), seed=0, note="t")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["synthetic"]
    # A copy of another size, left by a generation that was killed, goes too; a live process's copy stays.
    (tmp_path / f".synthetic-v1-99999.tmp-{dead.pid}" / "class_00").mkdir(parents=True)
    (tmp_path / f".synthetic-v1-500.tmp-{os.getpid()}").mkdir()
    generate_image_folder(tmp_path / "synthetic-v1-10", 10, lambda rng, path: path.write_bytes(b"x"), seed=0, note="t")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".synthetic-v1-500.tmp-{os.getpid()}", "synthetic", "synthetic-v1-10"]


@pytest.mark.slow
@pytest.mark.time_limit(600)  # several real searches in a row: slow on a loaded machine
def test_ctrl_c_during_calibration_keeps_its_runs_and_the_rerun_reuses_them(tmp_path, cache_dir, monkeypatch) -> None:
    """A real SIGINT once the calibration stored two runs: exit 130, the last line counts the runs kept, and the same
    command run again reuses exactly those (nothing measured is lost) and finishes the search."""
    import re

    out = tmp_path / "out"
    cmd = search_cmd(out, cache_dir, trials=1)
    proc = start(cmd)
    deadline = time.monotonic() + WAIT_S

    def kept() -> int:
        try:
            runs = study_of(out).user_attrs.get("calibration_runs") or {}
        except Exception:  # the study is still being created
            return 0
        return sum(len(r) for r in runs.values())

    while kept() < 2:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1].decode()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    last = stderr.decode().strip().splitlines()[-1]
    assert proc.returncode == 130, stderr.decode()
    found = re.fullmatch(r"interrupted during calibration, before the first trial \(runs measured and kept: (\d+)\); "
                         r"rerun the same command to go on", last)
    assert found is not None and int(found.group(1)) == kept() >= 2, last
    # Another search in a copy of that --out takes it over (nothing else is held) and says that it drops the runs.
    import shutil

    from autotune.tuner import SearchConfig
    from autotune.tuner.prepare import prepare

    class Said:
        lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    other = shutil.copytree(out, tmp_path / "copy")
    config = SearchConfig(model="factories:tiny_cnn", image_size=32, synthetic_images=64, trial_seconds=3.0, device="cpu", trials=1,
                          out=other, cache_dir=cache_dir)
    monkeypatch.chdir(TESTS)  # the model's module is imported from the working directory, as a user's own is
    prepare(config, Said()).held.close()  # type: ignore[arg-type]
    monkeypatch.undo()
    assert (f"dropped the {found.group(1)} calibration runs that a search with other settings kept here (it stopped before "
            "its calibration ended): they measured that search, not this one") in Said.lines, Said.lines
    code, stdout, stderr = run_here(cmd)
    said = stdout + stderr
    assert code == 0, said
    assert f"(runs measured before an interruption and kept: {found.group(1)})" in said
    assert f"calibration: reused {found.group(1)} of the {found.group(1)} runs kept from before the interruption, measured " in said
    assert (out / "best.json").is_file() and kept() == 0  # the whole calibration is stored instead


def test_sigterm_while_the_jpegs_are_generated_stops_in_one_line_and_leaves_no_copy(tmp_path) -> None:
    cache = tmp_path / "cache"
    cmd = [sys.executable, "-m", "autotune", "search", "--model", "resnet18", "--image-size", "32", "--synthetic-images", "20000",
           "--trials", "1", "--device", "cpu", "--out", str(tmp_path / "out"), "--cache-dir", str(cache)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    deadline = time.monotonic() + WAIT_S
    while not list(cache.glob(".synthetic-*.tmp-*")):  # the generation has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1].decode()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()
    assert f"writing 20000 synthetic JPEGs to {cache / 'synthetic-v1-20000'} (about " in stderr.decode()  # minutes: said first
    assert stderr.decode().strip().splitlines()[-1] == (
        "interrupted while the search was prepared: this run measured nothing (what earlier runs of the study measured "
        "is kept); rerun the same command")
    assert list(cache.iterdir()) == []  # the half-written copy is gone


@pytest.mark.slow
def test_autotune_trial_removes_its_directory_on_sigterm(tmp_path, cache_dir) -> None:
    env = {**ENV, "TMPDIR": str(tmp_path)}
    cmd = [sys.executable, "-m", "autotune", "trial", "--model", "factories:sleeps_forever", "--image-size", "32",
           "--device", "cpu", "--cache-dir", str(cache_dir), "--synthetic-images", "64", "--trial-seconds", "1", "--json"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    deadline = time.monotonic() + WAIT_S
    while not list(tmp_path.glob("autotune-trial-*/output.txt")):  # the trial process has started
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1].decode()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=60)
    line = "interrupted before the trial's result: its processes were stopped and its directory removed; nothing was measured"
    assert proc.returncode == 130 and stderr.decode().strip().splitlines()[-1] == f"error: {line}", stderr.decode()
    assert json.loads(stdout) == {"status": None, "samples_per_s": None, "error": line}  # a script reading --json gets its object
    assert not list(tmp_path.glob("autotune-trial-*"))


def test_trial_directories_of_a_killed_search_are_removed_by_a_later_one(tmp_path) -> None:
    """``kill -9`` leaves the trial's directory; the next search removes it once its maker is gone and it is stale."""
    from autotune.runner.launch import PREFIX, STALE_AFTER_S, remove_stale_trial_dirs

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    old = time.time() - STALE_AFTER_S - 60
    made = {}
    for name, pid, age in [("dead-old", dead.pid, old), ("dead-fresh", dead.pid, None), ("live-old", os.getppid(), old)]:
        directory = tmp_path / f"{PREFIX}{pid}-{name}"
        directory.mkdir()
        (directory / "request.json").write_text("{}")
        if age is not None:
            for path in (directory / "request.json", directory):
                os.utime(path, (age, age))
        made[name] = directory
    other = tmp_path / "autotune-trial-notapid"
    other.mkdir()
    remove_stale_trial_dirs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([made["dead-fresh"].name, made["live-old"].name, other.name])


def test_ci_log_is_a_private_temporary_file() -> None:
    script = (TESTS.parent / ".ci" / "run").read_text()
    assert "/tmp/autotune-ci.log" not in script
    assert 'log=$(mktemp' in script and 'rm -f "$log"' in script


# --------------------------------------------------------------- resumes across machines and runs
def _fake(setup, workload, options=None, *, on_window=None):
    from autotune.records import TrialResult

    rate = 100.0 + setup.batch_size + 10 * setup.num_workers
    return TrialResult(status="ok", samples_per_s=rate, windows=(rate,), peak_memory_bytes=2**20)


def _config(tmp_path: Path, cache_dir: Path, **kw):
    from autotune.tuner import SearchConfig

    base = dict(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                cache_dir=cache_dir, synthetic_images=64, confirm_rounds=2, confirm_top=2)
    return SearchConfig(**{**base, **kw})


def test_a_study_from_another_machine_or_timeout_is_refused_naming_the_difference(tmp_path, cache_dir) -> None:
    from autotune.tuner import run_search

    run_search(_config(tmp_path, cache_dir), runner=_fake)
    study = study_of(tmp_path / "out")
    stored = dict(study.user_attrs["signature"])
    cores = stored["usable_cores"]
    study.set_user_attr("signature", {**stored, "usable_cores": cores + 62, "cpu_model": "Other CPU"})
    with pytest.raises(StudyMismatch, match=r"CPU: 'Other CPU' there, .* now"):
        run_search(_config(tmp_path, cache_dir), runner=_fake)
    study.set_user_attr("signature", stored)
    with pytest.raises(StudyMismatch, match=r"--timeout: the default there, 30.0 now"):  # it read "None there"
        run_search(_config(tmp_path, cache_dir, timeout_s=30.0), runner=_fake)


def test_confirmation_rounds_are_never_reused_across_runs(tmp_path, cache_dir) -> None:
    from autotune.tuner import run_search
    from autotune.tuner.progress import SilentReporter

    confirmations: list[int] = []

    class Counting(SilentReporter):
        def confirm_progress(self, done, total, label, result) -> None:  # called once per confirmation run
            confirmations.append(1)

    first = run_search(_config(tmp_path, cache_dir), Counting(), runner=_fake)
    measured_first = len(confirmations)
    assert measured_first == sum(len(c.values) for c in first.confirmed) > 0
    second = run_search(_config(tmp_path, cache_dir, trials=4), Counting(), runner=_fake)
    assert len(confirmations) - measured_first == sum(len(c.values) for c in second.confirmed)
    assert all(len(c.values) == 2 for c in second.confirmed)  # this run's rounds only, not 2 + 2


def test_defaults_that_diverge_stop_the_search_in_one_line_and_keep_the_trials(tmp_path, cache_dir) -> None:
    """A recipe whose loss turns NaN only after some steps passes calibration; its defaults' trial diverging ends the search."""
    from autotune.errors import WorkloadError
    from autotune.records import TrialResult
    from autotune.train_setup import TrainSetup
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study import SearchStudy

    def runner_(setup, workload, options=None, *, on_window=None):
        if options is not None and options.mode == "train" and setup.batch_size == TrainSetup().batch_size and setup.num_workers == 0:
            return TrialResult(status="diverged", error="the loss became NaN or infinite")
        return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=4, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                          cache_dir=cache_dir, synthetic_images=64, confirm_rounds=1)
    with pytest.raises(WorkloadError, match=r"the loss became NaN or infinite in trial #0, the PyTorch defaults .* the recipe diverges"):
        run_search(config, runner=runner_)
    stored = SearchStudy.load(f"sqlite:///{tmp_path / 'out' / 'study.db'}")
    assert [r.result.status for r in stored.records()] == ["diverged"]  # kept, and no trial after it
    assert not (tmp_path / "out" / "best.json").exists()
    with pytest.raises(WorkloadError, match="the recipe diverges"):  # the same command again runs no trial
        run_search(config, runner=runner_)
    assert len(SearchStudy.load(f"sqlite:///{tmp_path / 'out' / 'study.db'}").records()) == 1
    # A Task's model in float64 is named in its dtype, as the calibration's line names it (it said fp32).
    from autotune.records import Workload
    from autotune.tuner.explore import check_recipe

    record = SearchStudy.load(f"sqlite:///{tmp_path / 'out' / 'study.db'}").records()[0]
    with pytest.raises(WorkloadError, match=r"the PyTorch defaults \(batch 32, float64\): the recipe diverges"):
        check_recipe([record], Workload(model="m:f", image_size=32, task="m:f", precision="float64"))


@pytest.mark.parametrize("case", ["every setup fails alike", "processes died alike", "only the defaults' batch fails"])
def test_defaults_that_fail_as_another_batch_does_stop_the_search_while_nothing_trained(tmp_path, cache_dir, case) -> None:
    """One label out of range among the items: the pre-pass (the first items) passes, then every trial meets it. The
    search ran all its trials, each failing alike; it stops once the defaults and a setup of another batch failed with
    the same exception while no trial trained, and names it. Processes that died alike (a signal) say nothing of the
    workload, and an error at the defaults' batch alone is that batch's: the search goes on."""
    from autotune.errors import AutotuneError
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study import SearchStudy

    error = "the trial process died of SIGSEGV" if case == "processes died alike" else "IndexError: Target 9 is out of bounds."

    def runner_(setup, workload, options=None, *, on_window=None):
        if options is not None and options.mode == "train" and (case != "only the defaults' batch fails" or setup.batch_size == 32):
            return TrialResult(status="error", error=error)
        return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(100.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=6, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                          cache_dir=cache_dir, synthetic_images=64, confirm_rounds=1, seed=3)
    if case == "only the defaults' batch fails":
        assert run_search(config, runner=runner_).best is not None  # the other batches trained and won
        return
    with pytest.raises(AutotuneError) as raised:
        run_search(config, runner=runner_)
    records = SearchStudy.load(f"sqlite:///{tmp_path / 'out' / 'study.db'}").records()
    assert {r.result.status for r in records} == {"error"} and not (tmp_path / "out" / "best.json").exists()
    if case == "processes died alike":
        assert "failed alike" not in str(raised.value) and len(records) == 6, raised.value  # every trial ran
        return
    assert re.match(r"model resnet18: trial #0 \(the PyTorch defaults\) and trial #\d+ \(bs=(?!32 ).*\) failed alike: IndexError: "
                    r"Target 9 is out of bounds.; so would every setup: check every item", str(raised.value)), raised.value
    assert len(records) < 6  # stopped at the first trial of another batch, every trial kept


def test_an_interrupt_during_the_confirmation_shows_its_rounds_so_far(tmp_path, cache_dir) -> None:
    """Nothing measured is hidden: the rounds before a Ctrl-C are in the outcome, the report and the note."""
    from autotune.errors import SearchInterrupted
    from autotune.output.best import read_best
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.progress import SilentReporter

    class StopsAtThird(SilentReporter):
        def confirm_progress(self, done, total, label, result) -> None:
            if done == 3:
                raise KeyboardInterrupt

    out = tmp_path / "out"
    config = SearchConfig(model="resnet18", trials=3, image_size=32, device="cpu", trial_seconds=1.0, confirm_rounds=3,
                          out=out, cache_dir=cache_dir, synthetic_images=64, ceilings=False)
    with pytest.raises(SearchInterrupted, match="best so far written to .*unconfirmed") as info:
        run_search(config, StopsAtThird(), runner=steady_runner)
    outcome = info.value.outcome
    assert sum(len(c.values) for c in outcome.confirmed) == 3
    note = next(n for n in read_best(out / "best.json").notes if n.startswith("not confirmed"))
    assert "interrupted during the interleaved re-measurement (its rounds so far are shown" in note
    page = (out / "report.html").read_text()
    assert "no confirmation rounds" not in page and "measurement 1" in page and "Best so far (not confirmed)" in page


def test_a_rerun_interrupted_during_its_confirmation_keeps_the_earlier_winner_s_rounds(tmp_path, cache_dir, monkeypatch) -> None:
    """The kept winner's rounds are its evidence: the rerun's partial rounds never replace them, in the rerun's report or
    in `autotune report`, and the rerun's own summary says its rounds were interrupted (not that none ran)."""
    import autotune.tuner.study_report
    from autotune.errors import SearchInterrupted
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study import SearchStudy
    from autotune.tuner.study_report import report_study

    reports: list = []
    real = autotune.tuner.study_report.render_report
    monkeypatch.setattr(autotune.tuner.study_report, "render_report", lambda data: reports.append(data) or real(data))
    out = tmp_path / "out"
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, confirm_rounds=2,
                          out=out, cache_dir=cache_dir, synthetic_images=64, ceilings=False)
    run_search(config, runner=steady_runner)
    storage = f"sqlite:///{(out / 'study.db').resolve()}"
    first = SearchStudy.load(storage).stored_confirmation()
    calls: list[int] = []

    def slower_then_stopped(setup, workload, options=None, *, on_window=None):  # one new trial, one confirmation run, then Ctrl-C
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return TrialResult(status="ok", samples_per_s=1000.0 + setup.batch_size, windows=(1000.0,), peak_memory_bytes=2**20)

    with pytest.raises(SearchInterrupted, match="the confirmed winner of an earlier run stays in") as info:
        run_search(replace(config, trials=3), runner=slower_then_stopped)
    stored = SearchStudy.load(storage)
    assert stored.winner_rounds() == first and stored.stored_confirmation() != first  # the rerun's one run is stored too
    assert any(values for values, _, _ in stored.stored_confirmation().values())
    notes = info.value.outcome.best.notes
    assert any("interrupted during the interleaved re-measurement" in n for n in notes), notes
    report_study(out)
    for data in reports[-2:]:  # the rerun's report and `autotune report`'s show the kept winner with its own rounds
        assert data.best.confirmed and {c.candidate.key: (list(c.values), list(c.failures), list(c.failed_rounds)) for c in data.confirmed} == first


def test_a_study_of_the_earlier_version_keeps_its_last_rounds_as_the_winner_s_when_a_rerun_confirms_again(tmp_path) -> None:
    """Before the winner's rounds were kept apart, a study held only the last run's: a rerun's first measurement keeps them."""
    import optuna

    from autotune.tuner.stores import STUDY_CONFIRMATION, STUDY_WINNER_ROUNDS
    from autotune.tuner.study import SearchStudy

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(study_name="old", storage=storage).set_user_attr(
        STUDY_CONFIRMATION, {"run": "an-earlier-run", "rounds": {"a": [[100.0, 110.0], []]}})
    rerun = SearchStudy.load(storage, "old")
    assert rerun.winner_rounds() == {"a": ([100.0, 110.0], [], [])}  # read as the winner's until a rerun measures
    rerun.store_confirmation("a", ([300.0], [], []))
    rerun.store_confirmation("b", ([310.0], [], []))
    again = SearchStudy.load(storage, "old")
    assert again.winner_rounds() == {"a": ([100.0, 110.0], [], [])}
    assert again.stored_confirmation() == {"a": ([300.0], [], []), "b": ([310.0], [], [])}
    assert STUDY_WINNER_ROUNDS in again.study.user_attrs
    # Kept under its run too, which no later confirmation replaces (an upgrade's rerun measured again, and the old
    # rounds were gone from the study once it finished).
    assert again.study.user_attrs[f"{STUDY_CONFIRMATION}:an-earlier-run"] == {"run": "an-earlier-run", "rounds": {"a": [[100.0, 110.0], []]}}


def test_a_rerun_that_adds_no_trial_takes_an_earlier_version_s_confirmation_of_enough_rounds(tmp_path) -> None:
    """An earlier version kept its last run's rounds without the rounds it was asked for: an upgrade's rerun with no
    trial added measured them again (2.70x became 8.64x on a loaded machine). The rounds its leader measured stand for
    them; a confirmation of this version that no finished one follows (cut short) is not taken."""
    import optuna

    from autotune.tuner.stores import STUDY_CONFIRMATION, STUDY_VERDICT, STUDY_WINNER_ROUNDS
    from autotune.tuner.study import SearchStudy

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    old = optuna.create_study(study_name="old", storage=storage)
    old.set_user_attr(STUDY_CONFIRMATION, {"run": "r1", "rounds": {"a": [[100.0, 110.0, 105.0], []], "b": [[90.0], []]}})
    study = SearchStudy.load(storage, "old")
    assert study.reuse_rounds({"a", "b"}, 4) == ({}, {})  # asked for more rounds than its leader measured
    assert study.reuse_rounds({"a"}, 3) == ({}, {})  # other finalists
    rounds, peaks = study.reuse_rounds({"a", "b"}, 3)
    assert rounds == {"a": ([100.0, 110.0, 105.0], [], []), "b": ([90.0], [], [])} and peaks == {}
    assert study.winner_rounds() == rounds and study.study.user_attrs[STUDY_VERDICT] == {}
    cut = optuna.create_study(study_name="cut", storage=storage)  # this version's, interrupted: its run's twin is there
    for key in (STUDY_CONFIRMATION, f"{STUDY_CONFIRMATION}:r2"):
        cut.set_user_attr(key, {"run": "r2", "rounds": {"a": [[100.0, 110.0, 105.0], []]}})
    assert SearchStudy.load(storage, "cut").reuse_rounds({"a"}, 3) == ({}, {})
    assert STUDY_WINNER_ROUNDS not in SearchStudy.load(storage, "cut").study.user_attrs


def test_a_stop_while_a_shared_study_worker_writes_the_study_s_winner_waits_for_both_files(tmp_path, cache_dir, monkeypatch) -> None:
    """A worker that finds the study's winner published writes it to its own --out: a SIGTERM there waits until best.json
    and train.py are both whole, then ends the worker as interrupted (exit 130), naming the winner's file. Before, the
    signal killed the worker (exit 143), possibly between the two files."""
    import autotune.tuner.run
    from autotune.errors import SearchInterrupted
    from autotune.output.best import read_best
    from autotune.tuner import SearchConfig, run_search

    storage = f"journal:///{tmp_path / 'study.log'}"
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, confirm_rounds=2,
                          out=tmp_path / "first", cache_dir=cache_dir, synthetic_images=64, storage=storage, study="shared",
                          ceilings=False)
    run_search(config, runner=steady_runner)  # the elected worker: it confirms and publishes the winner
    monkeypatch.setattr(autotune.tuner.run, "write_winner", _terminated_before(autotune.tuner.run.write_winner))
    second = tmp_path / "second"

    def refused(signum, frame):  # type: ignore[no-untyped-def]
        raise _Stopped

    previous = signal.signal(signal.SIGTERM, refused)  # where the search installs no handler of its own
    try:
        with pytest.raises(SearchInterrupted, match=r"^interrupted: the study's confirmed winner is in .*second/best.json"):
            run_search(replace(config, out=second), runner=steady_runner)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert read_best(second / "best.json").setup == read_best(tmp_path / "first" / "best.json").setup
    script = (second / "train.py").read_text()
    compile(script, "train.py", "exec")  # whole
    assert "this worker wrote the same to" in script and not (second / "report.html").exists()


def test_images_removed_from_data_while_the_search_runs_stop_the_next_trial_naming_the_change(tmp_path, synthetic_data) -> None:
    """Images deleted after the first trial (22 of 80 in the case found): the later trials and the confirmation measured
    58 while the search said 80, and the same command then refused the study as made for another search. A trial that finds another
    count than the search began with ends as bad data (the search stops with it); a DDP rank compares its share."""
    import dataclasses
    import shutil
    import time

    from autotune.records import TrialOptions
    from autotune.runner import entry
    from autotune.train_setup import TrainSetup
    from autotune.workloads import build_workload

    data = tmp_path / "photos"
    shutil.copytree(synthetic_data, data)
    workload = build_workload(model="resnet18", image_size=32, data=data, device="cpu", write_data=False)
    request = {"setup": TrainSetup(batch_size=4).to_dict(), "workload": workload.to_dict(),
               "options": dataclasses.asdict(TrialOptions(trial_seconds=0.3, windows=2))}
    assert entry.execute(request, started=time.perf_counter(), send=lambda event: None).status == "ok"
    for folder in sorted(p for p in data.iterdir() if p.is_dir()):  # one image of each of the 10 classes
        next(folder.glob("*.jpg")).unlink()
    result = entry.execute(request, started=time.perf_counter(), send=lambda event: None)
    assert result.status == "bad_data", result
    assert result.error == f"{data}: 54 images now, 64 at the start: files were removed or added while it ran; put them back"
    for image in (data / "class_00").glob("*.jpg"):  # a class emptied: ImageFolder's own error, said as the change
        image.unlink()
    result = entry.execute(request, started=time.perf_counter(), send=lambda event: None)
    assert result.status == "bad_data" and result.error.startswith(f"{data}: Found no valid file for the classes class_00"), result
    assert result.error.endswith("; files were removed while the search ran: put them back")
    from autotune.workloads.data import BadData, same_count

    halves = dataclasses.replace(workload, images=27)  # one of two ranks' share of the 54 left
    assert same_count(list(range(54)), halves, world_size=2) == list(range(54))
    whole = dataclasses.replace(workload, images=54)  # `autotune trial --nproc-per-node 2` counts the whole folder
    assert same_count(list(range(54)), whole, world_size=2) == list(range(54))
    with pytest.raises(BadData, match=r": 50 images now, 27 \(a rank's share of 54 or so\) at the start"):
        same_count(list(range(50)), halves, world_size=2)
