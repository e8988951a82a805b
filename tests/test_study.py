"""The study module: opening and resuming, the signature, what is stored per trial and per study."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.errors import StorageError, StudyMismatch
from autotune.records import Calibration, TrialResult
from autotune.train_setup import KNOBS, TrainSetup
from autotune.tuner.identity import signature_difference
from autotune.tuner.study import ROLE_DEFAULTS, ROLE_SEARCH, SearchStudy, startup_trials_for


def _open(tmp_path: Path, trials: int = 30, name: str = "s") -> SearchStudy:
    return SearchStudy.open(f"sqlite:///{tmp_path / 'study.db'}", name, trials=trials)


def test_the_startup_schedule_is_kept_when_a_study_is_resumed_with_more_trials(tmp_path: Path) -> None:
    assert startup_trials_for(9) == 3 and startup_trials_for(90) == 10
    first = _open(tmp_path, trials=9)
    again = _open(tmp_path, trials=90)
    assert first.study.user_attrs["n_startup_trials"] == again.study.user_attrs["n_startup_trials"] == 3
    assert again.study.sampler._n_startup_trials == 3


def test_openers_of_a_new_sqlite_study_at_once_all_open_it(tmp_path: Path) -> None:
    """Opening creates Optuna's tables; openers racing on a fresh file (``autotune status`` while a search starts, as a
    CI run met) retry instead of failing on "table ... already exists". Four threads start together on each file."""
    import threading

    import optuna

    from autotune.tuner.storage import open_storage

    errors: list[str] = []
    for round_ in range(2):
        url, go = f"sqlite:///{tmp_path / f'race{round_}.db'}", threading.Barrier(4)

        def open_it(url: str = url, go: threading.Barrier = go) -> None:
            go.wait()
            try:
                optuna.create_study(storage=open_storage(url), study_name="s", load_if_exists=True)
            except Exception as exc:  # what the race raised before
                errors.append(f"{type(exc).__name__}: {exc}"[:200])

        threads = [threading.Thread(target=open_it) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not errors


def test_an_unreachable_storage_is_one_error() -> None:
    with pytest.raises(StorageError, match="cannot open study storage"):
        SearchStudy.open("postgresql://nobody@127.0.0.1:1/none", "s")


def test_a_different_signature_is_refused_naming_the_difference(tmp_path: Path) -> None:
    import studies

    study = _open(tmp_path)
    study.check_signature({"model": "resnet18", "trial_seconds": 3.0})
    # Nothing measured yet (the first run failed before its calibration): the corrected search takes the study.
    _open(tmp_path).check_signature({"model": "resnet18", "trial_seconds": 4.0})
    study.check_signature({"model": "resnet18", "trial_seconds": 3.0})
    studies.seed_calibration(f"sqlite:///{tmp_path / 'study.db'}", "s")  # measured: the study is this search's now
    study.check_signature({"model": "resnet18", "trial_seconds": 3.0})  # the same search resumes
    with pytest.raises(StudyMismatch, match=r"--trial-seconds: 3.0 there, 5.0 now"):
        _open(tmp_path).check_signature({"model": "resnet18", "trial_seconds": 5.0})
    assert signature_difference({"a": [1]}, {"a": (1,)}) is None  # compared as stored JSON


def test_a_changed_set_is_named_as_the_user_wrote_it_and_an_older_study_s_constraints_still_match() -> None:
    from autotune.records import Workload
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.constraints import parse_constraint
    from autotune.tuner.identity import signature

    def signed(*texts: str) -> dict:
        return signature(SearchConfig(model="resnet18", trials=3, constraints=texts), Workload(model="resnet18"))

    assert signed("num_workers=0", "amp=off,bf16")["constraints"] == ["amp=off,bf16", "num_workers=0"]
    assert signature_difference(signed(), signed("num_workers=0")) == "no --set there, --set num_workers=0 now"
    assert signature_difference(signed("num_workers=1..4"), signed("num_workers=..4")) == "--set num_workers=1..4 there, --set num_workers=..4 now"
    # Studies stored each constraint's dataclass repr before: the same --set resumes them.
    older = {**signed(), "constraints": [repr(parse_constraint("num_workers=1..4")), repr(parse_constraint("num_threads=auto,1"))]}
    assert signature_difference(older, signed("num_threads=auto,1", "num_workers=1..4")) is None


def test_a_study_without_ddp_is_named_one_rank_when_ddp_is_asked() -> None:
    from autotune.records import Workload
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.identity import signature

    lone = signature(SearchConfig(model="resnet18", trials=3), Workload(model="resnet18"))
    ddp = signature(SearchConfig(model="resnet18", trials=3, nproc_per_node=2), Workload(model="resnet18"))
    assert signature_difference(lone, ddp) == "--nproc-per-node: 1 there, 2 now"
    assert signature_difference(ddp, lone) == "--nproc-per-node: 2 there, 1 now"


def test_another_synthetic_count_names_the_flag_that_continues_the_study() -> None:
    """A study made with another count of synthetic JPEGs (a CUDA study from before 16384 became CUDA's default, made with
    2000): the refusal names --synthetic-images with the stored count, where it alone differs; not where more differs."""
    from autotune.records import Workload
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.identity import signature

    def signed(images: int, device: str = "cuda:0") -> dict:
        workload = Workload(model="resnet18", device=device, images=images, synthetic_images=images)
        return signature(SearchConfig(model="resnet18", trials=3), workload)

    assert signature_difference(signed(2000), signed(16384)) == (
        "synthetic JPEGs: 2000 there, 16384 now; --synthetic-images 2000 continues it (without it: 2000 on a CPU, 16384 on CUDA)")
    older = {k: v for k, v in signed(2000).items() if k != "samples"}  # stored by an earlier version
    assert signature_difference(older, signed(16384)).startswith("synthetic JPEGs: 2000 there, 16384 now; --synthetic-images 2000")
    assert signature_difference(signed(2000), signed(16384, device="cuda:1")) == "--device: 'cuda:0' there, 'cuda:1' now"


def test_a_changed_task_model_or_data_size_is_another_search() -> None:
    from autotune.records import Workload
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.identity import signature

    def signed(images: int, parameters: int | None) -> dict:
        workload = Workload(model="m:f", task="m:f", images=images, parameters=parameters)
        return signature(SearchConfig(model="resnet18", trials=3, workload="m:f"), workload)

    assert signature_difference(signed(2048, 10), signed(2048, 10)) is None
    assert signature_difference(signed(2048, 10), signed(2048, 1000)) == "the model's parameters: 10 there, 1000 now"
    # A Task's model field holds its factory's reference: --workload, as the user wrote it.
    assert signature_difference({"task": "m:f", "model": "m:f"}, {"task": "m:g", "model": "m:g"}) == "--workload: 'm:f' there, 'm:g' now"
    assert signature_difference({"model": "resnet18"}, {"model": "resnet50"}) == "--model: 'resnet18' there, 'resnet50' now"
    assert signature_difference(signed(2048, 10), signed(300, 10)) == "samples in the data: 2048 there, 300 now"
    older = {k: v for k, v in signed(2048, 10).items() if k not in ("samples", "parameters")}  # stored by earlier versions
    assert signature_difference(older, signed(300, 1000)) is None


def test_a_changed_task_batch_size_is_another_search() -> None:
    """The Task's batch_size is the PyTorch defaults' batch, the speedup's baseline: a study whose defaults ran another
    batch would have no baseline trial for this one (and say its trial had failed)."""
    from autotune.records import Workload
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.identity import signature

    def signed(batch: int | None) -> dict:
        workload = Workload(model="m:f", task="m:f", images=200, parameters=10, reference_batch=batch)
        return signature(SearchConfig(model="resnet18", trials=3, workload="m:f"), workload)

    assert signature_difference(signed(16), signed(16)) is None
    assert signature_difference(signed(16), signed(32)) == "the Task's batch_size: 16 there, 32 now"
    # Internal names said in the user's words: it read "max_memory: None there, 4294967296 now".
    assert signature_difference({"max_memory": None}, {"max_memory": 2**32}) == "--max-memory: the default (half the RAM) there, 4.0 GiB now"
    older = {k: v for k, v in signed(16).items() if k != "batch_size"}  # stored by earlier versions
    assert signature_difference(older, signed(32)) is None
    assert "batch_size" not in signature(SearchConfig(model="resnet18", trials=3), Workload(model="resnet18"))


def test_trials_sampled_from_other_choices_stop_the_search_in_one_line(tmp_path: Path) -> None:
    """Optuna cannot sample a knob whose choices changed within a study: the search says why, never crashes."""
    from autotune.records import TrialOptions, Workload
    from autotune.tuner.explore import Exploration, setup_for
    from autotune.tuner.space import Space

    def plan(batches: tuple[int, ...]) -> Exploration:
        fixed = {k: (getattr(TrainSetup(), k),) for k in KNOBS}
        space = Space({**fixed, "batch_size": batches})
        return Exploration(space, TrainSetup(), Workload(model="resnet18"), TrialOptions(), 3, tmp_path / "trials.csv")

    study = _open(tmp_path)
    trial, role = study.ask()
    assert setup_for(trial, role, plan((8, 16, 32))).batch_size in (8, 16, 32)
    study.tell(trial, TrialResult(status="ok", samples_per_s=1.0))
    trial, role = study.ask()
    with pytest.raises(StorageError, match=r"holds trials sampled from other choices of a knob than this search offers \(batch_size="
                                           r"8\|16\|32 in the study's trials, batch_size=8\|16 in this search; .*another --out \(with "
                                           r"--storage: --study NEW_NAME\)"):
        setup_for(trial, role, plan((8, 16)))


def test_a_study_sampled_in_an_older_space_is_refused_not_crashed(tmp_path: Path) -> None:
    from autotune.records import Workload
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.identity import signature
    from autotune.tuner.space import SPACE_VERSION

    current = signature(SearchConfig(model="resnet18", trials=3), Workload(model="resnet18"))
    assert current["space"] == SPACE_VERSION
    older = {k: v for k, v in current.items() if k != "space"}  # stored before the space was versioned
    study = _open(tmp_path)
    study.check_signature(older)
    study.study.enqueue_trial({"batch_size": 32})  # a trial of that space
    with pytest.raises(StudyMismatch, match=f"space: None there, {SPACE_VERSION} now"):
        _open(tmp_path).check_signature(current)


def test_a_study_of_an_effective_batch_whose_batches_changed_is_refused(tmp_path: Path) -> None:
    """--effective-batch 96 offers every divisor now (a changed distribution Optuna refuses): its older study is refused
    in words; one of a power of two (the same batches) is not."""
    from autotune.records import Workload
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.identity import signature

    for effective, refused in ((96, True), (256, False)):
        current = signature(SearchConfig(model="resnet18", trials=3, effective_batch=effective), Workload(model="resnet18"))
        study = _open(tmp_path, name=f"eb{effective}")
        study.check_signature({**current, "space": 2})  # as the version before wrote it
        study.study.enqueue_trial({"batch_size": 32})
        if refused:
            with pytest.raises(StudyMismatch, match="space: 2 there, 3 now: another autotune version sampled it"):
                _open(tmp_path, name=f"eb{effective}").check_signature(current)
        else:
            _open(tmp_path, name=f"eb{effective}").check_signature(current)


def test_trials_are_stored_told_and_read_back(tmp_path: Path) -> None:
    study = _open(tmp_path)
    study.check_signature({"model": "resnet18"})  # as every search does before its first trial
    study.enqueue(ROLE_DEFAULTS, {})
    setup = TrainSetup(batch_size=16)
    trial, role = study.ask()
    assert role == ROLE_DEFAULTS
    result = TrialResult(status="ok", samples_per_s=123.0, windows=(120.0, 126.0))
    study.record(trial, role, setup, result, reused_from=None)
    study.tell(trial, result)
    oom = TrialResult(status="oom", error="too big")
    trial2, role2 = study.ask()
    assert role2 == ROLE_SEARCH
    study.record(trial2, role2, setup.replace(batch_size=64), oom, reused_from=None)
    study.tell(trial2, oom)
    trial3, _ = study.ask()
    study.fail(trial3)  # interrupted: does not count
    reopened = _open(tmp_path)
    records = reopened.records()
    assert reopened.finished() == 2 and [r.number for r in records] == [0, 1]
    assert records[0].setup == setup and records[0].result == result and records[0].role == ROLE_DEFAULTS
    assert reopened.study.trials[1].value == 0.0  # infeasible trials are worth 0 to the sampler
    assert reopened.same_setup(setup, number=5).number == 0
    assert reopened.same_setup(setup, number=0) is None


def test_calibration_survives_a_reopen_and_confirmation_stays_with_its_run(tmp_path: Path) -> None:
    study = _open(tmp_path)
    assert study.calibration() is None and study.confirmation() == {}
    calibration = Calibration(
        budget_bytes=1, max_batch=64, memory_points=(), probe_batch=64, compute_setup=TrainSetup(),
        compute_samples_per_s=None, loader=(), max_workers=2,
    )
    study.store_calibration(calibration)
    study.store_confirmation("a", ([1.0, 2.0], [], []))
    study.store_confirmation("b", ([], ["oom: x"], [0]))
    assert study.confirmation() == {"a": ([1.0, 2.0], [], []), "b": ([], ["oom: x"], [0])}
    reopened = _open(tmp_path)
    assert reopened.calibration() == calibration
    assert reopened.confirmation() == {}  # another run: its rounds are measured anew, never mixed


def test_status_names_a_running_trials_role_and_how_long_it_has_run(tmp_path: Path) -> None:
    from autotune.tuner.status import study_status

    study = _open(tmp_path)
    study.claim()  # a live lone search holds the study: its RUNNING trial is its own
    study.check_signature({"model": "resnet18"})
    study.enqueue(ROLE_DEFAULTS, {})
    before = time.time()
    trial, role = study.ask()
    assert role == ROLE_DEFAULTS
    found = study_status(f"sqlite:///{tmp_path / 'study.db'}")
    since = time.time() - before
    running = found.running[0]
    assert running.number == trial.number and running.role == ROLE_DEFAULTS and not running.gone
    # Its age is the time since it was asked, however loaded the machine (1 s: the stored start's clock resolution).
    assert running.seconds is not None and 0 <= running.seconds <= since + 1.0
    assert any(line.startswith(f"  running: #{trial.number} (defaults, ") and " s) on pid " in line for line in found.lines())
    assert found.to_dict()["running"][0]["role"] == ROLE_DEFAULTS


def test_status_reads_the_trials_once_so_a_trial_finishing_meanwhile_is_not_both_running_and_best(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A probe's `autotune status` during a rerun: "running: #10" and "best so far: #10" beside "9/10 trials finished"
    (the running trials and the finished records were two reads of the study)."""
    from autotune.tuner.status import study_status

    study = _open(tmp_path)
    study.claim()
    study.check_signature({"model": "resnet18"})
    study.enqueue(ROLE_DEFAULTS, {})
    trial, role = study.ask()
    before = study.study.get_trials(deepcopy=True)  # the first read sees it running ...
    result = TrialResult(status="ok", samples_per_s=300.0, windows=(300.0,))
    study.record(trial, role, TrainSetup(), result, reused_from=None)
    study.tell(trial, result)  # ... and it finishes before any later read
    real = optuna.Study.get_trials

    def read_of_every_state_before(self: optuna.Study, deepcopy: bool = True, states: Any = None) -> list[Any]:
        return before if states is None else real(self, deepcopy, states)  # a read of the finished ones sees it done

    monkeypatch.setattr(optuna.Study, "get_trials", read_of_every_state_before)
    found = study_status(f"sqlite:///{tmp_path / 'study.db'}")
    assert [r.number for r in found.running] == [trial.number] and found.best is None and found.finished == 0, found.lines()


def test_status_s_best_so_far_is_the_fastest_trial_the_stored_set_allows(tmp_path: Path) -> None:
    from autotune.records import Workload
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.constraints import parse_constraint
    from autotune.tuner.identity import signature
    from autotune.tuner.status import study_status

    def told(study: SearchStudy, setup: TrainSetup, samples_per_s: float) -> None:
        trial, role = study.ask()
        result = TrialResult(status="ok", samples_per_s=samples_per_s, windows=(samples_per_s,))
        study.record(trial, role, setup, result, reused_from=None)
        study.tell(trial, result)

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = _open(tmp_path)
    study.check_signature(signature(SearchConfig(model="resnet18", trials=3, constraints=("num_workers=1..2",)),
                                    Workload(model="resnet18")))
    study.enqueue(ROLE_DEFAULTS, {})
    told(study, TrainSetup(), 300.0)  # the PyTorch defaults, 0 workers: the fastest, outside --set num_workers=1..2
    alone = study_status(storage)
    assert alone.best is not None and alone.best.number == 0 and alone.best_excluded_by == "--set num_workers=1..2"
    assert "best so far: #0 " in " ".join(alone.lines()) and "(outside --set num_workers=1..2: no trial within it" in " ".join(alone.lines())
    told(study, TrainSetup(num_workers=1), 200.0)
    told(study, TrainSetup(num_workers=2), 250.0)
    found = study_status(storage)
    assert found.best is not None and found.best.number == 2 and found.best_excluded_by is None
    assert any(line.startswith("best so far: #2 ") and line.endswith("250.0 samples/s") for line in found.lines())
    assert found.to_dict()["best"]["number"] == 2 and found.to_dict()["best_excluded_by"] is None
    # A study that stored each constraint's repr (earlier versions) reads the same; one without a signature shows the fastest.
    study.study.set_user_attr("signature", {"constraints": [repr(parse_constraint("num_workers=1..2"))]})
    assert study_status(storage).best.number == 2
    study.study.set_user_attr("signature", None)
    assert study_status(storage).best.number == 0
    # A loader twin of the fastest diverged: the fastest finished by luck, and no longer reads as the best so far.
    told(study, TrainSetup(batch_size=64, num_workers=1), 350.0)
    assert study_status(storage).best.number == 3
    trial, role = study.ask()
    diverged = TrialResult(status="diverged", error="the loss became NaN or infinite")
    study.record(trial, role, TrainSetup(batch_size=64), diverged, reused_from=None)
    study.tell(trial, diverged)
    assert study_status(storage).best.number == 0


def test_a_study_another_program_filled_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """A plain Optuna study (trials, no search signature) named by --study is not taken over: before, the search
    calibrated into it, then ended with ``all 0 trials failed ()`` as its trials counted toward --trials."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    foreign = optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="s", direction="maximize")
    foreign.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    url = f"sqlite:///{tmp_path / 'study.db'}"
    with pytest.raises(StorageError, match=r"study 's' in .* holds 2 trials but no autotune search signature: another program made it; "
                                           r"pass --study NEW_NAME$"):
        SearchStudy.open(url, "s")
    with pytest.raises(StorageError, match="another program made it; pass another --out$"):  # --out's own study.db: not another name
        SearchStudy.open(url, "s", in_out=True)
    assert optuna.load_study(study_name="s", storage=url).user_attrs == {}  # nothing written to it
    with pytest.raises(StorageError, match="another program made it; autotune reads only the studies of its own searches$"):
        SearchStudy.load(url)  # autotune status and autotune report: no setups, no results to show


_FULL_DISK = """
import os, resource, signal, sys
import optuna
from autotune.tuner.storage import open_storage
url = sys.argv[1]
study = optuna.create_study(study_name="s", storage=open_storage(url))
for value in (1.0, 2.0):
    study.add_trial(optuna.trial.create_trial(value=value))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as on a full disk, partly written
soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (os.path.getsize(url.split("///", 1)[1]) + 100, hard))
try:
    study.add_trial(optuna.trial.create_trial(value=9.0, user_attrs={"pad": "x" * 5000}))
except OSError as exc:
    print("write failed", exc.errno)
resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))  # the disk has room again: the search goes on
study.add_trial(optuna.trial.create_trial(value=3.0))
"""


def test_a_journal_write_cut_short_leaves_whole_records_and_a_readable_study(tmp_path: Path) -> None:
    """A full disk cut a journal record short; the next append wrote onto it, the two made one line that is no JSON,
    and every later read failed: the study's calibration and trials were lost. A torn last line left by a process
    killed mid-write is cut away before the next append too."""
    import subprocess
    import sys

    import optuna

    log = tmp_path / "study.log"
    url = f"journal:///{log}"
    ran = subprocess.run([sys.executable, "-c", _FULL_DISK, url], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)
    assert ran.returncode == 0 and "write failed 27" in ran.stdout, ran.stderr[-2000:]
    assert log.read_bytes().endswith(b"\n")
    (log.open("ab")).write(b'{"op_code":4,"worker_id":"x","trial_id":')  # a record cut short by a kill
    from autotune.tuner.storage import open_storage

    optuna.load_study(study_name="s", storage=open_storage(url)).add_trial(optuna.trial.create_trial(value=4.0))
    values = sorted(t.value for t in optuna.load_study(study_name="s", storage=open_storage(url)).trials)
    assert values == [1.0, 2.0, 3.0, 4.0]
    assert all(line.startswith(b"{") and line.endswith(b"}") for line in log.read_bytes().splitlines())
    other = tmp_path / "notes.json"  # a wrong path to a file of one's own, with no newline: not taken for a torn record
    other.write_bytes(b'{"mine": 1}')
    with contextlib.suppress(Exception):
        optuna.create_study(study_name="s", storage=open_storage(f"journal:///{other}"))
    assert other.read_bytes().startswith(b'{"mine": 1}')


def test_a_study_name_with_control_characters_reaches_no_terminal_raw(tmp_path: Path) -> None:
    """`status --study nope` listed the storage's studies as they were: a name holding ESC put a colour escape on the
    terminal (the line's newline was escaped, the ESC not). Names that are not printable are listed as Python literals."""
    storage = f"sqlite:///{tmp_path / 's.db'}"
    optuna.create_study(study_name="plain", storage=storage)
    optuna.create_study(study_name="a\x1b[31mred", storage=storage)
    with pytest.raises(StorageError) as raised:
        SearchStudy.load(storage, "nope")
    assert "\x1b" not in str(raised.value) and "(studies there: plain, 'a\\x1b[31mred')" in str(raised.value)
