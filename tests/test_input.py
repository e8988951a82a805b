"""Bad input and what a user reads: one line, printed as typed, nothing written first."""

from __future__ import annotations

import json
import pathlib
import re

import pytest
from test_cli import _search
from typer.testing import CliRunner

import autotune
from autotune.cli import app

runner = CliRunner()
run = _search  # autotune search with the tiny settings and extra options: (exit code, output, --out)


def one_line(output: str) -> str:
    lines = [ln for ln in output.splitlines() if ln.strip()]
    assert len(lines) == 1, output
    assert "Traceback" not in output and "MarkupError" not in output
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "shown"),
    [
        (("--model", "x[/y]"), "x[/y]"),
        (("--max-memory", "[/]"), "[/]"),
        (("--set", "[/x]=1"), "[/x]"),
        (("--model", "photos[old]"), "photos[old]"),
    ],
)
def test_brackets_in_input_are_printed_as_typed(tmp_path, cache_dir, extra, shown) -> None:
    code, output, _ = run(tmp_path, cache_dir, *extra)
    assert code in (1, 2)
    assert shown in one_line(output)


def test_a_bracketed_data_directory_is_named_as_typed(tmp_path, cache_dir) -> None:
    data = tmp_path / "photos[old]"
    data.mkdir()
    code, output, _ = run(tmp_path, cache_dir, "--data", str(data))
    assert code == 1
    assert "photos[old]" in one_line(output)


def test_tables_and_progress_print_bracketed_errors_as_typed() -> None:
    import io

    from rich.console import Console

    from autotune.records import TrialResult
    from autotune.render import RichReporter, render_trial
    from autotune.train_setup import TrainSetup

    failed = TrialResult(status="error", error="shape [/x] mismatch in photos[old]")
    buffer = io.StringIO()
    console = Console(file=buffer, width=200, color_system=None)
    console.print(render_trial(TrainSetup(), failed))
    with RichReporter(console) as reporter:
        reporter.confirm_progress(1, 2, "#3 [guess]", failed)
    text = buffer.getvalue()
    assert text.count("shape [/x] mismatch in photos[old]") == 2
    assert "#3 [guess]" in text


def test_a_loader_trial_shows_its_batch_time_and_no_data_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """`autotune trial --mode loader` printed "ms per optimizer step" and "78% of wall time blocked on the loader" for a
    measurement with no model and no optimizer."""
    import io

    from rich.console import Console

    from autotune.records import TrialResult
    from autotune.render import render_trial
    from autotune.train_setup import TrainSetup

    def shown(mode: str) -> str:
        result = TrialResult(status="ok", samples_per_s=100.0, step_time_s=0.32, data_wait_fraction=0.78, mode=mode)  # type: ignore[arg-type]
        buffer = io.StringIO()
        Console(file=buffer, width=200, color_system=None).print(render_trial(TrainSetup(), result))
        return buffer.getvalue()

    loading, training = shown("loader"), shown("train")
    assert "320.0 ms per batch loaded" in loading and "optimizer step" not in loading and "blocked on the loader" not in loading
    assert "320.0 ms per optimizer step" in training and "78% of wall time blocked on the loader" in training
    # The load beside it: `autotune trial` on a busy machine printed its figure with no word of it (only --json had it).
    # Busy as the search's note and a timeout's line count it: a tenth of the usable cores on a larger host.
    import autotune.render as render

    def rendered(cores: int) -> str:
        monkeypatch.setattr(render, "usable_cores", lambda: cores)
        busy = io.StringIO()
        result = TrialResult(status="ok", samples_per_s=1.0, other_cores=1.36)
        Console(file=busy, width=200, color_system=None).print(render_trial(TrainSetup(), result))
        return busy.getvalue()

    assert "│ other load  │ 1.4 cores kept busy by other processes while it measured: the figures hold for a machine that busy │" in rendered(2)
    assert "│ other load  │ 1.4 cores kept busy by other processes while it measured │" in rendered(64)
    assert "other load" not in loading  # not measured: no row


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--trial-seconds", "inf"), "--trial-seconds must be >= 0.5 and <= 86400"),
        (("--trial-seconds", "nan"), "--trial-seconds must be >= 0.5"),
        (("--trial-seconds", "0.001"), "--trial-seconds must be >= 0.5 and <= 86400, got 0.001"),  # measures the prefetched queue
        (("--timeout", "inf"), "--timeout must be > 0"),
        (("--timeout", "0.3", "--trial-seconds", "1"), "--timeout 0.3 must be longer than --trial-seconds 1: a trial measures"),
        (("--max-memory", "9" * 400), "memory size too large"),
        (("--max-memory", ""), "not a memory size: ''"),
        # 20 GiB meant: 20 bytes failed after a minute of memory pre-pass.
        (("--max-memory", "20"), "memory size '20' has no unit, so it is 20 bytes: write one (20GiB, 512MiB)"),
        (("--set", "num_workers=0..1000000000000"), "--set num_workers: must be <= 1024"),
        (("--seed", "-1"), "--seed must be between 0 and 2**32 - 1"),
        (("--synthetic-images", "0"), "--synthetic-images must be between 16 and 100000, got 0"),
        (("--synthetic-images", "99999999999"), "--synthetic-images must be between 16 and 100000"),  # 5 PB of JPEGs
        (("--study", ""), "--study must not be empty"),
        (("--storage", " "), "--storage must not be empty"),
        (("--lr", "inf"), "--lr must be a finite number > 0"),
    ],
)
def test_bad_values_are_refused_before_anything_is_written(tmp_path, extra, message) -> None:
    cache = tmp_path / "cache"
    code, output, out = run(tmp_path, cache, *extra)
    assert code == 2, output
    assert message in one_line(output)
    assert not out.exists() and not cache.exists()


@pytest.mark.parametrize("command", ["trial", "search"])
def test_synthetic_images_out_of_range_or_beside_data_are_refused_by_trial_and_search_alike(tmp_path, command) -> None:
    """``trial`` checked only the lower bound: ``--synthetic-images 100001`` wrote 5.2 GB of JPEGs before its trial (a
    typo of one more zero, 500 GB). Beside ``--data`` the flag was ignored without a word."""
    cache, data = tmp_path / "cache", tmp_path / "data"
    (data / "a").mkdir(parents=True)
    base = [command, "--model", "resnet18", "--image-size", "32", "--device", "cpu", "--cache-dir", str(cache)]
    for extra, message in ((["--synthetic-images", "100001"], "error: --synthetic-images must be between 16 and 100000, got 100001"),
                           (["--synthetic-images", "64", "--data", str(data)],
                            "error: --synthetic-images sizes the synthetic JPEGs made without --data; leave one of them out")):
        result = runner.invoke(app, [*base, *extra, *(["--out", str(tmp_path / "out")] if command == "search" else [])])
        assert result.exit_code == 2 and one_line(result.output) == message, result.output
    assert not cache.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("inside", ["results", "cats", "cats/results"])
def test_an_out_inside_the_data_is_refused_before_anything_is_written(tmp_path, inside) -> None:
    """ImageFolder takes every sub-directory of --data as a class: an --out there would change the data measured."""
    from PIL import Image

    data = tmp_path / "data"
    for name in ("cats", "dogs"):
        (data / name).mkdir(parents=True)
        Image.new("RGB", (8, 8)).save(data / name / "a.jpg")
    out = data / inside
    result = runner.invoke(app, ["search", "--model", "resnet18", "--device", "cpu", "--data", str(data), "--out", str(out)])
    assert result.exit_code == 2, result.output
    line = one_line(result.output)
    assert line.startswith(f"error: --out {out} is inside --data {data}: ") and f"part of class {inside.split('/')[0]} " in line
    assert sorted(p.name for p in data.rglob("*")) == ["a.jpg", "a.jpg", "cats", "dogs"]  # nothing written


def test_pinned_batches_that_do_not_divide_the_effective_batch_are_refused_before_calibrating(tmp_path, cache_dir) -> None:
    code, output, out = run(tmp_path, cache_dir, "--effective-batch", "12", "--set", "batch_size=4,8")
    assert code == 2 and one_line(output) == "error: --effective-batch 12 is not a multiple of batch_size 8 (--set batch_size=4,8)"
    assert not out.exists()  # nothing calibrated or stored: the same --out takes the next command


def test_effective_batch_refusals_name_the_users_figure_under_ddp() -> None:
    """run.py checks one rank's share (--effective-batch 96 over 2 ranks: 48); the message names the 96 the user typed."""
    from autotune.errors import AutotuneError
    from autotune.tuner.constraints import check_effective_batch, parse_constraint

    pins = {"batch_size": parse_constraint("batch_size=32")}
    with pytest.raises(AutotuneError, match=re.escape("--effective-batch 96 (48 per rank) is not a multiple of batch_size 32")):
        check_effective_batch(48, None, constraints=pins, ranks=2)
    with pytest.raises(AutotuneError, match=re.escape("--effective-batch 128 (64 per rank) is larger than the 50 training images of a rank")):
        check_effective_batch(64, 50, ranks=2)


def test_an_out_holding_a_study_without_trials_says_what_it_holds(tmp_path) -> None:
    """A search stopped before its first trial keeps its study; another study there is refused, and told how to go on."""
    import optuna

    from autotune.errors import AutotuneError
    from autotune.tuner.study_files import check_one_study

    out = tmp_path / "out"
    out.mkdir()
    optuna.create_study(study_name="earlier-eb128", storage=f"sqlite:///{out / 'study.db'}")
    with pytest.raises(AutotuneError, match=r"holds study 'earlier-eb128', stopped before its first trial: pass another --out, "
                       r"--study earlier-eb128 to continue it, or remove .*study.db to start afresh"):
        check_one_study(out, "resnet18-32px-cpu")
    check_one_study(out, "earlier-eb128")  # its own rerun goes on
    # A name that is no shell word is quoted: pasted, `$(...)` ran and a space split it.
    optuna.delete_study(study_name="earlier-eb128", storage=f"sqlite:///{out / 'study.db'}")
    optuna.create_study(study_name="my $(study)", storage=f"sqlite:///{out / 'study.db'}")
    with pytest.raises(AutotuneError, match=r"--study 'my \$\(study\)' to continue it"):
        check_one_study(out, "resnet18-32px-cpu")


def test_a_file_given_as_the_cache_dir_is_named_as_such(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    code, output, out = run(tmp_path, blocker)
    assert code == 1 and one_line(output) == f"error: --cache-dir {blocker} is not a directory" and not out.exists()


def test_a_default_cache_that_cannot_be_written_says_what_to_pass_not_a_flag_never_typed(tmp_path, monkeypatch) -> None:
    """An unwritable HOME: `--cache-dir ~/.cache/autotune cannot be created: ...`, naming a flag the user never passed
    and no way out."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("AUTOTUNE_CACHE", str(blocker / "cache"))
    result = runner.invoke(app, ["search", "--model", "resnet18", "--trials", "1", "--device", "cpu", "--out", str(tmp_path / "out")])
    line = one_line(result.output)
    assert result.exit_code == 1 and line.startswith("error: the synthetic JPEGs' default cache ($AUTOTUNE_CACHE) ") and "--cache-dir" not in \
        line.split(";")[0] and line.endswith("; pass --cache-dir DIR to write them elsewhere, or --data DIR for your own images"), line


@pytest.mark.parametrize("name", ["best.json", "train.py", "trials.csv", "study.db"])  # study.db: sqlite's "unable to open database file"
def test_a_result_file_that_is_a_directory_is_refused_before_anything_runs(tmp_path, cache_dir, name) -> None:
    """Its atomic rename failed only after the calibration, the trials and the confirmation, naming a temporary file."""
    from autotune.errors import StorageError
    from autotune.tuner import SearchConfig, run_search

    out = tmp_path / "out"
    (out / name).mkdir(parents=True)
    ran: list[object] = []

    def runner(*args, **kwargs):
        ran.append(args)
        raise AssertionError("no trial may run")

    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, out=out,
                          cache_dir=cache_dir, synthetic_images=64)
    with pytest.raises(StorageError, match=f"^{re.escape(str(out / name))} exists and is not a regular file: "):
        run_search(config, runner=runner)
    assert not ran and sorted(p.name for p in out.iterdir()) == [name]


@pytest.mark.parametrize("link", ["dangling", "loop"])
def test_an_out_that_is_a_broken_symbolic_link_is_named_as_such(tmp_path, cache_dir, link) -> None:
    """Before: `error: [Errno 17] File exists: 'OUT'` (mkdir of a link that leads nowhere)."""
    out = tmp_path / "out"
    if link == "dangling":
        out.symlink_to(tmp_path / "gone" / "results")
    else:
        out.symlink_to(tmp_path / "other")
        (tmp_path / "other").symlink_to(out)
    result = runner.invoke(app, ["search", "--model", "resnet18", "--image-size", "32", "--device", "cpu", "--out", str(out),
                                 "--cache-dir", str(cache_dir), "--synthetic-images", "64"])
    target = tmp_path / ("gone/results" if link == "dangling" else "other")
    assert result.exit_code == 1 and one_line(result.output) == (
        f"error: --out {out} is a symbolic link to {target}, which leads to no directory: create its target or pass another --out")
    assert out.is_symlink() and not (tmp_path / "gone").exists()


def test_an_out_below_a_broken_symbolic_link_is_named_as_such(tmp_path, cache_dir) -> None:
    """``--out link/sub`` with ``link`` leading nowhere: before, `error: [Errno 17] File exists: '.../link'`."""
    (tmp_path / "link").symlink_to(tmp_path / "gone")
    out = tmp_path / "link" / "sub" / "out"
    result = runner.invoke(app, ["search", "--model", "resnet18", "--image-size", "32", "--device", "cpu", "--out", str(out),
                                 "--cache-dir", str(cache_dir), "--synthetic-images", "64"])
    assert result.exit_code == 1 and one_line(result.output) == (
        f"error: --out {out} cannot be created: {tmp_path / 'link'} is a symbolic link to {tmp_path / 'gone'}, which leads "
        "to no directory: create its target or pass another --out")
    assert not (tmp_path / "gone").exists()


def test_a_refused_storage_search_creates_no_study(tmp_path, cache_dir) -> None:
    import optuna

    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result = runner.invoke(app, ["search", "--model", "resnet18", "--image-size", "32", "--device", "cpu",
                                 "--storage", storage, "--out", str(blocker), "--cache-dir", str(cache_dir),
                                 "--synthetic-images", "64"])
    assert result.exit_code == 1 and "is not a directory" in one_line(result.output)
    assert not (tmp_path / "shared.db").exists() or not optuna.get_all_study_names(storage)


def test_set_choices_stay_choices(tmp_path, cache_dir) -> None:
    """--set num_workers=2,8 samples 2 and 8 only, never 3-7."""
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.constraints import parse_constraint

    def runner_(setup, workload, options=None, *, on_window=None):
        return TrialResult(status="ok", samples_per_s=100.0 + setup.num_workers, windows=(1.0,), peak_memory_bytes=2**20)

    config = SearchConfig(model="resnet18", trials=14, image_size=32, device="cpu", trial_seconds=1.0, sampler="random",
                          out=tmp_path / "out", cache_dir=cache_dir, synthetic_images=64, confirm_rounds=1,
                          constraints=(parse_constraint("num_workers=2,8"), parse_constraint("prefetch=1,4")))
    outcome = run_search(config, runner=runner_)
    searched = [r.setup for r in outcome.records if r.role != "defaults"]
    assert {s.num_workers for s in searched} <= {2, 8}
    assert {s.prefetch_factor for s in searched} <= {1, 4}
    assert {s.num_workers for s in searched} == {2, 8}  # both choices are sampled


def test_recorded_command_keeps_global_options_and_hides_passwords() -> None:
    from autotune.redact import recorded_command

    argv = ["/venv/bin/autotune", "--debug", "search", "--storage", "postgresql://me:s3cret@db:5432/optuna", "-n", "5"]
    assert recorded_command(argv) == "autotune --debug search --storage 'postgresql://me:***@db:5432/optuna' -n 5"
    assert recorded_command(["/x/autotune/__main__.py", "search", "--model", "resnet18"]) == "autotune search --model resnet18"
    assert recorded_command(["/venv/bin/pytest", "-k", "search"]) == ""  # not started as autotune
    assert recorded_command(["/x/autotune/cli.py", "search", "--trials", "3"]) == "autotune search --trials 3"  # python -m autotune.cli
    assert recorded_command(["/x/tools/cli.py", "search"]) == ""  # another program's cli.py


@pytest.mark.parametrize(("text", "hidden"), [
    # SQLAlchemy reads a password with a space or a quote: the redaction stopped at the space, and at the quote.
    (["--storage", "postgresql://me:p ss@db/x"], "autotune search --storage 'postgresql://me:***@db/x'"),
    (["--storage", "postgresql://me@db/x?password=ab'cd&sslmode=require", "--study", "team@v2"],
     "autotune search --storage 'postgresql://me@db/x?password=***&sslmode=require' --study team@v2"),
    ("cannot open study storage 'postgresql://me:p ss@db:1/x': (psycopg.OperationalError) refused",
     "cannot open study storage 'postgresql://me:***@db:1/x': (psycopg.OperationalError) refused"),
    ("""cannot open study storage "postgresql://me:ab' cd@db:1/x": refused""", 'cannot open study storage "postgresql://me:***@db:1/x": refused'),
    ("""cannot open study storage "postgresql://me@db:1/x?password=ab'cd": refused""",
     'cannot open study storage "postgresql://me@db:1/x?password=***": refused'),
    # an '@' left unencoded in the password (refused, naming the URL): up to the last '@' before the host
    ("cannot open 'postgresql://u:p@ss9Q@127.0.0.1:1/db': more than one '@'", "cannot open 'postgresql://u:***@127.0.0.1:1/db': more than one '@'"),
    ("lost postgresql://me:pw@db/x and postgresql://b:pw@h2/y", "lost postgresql://me:***@db/x and postgresql://b:***@h2/y"),
    # a host and port, not a password: nothing hidden up to a later '@' (train.py's header lost `5432/optuna --study team`)
    ("autotune search --storage postgresql://db:5432/optuna --study team@v2", "autotune search --storage postgresql://db:5432/optuna --study team@v2"),
    ("cannot open 'postgresql://db:5432/x': ask admin@example.com", "cannot open 'postgresql://db:5432/x': ask admin@example.com"),
    ("postgresql://db:5432/x\nask admin@example.com", "postgresql://db:5432/x\nask admin@example.com"),
])
def test_every_password_sqlalchemy_reads_is_hidden(text: str | list[str], hidden: str) -> None:
    from autotune.redact import hide_passwords, hide_url_password, recorded_command

    said = recorded_command(["/venv/bin/autotune", "search", *text]) if isinstance(text, list) else hide_passwords(text)
    assert said == hidden
    # One whole URL, as a study names its storage in every message: exact, whatever its password holds.
    assert hide_url_password("postgresql://me:a b\t'c\"@d@db:5432/x?sslpassword=e f&sslmode=require") == (
        "postgresql://me:***@db:5432/x?sslpassword=***&sslmode=require")
    assert hide_url_password("postgresql://db:5432/x") == "postgresql://db:5432/x"


def test_the_python_api_s_recorded_command_names_the_arguments_given() -> None:
    """best.json of an autotune.search() from a notebook read `python: autotune.search() in ipykernel_launcher.py`:
    two searches could not be told apart, nor one run again from its record."""
    from autotune.redact import recorded_call

    def search(workload=None, *, trials=30, out="autotune-out", storage=None, reporter=None, progress=False):  # type: ignore[no-untyped-def]
        return recorded_call(search, locals())

    said = search(pathlib.Path.home, trials=10, out=pathlib.Path("runs/a b"), storage="postgresql://me:s3cret@db/optuna",
                  progress=True)
    assert said.startswith("python: autotune.search(workload='pathlib:Path.home', trials=10, out='runs/a b', "
                           "storage='postgresql://me:***@db/optuna') in "), said
    assert search().startswith("python: autotune.search() in ")


def test_a_recorded_command_with_a_line_break_in_a_path_reads_back_in_a_shell_as_typed(tmp_path) -> None:
    """--out 'nl<LF>out': shlex.quote kept the line break raw, so best.json's command and train.py's header broke
    across two lines, and the command pasted back named another directory."""
    import subprocess

    from autotune.redact import recorded_command, shell_quote

    command = recorded_command(["/venv/bin/autotune", "search", "--out", "nl\nout", "--data", "it's\tx", "--study", "a b"])
    assert command == "autotune search --out $'nl\\nout' --data $'it\\'s\\tx' --study 'a b'" and "\n" not in command
    for word in ("nl\nout", "it's\tx", "back\\slash\n\x01", "plain", "a b"):
        said = subprocess.run(["bash", "-c", f"printf %s {shell_quote(word)}"], capture_output=True, text=True, check=True).stdout
        assert said == word, (word, shell_quote(word))


def test_passwords_never_reach_best_json_train_py_or_messages(tmp_path, cache_dir) -> None:
    from autotune.errors import StorageError
    from autotune.records import TrialResult
    from autotune.tuner import SearchConfig, run_search
    from autotune.tuner.study import SearchStudy

    def runner_(setup, workload, options=None, *, on_window=None):
        return TrialResult(status="ok", samples_per_s=100.0 + setup.batch_size, windows=(1.0,), peak_memory_bytes=2**20)

    command = "autotune search --storage postgresql://me:s3cret@db/optuna"
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, out=tmp_path / "out",
                          cache_dir=cache_dir, synthetic_images=64, confirm_rounds=1, command=command)
    run_search(config, runner=runner_)
    for name in ("best.json", "train.py"):
        text = (tmp_path / "out" / name).read_text()
        assert "s3cret" not in text and "postgresql://me:***@db/optuna" in text
    with pytest.raises(StorageError) as caught:
        SearchStudy.open("postgresql+nosuchdriver://me:s3cret@localhost:1/db", "x")
    assert "s3cret" not in str(caught.value) and "me:***@localhost" in str(caught.value)
    with pytest.raises(StorageError, match=r"me:\*\*\*@localhost.*: write postgresql:// ") as caught:
        SearchStudy.open("postgres://me:s3cret@localhost:1/db", "x")  # a common spelling SQLAlchemy lacks
    assert "s3cret" not in str(caught.value)


def test_status_of_a_shared_workers_directory_asks_for_its_storage(tmp_path) -> None:
    from autotune.errors import StorageError
    from autotune.tuner.study_files import storage_of

    (tmp_path / "trials.csv").write_text("trial\n")  # a worker's --out, or a lone search's whose study.db was removed: no best.json tells
    with pytest.raises(StorageError, match=r"study.db is missing; it was removed or moved \(put it back\), or the search kept its study "
                                           r"in a --storage \(pass that --storage URL --study NAME\)$"):
        storage_of(tmp_path, None)
    with pytest.raises(StorageError, match="run `autotune search --out"):
        storage_of(tmp_path / "empty", None)



def test_status_of_a_directory_whose_study_db_was_removed_says_so(tmp_path) -> None:
    import dataclasses

    from test_emit import make_best

    from autotune.errors import StorageError
    from autotune.output.best import write_best
    from autotune.tuner.study_files import storage_of

    (tmp_path / "trials.csv").write_text("trial\n")
    best = make_best(tmp_path, command="autotune search --model resnet18 --out out")
    write_best(tmp_path / "best.json", best)  # a search that kept its study in out/study.db, since removed
    with pytest.raises(StorageError, match=r"study.db is missing, yet the search of .*best.json kept its study there .*removed or moved"):
        storage_of(tmp_path, None)
    write_best(tmp_path / "best.json", dataclasses.replace(best, command=best.command + " --storage postgresql://db/optuna"))
    with pytest.raises(StorageError, match="its search kept the study in its --storage; pass --storage postgresql://db/optuna --study NAME$"):
        storage_of(tmp_path, None)
    # The command names where (a helper's journal study: the line said only "pass that --storage URL --study NAME").
    journal = dataclasses.replace(best, command=best.command + " --storage 'journal:///tmp/my runs/s.log' --study s1", study="s1")
    write_best(tmp_path / "best.json", journal)
    with pytest.raises(StorageError, match=r"; pass --storage 'journal:///tmp/my runs/s\.log' --study s1$"):
        storage_of(tmp_path, None)
    hidden = dataclasses.replace(best, command=best.command + " --storage 'postgresql://me:***@db/x'", study="s1")
    write_best(tmp_path / "best.json", hidden)
    with pytest.raises(StorageError, match=r"--storage 'postgresql://me:\*\*\*@db/x' --study s1 \(best.json hides its password: put it back\)$"):
        storage_of(tmp_path, None)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: [d], "must hold a JSON object, not a list"),
        (lambda d: {**d, "schema": 2}, "has schema 2; this autotune reads the integer schema 1"),
        (lambda d: {k: v for k, v in d.items() if k != "schema"}, "this JSON file is not a best.json of autotune"),
        (lambda d: {**d, "notes": "abc"}, "field 'notes' must be a list, not a string"),
        (lambda d: {**d, "notes": [1]}, "'notes' must be a list of strings"),
        (lambda d: {**d, "workload": "resnet18"}, "field 'workload' must be an object, not a string"),
        (lambda d: {**d, "setup": []}, "field 'setup' must be an object, not a list"),
        (lambda d: {**d, "samples_per_s": "fast"}, "field 'samples_per_s' must be a number, not a string"),
        (lambda d: {**d, "speedup": True}, "field 'speedup' must be a number or null, not a boolean"),
        (lambda d: {**d, "effective_batch": 32.5}, "field 'effective_batch' must be a whole number, not 32.5"),  # "number, not a number"
        (lambda d: {**d, "world_size": {}}, "field 'world_size' must be a whole number, not an object"),
        (lambda d: {**d, "extra": 1}, "unknown fields: extra"),
        (lambda d: {**d, "confirmed": "yes"}, "field 'confirmed' must be"),
        (lambda d: {k: v for k, v in d.items() if k != "lr"}, "lacks the field 'lr'"),
        (lambda d: {**d, "lr": -1}, "field 'lr' must be > 0, got -1"),  # hand-edited: reached train.py's default
        (lambda d: {**d, "effective_batch": 0}, "field 'effective_batch' must be >= 1, got 0"),
        (lambda d: {**d, "world_size": 100000}, "field 'world_size' must be <= 1024, got 100000: the processes on one machine"),
        (lambda d: {**d, "workload": {**d["workload"], "sys_path": "/x"}}, "'workload.sys_path' must be a list"),
        # A Task's only (earlier versions wrote null there); the classifier's names the field.
        (lambda d: {**d, "workload": {**d["workload"], "image_size": None}}, "field 'workload.image_size' must be a whole number, not null"),
        (lambda d: {**d, "samples_per_s": float("nan")}, "field 'samples_per_s' must be a finite number, not nan"),  # status printed it
        (lambda d: {**d, "speedup": float("inf")}, "field 'speedup' must be a finite number, not inf"),
        # A million loader workers: the emitted script hung without a word.
        (lambda d: {**d, "setup": {**d["setup"], "num_workers": 1_000_000}}, "num_workers must be <= 1024, got 1000000"),
        # A knob left out took its default: train.py's header claimed the measured speed for batch 32, never measured.
        (lambda d: {**d, "setup": {k: v for k, v in d["setup"].items() if k != "batch_size"}}, "lacks the field 'setup.batch_size'"),
        (lambda d: {**d, "setup": {k: v for k, v in d["setup"].items() if k != "num_workers"}}, "lacks the field 'setup.num_workers'"),
        (lambda d: {**d, "workload": {k: v for k, v in d["workload"].items() if k != "model"}}, "lacks the field 'workload.model'"),
        # A probe's hand edits read "must be number, not a number", "'<' not supported", "Workload.__init__() got ...".
        (lambda d: {**d, "schema": 1.0}, "has schema 1.0; this autotune reads the integer schema 1"),
        (lambda d: {**d, "workload": {**d["workload"], "zzz": 1}}, "unknown fields: workload.zzz"),
        (lambda d: {**d, "workload": {**d["workload"], "images": "x"}}, "field 'workload.images' must be a whole number or null, not a string"),
        (lambda d: {**d, "workload": {**d["workload"], "model": 5}}, "field 'workload.model' must be a string, not a number"),
        # '<' not supported between instances of 'str' and 'int', naming no field; others were taken and train.py written.
        (lambda d: {**d, "workload": {**d["workload"], "reference_batch": "x"}}, "'workload.reference_batch' must be a whole number or null"),
        (lambda d: {**d, "workload": {**d["workload"], "lr": "x"}}, "field 'workload.lr' must be a number, not a string"),
        (lambda d: {**d, "workload": {**d["workload"], "iterable": "no"}}, "field 'workload.iterable' must be true or false, not a string"),
        (lambda d: {**d, "workload": {**d["workload"], "batch_norm": 1}}, "field 'workload.batch_norm' must be true, false or null, not a number"),
    ],
)
def test_bad_best_json_is_one_line_in_emit_and_load_setup(tmp_path, cache_dir, change, message) -> None:
    import json

    from autotune.errors import AutotuneError
    from autotune.output.best import Best, read_best
    from autotune.records import Workload
    from autotune.train_setup import TrainSetup

    good = Best(setup=TrainSetup(), workload=Workload(model="resnet18"), samples_per_s=1.0, samples_per_s_spread=0.0,
                defaults_samples_per_s=1.0, speedup=1.0, peak_memory_bytes=None, effective_batch=32,
                reference_batch=32, lr=1e-3).to_dict()
    (tmp_path / "best.json").write_text(json.dumps(change(good)))
    with pytest.raises(AutotuneError, match=message.replace("(", r"\(")):
        read_best(tmp_path)
    result = runner.invoke(app, ["emit", str(tmp_path)])
    assert result.exit_code == 1 and message in one_line(result.output)
    if "'setup." in message:
        with pytest.raises(AutotuneError, match=message):
            autotune.load_setup(tmp_path)


def test_a_best_json_that_is_a_fifo_or_a_device_is_refused_not_read(tmp_path) -> None:
    """`autotune emit DIR` whose best.json was a FIFO waited for a writer for good; one linked to /dev/zero was read until
    the kernel killed the process. Neither is a file a search wrote."""
    import os

    from autotune.errors import AutotuneError, SetupError
    from autotune.output.best import read_best
    from autotune.train_setup import load_setup

    os.mkfifo(tmp_path / "best.json")
    with pytest.raises(AutotuneError, match=r"best.json: not a regular file \(a FIFO, a device or a socket\)$"):
        read_best(tmp_path)
    with pytest.raises(SetupError, match=r"not a regular file"):
        load_setup(tmp_path / "best.json")
    (tmp_path / "best.json").unlink()
    (tmp_path / "best.json").symlink_to("/dev/zero")
    result = runner.invoke(app, ["emit", str(tmp_path)])
    assert result.exit_code == 1 and one_line(result.output).endswith("best.json: not a regular file (a FIFO, a device or a socket)")


def test_a_best_json_with_a_byte_order_mark_reads_as_any_other(tmp_path) -> None:
    """Saved by an editor that writes a UTF-8 byte-order mark (Windows Notepad): refused before as `Unexpected UTF-8 BOM`."""
    from autotune.output.best import Best, read_best
    from autotune.records import Workload
    from autotune.train_setup import TrainSetup

    best = Best(setup=TrainSetup(batch_size=64), workload=Workload(model="resnet18"), samples_per_s=1.0, samples_per_s_spread=0.0,
                defaults_samples_per_s=1.0, speedup=1.0, peak_memory_bytes=None, effective_batch=64, reference_batch=32, lr=1e-3)
    (tmp_path / "best.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(best.to_dict()).encode())
    assert read_best(tmp_path) == best and autotune.load_setup(tmp_path).batch_size == 64
    result = runner.invoke(app, ["emit", str(tmp_path)])
    assert result.exit_code == 0 and (tmp_path / "train.py").exists(), result.output


def test_a_best_json_written_before_the_confirmed_field_reads_it_from_its_notes(tmp_path) -> None:
    import json

    from autotune.output.best import Best, read_best
    from autotune.records import Workload
    from autotune.train_setup import TrainSetup

    best = Best(setup=TrainSetup(), workload=Workload(model="resnet18"), samples_per_s=1.0, samples_per_s_spread=0.0,
                defaults_samples_per_s=1.0, speedup=1.0, peak_memory_bytes=None, effective_batch=32, reference_batch=32, lr=1e-3)
    for notes, confirmed in (([], True), (["not confirmed: the search was interrupted before the interleaved re-measurement"], False)):
        older = {k: v for k, v in best.to_dict().items() if k != "confirmed"}
        (tmp_path / "best.json").write_text(json.dumps({**older, "notes": notes}))
        assert read_best(tmp_path / "best.json").confirmed is confirmed


def test_best_json_has_an_image_size_for_the_classifier_only_and_reads_back_old_and_new_files(tmp_path) -> None:
    """A Task's data is its own: its best.json names no image size or synthetic data; the classifier's does. Files written either way read back."""
    import json

    from autotune.output.best import Best, read_best, write_best
    from autotune.records import Workload
    from autotune.train_setup import TrainSetup, load_setup

    setup = TrainSetup(batch_size=16, amp="bf16")
    task = Workload(model="mytasks:make", task="mytasks:make", images=500, image_input=False)
    classifier = Workload(model="resnet18", image_size=64)
    for workload in (task, classifier):
        best = Best(setup=setup, workload=workload, samples_per_s=1.0, samples_per_s_spread=0.0, defaults_samples_per_s=1.0, speedup=1.0,
                    peak_memory_bytes=None, effective_batch=16, reference_batch=32, lr=1e-3)
        write_best(tmp_path / "best.json", best)
        written = json.loads((tmp_path / "best.json").read_text())["workload"]
        for name in ("image_size", "data", "synthetic_images", "cache_dir"):
            assert (name in written) is (workload.task is None), name
        assert written.get("image_size", 64) == 64
        assert read_best(tmp_path).workload == workload and load_setup(tmp_path / "best.json") == setup
        # Written by an earlier version: a Task's best.json carried the unused default (224); a null reads as well.
        earlier = {"image_size": 224, "data": None, "synthetic_images": 2000, "cache_dir": None}
        for older in ({**written, **earlier}, {**written, "image_size": None}) if workload.task else ():
            (tmp_path / "best.json").write_text(json.dumps({**best.to_dict(), "workload": older}))
            assert read_best(tmp_path).workload == workload and load_setup(tmp_path / "best.json") == setup


def test_load_setup_refuses_another_schema(tmp_path) -> None:
    import json

    from autotune.errors import SetupError
    from autotune.train_setup import TrainSetup, load_setup

    for schema in (2, 1.0, True):  # 1.0 and true read as 1 here and were refused by load_best
        (tmp_path / "best.json").write_text(json.dumps({"schema": schema, "setup": TrainSetup().to_dict()}))
        with pytest.raises(SetupError, match=f"schema {schema!r}"):
            load_setup(tmp_path / "best.json")


def test_train_py_header_names_the_factory_it_imports(tmp_path) -> None:
    from autotune.output.best import Best
    from autotune.output.emit import write_script
    from autotune.records import Workload
    from autotune.train_setup import TrainSetup

    best = Best(setup=TrainSetup(), workload=Workload(model="mypkg.nets:build"), samples_per_s=1.0,
                samples_per_s_spread=0.0, defaults_samples_per_s=1.0, speedup=1.0, peak_memory_bytes=None,
                effective_batch=32, reference_batch=32, lr=1e-3)
    header = write_script(best, tmp_path / "train.py").read_text().split('"""')[0]
    assert "# Model: imports mypkg.nets:build (module:function)" in header


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trials": "3"}, "^trials must be an integer, got '3'"),
        ({"trials": 2.5}, "^trials must be an integer, got 2.5"),
        ({"seed": "abc"}, "^seed must be an integer"),
        ({"effective_batch": "64"}, "^effective_batch must be an integer"),
        ({"trial_seconds": "x"}, "^trial_seconds must be a number, got 'x'"),
        ({"timeout_s": "9"}, "^timeout_s must be a number"),
        ({"timeout_s": 1.0, "trial_seconds": 1.0}, "^timeout_s 1 must be longer than trial_seconds 1"),
        ({"trials": None}, "^trials must be an integer, got None"),
        ({"trials": 0}, "^trials must be between 1 and"),
        ({"constraints": ["amp=xx"]}, "^constraints amp: expected one of off, bf16, fp16, got 'xx'"),
        ({"lr": 0.5, "model": None, "workload": "task_factories:good"}, "^lr: for the classifier shorthand only"),
        ({"model": 18}, "^model must be a string, got 18"),
        ({"study": 3}, "^study must be a string, got 3"),
        ({"devices": 2}, "^devices must be a string, got 2"),
        ({"data": 7}, "^data must be a path \\(a str or os.PathLike\\), got 7"),
        ({"cache_dir": b"cache"}, "^cache_dir must be a path \\(a str or os.PathLike\\), got b'cache'"),
        ({"out": None}, "^out must be a path \\(a str or os.PathLike\\), got None"),
        ({"out": ""}, "^out must not be empty \\(write . for the current directory\\)"),  # it wrote into the cwd
        ({"sampler": None}, "^sampler must be a string, got None"),  # AttributeError: 'NoneType' ... 'lower'
        ({"constraints": None}, "^constraints must be a list of strings such as 'amp=bf16', got None"),
        ({"constraints": ["amp=off", 3]}, "^constraints must be a list of strings such as 'amp=bf16', got 3 in it"),
        ({"reporter": 3}, "^reporter must have the methods of autotune\\.tuner\\.Reporter .*; int lacks message, trial_started"),
        ({"reporter": print}, "lacks message, trial_started, trial_finished, confirm_progress$"),
        ({"ceilings": "no"}, "^ceilings must be True or False, got 'no'"),
        ({"progress": "x"}, "^progress must be True or False, got 'x'"),
        ({"max_memory": [1]}, "^max_memory must be bytes \\(an integer\\) or a size such as '20GiB', got \\[1\\]"),
        ({"max_memory": True}, "^max_memory must be bytes \\(an integer\\) or a size such as '20GiB', got True"),
    ],
)
def test_the_python_api_refuses_wrong_types_before_writing_anything(tmp_path, kwargs, message) -> None:
    """What Typer parses on the command line reaches the API as any Python value: one AutotuneError, no directory.

    The refusal names the function's parameters, which the caller wrote, not the CLI's flags."""
    import autotune

    with pytest.raises(autotune.errors.UsageError, match=message) as raised:
        autotune.search(**{"model": "resnet18", "trials": 2, "device": "cpu", "out": tmp_path / "out", **kwargs})
    assert "--" not in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_the_python_api_words_pins_and_reruns_as_a_caller_writes_them() -> None:
    """A Task's pickling refusal read "or pass constraints num_workers=0" (``--set`` swapped word for word), and its
    storage errors "rerun the same command" to a caller who ran no command."""
    from autotune.errors import UsageError, in_python_terms

    said = in_python_terms(UsageError("make it picklable, or pass --set num_workers=0; --out x is in use: rerun the same command"),
                           {"constraints", "out"}, {"set": "constraints"})
    assert str(said) == 'make it picklable, or pass constraints=["num_workers=0"]; out x is in use: rerun the same call'
    assert str(in_python_terms(UsageError("pass --set amp=off"), {"out"}, {"set": "constraints"})) == "pass --set amp=off"
    for said, worded in (("--set amp=fp16: needs CUDA", 'constraints=["amp=fp16"]: needs CUDA'),
                         ("pass --set num_workers=0.", 'pass constraints=["num_workers=0"].'),
                         ("--set amp=off,bf16 (both)", 'constraints=["amp=off,bf16"] (both)')):
        assert str(in_python_terms(UsageError(said), {"constraints"}, {"set": "constraints"})) == worded


def test_the_python_api_names_its_parameters_in_storage_errors_too(tmp_path) -> None:
    """A probe's search(out='/proc/x') read "StorageError: --out /proc/x cannot be created": a flag the caller never typed."""
    import autotune

    with pytest.raises(autotune.errors.StorageError, match="^out /proc/autotune-x cannot be created: /proc is not writable") as raised:
        autotune.search(model="resnet18", trials=2, device="cpu", out="/proc/autotune-x")
    assert "--" not in str(raised.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nproc_per_node": "2"}, "^nproc_per_node must be an integer, got '2'"),
        ({"nproc_per_node": 2.5}, "^nproc_per_node must be an integer, got 2.5"),
        ({"data": 7}, "^data must be a path \\(a str or os.PathLike\\), got 7"),
        ({"cache_dir": 7}, "^cache_dir must be a path \\(a str or os.PathLike\\), got 7"),
        ({"announce": 3}, "^announce must be a function called with one line, got int"),
        ({"model": 5}, "^model must be a string, got 5"),  # TypeError: argument of type 'int' is not iterable
        ({"task_batch": "no"}, "^task_batch must be True or False, got 'no'"),
        ({"max_memory": [1]}, "^max_memory must be bytes \\(an integer\\) or a size such as '20GiB', got \\[1\\]"),
        ({"max_memory": True}, "^max_memory must be bytes \\(an integer\\) or a size such as '20GiB', got True"),
    ],
)
def test_a_trial_refuses_wrong_types_in_one_line(kwargs, message) -> None:
    import autotune

    with pytest.raises(autotune.errors.UsageError, match=message) as raised:
        autotune.trial(**{"model": "resnet18", "device": "cpu", **kwargs})
    assert "--" not in str(raised.value)


def test_the_cli_refusals_keep_naming_its_flags(tmp_path) -> None:
    """The CLI calls the same functions; its users typed flags, so its refusals name them."""
    for args, message in (
        (["search", "--trials", "0", "--out", str(tmp_path / "out")], "--trials must be between 1 and"),
        (["search", "--model", "resnet18", "--set", "amp=xx", "--out", str(tmp_path / "out")], "--set amp: expected one of"),
        (["trial", "--trial-seconds", "0"], "--trial-seconds must be >= 0.5"),
        (["trial", "--image-size", "-1"], "error: the image size (--image-size) must be an integer >= 8, got -1"),  # it named no option
        (["trial", "--timeout", "2", "--trial-seconds", "3"], "--timeout 2 must be longer than --trial-seconds 3"),
    ):
        result = runner.invoke(app, [*args, "--device", "cpu"])
        assert result.exit_code == 2, result.output
        assert message in result.output, result.output


@pytest.mark.parametrize("value", ["1_0", "\u0668", "8.0", "0x10"])
@pytest.mark.parametrize("flag", ["--batch-size", "--workers", "--accum", "--trials", "--image-size", "--seed"])
def test_an_integer_flag_takes_ascii_digits_only(tmp_path, flag: str, value: str) -> None:
    """int() reads 1_0 as 10 and other scripts' digits as numbers: a typo would pin 10 workers. Every integer flag
    refuses them in one line before anything runs."""
    command = "search" if flag in ("--trials", "--seed") else "trial"
    result = runner.invoke(app, [command, flag, value, "--device", "cpu", *(["--out", str(tmp_path / "out")] if command == "search" else [])])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{flag}'" in result.output and f": expected an integer, got {value!r}" in result.output, result.output
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", ["1_0", "\u0668", "abc", "5s"])
@pytest.mark.parametrize(("command", "flag"), [("trial", "--trial-seconds"), ("search", "--trial-seconds"), ("trial", "--timeout"),
                                               ("search", "--timeout"), ("search", "--lr")])
def test_a_number_flag_is_refused_in_the_integer_flags_words(tmp_path, command: str, flag: str, value: str) -> None:
    """float() reads 1_0 as 10.0; a word was refused in pydantic's words ("Input should be a valid number, unable to parse
    string as a number") where an integer flag says "expected an integer, got 'abc'"."""
    result = runner.invoke(app, [command, flag, value, "--device", "cpu", *(["--out", str(tmp_path / "out")] if command == "search" else [])])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{flag}'" in result.output and f": expected a number, got {value!r}" in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_api_setup_and_device_arguments_in_other_shapes(tmp_path) -> None:
    import torch

    import autotune
    import probes
    from autotune.devices import resolve_device

    assert resolve_device(torch.device("cpu"), probes.collect()).name == "cpu"  # type: ignore[arg-type]
    for setup in ("best.json", {"batch_size": 8}):
        with pytest.raises(autotune.AutotuneError, match="setup must be an autotune.TrainSetup"):
            autotune.trial(model="resnet18", setup=setup, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(autotune.AutotuneError, match="load_setup takes the path of a best.json, got NoneType"):
        autotune.load_setup(None)  # type: ignore[arg-type]
    with pytest.raises(autotune.AutotuneError, match="^load_setup takes the path of a best.json, got an empty path$"):
        autotune.load_setup("")  # it read the working directory's best.json
    with pytest.raises(autotune.AutotuneError, match="^load_best takes the path of a best.json, got an empty path$"):
        autotune.load_best("")  # so did it
    with pytest.raises(autotune.AutotuneError, match=f"{tmp_path / 'best.json'}: no such file"):
        autotune.load_setup(tmp_path)  # a search's directory: its best.json


@pytest.mark.parametrize(("name", "text"), [("train.py", "print('my own training')\n"), ("best.json", '{"lr": 0.1, "acc": 0.93}\n'),
                                             ("report.html", "<html>my own page</html>\n"), ("report-history.png", "my own plot\n")])
def test_an_out_holding_the_users_own_train_py_best_json_or_report_is_refused_before_anything_runs(tmp_path, cache_dir, name, text) -> None:
    """An --out whose train.py (wherever), or, where no search wrote (no study.db, no trials.csv), best.json, report.html
    or a report-*.png autotune did not write: the winner's script would meet it only after the whole search, and the search replaced the
    other two with its results at the end, without a word. Its own files are rewritten by a rerun."""
    from autotune.errors import EmitError, StorageError
    from autotune.tuner import SearchConfig, run_search

    ran = []

    def runner_(setup, workload, options=None, *, on_window=None):
        ran.append(setup)
        raise AssertionError("nothing may run")

    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_text(text)
    config = SearchConfig(model="resnet18", trials=2, image_size=32, device="cpu", trial_seconds=1.0, out=out,
                          cache_dir=cache_dir, synthetic_images=64)
    refusal = ((EmitError, r"train.py exists and is not a script written by autotune: not overwritten \(pass another --out\)")
               if name == "train.py" else
               (StorageError, f"{name} exists and was not written by autotune: the search would replace it with its results; move it "
                              "away or pass another --out"))
    with pytest.raises(refusal[0], match=refusal[1]):
        run_search(config, runner=runner_)
    assert ran == [] and (out / name).read_text() == text and not (out / "study.db").exists()
    if name == "train.py":
        return
    from test_emit import make_best

    from autotune.files import check_out
    from autotune.output.best import write_best

    if name == "best.json":  # autotune's own (a copy moved there alone) is no user's file
        write_best(out / name, make_best(tmp_path))
    elif name.endswith(".png"):
        from matplotlib.figure import Figure

        from autotune.output.plots import png

        (out / name).write_bytes(png(Figure()))
        check_out(out, None)
        # An older autotune's PNG (matplotlib's own Software chunk) beside its report.html: its files, not the user's.
        (out / name).write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\x18tEXtSoftware\x00Matplotlib version3.10")
        with pytest.raises(StorageError, match="was not written by autotune"):
            check_out(out, None)
        (out / "report.html").write_text('<!DOCTYPE html>\n<html lang="en"><head><title>autotune report: s</title></head></html>\n')
    else:
        (out / name).write_text('<!DOCTYPE html>\n<html lang="en"><head><title>autotune report: s</title></head></html>\n')
    check_out(out, None)


def test_an_out_holding_another_program_s_sqlite_study_db_is_refused_and_left_as_it_is(tmp_path, cache_dir) -> None:
    """A study.db of the user's own in --out made the search take --out for one it wrote: Optuna added its tables to
    the user's database, and best.json and report.html of the user's were replaced at the end without a word. status
    and report refuse it as before; an explicit --storage naming such a file too."""
    import sqlite3

    out = tmp_path / "out"
    out.mkdir()
    with sqlite3.connect(out / "study.db") as db:
        db.execute("CREATE TABLE mydata (x)")
        db.execute("INSERT INTO mydata VALUES (42)")
    db.close()
    (out / "best.json").write_text('{"my": "own"}\n')
    base = ["--model", "resnet18", "--image-size", "32", "--trials", "2", "--device", "cpu", "--synthetic-images", "64",
            "--cache-dir", str(cache_dir)]
    said = "study.db is an SQLite database without Optuna's tables (tables: mydata); it is left as it is"
    for args in (["--out", str(out)], ["--out", str(tmp_path / "elsewhere"), "--storage", f"sqlite:///{out / 'study.db'}"]):
        result = runner.invoke(app, ["search", *base, *args])
        assert result.exit_code == 1 and said in one_line(result.output), result.output
    with sqlite3.connect(out / "study.db") as db:
        assert [row[0] for row in db.execute("SELECT name FROM sqlite_master")] == ["mydata"]
    db.close()
    assert (out / "best.json").read_text() == '{"my": "own"}\n' and sorted(p.name for p in out.iterdir()) == ["best.json", "study.db"]
    for command in ("status", "report"):
        result = runner.invoke(app, [command, str(out)])
        assert result.exit_code == 1 and "holds no study" in one_line(result.output), result.output
    from autotune.tuner.storage import open_storage

    empty = tmp_path / "empty.db"  # made ready for Optuna (WAL mode), no table yet: Optuna's to fill, as before
    with sqlite3.connect(empty) as db:
        db.execute("PRAGMA journal_mode=WAL")
    db.close()
    assert empty.stat().st_size > 0
    open_storage(f"sqlite:///{empty}")


def test_a_classifier_trial_without_a_batch_size_takes_all_of_fewer_images_as_a_search_defaults_do(tmp_path, monkeypatch) -> None:
    """On 3 images `autotune trial --model ... --data DIR` without --batch-size measures one batch of the 3, as the
    search's defaults trial does; it was refused as `--batch-size 32 x --accum 1 = 32 exceeds the 3 training images`,
    naming a flag never typed. A batch typed is still checked against the data."""
    from PIL import Image

    import autotune.runner
    from autotune.records import TrialResult

    for i in range(3):
        (tmp_path / "data" / f"c{i % 2}").mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (8, 8)).save(tmp_path / "data" / f"c{i % 2}" / f"{i}.jpg")
    batches: list[int] = []
    monkeypatch.setattr(autotune.runner, "prestart", lambda: None)
    monkeypatch.setattr(autotune.runner, "run_trial", lambda setup, workload, options: batches.append(setup.batch_size)
                        or TrialResult(status="ok", samples_per_s=9.0))
    args = ["trial", "--model", "resnet18", "--image-size", "32", "--device", "cpu", "--data", str(tmp_path / "data")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0 and batches == [3], result.output
    result = runner.invoke(app, [*args, "--batch-size", "4"])
    assert result.exit_code == 2 and "--batch-size 4 x --accum 1 = 4 exceeds the 3 training images" in one_line(result.output)


def test_the_synthetic_set_is_sized_for_the_device(tmp_path) -> None:
    """Without --data: 2000 JPEGs on a CPU, 2**14 on CUDA, where an epoch of 2000 held the loader to a few workers
    (an H200, 2026-12-04); --synthetic-images wins on either. Nothing is written (write_data=False), no GPU needed."""
    from autotune.tuner.config import SearchConfig
    from autotune.workloads import build_workload

    def built(device: str, count: int | None = None) -> tuple[int, int | None]:
        workload = build_workload(model="resnet18", image_size=32, data=None, device=device, cache_dir=tmp_path,
                                  synthetic_images=count, write_data=False)
        return workload.synthetic_images, workload.images

    assert built("cpu") == (2000, 2000)
    assert built("cuda:0") == built("cuda") == (16384, 16384)
    assert built("cuda:0", 3000) == (3000, 3000) and built("cpu", 64) == (64, 64)
    assert SearchConfig(model="resnet18", trials=2).synthetic_images is None  # resolved where the device is known
    assert not any(tmp_path.iterdir())


def test_a_search_on_cuda_is_prepared_with_16384_synthetic_images_unless_told(tmp_path, monkeypatch) -> None:
    """The device is resolved in prepare (a fake A100 here, no GPU needed): the workload, the study's signature
    (``samples``) and the JPEGs written all see the resolved count; --synthetic-images wins. A CPU search keeps 2000."""
    from autotune.devices import DeviceInfo
    from autotune.tuner import placement, prepare
    from autotune.tuner.config import SearchConfig
    from autotune.tuner.study import STUDY_SIGNATURE

    a100 = DeviceInfo("cuda:0", True, 80 * 2**30, 80 * 2**30, "A100", tf32=True)
    cpu = DeviceInfo("cpu", True, None, None, "test CPU")
    written: list[int] = []
    monkeypatch.setattr(prepare, "write_synthetic", lambda workload, *args: written.append(workload.synthetic_images))

    class Quiet:
        def message(self, text: str) -> None:
            pass

    def prepared(device: DeviceInfo, out: str, count: int | None = None) -> tuple[int, int]:
        monkeypatch.setattr(placement, "resolve_device", lambda text, hardware: device)
        config = SearchConfig(model="resnet18", image_size=32, trials=2, device=device.name, out=tmp_path / out,
                              cache_dir=tmp_path / "cache", synthetic_images=count)
        ready = prepare.prepare(config, Quiet())
        try:
            return ready.workload.synthetic_images, ready.study.study.user_attrs[STUDY_SIGNATURE]["samples"]
        finally:
            ready.held.close()

    assert prepared(a100, "cuda") == (16384, 16384)
    assert prepared(a100, "cuda-told", 3000) == (3000, 3000)
    assert prepared(cpu, "cpu") == (2000, 2000)
    assert prepared(cpu, "cpu", 2000) == (2000, 2000)  # the rerun of a CPU search that named 2000 resumes the same study
    assert written == [16384, 3000, 2000, 2000]


def test_a_trial_announces_the_synthetic_jpegs_before_it_writes_them(tmp_path, monkeypatch) -> None:
    """`autotune trial` without --data says it writes the synthetic JPEGs (16384 by default on CUDA: a minute or more the
    first time) before writing them, then what it trains; before, the generation ran silently. No trial runs here."""
    import autotune
    import autotune.runner
    from autotune.records import TrialResult

    monkeypatch.setattr(autotune.runner, "prestart", lambda: None)
    monkeypatch.setattr(autotune.runner, "run_trial", lambda setup, workload, options: TrialResult(status="ok", samples_per_s=1.0))
    lines: list[str] = []
    autotune.trial(model="resnet18", image_size=32, device="cpu", cache_dir=tmp_path, synthetic_images=16, announce=lines.append)
    assert len(lines) == 2 and lines[0].startswith(f"writing 16 synthetic JPEGs to {tmp_path / 'synthetic-v1-16'}"), lines
    assert lines[1].startswith("trial: resnet18") and (tmp_path / "synthetic-v1-16" / ".complete").exists()
    lines.clear()
    autotune.trial(model="resnet18", image_size=32, device="cpu", cache_dir=tmp_path, synthetic_images=16, announce=lines.append)
    assert len(lines) == 1 and lines[0].startswith("trial: resnet18")  # written once: nothing more to say


def test_a_trial_with_more_threads_than_cores_says_so(tmp_path, monkeypatch) -> None:
    """`autotune trial --set num_threads=99` on 2 cores ran at 9 samples/s against 200 without a word (train.py and
    configure_torch say it). No trial runs here."""
    import autotune
    import autotune.runner
    from autotune.records import TrialResult
    from probes.cpu import usable_cores

    monkeypatch.setattr(autotune.runner, "prestart", lambda: None)
    monkeypatch.setattr(autotune.runner, "run_trial", lambda setup, workload, options: TrialResult(status="ok", samples_per_s=1.0))
    cores, lines = usable_cores(), []
    common = dict(model="resnet18", image_size=32, device="cpu", cache_dir=tmp_path, synthetic_images=16)
    autotune.trial(setup=autotune.TrainSetup(batch_size=8, num_threads=cores + 1), announce=lines.append, **common)
    assert lines[-1] == (f"warning: num_threads={cores + 1} is more than the {cores} CPU cores this trial may use: the threads "
                         "share them, which slows the step")
    with pytest.warns(UserWarning, match=f"num_threads={cores + 1} is more than the {cores} CPU cores") as warned:
        autotune.trial(setup=autotune.TrainSetup(batch_size=8, num_threads=cores + 1), **common)
    assert warned[0].filename == __file__  # the caller's line, not autotune's wrapper
    lines.clear()
    autotune.trial(setup=autotune.TrainSetup(batch_size=8, num_threads=cores), announce=lines.append, **common)
    assert not any(line.startswith("warning:") for line in lines)


def test_a_temporary_directory_too_long_for_the_workers_sockets_is_refused(tmp_path, monkeypatch) -> None:
    """A job scheduler's deep TMPDIR: multiprocessing's socket under it (pymp-*/listener-*) passed the 107 bytes of a Unix
    socket path and every trial with loader workers hung at its first batch until its timeout. Refused before anything
    is written, unless --set num_workers=0 keeps the workers out."""
    import tempfile

    deep = tmp_path / ("d" * (110 - len(str(tmp_path))))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    cache = tmp_path / "cache"
    code, output, out = run(tmp_path, cache)
    assert code == 2 and one_line(output).startswith(f"error: the temporary directory {deep} is too long for DataLoader workers")
    assert "set TMPDIR to a shorter directory (TMPDIR=/tmp), or pass --set num_workers=0" in output
    assert not out.exists() and not cache.exists()
    trial = CliRunner().invoke(app, ["trial", "--workers", "1", "--prefetch", "2", "--device", "cpu", "--cache-dir", str(cache)])
    assert trial.exit_code == 2 and one_line(trial.output).startswith(f"error: the temporary directory {deep} is too long")
    from autotune.files import check_temp_dir_for_workers

    check_temp_dir_for_workers("/tmp")  # the usual one passes
    check_temp_dir_for_workers("/" + "x" * 74)  # 75 bytes: the socket path is 107
    with pytest.raises(Exception, match="too long"):
        check_temp_dir_for_workers("/" + "x" * 75)


@pytest.mark.parametrize("knob", ["bucket_cap_mb=10", "gradient_as_bucket_view=true", "static_graph=true"])
def test_a_trial_of_one_process_refuses_a_ddp_knob_as_the_search_does(tmp_path, knob) -> None:
    """The search refuses a DDP knob away from PyTorch's default without --nproc-per-node 2 or more; the trial ran it
    (status ok) and a user could take the figure for the knob's effect."""
    result = runner.invoke(app, ["trial", "--model", "resnet18", "--image-size", "32", "--device", "cpu", "--trial-seconds", "1",
                                 "--cache-dir", str(tmp_path / "cache"), "--set", knob])
    name = knob.split("=")[0]
    assert result.exit_code == 2 and one_line(result.output) == (
        f"error: --set {name}: a DDP knob; it changes nothing in a trial of one process (pass --nproc-per-node 2 or more)"), result.output
    assert not (tmp_path / "cache").exists()  # refused before the synthetic JPEGs were written


def test_a_trial_refuses_its_ranks_before_writing_synthetic_jpegs(tmp_path) -> None:
    """``--nproc-per-node 0`` (or more ranks than cores) was refused only after 2000 synthetic JPEGs were written."""
    for ranks, message in (("0", "error: --nproc-per-node must be >= 1, got 0"),
                           ("999", "error: --nproc-per-node 999: only ")):
        result = runner.invoke(app, ["trial", "--model", "resnet18", "--image-size", "32", "--device", "cpu", "--trial-seconds", "1",
                                     "--cache-dir", str(tmp_path / "cache"), "--nproc-per-node", ranks])
        assert result.exit_code == 2 and one_line(result.output).startswith(message), result.output
        assert not (tmp_path / "cache").exists()


def test_the_python_api_takes_numpy_numbers_a_home_relative_out_and_string_constraints(tmp_path, monkeypatch) -> None:
    """What a probe's Python caller met: NumPy numbers (a config read through NumPy or pandas) refused as "must be an
    integer, got np.int64(2)"; out="~/runs/x" made a folder named ~ in the working directory; SearchConfig required
    model and trials for a workload and took constraints as Constraint objects only ('str' object has no attribute
    'knob'); run_search(None) and load_best(None) were Python's AttributeError and TypeError."""
    import numpy as np

    import autotune
    from autotune.tuner.config import path_of
    from autotune.tuner.constraints import parse_constraint

    monkeypatch.setenv("HOME", str(tmp_path))
    assert path_of("--out", "~/runs/x") == tmp_path / "runs" / "x"
    with pytest.raises(autotune.errors.UsageError, match="^--out ~nosuchuser-autotune/x: its ~ names no home directory here"):
        path_of("--out", "~nosuchuser-autotune/x")
    config = autotune.SearchConfig(workload="task_factories:good", trials=np.int64(2), trial_seconds=np.float32(1.7),
                                   timeout_s=np.float64(60), lr=np.float32(0.01), constraints=["amp=off", parse_constraint("batch_size=8")])
    config.validate()
    assert (type(config.trials), type(config.trial_seconds), type(config.timeout_s)) == (int, float, float)
    assert (config.trials, config.trial_seconds, config.timeout_s, config.lr) == (2, 1.7, 60.0, 0.01)  # not 1.7000000476
    assert config.constraints == (parse_constraint("amp=off"), parse_constraint("batch_size=8")) and config.model == "resnet50"
    with pytest.raises(autotune.errors.UsageError, match="^--trials must be an integer, got np.float64\\(2.0\\)"):
        autotune.SearchConfig(trials=np.float64(2.0)).validate()
    with pytest.raises(autotune.errors.UsageError, match="^--set: each constraint is a KNOB=VALUE string \\(amp=bf16\\), got 3"):
        autotune.SearchConfig(constraints=("amp=off", 3)).validate()
    # What autotune.search() takes, its config-object form takes too: str paths and a size text were AttributeError
    # ('str' object has no attribute 'exists') and TypeError tracebacks.
    texts = autotune.SearchConfig(out=str(tmp_path / "o"), cache_dir="~/c", data=str(tmp_path), max_memory="20GiB")
    texts.validate()
    assert (texts.out, texts.cache_dir, texts.data, texts.max_memory) == (tmp_path / "o", tmp_path / "c", tmp_path, 20 * 2**30)
    numpy_budget = autotune.SearchConfig(max_memory=np.int64(2**30))
    numpy_budget.validate()
    assert type(numpy_budget.max_memory) is int and numpy_budget.max_memory == 2**30  # stored as JSON
    from autotune.tuner.config import parse_max_memory  # what autotune.search() and trial() read it with: it refused NumPy's

    assert parse_max_memory(np.int64(2**30)) == 2**30 and parse_max_memory("1GiB") == 2**30 and parse_max_memory(None) is None
    for field, wrong, message in (("max_memory", 1.5, "--max-memory must be bytes"), ("cache_dir", 5, "--cache-dir must be a path"),
                                  ("out", None, "--out must be a path"), ("max_memory", "lots", "not a memory size")):
        with pytest.raises(autotune.errors.UsageError, match=message):
            autotune.SearchConfig(**{field: wrong}).validate()
    for wrong in (None, {"model": "resnet18"}):
        with pytest.raises(autotune.errors.UsageError, match="^run_search takes an autotune.SearchConfig, got "):
            autotune.run_search(wrong)
    with pytest.raises(autotune.errors.UsageError, match="^reporter must have the methods of autotune\\.tuner\\.Reporter"):
        autotune.run_search(config, 5)
    for wrong in (None, 5, b"best.json"):
        with pytest.raises(autotune.AutotuneError, match="^load_best takes the path of a best.json, got "):
            autotune.load_best(wrong)


def test_a_best_json_holding_an_integer_python_will_not_read_is_one_line(tmp_path) -> None:
    """An integer of more than 4300 digits (Python's limit on reading one) escaped json.loads as a ValueError."""
    import autotune

    (tmp_path / "best.json").write_text('{"schema": ' + "9" * 5000 + "}")
    for load in (autotune.load_setup, autotune.load_best):
        with pytest.raises(autotune.AutotuneError, match="best.json: not valid JSON for autotune \\(Exceeds the limit"):
            load(tmp_path)


def test_a_missing_data_directory_is_refused_before_torch_is_imported(tmp_path) -> None:
    """On a busy machine the refusal of a mistyped --data took seconds (up to minutes under load): the model's name was
    checked first, importing torchvision. The folder is checked before, in a process that has not imported torch."""
    import subprocess
    import sys

    code = ("import sys\nfrom autotune.errors import WorkloadError\nfrom autotune.workloads import build_workload\n"
            f"try:\n    build_workload(model='resnet18', image_size=32, data=__import__('pathlib').Path({str(tmp_path / 'gone')!r}), "
            "device='cpu', write_data=False)\nexcept WorkloadError as exc:\n    print(exc)\n"
            "print(sorted(m for m in ('torch', 'torchvision') if m in sys.modules))\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert ran.stdout.splitlines() == [f"data directory {tmp_path / 'gone'} does not exist", "[]"], ran.stdout + ran.stderr


def test_a_pin_that_needs_no_workload_is_refused_before_the_workload_is_checked(tmp_path) -> None:
    """--set bucket_cap_mb=10 in a search of one process was refused after the workload's import and checks (24-61 s
    on a busy machine): the pin alone says it, before them; here the workload, which does not exist, is never reached."""
    result = CliRunner().invoke(app, ["search", "--workload", "no_such_module_here:make", "--device", "cpu", "--trials", "2",
                                      "--set", "bucket_cap_mb=10", "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.strip() == ("error: --set bucket_cap_mb: a DDP knob; it changes nothing in a search of one process "
                                     "(search with --nproc-per-node 2 or more)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["s?x=1", "s%41", "runs #3"])
def test_an_out_whose_name_holds_url_characters_keeps_its_study_inside(tmp_path: pathlib.Path, name: str) -> None:
    """--out 'runs/s?x=1' was pasted into the SQLite URL as it is: SQLAlchemy read the study as the file runs/s, beside
    --out (x=1 an ignored query, with a raw SAWarning), and `autotune status` then found no study; 's%41' read as the
    missing directory sA. The study is now OUT/study.db for any directory name, and status's URL opens that file."""
    from autotune.errors import UsageError
    from autotune.tuner.storage_urls import sqlite_url, storage_file
    from autotune.tuner.study import SearchStudy
    from autotune.tuner.study_files import check_one_study, storage_of

    out = tmp_path / name
    out.mkdir()
    SearchStudy.open(sqlite_url(out / "study.db"), "a-study")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name] and (out / "study.db").is_file()
    assert storage_file(storage_of(out, None)) == (out / "study.db").resolve()
    assert SearchStudy.load(storage_of(out, None)).name == "a-study"
    with pytest.raises(UsageError, match="holds study 'a-study', stopped before its first trial"):
        check_one_study(out, "another-study")


def test_a_cache_dir_that_cannot_be_created_is_refused_before_the_jpegs_are_written(tmp_path) -> None:
    """An --cache-dir that cannot be made (/proc/x) was found after "writing 2000 synthetic JPEGs to /proc/x/...", tens
    of seconds in, where the same --out is refused at once: now in the same words, before any JPEG, nothing left."""
    import autotune

    result = runner.invoke(app, ["search", "--model", "resnet18", "--image-size", "32", "--trials", "2", "--device", "cpu",
                                 "--out", str(tmp_path / "out"), "--cache-dir", "/proc/autotune-x"])
    assert result.exit_code == 1 and "writing" not in result.output, result.output
    assert result.output.strip().splitlines()[-1] == "error: --cache-dir /proc/autotune-x cannot be created: /proc is not writable"
    assert not (tmp_path / "out").exists()
    with pytest.raises(autotune.errors.StorageError, match="^cache_dir /proc/autotune-x cannot be created: /proc is not writable"):
        autotune.search(model="resnet18", trials=2, device="cpu", out=tmp_path / "out", cache_dir="/proc/autotune-x")
    trial = runner.invoke(app, ["trial", "--model", "resnet18", "--image-size", "32", "--device", "cpu", "--cache-dir", "/proc/autotune-x"])
    assert trial.exit_code == 1 and "writing" not in trial.output, trial.output  # `autotune trial` writes them too
    assert trial.output.strip().splitlines()[-1] == "error: --cache-dir /proc/autotune-x cannot be created: /proc is not writable"
