"""report.html: self-contained, every plot present, readable without a browser."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import html as html_module
import json
import os
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import time
import types
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest
from hosts import pretend_bf16_cpu
from typer.testing import CliRunner

from autotune.cli import app
from autotune.output.best import read_best, write_best
from autotune.output.importance import FEW_TRIALS, knob_importance
from autotune.output.report import REPORT
from autotune.records import TrialRecord, TrialResult, Workload
from autotune.time_spent import TimeSpent
from autotune.train_setup import TrainSetup
from autotune.tuner import SearchConfig, run_search
from autotune.tuner.constraints import parse_constraint

PNG = b"\x89PNG\r\n\x1a\n"
SECTIONS = {"summary", "history", "batch-size", "loader", "importance", "confirmation", "time"}
WARMUP_S, MEASURED_S = 2.0, 3.0


def mixed_runner(setup: TrainSetup, workload, options=None, *, on_window=None) -> TrialResult:
    """Deterministic: 2 workers in fp32 run out of memory, 1 worker in fp32 is pruned; the loader computes on 2 cores."""
    if options.mode == "loader":
        return TrialResult(status="ok", samples_per_s=150.0 * (min(setup.num_workers, 2) + 1), windows=(1.0,))
    if setup.amp == "off" and setup.num_workers == 2:
        return TrialResult(status="oom", error="peak memory above the budget", peak_memory_bytes=9 * 2**30)
    rate = 100.0 * min(setup.batch_size, 128) / 32 * (1.5 if setup.amp == "bf16" else 1.0) * (1 + 0.3 * setup.num_workers)
    if options.mode == "train" and on_window is not None and setup.num_workers == 1 and setup.amp != "bf16":
        return TrialResult(status="pruned", samples_per_s=rate / 2, windows=(rate / 2,), measured_s=1.0)
    return TrialResult(
        status="ok", samples_per_s=rate * (2 if options.mode == "compute" else 1), samples_per_s_spread=5.0,
        windows=(rate - 2, rate + 2, rate), peak_memory_bytes=2**28 + setup.batch_size * 2**20,
        data_wait_fraction=0.4 / (1 + setup.num_workers), warmup_s=WARMUP_S, measured_s=MEASURED_S,
    )


def _config(out: Path, cache_dir: Path, **kw) -> SearchConfig:
    base = dict(model="resnet18", trials=14, image_size=32, device="cpu", trial_seconds=1.0, out=out, cache_dir=cache_dir,
                synthetic_images=64, confirm_rounds=3, confirm_top=2, sampler="random", seed=3,
                # The torch knobs pinned: the random draws of the loader, batch and precision knobs stay
                # those that give this search ok, pruned and oom trials.
                constraints=tuple(parse_constraint(c) for c in ("num_threads=2", "optimizer_impl=foreach", "compile=off")))
    base.update(kw)
    return SearchConfig(**base)


@pytest.fixture(scope="module")
def searched(tmp_path_factory: pytest.TempPathFactory, cache_dir: Path):
    """One search with ok, pruned and oom trials, and its output directory."""
    out = tmp_path_factory.mktemp("report") / "out"
    with pytest.MonkeyPatch.context() as monkeypatch:
        pretend_bf16_cpu(monkeypatch)  # the mixed runner's trials assume bf16 among the precisions, whatever this host's CPU
        return run_search(_config(out, cache_dir), runner=mixed_runner), out


class Page(HTMLParser):
    """What a check of the page needs: images, section ids, tables, every URL-bearing attribute, the text."""

    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.sections: set[str] = set()
        self.urls: list[str] = []
        self.tables = 0
        self.details = 0
        self.text: list[str] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "img":
            self.images.append(found.get("src") or "")
        if tag == "section":
            self.sections.add(found.get("id") or "")
        self.tables += tag == "table"
        self.details += tag == "details"
        self._in_style = tag == "style"
        self.urls += [v or "" for k, v in attrs if k in ("src", "href", "action", "poster", "data")]
        if "style" in found:
            self.styles.append(found["style"] or "")

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        (self.styles if self._in_style else self.text).append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def assert_self_contained(page: Page) -> None:
    assert not [u for u in page.urls if u.lower().startswith(("http:", "https:", "//"))]
    assert not [u for u in page.urls if not u.startswith("data:")]
    assert "url(" not in "".join(page.styles)


def test_a_search_writes_a_self_contained_report_with_every_plot(searched) -> None:
    outcome, out = searched
    statuses = {r.result.status for r in outcome.records}
    assert {"ok", "pruned", "oom"} <= statuses
    page = parse(out / REPORT)
    assert SECTIONS <= page.sections
    assert len(page.images) == len(SECTIONS)  # every section has its plot
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        data = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert data.startswith(PNG) and len(data) > 1000
    assert_self_contained(page)
    assert page.details >= len(SECTIONS) and page.tables >= len(SECTIONS)
    text = " ".join(page.text)
    assert f"{outcome.best.speedup:.2f}x" in text and "Bottleneck:" in text
    assert f"{outcome.best.samples_per_s:.1f} samples/s" in text
    assert "Use it: python train.py beside this page" in " ".join(text.split()) and 'autotune.load_setup("best.json")' in text  # what next
    written = [Path(f) for f in outcome.files]
    assert out / REPORT in written
    pngs = [f for f in written if f.suffix == ".png"]
    assert {p.name for p in pngs} == {"report-summary.png", "report-history.png", "report-confirmation.png"}
    assert all(p.read_bytes().startswith(PNG) for p in pngs)


def chromium() -> str:
    """Debian's chromium (``.ci/run`` installs it when missing): CI fails without it, elsewhere the test is skipped."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing in CI (.ci/run installs Debian's chromium)")
        pytest.skip("no chromium (apt-get install chromium)")
    return found


#: Appended to a copy of the page: once it has loaded, what the browser made of it, as JSON in a <pre>.
BROWSER_CHECK = """<script>
window.addEventListener("load", () => {
  const images = [...document.images];
  const said = document.createElement("pre");
  said.id = "autotune-check";
  said.textContent = JSON.stringify({
    widths: images.map(i => (i.complete ? i.naturalWidth : 0)),
    sections: [...document.querySelectorAll("section[id]")].map(s => s.id),
    text: document.body.innerText,
  });
  document.body.appendChild(said);
});
</script>"""


def test_the_report_shows_every_plot_in_a_real_browser(searched, tmp_path: Path) -> None:
    """Headless Chromium opens report.html from disk as a user does: every plot decodes into an image, every section
    is there, and the page says the winner's speedup."""
    outcome, out = searched
    page = tmp_path / "page.html"
    html = (out / REPORT).read_text(encoding="utf-8")
    assert html.count("</body>") == 1
    page.write_text(html.replace("</body>", BROWSER_CHECK + "</body>"), encoding="utf-8")
    shown = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={tmp_path / 'profile'}",
                            "--virtual-time-budget=10000", "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert shown.returncode == 0, shown.stderr[-2000:]
    dumped = shown.stdout.split('<pre id="autotune-check">', 1)
    assert len(dumped) == 2, shown.stdout[-2000:]
    seen = json.loads(html_module.unescape(dumped[1].split("</pre>", 1)[0]))
    assert len(seen["widths"]) == len(SECTIONS) and all(w > 100 for w in seen["widths"]), seen["widths"]  # decoded plots
    assert SECTIONS <= set(seen["sections"])
    assert f"{outcome.best.speedup:.2f}x" in seen["text"] and "Bottleneck:" in seen["text"]


def test_the_time_breakdown_accounts_every_trial_process(searched) -> None:
    outcome, _ = searched
    spent = outcome.time_spent
    ran = [r for r in outcome.records if r.result.ok and r.reused_from is None]  # measured in full by the runner
    assert spent.measured_s == pytest.approx(MEASURED_S * len(ran))
    assert spent.warmup_s == pytest.approx(WARMUP_S * len(ran))
    confirmations = sum(len(c.values) + len(c.failures) for c in outcome.confirmed)
    assert spent.runs == outcome.timing.runs and spent.runs > len(ran) + confirmations  # calibration counts too
    assert spent.pruned_s > 0 and spent.infeasible_s > 0 and spent.confirmation_s > 0 and spent.calibration_s > 0
    assert spent.ceilings_s > 0 and outcome.ceilings is not None  # the winner's own ceilings, after the confirmation
    assert spent.wall_s > 0
    # "other" is the wall time outside the trial processes; a fake runner's made-up seconds can exceed the wall: none then.
    assert TimeSpent(wall_s=10.0, calibration_s=2.0, measured_s=4.0, warmup_s=1.0).other_s == pytest.approx(3.0)
    assert TimeSpent(wall_s=1.0, measured_s=4.0).other_s == 0.0
    # A shared study's worker waiting for the others: its own part, not "other".
    waited = TimeSpent(wall_s=10.0, measured_s=4.0, waiting_s=5.0)
    assert waited.other_s == pytest.approx(1.0) and ("waiting for other workers", 5.0) in waited.breakdown()
    timing = outcome.to_dict()["timing"]  # --json: this run's breakdown carries its wall time too
    assert timing["spent"]["wall_s"] == timing["wall_s"] > 0
    # The page's table: every figure in its "seconds" column is seconds; the count of processes is not one of them.
    from autotune.output.sections import time_section

    rows = time_section(spent, True, None).tables[0].rows
    assert (f"trial runs: {spent.runs}", "", "") in rows
    assert all(float(seconds) >= 0 for _, seconds, _ in rows if seconds) and str(spent.runs) not in [r[1] for r in rows]


def test_resumed_search_adds_its_time_to_the_stored_breakdown(tmp_path, cache_dir) -> None:
    first = run_search(_config(tmp_path / "out", cache_dir, trials=4), runner=mixed_runner)
    second = run_search(_config(tmp_path / "out", cache_dir, trials=6), runner=mixed_runner)
    assert second.time_spent.runs == first.time_spent.runs + second.timing.runs
    assert second.time_spent.wall_s > first.time_spent.wall_s


def test_every_run_s_time_is_kept_however_runs_sharing_the_study_overlap(tmp_path) -> None:
    """Two workers of one study, each storing its own run's breakdown when it ends: the study sums both, whichever
    ends last (before, each stored the total it read at its start plus its own, and the last worker's replaced the
    other's: a shared study's page read 0 s of confirmation beside the confirmation it plotted)."""
    from autotune.tuner.study import SearchStudy

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(storage=storage, study_name="s", direction="maximize")
    optuna.load_study(study_name="s", storage=storage).set_user_attr("time_spent", {"wall_s": 5.0, "runs": 1})  # an older run
    first, second = SearchStudy.load(storage, "s"), SearchStudy.load(storage, "s")
    first.store_time_spent(TimeSpent(wall_s=100.0, calibration_s=40.0, runs=5))
    second.store_time_spent(TimeSpent(wall_s=90.0, confirmation_s=30.0, ceilings_s=6.0, runs=7))
    first.store_time_spent(TimeSpent(wall_s=110.0, calibration_s=40.0, runs=6))  # stored again: replaces its own
    total = SearchStudy.load(storage, "s").time_spent()
    assert total == TimeSpent(wall_s=205.0, calibration_s=40.0, confirmation_s=30.0, ceilings_s=6.0, runs=14, searches=3)
    assert second.time_spent(others=True) == TimeSpent(wall_s=115.0, calibration_s=40.0, runs=7, searches=2)
    # The page says its wall time is a sum of runs (workers of a shared study overlap in time).
    from autotune.output.sections import time_section

    assert ("wall time, summed over 3 runs of the search", "205.0", "100%") in time_section(total, True, None).tables[0].rows
    assert ("wall time", "90.0", "100%") in time_section(TimeSpent(wall_s=90.0), True, None).tables[0].rows


def test_report_command_rewrites_the_report_from_the_study(searched, tmp_path) -> None:
    _, source = searched
    out = tmp_path / "copy"
    shutil.copytree(source, out)
    (out / REPORT).unlink()
    result = CliRunner().invoke(app, ["report", str(out)])
    assert result.exit_code == 0, result.output
    assert result.output.strip().splitlines()[-1] == f"report: {(out / REPORT).resolve()} (plots; open it in a browser)"
    page = parse(out / REPORT)
    assert SECTIONS <= page.sections and len(page.images) == len(SECTIONS)
    text = " ".join(page.text)
    assert "finished" in text and "Bottleneck:" in text  # the verdict stored with the study
    assert "compute alone (winner's setup)" in text  # the winner's own ceilings, also stored


def test_report_command_reads_a_study_by_storage_and_name(searched, tmp_path) -> None:
    """No best.json there: the best trial so far, unconfirmed; the study's confirmation finished, so the status says where
    its winner is (it read "in progress or interrupted (no best.json yet)" for a search that had finished)."""
    outcome, source = searched
    storage = f"sqlite:///{source / 'study.db'}"
    result = CliRunner().invoke(app, ["report", str(tmp_path / "live"), "--storage", storage, "--study", outcome.study])
    assert result.exit_code == 0, result.output
    page = parse(tmp_path / "live" / REPORT)
    text = " ".join(page.text)
    assert "Best trial so far (not confirmed)" in text and "in progress" not in text
    assert (f"winner confirmed, not shown here: it is in the best.json of the search's own --out ({tmp_path / 'live'} holds "
            "none); report that directory to show it") in text
    assert "resnet18 @ 32px on cpu, data: synthetic JPEGs (no --data given)" in text  # the workload, as the study stored it
    assert SECTIONS <= page.sections
    assert_self_contained(page)


def test_the_report_of_a_search_interrupted_before_a_feasible_trial_names_its_workload(tmp_path, cache_dir) -> None:
    """No best.json (nothing feasible yet): the header names the model, image size, device and data as a finished one does."""
    from autotune.errors import SearchInterrupted

    trials = []

    def interrupted(setup, workload, options=None, *, on_window=None):
        if options.mode != "train":  # calibration passes
            return mixed_runner(setup, workload, options, on_window=on_window)
        trials.append(setup)
        if len(trials) > 1:  # Ctrl-C during the second trial
            raise KeyboardInterrupt
        return TrialResult(status="oom", error="no memory at all", peak_memory_bytes=2**30)

    with pytest.raises(SearchInterrupted, match="interrupted before any feasible trial"):
        run_search(_config(tmp_path / "out", cache_dir, trials=3), runner=interrupted)
    assert not (tmp_path / "out" / "best.json").exists()
    for rewrite in (False, True):  # the search's own report, and `autotune report` of the study
        if rewrite:
            result = CliRunner().invoke(app, ["report", str(tmp_path / "out")])
            assert result.exit_code == 0, result.output
        text = " ".join(" ".join(parse(tmp_path / "out" / REPORT).text).split())
        assert "resnet18 @ 32px on cpu, data: synthetic JPEGs (no --data given) · 1 trial" in text, text[:400]


def test_the_workload_line_of_a_stored_signature() -> None:
    """A Task's reference, device and samples (no image size: its data is its own); nothing from a signature that says too little."""
    from autotune.output.report import render_report
    from autotune.output.sections import ReportInput
    from autotune.tuner.identity import described_workload

    task = {"task": "mytasks:make", "model": "mytasks:make", "image_size": 224, "data": None, "device": "cuda", "samples": 5000}
    assert described_workload(task) == "workload mytasks:make on cuda, 5000 samples"
    classifier = {"model": "resnet50", "image_size": 176, "data": "/data/train", "device": "cpu", "samples": 100}
    assert described_workload(classifier) == "resnet50 @ 176px on cpu, data: /data/train"
    for unreadable in (None, [], {}, {"model": "resnet50", "device": "cpu"}, {**classifier, "image_size": "big"}, {**classifier, "device": 3}):
        assert described_workload(unreadable) is None, unreadable
    data = ReportInput(records=(), calibration=None, confirmed=(), best=None, verdict=None, time_spent=None, study="s", storage="sqlite:///x",
                       status="in progress or interrupted (no best.json yet)", workload=described_workload(task))
    page, _ = render_report(data)
    assert '<p class="meta">workload mytasks:make on cuda, 5000 samples &middot; 0 trials' in page
    # Trials counted as the budget and `autotune status` count them: a repeat that did not run is said apart (a probe's
    # header read "45 trials" beside status's "40/40 trials finished").
    setup = TrainSetup(batch_size=16)
    ok = TrialResult(status="ok", samples_per_s=100.0)
    records = (TrialRecord(0, "search", setup, ok), TrialRecord(1, "search", setup, ok, reused_from=0, free=True))
    page, _ = render_report(dataclasses.replace(data, records=records))
    assert "&middot; 1 trial (1 ok; 1 more not run (a setup measured before, or one the data or /dev/shm cannot feed))" in page


def test_a_report_that_cannot_be_written_is_one_line(searched, tmp_path, monkeypatch) -> None:
    outcome, source = searched
    monkeypatch.delenv("AUTOTUNE_DEBUG", raising=False)
    (tmp_path / "out" / REPORT).mkdir(parents=True)  # where the page goes: the write fails as on a full disk, with an OSError
    storage = f"sqlite:///{source / 'study.db'}"
    result = CliRunner().invoke(app, ["report", str(tmp_path / "out"), "--storage", storage, "--study", outcome.study])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    # report.html named, not the hidden temporary copy the write went to (as on a read-only disk).
    assert lines[0].startswith(f"error: cannot write {tmp_path / 'out' / REPORT}: "), result.output
    assert "internal error" not in result.output and ".report.html." not in result.output


def test_status_and_report_of_a_directory_read_its_own_study_when_another_search_added_one(searched, tmp_path) -> None:
    """A search given `--storage sqlite:///OUT/study.db --study other` added its study to another search's study.db:
    `autotune status OUT` and `autotune report OUT` then said `2 studies (...); pass --study NAME`, though OUT's
    best.json names its own."""
    outcome, source = searched
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    other = optuna.create_study(study_name="other", storage=f"sqlite:///{copy / 'study.db'}")
    other.add_trial(optuna.trial.create_trial(value=1.0))
    status = CliRunner().invoke(app, ["status", str(copy)])
    assert status.exit_code == 0 and f"study {outcome.study!r} in sqlite:///" in status.stdout, status.output
    report = CliRunner().invoke(app, ["report", str(copy)])
    assert report.exit_code == 0 and "report: " in report.stdout, report.output
    asked = CliRunner().invoke(app, ["status", str(copy), "--study", "other"])  # named: that one, as asked
    assert asked.exit_code == 1 and "no autotune search signature" in asked.output, asked.output
    (copy / "best.json").unlink()  # nothing names one: both are said, as before
    unnamed = CliRunner().invoke(app, ["status", str(copy)])
    assert unnamed.exit_code == 1 and f"2 studies ({outcome.study}, other); pass --study NAME" in unnamed.output, unnamed.output


def test_status_names_an_earlier_runs_winner_while_a_rerun_is_in_progress(searched, tmp_path) -> None:
    """The same command again re-runs the confirmation: until it writes its own, best.json is the earlier run's."""
    import os

    from autotune.tuner.lock import Holder
    from autotune.tuner.study import STUDY_HOLDER

    outcome, source = searched
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    me = Holder.me()  # alive: this process stands for the rerun, started after best.json was written
    optuna.load_study(study_name=outcome.study, storage=f"sqlite:///{copy / 'study.db'}").set_user_attr(STUDY_HOLDER, me.to_dict())
    os.utime(copy / "best.json", (me.started - 60, me.started - 60))
    text = " ".join(CliRunner().invoke(app, ["status", str(copy)]).stdout.split())
    assert f"confirmed by an earlier run of this search (best.json and train.py in {copy.resolve()}); the run in progress" in text
    # The report says so too (it read "search finished" with the earlier run's winner, as if the rerun had ended).
    assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 0
    page = " ".join((copy / REPORT).read_text().split())
    assert "search in progress: a rerun is searching; the winner shown is an earlier run's" in page and "search finished" not in page
    confirmed = (copy / "best.json").read_bytes()
    write_best(copy / "best.json", dataclasses.replace(read_best(copy / "best.json"), confirmed=False))  # an interrupted run's pick
    os.utime(copy / "best.json", (me.started - 60, me.started - 60))
    # A rerun of an interrupted search is in progress: its trials are newer evidence than the earlier run's unconfirmed pick
    # (the page said "search interrupted" with that pick while `autotune status` said a search was running).
    assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 0
    page = " ".join((copy / REPORT).read_text().split())
    assert "search in progress: a rerun is searching; the best trial so far is shown, not confirmed" in page, page
    assert "Best trial so far (not confirmed): #" in page and "interrupted" not in page.split("<h2>")[0]
    study = optuna.load_study(study_name=outcome.study, storage=f"sqlite:///{copy / 'study.db'}")
    study.set_user_attr(STUDY_HOLDER, dataclasses.replace(me, started=me.started - 3600).to_dict())  # ended: its pid reused since
    assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 0
    assert "search interrupted (winner not confirmed)" in (copy / REPORT).read_text()
    study.set_user_attr(STUDY_HOLDER, me.to_dict())
    (copy / "best.json").write_bytes(confirmed)
    os.utime(copy / "best.json")  # written by the run in progress: its own winner
    text = " ".join(CliRunner().invoke(app, ["status", str(copy)]).stdout.split())
    assert f"confirmed by this search (best.json and train.py in {copy.resolve()})" in text


def test_a_copied_winner_s_time_is_its_own_in_the_time_zone_that_wrote_it(tmp_path, monkeypatch) -> None:
    """best.json copied (its file time reset) to a machine in another time zone: the trials, which Optuna stamps with
    the writer's wall clock, are compared with best.json's `created` on that clock, whatever the reader's zone."""
    import datetime

    from optuna.distributions import FloatDistribution
    from optuna.trial import FrozenTrial

    from autotune.tuner.study_files import measured_after

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        path = tmp_path / "best.json"
        path.write_text(json.dumps({"created": "2026-01-01T12:05:00-05:00"}))  # written in New York
        starts = (datetime.datetime(2026, 1, 1, 12, 0), datetime.datetime(2026, 1, 1, 12, 10))  # its trials, New York's clock
        trials = [FrozenTrial(number=k, state=optuna.trial.TrialState.COMPLETE, value=1.0, datetime_start=start,
                              datetime_complete=start, params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
                              user_attrs={}, system_attrs={}, intermediate_values={}, trial_id=k) for k, start in enumerate(starts)]
        assert measured_after(trials, path) == 1
        own = datetime.datetime.fromisoformat("2026-01-01T12:05:00-05:00").timestamp() + 30
        os.utime(path, (own, own))  # the file's time as written, not a copy's: it holds, on the reader's clock, as before
        assert measured_after(trials, path) == 0  # Tokyo's clock reads 2026-01-02 02:05 then
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_status_says_trials_after_the_winner_are_not_confirmed(searched, tmp_path) -> None:
    """A rerun with more --trials stopped before its confirmation: best.json is the earlier run's, and status says the
    later trials are not confirmed, as the report does ("an earlier run's confirmed winner kept")."""
    import datetime

    outcome, source = searched
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    starts = sorted(t.datetime_start.timestamp() for t in optuna.load_study(
        study_name=outcome.study, storage=f"sqlite:///{copy / 'study.db'}").get_trials() if t.datetime_start is not None)
    study = optuna.load_study(study_name=outcome.study, storage=f"sqlite:///{copy / 'study.db'}")
    study.tell(study.ask(), state=optuna.trial.TrialState.FAIL)  # cut short by the stop: it measured nothing
    study.ask()  # left running by a search that was killed: nor did it
    def created(at: float) -> None:  # best.json written at ``at``, by its own word; the file's time is a copy's, 10 min on
        best = json.loads((copy / "best.json").read_text())
        best["created"] = datetime.datetime.fromtimestamp(at).astimezone().isoformat()
        (copy / "best.json").write_text(json.dumps(best))
        os.utime(copy / "best.json", (at + 600, at + 600))

    created(starts[-2] + 0.001)  # written between the last two trials' starts, copied later (cp -r: a new file time)
    text = " ".join(CliRunner().invoke(app, ["status", str(copy)]).stdout.split())
    assert (f"confirmed by an earlier run of this search (best.json and train.py in {copy.resolve()}); 1 trial(s) measured after it "
            "are not confirmed: rerun the search's command to confirm them") in text, text
    # The report says so too (it read "search finished", the later trial unmentioned).
    assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 0
    page = " ".join((copy / REPORT).read_text().split())
    assert ("search interrupted (an earlier run's confirmed winner kept; 1 trial(s) measured after it are not confirmed: rerun "
            "the search's command to confirm them)") in page and "search finished" not in page
    created(time.time())
    text = " ".join(CliRunner().invoke(app, ["status", str(copy)]).stdout.split())
    assert "confirmed by this search" in text and "not confirmed" not in text, text


def test_a_best_json_of_another_image_size_or_device_is_not_the_studys(searched, tmp_path) -> None:
    """``autotune report o1 --storage sqlite:///o2/study.db``: o1's best.json of the same model at another image size
    (or device, or data) is not drawn beside o2's trials as their winner, even when its setup is one they ran."""
    from autotune.output.best import write_best

    outcome, source = searched
    for change in ({"image_size": 48}, {"device": "cuda:0"}, {"data": "/elsewhere"}, {}):
        copy = tmp_path / f"copy-{len(change)}-{next(iter(change), 'same')}"
        shutil.copytree(source, copy)
        best = read_best(copy / "best.json")
        write_best(copy / "best.json", dataclasses.replace(best, workload=dataclasses.replace(best.workload, **change)))
        text = " ".join(CliRunner().invoke(app, ["status", str(copy)]).stdout.split())
        assert ("confirmed by this search" in text) is (not change), (change, text)
        foreign = f"winner: none of this study's in {copy}: its best.json is another search's (another storage or study)"
        assert (foreign in text) is bool(change) and "rerun the search's command to confirm one" not in text, (change, text)
        assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 0
        page = " ".join((copy / REPORT).read_text(encoding="utf-8").split())
        assert (f"winner not shown: {copy / 'best.json'} is another search's" in page) is bool(change)


def test_a_best_json_of_another_study_of_the_same_workload_is_not_the_studys(searched, tmp_path) -> None:
    """Two studies of one workload in one storage (--study alpha, --study beta) share setups (the defaults at least):
    `autotune report DIR_OF_ALPHA --study beta` showed alpha's winner as beta's, and called beta interrupted."""
    outcome, source = searched
    assert read_best(source / "best.json").study == outcome.study  # the search names the study it kept its trials in
    copy = tmp_path / "copy"
    shutil.copytree(source, copy)
    write_best(copy / "best.json", dataclasses.replace(read_best(copy / "best.json"), study="beta"))
    result = CliRunner().invoke(app, ["report", str(copy)])
    assert result.exit_code == 0, result.output
    page = " ".join((copy / REPORT).read_text().split())
    assert f"is another search's (another study, workload or setups), not the winner of study {outcome.study!r}" in html_module.unescape(page)
    assert "Winner:" not in page and "warning: winner not shown" in " ".join(result.output.split())
    text = " ".join(CliRunner().invoke(app, ["status", str(copy)]).stdout.split())
    assert "its best.json is another search's (another storage or study)" in text, text
    write_best(copy / "best.json", dataclasses.replace(read_best(copy / "best.json"), study=""))  # written before the field
    assert CliRunner().invoke(app, ["report", str(copy)]).exit_code == 0
    assert "Winner:" in (copy / REPORT).read_text()


def test_a_winner_that_ran_in_the_confirmation_only_is_the_studys(searched, tmp_path) -> None:
    """The leader's fp32 twin is measured in a confirmation only, never as a trial (and a rerun's rounds may have
    replaced that confirmation's): status still names it this search's winner; a setup no trial is the twin of is not."""
    from autotune.output.best import write_best

    outcome, source = searched
    setups = {r.setup for r in outcome.records}
    twin = next(r.setup.replace(amp="off") for r in outcome.records if r.setup.amp != "off" and r.setup.replace(amp="off") not in setups)
    for setup, ours in ((twin, True), (twin.replace(batch_size=3), False)):
        copy = tmp_path / f"copy-{ours}"
        shutil.copytree(source, copy)
        write_best(copy / "best.json", dataclasses.replace(read_best(copy / "best.json"), setup=setup))
        text = " ".join(CliRunner().invoke(app, ["status", str(copy)]).stdout.split())
        assert (f"winner: {setup.describe()}: " in text and "confirmed by this search" in text) is ours, text


def test_status_reads_a_search_directory_like_report(searched, tmp_path) -> None:
    """`autotune status DIR` reads DIR/study.db, as --storage sqlite:///DIR/study.db does, and DIR/best.json."""
    outcome, source = searched
    by_dir = CliRunner().invoke(app, ["status", str(source), "--json"])
    by_url = CliRunner().invoke(app, ["status", "--storage", f"sqlite:///{(source / 'study.db').resolve()}", "--json"])
    assert by_dir.exit_code == 0 == by_url.exit_code, by_dir.output + by_url.output
    progress = lambda d: {k: v for k, v in d.items() if not k.startswith("winner")}  # noqa: E731
    assert progress(json.loads(by_dir.stdout)) == progress(json.loads(by_url.stdout))
    assert json.loads(by_dir.stdout)["study"] == outcome.study
    # A lone search stores no winner in its study: read from DIR, its confirmed best.json is the winner.
    assert json.loads(by_dir.stdout)["winner"]["samples_per_s"] == read_best(source / "best.json").samples_per_s
    assert json.loads(by_url.stdout)["winner"] is None
    text = CliRunner().invoke(app, ["status", str(source)]).stdout
    assert "winner: " in text and f"confirmed by this search (best.json and train.py in {source.resolve()})" in " ".join(text.split())
    # The budget is stored for a lone search too; by URL alone its winner is not in the study, and nothing is running.
    infeasible = json.loads(by_dir.stdout)["infeasible"]
    assert infeasible == sum(r.result.status not in ("ok", "pruned") and not r.free for r in outcome.records) > 0
    assert json.loads(by_dir.stdout)["trials"] == 14 and f"14/14 trials finished ({infeasible} infeasible" in text
    assert ", 0 running" in text
    by_url_text = " ".join(CliRunner().invoke(app, ["status", "--storage", f"sqlite:///{source / 'study.db'}"]).stdout.split())
    assert "winner: in the best.json of the search's directory" in by_url_text and "being confirmed" not in by_url_text
    # Another search's best.json (another model) is not this study's winner.
    other = tmp_path / "other"
    shutil.copytree(source, other)
    best = read_best(other / "best.json")
    write_best(other / "best.json", dataclasses.replace(best, workload=dataclasses.replace(best.workload, model="mobilenet_v3_small")))
    assert json.loads(CliRunner().invoke(app, ["status", str(other), "--json"]).stdout)["winner"] is None
    # A damaged best.json is said to be one, as report and emit say it (it read "none confirmed ...; rerun to confirm one").
    text = (source / "best.json").read_text()
    (other / "best.json").write_text(text[: len(text) // 2])
    said = " ".join(CliRunner().invoke(app, ["status", str(other)]).stdout.split())
    assert f"winner: not shown: {other / 'best.json'}" in said and "none confirmed" not in said, said
    assert said.endswith("rerun the search's command to write best.json again"), said
    missing = CliRunner().invoke(app, ["status", str(tmp_path / "nowhere")])
    lines = [ln for ln in missing.output.splitlines() if ln.strip()]
    assert missing.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error: no study in ")
    assert "does not exist (run `autotune search --out" in lines[0]
    # A search with --storage stopped before it wrote a file: its lock file alone says one ran there (it read "run
    # `autotune search --out DIR` first").
    (tmp_path / "stopped").mkdir()
    (tmp_path / "stopped" / "autotune.lock").write_text("")
    for command in ("status", "report"):
        stopped = CliRunner().invoke(app, [command, str(tmp_path / "stopped")])
        assert stopped.exit_code == 1 and stopped.output.strip().endswith(
            "does not exist, yet a search used this directory (autotune.lock): one run with --storage keeps its study there (pass "
            "that --storage URL --study NAME, as its command named them); else its study.db was removed"), stopped.output
    # A directory named study.db read "does not exist"; an empty --storage, as a path, named the working directory.
    (tmp_path / "odd" / "study.db").mkdir(parents=True)
    for command in (["status", str(tmp_path / "odd")], ["report", str(tmp_path / "odd")]):
        odd = CliRunner().invoke(app, command)
        assert odd.exit_code == 1 and odd.output.strip() == (f"error: no study in {tmp_path / 'odd'}: {tmp_path / 'odd' / 'study.db'} is "
                                                             "not a file (a directory, say), where a search keeps its study database")
    for command in ("status", "report"):
        empty = CliRunner().invoke(app, [command, str(source), "--storage", " "])
        assert empty.exit_code == 2 and empty.output.strip() == f"error: --storage must not be empty (leave it out for {source / 'study.db'})"


def test_status_of_a_directory_with_its_storage_reads_the_directory_s_winner(searched, tmp_path) -> None:
    """`autotune status DIR --storage URL` (a lone search run with --storage keeps no study.db in DIR, and stores no
    winner in its study) names DIR/best.json as the winner; DIR was ignored, and each form pointed to the other."""
    _, source = searched
    url = f"sqlite:///{(source / 'study.db').resolve()}"
    both = CliRunner().invoke(app, ["status", str(source), "--storage", url, "--json"])
    assert both.exit_code == 0, both.output
    assert json.loads(both.stdout)["winner"]["samples_per_s"] == read_best(source / "best.json").samples_per_s
    by_url_text = " ".join(CliRunner().invoke(app, ["status", "--storage", url]).stdout.split())
    assert "(autotune status DIR --storage URL shows it)" in by_url_text


@pytest.mark.parametrize(
    ("command", "make"),
    [
        ("report", "nothing"), ("report", "empty study"), ("report", "empty file"), ("status", "nothing"), ("status", "empty file"),
        ("report", "another database"), ("status", "another database"),
    ],
)
def test_reading_a_directory_without_trials_is_one_error_line(tmp_path, make: str, command: str) -> None:
    db = tmp_path / "study.db"
    if make == "empty study":
        optuna.create_study(study_name="empty", storage=f"sqlite:///{db}")
    elif make == "empty file":
        db.touch()
    elif make == "another database":  # an SQLite file of another program
        with contextlib.closing(sqlite3.connect(db)) as other:
            other.execute("CREATE TABLE notes (x)")
            other.commit()
    result = CliRunner().invoke(app, [command, str(tmp_path)])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in result.output
    assert {
        "nothing": "does not exist", "empty study": "holds no finished trial", "empty file": "holds no study",
        "another database": "an SQLite database without Optuna's tables (tables: notes)",
    }[make] in lines[0]
    if make == "empty file":  # only read: no schema written into it
        assert db.stat().st_size == 0
    if make == "another database":  # nor Optuna's tables into another program's database
        with contextlib.closing(sqlite3.connect(db)) as other:
            assert [row[0] for row in other.execute("SELECT name FROM sqlite_master")] == ["notes"]


@pytest.mark.parametrize("damage", ["truncated", "overwritten", "a damaged page"])
@pytest.mark.parametrize("command", ["status", "report", "search"])
def test_a_damaged_study_db_is_named_as_damaged_with_what_to_do(tmp_path, damage: str, command: str) -> None:
    """A study.db cut short (a full disk, a copy that stopped) or overwritten: one line saying the file is damaged and
    what to do, not SQLite's words alone (before: `cannot open study storage ...: (sqlite3.DatabaseError) database
    disk image is malformed`)."""
    db = tmp_path / "study.db"
    study = optuna.create_study(study_name="s", storage=f"sqlite:///{db}")
    for _ in range(30):
        study.add_trial(optuna.trial.create_trial(value=1.0, params={}, distributions={}, user_attrs={"pad": "x" * 4000}))
    if damage == "truncated":
        os.truncate(db, db.stat().st_size // 2)
    elif damage == "overwritten":
        db.write_bytes(os.urandom(db.stat().st_size))
    else:  # 4000 random bytes inside, the header whole: Optuna's read wrapped SQLite's words in its own about a commit
        with open(db, "r+b") as file:
            file.seek(20000)
            file.write(random.Random(0).randbytes(4000))
    size = db.stat().st_size
    args = [command, str(tmp_path)] if command != "search" else [command, "--model", "resnet18", "--device", "cpu", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and len(lines) == 1 and "Traceback" not in result.output, result.output
    assert f"{db} is damaged (not a readable SQLite database): restore it from a backup, or move it away" in lines[0], lines[0]
    assert db.stat().st_size == size  # only read


@pytest.mark.parametrize("command", ["status", "report", "search"])
def test_a_storage_that_is_a_text_file_is_said_to_be_no_database_not_damaged(tmp_path, command: str) -> None:
    """--storage sqlite:///notes.txt read `notes.txt is damaged (not a readable SQLite database): restore it from a backup`."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\nline two\n")
    url = f"sqlite:///{notes}"
    args = ([command, "--storage", url, "--study", "s"] if command != "search" else
            [command, "--model", "resnet18", "--device", "cpu", "--storage", url, "--out", str(tmp_path / "out")])
    result = CliRunner().invoke(app, args)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert lines[0].endswith(f"{notes} is a text file, no SQLite database; it is left as it is: pass a new file's path (or another "
                             "--out) for the study"), lines[0]
    assert notes.read_text() == "my notes\nline two\n"


def test_a_search_whose_command_names_a_path_that_is_not_utf8_writes_its_report(tmp_path, cache_dir) -> None:
    """Python decodes such a path's bytes to lone surrogates (surrogateescape): the page names them escaped, as train.py does."""
    command = "autotune search --data 'bad\udcffname'"  # sys.argv of --data $'bad\xffname'
    run_search(_config(tmp_path / "out", cache_dir, trials=4, command=command), runner=mixed_runner)
    page = (tmp_path / "out" / REPORT).read_text(encoding="utf-8")
    assert "bad\\udcffname" in page
    assert CliRunner().invoke(app, ["report", str(tmp_path / "out")]).exit_code == 0


def test_reading_a_missing_journal_file_does_not_create_it(tmp_path) -> None:
    for command in (["status"], ["report", str(tmp_path / "rep")]):
        result = CliRunner().invoke(app, [*command, "--storage", str(tmp_path / "typo.log"), "--study", "s1"])
        assert result.exit_code == 1 and "holds no study" in result.output and "missing" in result.output
        assert not (tmp_path / "typo.log").exists()


def test_without_matplotlib_the_report_is_text_only_and_names_the_extra(tmp_path, cache_dir, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    outcome = run_search(_config(tmp_path / "out", cache_dir, trials=4), runner=mixed_runner)
    page = parse(tmp_path / "out" / REPORT)
    assert page.images == []
    assert 'pip install "matplotlib>=3.8"' in " ".join(page.text)
    assert SECTIONS <= page.sections and page.tables > 0
    assert_self_contained(page)
    assert not any(f.endswith(".png") for f in outcome.files)
    # The console named it "(plots; open it in a browser)" all the same: a user looked for plots that were never drawn.
    from rich.console import Console

    from autotune.render import render_search

    console = Console(width=400, record=True)
    console.print(render_search(outcome), crop=False)
    assert f'report: {(tmp_path / "out" / REPORT).resolve()} (tables only: pip install "matplotlib>=3.8" for its plots; open it in a ' \
           "browser)" in console.export_text()


def test_a_search_where_every_trial_failed_still_writes_its_report(tmp_path, cache_dir) -> None:
    from autotune.errors import SearchFailed

    def always_oom(setup, workload, options=None, *, on_window=None):
        if options.mode != "train":  # calibration passes (a batch that never fits is its own error)
            return TrialResult(status="ok", samples_per_s=100.0, windows=(100.0,), peak_memory_bytes=2**20)
        return TrialResult(status="oom", error="no memory at all", peak_memory_bytes=2**30)

    with pytest.raises(SearchFailed, match=r"all 3 trials failed \(oom: no memory at all\); every trial's reason in .*report.html"):
        run_search(_config(tmp_path / "out", cache_dir, trials=3), runner=always_oom)
    page = parse(tmp_path / "out" / REPORT)
    assert "No feasible trial" in " ".join(page.text) and SECTIONS <= page.sections
    assert_self_contained(page)
    # Rewritten from the study, and read by `autotune status`: a failed search, not one in progress or interrupted.
    from autotune.tuner.status import study_status
    from autotune.tuner.study_report import report_study

    report_study(tmp_path / "out")
    text = " ".join(parse(tmp_path / "out" / REPORT).text)
    assert "failed: no feasible trial" in text and "no trial measured a throughput" in text
    assert "in progress or interrupted" not in text and "interrupted before them" not in text
    lines = study_status(f"sqlite:///{tmp_path / 'out' / 'study.db'}", out=tmp_path / "out").lines()
    assert "3/3 trials finished (3 infeasible: oom)" in lines[0]  # the statuses they ended with
    assert "winner: none: no trial measured a throughput (trials.csv says why)" in lines


def test_the_terminal_summary_ends_with_the_report_path(searched) -> None:
    import io

    from rich.console import Console

    from autotune.render import render_search

    outcome, out = searched
    buffer = io.StringIO()
    Console(file=buffer, width=400, color_system=None).print(render_search(outcome))
    last = buffer.getvalue().strip().splitlines()[-1]
    assert last.startswith("report:") and str((out / REPORT).resolve()) in last


def test_the_terminal_summary_of_a_long_study_shows_its_fastest_trials_and_names_the_rest(searched) -> None:
    """A resumed 20,000-trial study printed 20,266 table lines before the winner: now its fastest 30, then one line."""
    import io

    from rich.console import Console

    from autotune.render import MAX_TRIAL_ROWS, SHOWN_OF_MANY, render_search

    outcome, _ = searched
    slow = TrialRecord(400, "defaults", TrainSetup(batch_size=8), TrialResult("ok", samples_per_s=1.0))  # shown wherever it ranks
    many = dataclasses.replace(outcome, records=(*_records(400), slow))
    for width in (80, 200):  # a trial per line, and the table
        buffer = io.StringIO()
        Console(file=buffer, width=width, color_system=None).print(render_search(many), crop=False)
        text = buffer.getvalue()
        hidden = re.search(r"and (\d+) more trials, slower or not measured: trials.csv has every one", text)
        assert hidden and 330 <= int(hidden.group(1)) <= 370, text[-3000:]  # 30 fastest, the defaults, the finalists
        assert re.search(r"#400 \[defaults\]|│ +400 │ defaults", text), text
        fastest = max(_records(400), key=lambda r: r.result.samples_per_s or 0.0)
        assert fastest.setup.describe() in text and len(text.splitlines()) < 2 * SHOWN_OF_MANY + 40, len(text.splitlines())
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(render_search(dataclasses.replace(outcome, records=tuple(_records(MAX_TRIAL_ROWS)))))
    assert "more trials" not in buffer.getvalue()


def test_the_terminal_summary_in_80_columns_gives_each_trial_one_line(searched) -> None:
    """An 80-column terminal left the trials table's setup column 11 characters: `opt=forea` / `ch` over 7 lines. Below
    110 columns each trial is one line (folded where longer), its setup whole; wider, the table."""
    import io

    from rich.console import Console

    from autotune.render import render_search

    outcome, _ = searched
    for width, table in ((80, False), (110, True)):
        buffer = io.StringIO()
        Console(file=buffer, width=width, color_system=None).print(render_search(outcome), crop=False)
        text = buffer.getvalue()
        assert ("┃ role" in text) == table, text
        ran = [r for r in outcome.records if r.ran]
        if not table:
            for record in ran:
                line = next(line for line in text.splitlines() if line.startswith(f"  #{record.number} [{record.role}] "))
                assert record.setup.describe() in line, line  # whole, on its trial's line
                assert f"{record.setup.describe()}: {record.result.status}" in " ".join(text.split()), record
            assert "trials (sorted by samples/s)" in text


def test_the_terminal_summary_marks_a_repeat_and_a_setup_not_run(searched) -> None:
    """A setup proposed again is not run: its row read `ok` with its earlier trial's figures, as if it had been measured."""
    import io
    from dataclasses import replace

    from rich.console import Console

    from autotune.render import render_search

    outcome, _ = searched
    first = next(r for r in outcome.records if r.result.ok and r.role != "defaults")
    repeat = replace(first, number=90, reused_from=first.number, free=True)
    unfed = replace(first, number=91, free=True, result=TrialResult("error", error="the data cannot feed it"))
    buffer = io.StringIO()
    Console(file=buffer, width=400, color_system=None).print(render_search(replace(outcome, records=[*outcome.records, repeat, unfed])))
    rows = {line.split("│")[1].strip(): line for line in buffer.getvalue().splitlines() if line.count("│") > 8}
    assert f"same setup as #{first.number}" in rows["90"] and f"{first.result.samples_per_s:.1f}" not in rows["90"], rows["90"]
    assert "error (not run)" in rows["91"]
    numbers = list(rows)  # after every trial that ran
    ran = [numbers.index(str(r.number)) for r in outcome.records if not r.free and r.reused_from is None]
    assert max(ran) < numbers.index("90") and max(ran) < numbers.index("91")


def _records(n: int) -> list[TrialRecord]:
    setups = [TrainSetup(batch_size=16 * (1 + i % 4), num_workers=i % 3, prefetch_factor=2 if i % 3 else None,
                         amp="bf16" if i % 2 else "off") for i in range(n)]
    return [TrialRecord(i, "search", s, TrialResult("ok", samples_per_s=s.batch_size * (2 if s.amp == "bf16" else 1) + i % 3))
            for i, s in enumerate(setups)]


def test_knob_importance_follows_the_measurements_and_is_not_drawn_from_too_few() -> None:
    """With 3-4 trials PED-ANOVA's top group held the fastest trial alone: the bars were the same for rates 15x apart
    and for equal ones. Now no importance below FEW_TRIALS, and the knob that sets the rates apart leads."""
    from autotune.output.sections import importance_section

    def records(n: int, rate: Callable[[TrainSetup], float]) -> list[TrialRecord]:
        return [TrialRecord(i, "search", r.setup, TrialResult("ok", samples_per_s=rate(r.setup))) for i, r in enumerate(_records(n))]

    by_amp = knob_importance(records(FEW_TRIALS + 10, lambda s: 200.0 if s.amp == "bf16" else 100.0))
    by_batch = knob_importance(records(FEW_TRIALS + 10, lambda s: 10.0 * s.batch_size))
    assert by_amp is not None and by_batch is not None
    assert max(by_amp.values, key=by_amp.values.__getitem__) == "amp", by_amp
    assert max(by_batch.values, key=by_batch.values.__getitem__) == "batch_size", by_batch
    assert set(by_amp.values) == {"batch_size", "num_workers", "prefetch_factor", "amp"}
    assert sum(by_amp.values.values()) == pytest.approx(1.0) and by_amp.trials == FEW_TRIALS + 10
    if by_amp.evaluator == "PedAnovaImportanceEvaluator":  # its top group holds 5 trials at least
        assert by_amp.top == 5 and knob_importance(_records(FEW_TRIALS)).top == 5  # type: ignore[union-attr]
    assert knob_importance(_records(FEW_TRIALS - 1)) is None
    section = importance_section(_records(6), None)
    assert section.caveat == ("not computed: 6 measured trials (the PyTorch defaults' and repeats left out), and importances need at "
                              f"least {FEW_TRIALS}: with fewer, they "
                              "follow the fastest trial's knobs, not what the others measured")


def test_knob_importance_leaves_out_the_defaults_so_pinned_knobs_get_no_credit() -> None:
    """--set batch_size=48 --set prefetch_factor=4: only the defaults' trial differs in them; the credit goes to what was searched."""
    defaults = TrialRecord(0, "defaults", TrainSetup(batch_size=32), TrialResult("ok", samples_per_s=50.0))
    searched = [TrialRecord(i, "search", TrainSetup(batch_size=48, num_workers=1 + i % 2, prefetch_factor=4, amp="bf16" if i % 3 else "off"),
                            TrialResult("ok", samples_per_s=100.0 + 40 * (i % 2) + i)) for i in range(1, 12)]
    found = knob_importance([defaults, *searched])
    assert found is not None and found.trials == 11
    assert set(found.values) == {"num_workers", "amp"}  # batch_size and prefetch_factor never varied among them


def test_time_spent_puts_each_trial_process_in_its_part() -> None:
    ok = TrialResult("ok", samples_per_s=10.0, warmup_s=2.0, measured_s=3.0)
    spent = (TimeSpent()
             .with_trial("calibration", ok, 6.0)
             .with_trial("search", ok, 6.5)
             .with_trial("search", TrialResult("pruned", samples_per_s=4.0, measured_s=1.0), 2.5)
             .with_trial("search", TrialResult("timeout"), 30.0)
             .with_trial("confirmation", ok, 7.0))
    assert (spent.calibration_s, spent.warmup_s, spent.measured_s, spent.launch_s) == (6.0, 2.0, 3.0, 1.5)
    assert (spent.pruned_s, spent.infeasible_s, spent.confirmation_s, spent.runs) == (2.5, 30.0, 7.0, 5)
    total = TimeSpent(wall_s=60.0) + spent
    assert total.other_s == pytest.approx(60.0 - 52.0)
    assert TimeSpent.from_dict({**total.__dict__, "unknown": 1}) == total


def test_a_trial_a_stop_cut_short_is_its_own_part_of_the_time() -> None:
    """A probe's page filed the trial Ctrl-C stopped (20-25 s) under "other (sampler, storage, files)": 30 % of the wall."""
    from autotune.tuner.config import Timing
    from autotune.tuner.timed import TimedRunner

    def stopped(setup, workload, options=None, *, on_window=None) -> TrialResult:  # type: ignore[no-untyped-def]
        time.sleep(0.2)
        raise KeyboardInterrupt

    timing = Timing(phase="search")
    with pytest.raises(KeyboardInterrupt):
        TimedRunner(stopped, timing)(TrainSetup(), Workload(model="resnet18", image_size=32, device="cpu"))
    assert timing.spent.interrupted_s >= 0.2 and timing.spent.runs == 1
    spent = TimeSpent().with_trial("search", TrialResult("interrupted"), 20.0)
    assert (spent.interrupted_s, spent.infeasible_s) == (20.0, 0.0)
    assert ("trials cut short by a stop", 20.0) in dataclasses.replace(spent, wall_s=30.0).breakdown()


def test_an_unconfirmed_winner_is_not_called_confirmed(searched, monkeypatch) -> None:
    from dataclasses import replace

    from autotune.output.report import ReportInput, render_report

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # tables only: fast
    outcome, _ = searched
    best = replace(outcome.best, confirmed=False, notes=("not confirmed: the search was interrupted before the interleaved re-measurement",))
    page, images = render_report(ReportInput(outcome.records, outcome.calibration, (), best, None, None, "s", "sqlite://"))
    assert "Best so far (not confirmed)" in page and "confirmed median" not in page and images == {}
    assert "single trials, unconfirmed" in page and "paired rounds" not in page  # no rounds were measured


def test_the_ceilings_plot_draws_each_figure_once_with_what_it_rests_on(searched) -> None:
    """A probe's pages: "together (confirmed)" beside "winner (confirmed median)", one figure drawn twice; the defaults'
    confirmation-round figure of an interrupted search labelled "single trial"; a 1-worker loader bar beside a verdict
    that quoted the 0-worker figure the winner's setup runs."""
    from dataclasses import replace

    from autotune.output.best import PAIRED_SO_FAR
    from autotune.output.sections import ReportInput, ceiling_bars
    from autotune.records import LoaderPoint, PrecisionPoint
    from autotune.rounds import Ceilings

    outcome, _ = searched
    best = outcome.best
    base = ReportInput(outcome.records, outcome.calibration, (), best, None, None, "s", "sqlite://")
    own = replace(base, ceilings=Ceilings(best.samples_per_s, 500.0, 900.0, 0.1))
    assert [label for label, *_ in ceiling_bars(own)] == [
        "compute alone\n(winner's setup)", "loader alone\n(winner's setup)", "winner\n(confirmed median)", "PyTorch defaults\n(same rounds)"]
    interrupted = replace(best, confirmed=False, notes=(f"not confirmed: ...; {PAIRED_SO_FAR}",))
    assert ceiling_bars(replace(base, best=interrupted))[-1][0] == "PyTorch defaults\n(rounds so far)"
    assert ceiling_bars(replace(base, best=replace(interrupted, notes=())))[-1][0] == "PyTorch defaults\n(single trial)"
    calibration = replace(outcome.calibration, loader=(LoaderPoint(0, "ok", 181.0), LoaderPoint(1, "ok", 403.0)))
    for workers, bar in ((0, ("loader only\n(calibration, 0 workers)", 181.0)), (2, ("loader only\n(calibration, 1 worker)", 403.0))):
        winner = replace(best, setup=best.setup.replace(num_workers=workers, prefetch_factor=2 if workers else None,
                                                        persistent_workers=bool(workers), pin_memory=False))
        bars = ceiling_bars(replace(base, calibration=calibration, best=winner))
        assert [b[:2] for b in bars if b[0].startswith("loader")] == [bar]
    # The compute bar is the calibration's at the winner's precision and layout, the figure the bottleneck line quotes (it
    # drew the fastest precision's, bf16 + channels_last, beside an fp32 winner, above what that winner reached).
    precisions = (PrecisionPoint("off", False, "ok", 9.0), PrecisionPoint("bf16", True, "ok", 11.9))
    calibration = replace(outcome.calibration, precisions=precisions, compute_samples_per_s=11.9,
                          compute_setup=outcome.calibration.compute_setup.replace(amp="bf16", channels_last=True))
    for amp, layout, rate in (("off", False, 9.0), ("bf16", True, 11.9), ("fp16", False, 11.9)):  # fp16: not measured, the fastest
        winner = replace(best, setup=best.setup.replace(amp=amp, channels_last=layout))
        compute = [b for b in ceiling_bars(replace(base, calibration=calibration, best=winner)) if b[0].startswith("compute")]
        assert [b[1] for b in compute] == [rate] and ("fp32" in compute[0][3]) == (rate == 9.0), compute


def test_the_history_plot_has_whole_trial_numbers_and_room_above_the_best() -> None:
    from autotune.output import plots
    from autotune.output.sections import best_so_far

    def history(records):
        line = best_so_far(records)
        return plots.history([r for r, _ in line], [best for _, best in line])

    ax = history(_records(3)).axes[0]
    assert all(float(tick).is_integer() for tick in ax.get_xticks())
    one = history(_records(1)).axes[0]  # a single trial: matplotlib's default view is +-0.045 around it
    assert list(one.get_xticks()) == [0]  # not -1, 0, 1: no trial -1
    # A repeat (a setup measured before, not run) is drawn apart: three green dots of one figure read as three runs that agree.
    records = _records(3)
    repeat = dataclasses.replace(records[1], number=3, reused_from=1, free=True)
    labels = history([*records, repeat]).axes[0].get_legend_handles_labels()[1]
    assert "ok (3)" in labels and "not run: its earlier trial's figure (1)" in labels, labels
    best = max(r.result.samples_per_s or 0.0 for r in _records(3))
    assert ax.get_ylim()[1] > best * 1.03 and ax.get_ylim()[0] < 0


def test_every_loader_series_has_its_own_style_in_order_and_thousands_of_trials_stay_points() -> None:
    """The default space's loader plot has 9 series (no workers, prefetch 1 to 8) and 8 colours: no workers and prefetch 8
    were drawn alike, and the series sorted as text (prefetch 10 before prefetch 2). A study of thousands of trials
    drew full-size opaque markers, a solid band with the pruned drawn over the ok."""
    from autotune.output import plots
    from autotune.output.sections import best_so_far

    depths = [None, *range(1, 9), 10]
    records = [TrialRecord(i, "search", TrainSetup(batch_size=32, num_workers=1 if depth else 0, prefetch_factor=depth),
                           TrialResult("ok", samples_per_s=100.0 + i)) for i, depth in enumerate(depths)]
    lines = plots.loader(records, None).axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["no workers", *(f"prefetch {d}" for d in range(1, 9)), "prefetch 10"]
    styles = [(line.get_color(), line.get_marker()) for line in lines]
    assert len(set(styles)) == len(styles), styles
    many = _records(3000)
    line = best_so_far(many)
    ax = plots.history([r for r, _ in line], [best for _, best in line]).axes[0]
    assert all(collection.get_sizes()[0] < 46 / 3 and collection.get_alpha() < 1 for collection in ax.collections)
    few = _records(30)
    line = best_so_far(few)
    assert plots.history([r for r, _ in line], [best for _, best in line]).axes[0].collections[0].get_sizes()[0] == 46


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("result", '"garbage"', "trial #1 holds an unreadable result (dictionary update sequence"),
        ("result", '{"status": "ok", "samples_per_s": "fast"}', "trial #1 holds an unreadable result (field 'samples_per_s': 'fast')"),
        ("result", '{"status": "ok", "bogus": 1}', "trial #1 holds an unreadable result ("),
        ("result", '{"status": 7}', "trial #1 holds an unreadable result (field 'status': 7)"),
        ("result", '{"status": "ok", "windows": [1.0, "x"]}', "trial #1 holds an unreadable result (field 'windows'"),
        ("setup", '{"batch_size": "x"}', "trial #1 holds an unreadable setup (batch_size must be an integer"),
    ],
)
def test_a_hand_edited_trial_record_is_one_line_naming_the_trial(searched, tmp_path, key, value, said) -> None:
    """A study whose trial record was edited (or written by another program): `autotune status` and `autotune report`
    name the trial, exit 1; they ended as `internal error: ValueError ...` (exit 3), or drew the page from a wrong figure."""
    _, source = searched
    copy = tmp_path / "edited"
    shutil.copytree(source, copy)
    with contextlib.closing(sqlite3.connect(copy / "study.db")) as db:
        trial_id = db.execute("SELECT trial_id FROM trials WHERE number = 1").fetchone()[0]
        db.execute("UPDATE trial_user_attributes SET value_json = ? WHERE trial_id = ? AND key = ?", (value, trial_id, key))
        db.commit()
    for command in ("status", "report"):
        result = CliRunner().invoke(app, [command, str(copy)])
        assert result.exit_code == 1, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and said in lines[0] and "the study was edited or written by another program" in lines[0], lines


def test_the_ceilings_section_of_a_search_without_a_confirmed_winner_is_not_titled_winner(searched, tmp_path) -> None:
    """While the search runs (no best.json yet) or after it was interrupted, the bars show the best trial so far,
    unconfirmed: the section was titled "Winner against the ceilings" all the same."""
    _, source = searched
    copy = tmp_path / "running"
    shutil.copytree(source, copy)
    (copy / "best.json").unlink()
    result = CliRunner().invoke(app, ["report", str(copy)])
    assert result.exit_code == 0, result.output
    page = (copy / "report.html").read_text()
    assert ">Best so far against the ceilings<" in page and "Winner against the ceilings" not in page
    assert ">Winner against the ceilings<" in (source / "report.html").read_text()


def test_an_unwritable_home_leaves_no_matplotlib_warnings_on_stderr(tmp_path: Path) -> None:
    """With HOME unwritable, matplotlib cannot make its config and cache directories: it says so in two lines of its
    own on stderr ("mkdir -p failed ...", "Matplotlib created a temporary cache directory ..."), between autotune's
    lines, and goes on with a temporary one. The report's plots import it quietly."""
    env = {k: v for k, v in os.environ.items() if k not in ("MPLCONFIGDIR", "XDG_CONFIG_HOME", "XDG_CACHE_HOME")}
    env["HOME"] = "/proc"  # exists, and no directory can be made in it (as root too)
    draw = "import matplotlib.figure; matplotlib.figure.Figure().savefig(__import__('io').BytesIO())"
    plain = subprocess.run([sys.executable, "-c", draw], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "Matplotlib created a temporary cache directory" in plain.stderr  # what the quiet import keeps off stderr
    quiet = subprocess.run([sys.executable, "-c", "from autotune.output.sections import plotting; "
                            "plots = plotting(); plots.png(plots.ceilings([('computing', 100.0, 'ceiling')]))"],
                           env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_report_of_a_search_stopped_after_its_calibration_shows_it(tmp_path) -> None:
    """A search stopped before its first trial finished wrote report.html (its calibration); `autotune report DIR` then
    refused: "holds no finished trial yet: nothing to report". A study without even a calibration is still refused."""
    import studies

    out = tmp_path / "out"
    out.mkdir()
    storage = f"sqlite:///{out / 'study.db'}"
    from autotune.tuner.study import SearchStudy

    SearchStudy.open(f"sqlite:///{tmp_path / 'bare.db'}", "bare", trials=3)
    bare = CliRunner().invoke(app, ["report", str(tmp_path / "none"), "--storage", f"sqlite:///{tmp_path / 'bare.db'}"])
    assert bare.exit_code == 1 and "holds no finished trial yet: nothing to report" in bare.output, bare.output
    studies.seed_calibration(storage, "calibrated")
    written = CliRunner().invoke(app, ["report", str(out)])
    assert written.exit_code == 0, written.output
    page = (out / REPORT).read_text()
    assert "calibrated, no trial finished yet (in progress or interrupted)" in page
    assert "1000" in page  # the calibration's compute-only ceiling
    # No trial ran: none failed (the page said "every trial failed (see the history table for why)"), and there is no best so far.
    assert "No trial finished yet" in page and "every trial failed" not in page and ">Ceilings<" in page and "Best so far" not in page


def test_kept_defaults_are_one_bar_a_single_measurement_has_no_spread_and_the_header_s_best_is_the_plots(searched, monkeypatch) -> None:
    """A probe's pages: where nothing beat the PyTorch defaults, "winner" and "PyTorch defaults" were two bars of one
    figure, and its "spread 0.0 samples/s" came from one measurement; without best.json the header's best trial so far
    was the defaults that --set excludes while the ceilings plot named another; the confirmation axis began at 14.4."""
    from dataclasses import replace

    from autotune.output.report import render_report
    from autotune.output.sections import ReportInput, ceiling_bars, summary_section
    from autotune.rounds import Candidate, Confirmed

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # tables only: fast
    outcome, _ = searched
    records = outcome.records
    defaults = next(r for r in records if r.role == "defaults")
    kept = replace(outcome.best, setup=defaults.setup, samples_per_s=15.2, samples_per_s_spread=0.0, speedup=None,
                   defaults_samples_per_s=15.2)
    once = (Confirmed(Candidate(defaults.setup.to_json(), defaults.setup, "defaults"), (15.2,), ()),)
    base = ReportInput(records, outcome.calibration, once, kept, None, None, "s", "sqlite://")
    labels = [label for label, *_ in ceiling_bars(base)]
    assert labels[-1] == "PyTorch defaults\n(kept: nothing beat them)" and not any(label.startswith("winner") for label in labels)
    drawn: list[list[tuple[str, float, str]]] = []  # and drawn: the bar's kind is "defaults", and only "achieved" was drawn
    plots = types.SimpleNamespace(ceilings=lambda bars: drawn.append(bars) or "figure", png=lambda figure: b"png")
    assert summary_section(base, plots).image == b"png" and drawn[0][-1][0] == labels[-1]  # type: ignore[arg-type]
    page, _ = render_report(base)
    assert "15.2 samples/s (one measurement: no spread)" in page and "spread 0.0" not in page
    # Interrupted after one confirmation run: the pick's figure is its trial's, whose windows have a spread.
    trial = replace(kept, samples_per_s=74.9, samples_per_s_spread=82.5, confirmed=False)
    page, _ = render_report(replace(base, best=trial))
    assert "74.9 samples/s (spread 82.5 samples/s)" in page and "one measurement" not in page
    # The header's best so far passes over the defaults that --set excludes, as the plots and `autotune status` do.
    fastest = replace(defaults, result=replace(defaults.result, samples_per_s=1e6))
    others = tuple(fastest if r is defaults else r for r in records)
    top = max((r for r in records if r is not defaults and r.result.ok and r.result.samples_per_s),
              key=lambda r: r.result.samples_per_s or 0.0)
    page, _ = render_report(ReportInput(others, outcome.calibration, (), None, None, None, "s", "sqlite://",
                                        baseline_only=frozenset({defaults.number})))
    assert f"Best trial so far (not confirmed): #{top.number} " in page, page


def test_an_unconfirmed_page_says_so_and_escapes_its_status(searched, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader's pages: a bold speedup of two single trials; the bar "winner (not confirmed)" under "Best so far"; a
    running DDP search's page that never said its samples/s counts every rank, and drew the defaults' one trial as two
    bars; a status line naming a directory "a&b<i>" whose tag set the rest of the page in italics."""
    from dataclasses import replace

    from autotune.output.report import render_report
    from autotune.output.sections import ReportInput, ceiling_bars

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # tables only: fast
    outcome, _ = searched
    base = ReportInput(outcome.records, outcome.calibration, (), replace(outcome.best, confirmed=False, speedup=1.48), None, None,
                       "s", "sqlite://", status="winner not shown: a&b<i>/best.json: not valid JSON")
    page, _ = render_report(base)
    assert "<b>1.48x</b>" not in page and "1.48x the PyTorch defaults" in page
    assert "a&amp;b&lt;i&gt;/best.json" in page and "a&b<i>" not in page
    assert any(label == "best so far\n(not confirmed)" for label, *_ in ceiling_bars(base))
    assert "<b>1.48x</b>" in render_report(replace(base, best=replace(base.best, confirmed=True)))[0]  # a confirmed one is bold
    defaults = next(r for r in outcome.records if r.role == "defaults")
    fastest = replace(defaults, result=replace(defaults.result, samples_per_s=1e6))  # the best so far is the defaults' trial
    running = replace(base, records=tuple(fastest if r is defaults else r for r in outcome.records), best=None, world_size=2)
    labels = [label for label, *_ in ceiling_bars(running)]
    assert labels[-1] == "PyTorch defaults\n(best so far, unconfirmed)" and not any(label.startswith("best trial") for label in labels)
    page, _ = render_report(running)
    assert f"Best trial so far (not confirmed): #{defaults.number} " in page
    assert "DDP trials of 2 ranks: samples/s counts every rank, the batch and the memory are one rank's" in page


def test_the_plots_draw_only_what_was_measured(searched, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader's pages: the best-so-far line began at 0 on the defaults a --set excludes; a setup the data could not
    feed (never run) was an "error" at 0; a repeat (its earlier trial's figure) was a second point and table row in the
    batch and loader sections; the defaults' dotted line lay hidden under an equal best-so-far line."""
    from dataclasses import replace

    from autotune.output import plots
    from autotune.output.sections import best_so_far

    outcome, _ = searched
    records = sorted(outcome.records, key=lambda r: r.number)
    first, second = records[0], next(r for r in records[1:] if r.result.ok)
    repeat = replace(second, number=100, reused_from=second.number, free=True)
    unfed = replace(second, number=101, free=True, result=replace(second.result, status="error", samples_per_s=None))
    every = [*records, repeat, unfed]
    line = best_so_far(every, frozenset({first.number}))
    fig = plots.history(every, [b for _, b in line])
    ax = fig.axes[0]
    step = next(artist for artist in ax.get_lines() if artist.get_label() == "best so far")
    assert step.get_xdata()[0] > first.number and min(step.get_ydata()) > 0  # from the first allowed trial, never at 0
    labels = ax.get_legend_handles_labels()[1]
    unfed_count = sum(r.free and r.reused_from is None for r in every)
    assert f"not run: the data or /dev/shm cannot feed it ({unfed_count})" in labels
    assert not any(label.startswith("error") for label in labels) or any(r.result.status == "error" and not r.free for r in every)
    dotted = next(artist for artist in ax.get_lines() if artist.get_label().startswith("PyTorch defaults"))
    assert dotted.get_zorder() > step.get_zorder()
    from autotune.output.report import render_report
    from autotune.output.sections import ReportInput

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # tables only: fast
    page, _ = render_report(ReportInput(tuple(every), outcome.calibration, (), None, None, None, "s", "sqlite://"))
    table = page.split("trials by batch size", 1)[1].split("</table>", 1)[0]
    assert table.count("<tr>") - 1 == sum(not r.free for r in every)  # its header, then one row per trial that ran


def test_the_confirmation_plot_starts_at_zero() -> None:
    from autotune.output import plots
    from autotune.rounds import Candidate, Confirmed
    from autotune.train_setup import TrainSetup

    setup = TrainSetup()
    fig = plots.confirmation([Confirmed(Candidate(setup.to_json(), setup, "a"), (14.6, 15.9), ())])
    assert fig.axes[0].get_xlim()[0] == 0.0
    # A finalist's whole label on short lines: on one, at 8 pt, the page scaled to 800 px drew it about 5 px tall.
    long = TrainSetup(batch_size=32, num_workers=1, prefetch_factor=2, persistent_workers=True, channels_last=True, num_threads=1)
    label = f"{long.describe()} (a finalist in fp32) (winner)"
    fig = plots.confirmation([Confirmed(Candidate(long.to_json(), long, label), (14.6, 15.9), ())])
    ticks = [tick.get_text() for tick in fig.axes[0].get_yticklabels()]
    assert ticks[0].replace("\n", " ") == label and max(map(len, ticks[0].splitlines())) <= 30


def test_the_winner_is_marked_among_the_finalists_and_the_sections_count_on_past_the_compile_one(searched, monkeypatch) -> None:
    """Within the noise a simpler setup wins over a higher median (fp32 over bf16): the confirmation plot and table,
    sorted by median, put the other on top and marked no winner. The torch.compile section, when there, is numbered
    and the sections after it count one on (they kept their numbers: "4. Knob importance", "torch.compile ...", "5. ...")."""
    from autotune.output.report import render_report
    from autotune.output.sections import ReportInput, confirmation_section
    from autotune.rounds import Candidate, Confirmed

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # tables only: fast
    outcome, _ = searched
    fp32, bf16 = TrainSetup(batch_size=64), TrainSetup(batch_size=64, amp="bf16")
    rounds = (Confirmed(Candidate(bf16.to_json(), bf16, "#2 bs=64 bf16"), (661.0, 640.0), ()),
              Confirmed(Candidate(fp32.to_json(), fp32, "#1 bs=64 fp32"), (405.9, 650.0), ()))
    rows = confirmation_section(rounds, None, winner=fp32).tables[0].rows
    assert [row[0] for row in rows] == ["#2 bs=64 bf16", "#1 bs=64 fp32 (winner)"], rows
    assert [row[0] for row in confirmation_section(rounds, None).tables[0].rows] == ["#2 bs=64 bf16", "#1 bs=64 fp32"]
    compiled = dataclasses.replace(outcome.records[-1], number=99, setup=outcome.records[-1].setup.replace(compile="default"),
                                   result=dataclasses.replace(outcome.records[-1].result, compile_s=20.0))
    page, _ = render_report(ReportInput((*outcome.records, compiled), outcome.calibration, outcome.confirmed, outcome.best,
                                        None, None, "s", "sqlite://"))
    titles = [html_module.unescape(t.split("</h2>")[0]) for t in page.split("<h2>")[1:]]
    assert [t.split(". ", 1)[0] for t in titles[1:]] == [str(n) for n in range(1, len(titles))], titles
    assert any(t.endswith(". torch.compile on the leading setup") for t in titles) and titles[-1] == f"{len(titles) - 1}. Where the search's time went"


def test_a_report_that_cannot_write_one_file_replaces_none(tmp_path) -> None:
    """A report that failed on its second PNG (a directory in its place, a full disk) had already replaced the page and
    the first PNG: a page beside an earlier run's plots, where docs/faults.md promises the page and its PNGs of one
    report. Every file is now written to a temporary file first, and a target that is a directory is refused first."""
    from autotune.errors import EmitError
    from autotune.output.report import write_rendered

    (tmp_path / "report.html").write_text("old page")
    (tmp_path / "report-summary.png").write_bytes(b"old summary")
    (tmp_path / "report-history.png").mkdir()
    with pytest.raises(EmitError, match=rf"^cannot write {tmp_path}/report-history.png: Is a directory$"):
        write_rendered(tmp_path, "new page", {"summary": b"new", "history": b"new", "confirmation": b"new"})
    assert (tmp_path / "report.html").read_text() == "old page" and (tmp_path / "report-summary.png").read_bytes() == b"old summary"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report-history.png", "report-summary.png", "report.html"]  # no temp file
    (tmp_path / "report-history.png").rmdir()
    written = write_rendered(tmp_path, "new page", {"summary": b"new", "history": b"new"})
    assert [p.name for p in written] == ["report.html", "report-summary.png", "report-history.png"]
    assert (tmp_path / "report.html").read_text() == "new page" and not (tmp_path / "report-confirmation.png").exists()


def test_a_directory_that_refuses_the_report_names_report_html_not_its_temporary_copy(tmp_path, monkeypatch) -> None:
    """`autotune report` on a read-only directory said `cannot write DIR/.report.html.k2j4x9: Permission denied`."""
    import errno
    import tempfile

    from autotune.errors import EmitError
    from autotune.output.report import write_rendered

    def refused(prefix: str = "", dir: str | None = None, **kwargs: object) -> tuple[int, str]:
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/{prefix}k2j4x9")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(EmitError, match=rf"^cannot write {tmp_path}/report.html: Permission denied$"):
        write_rendered(tmp_path, "page", {})
