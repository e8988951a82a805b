"""Fault injection: real signals, real second processes, real corrupt files.

Each test provokes one fault a long search meets (docs/faults.md lists them
with the command that reproduces each) and checks that nothing measured is
lost and the user gets one clear line. The waits poll an observable event
(a trial RUNNING in the study, a line on stderr), never a fixed sleep.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest
from optuna.trial import TrialState

TESTS = Path(__file__).parent
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(TESTS.parent)])}
WAIT_S = 240.0
optuna.logging.set_verbosity(optuna.logging.WARNING)


def search_cmd(out: Path, cache_dir: Path, *extra: str, trials: int = 2) -> list[str]:
    """``autotune search`` of the tiny test model, 1-s trials, one confirmation round."""
    return [sys.executable, "-m", "autotune", "search", "--model", "factories:tiny_cnn", "--image-size", "32",
            "--synthetic-images", "64", "--trial-seconds", "1", "--device", "cpu", "--trials", str(trials),
            "--confirm-top", "1", "--confirm-rounds", "1", "--out", str(out), "--cache-dir", str(cache_dir), *extra]


def start(cmd: list[str]) -> subprocess.Popen[bytes]:
    """The command in a child with default signal dispositions (a background shell ignores SIGINT)."""
    def defaults() -> None:
        for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)

    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV, preexec_fn=defaults)


def wait_running(proc: subprocess.Popen[bytes], out: Path, number: int) -> None:
    """Wait until trial ``number`` is RUNNING in the study of ``out``."""
    storage = f"sqlite:///{out / 'study.db'}"
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1].decode()
        if (out / "study.db").exists():
            try:
                trials = optuna.load_study(study_name=None, storage=storage).get_trials(deepcopy=False)
            except Exception:  # the study is still being created
                trials = []
            if any(t.number == number and t.state == TrialState.RUNNING for t in trials):
                return
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"trial #{number} never ran")


def study_of(out: Path) -> optuna.Study:
    return optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")


@pytest.mark.slow
def test_hangup_and_kill9_mid_trial_lose_nothing_and_a_second_search_is_refused(tmp_path, cache_dir) -> None:
    """SIGHUP during the defaults trial, kill -9 during the next: the resumed search still has its baseline.

    While the first search runs, a second one on the same --out is refused in one line naming the holder.
    """
    out = tmp_path / "out"
    first = start(search_cmd(out, cache_dir))
    wait_running(first, out, 0)
    first.send_signal(signal.SIGHUP)
    _, stderr = first.communicate(timeout=WAIT_S)
    assert first.returncode == 130, stderr.decode()
    assert "Traceback" not in stderr.decode()
    assert study_of(out).trials[0].state == TrialState.FAIL

    resumed = start(search_cmd(out, cache_dir))
    wait_running(resumed, out, 1)
    resumed.send_signal(signal.SIGSTOP)  # frozen mid-trial: it certainly holds --out while the second one starts
    second = subprocess.run(search_cmd(out, cache_dir), capture_output=True, env=ENV, timeout=WAIT_S)
    resumed.kill()  # kill -9: no handler runs, the trial stays RUNNING in the study
    resumed.communicate(timeout=WAIT_S)
    assert second.returncode == 1
    line = second.stderr.decode().strip()
    assert f"pid {resumed.pid} on" in line and "in use by another autotune search" in line
    assert len(line.splitlines()) == 1
    assert study_of(out).trials[1].state == TrialState.RUNNING

    final = subprocess.run(search_cmd(out, cache_dir, "--json"), capture_output=True, env=ENV, timeout=WAIT_S)
    assert final.returncode == 0, final.stderr.decode()
    summary = json.loads(final.stdout)
    assert summary["best"]["speedup"] is not None
    assert summary["best"]["defaults_samples_per_s"] > 0
    study = study_of(out)
    assert study.trials[1].state == TrialState.FAIL  # the dead process's trial
    finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
    assert len(finished) == 2
    assert [t.user_attrs["role"] for t in finished].count("defaults") == 1
    assert "left running by a search that died" in final.stderr.decode()


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
