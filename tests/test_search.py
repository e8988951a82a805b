"""The search end to end: a real tiny search, and its logic with a fake runner."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import studies
from hosts import pretend_bf16_cpu

from autotune.errors import SearchFailed, StudyMismatch, UsageError
from autotune.output.best import read_best
from autotune.records import TrialResult
from autotune.train_setup import TrainSetup
from autotune.tuner import SearchConfig, run_search
from autotune.tuner.constraints import check_effective_batch, parse_constraint

TESTS = Path(__file__).parent


def fake_runner(setup: TrainSetup, workload, options=None, *, on_window=None) -> TrialResult:
    """Deterministic stand-in: fp32 training with loader workers never fits; the loader computes on 2 cores."""
    if options.mode == "loader":
        return TrialResult(status="ok", samples_per_s=200.0 * (min(setup.num_workers, 2) + 1), windows=(1.0,))
    if options.mode == "train" and setup.amp == "off" and setup.num_workers > 0:
        return TrialResult(status="oom", error="peak memory 9.00 GiB exceeded the budget of 8.00 GiB", peak_memory_bytes=9 * 2**30)
    rate = 100.0 * min(setup.batch_size, 128) / 32 * (1.5 if setup.amp == "bf16" else 1.0) * (1 + 0.3 * setup.num_workers)
    if options.mode == "compute":
        rate *= 2
    windows = (rate, rate)
    if on_window is not None:
        for i, w in enumerate(windows):
            if on_window(i, w):
                return TrialResult(status="pruned", samples_per_s=w, windows=windows[: i + 1])
    return TrialResult(
        status="ok", samples_per_s=rate, samples_per_s_spread=0.0, windows=windows, peak_memory_bytes=2**28 + setup.batch_size * 2**20,
        data_wait_fraction=0.1, step_time_s=setup.batch_size / rate,
    )


def search(cfg: SearchConfig, runner=fake_runner, **kw):
    """run_search with the fake runner handed in."""
    return run_search(cfg, runner=runner, **kw)


def measured(records) -> list:
    """The trials that ran (free ones, a repeat or a setup the data cannot feed, do not use up ``--trials``)."""
    return [r for r in records if not r.free]


def config(tmp_path: Path, cache_dir: Path, **kw) -> SearchConfig:
    base = dict(model="resnet18", trials=6, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                cache_dir=cache_dir, synthetic_images=64, confirm_rounds=2, confirm_top=2)
    base.update(kw)
    if base.get("data") is not None:
        base.pop("synthetic_images")  # refused beside --data
    return SearchConfig(**base)


def test_a_stop_in_the_python_api_gets_through_except_autotune_error(tmp_path, cache_dir, monkeypatch) -> None:
    """A loop of searches that skips failed ones with `except autotune.AutotuneError` (as the docs show) skipped a
    Ctrl-C to the next search, and a scheduler's SIGTERM to a clean exit 0: the stop was an AutotuneError. It is a
    KeyboardInterrupt (SearchStopped) with the best so far, and the finished trial is kept."""
    import autotune
    import autotune.api

    trained: list[TrainSetup] = []

    def stopped_at_the_second_trial(setup, workload, options=None, *, on_window=None) -> TrialResult:
        if options.mode == "train" and len(trained) == 1:
            raise KeyboardInterrupt
        trained.extend([setup] if options.mode == "train" else [])
        return fake_runner(setup, workload, options, on_window=on_window)

    monkeypatch.setattr(autotune.api, "run_search", lambda cfg, reporter=None: run_search(cfg, reporter, runner=stopped_at_the_second_trial))
    with pytest.raises(autotune.SearchStopped, match=r"^interrupted: 1 finished trial kept in ") as stopped:
        try:
            autotune.search(model="resnet18", image_size=32, trials=4, device="cpu", out=tmp_path / "out", cache_dir=cache_dir,
                            synthetic_images=64)
        except autotune.AutotuneError as exc:
            pytest.fail(f"a stop caught as an error: {exc!r}")
    assert isinstance(stopped.value, KeyboardInterrupt) and not isinstance(stopped.value, autotune.AutotuneError)
    assert str(stopped.value).endswith("(unconfirmed); rerun the same call to resume"), stopped.value  # the caller ran no command
    assert stopped.value.outcome.interrupted and stopped.value.outcome.best.setup == trained[0]
    assert read_best(tmp_path / "out").setup == trained[0]

    # A trial terminated from outside (earlyoom's SIGTERM) stops the search, but nothing stopped this process: the loop's
    # `except AutotuneError` takes it, where a KeyboardInterrupt ended the loop of a caller who had pressed nothing.
    def terminated(setup, workload, options=None, *, on_window=None) -> TrialResult:
        if options.mode == "train":
            return TrialResult(status="interrupted", error="the trial process was terminated from outside (SIGTERM)")
        return fake_runner(setup, workload, options, on_window=on_window)

    monkeypatch.setattr(autotune.api, "run_search", lambda cfg, reporter=None: run_search(cfg, reporter, runner=terminated))
    with pytest.raises(autotune.AutotuneError, match=r"\(what stopped it: the trial process was terminated from outside \(SIGTERM\)\)"):
        autotune.search(model="resnet18", image_size=32, trials=4, device="cpu", out=tmp_path / "other", cache_dir=cache_dir,
                        synthetic_images=64)


def test_a_rerun_with_parallel_trials_is_refused_for_a_study_of_lone_trials(tmp_path, cache_dir) -> None:
    """Trials run one per core beside another (`--devices cpu,cpu`) measure another machine than trials alone on every
    core. A probe's rerun with --devices was accepted: its trials were pruned against the lone ones' best, and best.json
    said every trial ran pinned beside another, false for those of the first run."""

    search(config(tmp_path, cache_dir, trials=2, confirm_top=1))
    records = (tmp_path / "out" / "trials.csv").read_text()
    with pytest.raises(StudyMismatch, match=r"was made for a different search \(trials at once \(--devices\): 1 there, 2 now\)") as info:
        search(config(tmp_path, cache_dir, trials=4, devices="cpu,cpu"))
    assert info.value.exit_code == 2  # a usage error, as for an --out that holds another study's files
    assert (tmp_path / "out" / "trials.csv").read_text() == records
    search(config(tmp_path, cache_dir, trials=3))  # without --devices it goes on
    # A study stored before the key (lone trials or parallel: which, it does not say) resumes, as it did: an older study
    # of parallel trials was refused on the same command, read as "parallel_trials: 1 there, 2 now".
    older = tmp_path / "older"
    search(config(tmp_path, cache_dir, trials=2, devices="cpu,cpu", confirm_top=1, out=older))
    stored = optuna.load_study(study_name="resnet18-32px-cpu", storage=f"sqlite:///{older / 'study.db'}")
    stored.set_user_attr("signature", {k: v for k, v in stored.user_attrs["signature"].items() if k != "parallel_trials"})
    search(config(tmp_path, cache_dir, trials=4, devices="cpu,cpu", confirm_top=1, out=older))


def test_a_rerun_of_parallel_trials_with_a_larger_budget_stores_it(tmp_path, cache_dir) -> None:
    """`autotune status` read `3/4` while a rerun with `--devices cpu,cpu --trials 6` ran, then `6 trials finished (the
    study's --trials: 4; 2 more stored past it)`: only the one-at-a-time loop stored a rerun's larger --trials."""
    from autotune.tuner.budget import STUDY_BUDGET

    search(config(tmp_path, cache_dir, trials=2, devices="cpu,cpu", confirm_top=1))
    search(config(tmp_path, cache_dir, trials=4, devices="cpu,cpu", confirm_top=1))
    stored = optuna.load_study(study_name="resnet18-32px-cpu", storage=f"sqlite:///{tmp_path / 'out' / 'study.db'}")
    assert stored.user_attrs[STUDY_BUDGET] == 4


def test_a_stop_as_the_calibration_line_is_printed_is_a_stop_during_calibration(tmp_path, cache_dir) -> None:
    """A SIGTERM right as calibration started (1 in about 10 of a probe's tries) ended with the CLI's generic `interrupted:
    autotune search stopped before it was done`: the line announcing the calibration was printed outside its guard."""
    from autotune.errors import SearchInterrupted
    from autotune.tuner.progress import SilentReporter

    class StoppedThere(SilentReporter):
        def message(self, text: str) -> None:
            if text.startswith("calibration:"):
                raise KeyboardInterrupt

    with pytest.raises(SearchInterrupted, match=r"^interrupted during calibration, before the first trial \(runs measured and kept: 0\)"):
        search(config(tmp_path, cache_dir, trials=2), reporter=StoppedThere())


def test_a_sqlite_storage_inside_a_new_out_directory_is_taken(tmp_path, cache_dir) -> None:
    """--out runs/a --storage sqlite:///runs/a/study.db on a first run: the URL is checked before --out exists."""
    out = tmp_path / "runs" / "a"
    outcome = search(config(tmp_path, cache_dir, trials=2, out=out, storage=f"sqlite:///{out}/study.db"))
    assert outcome.best is not None and (out / "study.db").is_file()


def test_fake_search_records_infeasible_and_writes_best(tmp_path, cache_dir) -> None:
    outcome = search(config(tmp_path, cache_dir, trials=12))
    statuses = [r.result.status for r in outcome.records]
    assert len(measured(outcome.records)) == 12
    assert "oom" in statuses
    best = read_best(tmp_path / "out" / "best.json")
    assert best.setup == outcome.best.setup
    assert not (best.setup.amp == "off" and best.setup.num_workers > 0)  # never an infeasible winner
    assert best.defaults_samples_per_s == pytest.approx(100.0)
    assert best.speedup == pytest.approx(best.samples_per_s / 100.0)
    with (tmp_path / "out" / "trials.csv").open() as fh:
        header = next(csv.reader(fh))
    assert len(header) == len(set(header))  # every column once: a DictReader or pandas reads each
    rows = list(csv.DictReader((tmp_path / "out" / "trials.csv").open()))
    assert len(rows) == len(outcome.records)
    assert rows[0]["role"] == "defaults" and rows[1]["role"] == "guess"
    guesses = [r for r in rows if r["role"] == "guess"]
    assert [r["role"] for r in rows[: 1 + len(guesses)]] == ["defaults"] + ["guess"] * len(guesses)
    assert {r["batch_size"] for r in guesses} == {"64"}  # the 64 images cap the batch at the first guess's 64
    oom_rows = [r for r in rows if r["status"] == "oom"]
    assert oom_rows and "exceeded the budget" in oom_rows[0]["error"]
    assert (tmp_path / "out" / "train.py").exists()


def test_an_effective_batch_larger_than_the_data_is_refused_before_anything_runs(tmp_path, cache_dir) -> None:
    from autotune.errors import UsageError

    ran: list[TrainSetup] = []

    def recording(setup, workload, options=None, *, on_window=None) -> TrialResult:
        ran.append(setup)
        return fake_runner(setup, workload, options, on_window=on_window)

    with pytest.raises(UsageError, match="--effective-batch 128 is larger than the 64 training images"):
        search(config(tmp_path, cache_dir, effective_batch=128), runner=recording)
    assert ran == [] and not (tmp_path / "out").exists()  # no calibration run, nothing written
    # So are --set values whose smallest optimizer step is larger than the data; one that leaves a smaller one is not.
    for pins, message in ((["batch_size=1000"], "--set batch_size (at least 1000): an optimizer step of at least 1000 is larger"),
                          (["batch_size=32..64", "accumulation_steps=4"], "--set batch_size (at least 32) and --set accumulation_steps"),
                          (["num_workers=2..4", "prefetch_factor=2", "batch_size=32"],
                           "--set num_workers=2..4 and --set prefetch_factor=2 and --set batch_size=32: the smallest loader queue they "
                           "allow (2 workers x prefetch 2 x batch 32 = 128 samples)")):
        with pytest.raises(UsageError, match=re.escape(message)):
            search(config(tmp_path, cache_dir, constraints=tuple(parse_constraint(p) for p in pins)), runner=recording)
    assert ran == [] and not (tmp_path / "out").exists()
    check_effective_batch(None, 64, constraints={"batch_size": parse_constraint("batch_size=8..1000")})
    queue = {"num_workers": parse_constraint("num_workers=2"), "prefetch_factor": parse_constraint("prefetch_factor=4")}
    with pytest.raises(UsageError, match=re.escape("(2 workers x prefetch 4 x batch 1 = 8 samples) is larger than the 4 training images")):
        check_effective_batch(None, 4, constraints=queue)
    check_effective_batch(None, 8, constraints=queue)  # an epoch of 8 holds it
    check_effective_batch(None, 4, constraints={**queue, "num_workers": parse_constraint("num_workers=0..2")})  # 0 workers: no queue
    check_effective_batch(None, 4, constraints={**queue, "num_workers": parse_constraint("num_workers=..2")})  # so does an open range
    # A pinned micro-batch above --effective-batch, before calibration too.
    with pytest.raises(UsageError, match=re.escape("--set batch_size=64: every micro-batch it allows is larger than --effective-batch 32")):
        search(config(tmp_path, cache_dir, effective_batch=32, constraints=(parse_constraint("batch_size=64"),)), runner=recording)
    assert ran == [] and not (tmp_path / "out").exists()
    check_effective_batch(32, None, constraints={"batch_size": parse_constraint("batch_size=16..64")})


def test_steps_larger_than_the_data_are_infeasible_and_never_run(tmp_path, cache_dir) -> None:
    ran: list[TrainSetup] = []

    def recording(setup, workload, options=None, *, on_window=None):
        if options.mode == "train":
            ran.append(setup)
        return fake_runner(setup, workload, options, on_window=on_window)

    # 64 images, batch 32 or 64: the space keeps accumulation 1 and 2 (32 x 2 fits), so 64 x 2 = 128 is sampled and refused
    # (the seeded random sampler draws it: deterministic for an Optuna version, not by design).
    outcome = search(config(tmp_path, cache_dir, trials=8, sampler="random",
                            constraints=(parse_constraint("batch_size=32..64"),)), runner=recording)
    too_big = [r for r in outcome.records if r.setup.effective_batch() > 64]
    assert too_big and all(r.result.status == "error" for r in too_big)
    assert "exceeds the 64 training images" in (too_big[0].result.error or "")
    assert all(s.effective_batch() <= 64 for s in ran)
    assert outcome.best.setup.effective_batch() <= 64


def test_data_smaller_than_the_default_batch_still_has_a_baseline(tmp_path, cache_dir) -> None:
    # 20 images: a DataLoader of batch 32 yields one batch of all 20, and so do the defaults measured.
    outcome = search(config(tmp_path, cache_dir, trials=3, synthetic_images=20))
    defaults = next(r for r in outcome.records if r.role == "defaults")
    assert defaults.setup == TrainSetup(batch_size=20) and defaults.result.ok
    assert outcome.best.defaults_samples_per_s and outcome.best.speedup
    assert not any("could not be measured" in n for n in outcome.best.notes)


def test_defaults_whose_trial_timed_out_get_their_speedup_from_the_confirmation(tmp_path, cache_dir) -> None:
    """The defaults' trial timed out on a busy machine: best.json had no speedup (the note said so). The confirmation
    measures them in its rounds like the finalists."""
    timed_out: list[TrainSetup] = []

    def busy_at_first(setup, workload, options=None, *, on_window=None):
        if options.mode == "train" and setup == TrainSetup(batch_size=32) and not timed_out:
            timed_out.append(setup)
            return TrialResult(status="timeout", error="no result within 20 s")
        return fake_runner(setup, workload, options, on_window=on_window)

    outcome = search(config(tmp_path, cache_dir, trials=4), runner=busy_at_first)
    assert timed_out and next(r for r in outcome.records if r.role == "defaults").result.status == "timeout"
    assert outcome.best.defaults_samples_per_s and outcome.best.speedup and outcome.best.speedup > 1
    assert not any("could not be measured" in n for n in outcome.best.notes), outcome.best.notes


def test_second_guess_at_the_largest_batch_when_throughput_rises(tmp_path, cache_dir) -> None:
    outcome = search(config(tmp_path, cache_dir, trials=4, synthetic_images=256, trial_seconds=4.0))  # batch cap 256
    roles = [r.role for r in outcome.records]
    assert roles[:3] == ["defaults", "guess", "guess"]
    guesses = [r.setup for r in outcome.records if r.role == "guess"]
    first, second = guesses[0], guesses[-1]  # the core split (where there is one) comes between them
    assert second.batch_size > first.batch_size
    # The same guess at the larger batch, its prefetch (and, where even depth 1 is too deep, its
    # workers) lowered so the loader queue fits in the 256 images.
    assert second == first.replace(batch_size=second.batch_size, prefetch_factor=second.prefetch_factor,
                                   num_workers=second.num_workers, persistent_workers=second.persistent_workers)
    assert second.num_workers <= first.num_workers
    assert second.num_workers * (second.prefetch_factor or 0) * second.batch_size <= 256
    assert "loader queue" not in (outcome.records[2].result.error or "")


def test_a_guess_gets_fewer_workers_when_even_prefetch_1_overfills_an_epoch() -> None:
    from autotune.tuner.guesses import _queue_within_epoch
    from autotune.tuner.space import Space

    values = {
        "num_workers": (0, 1, 2, 3), "prefetch_factor": (1, 2, 3, 4), "pin_memory": (False,), "persistent_workers": (True,),
        "batch_size": (64, 128, 256, 512), "accumulation_steps": (1,), "amp": ("off",), "channels_last": (False,),
    }
    space = Space(values=values, images=256)
    setup = TrainSetup(num_workers=3, prefetch_factor=4, persistent_workers=True, batch_size=64)
    assert _queue_within_epoch(space, setup) == setup.replace(prefetch_factor=1)  # 3 x 1 x 64 = 192
    big = setup.replace(batch_size=128)
    assert _queue_within_epoch(space, big) == big.replace(num_workers=2, prefetch_factor=1)  # 2 x 1 x 128 = 256
    whole = setup.replace(batch_size=256)
    assert _queue_within_epoch(space, whole) == whole.replace(num_workers=1, prefetch_factor=1)
    too_big = setup.replace(batch_size=512)  # no queue fits: the loader runs in the main process
    assert _queue_within_epoch(space, too_big) == too_big.replace(num_workers=0, prefetch_factor=None,
                                                                  persistent_workers=False)


def test_same_seed_gives_same_first_suggestions(tmp_path, cache_dir) -> None:
    first = search(config(tmp_path / "a", cache_dir, trials=7, seed=7))
    second = search(config(tmp_path / "b", cache_dir, trials=7, seed=7))
    other = search(config(tmp_path / "c", cache_dir, trials=7, seed=8))
    setups = lambda o: [r.setup for r in sorted(o.records, key=lambda r: r.number)]  # noqa: E731
    assert setups(first) == setups(second)
    assert setups(first) != setups(other)


def test_resume_adds_trials_instead_of_repeating(tmp_path, cache_dir) -> None:
    from autotune.tuner.progress import SilentReporter

    class Said(SilentReporter):
        lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    search(config(tmp_path, cache_dir, trials=4))
    storage = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    before = {t.number: t.user_attrs["setup"] for t in optuna.load_study(study_name=None, storage=storage).trials}
    outcome = search(config(tmp_path, cache_dir, trials=6), reporter=Said())
    assert "continuing study 'resnet18-32px-cpu': calibration reused, 4 finished trials kept" in Said.lines  # said so, not only implied
    study = optuna.load_study(study_name=None, storage=storage)
    assert {n: study.trials[n].user_attrs["setup"] for n in before} == before
    assert len(measured(outcome.records)) == 6
    # The same command again runs nothing new.
    again = search(config(tmp_path, cache_dir, trials=6))
    assert len(optuna.load_study(study_name=None, storage=storage).trials) == len(study.trials)
    # Nor does a smaller --trials: it says so, and the study's budget stays what it holds (status shows 6/6, not 6/3).
    Said.lines.clear()
    search(config(tmp_path, cache_dir, trials=3), reporter=Said())
    assert "the study holds 6 finished trials, --trials 3 asks for no more: none runs (pass --trials 7 or more to search further)" in Said.lines
    assert optuna.load_study(study_name=None, storage=storage).user_attrs["trials"] == 6
    assert again.records == outcome.records


def test_the_best_so_far_on_each_trial_s_line_is_of_the_setups_the_set_allows(tmp_path, cache_dir) -> None:
    """--set num_workers=1: the defaults (0 workers, the fastest here) are measured as the baseline only, so the progress
    line's best so far is not theirs, as the report's and `autotune status`'s are not."""
    from autotune.tuner.progress import SilentReporter

    def defaults_fastest(setup: TrainSetup, workload, options=None, *, on_window=None) -> TrialResult:
        rate = 1000.0 if setup.num_workers == 0 else 100.0 + setup.batch_size
        return TrialResult(status="ok", samples_per_s=rate, windows=(rate,), peak_memory_bytes=2**28, step_time_s=0.1)

    shown: list[tuple[int, float | None]] = []

    class Said(SilentReporter):
        def trial_finished(self, done: int, total: int, record, best: float | None) -> None:
            shown.append((record.setup.num_workers, best))

    search(config(tmp_path, cache_dir, trials=4, constraints=(parse_constraint("num_workers=1"),)), runner=defaults_fastest, reporter=Said())
    assert shown[0] == (0, None)  # the defaults' trial: nothing within --set measured yet
    assert [w for w, _ in shown[1:]] == [1, 1, 1] and all(best is not None and best < 1000.0 for _, best in shown[1:]), shown


def test_a_data_warning_is_said_before_the_search_and_the_search_runs(tmp_path, cache_dir, synthetic_data) -> None:
    import shutil

    from autotune.tuner.progress import SilentReporter

    class Said(SilentReporter):
        lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    data = tmp_path / "photos" / "train"
    shutil.copytree(synthetic_data / "class_00", data / "class_00")
    outcome = search(config(tmp_path, cache_dir, trials=2, data=tmp_path / "photos"), reporter=Said())
    photos = tmp_path / "photos"
    assert Said.lines[0].startswith(f"data: {photos}: ") and " in 1 class (train)" in Said.lines[0]  # what the trials will read
    assert Said.lines[1] == f"warning: the class folders of {photos} are train, which look like dataset splits: did you mean --data {data}?"
    assert outcome.best is not None


def test_the_probe_s_warnings_are_said_once_the_input_is_checked(tmp_path, cache_dir, monkeypatch) -> None:
    import dataclasses

    import probes
    from autotune.errors import UsageError
    from autotune.tuner.progress import SilentReporter

    class Said(SilentReporter):
        lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    real = probes.collect
    warning = "ulimit -v limits this process to 4.0 GiB of address space: ..."
    monkeypatch.setattr(probes, "collect", lambda: dataclasses.replace(real(), warnings=(warning,)))
    with pytest.raises(UsageError):  # bad input: its one error line, no warning before it
        search(config(tmp_path, cache_dir, trials=2, effective_batch=10_000), reporter=Said())
    assert Said.lines == []
    search(config(tmp_path, cache_dir, trials=2), reporter=Said())
    assert Said.lines[0] == f"probe: {warning}"


def test_a_thread_count_pinned_above_the_cores_is_searched_with_a_warning(tmp_path, cache_dir) -> None:
    from autotune.tuner.pins import threads_over_cores
    from autotune.tuner.progress import SilentReporter

    class Said(SilentReporter):
        lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    import probes

    over = int(probes.collect().cpu.usable_cores) + 1  # one more than the cores a trial has here
    outcome = search(config(tmp_path, cache_dir, trials=3, constraints=(parse_constraint(f"num_threads=auto,1,{over}"),)),
                     reporter=Said())
    warned = [line for line in Said.lines if line.startswith(f"--set num_threads=auto,1,{over}: {over} training threads")]
    assert len(warned) == 1 and warned[0].endswith("; searched as given")
    assert outcome.best is not None
    assert threads_over_cores(parse_constraint("num_threads=1..16"), 2).startswith("--set num_threads=1..16: up to 16 training")
    for within in ("num_threads=auto", "num_threads=2", "num_threads=..2", "num_threads=auto,1,2"):
        assert threads_over_cores(parse_constraint(within), 2) is None, within
    assert threads_over_cores(None, 2) is None


def test_a_resumed_random_search_draws_new_points(tmp_path, cache_dir) -> None:
    """Seeded as in the first run, the sampler would repeat the first run's points and waste the added budget."""
    search(config(tmp_path, cache_dir, trials=6, sampler="random", confirm_top=1))
    storage = f"sqlite:///{tmp_path / 'out' / 'study.db'}"

    def drawn() -> list[dict]:
        trials = optuna.load_study(study_name=None, storage=storage).trials
        return [t.params for t in trials if t.user_attrs.get("role") == "search" and not t.user_attrs.get("free")]

    first = drawn()
    search(config(tmp_path, cache_dir, trials=12, sampler="random", confirm_top=1))
    added = drawn()[len(first):]
    assert len(first) == 5 and len(added) == 6
    assert added[: len(first)] != first  # with the first run's seed they were the same five points


def test_resume_with_a_different_search_is_refused(tmp_path, cache_dir) -> None:

    search(config(tmp_path, cache_dir, trials=2))
    # The --out's own study: a new --study there would be refused too (an --out holds one search), so it is not offered.
    with pytest.raises(StudyMismatch, match=r"different search \(.*\); pass another --out for this one \(an --out holds one search\)$"):
        search(config(tmp_path, cache_dir, trials=3, constraints=(parse_constraint("amp=off"),)))
    shared = f"sqlite:///{tmp_path / 'shared.db'}"  # a --storage of the user's: another study name there will do
    search(config(tmp_path, cache_dir, trials=2, storage=shared, study="s", out=tmp_path / "a"))
    refusal = r"different search \(.*\); pass --study NEW_NAME \(the study lives in --storage: another --out names the same one\)$"
    with pytest.raises(StudyMismatch, match=refusal):
        search(config(tmp_path, cache_dir, trials=3, storage=shared, study="s", out=tmp_path / "b",
                      constraints=(parse_constraint("amp=off"),)))


def test_another_synthetic_image_count_is_refused_before_any_jpeg_is_written(tmp_path, cache_dir) -> None:
    """The signature check comes before the synthetic JPEGs: a refused rerun writes none (seconds to minutes for nothing)."""
    from autotune.tuner.progress import SilentReporter

    class Said(SilentReporter):
        def __init__(self) -> None:
            self.lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    cache = tmp_path / "cache"
    shutil.copytree(cache_dir / "synthetic-v1-64", cache / "synthetic-v1-64")
    search(config(tmp_path, cache, trials=2))
    said = Said()
    with pytest.raises(StudyMismatch, match=r"different search \(synthetic JPEGs: 64 there, 80 now; --synthetic-images 64 continues it "):
        search(config(tmp_path, cache, trials=2, synthetic_images=80), reporter=said)
    assert sorted(p.name for p in cache.iterdir()) == ["synthetic-v1-64"]  # no synthetic-v1-80, no half copy
    assert not any("synthetic JPEGs" in text for text in said.lines)
    # A new --out with that count writes them, and says so first.
    search(config(tmp_path, cache, trials=2, synthetic_images=80, out=tmp_path / "other"), reporter=said)
    assert (cache / "synthetic-v1-80" / ".complete").exists() and any("writing 80 synthetic JPEGs" in text for text in said.lines)


def test_a_failed_synthetic_generation_leaves_no_empty_study(tmp_path, cache_dir, monkeypatch) -> None:
    """The JPEGs are written after the study is opened: a failure there removes the study it opened (and an --out it made)."""
    from autotune.errors import SearchInterrupted, WorkloadError
    from autotune.workloads import data

    def full_disk(*args, **kwargs):
        raise WorkloadError("cannot write synthetic data under /x: No space left on device")

    monkeypatch.setattr(data, "generate_image_folder", full_disk)
    with pytest.raises(WorkloadError, match="No space left"):
        search(config(tmp_path, tmp_path / "cache", trials=2))
    assert not (tmp_path / "out").exists()
    out = tmp_path / "kept"
    out.mkdir()
    with pytest.raises(WorkloadError, match="No space left"):
        search(config(tmp_path, tmp_path / "cache", trials=2, out=out))
    assert optuna.get_all_study_names(f"sqlite:///{out / 'study.db'}") == []

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data, "generate_image_folder", interrupted)
    with pytest.raises(SearchInterrupted, match="interrupted while the search was prepared"):
        search(config(tmp_path, tmp_path / "cache", trials=2, out=out))
    assert optuna.get_all_study_names(f"sqlite:///{out / 'study.db'}") == []


def test_a_stop_while_a_rerun_is_prepared_keeps_the_studys_trials_and_says_so(tmp_path, cache_dir, monkeypatch) -> None:
    """Ctrl-C (or SIGTERM) in a rerun's first seconds, before it measures: the line does not claim nothing was measured."""
    from autotune.errors import SearchInterrupted
    from autotune.tuner import prepare

    first = search(config(tmp_path, cache_dir, trials=2))

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patched, pytest.raises(SearchInterrupted) as stopped:
        patched.setattr(prepare, "write_synthetic", interrupted)
        search(config(tmp_path, cache_dir, trials=3))
    assert str(stopped.value) == ("interrupted while the search was prepared: this run measured nothing (what earlier runs of the "
                                  "study measured is kept); rerun the same command")
    assert search(config(tmp_path, cache_dir, trials=3)).records[: len(first.records)] == first.records


def test_a_reporter_stopping_the_search_on_its_first_line_leaves_out_unlocked(tmp_path, cache_dir) -> None:
    """A reporter's Ctrl-C at the line that ends the checks: the rerun in the same process is not refused as 'in use'."""
    from autotune.errors import SearchInterrupted
    from autotune.tuner.progress import SilentReporter

    class Stops(SilentReporter):
        def message(self, text: str) -> None:
            raise KeyboardInterrupt

    with pytest.raises(SearchInterrupted):
        search(config(tmp_path, cache_dir, trials=2), reporter=Stops())
    assert search(config(tmp_path, cache_dir, trials=2)).best is not None


def test_a_run_that_failed_before_measuring_anything_does_not_hold_its_settings(tmp_path, cache_dir) -> None:
    """The error names a setting to change; the same --out with that setting changed runs (nothing was measured)."""
    from autotune.errors import UsageError, WorkloadError

    def broken(setup, workload, options=None, *, on_window=None) -> TrialResult:
        return TrialResult(status="error", error="RuntimeError: boom")

    with pytest.raises(WorkloadError):
        search(config(tmp_path, cache_dir, trials=2), runner=broken)
    assert not (tmp_path / "out").exists()  # made by that run, holding nothing: gone
    outcome = search(config(tmp_path, cache_dir, trials=2))
    assert outcome.best is not None
    # An --out that holds another search is refused before anything runs: its outputs are that search's.
    with pytest.raises(UsageError, match="holds the search of study"):
        search(config(tmp_path, cache_dir, trials=2, study="other"), runner=broken)
    assert optuna.get_all_study_names(f"sqlite:///{tmp_path / 'out' / 'study.db'}") == [outcome.study]
    # A study whose signature was kept by an empty first run takes the corrected settings.
    from autotune.tuner.study import SearchStudy

    SearchStudy.open(f"sqlite:///{tmp_path / 'out' / 'study.db'}", "kept").check_signature({"max_memory": 1024})
    assert search(config(tmp_path, cache_dir, trials=2, study="kept", max_memory=2**33)).best is not None


def test_every_trial_failing_is_one_error(tmp_path, cache_dir) -> None:
    def always_oom(setup, workload, options=None, *, on_window=None):
        if options.mode != "train":  # calibration passes; every search trial runs out of memory
            return fake_runner(setup, workload, options)
        return TrialResult(status="oom", error="no memory at all")

    with pytest.raises(SearchFailed, match="all 3 trials failed.*oom: no memory at all"):
        search(config(tmp_path, cache_dir, trials=3), runner=always_oom)


def test_pinned_knobs_are_respected(tmp_path, cache_dir) -> None:
    outcome = search(config(tmp_path, cache_dir, trials=6, constraints=(parse_constraint("amp=off"), parse_constraint("batch_size=16..32"))))
    searched = [r for r in outcome.records if r.role != "defaults"]
    assert all(r.setup.amp == "off" and 16 <= r.setup.batch_size <= 32 for r in searched)
    # Every fp32 setup with a worker fails (the fake runner's oom): the defaults, which the pin excludes, are returned and said so.
    pinned = search(config(tmp_path / "w", cache_dir, trials=3, constraints=(parse_constraint("num_workers=1"), parse_constraint("amp=off"))))
    assert pinned.best.setup.num_workers == 0 and pinned.best.speedup is None  # the defaults alone measured: nothing to pair
    assert any(n.startswith("no setup within --set num_workers=1 measured a throughput") for n in pinned.best.notes)


def test_pinned_workers_whose_every_queue_outgrows_the_data_are_refused_before_any_trial(tmp_path, cache_dir) -> None:
    """--set num_workers=99 on 256 images: every trial was infeasible (a queue of 99 x 1 x 8 samples or more), and the
    search returned the PyTorch defaults the pin excludes, as a result."""
    ran: list[TrainSetup] = []

    def recording(setup, workload, options=None, *, on_window=None):
        if options.mode == "train":
            ran.append(setup)
        return fake_runner(setup, workload, options, on_window=on_window)

    with pytest.raises(UsageError, match=re.escape("--set num_workers=99: the smallest loader queue it allows (99 workers x "
                                                   "prefetch 1 x batch 8 = 792 samples) is larger than the data's 256 samples, "
                                                   "which no setup may prefetch; allow fewer workers")):
        search(config(tmp_path, cache_dir, trials=3, synthetic_images=256, constraints=(parse_constraint("num_workers=99"),)),
               runner=recording)
    assert ran == []
    # The refusal comes after the calibration; the study it stored refused the corrected --set in the same --out.
    fixed = search(config(tmp_path, cache_dir, trials=3, synthetic_images=256, constraints=(parse_constraint("num_workers=1"),)),
                   runner=recording)
    assert fixed.best is not None and ran
    with pytest.raises(UsageError, match=re.escape("allow fewer workers, a smaller prefetch_factor or a smaller batch_size")):
        search(config(tmp_path / "b", cache_dir, trials=3, synthetic_images=256, constraints=tuple(
            map(parse_constraint, ("num_workers=20", "prefetch_factor=2", "batch_size=4..64")))), runner=recording)


def test_the_report_draws_max_memory_beside_the_budget_the_batches_were_sized_to(tmp_path, cache_dir) -> None:
    """A probe's oom trials failed against --max-memory 560 MiB while the plot drew only the 448 MiB budget (80 % of it)."""
    from autotune.output import plots
    from autotune.output.sections import batch_section
    from autotune.tuner.study import SearchStudy
    from autotune.tuner.study_facts import stored_max_memory

    outcome = search(config(tmp_path, cache_dir, trials=2, max_memory=2**33))
    stored = SearchStudy.load(f"sqlite:///{tmp_path / 'out' / 'study.db'}", None)
    assert stored_max_memory(stored) == 2**33
    page = (tmp_path / "out" / "report.html").read_text()
    assert "given, drawn too: 8.0 GiB)" in page
    figure = plots.batch_size(outcome.records, 2**32, 2**33)
    labels = [line.get_label() for line in figure.axes[1].get_lines()]
    assert "--max-memory, a peak above it is oom: 8.0 GiB" in labels and "budget the batch range was sized to, 4.0 GiB" in labels
    assert "drawn too" not in batch_section(outcome.records, outcome.calibration, None).reading


def test_effective_batch_keeps_the_math(tmp_path, cache_dir) -> None:
    outcome = search(config(tmp_path, cache_dir, trials=6, effective_batch=64))
    assert all(r.setup.effective_batch() == 64 for r in outcome.records)
    assert outcome.best.reference_batch == 64 and outcome.best.lr == pytest.approx(1e-3)


# ---------------------------------------------------------------- real runs
@pytest.mark.slow
def test_real_tiny_search_then_resume(tmp_path, cache_dir) -> None:
    cfg = config(tmp_path, cache_dir, trials=2, confirm_top=1, confirm_rounds=2, trial_seconds=0.5)
    outcome = run_search(cfg)
    best = read_best(tmp_path / "out" / "best.json")
    assert best.samples_per_s > 0 and best.defaults_samples_per_s > 0
    assert best.workload.model == "resnet18" and best.workload.image_size == 32
    assert best.hardware["cpu"]["usable_cores"] >= 1
    assert len(measured(outcome.records)) == 2
    assert outcome.calibration.compute_samples_per_s > 0
    assert [p.num_workers for p in outcome.calibration.loader][0] == 0
    # Two rounds each, but an fp32 twin no trial ran: one round below 0.8x the leader ends it (how far depends on the load);
    # one round when the defaults, fastest of the two trials, are the only setup to confirm (an fp32-only CPU may measure so).
    rounds = 2 if len(outcome.confirmed) > 1 else 1
    assert all(len(c.values) == rounds or c.candidate.twin for c in outcome.confirmed), [(c.candidate.label, c.values) for c in outcome.confirmed]
    assert outcome.ceilings is not None and outcome.ceilings.compute
    # The ceilings and two-round confirmation are covered above: the resumed run skips the one and shortens the other
    # (neither is part of the study's signature).
    resumed = run_search(config(tmp_path, cache_dir, trials=3, confirm_top=1, confirm_rounds=1, ceilings=False, trial_seconds=0.5))
    assert len(measured(resumed.records)) == 3
    assert resumed.records[: len(outcome.records)] == outcome.records


@pytest.mark.slow
def test_sigint_leaves_a_resumable_study_and_best_json(tmp_path, cache_dir) -> None:
    out = tmp_path / "out"
    out.mkdir()
    studies.seed_calibration(f"sqlite:///{out / 'study.db'}", "resnet18-32px-cpu")  # Ctrl-C in calibration: the next test
    env = {**os.environ, "PYTHONPATH": str(TESTS.parent)}
    cmd = [sys.executable, "-m", "autotune", "search", "--model", "resnet18", "--image-size", "32", "--trials", "30",
           "--trial-seconds", "1", "--device", "cpu", "--out", str(out), "--cache-dir", str(cache_dir), "--synthetic-images", "64",
           "--json"]
    # A shell that starts the tests in the background (nohup, &) hands them SIGINT ignored, and the
    # search would rightly keep ignoring it: give the child the default disposition.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    rows = 0
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
        if (out / "trials.csv").exists():
            rows = len(list(csv.DictReader((out / "trials.csv").open())))
            if rows >= 2:
                break
    assert rows >= 2, proc.stderr.read().decode() if proc.poll() is not None else "no trials in time"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr.decode()
    assert "rerun the same command to resume" in stderr.decode()
    assert "Traceback" not in stderr.decode()
    best = json.loads((out / "best.json").read_text())
    assert best["setup"]["batch_size"] >= 1
    assert any("not confirmed: the search was interrupted" in n for n in best["notes"])
    summary = json.loads(stdout)  # --json still emits the best so far, marked interrupted
    assert summary["interrupted"] is True
    assert summary["best"]["setup"] == best["setup"]
    assert "interrupted" in (out / "report.html").read_text()  # the report of the trials so far
    study = optuna.load_study(study_name=None, storage=f"sqlite:///{out / 'study.db'}")
    states = [t.state for t in study.trials]
    assert optuna.trial.TrialState.RUNNING not in states
    assert sum(s == optuna.trial.TrialState.COMPLETE for s in states) >= 2


def test_ctrl_c_during_calibration_keeps_its_runs_and_the_rerun_goes_on_from_there(tmp_path, cache_dir) -> None:
    """Interrupted at the third calibration run: the two measured are stored in the study as they return, and the
    rerun of the same command gets them back without running them again (nothing measured is lost); it then runs
    the rest of the calibration and the search."""
    from autotune.errors import SearchInterrupted
    from autotune.tuner.study import SearchStudy

    runs: list[tuple[int, str]] = []

    def interrupted_in_calibration(setup, workload, options=None, *, on_window=None):
        runs.append((setup.batch_size, options.mode))
        if len(runs) == 3:
            raise KeyboardInterrupt
        return fake_runner(setup, workload, options, on_window=on_window)

    with pytest.raises(SearchInterrupted, match=r"interrupted during calibration, before the first trial \(runs measured and kept: 2\); "
                                                r"rerun the same command to go on"):
        search(config(tmp_path, cache_dir, trials=3), runner=interrupted_in_calibration)
    study = SearchStudy.open(f"sqlite:///{tmp_path / 'out' / 'study.db'}", "resnet18-32px-cpu")
    assert study.calibration() is None and study.is_empty()
    assert sum(len(r) for r in study.calibration_runs().values()) == 2
    assert not (tmp_path / "out" / "best.json").exists()
    first, again = runs[:2], []

    def counting(setup, workload, options=None, *, on_window=None):
        again.append((setup.batch_size, options.mode))
        return fake_runner(setup, workload, options, on_window=on_window)

    from autotune.tuner.progress import SilentReporter

    class Said(SilentReporter):
        lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    outcome = search(config(tmp_path, cache_dir, trials=3), runner=counting, reporter=Said())
    assert outcome.calibration.compute_samples_per_s and len(measured(outcome.records)) == 3
    assert again[0] == runs[2] and again.count(first[0]) == 0  # the third run first: the two before it are reused
    assert "calibration: memory pre-pass, compute-only and loader-only ceilings (runs measured before an interruption and kept: 2)" in Said.lines
    assert any(re.fullmatch(r"calibration: reused 2 of the 2 runs kept from before the interruption, measured [1-9]\d* now", line)
               for line in Said.lines)
    assert study.calibration_runs() == {}  # the whole calibration is stored now


def test_a_calibration_that_fails_keeps_its_runs_and_another_search_in_the_study_does_not_reuse_them(tmp_path, cache_dir) -> None:
    """A calibration that stops on an error (data gone, a model that fails at some batch) keeps the runs it measured,
    and its --out, for the rerun of the same command. A changed command on that --out takes the study over (nothing
    finished in it), but the kept runs measured the other search: they are dropped, never reused."""
    from autotune.errors import AutotuneError
    from autotune.tuner.study import SearchStudy

    runs: list[tuple[int, str]] = []

    def fails_third(setup, workload, options=None, *, on_window=None):
        runs.append((setup.batch_size, options.mode))
        if len(runs) == 3:
            return TrialResult(status="bad_data", error="/data/a/1.jpg: a failure of the third run")
        return fake_runner(setup, workload, options, on_window=on_window)

    with pytest.raises(AutotuneError, match="a failure of the third run"):
        search(config(tmp_path, cache_dir, trials=3), runner=fails_third)
    study = SearchStudy.open(f"sqlite:///{tmp_path / 'out' / 'study.db'}", "resnet18-32px-cpu")
    assert study.calibration() is None and study.is_empty()
    assert sum(len(r) for r in study.calibration_runs().values()) == 2  # kept, with the --out that holds them
    from autotune.tuner.status import study_status

    said = study_status(f"sqlite:///{tmp_path / 'out' / 'study.db'}").lines()
    assert said[1] == ("  calibration not finished, and no search runs it now: 2 of its runs measured and kept; rerun the "
                       "search's command to go on from them"), said
    from autotune.tuner.lock import Holder
    from autotune.tuner.study import STUDY_HOLDER

    me = Holder.me()  # a search measuring it now: not the same words as one stopped (a probe read them alike)
    study.study.set_user_attr(STUDY_HOLDER, me.to_dict())
    said = study_status(f"sqlite:///{tmp_path / 'out' / 'study.db'}").lines()
    assert said[1] == f"  calibrating now ({me.describe()}): 2 of its runs measured so far; the trials follow it", said
    study.study.set_user_attr(STUDY_HOLDER, None)
    assert ": 0/3 trials finished, 0 running" in said[0], said  # the budget is known before the first trial
    again: list[tuple[int, str]] = []

    def counting(setup, workload, options=None, *, on_window=None):
        again.append((setup.batch_size, options.mode))
        return fake_runner(setup, workload, options, on_window=on_window)

    outcome = search(config(tmp_path, cache_dir, trials=3, synthetic_images=96), runner=counting)  # another search
    assert outcome.calibration.compute_samples_per_s is not None
    assert again[:2] == runs[:2]  # measured again for this search's data, not taken from the other's runs
    study.study.set_user_attr(STUDY_HOLDER, me.to_dict())  # a search holding a calibrated study measures trials
    assert study_status(f"sqlite:///{tmp_path / 'out' / 'study.db'}").calibrating is None  # `status --json` said calibrating to the end


def test_a_calibration_that_fits_no_batch_leaves_the_out_free_for_the_smaller_image_size_it_advises(tmp_path, cache_dir) -> None:
    """Out of memory at every batch (runs a rerun would reuse) ends in advice to change the command: the study, which
    holds no calibration and no trial, is not kept, so the advised --image-size (another study name) runs on that --out."""
    from autotune.errors import WorkloadError

    def fits_at_32_only(setup, workload, options=None, *, on_window=None):
        if workload.image_size > 32 and options.mode != "loader":
            return TrialResult(status="oom", error="out of memory", peak_memory_bytes=2**30)
        return fake_runner(setup, workload, options, on_window=on_window)

    with pytest.raises(WorkloadError, match=r"^not even batch 1 .* a smaller --image-size"):
        search(config(tmp_path, cache_dir, trials=2, image_size=64), runner=fits_at_32_only)
    assert not (tmp_path / "out").exists()
    assert search(config(tmp_path, cache_dir, trials=2, image_size=32), runner=fits_at_32_only).best is not None


def test_a_calibration_run_is_reused_only_when_it_measured_and_under_about_the_same_memory_budget() -> None:
    """An error is not kept (the code may be fixed by the rerun); a throughput and an out-of-memory are, and come back
    in the order they ran while the budget moved by at most a tenth (the available RAM it derives from drifts); under
    another budget (another --max-memory) the run runs again and replaces the kept one."""
    from autotune.records import TrialOptions, Workload
    from autotune.tuner.kept_runs import KeptRuns

    stored: dict = {}
    saved: dict = {}
    results = iter([TrialResult(status="error", error="boom"), TrialResult(status="oom", error="over"),
                    TrialResult(status="ok", samples_per_s=5.0)])
    kept = KeptRuns(lambda *a, **k: next(results), stored, saved.update)
    workload, options = Workload(model="resnet18", image_size=32, device="cpu"), TrialOptions(max_memory_bytes=1000, mode="compute")
    assert [kept(TrainSetup(batch_size=b), workload, options).status for b in (8, 16, 32)] == ["error", "oom", "ok"]
    assert sorted(runs[0].result.status for runs in saved.values()) == ["ok", "oom"] and kept.measured == 2
    fresh = TrialResult(status="ok", samples_per_s=9.0)
    replay = KeptRuns(lambda *a, **k: fresh, dict(saved), saved.update)
    drifted = TrialOptions(max_memory_bytes=950, mode="compute")
    assert [replay(TrainSetup(batch_size=b), workload, drifted).samples_per_s for b in (8, 16, 32)] == [9.0, None, 5.0]
    assert replay.reused == 2 and replay.ran == 1
    assert replay.summary() == ("calibration: reused 2 of the 2 runs kept from before the interruption, measured 1 now")
    other = KeptRuns(lambda *a, **k: fresh, dict(saved), saved.update)
    assert other(TrainSetup(batch_size=16), workload, TrialOptions(max_memory_bytes=2000, mode="compute")) is fresh
    assert other.summary() == ("calibration: none of the 3 runs kept from before the interruption could be reused (the memory "
                               "budget moved too far for them to stand, or they were not asked for this time), measured 1 now")
    assert other.reused == 0 and [run.budget for run in saved[next(k for k in saved if '"batch_size": 16' in k)]] == [2000]


def test_a_kept_calibration_run_far_below_either_memory_budget_is_reused_when_the_budget_moved_further() -> None:
    """The budget derives from the available RAM, which another process moves by more than a tenth in a minute: a run
    that held far below the new budget would measure the same, and one over its budget would be over a smaller one too
    (before, both ran again, and an interrupted calibration on a busy machine resumed nothing)."""
    from autotune.tuner.kept_runs import KeptRun

    held = KeptRun(TrialResult(status="ok", samples_per_s=5.0, peak_memory_bytes=400), 10_000)
    assert held.fits(10_500) and held.fits(5_000) and held.fits(40_000) and held.fits(445)  # 400 <= 0.9 x 445
    assert not held.fits(420) and not held.fits(None)  # near or over the new budget; no budget at all now
    unknown = KeptRun(TrialResult(status="ok", samples_per_s=5.0), 10_000)  # no peak recorded: only the drift holds
    assert unknown.fits(9_500) and not unknown.fits(5_000)
    over = KeptRun(TrialResult(status="oom", error="over", peak_memory_bytes=12_000), 10_000)
    assert over.fits(10_900) and over.fits(3_000)  # within the drift, or a smaller budget: over it again
    assert not over.fits(12_000) and not over.fits(40_000)  # a larger budget may hold it: measured again


def test_rich_progress_shows_roles_and_bracketed_text(tmp_path, cache_dir) -> None:
    """Roles print as [defaults]/[guess], not swallowed as Rich markup; so does any bracketed message."""
    import io

    from rich.console import Console

    from autotune.render import RichReporter

    buffer = io.StringIO()
    console = Console(file=buffer, width=80, color_system=None)  # a log file or pipe: Rich's 80 columns
    with RichReporter(console) as reporter:
        search(config(tmp_path, cache_dir, trials=3), reporter=reporter)
        reporter.message("model factories:net [from the cwd]")
    text = buffer.getvalue()
    assert "#0 [defaults] bs=32 w=0 fp32" in text
    assert "#1 [guess]" in text
    assert "[from the cwd]" in text
    # Every trial and confirmation measurement is one line, whatever its length (grep-able in a log).
    trials = [line for line in text.splitlines() if line.startswith(("  1/3 #", "  2/3 #", "  3/3 #"))]
    assert len(trials) == 3 and all(line.rstrip().split("best ")[-1][0].isdigit() for line in trials), trials
    confirms = [line for line in text.splitlines() if line.startswith("  confirm ")]
    assert confirms and all(re.search(r": (\d+\.\d samples/s|[a-z_]+: .+)$", line.rstrip()) for line in confirms), confirms
    assert not any(line.lstrip().startswith(("samples/s", "GiB")) for line in text.splitlines())  # nothing folded onto a line of its own


def test_progress_in_jupyter_without_ipywidgets_prints_the_lines_and_no_widget_warning(tmp_path, cache_dir, monkeypatch) -> None:
    """progress=True in a notebook: Rich draws a live bar there through ipywidgets only, and without it printed its
    "install ipywidgets" warning at every bar, 5 times a search. The trial lines come, the bar is left out."""
    import importlib.util
    import io

    import rich.jupyter
    from rich.console import Console

    from autotune.render import RichReporter

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ipywidgets" else find_spec(name, *a))
    shown: list[str] = []  # what the notebook's cell shows (IPython's display, which this test process lacks)
    monkeypatch.setattr(rich.jupyter, "display", lambda segments, text: shown.append(text))
    with RichReporter(Console(file=io.StringIO(), force_jupyter=True, color_system=None)) as reporter:
        search(config(tmp_path, cache_dir, trials=3), reporter=reporter)
        assert not reporter.progress.live.is_started
    text = "".join(shown)
    assert "#1 [guess]" in text and "confirm 1/" in text and "ipywidgets" not in text
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "ipywidgets" else find_spec(name, *a))
    assert RichReporter(Console(file=io.StringIO(), force_jupyter=True))._bar_shown  # with it, the widget bar


def test_the_summary_in_a_narrow_log_keeps_paths_and_setups_whole(tmp_path, cache_dir) -> None:
    """Piped to a file, Rich renders 80 columns: a path to copy stays on one line, a setup folds, nothing is cut off."""
    import io

    from rich.console import Console

    from autotune.render import render_search

    out = tmp_path / ("a-rather-long-directory-name-for-the-output-of-this-search" * 2)
    outcome = search(config(tmp_path, cache_dir, trials=3, out=out))
    buffer = io.StringIO()
    Console(file=buffer, width=80, color_system=None).print(render_search(outcome), crop=False)
    lines = buffer.getvalue().splitlines()
    for name in ("best.json", "train.py"):
        assert f"wrote {out / name}" in lines
    assert any(line.startswith(f"report: {(out / 'report.html').resolve()} ") for line in lines)
    assert "…" not in buffer.getvalue()  # no setup or column cut short
    words = " ".join(lines).split()
    assert all(word in words for word in outcome.best.setup.describe().split())
    # The winner's line and its notes stay whole: `grep winner:` gives the setup and its speed.
    winner = next(line for line in lines if line.startswith("winner: "))
    assert winner.startswith(f"winner: {outcome.best.setup.describe()}: ") and "x the PyTorch defaults (" in winner
    assert re.search(r"median of \d+ paired rounds, (all [\d.]+x|[\d.]+x to [\d.]+x)\)$", winner.rstrip()), winner
    verdict = next(line for line in lines if line.startswith("bottleneck: "))  # whole too (it was wrapped mid-sentence)
    assert verdict.rstrip() == f"bottleneck: {outcome.verdict}" and len(verdict) > 80, verdict


def test_a_report_a_full_disk_refused_is_said_again_where_the_search_ends(tmp_path, cache_dir, monkeypatch) -> None:
    """On a nearly full file system the search wrote best.json and train.py, and its one line on report.html came in
    the middle of its output, with an internal class name and without what writes it later."""
    import io

    from rich.console import Console

    import autotune.tuner.study_report
    from autotune.errors import EmitError
    from autotune.render import render_search

    def full(out, page, images):
        raise EmitError(f"cannot write {out / 'report.html'}: No space left on device")

    monkeypatch.setattr(autotune.tuner.study_report, "write_rendered", full)
    from autotune.tuner.progress import SilentReporter

    said: list[str] = []

    class Said(SilentReporter):
        def message(self, text: str) -> None:
            said.append(text)

    out = tmp_path / "out"
    outcome = search(config(tmp_path, cache_dir, trials=3, out=out), reporter=Said())
    assert f"report.html not written: cannot write {out / 'report.html'}: No space left on device (`autotune report {out}` " \
        "writes it from the study)" in said, said
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(render_search(outcome), crop=False)
    last = buffer.getvalue().splitlines()[-1]
    assert last == f"report: not written (the line above says why); autotune report {out} writes it from the study", last
    assert (out / "best.json").is_file() and not (out / "report.html").exists()
    # A study kept elsewhere (a journal file, a database server): `autotune report OUT` alone finds none there.
    journal, out = tmp_path / "shared.log", tmp_path / "out two"
    outcome = search(config(tmp_path, cache_dir, trials=3, out=out, storage=str(journal)), reporter=Said())
    buffer = io.StringIO()
    Console(file=buffer, width=300, color_system=None).print(render_search(outcome), crop=False)
    command = f"autotune report '{out}' --storage {journal} --study {outcome.best.study}"
    assert buffer.getvalue().splitlines()[-1].endswith(f"; {command} writes it from the study"), buffer.getvalue()
    assert said[-1].endswith(f"(`{command}` writes it from the study)"), said[-1]


INTERRUPTED_MODULE = """import os, signal, time
os.kill(os.getpid(), signal.SIGINT)  # a notebook's interrupt half-way through the import
time.sleep(0.05)
WHOLE = True
"""


def test_a_ctrl_c_inside_the_api_s_lazy_imports_waits_for_them_to_finish(tmp_path, monkeypatch) -> None:
    """A notebook's interrupt in the first seconds of a session's first search() landed inside torch._dynamo's (sympy's)
    import: every later call in the kernel failed on the half-made module (`module 'sympy' has no attribute 'logic'`,
    said as the Task's optimizer factory failing) until a restart. The imports finish, then the stop is raised; the
    public names imported on first use (autotune.search) too."""
    import autotune
    from autotune.tuner.signals import imported_whole

    monkeypatch.syspath_prepend(str(tmp_path))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a notebook's kernel
    try:
        for name in ("whole_first", "whole_second"):
            (tmp_path / f"{name}.py").write_text(INTERRUPTED_MODULE)
            monkeypatch.delitem(sys.modules, name, raising=False)
        with pytest.raises(KeyboardInterrupt):
            imported_whole(("whole_first",))
        assert sys.modules["whole_first"].WHOLE  # whole, so the next call and the user's own code find it so
        monkeypatch.setitem(autotune._LAZY, "WHOLE", "whole_second")
        monkeypatch.delitem(vars(autotune), "WHOLE", raising=False)
        with pytest.raises(KeyboardInterrupt):
            autotune.WHOLE  # noqa: B018
        assert sys.modules["whole_second"].WHOLE and autotune.WHOLE is True
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_interrupts_are_held_until_the_storage_write_is_done() -> None:
    from autotune.tuner.signals import interrupts_held as _interrupts_held

    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a foreground process
    finished = False
    with pytest.raises(KeyboardInterrupt):
        with _interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            finished = True  # the block runs to its end despite the Ctrl-C
    assert finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # ignored, as under nohup: it stays ignored
    with _interrupts_held():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    signal.signal(signal.SIGINT, before)


def test_a_held_interrupt_does_not_replace_the_error_of_its_block() -> None:
    """A Ctrl-C held while a write fails (a full disk, a lost database): the write's own error reaches the user,
    not a KeyboardInterrupt over it, and the stop stays remembered for the next check."""
    from autotune.tuner.signals import clear_stop, interrupts_held, stop_requested

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    caught: BaseException | None = None
    try:
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            raise OSError(28, "No space left on device")
    except BaseException as exc:  # a KeyboardInterrupt must fail this test, not stop the session
        caught = exc
    finally:
        stopped = stop_requested()
        clear_stop()
        signal.signal(signal.SIGINT, before)
    assert isinstance(caught, OSError) and "No space left" in str(caught), repr(caught)
    assert stopped


def test_failed_confirmation_is_not_called_an_interruption(tmp_path, cache_dir) -> None:
    from autotune.tuner.progress import SilentReporter

    class Phases(SilentReporter):
        confirming = False

        def message(self, text: str) -> None:
            self.confirming = self.confirming or text.startswith("confirmation:")

    phases = Phases()

    def confirmation_fails(setup, workload, options=None, *, on_window=None):
        if phases.confirming:
            return TrialResult(status="timeout", error="no result")
        return fake_runner(setup, workload, options, on_window=on_window)

    outcome = search(config(tmp_path, cache_dir, trials=3, ceilings=False), runner=confirmation_fails, reporter=phases)
    assert phases.confirming and not outcome.interrupted
    assert any("every confirmation run failed" in n for n in outcome.best.notes)
    assert not any("interrupted" in n for n in outcome.best.notes)


def test_the_verdict_compares_the_winner_with_its_own_ceilings(tmp_path, cache_dir) -> None:
    modes: list[str] = []

    def recording(setup, workload, options=None, *, on_window=None):
        modes.append(options.mode)
        return fake_runner(setup, workload, options, on_window=on_window)

    outcome = search(config(tmp_path, cache_dir, trials=5), runner=recording)
    # After the confirmation, at the winner's setup: computing and loading alone, two runs (training is its confirmed median).
    assert modes[-2:] == ["compute", "loader"]
    with_ceilings = list(modes)
    modes.clear()
    search(config(tmp_path / "without", cache_dir, trials=5, ceilings=False), runner=recording)
    assert len(with_ceilings) == len(modes) + 2
    assert outcome.ceilings is not None and outcome.ceilings.together == outcome.best.samples_per_s
    assert outcome.ceilings.data_wait_fraction == 0.1  # the wait of the winner's own confirmation runs
    assert outcome.ceilings.compute == pytest.approx(2 * outcome.ceilings.together)
    assert "at the winner's setup: compute alone" in outcome.verdict and "its confirmed median" in outcome.verdict
    assert json.loads(json.dumps(outcome.to_dict()))["ceilings"]["loader"] > 0


def test_nothing_faster_than_the_defaults_keeps_the_defaults(tmp_path, cache_dir) -> None:
    rounds = iter(range(10_000))

    def flat(setup, workload, options=None, *, on_window=None):
        # Every setup runs 100 +- 5 samples/s: nothing beats the defaults beyond the noise.
        return TrialResult(status="ok", samples_per_s=100.0 + (5.0 if next(rounds) % 2 else -5.0), windows=(100.0,))

    outcome = search(config(tmp_path, cache_dir, trials=4), runner=flat)
    assert outcome.best.setup == TrainSetup(batch_size=32) and outcome.best.speedup == pytest.approx(1.0)
    assert any("nothing measurably faster" in n for n in outcome.best.notes)
    # Its lines state no speedup of the defaults over themselves ("1.00x the PyTorch defaults (...; median of the
    # paired rounds)"), as for defaults measured alone.
    from rich.console import Console

    from autotune.output.best import DEFAULTS_KEPT
    from autotune.render import render_search
    from autotune.tuner.status import study_status

    console = Console(width=400, record=True)
    console.print(render_search(outcome), crop=False)
    line = next(x for x in console.export_text().splitlines() if x.startswith("winner: "))
    assert outcome.best.defaults_won and line.endswith(f" samples/s, {DEFAULTS_KEPT}") and "1.00x" not in line, line
    page = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert DEFAULTS_KEPT in page and "1.00x</b>" not in page
    status = study_status(f"sqlite:///{tmp_path / 'out' / 'study.db'}", None, out=tmp_path / "out").lines()
    assert any(x.startswith("winner: ") and x.endswith(DEFAULTS_KEPT) for x in status), status
    header = (tmp_path / "out" / "train.py").read_text(encoding="utf-8")
    assert f"# Measured: 100.0 samples/s (spread 10.0): {DEFAULTS_KEPT}\n" in header and "speedup 1.00x" not in header


def test_the_ceilings_can_be_skipped(tmp_path, cache_dir) -> None:
    modes: list[str] = []

    def recording(setup, workload, options=None, *, on_window=None):
        modes.append(options.mode)
        return fake_runner(setup, workload, options, on_window=on_window)

    outcome = search(config(tmp_path, cache_dir, trials=3, ceilings=False), runner=recording)
    assert outcome.ceilings is None and "its confirmed median" not in outcome.verdict
    assert modes[-1] == "train"  # the confirmation was the last thing measured


def test_repeats_do_not_use_up_the_budget_and_a_converged_sampler_still_ends(tmp_path, cache_dir) -> None:
    """A sampler that proposes a measured setup gets its measurement back for free; --trials counts measurements."""
    # Four setups (contiguous or channels_last, batch 16 or 32) and the defaults, and a budget of 8: the space runs out.
    pins = ("num_workers=0", "accumulation_steps=1", "amp=off", "num_threads=1", "optimizer_impl=foreach",
            "channels_last=false,true", "batch_size=16,32")
    import io

    from rich.console import Console

    from autotune.render import RichReporter

    buffer = io.StringIO()
    with RichReporter(Console(file=buffer, width=200, color_system=None)) as reporter:
        outcome = search(config(tmp_path, cache_dir, trials=8, constraints=tuple(map(parse_constraint, pins))), reporter=reporter)
    ran = measured(outcome.records)
    assert len(ran) == len({r.setup for r in ran}) == len({r.setup for r in outcome.records}) == 5  # each once
    free = [r for r in outcome.records if r.free]
    assert free and all(r.reused_from in {m.number for m in ran} for r in free)
    assert all(r.result == next(m for m in ran if m.number == r.reused_from).result for r in free)
    assert len(outcome.records) == 2 * 8  # 5 measured and 11 free: past 8 free trials, free ones count
    rows = list(csv.DictReader((tmp_path / "out" / "trials.csv").open()))
    assert len(rows) == 16 and sum(bool(r["reused_from"]) for r in rows) == 11
    assert f"(same setup as #{free[0].reused_from}: not run again, not counted)" in buffer.getvalue()
    # Its rerun said "the study holds 8 finished trials ... pass --trials 9 or more to search further", beside "5 finished
    # trials kept", and a rerun with more --trials, which adds repeats only, measured the confirmation again.
    from autotune.tuner.finalists import REUSED
    from autotune.tuner.status import study_status

    for trials in (8, 10):
        buffer = io.StringIO()
        with RichReporter(Console(file=buffer, width=400, color_system=None)) as reporter:
            again = search(config(tmp_path, cache_dir, trials=trials, constraints=tuple(map(parse_constraint, pins))), reporter=reporter)
        said = buffer.getvalue()
        assert "calibration reused, 5 finished trials kept" in said and "search further" not in said, said
        assert trials != 8 or ("the study holds 5 measured trials, and its sampler proposed setups measured before 11 times, more "
                               "than --trials 8: it has converged, none runs") in said, said
        assert len(measured(again.records)) == 5 and REUSED in said, said  # nothing measured: the confirmation's rounds stand
    status = study_status(f"sqlite:///{tmp_path / 'out' / 'study.db'}", None, out=tmp_path / "out").lines()
    assert "(5 measured; the sampler proposed setups measured before more times than --trials: it converged)" in status[0], status
    # A rerun with fewer --trials stored a budget counting the repeats past it: status read "5/12 trials finished", as if
    # seven were still to run. The budget it converged under stays.
    search(config(tmp_path, cache_dir, trials=4, constraints=tuple(map(parse_constraint, pins))))
    again = study_status(f"sqlite:///{tmp_path / 'out' / 'study.db'}", None, out=tmp_path / "out").lines()
    counts = [re.search(r": (\d+)/(\d+) trials finished \(5 measured; ", line) for line in (status[0], again[0])]
    assert all(counts) and counts[0].groups() == counts[1].groups() and len(set(counts[1].groups())) == 1, again


def test_the_report_s_best_so_far_passes_over_defaults_the_set_excludes(tmp_path, cache_dir, monkeypatch) -> None:
    """With --set num_workers=1 the defaults (no workers) are the baseline only: when they run fastest, the history's
    best-so-far line and table start at the first trial within the --set, as best.json and `autotune status` do."""
    pretend_bf16_cpu(monkeypatch)  # the fake runner's fp32 with workers never fits: within the --set only bf16 runs

    def defaults_fastest(setup, workload, options=None, *, on_window=None):
        if options.mode == "train" and setup.num_workers == 0 and setup.batch_size == 32:
            return TrialResult(status="ok", samples_per_s=5000.0, windows=(5000.0,), data_wait_fraction=0.1)
        return fake_runner(setup, workload, options, on_window=on_window)

    outcome = search(config(tmp_path, cache_dir, trials=3, constraints=(parse_constraint("num_workers=1"),)), runner=defaults_fastest)
    assert outcome.best.setup.num_workers == 1
    html = (tmp_path / "out" / "report.html").read_text()
    table = html[html.index("<caption>trials</caption>"):]
    rows = [re.findall(r"<td>(.*?)</td>", row) for row in re.findall(r"<tr>(.*?)</tr>", table[: table.index("</table>")])]
    rows = [r for r in rows if r]
    assert rows[0][1] == "defaults" and rows[0][4] == "5000.0" and rows[0][5] == "-"
    allowed = max(float(r[4]) for r in rows[1:] if r[3] == "ok")
    assert rows[-1][5] == f"{allowed:.1f}" and allowed < 5000.0


def test_a_search_leaves_optuna_s_log_level_and_the_warnings_filters_as_it_found_them(tmp_path, cache_dir) -> None:
    """The search quiets optuna's per-trial INFO lines and its experimental-feature warnings for itself: they stayed
    quiet in the caller's process after it returned (a notebook's own optuna studies printed nothing)."""
    import warnings

    import optuna

    optuna.logging.set_verbosity(optuna.logging.DEBUG)
    filters = list(warnings.filters)
    try:
        outcome = search(config(tmp_path, cache_dir, trials=2))
        assert outcome.best is not None
        assert optuna.logging.get_verbosity() == optuna.logging.DEBUG and warnings.filters == filters
    finally:
        optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_a_loader_queue_dev_shm_could_not_hold_is_not_run_again_at_its_size_or_larger(tmp_path, cache_dir, monkeypatch) -> None:
    """In a container's default 64 MiB /dev/shm, every setup whose workers hold more batches in flight than it fits fails
    alike: a search spent trial after trial on them (both guesses, in a probe). A queue no smaller than one that failed is
    not run again (free, as a setup the data cannot feed), and smaller ones still run; a rerun in a larger /dev/shm
    runs them."""
    import autotune.tuner.explore as explore
    from autotune.runner.failures import SHM_TOO_SMALL
    from autotune.tuner.explore import in_flight
    from probes.memory import ShmInfo

    monkeypatch.setattr(explore, "collect_shm", lambda: ShmInfo("/dev/shm", 64 * 2**20, 0))

    ran: list[TrainSetup] = []

    def small_shm(setup, workload, options=None, *, on_window=None) -> TrialResult:
        if options.mode == "train" and setup.num_workers and in_flight(setup) >= 64:
            ran.append(setup)
            return TrialResult(status="error", error=f"failed in a DataLoader worker ...; /dev/shm (64 MiB, 0 B free) {SHM_TOO_SMALL} "
                                                     "(workers x prefetch x batch): fewer workers ...")
        return fake_runner(setup, workload, options, on_window=on_window)

    outcome = search(config(tmp_path, cache_dir, trials=12, seed=3), runner=small_shm)
    queues = [in_flight(s) for s in ran]
    assert queues and all(q < min(queues[:i]) for i, q in enumerate(queues) if i), queues  # each below every queue that failed before
    skipped = [r for r in outcome.records if r.free and "that /dev/shm could not hold in trial #" in (r.result.error or "")]
    assert skipped and all(in_flight(r.setup) >= min(queues) for r in skipped), skipped
    records = list(outcome.records)
    assert explore.beyond_the_shm(skipped[0].setup, lambda: records) is not None
    monkeypatch.setattr(explore, "collect_shm", lambda: ShmInfo("/dev/shm", 8 * 2**30, 8 * 2**30))  # --shm-size=8g, rerun
    assert explore.beyond_the_shm(skipped[0].setup, lambda: records) is None


def test_a_rerun_that_adds_no_trial_keeps_the_confirmation_and_every_run_s_rounds(tmp_path, cache_dir, monkeypatch) -> None:
    """The same command rerun on a finished study (to resume, or to check that it is done) measured the confirmation
    again: on a machine loaded differently its rounds replaced a confirmed 3.40x winner by the defaults, rewrote
    best.json and train.py, and the first run's rounds were gone from the study. A rerun that adds no trial now takes
    the last finished confirmation of the same finalists; one asking for more rounds measures again; and each run's
    rounds stay in the study under its own key."""
    from autotune.tuner.finalists import REUSED
    from autotune.tuner.progress import SilentReporter

    class Said(SilentReporter):
        lines: list[str] = []

        def message(self, text: str) -> None:
            self.lines.append(text)

    import autotune.tuner.run
    from autotune.tuner.study import SearchStudy

    confirming: list[str] = []
    in_confirmation: list[bool] = []
    confirm = autotune.tuner.run.confirm

    def confirming_now(*args, **kwargs):  # type: ignore[no-untyped-def]
        in_confirmation.append(True)
        try:
            return confirm(*args, **kwargs)
        finally:
            in_confirmation.clear()

    monkeypatch.setattr(autotune.tuner.run, "confirm", confirming_now)

    def counting(setup: TrainSetup, workload, options=None, *, on_window=None) -> TrialResult:
        result = fake_runner(setup, workload, options, on_window=on_window)
        if in_confirmation:  # a confirmation round, not a trial
            confirming.append(setup.to_json())
            return dataclasses.replace(result, peak_memory_bytes=3 * 2**30)  # above the trials' own peaks
        return result

    first = search(config(tmp_path, cache_dir, trials=4), runner=counting)
    best = (tmp_path / "out" / "best.json").read_text()
    assert confirming and first.best is not None and json.loads(best)["peak_memory_bytes"] == 3 * 2**30
    confirming.clear()
    (tmp_path / "out" / "best.json").unlink()  # written again from the study
    again = search(config(tmp_path, cache_dir, trials=4), runner=counting, reporter=Said())
    assert confirming == [] and REUSED in Said.lines
    assert again.best is not None and again.best.setup == first.best.setup and again.best.speedup == first.best.speedup
    rewritten = json.loads((tmp_path / "out" / "best.json").read_text())
    # The peak its rounds measured too (a rerun wrote the trial's lower one: the rounds were kept without their peaks).
    assert (rewritten["setup"], rewritten["speedup"], rewritten["peak_memory_bytes"]) == (
        json.loads(best)["setup"], json.loads(best)["speedup"], 3 * 2**30)
    search(config(tmp_path, cache_dir, trials=4, confirm_rounds=3), runner=counting)  # more rounds asked: measured again
    assert confirming
    storage = f"sqlite:///{tmp_path / 'out' / 'study.db'}"
    kept = [k for k in optuna.load_study(study_name=None, storage=storage).user_attrs if k.startswith("confirmation:")]
    assert len(kept) == 2  # the first run's rounds and the third's, each under its run (the second measured none)
    # Other finalists (--confirm-top 1) are measured; going back to the earlier ones takes their confirmation (it measured
    # them again: only the last confirmation was kept), and so does going forth again.
    for top, measured in ((1, True), (2, False), (1, False)):
        confirming.clear()
        outcome = search(config(tmp_path, cache_dir, trials=4, confirm_rounds=3, confirm_top=top), runner=counting)
        assert bool(confirming) == measured, (top, confirming)
        # The rounds taken are the winner's again: `autotune report` showed the last confirmation's, another winner's.
        assert set(SearchStudy.load(storage).winner_rounds()) == {c.candidate.key for c in outcome.confirmed}


def test_a_search_in_a_python_session_leaves_no_study_db_open(tmp_path, cache_dir) -> None:
    """After autotune.search() returned, 2 to 8 files of its study.db stayed open in a notebook's kernel until garbage
    collection ran: the storage's pooled connections are closed once the study is released."""
    import gc

    import psutil

    gc.collect()
    gc.disable()  # the connections must be closed by the search, not found by a collection that happens to run
    try:
        outcome = search(config(tmp_path, cache_dir, trials=3))
        opened = [f.path for f in psutil.Process().open_files() if "study.db" in f.path]
    finally:
        gc.enable()
    assert outcome.best is not None and opened == [], opened


@pytest.mark.parametrize("kills", [1, 3])
def test_a_guess_killed_from_outside_runs_once_more_with_its_role(tmp_path, cache_dir, kills: int) -> None:
    """A guess whose trial process someone killed (SIGKILL, the kernel's OOM kill counters unchanged: a user, a
    supervisor) was stored as its setup's error, and every later proposal of that setup reused the error, a resume's
    too, though the guess was the fastest setup of the study. It is queued once more with its role and measured; killed
    again, the second kill stands for it (a user-space OOM daemon's limit) and nothing runs it a third time."""
    from autotune.runner.failures import KILLED_FROM_OUTSIDE

    runs: list[TrainSetup] = []
    target: list[TrainSetup] = []

    def kill_the_first_guess(setup, workload, options=None, *, on_window=None) -> TrialResult:
        if options.mode == "train":
            runs.append(setup)
            if len(runs) == 2:  # the defaults run first, then the first guess
                target.append(setup)
            if target and setup == target[0] and runs.count(setup) <= kills:
                return TrialResult(status="error", error=f"the trial process {KILLED_FROM_OUTSIDE}; not by the kernel's ...")
        return fake_runner(setup, workload, options, on_window=on_window)

    outcome = search(config(tmp_path, cache_dir, trials=5, confirm_top=1), runner=kill_the_first_guess)
    [guess] = target
    assert runs.count(guess) == 2
    of_guess = [r for r in outcome.records if r.setup == guess and r.reused_from is None]
    assert [r.role for r in of_guess] == ["guess", "guess"]
    assert KILLED_FROM_OUTSIDE in (of_guess[0].result.error or "")
    if kills == 1:
        assert of_guess[1].result.status == "ok" and of_guess[1].result.samples_per_s
    else:
        assert KILLED_FROM_OUTSIDE in (of_guess[1].result.error or "")
    assert len(measured(outcome.records)) == 5
