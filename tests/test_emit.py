"""autotune.emit: rendering train.py safely, and running what it renders."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import os
import re
import runpy
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import in_process
import psutil
import pytest
from typer.testing import CliRunner

from autotune.cli import app
from autotune.errors import EmitError
from autotune.output.best import Best, write_best
from autotune.output.emit import render_script, write_script
from autotune.records import Workload
from autotune.train_setup import TrainSetup
from probes.cpu import collect_cpu

RUN_TIMEOUT = 180


def make_best(
    synthetic_data: Path,
    *,
    model: str = "resnet18",
    device: str = "cpu",
    data: str | None = None,
    command: str = "autotune search --model resnet18 --image-size 32",
    notes: tuple[str, ...] = ("synthetic data",),
    hardware: dict[str, Any] | None = None,
    **knobs: Any,
) -> Best:
    """A hand-built Best for resnet18 at 32 px on the session's synthetic data."""
    setup = TrainSetup(**knobs)
    workload = Workload(
        model=model,
        image_size=32,
        data=data,
        device=device,
        num_classes=10,
        lr=1e-3,
        synthetic_images=64,
        cache_dir=str(synthetic_data.parent),
    )
    return Best(
        setup=setup,
        workload=workload,
        samples_per_s=120.0,
        samples_per_s_spread=6.0,
        defaults_samples_per_s=80.0,
        speedup=1.5,
        peak_memory_bytes=None,
        effective_batch=setup.effective_batch(),
        reference_batch=32,
        lr=1e-3 * setup.effective_batch() / 32,
        hardware=hardware if hardware is not None else {"cpu": {"model": "Test CPU", "usable_cores": 2}},
        command=command,
        notes=notes,
    )


CPU_KNOBS = dict(
    num_workers=1, prefetch_factor=2, batch_size=8, accumulation_steps=2, amp="bf16", channels_last=True
)


def load_script(path: Path) -> dict[str, Any]:
    """The rendered script's namespace, without running main()."""
    return runpy.run_path(str(path), run_name="emitted_train")


def defaults(path: Path) -> Any:
    return load_script(path)["get_args_parser"]().parse_args([])


def run_script(args: list[str], cwd: Path, *, torchrun: bool = False) -> subprocess.CompletedProcess[str]:
    """The script as its own process (standalone: its own imports and ``sys.path``), or under torchrun."""
    prefix = [sys.executable]
    if torchrun:
        prefix += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = subprocess.run(prefix + args, cwd=cwd, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def run_here(args: list[str], cwd: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """``args[0]`` run with ``args[1:]`` in this process (see :mod:`in_process`); its stdout."""
    code, out, err = in_process.run_script(Path(args[0]), args[1:], cwd, capfd, monkeypatch)
    assert code == 0, f"exit {code}\n{out}\n{err}"
    return out


def add_argument_default(source: str, flag: str) -> Any:
    """The literal default of ``parser.add_argument(flag, default=...)`` in the source."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == flag
        ):
            for keyword in node.keywords:
                if keyword.arg == "default":
                    return ast.literal_eval(keyword.value)
    raise AssertionError(f"no add_argument({flag!r}, default=...)")


# ------------------------------------------------------------------ rendering
def test_defaults_are_the_tuned_values(synthetic_data: Path, tmp_path: Path) -> None:
    best = make_best(synthetic_data, **CPU_KNOBS)
    path = write_script(best, tmp_path / "train.py")
    args = defaults(path)
    assert args.data == os.path.abspath(synthetic_data)
    assert args.model == "resnet18"
    assert args.device == "cpu"
    assert args.image_size == 32
    assert (args.batch_size, args.accum_steps, args.workers, args.prefetch_factor) == (8, 2, 1, 2)
    assert (args.pin_memory, args.persistent_workers, args.channels_last) == (False, False, True)
    assert args.amp == "bf16"
    assert args.lr == 1e-3 and args.reference_batch == 32
    assert args.max_steps is None and args.resume is False


def test_header_documents_the_search(synthetic_data: Path) -> None:
    text = render_script(make_best(synthetic_data, **CPU_KNOBS))
    header = text.split('"""', 1)[0]
    assert "Test CPU (2 usable cores)" in header
    one = render_script(make_best(synthetic_data, hardware={"cpu": {"model": "Test CPU", "usable_cores": 1}}, **CPU_KNOBS))
    assert "Test CPU (1 usable core)" in one.split('"""', 1)[0]  # a taskset -c 0 search's header said "1 usable cores"
    assert "120.0 samples/s" in header and "80.0 samples/s" in header and "1.50x" in header
    assert "autotune search --model resnet18 --image-size 32" in header
    assert "Note: synthetic data" in header
    assert all(line.startswith("#") or not line.strip() for line in header.splitlines())
    assert "(effective batch 16 with 1 process -> lr 0.0005;" in header
    ddp = render_script(dataclasses.replace(make_best(synthetic_data, **CPU_KNOBS), world_size=2, effective_batch=32))
    assert "(effective batch 32 with 2 processes -> lr" in ddp.split('"""', 1)[0]
    best = make_best(synthetic_data, **CPU_KNOBS)  # a rate kept at every batch (a sign-based optimizer's): no scaling said
    kept = render_script(dataclasses.replace(best, workload=dataclasses.replace(best.workload, lr_scaling="none")))
    assert "Learning rate: 0.001 at effective batch 32, kept at every batch (effective batch 16 with 1 process -> lr" in kept
    assert "; the script keeps it)" in kept and "scales it" not in kept.split('"""', 1)[0]



def test_header_says_how_the_speedup_was_measured(synthetic_data: Path) -> None:
    """The speedup is the median of the paired ratios, not winner / defaults: the line says so, as the console and report.html do."""
    best = dataclasses.replace(make_best(synthetic_data, **CPU_KNOBS), samples_per_s=96.5, defaults_samples_per_s=42.4, speedup=2.41)
    header = render_script(best).split('"""', 1)[0]
    assert "speedup 2.41x (median of the paired rounds)" in header  # 96.5 / 42.4 is 2.28
    unconfirmed = render_script(dataclasses.replace(best, confirmed=False)).split('"""', 1)[0]
    assert "speedup 2.41x (single trials, unconfirmed)" in unconfirmed

def test_imports_only_torch_torchvision_and_stdlib(synthetic_data: Path) -> None:
    tree = ast.parse(render_script(make_best(synthetic_data, **CPU_KNOBS)))
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            modules.add((node.module or "").split(".")[0])
    assert modules - {"torch", "torchvision"} <= set(sys.stdlib_module_names), modules


def test_fp16_accumulation_ddp_rendering(synthetic_data: Path, tmp_path: Path) -> None:
    best = make_best(
        synthetic_data,
        device="cuda:0",
        num_workers=4,
        prefetch_factor=4,
        pin_memory=True,
        persistent_workers=True,
        batch_size=64,
        accumulation_steps=4,
        amp="fp16",
        channels_last=True,
    )
    text = render_script(best)
    compile(text, "train.py", "exec")
    assert "torch.amp.GradScaler(device.type)" in text
    assert "model.no_sync()" in text
    assert "**OPTIMIZER_KWARGS[args.optimizer_impl]" in text and '"fused": {"fused": True}' in text
    assert "zero_grad(set_to_none=True)" in text
    assert "/ accum" in text
    # The scaler unscales before the gradients are clipped.
    scaled = text[text.index("if scaler is not None:\n            if args.clip_grad_norm"):]
    assert scaled.index("scaler.unscale_(optimizer)") < scaled.index("clip_grad_norm_") < scaled.index("scaler.step")
    path = tmp_path / "train.py"
    path.write_text(text)
    args = defaults(path)
    assert (args.device, args.amp, args.accum_steps, args.pin_memory, args.workers) == ("cuda", "fp16", 4, True, 4)


def test_amp_off_renders_no_autocast(synthetic_data: Path, tmp_path: Path) -> None:
    import torch

    path = write_script(make_best(synthetic_data, batch_size=8), tmp_path / "train.py")
    namespace = load_script(path)
    args = namespace["get_args_parser"]().parse_args([])
    assert args.amp == "off"
    assert isinstance(namespace["autocast"](args, torch.device("cpu")), contextlib.nullcontext)
    args = namespace["get_args_parser"]().parse_args(["--amp", "bf16"])
    ctx = namespace["autocast"](args, torch.device("cpu"))
    assert isinstance(ctx, torch.amp.autocast) and ctx.fast_dtype == torch.bfloat16
    assert "bf16" not in render_script(make_best(synthetic_data, batch_size=8)).split('"""', 1)[0]


def test_prefetch_only_with_workers(synthetic_data: Path, tmp_path: Path) -> None:
    import torch
    from torch.utils.data import TensorDataset

    path = write_script(make_best(synthetic_data, batch_size=4), tmp_path / "train.py")
    namespace = load_script(path)
    dataset = TensorDataset(torch.zeros(8, 1))
    args = namespace["get_args_parser"]().parse_args([])
    loader = namespace["make_loader"](dataset, None, args, torch.device("cpu"), True)
    assert loader.num_workers == 0 and loader.prefetch_factor is None and loader.drop_last
    args = namespace["get_args_parser"]().parse_args(["--workers", "2", "--prefetch-factor", "3"])
    loader = namespace["make_loader"](dataset, None, args, torch.device("cpu"), True)
    assert loader.num_workers == 2 and loader.prefetch_factor == 3


@pytest.mark.parametrize(
    "model",
    [
        "os:system('x')",
        "resnet18; import os",
        "resnet18\nimport os",
        "__import__('os').system",
        "a.b:c d",
        "a..b:c",
        "import:x",
        "\ufb01le:make",  # "ﬁle": Python reads it as "file" in source (NFKC), another module than the one searched
        "",
    ],
)
def test_hostile_model_is_rejected(synthetic_data: Path, model: str) -> None:
    with pytest.raises(EmitError, match="model"):
        render_script(make_best(synthetic_data, model=model))


def test_factory_model_is_rendered_as_literal(synthetic_data: Path) -> None:
    text = render_script(make_best(synthetic_data, model="my_pkg.nets:tiny"))
    assert add_argument_default(text, "--model") == "my_pkg.nets:tiny"
    # A module name Python takes (a non-ASCII identifier) is one autotune takes too: it refused `tab_ünï:make_task`.
    text = render_script(make_best(synthetic_data, model="tab_\u00fcn\u00ef.netze:kl\u00e9in"))
    assert add_argument_default(text, "--model") == "tab_\u00fcn\u00ef.netze:kl\u00e9in"


HOSTILE_PATH = "/tmp/it's a \"path\"\nimport os; os.system('echo pwned')\r\n#\\x00 \u2028end"


def test_hostile_data_path_is_a_literal(synthetic_data: Path, tmp_path: Path) -> None:
    text = render_script(make_best(synthetic_data, data=HOSTILE_PATH))
    assert add_argument_default(text, "--data") == HOSTILE_PATH
    path = tmp_path / "train.py"
    path.write_text(text, encoding="utf-8")
    assert defaults(path).data == HOSTILE_PATH


def test_hostile_cache_dir_and_sys_path_are_literals(synthetic_data: Path) -> None:
    best = make_best(synthetic_data)
    workload = dataclasses.replace(best.workload, cache_dir=HOSTILE_PATH, sys_path=(HOSTILE_PATH,))
    text = render_script(dataclasses.replace(best, workload=workload))
    assert add_argument_default(text, "--data").startswith(os.path.abspath(HOSTILE_PATH))
    assignments = {
        node.targets[0].id: ast.literal_eval(node.value)
        for node in ast.parse(text).body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "FACTORY_PATHS"
    }
    assert assignments == {"FACTORY_PATHS": [HOSTILE_PATH]}


def test_hostile_header_text_stays_in_comments(synthetic_data: Path) -> None:
    evil = "x\nprint('pwned')\r\nraise SystemExit\u2028print('pwned')"
    best = make_best(synthetic_data, command=evil, notes=(evil,), hardware={"cpu": {"model": evil}, "gpus": [{"name": evil}]})
    text = render_script(best)
    compile(text, "train.py", "exec")
    for line in text.splitlines():
        if "pwned" in line:
            assert line.startswith("#"), line
    body = ast.parse(text).body
    assert not any(isinstance(node, (ast.Expr, ast.Raise)) and "pwned" in ast.unparse(node) for node in body)


def _tampered(best: Best, part: str, **changes: Any) -> Best:
    """Bypass the dataclass validation, as a hand-edited or buggy caller could."""
    obj = getattr(best, part) if part else best
    for name, value in changes.items():
        object.__setattr__(obj, name, value)
    return best


@pytest.mark.parametrize(
    ("part", "changes", "match"),
    [
        ("setup", {"amp": "fp8"}, "amp"),
        ("setup", {"amp": "off'); import os; ('"}, "amp"),
        ("setup", {"batch_size": "8"}, "batch_size"),
        ("setup", {"batch_size": 8.5}, "batch_size"),
        ("setup", {"channels_last": "yes"}, "channels_last"),
        ("setup", {"prefetch_factor": "2; x"}, "prefetch_factor"),
        ("workload", {"device": "tpu"}, "device"),
        ("workload", {"lr": float("nan")}, "lr"),
        ("workload", {"lr": float("inf")}, "lr"),
        ("workload", {"image_size": "32)"}, "image_size"),
        ("workload", {"data": 42}, "data"),
        ("", {"reference_batch": True}, "reference_batch"),
        ("", {"speedup": "fast"}, "speedup"),
        ("", {"samples_per_s": float("nan")}, "samples_per_s"),
    ],
)
def test_invalid_values_are_rejected(synthetic_data: Path, part: str, changes: dict[str, Any], match: str) -> None:
    best = _tampered(make_best(synthetic_data, **CPU_KNOBS), part, **changes)
    with pytest.raises(EmitError, match=match):
        render_script(best)


def test_write_script_is_atomic_executable_and_creates_dirs(synthetic_data: Path, tmp_path: Path) -> None:
    best = make_best(synthetic_data, **CPU_KNOBS)
    target = tmp_path / "a" / "b" / "train.py"
    path = write_script(best, target)
    assert path == target and path.read_text(encoding="utf-8") == render_script(best)
    assert path.stat().st_mode & stat.S_IXUSR
    assert [p.name for p in target.parent.iterdir()] == ["train.py"]  # no temp file left behind
    assert write_script(best, tmp_path) == tmp_path / "train.py"  # a directory gets train.py inside


# ------------------------------------------------------------------------ CLI
def _one_error_line(result: Any) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_cli_emit_missing_dir(tmp_path: Path) -> None:
    line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path / "nope")]))
    assert "error" in line and "no such file" in line


def test_cli_emit_of_a_search_without_best_json_yet_and_of_broken_links_says_what_is_there(tmp_path: Path) -> None:
    """While a search ran, or after one was killed with its trials kept, emit said "run `autotune search` first"; a
    dangling link or a loop of links read as a missing file."""
    (tmp_path / "study.db").touch()
    line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path)]))
    assert line.startswith(f"error: {tmp_path / 'best.json'}: no such file yet: a search running in {tmp_path} writes it once it "
                           "confirms a winner; one that stopped before: rerun its command (its trials are kept)"), line
    (tmp_path / "best.json").symlink_to("/nonexistent/best.json")
    line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path)]))
    assert line == f"error: {tmp_path / 'best.json'}: a symbolic link to /nonexistent/best.json, which does not exist", line
    (tmp_path / "best.json").unlink()
    (tmp_path / "best.json").symlink_to("loop.json")
    (tmp_path / "loop.json").symlink_to("best.json")
    line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path)]))
    assert line == f"error: {tmp_path / 'best.json'}: cannot read: a loop of symbolic links", line


def test_cli_emit_corrupt_best(tmp_path: Path) -> None:
    (tmp_path / "best.json").write_text("{not json")
    line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path)]))
    assert "not valid JSON" in line
    (tmp_path / "best.json").write_text('{"schema": 1, "setup": {}}')
    line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path)]))
    assert "workload" in line
    (tmp_path / "study.db").write_bytes(b"SQLite format 3\x00\xfb\xff")  # the wrong file: not an internal error
    result = CliRunner().invoke(app, ["emit", str(tmp_path / "study.db")])
    assert result.exit_code != 3 and "not valid JSON (not even UTF-8 text)" in _one_error_line(result)
    (tmp_path / "best.json").write_text("[" * 100_000 + "]" * 100_000)  # deeper than json.loads recurses
    assert "nested too deeply to parse" in _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path)]))


def test_emit_onto_a_symbolic_link_writes_the_file_it_leads_to(synthetic_data: Path, tmp_path: Path) -> None:
    """The link stays, as `cp` and a shell's `>` leave it: the rename put a file in its place, and the file it led to
    kept the old script."""
    best = make_best(synthetic_data, **CPU_KNOBS)
    write_best(tmp_path / "best.json", best)
    (tmp_path / "deploy").mkdir()
    script, link = tmp_path / "deploy" / "train.py", tmp_path / "run.py"
    link.symlink_to(script)  # not there yet: made as a shell's > makes it
    for _ in range(2):
        result = CliRunner().invoke(app, ["emit", str(tmp_path), "-o", str(link)])
        assert result.exit_code == 0, result.output
        assert link.is_symlink() and os.readlink(link) == str(script)
        assert script.read_text() == render_script(best) and stat.S_IMODE(script.stat().st_mode) == 0o755
        script.write_text(script.read_text() + "# an older script by autotune\n")  # the next emit replaces it


def test_emit_under_a_file_names_the_file(synthetic_data: Path, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    for target in ("afile/train.py", "afile/sub/train.py"):
        with pytest.raises(EmitError, match="afile is a file, not a directory"):
            write_script(make_best(synthetic_data), tmp_path / target)


def test_cli_emit_hostile_model(synthetic_data: Path, tmp_path: Path) -> None:
    write_best(tmp_path / "best.json", make_best(synthetic_data, model="os:system('x')"))
    line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path)]))
    assert "model" in line
    assert not (tmp_path / "train.py").exists()


def test_cli_emit_writes_train_py(synthetic_data: Path, tmp_path: Path) -> None:
    write_best(tmp_path / "best.json", make_best(synthetic_data, **CPU_KNOBS))
    result = CliRunner().invoke(app, ["emit", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "train.py").is_file()
    result = CliRunner().invoke(app, ["emit", str(tmp_path), "-o", str(tmp_path / "x" / "run.py")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "x" / "run.py").is_file()
    (tmp_path / "train.py").unlink()
    result = CliRunner().invoke(app, ["emit", str(tmp_path / "best.json")])  # the file itself: train.py beside it
    assert result.exit_code == 0 and (tmp_path / "train.py").is_file(), result.output
    (tmp_path / "train.py").unlink()
    result = CliRunner().invoke(app, ["emit", "--out", str(tmp_path)])  # the directory as search's option names it
    assert result.exit_code == 0 and (tmp_path / "train.py").is_file(), result.output
    # A directory not made yet, named with its slash: train.py in it (a file named `deploy` was written before).
    result = CliRunner().invoke(app, ["emit", str(tmp_path), "-o", f"{tmp_path / 'deploy'}/"])
    assert result.exit_code == 0 and (tmp_path / "deploy" / "train.py").is_file(), result.output
    assert write_script(make_best(synthetic_data, **CPU_KNOBS), f"{tmp_path / 'api'}/") == tmp_path / "api" / "train.py"


@pytest.mark.parametrize("hardware", [{"cpu": "x"}, {"gpus": "H100"}, {"gpus": [5, {"name": "T4"}]}])
def test_a_hand_edited_probe_summary_is_no_internal_error(synthetic_data: Path, tmp_path: Path, hardware: dict[str, Any]) -> None:
    """best.json's `hardware` feeds only train.py's header comment: `"cpu": "x"` ended `autotune emit` with exit 3."""
    write_best(tmp_path / "best.json", dataclasses.replace(make_best(synthetic_data, **CPU_KNOBS), hardware=hardware))
    result = CliRunner().invoke(app, ["emit", str(tmp_path)])
    assert result.exit_code == 0, result.output
    header = (tmp_path / "train.py").read_text()
    assert ("Hardware: T4\n" in header) if "gpus" in hardware and isinstance(hardware["gpus"], list) else (
        "Hardware: unknown (no probe summary in best.json)\n" in header)


def test_a_best_json_whose_batch_was_edited_after_the_search_is_refused_in_one_line(synthetic_data: Path, tmp_path: Path) -> None:
    """batch_size lowered by hand (to fit memory, say): emit wrote a header claiming the measured speed and the lr of
    effective batch 16 for a setup of 32, and load_best's lr was the old one for the user's own loop."""
    import autotune

    data = make_best(synthetic_data, **CPU_KNOBS).to_dict()
    data["setup"]["accumulation_steps"] = 4  # 8 x 4 = 32, the file says 16
    (tmp_path / "best.json").write_text(json.dumps(data))
    said = ("best.json's setup makes an effective batch of 32 (batch_size 8 x accumulation_steps 4 x 1 process), its "
            "effective_batch field 16: the setup (or world_size) was edited after the search, so its measured figures and its lr (0.0005) are "
            "another setup's: put the search's values back and pass train.py --batch-size and --accum-steps")
    result = CliRunner().invoke(app, ["emit", str(tmp_path)])
    assert result.exit_code == 1 and said in result.output and not (tmp_path / "train.py").exists(), result.output
    with pytest.raises(autotune.AutotuneError, match=re.escape(said)):
        autotune.load_best(tmp_path)
    assert autotune.load_setup(tmp_path / "best.json").accumulation_steps == 4  # the setup alone: the user's to change
    data["setup"]["accumulation_steps"], data["world_size"] = 1, 2  # 8 x 1 x 2 processes: the file's 16
    (tmp_path / "best.json").write_text(json.dumps(data))
    assert autotune.load_best(tmp_path).effective_batch == 16


def test_cli_emit_dash_prints_the_script_and_writes_no_file(synthetic_data: Path, tmp_path: Path, monkeypatch) -> None:
    write_best(tmp_path / "best.json", make_best(synthetic_data, **CPU_KNOBS))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, ["emit", str(tmp_path), "-o", "-"])
    assert result.exit_code == 0, result.output
    assert result.stdout == render_script(make_best(synthetic_data, **CPU_KNOBS))
    assert not (tmp_path / "-").exists() and not (tmp_path / "train.py").exists()
    result = CliRunner().invoke(app, ["emit", str(tmp_path), "-o", "./-"])  # a file named -, as a shell's ./- is
    assert result.exit_code == 0 and result.stdout.startswith("wrote "), result.output
    assert (tmp_path / "-").read_text() == render_script(make_best(synthetic_data, **CPU_KNOBS))


def test_emit_overwrites_only_a_script_it_wrote_and_files_follow_the_umask(synthetic_data: Path, tmp_path: Path) -> None:
    write_best(tmp_path / "best.json", make_best(synthetic_data, **CPU_KNOBS))
    (tmp_path / "study.db").write_bytes(b"SQLite format 3\x00")
    (tmp_path / "mine.py").write_text("print('my own script')\n")
    for name in ("best.json", "study.db", "mine.py"):
        before = (tmp_path / name).read_bytes()
        line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path), "-o", str(tmp_path / name)]))
        assert f"{tmp_path / name} exists and is not a script written by autotune: not overwritten" in line
        assert (tmp_path / name).read_bytes() == before
    os.mkfifo(tmp_path / "pipe")  # as /dev/null, no regular file: the atomic rename would replace it by one
    line = _one_error_line(CliRunner().invoke(app, ["emit", str(tmp_path), "-o", str(tmp_path / "pipe")]))
    assert f"{tmp_path / 'pipe'} exists and is not a regular file: not overwritten (pass another --output)" in line
    assert stat.S_ISFIFO((tmp_path / "pipe").stat().st_mode)
    assert CliRunner().invoke(app, ["emit", str(tmp_path)]).exit_code == 0
    again = CliRunner().invoke(app, ["emit", str(tmp_path)])  # its own script: rewritten
    assert again.exit_code == 0, again.output
    old = os.umask(0o027)
    try:
        write_best(tmp_path / "best.json", make_best(synthetic_data, **CPU_KNOBS))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "best.json").stat().st_mode) == 0o640  # not mkstemp's private 0600


def test_the_loader_runs_on_across_epochs_of_whole_optimizer_steps(synthetic_data: Path, tmp_path: Path) -> None:
    """One pass of the loader over every epoch (its workers never drain at an epoch's end); each epoch is
    reshuffled and cut to whole optimizer steps; a resumed run starts on the sample it stopped at."""
    import torch
    from torch.utils.data import TensorDataset

    path = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    assert "sampler.end = steps_per_epoch * args.accum_steps * args.batch_size" in path.read_text()
    sampler = load_script(path)["ResumableSampler"](TensorDataset(torch.zeros(30, 1)), num_replicas=1, rank=0, seed=0)
    sampler.end = 24  # as main() sets it for batch 4 x 2 micro-batches: 3 whole steps of the 30 samples
    stream = iter(sampler)
    first, second = [next(stream) for _ in range(24)], [next(stream) for _ in range(24)]
    assert len(set(first)) == len(set(second)) == 24 and first != second
    sampler.start(0, skip=8)  # resumed after the epoch's first step
    stream = iter(sampler)
    assert [next(stream) for _ in range(16 + 24)] == first[8:] + second


def test_benchmark_log_parser() -> None:
    from benchmarks.emitted_vs_search import parse_log, steady_state

    log = "model resnet18 | ...\nstep 5 loss 2.3010 images/s 10.0\nstep 10 loss 2.2 images/s 120.5\nepoch 0 done\nstep 15 loss nan images/s 130.0\n"
    rows = parse_log(log)
    assert rows == [(5, 10.0), (10, 120.5), (15, 130.0)]
    assert steady_state(rows, 1) == [120.5, 130.0]
    # A Task's train.py counts samples, not images.
    assert parse_log("step 4 loss 0.7 samples/s 1500.0\n") == [(4, 1500.0)]


def test_the_script_s_figure_counts_epoch_boundaries_as_often_as_they_happen() -> None:
    """A short epoch: steps served from the prefetch queue run fast, the first step of each epoch waits for it to fill."""
    from benchmarks.emitted_vs_search import epoch_ends, parse_log, steady_rate, steady_state

    lines = []
    for step in range(1, 11):  # 5 steps per epoch, one log line per step
        lines.append(f"step {step} loss 1.0 images/s {100.0 if step % 5 == 1 else 300.0}")
        if step % 5 == 0:
            lines.append(f"epoch {step // 5 - 1} done at step {step}, 1.0s elapsed")
    log = "\n".join(lines)
    rows = parse_log(log)
    assert epoch_ends(log) == [5, 10]
    assert sorted(steady_state(rows, 0))[5] == 300.0  # the median of the lines never sees the stall
    assert steady_rate(rows, epoch_ends(log), 0) == pytest.approx(10 / (2 / 100 + 8 / 300))  # 214.3
    # Every 5 steps, one log line: the interval after an epoch's reset covers only the steps since it.
    coarse = parse_log("step 5 loss 1 images/s 200.0\nepoch 0 done at step 7, 1s\nstep 10 loss 1 images/s 100.0\n")
    assert steady_rate(coarse, [7], 0) == pytest.approx(8 / (5 / 200 + 3 / 100))


# ---------------------------------------------------------------- real runs
def _checkpoint(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def test_a_factory_s_frozen_backbone_in_eval_mode_stays_so_in_train_py(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A --model factory's backbone left in eval mode (fine-tuning) was switched to train mode each epoch: its BatchNorm's
    running statistics drifted. The evaluation between epochs puts the model in eval mode; the next epoch restores it."""
    best = make_best(synthetic_data, num_workers=0, prefetch_factor=None, batch_size=8)
    tests = str(Path(__file__).parent)
    best = dataclasses.replace(best, workload=dataclasses.replace(best.workload, model="factories:frozen_cnn", sys_path=(tests,)))
    script = write_script(best, tmp_path / "emit" / "train.py")
    run_here([str(script), "--max-steps", "10", "--print-freq", "5", "--output-dir", "out", "--val-data", str(synthetic_data)],
             tmp_path, capfd, monkeypatch)  # 64 images in steps of 8: two epochs, an evaluation after each
    model = _checkpoint(tmp_path / "out" / "checkpoint.pth")["model"]
    assert int(model["0.1.num_batches_tracked"]) == 0 and not bool(model["0.1.running_mean"].any())


@pytest.mark.slow
def test_runs_and_resumes(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "emit" / "train.py")
    run = tmp_path / "run"
    run.mkdir()
    out = run_here([str(script), "--max-steps", "2", "--print-freq", "1", "--output-dir", "out"], run, capfd, monkeypatch)
    assert "batch 8 x accum 2 x 1 = 16" in out
    # --amp bf16 (the tuned value here) on a CPU without a bf16 unit is emulated: the script says so, as the probe would.
    assert ("--amp bf16 is emulated here" in out) is (not collect_cpu().bf16)
    assert "lr 0.001 x sqrt(16 / 32) = 0.000707107, warm-up 0 steps" in out
    assert "step 2 loss" in out and "images/s" in out
    checkpoint = _checkpoint(run / "out" / "checkpoint.pth")
    assert (checkpoint["step"], checkpoint["epoch"], checkpoint["epoch_step"]) == (2, 0, 2)
    assert set(checkpoint) >= {"model", "optimizer", "scaler", "args"}

    # 64 images / (8 x 2) = 4 steps per epoch: the resumed run finishes epoch 0 at step 4.
    out = run_here([str(script), "--resume", "--max-steps", "4", "--print-freq", "1", "--output-dir", "out"], run, capfd, monkeypatch)
    assert "resumed from out/checkpoint.pth at epoch 0 step 2" in out
    steps = [int(line.split()[1]) for line in out.splitlines() if line.startswith("step ")]
    assert steps == [3, 4]
    checkpoint = _checkpoint(run / "out" / "checkpoint.pth")
    assert (checkpoint["step"], checkpoint["epoch"], checkpoint["epoch_step"]) == (4, 1, 0)


@pytest.mark.slow
def test_a_batch_of_one_for_batch_norm_is_one_line(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # resnet18 at 32 px ends in a 1x1 feature map: its last BatchNorm sees one value per channel at batch 1.
    script = write_script(make_best(synthetic_data), tmp_path / "train.py")
    (tmp_path / "runs").mkdir()
    code, _, err = in_process.run_main(script, ["--batch-size", "1", "--output-dir", "runs/a/b"], tmp_path, capfd, monkeypatch)
    assert code == 1 and err.splitlines() == [
        "error: Expected more than 1 value per channel when training, got input size torch.Size([1, 512, 1, 1]); "
        "a BatchNorm layer needs more than one value per channel to train on: pass --batch-size 2 or more"], err
    # The folders it created for the checkpoint, still empty, are removed at exit; the one that was there stays.
    assert (tmp_path / "runs").is_dir() and not (tmp_path / "runs" / "a").exists()


@pytest.mark.slow
def test_a_compile_without_a_cxx_compiler_is_one_line(synthetic_data: Path, tmp_path: Path) -> None:
    """A train.py tuned with --compile on one machine, run where inductor finds no C++ compiler (a container without
    g++): a 105-line traceback ending `InductorError: InvalidCxxCompiler`. One line, naming what to do."""
    script = write_script(make_best(synthetic_data), tmp_path / "train.py")
    env = {**os.environ, "CXX": "/nonexistent/g++", "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}  # no cached kernels
    failed = subprocess.run([sys.executable, str(script), "--compile", "default", "--max-steps", "1", "--batch-size", "2",
                             "--output-dir", "runs"], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env)
    lines = [line for line in failed.stderr.splitlines() if line.strip()]
    assert failed.returncode == 1 and len(lines) == 1, failed.stderr[-3000:]
    assert lines[0].startswith("error: torch.compile failed: ") and lines[0].endswith(
        "install a C++ compiler (g++) or set CXX to one, or rerun with --compile off"), lines


def test_the_script_tells_a_native_bf16_cpu_by_its_flags(synthetic_data: Path, tmp_path: Path) -> None:
    native = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))["cpu_has_native_bf16"]
    for flags, expected in (("fpu sse avx2", False), ("fpu avx512f avx512_bf16", True), ("fpu amx_bf16 amx_tile", True),
                            ("fp asimd bf16 i8mm", True)):
        (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
        assert native(str(tmp_path / "cpuinfo")) is expected, flags
    assert native(str(tmp_path / "missing")) is True  # unknown: no warning


def test_threads_default_to_the_tuned_count_and_auto_is_torchs_own_choice(synthetic_data: Path, tmp_path: Path) -> None:
    def parser(threads: int | None) -> Any:
        script = write_script(make_best(synthetic_data, **{**CPU_KNOBS, "num_threads": threads}), tmp_path / f"train{threads}.py")
        return runpy.run_path(str(script), run_name="not_main")["get_args_parser"]()  # its parser, not its main

    tuned = parser(2)
    assert tuned.parse_args([]).threads == 2 and tuned.parse_args(["--threads", "auto"]).threads is None
    assert "auto: torch's own choice (default: 2)" in " ".join(tuned.format_help().split())
    assert "(default: auto)" in " ".join(parser(None).format_help().split())
    shown = " ".join(tuned.format_help().split())  # --help shows every tuned knob's default
    for text in (f"micro-batch per process (default: {CPU_KNOBS.get('batch_size', 32)})", "worker processes (default: ",
                 "autocast precision (default: ", "keep loader workers between epochs (default: "):
        assert text in shown, text
    with pytest.raises(SystemExit):
        tuned.parse_args(["--threads", "many"])


def test_bad_data_directories_name_their_flag(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    (tmp_path / "flat").mkdir()
    for flags, message in (
        (["--data", str(script)], f"error: --data {script} is not a directory; pass --data DIR"),
        (["--val-data", str(tmp_path / "nowhere")], f"error: --val-data {tmp_path / 'nowhere'} does not exist; pass --val-data DIR"),
        (["--val-data", str(tmp_path / "flat")], f"error: --val-data {tmp_path / 'flat'}: Couldn't find any class folder"),
    ):
        line, _ = in_process.refusal(script, [*flags, "--max-steps", "1", "--output-dir", "out"], tmp_path, capfd, monkeypatch)
        assert line.startswith(message), line


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "-1"], "--workers must be >= 0"),
        (["--workers", "1000000"], "--workers must be <= 1024, got 1000000"),  # a million processes: the run hung
        (["--workers", "1", "--prefetch-factor", "0"], "--prefetch-factor must be >= 1"),
        (["--epochs", "0"], "--epochs must be >= 1"),
        (["--max-steps", "-3"], "--max-steps must be >= 1"),
        (["--image-size", "0"], "--image-size must be >= 8"),
        (["--lr", "-1"], "--lr must be a finite number > 0"),
        (["--clip-grad-norm", "nan"], "--clip-grad-norm must be a finite number > 0"),
        (["--checkpoint-every", "nan"], "--checkpoint-every must be a number of seconds (0: every epoch)"),
        (["--warmup-steps", "-5"], "--warmup-steps must be >= -1"),
        (["--checkpoint-every", "-5"], "--checkpoint-every must be >= 0"),  # it read as 0 (every epoch), without a word
        (["--weight-decay", "-1"], "--weight-decay must be a finite number >= 0"),
        (["--weight-decay", "nan"], "--weight-decay must be a finite number >= 0"),
        (["--threads", "0"], "--threads must be >= 1"),
        (["--seed", str(2**64)], "--seed must be a 64-bit integer (-2**63 to 2**63 - 1)"),  # torch's overflow traceback before
    ],
)
def test_bad_numbers_are_one_line_before_any_work(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    """As argparse refuses a mistyped value: exit 2 as the flags are read (they exited 1 from main())."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    code, out, err = in_process.run_script(script, [*flags, "--output-dir", "out"], tmp_path, capfd, monkeypatch)
    said, way = err.split(" (python ", 1)  # the script's name there is argv[0]'s: in this process, pytest's
    assert (code, out, said, way.endswith(" --help lists the flags)\n"), err.count("\n")) == (2, "", f"error: {message}", True, 1)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--model", "nosuchmodel"], "error: --model nosuchmodel is neither a torchvision classification model"),
        (["--model", "fcn_resnet50"], "error: --model fcn_resnet50 is a torchvision model of another kind than a classifier: this script "
                                      "trains classifiers; train it with your own loop (autotune search --workload tunes it"),
        # The search suggests close names; the script named none.
        (["--model", "resnet1"], "error: --model resnet1 is neither a torchvision classification model (torchvision.models.list_models("
                                 "module=torchvision.models)) nor a module:function factory; did you mean resnet18, resnet152, resnet101?"),
        (["--model", "no_such_module_xyz:make"], "error: --model no_such_module_xyz:make: cannot find module no_such_module_xyz; run from"),
        (["--model", "os:no_such_function"], "error: --model os:no_such_function: os has no function no_such_function"),
        (["--model", "models:"], "error: --model models:: expected module:function"),
        (["--output-dir", "/proc/autotune-x"], "error: --output-dir /proc/autotune-x: No such file or directory"),
        (["--output-dir", "train.py"], "error: --output-dir train.py is a file, not a folder; pass another --output-dir"),
    ],
)
def test_bad_model_or_output_dir_is_one_line_before_any_work(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, flags: list[str], message: str
) -> None:
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    line, out = in_process.refusal(script, ["--output-dir", "out", *flags], tmp_path, capfd, monkeypatch)
    assert line.startswith(message), line
    assert out == "" and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("def net(num_classes):\n    raise RuntimeError('no weights here')\n",
         "error: --model factory_{0}:net failed: RuntimeError: no weights here"),
        ("def net(depth):\n    return None\n",
         "error: --model factory_{0}:net failed: TypeError: net() missing 1 required positional argument: 'depth'"),
        ("def net():\n    return 'resnet18'\n", "error: --model factory_{0}:net returned str, not a torch.nn.Module"),
    ],
    ids=["raises", "needs_an_argument", "returns_text"],
)
def test_a_model_factory_that_fails_or_returns_no_module_is_one_line(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, factory: str,
    message: str
) -> None:
    module = f"factory_{tmp_path.name}"  # one module per case: the test process keeps what it imported
    (tmp_path / f"{module}.py").write_text(factory)
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    line, _ = in_process.refusal(script, ["--model", f"{module}:net", "--output-dir", "out"], tmp_path, capfd, monkeypatch)
    assert line == message.format(tmp_path.name)


def test_resume_refuses_a_checkpoint_it_cannot_continue_in_one_line(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    checkpoint = tmp_path / "out" / "checkpoint.pth"
    checkpoint.parent.mkdir()
    state = {"model": {"fc.weight": torch.zeros(1)}, "optimizer": {}, "scaler": None, "epoch": 0, "epoch_step": 1, "step": 1}
    written_with = {"model": "resnet18", "batch_size": 8, "accum_steps": 2, "lr": 1e-3, "world_size": 1}
    cases = [
        (lambda: checkpoint.write_bytes(b"not a checkpoint" * 8), "cannot be read as a checkpoint (UnpicklingError)"),
        (lambda: torch.save({"weights": torch.zeros(2)}, checkpoint), "is not a checkpoint this script wrote"),
        (lambda: torch.save({**state, "args": {**written_with, "batch_size": 16, "accum_steps": 1}}, checkpoint),
         "was written with --batch-size 16 (now 8), --accum-steps 1 (now 2); resume with the flags it was written with"),
        (lambda: torch.save({**state, "args": {**written_with, "world_size": 2}}, checkpoint), "was written with 2 processes (now 1)"),
        # Another --seed shuffles the epoch otherwise: skipping its first samples would train some twice, some never.
        (lambda: torch.save({**state, "args": {**written_with, "seed": 5}}, checkpoint), "was written with --seed 5 (now 0)"),
        # The optimizer's saved state carries its weight decay and kernels: another value would be silently ignored.
        (lambda: torch.save({**state, "args": {**written_with, "weight_decay": 0.5, "optimizer_impl": "fused"}}, checkpoint),
         "was written with --weight-decay 0.5 (now 0.01), --optimizer-impl fused (now "),
        # Same flags, another model's weights: found once the model is built.
        (lambda: torch.save({**state, "args": written_with}, checkpoint), "does not fit this model or optimizer (Error(s) in loading"),
    ]
    for write, message in cases:
        write()
        line, out = in_process.refusal(script, ["--resume", "--output-dir", "out"], tmp_path, capfd, monkeypatch)
        assert line.startswith(f"error: --resume: {Path('out') / 'checkpoint.pth'} ") and message in line, line
        assert "weights_only" not in line and "step " not in out


def test_a_run_with_another_process_count_than_tuned_says_so(synthetic_data: Path, tmp_path: Path, capsys) -> None:
    import argparse

    best = dataclasses.replace(make_best(synthetic_data, **CPU_KNOBS), world_size=2)
    namespace = load_script(write_script(best, tmp_path / "train.py"))
    namespace["note_world_size"](argparse.Namespace(world_size=2))
    assert capsys.readouterr().out == ""  # as tuned: nothing to say
    namespace["note_world_size"](argparse.Namespace(world_size=1))  # plain python of a 2-rank winner
    said = capsys.readouterr().out
    assert said.startswith("note: tuned with torchrun --nproc_per_node 2; this run has 1 process(es)") and "does not apply" in said


def test_resume_stops_every_rank_when_only_some_find_the_checkpoint(synthetic_data: Path, tmp_path: Path) -> None:
    """--output-dir on each node's local disk: ranks that found no checkpoint would train from step 0 beside the resumed
    ones. Every rank sums who found it (one all_reduce), and all stop in one line when they disagree."""
    import torch

    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    check = namespace["checkpoint_on_every_rank"]

    class World:
        """torch.distributed of a 2-process world whose other process found ``other``."""

        def __init__(self, other: bool) -> None:
            self.other = other

        def is_available(self) -> bool:
            return True

        def is_initialized(self) -> bool:
            return True

        ReduceOp = SimpleNamespace(MAX="max")

        def all_reduce(self, tensor: torch.Tensor, op: str = "sum") -> None:
            if op == "max":  # the steps' (step, -step): the other's checkpoint is of step 5
                torch.maximum(tensor, torch.tensor([5.0, -5.0], dtype=tensor.dtype), out=tensor)
            else:
                tensor += torch.tensor([float(self.other), float(not self.other)])

    for here, other in ((True, False), (False, True)):
        check.__globals__["dist"] = World(other)
        with pytest.raises(SystemExit, match=r"^error: --resume: 1 process\(es\) found checkpoint.pth in --output-dir and 1 did not"):
            check({"step": 5} if here else None, torch.device("cpu"))
    for both in (True, False):
        check.__globals__["dist"] = World(both)
        check({"step": 5} if both else None, torch.device("cpu"))  # all agree: nothing to say
    check.__globals__["dist"] = World(True)
    with pytest.raises(SystemExit, match=r"^error: --resume: the processes found checkpoints of different steps in --output-dir "
                                         r"\(4 to 5\): copy the newest checkpoint.pth \(step 5\) to every node's --output-dir$"):
        check({"step": 4}, torch.device("cpu"))


def test_a_resumed_run_keeps_the_warm_up_length_it_started_with(synthetic_data: Path, tmp_path: Path) -> None:
    """--warmup-steps -1 is one epoch when the batch grew more than 4x, at most a tenth of the run (--epochs, or
    --max-steps when fewer: one epoch of a huge dataset would be all of it); a resumed run takes the checkpoint's length
    (the epoch length follows the data, which may have changed), and an explicit --warmup-steps wins."""
    import argparse

    warmup_steps = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))["warmup_steps"]
    run = {"reference_batch": 32, "epochs": 10, "max_steps": None}
    auto, explicit = argparse.Namespace(warmup_steps=-1, **run), argparse.Namespace(warmup_steps=3, **run)
    assert warmup_steps(auto, None, 10, 1024) == 10 and warmup_steps(auto, None, 10, 128) == 0
    one_epoch = argparse.Namespace(**{**vars(auto), "epochs": 1})
    assert warmup_steps(one_epoch, None, 10**6, 1024) == 10**5  # a tenth of the run, not all of it
    assert warmup_steps(argparse.Namespace(**{**vars(auto), "max_steps": 200}), None, 10**6, 1024) == 20
    assert warmup_steps(argparse.Namespace(**{**vars(one_epoch), "max_steps": 5}), None, 10**6, 1024) == 2  # at least two: one runs at the full rate
    assert warmup_steps(auto, None, None, 1024) == 0  # no epoch length (an iterable dataset): no automatic warm-up
    assert warmup_steps(auto, {"args": {"warmup_steps": 7}}, 10, 1024) == 7
    assert warmup_steps(auto, {"args": {}}, 10, 1024) == 10  # a checkpoint that did not say
    assert warmup_steps(explicit, {"args": {"warmup_steps": 7}}, 10, 1024) == 3


def test_validation_classes_take_the_training_indices(synthetic_data: Path, tmp_path: Path) -> None:
    """ImageFolder numbers a folder's classes by name: a val split without some classes must not shift the labels."""
    from torchvision.datasets import ImageFolder

    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    train = ImageFolder(str(synthetic_data))
    kept = train.classes[3], train.classes[7]
    for name in kept:
        (tmp_path / "val" / name).mkdir(parents=True)
        for image in sorted((synthetic_data / name).iterdir())[:2]:
            (tmp_path / "val" / name / image.name).symlink_to(image)
    val = ImageFolder(str(tmp_path / "val"))
    assert val.targets == [0, 0, 1, 1]  # ImageFolder's own numbering
    namespace["match_classes"](val, train, "val")
    assert val.targets == [3, 3, 7, 7] and [label for _, label in val.samples] == [3, 3, 7, 7]
    (tmp_path / "val" / "zebra").mkdir()
    (tmp_path / "val" / "zebra" / "z.jpg").symlink_to(next((synthetic_data / kept[0]).iterdir()))
    with pytest.raises(SystemExit, match="error: --val-data val has classes that --data lacks: zebra$"):
        namespace["match_classes"](ImageFolder(str(tmp_path / "val")), train, "val")
    # --val-data one level too high (its class folders are the splits): the line says which one was meant.
    for split in ("train", "val"):
        (tmp_path / "splits" / split / kept[0]).mkdir(parents=True)
        (tmp_path / "splits" / split / kept[0] / "a.jpg").symlink_to(next((synthetic_data / kept[0]).iterdir()))
    with pytest.raises(SystemExit, match=r"error: --val-data splits has classes that --data lacks: train, val; its class folders "
                                         r"look like dataset splits: did you mean --val-data splits/val\?$"):
        namespace["match_classes"](ImageFolder(str(tmp_path / "splits")), train, "splits")


def test_a_model_that_cannot_take_the_image_size_ends_the_script_in_one_line(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--model inception_v3 on the search's 32 px (or a ViT at a size its patches do not divide): a 20-line traceback
    from deep in torchvision. The script's last word is one line naming --image-size; other errors keep their traceback."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    namespace = runpy.run_path(str(script), run_name="in_process")
    with pytest.raises(RuntimeError) as failed:
        in_process.run_script(script, ["--model", "inception_v3", "--max-steps", "1", "--workers", "0", "--batch-size", "2",
                                       "--output-dir", "out"], tmp_path, capfd, monkeypatch)
    line = namespace["size_failure"](failed.value)
    assert line.startswith("error: the model cannot train on images of 32 px (RuntimeError: ") and line.endswith(
        "pass an --image-size it takes (the search measured 32; inception_v3 needs 299, a ViT a multiple of its patch size)"), line
    assert namespace["size_failure"](AssertionError("Input shape indivisible by patch size!")).startswith("error: the model cannot")
    assert namespace["size_failure"](RuntimeError("CUDA error: an illegal memory access")) is None
    # A shape error (maxvit_t at 32 px: a raw traceback) is the size's where the run left the searched model or size; at the
    # searched pair, which trained, it is another error's.
    shape = RuntimeError("shape '[64, 64, 1, 7, 1, 7]' is invalid for input of size 262144")
    assert namespace["size_failure"](shape) is None
    namespace["main"].__globals__["_model"] = "maxvit_t"
    assert namespace["size_failure"](shape).startswith("error: the model cannot train on images of 32 px (RuntimeError: shape '[64")
    namespace["main"].__globals__["_model"] = "resnet18"
    # Under torch.compile the first line is dynamo's; the model's own words come further down, or as the cause.
    compiled = RuntimeError("RuntimeError when making fake tensor call\n\nfrom user code:\n  Given input size: (768x2x2). "
                            "Calculated output size: (768x0x0). Output size is too small")
    assert "(RuntimeError: Given input size: (768x2x2)" in namespace["size_failure"](compiled)
    caused = RuntimeError("backend compiler failed")
    caused.__cause__ = AssertionError("Input shape indivisible by patch size!")
    assert "indivisible by patch size" in namespace["size_failure"](caused)
    # The script run as a program says it in one line (its main() made to fail so: a ViT at 60 px).
    program = tmp_path / "vit.py"
    program.write_text(script.read_text().replace(
        "def main(args):\n", "def main(args):\n    raise AssertionError('Input shape indivisible by patch size!')\ndef _searched_main(args):\n", 1))
    ran = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=RUN_TIMEOUT, cwd=tmp_path)
    assert ran.returncode == 1 and ran.stderr.strip().splitlines() == [
        "error: the model cannot train on images of 32 px (AssertionError: Input shape indivisible by patch size!); pass an "
        "--image-size it takes (the search measured 32; inception_v3 needs 299, a ViT a multiple of its patch size)"], ran.stderr


@pytest.mark.filterwarnings("error::FutureWarning")
def test_googlenet_and_inception_build_without_torchvision_s_warning(synthetic_data: Path, tmp_path: Path) -> None:
    """torchvision warns that their default initialisation will change: the search and the script both ask for it."""
    from autotune.workloads.models import build_model

    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    for name in ("googlenet", "inception_v3"):
        assert namespace["build_model"](name, None, 10, 299).fc.out_features == 10
        assert build_model(name, num_classes=10, image_size=299).fc.out_features == 10


def test_a_second_run_on_one_output_dir_is_refused_and_a_closed_stdout_stops_nothing(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs on one --output-dir replaced each other's checkpoint.pth (a probe's run said done while the file held
    the other's weights); the second is refused while the first holds the directory. And a run whose stdout went away
    (| head, a tee that ended) ended in a BrokenPipeError's traceback without its checkpoint: it trains on."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    (tmp_path / "out").mkdir()
    holding = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
               "os.write(fd, b'pid 4242 on node7'); print('held', flush=True); sys.stdin.read()")
    with subprocess.Popen([sys.executable, "-c", holding, str(tmp_path / "out" / ".train.lock")], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True) as holder:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        line, _ = in_process.refusal(script, ["--max-steps", "1", "--workers", "0", "--output-dir", "out"], tmp_path, capfd,
                                     monkeypatch)
        holder.stdin.close()  # type: ignore[union-attr]
    assert line == ("error: --output-dir out is in use by another training run (pid 4242 on node7); wait for it to end or pass "
                    "another --output-dir")
    assert not (tmp_path / "out" / "checkpoint.pth").exists()
    run_here([str(script), "--max-steps", "1", "--workers", "0", "--output-dir", "out"], tmp_path, capfd, monkeypatch)  # free
    closed = subprocess.Popen([sys.executable, str(script), "--max-steps", "3", "--workers", "0", "--print-freq", "1",
                               "--output-dir", "piped"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert closed.stdout is not None and closed.stderr is not None
    closed.stdout.close()  # the reader went away before the first line
    err = closed.stderr.read()
    assert closed.wait(timeout=RUN_TIMEOUT) == 0 and "Traceback" not in err, err
    assert _checkpoint(tmp_path / "piped" / "checkpoint.pth")["step"] == 3


def test_an_output_dir_that_cannot_hold_a_checkpoint_is_refused_and_a_partial_save_goes(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--output-dir naming a file said only "File exists"; a checkpoint.pth that is a folder was met at the first save,
    after the training; a checkpoint.pth.tmp left by a run killed mid-save (kill -9) stayed for good."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    flags = ["--max-steps", "1", "--workers", "0", "--batch-size", "2"]
    (tmp_path / "a-file").write_text("")
    for output_dir, named in (("a-file", "a-file"), ("a-file/sub", f"a-file/sub: {tmp_path / 'a-file'}")):
        line, _ = in_process.refusal(script, [*flags, "--output-dir", output_dir], tmp_path, capfd, monkeypatch)
        assert line == f"error: --output-dir {named} is a file, not a folder; pass another --output-dir"
    (tmp_path / "out" / "checkpoint.pth").mkdir(parents=True)
    line, _ = in_process.refusal(script, [*flags, "--output-dir", "out"], tmp_path, capfd, monkeypatch)
    assert line == (f"error: --output-dir out: {os.path.join('out', 'checkpoint.pth')} is not a file, so no checkpoint can be "
                    "written there; move it away or pass another --output-dir")
    (tmp_path / "out" / "checkpoint.pth").rmdir()
    (tmp_path / "out" / "checkpoint.pth.tmp").write_bytes(b"partial")
    run_here([str(script), *flags, "--output-dir", "out"], tmp_path, capfd, monkeypatch)
    assert not (tmp_path / "out" / "checkpoint.pth.tmp").exists()
    assert _checkpoint(tmp_path / "out" / "checkpoint.pth")["step"] == 1


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine without CUDA")
def test_a_gpu_setup_run_on_a_cpu_names_every_flag_to_change_in_one_line(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A GPU search's train.py on a CPU refused --device cuda, then --amp fp16, then --cudnn-benchmark, ...: one per run."""
    script = write_script(make_best(synthetic_data, device="cuda", batch_size=8, amp="fp16", cudnn_benchmark=True, tf32=True,
                                    compile="reduce-overhead"), tmp_path / "train.py")
    line, _ = in_process.refusal(script, ["--max-steps", "1", "--workers", "0"], tmp_path, capfd, monkeypatch)
    amp = "bf16" if collect_cpu().bf16 else "off"
    assert line == ("error: no CUDA device is visible, and this run's flags need one (a GPU's setup); to train here, add: "
                    f"--device cpu --amp {amp} --no-cudnn-benchmark --no-tf32 --compile default")
    flags = ["--device", "cpu", "--amp", amp, "--no-cudnn-benchmark", "--no-tf32", "--compile", "off", "--workers", "0"]
    run_here([str(script), "--max-steps", "1", *flags, "--output-dir", "out"], tmp_path, capfd, monkeypatch)  # then it trains
    assert _checkpoint(tmp_path / "out" / "checkpoint.pth")["step"] == 1


def test_data_too_small_for_one_step_names_the_flags_to_lower(synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """It read "13 images are too few for one step of 16 x 1 x 1 processes", naming no flag."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    images = len(list(synthetic_data.glob("*/*.jpg")))
    line, _ = in_process.refusal(script, ["--batch-size", str(images), "--accum-steps", "2", "--workers", "0", "--output-dir", "out"],
                                 tmp_path, capfd, monkeypatch)
    assert line == (f"error: {images} images are too few for one optimizer step of --batch-size {images} x --accum-steps 2; "
                    "pass a smaller --batch-size or --accum-steps")


def test_a_resumed_run_whose_epochs_are_used_up_says_so(synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """--resume --max-steps 100 after one epoch of --epochs 1 printed "done: step 2" and trained nothing, not saying why."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    flags = ["--epochs", "1", "--workers", "0", "--batch-size", "16", "--output-dir", "out"]
    run_here([str(script), *flags], tmp_path, capfd, monkeypatch)
    resumed = run_here([str(script), *flags, "--resume", "--max-steps", "100"], tmp_path, capfd, monkeypatch)
    assert "already at epoch 1 of --epochs 1 (step 2); nothing to do: raise --epochs to train on" in resumed, resumed  # 64 / (16 x 2)
    assert "done:" not in resumed


def test_more_threads_than_cores_are_said(synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A best.json tuned on a larger machine: its --threads set beyond the cores here, without a word."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    cores = len(os.sched_getaffinity(0))
    code, out, err = in_process.run_script(script, ["--threads", str(cores + 1), "--max-steps", "1", "--workers", "0",
                                                     "--batch-size", "2", "--output-dir", "out"], tmp_path, capfd, monkeypatch)
    assert code == 0, err
    assert f"warning: --threads {cores + 1} is more than the {cores} CPU cores this process may use" in out


def test_data_unpacked_from_a_mac_archive_is_refused_in_one_line_before_training(synthetic_data: Path, tmp_path: Path) -> None:
    """The search refuses '._' AppleDouble files and a __MACOSX folder (ImageFolder reads them as images); the script
    stopped on the first of them mid-epoch, telling to fix the file and resume. It names them all, before a step."""
    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    data = tmp_path / "my pets"
    for name in ("cat", "dog"):
        (data / name).mkdir(parents=True)
        (data / name / "a.jpg").symlink_to(next(synthetic_data.glob("*/*.jpg")))
        (data / name / "._a.jpg").write_bytes(b"\x00\x05\x16\x07")
    with pytest.raises(SystemExit, match=rf"^error: --val-data {data} holds macOS metadata \(2 files such as .+/\._a\.jpg\) "
                                         rf"that unpacking .*; remove them \(find -L '{data}' -name '\._\*' -delete\) and rerun$"):
        namespace["image_folder"](str(data), None, flag="--val-data")
    (data / "__MACOSX" / "cat").mkdir(parents=True)
    (data / "__MACOSX" / "cat" / "b.jpg").symlink_to(data / "cat" / "a.jpg")
    for junk in data.glob("*/._*"):
        junk.unlink()
    with pytest.raises(SystemExit, match=rf"\(1 file such as .+/__MACOSX/cat/b\.jpg\).*; remove them "
                                         rf"\(find -L '{data}' -name '\._\*' -delete; find -L '{data}' -name __MACOSX -prune "
                                         rf"-exec rm -rf \{{\}} \+\) and rerun$"):
        namespace["image_folder"](str(data), None)
    shutil.rmtree(data / "__MACOSX")
    (data / "cat" / "__MACOSX").mkdir()  # inside a class: named, and the command removes it
    (data / "cat" / "__MACOSX" / "c.jpg").symlink_to(data / "cat" / "a.jpg")
    with pytest.raises(SystemExit, match=r"\(1 file such as .+/cat/__MACOSX/c\.jpg\).* -name __MACOSX -prune -exec rm -rf"):
        namespace["image_folder"](str(data), None)
    shutil.rmtree(data / "cat" / "__MACOSX")
    outside = tmp_path / "__MACOSX_restore" / "pets"  # the name in --data itself is no metadata
    shutil.copytree(data, outside, symlinks=True)
    assert len(namespace["image_folder"](str(outside), None)) == 2
    assert len(namespace["image_folder"](str(data), None)) == 2


@pytest.mark.slow
def test_runs_under_torchrun(synthetic_data: Path, tmp_path: Path) -> None:
    # Measured with 2 ranks and DDP knobs other than PyTorch's defaults: the script applies them.
    ddp = dict(bucket_cap_mb=1, gradient_as_bucket_view=True)
    best = dataclasses.replace(make_best(synthetic_data, **CPU_KNOBS, **ddp), world_size=2)
    script = write_script(best, tmp_path / "train.py")
    assert "# Run: torchrun --nproc_per_node 2 " in script.read_text()
    proc = run_script(
        [str(script), "--max-steps", "2", "--batch-size", "4", "--workers", "0", "--print-freq", "1", "--output-dir", "out"],
        tmp_path,
        torchrun=True,
    )
    assert "2 process(es) on cpu" in proc.stdout and "note: tuned with" not in proc.stdout
    assert "DDP: bucket_cap_mb 1 gradient_as_bucket_view True static_graph False" in proc.stdout
    assert proc.stdout.count("step 2 loss") == 1  # rank 0 logs, rank 1 does not
    assert _checkpoint(tmp_path / "out" / "checkpoint.pth")["step"] == 2
    # static_graph cannot follow no_sync's changing graph: refused in one line, not a reducer assertion.
    refused = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
         "--static-graph", "--accum-steps", "2", "--max-steps", "1", "--batch-size", "4", "--workers", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT,
    )
    assert refused.returncode != 0 and "error: --static-graph cannot be used with --accum-steps > 1" in refused.stderr
    assert refused.stderr.count("error: --static-graph") == 1, refused.stderr  # rank 0 says it; rank 1 exits quietly


@pytest.mark.slow
def test_a_resume_under_torchrun_evaluates_an_unevaluated_epoch_on_every_rank(synthetic_data: Path, tmp_path: Path) -> None:
    """Rank 0 decides whether a resumed run evaluates first, for every rank (the evaluation sums over ranks: ranks that
    decided apart, reading OUTPUT_DIRs of their own nodes, would hang in it)."""
    script = write_script(dataclasses.replace(make_best(synthetic_data, **CPU_KNOBS), world_size=2), tmp_path / "train.py")
    flags = [str(script), "--epochs", "1", "--batch-size", "4", "--workers", "0", "--val-data", str(synthetic_data),
             "--output-dir", "out"]
    first = run_script(flags, tmp_path, torchrun=True)
    assert first.stdout.count("epoch 0 val top1") == 1 and (tmp_path / "out" / "evaluated-checkpoint").is_file()
    (tmp_path / "out" / "evaluated-checkpoint").unlink()  # as if the evaluation had not finished
    resumed = run_script([*flags, "--resume"], tmp_path, torchrun=True)
    assert resumed.stdout.count("(evaluated on resuming)") == 1 and "already at epoch 1 of --epochs 1" in resumed.stdout


@pytest.mark.slow
def test_the_validation_accuracy_under_torchrun_is_the_saved_model_s(synthetic_data: Path, tmp_path: Path) -> None:
    """Each rank evaluated with the BatchNorm statistics its own last batches left, not rank 0's, which the checkpoint
    holds: a 2-rank run printed 15/60 for a checkpoint that gets 16/60. The script's evaluate() under 2 gloo ranks whose
    BatchNorm buffers differ (rank 1's far off) counts as rank 0's model alone does."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    (tmp_path / "ranks.py").write_text(textwrap.dedent(f"""
        import os, runpy, sys, types
        import torch, torch.distributed as dist
        from torch import nn
        ns = runpy.run_path({str(script)!r}, run_name="emitted_train")
        dist.init_process_group("gloo")
        rank = dist.get_rank()
        torch.manual_seed(0)
        model = nn.Sequential(nn.Flatten(), nn.BatchNorm1d(12), nn.Linear(12, 3))
        images, target = torch.randn(40, 3, 2, 2), torch.randint(0, 3, (40,))
        model.eval()
        with torch.no_grad():
            alone = (model(images).argmax(1) == target).float().mean().item()  # rank 0's model, every image
            if rank == 1:
                model[1].running_mean.fill_(100.0)  # as a rank's own last batches leave its statistics
        shard = torch.utils.data.TensorDataset(images[rank::2], target[rank::2])
        args = types.SimpleNamespace(distributed=True, channels_last=False, amp="off")
        top1 = ns["evaluate"](model, torch.utils.data.DataLoader(shard, batch_size=8), torch.device("cpu"), args)
        if rank == 0:
            print(f"alone {{alone:.6f}} ranks {{top1:.6f}}")
        dist.destroy_process_group()
    """))
    ran = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "ranks.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert ran.returncode == 0, ran.stderr[-3000:]
    alone, ranks = re.search(r"alone (\S+) ranks (\S+)", ran.stdout).groups()  # type: ignore[union-attr]
    assert alone == ranks, ran.stdout


def _training_for_good_under_torchrun(synthetic_data: Path, tmp_path: Path, print_freq: int) -> tuple[Path, subprocess.Popen[str]]:
    """The emitted train.py for 2 ranks, started under torchrun to train until stopped (stdout and stderr piped)."""
    script = write_script(dataclasses.replace(make_best(synthetic_data, **CPU_KNOBS), world_size=2), tmp_path / "train.py")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
               "--max-steps", "100000", "--epochs", "100000", "--batch-size", "4", "--workers", "0", "--print-freq", str(print_freq),
               "--output-dir", "out"]
    return script, subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_a_rank_killed_under_torchrun_leaves_one_line_on_the_others(synthetic_data: Path, tmp_path: Path) -> None:
    """kill -9 of one rank: the other met gloo's 'Connection reset by peer' in its all-reduce and printed a
    25-line traceback; now one line naming --resume."""
    script, proc = _training_for_good_under_torchrun(synthetic_data, tmp_path, print_freq=1)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # rank 0 logs each step: both ranks are training
            if line.startswith("step 2 loss"):
                break
        rank_one = [child for child in psutil.Process(proc.pid).children(recursive=True)
                    if child.environ().get("RANK") == "1" and str(script) in " ".join(child.cmdline())]
        assert len(rank_one) == 1, rank_one
        rank_one[0].kill()
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0
    assert "error: rank 0: another process of the job ended (" in err and "--resume" in err, err
    # gloo's first sentence, not its advice; which words depend on where rank 0 was when its peer went (reading,
    # writing, or after torchrun's SIGTERM), so any of them, with or without the peer's address after them
    # ('Connection closed by peer [127.0.0.1]:63104', met on a loaded machine).
    said = next(line for line in err.splitlines() if line.startswith("error: rank 0: another process of the job ended ("))
    gloo = said.split("ended (", 1)[1].rsplit("); --resume", 1)[0]
    assert any(words in gloo for words in ("Connection reset by peer", "Connection closed by peer", "Broken pipe")), said
    assert len(gloo) < 200, said  # its first sentence, not its advice
    assert "GLHF" not in err
    # Rank 0 printed no traceback; torchrun's own summary of the failed job (its own traceback) follows the line.
    assert "[rank0]:" not in err and "Traceback" not in err.split("error: rank 0:")[0], err


@pytest.mark.slow
def test_a_sigterm_to_torchrun_stops_every_rank_after_a_step_with_its_checkpoint_between_log_lines(
    synthetic_data: Path, tmp_path: Path
) -> None:
    """The ranks checked for a stop at every --print-freq-th step only: with steps of seconds that outlasted torchrun's
    30-s grace, and it killed them without the stop's checkpoint. A --print-freq no step reaches here: they still stop
    after a step of their own, together, with the checkpoint of that step."""
    import time

    script, proc = _training_for_good_under_torchrun(synthetic_data, tmp_path, print_freq=100000)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # rank 0 is about to train
            if "process(es) on cpu" in line:
                break
        # Both ranks have their stop handler (SIGTERM caught: its bit in /proc/PID/status's SigCgt), however slow the machine.
        deadline = time.monotonic() + RUN_TIMEOUT
        while True:
            ranks = [child for child in psutil.Process(proc.pid).children(recursive=True)
                     if str(script) in " ".join(child.cmdline()) and child.environ().get("RANK") in ("0", "1")]
            caught = [int(next(line.split()[1] for line in Path(f"/proc/{rank.pid}/status").read_text().splitlines()
                               if line.startswith("SigCgt:")), 16) >> (signal.SIGTERM - 1) & 1 for rank in ranks]
            if len(ranks) == 2 and all(caught):
                break
            assert time.monotonic() < deadline and proc.poll() is None, (ranks, caught)
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)  # as a scheduler stops torchrun: it passes the signal to the ranks
        rest, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = [line for line in rest.splitlines() if line.startswith("stopped by SIGTERM after step ")]
    assert len(said) == 1, f"{rest}\n{err}"
    step = int(said[0].split("after step ")[1].split(";")[0])
    assert 0 < step < 100000 and _checkpoint(tmp_path / "out" / "checkpoint.pth")["step"] == step
    assert "forcefully exiting" not in err, err  # stopped within torchrun's grace, not killed


@pytest.mark.slow
def test_fp32_factory_model_with_eval_runs(synthetic_data: Path, tmp_path: Path) -> None:
    # amp off, no workers, no channels_last, a module:function factory imported
    # from the cwd, and an evaluation pass.
    (tmp_path / "small_nets.py").write_text(
        "from torch import nn\n"
        "def net(num_classes):\n"
        "    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=4), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))\n"
    )
    best = make_best(synthetic_data, model="small_nets:net", batch_size=16)
    script = write_script(best, tmp_path / "emit" / "train.py")
    proc = run_script(
        [str(script), "--epochs", "1", "--print-freq", "2", "--val-data", str(synthetic_data), "--output-dir", "out"],
        tmp_path,
    )
    assert "amp off" in proc.stdout
    assert "epoch 0 done at step 4" in proc.stdout
    assert "epoch 0 val top1" in proc.stdout
    assert _checkpoint(tmp_path / "out" / "checkpoint.pth")["epoch"] == 1


@pytest.mark.slow
def test_a_much_larger_batch_warms_the_learning_rate_up(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Effective batch 16 against a reference of 2 (8x): linear warm-up (its length: the test above), lr x sqrt(8)."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "emit" / "train.py")
    run = tmp_path / "run"
    run.mkdir()
    out = run_here([str(script), "--max-steps", "1", "--reference-batch", "2", "--warmup-steps", "4", "--output-dir", "out"],
                   run, capfd, monkeypatch)
    assert "lr 0.001 x sqrt(16 / 2) = 0.00282843, warm-up 4 steps" in out
    checkpoint = _checkpoint(run / "out" / "checkpoint.pth")
    lr = checkpoint["optimizer"]["param_groups"][0]["lr"]
    assert lr == pytest.approx(0.001 * 8**0.5 / 4)  # the first of 4 warm-up steps


def test_auxiliary_classifiers_count_in_the_loss_as_in_the_search(synthetic_data: Path, tmp_path: Path) -> None:
    """Inception v3 and GoogLeNet return auxiliary logits in training mode: the script and the trials weigh them alike."""
    import torch
    from torchvision.models.googlenet import GoogLeNetOutputs
    from torchvision.models.inception import InceptionOutputs

    from autotune.errors import WorkloadError
    from autotune.workloads.models import classification_loss

    namespace = load_script(write_script(make_best(synthetic_data, batch_size=4), tmp_path / "train.py"))
    script_loss = namespace["classification_loss"]
    criterion = torch.nn.CrossEntropyLoss()
    torch.manual_seed(0)
    a, b, c = (torch.randn(4, 10) for _ in range(3))
    labels = torch.tensor([0, 3, 9, 1])

    def ce(x: torch.Tensor) -> float:
        return float(criterion(x, labels))

    cases = [
        (a, ce(a)),
        (InceptionOutputs(a, b), ce(a) + 0.4 * ce(b)),
        (GoogLeNetOutputs(a, b, c), ce(a) + 0.3 * ce(b) + 0.3 * ce(c)),
        (InceptionOutputs(a, None), ce(a)),  # aux_logits=False
    ]
    for output, expected in cases:
        assert float(classification_loss(output, labels)) == pytest.approx(expected)
        assert float(script_loss(criterion, output, labels)) == pytest.approx(expected)
    with pytest.raises(WorkloadError, match=r"returned dict, not a logits tensor.*--workload"):
        classification_loss({"out": a}, labels)


@pytest.mark.slow
def test_a_model_with_auxiliary_classifiers_trains_in_a_trial(synthetic_data: Path) -> None:
    from autotune.records import TrialOptions
    from autotune.runner import run_trial

    workload = Workload(model="googlenet", image_size=64, data=str(synthetic_data), device="cpu")
    result = run_trial(TrainSetup(batch_size=2), workload, TrialOptions(trial_seconds=0.5, windows=2))
    assert result.status == "ok", result.error


@pytest.mark.slow
def test_a_bad_image_is_one_line_naming_it_and_a_bad_validation_image_loses_no_training(
    synthetic_data: Path, tmp_path: Path, request: pytest.FixtureRequest, capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the search says it: the file named, one line, exit 1, from the loader's worker or from the main process. The
    run with a loader worker is a process of its own (its pymp-* folder goes at its exit); the others run here."""
    data, val = tmp_path / "data", tmp_path / "val"
    for name in sorted(p.name for p in synthetic_data.iterdir() if p.is_dir())[:2]:
        for root, count in ((data, 8), (val, 2)):
            (root / name).mkdir(parents=True)
            for image in sorted((synthetic_data / name).iterdir())[:count]:
                (root / name / image.name).symlink_to(image)
    script = write_script(make_best(synthetic_data, model="resnet18", batch_size=4), tmp_path / "train.py")
    (val / name / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    # One whole epoch, whatever the fixture's images per class: its evaluation follows, and fails. A short TMPDIR: the
    # worker's socket under pytest-xdist's tmp_path passes the 107 bytes AF_UNIX allows.
    temp = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    proc = subprocess.run([sys.executable, str(script), "--epochs", "1", "--batch-size", "4", "--image-size", "32", "--amp", "off",
                           "--data", str(data), "--val-data", str(val), "--workers", "1", "--output-dir", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT, env={**os.environ, "TMPDIR": str(temp)})
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr[-2000:]
    assert proc.stderr.startswith(f"error: bad image {val / name / 'broken.jpg'}: ") and "Traceback" not in proc.stderr
    assert not list(temp.glob("pymp-*"))  # the loader's worker shut down before the exit: it left no pymp-* folder
    assert _checkpoint(tmp_path / "out" / "checkpoint.pth")["epoch"] == 1  # the epoch before the evaluation is kept
    # The file removed, --resume evaluates that epoch (before, it said "nothing to do": no accuracy was ever reported).
    (val / name / "broken.jpg").unlink()
    args = ["--epochs", "1", "--batch-size", "4", "--image-size", "32", "--amp", "off", "--data", str(data), "--val-data", str(val),
            "--workers", "0", "--output-dir", "out", "--resume"]
    code, out, err = in_process.run_main(script, args, tmp_path, capfd, monkeypatch)
    assert code == 0, err[-2000:]
    assert re.search(r"epoch 0 val top1 [0-9.]+ \(evaluated on resuming\)", out), out
    assert "already at epoch 1 of --epochs 1" in out
    code, out, err = in_process.run_main(script, args, tmp_path, capfd, monkeypatch)  # evaluated now: not again
    assert code == 0 and "val top1" not in out and "already at epoch 1" in out, out
    # A fresh run in that directory whose evaluation fails: the earlier run's record names another checkpoint, so the
    # resume evaluates this one (a record by step number matched it, and the evaluation was skipped).
    (val / name / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    code, out, err = in_process.run_main(script, [arg for arg in args if arg != "--resume"], tmp_path, capfd, monkeypatch)
    assert code == 1 and "bad image" in err, err[-2000:]
    (val / name / "broken.jpg").unlink()
    code, out, err = in_process.run_main(script, args, tmp_path, capfd, monkeypatch)
    assert code == 0 and "(evaluated on resuming)" in out, out
    # In the main process (no worker): one step of a batch of 2 reads both images of this folder.
    small = tmp_path / "small"
    (small / "a").mkdir(parents=True)
    (small / "b").mkdir()
    (small / "a" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    (small / "b" / "good.jpg").symlink_to(next((synthetic_data / name).iterdir()))
    code, out, err = in_process.run_main(script, ["--max-steps", "1", "--batch-size", "2", "--image-size", "32", "--data", str(small),
                                                  "--workers", "0", "--output-dir", "out2"], tmp_path, capfd, monkeypatch)
    assert code == 1 and err.startswith(f"error: bad image {small / 'a' / 'broken.jpg'}"), err[-2000:]


def test_a_bad_training_image_keeps_the_steps_trained_before_it(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bad training image met mid-epoch ended the script without a checkpoint: the steps since the last one were lost
    (with --checkpoint-every 0 a whole epoch's), where a SIGTERM at that step writes one. The checkpoint of the last
    finished step is written, and --resume, once the file is fixed, goes on from it."""
    import shutil

    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    victim = sorted((data / "class_05").iterdir())[-1]
    good = victim.read_bytes()
    victim.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    run = ["--epochs", "1", "--batch-size", "2", "--image-size", "32", "--amp", "off", "--data", str(data),
           "--workers", "0", "--output-dir", "out", "--checkpoint-every", "0", "--print-freq", "1"]
    code, out, err = in_process.run_main(script, run, tmp_path, capfd, monkeypatch)
    assert code == 1 and f"error: bad image {victim}" in err, err[-2000:]
    step = int(re.search(r"stopped by a bad image after step (\d+); checkpoint in ", out).group(1))  # type: ignore[union-attr]
    assert step > 0 and (tmp_path / "out" / "checkpoint.pth").is_file()
    victim.write_bytes(good)
    code, out, err = in_process.run_main(script, [*run, "--resume"], tmp_path, capfd, monkeypatch)
    assert code == 0 and f"at epoch 0 step {step}" in out, out[-2000:]


@pytest.mark.slow
def test_a_bad_image_under_torchrun_keeps_the_steps_and_checkpoints_of_other_steps_are_refused(synthetic_data: Path, tmp_path: Path) -> None:
    """Under torchrun a bad training image lost the steps since the last checkpoint (rank 0 alone writes one, and it
    waited for the failing rank in a collective): the rank that meets it writes the checkpoint of the last finished
    step, which every rank holds alike. Copies of different steps (that rank's node and rank 0's, each its own
    --output-dir) would then train apart: --resume refuses them on every rank."""
    import torch

    script = write_script(dataclasses.replace(make_best(synthetic_data, **CPU_KNOBS), world_size=2), tmp_path / "train.py")
    data = tmp_path / "data"
    shutil.copytree(synthetic_data, data)
    victim = sorted((data / "class_05").iterdir())[-1]
    good = victim.read_bytes()
    victim.write_bytes(b"\xff\xd8\xff\xe0 not a jpeg")
    flags = [str(script), "--epochs", "2", "--batch-size", "2", "--image-size", "32", "--amp", "off", "--data", str(data),
             "--workers", "0", "--checkpoint-every", "0", "--print-freq", "1"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *flags, "--output-dir", "out"]
    failed = subprocess.run(torchrun, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert failed.returncode != 0 and f"error: bad image {victim}" in failed.stderr, failed.stderr[-3000:]
    rank, step = map(int, re.search(r"rank (\d): stopped by a bad image after step (\d+); checkpoint in out/checkpoint.pth",  # type: ignore[union-attr]
                                    failed.stdout).groups())
    assert rank == 1 and step > 0, failed.stdout  # this file, at --seed 0, is rank 1's: not the rank that writes checkpoints
    written = _checkpoint(tmp_path / "out" / "checkpoint.pth")
    assert written["step"] == step
    victim.write_bytes(good)

    older = dict(written, step=step - 1)  # another node's copy, of a step before
    (tmp_path / "node2").mkdir()
    torch.save(older, tmp_path / "node2" / "checkpoint.pth")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [subprocess.Popen([sys.executable, *flags, "--output-dir", out, "--resume"], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(r),
                                   "LOCAL_RANK": str(r), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"})
             for r, out in enumerate(("out", "node2"))]
    said = [proc.communicate(timeout=RUN_TIMEOUT) for proc in ranks]
    assert [proc.returncode for proc in ranks] == [1, 1], said
    assert said[0][1].strip().splitlines()[-1] == (
        f"error: --resume: the processes found checkpoints of different steps in --output-dir ({step - 1} to {step}): copy "
        f"the newest checkpoint.pth (step {step}) to every node's --output-dir"), said
    assert said[1][1].strip() == "", said  # rank 0 alone says it

    resumed = subprocess.run([*torchrun, "--resume"], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert resumed.returncode == 0 and f"at epoch 0 step {step}" in resumed.stdout, resumed.stderr[-3000:]


def test_a_path_the_output_cannot_encode_is_printed_escaped(synthetic_data: Path, tmp_path: Path) -> None:
    """An ASCII stdout and an --output-dir named out_\u00e9: the steps trained, then the `done: ... checkpoint in` line
    raised UnicodeEncodeError, exit 1 (and --help, showing a tuned --data so named, did too)."""
    named = tmp_path / "donn\u00e9es"
    shutil.copytree(synthetic_data, named)
    script = write_script(make_best(synthetic_data, data=str(named), **CPU_KNOBS), tmp_path / "train.py")
    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    helped = subprocess.run([sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT)
    assert helped.returncode == 0 and "donn\\xe9es" in helped.stdout, helped.stderr[-2000:]
    proc = subprocess.run([sys.executable, str(script), "--max-steps", "1", "--batch-size", "2", "--image-size", "32", "--workers", "0",
                           "--output-dir", "out_\u00e9"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0 and "checkpoint in out_\\xe9" in proc.stdout, proc.stderr[-2000:]


def test_main_refuses_a_number_out_of_range_without_the_script_s_parser(synthetic_data: Path, tmp_path: Path) -> None:
    """The parser refuses them (exit 2); main(args) of a parser built with parents=[get_args_parser(add_help=False)] or
    parse_known_args skipped every check, and --batch-size 0 ended in torch's traceback."""
    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    args, _ = namespace["get_args_parser"]().parse_known_args(["--batch-size", "0", "--unknown"])
    with pytest.raises(SystemExit, match=r"^error: --batch-size must be >= 1$"):
        namespace["main"](args)


def test_an_image_over_pils_pixel_limit_is_a_bad_image_naming_it(synthetic_data: Path, tmp_path: Path, monkeypatch) -> None:
    """PIL's DecompressionBombError is not an OSError: train.py ended in a traceback that named no file."""
    from PIL import Image

    namespace = load_script(write_script(make_best(synthetic_data), tmp_path / "train.py"))
    huge = tmp_path / "huge.png"
    Image.new("RGB", (20, 20)).save(huge)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 400 pixels is over twice the limit: refused
    with pytest.raises(namespace["BadImage"], match=f"^bad image {huge}: DecompressionBombError: "):
        namespace["load_rgb"](str(huge))


def test_hidden_and_system_folders_are_said_as_the_search_says_them(synthetic_data: Path, tmp_path: Path) -> None:
    """The search warns of a `.thumbs` folder read as a class and of images in a hidden folder inside a class; the
    script trained on them without a word. It says what the search says."""
    from torchvision.datasets import ImageFolder

    from autotune.workloads.folders import folder_warning

    namespace = load_script(write_script(make_best(synthetic_data), tmp_path / "train.py"))
    image = next(synthetic_data.glob("*/*.jpg"))
    data = tmp_path / "data"
    for folder in ("a", "b", ".thumbs", "a/.thumbs", "b/@eaDir", "b/fine"):
        (data / folder).mkdir(parents=True, exist_ok=True)
        (data / folder / "x.jpg").symlink_to(image)
    found = ImageFolder(str(data))
    said = namespace["folder_warning"](str(data), found.classes, found.samples)
    assert said == folder_warning(data, found.classes, found.samples), said
    assert said.startswith(f"a hidden or system folder of {data} is read as a class (.thumbs); 2 images in hidden or system folders "
                           "inside class folders are read as images of their class (a/.thumbs/x.jpg, ...): ImageFolder takes them")
    clean = ImageFolder(str(synthetic_data))
    assert namespace["folder_warning"](str(synthetic_data), clean.classes, clean.samples) is None


def test_a_fifo_named_like_an_image_and_a_link_loop_are_refused_as_the_search_refuses_them(synthetic_data: Path, tmp_path: Path) -> None:
    """A FIFO named pipe.jpg: the script took a step and then waited for a writer for good (the trial names it). A
    link to a folder that holds it: the script trained on the same images round after round (the search refuses it)."""
    namespace = load_script(write_script(make_best(synthetic_data), tmp_path / "train.py"))
    fifo = tmp_path / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(namespace["BadImage"], match=f"^bad image {fifo}: ValueError: not a regular file \\(a FIFO, socket or device\\)$"):
        namespace["load_rgb"](str(fifo))
    with pytest.raises(namespace["BadImage"], match=f"^bad image {fifo}: not a regular file"):
        namespace["read_bytes"](str(fifo))  # --decode gpu
    dangling = tmp_path / "gone.jpg"  # ls lists it: "No such file or directory" named a file that looked there
    dangling.symlink_to("/nonexistent/gone.jpg")
    for read in ("load_rgb", "read_bytes"):
        with pytest.raises(namespace["BadImage"], match=f"^bad image {dangling}: .*a symbolic link to /nonexistent/gone.jpg, which does not exist"):
            namespace[read](str(dangling))
    chained = tmp_path / "chained.jpg"  # a link to that link: the chain's end is named, not the link ls lists
    chained.symlink_to("gone.jpg")
    with pytest.raises(namespace["BadImage"], match="a chain of links that ends at /nonexistent/gone.jpg, which does not exist"):
        namespace["load_rgb"](str(chained))
    data = tmp_path / "loop"
    (data / "a").mkdir(parents=True)
    (data / "a" / "x.jpg").symlink_to(next(synthetic_data.glob("*/*.jpg")))
    (data / "a" / "up").symlink_to(data)
    with pytest.raises(SystemExit, match=rf"^error: --data {data}: {data}/a/up links to {data}, which holds the link itself: "
                                         "ImageFolder follows it and reads the same images again, round after round; remove the link$"):
        namespace["image_folder"](str(data), None)
    (data / "a" / "up").unlink()
    (data / "b").mkdir()
    (data / "a" / "to_b").symlink_to(data / "b")
    (data / "b" / "to_a").symlink_to(data / "a")  # a loop of two links: the search refuses it too
    with pytest.raises(SystemExit, match=rf"^error: --data {data}: {data}/(a/to_b/to_a links to {data}/a|b/to_a/to_b links to "
                                         rf"{data}/b), which holds the link"):  # whichever the walk meets first
        namespace["image_folder"](str(data), None)
    (data / "b" / "to_a").unlink()
    (data / "a" / "to_b").unlink()
    (data / "b").rmdir()
    (data / "a" / "top").symlink_to(tmp_path)  # above --data: named at once, as the link itself
    with pytest.raises(SystemExit, match=rf"^error: --data {data}: {data}/a/top links to {tmp_path}, which holds the link"):
        namespace["image_folder"](str(data), None)
    (data / "a" / "top").unlink()
    (data / "a" / "elsewhere").symlink_to(synthetic_data)  # a link to a folder that does not hold it is read as before
    assert len(namespace["image_folder"](str(data), None).samples) == 1 + len(list(synthetic_data.glob("*/*.jpg")))


@pytest.mark.parametrize("error", [RuntimeError("DataLoader worker (pid 7) is killed by signal: Terminated."), EOFError(),
                                   ConnectionResetError(104, "Connection reset by peer")], ids=["loader", "eof", "reset"])
def test_workers_ended_by_the_stop_signal_stop_training_however_the_loader_reports_it(synthetic_data: Path, tmp_path: Path,
                                                                                      error: Exception) -> None:
    """A job-wide SIGTERM ends the loader's worker too: the DataLoader says so in its own error, or, when the worker was
    handing a batch over in shared memory, as that hand-over's connection closing (a CI run met an EOFError there,
    exit 1 with a traceback). After the stop signal each means "stop after the last whole step"; before it, each is
    an error of its own and is raised."""
    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    stop = namespace["GracefulStop"]()
    try:
        def work():
            raise error

        with pytest.raises(type(error)):
            stop.unless_workers_gone(work, "gone")
        stop.name = "SIGTERM"
        assert stop.unless_workers_gone(work, "gone") == "gone" and stop.stopped
        with pytest.raises(RuntimeError, match="CUDA"):
            stop.unless_workers_gone(lambda: (_ for _ in ()).throw(RuntimeError("CUDA error")), "gone")
    finally:
        stop.close()


@pytest.mark.parametrize("ending", ["peer", "refusal"])
def test_torchrun_s_sigterm_after_a_peer_s_end_waits_for_the_error_s_line(synthetic_data: Path, tmp_path: Path, ending: str) -> None:
    """A rank killed under torchrun: the other meets gloo's error, and torchrun sends it SIGTERM at about the same time.
    The handlers went back to SIG_DFL as the error left training, so a SIGTERM 2 ms later ended the rank before it
    printed its line (1 run in 8 of ``test_a_rank_killed_under_torchrun_leaves_one_line_on_the_others``). Run as a
    program (the script's own ``__main__`` block, its main() made to fail so, the SIGTERM sent as the error leaves
    training), the line is printed and the rank exits 1; called in-process, SIGTERM's handler is back at once."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    failure = "RuntimeError('Connection reset by peer')" if ending == "peer" else "SystemExit('error: --resume: no checkpoint')"
    failing_main = (
        "def main(args):\n"
        "    stop = GracefulStop()\n"
        "    try:\n"
        f"        raise {failure}\n"
        "    finally:\n"
        "        stop.close()\n"
        "        os.kill(os.getpid(), signal.SIGTERM)  # torchrun's, as the error leaves training\n"
        "        time.sleep(0.2)\n"
        "def _searched_main(args):\n"
    )
    source = script.read_text().replace("def main(args):\n", failing_main, 1)
    program = tmp_path / "rank.py"
    program.write_text(source)
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    ran = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=RUN_TIMEOUT, env=env, cwd=tmp_path)
    said = ("error: rank 0: another process of the job ended (Connection reset by peer); --resume goes on from the last "
            "checkpoint written, if any") if ending == "peer" else "error: --resume: no checkpoint"
    assert ran.returncode == 1 and ran.stderr.strip().splitlines()[-1] == said, (ran.returncode, ran.stderr)
    # In-process (a test, a notebook calling main()): nothing is held, the handler before is back.
    namespace = load_script(script)
    before = signal.getsignal(signal.SIGTERM)
    stop = namespace["GracefulStop"]()
    with pytest.raises(RuntimeError):
        try:
            raise RuntimeError("Connection reset by peer")
        finally:
            stop.close()
    assert signal.getsignal(signal.SIGTERM) is before


def test_under_torchrun_the_ranks_check_for_a_stop_every_two_seconds_of_the_slowest_rank_s_steps(
    synthetic_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks' schedule, on a clock of our own: the first step starts it, the second checks, and each check sets the
    next CHECK_EVERY_S of the slowest rank's steps later (every rank gets the same all-reduced time, so they agree)."""
    import argparse

    import torch

    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    now = [100.0]
    monkeypatch.setattr(namespace["time"], "monotonic", lambda: now[0])
    reduced: list[int] = []

    def all_reduce(told: torch.Tensor, op: object = None) -> None:  # the slower peer's time per step
        told[1] = max(float(told[1]), 0.5)
        reduced.append(len(reduced))

    monkeypatch.setattr(namespace["dist"], "all_reduce", all_reduce)
    args = argparse.Namespace(distributed=True)
    stop = namespace["GracefulStop"]()
    try:
        said = []
        for step in range(1, 12):
            if step == 3:
                stop._received(signal.SIGTERM, None)
            said.append(stop.now(step, args, torch.device("cpu")))
            now[0] += 0.1  # this rank's steps: 0.1 s; the slowest's 0.5 s
        # Step 2 checks (1 step of 0.5 s: the next 4 steps on); step 6 finds the stop, however many steps ran meanwhile.
        assert said == [False] * 5 + [True] * 6 and reduced[:2] == [0, 1], said
    finally:
        stop.close()


@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")  # the OSError surfaces as one in a C call
def test_a_sigchld_pending_with_the_stop_signal_raises_nothing(synthetic_data: Path, tmp_path: Path) -> None:
    """A job-wide SIGTERM and the SIGCHLD of the worker it ended, pending together: Python runs their handlers in
    signal order, the stop's first. It swapped PyTorch's SIGCHLD handler for SIG_DFL, so the pending SIGCHLD then
    raised "OSError: Signal 17 ignored due to race condition" mid-step (a CI run's traceback)."""
    import time

    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    children: list[int] = []
    before = signal.signal(signal.SIGCHLD, lambda signum, frame: children.append(signum))  # as PyTorch's DataLoader sets one
    both = {signal.SIGTERM, signal.SIGCHLD}
    stop = namespace["GracefulStop"]()
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, both)
        os.kill(os.getpid(), signal.SIGCHLD)
        os.kill(os.getpid(), signal.SIGTERM)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)  # both delivered now; the handlers run at the next bytecode
        for _ in range(3):
            time.sleep(0.01)
        assert stop.name == "SIGTERM"
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
        stop.close()
        signal.signal(signal.SIGCHLD, before)
    assert signal.getsignal(signal.SIGCHLD) is before


def test_a_stopped_script_exits_without_pytorch_s_sigchld_handler_back(synthetic_data: Path, tmp_path: Path) -> None:
    """A job-wide SIGTERM ends the loader's workers too; the script stopped cleanly, then now and then printed a 20-line
    "Exception ignored in ... _MultiProcessingDataLoaderIter.__del__ ... DataLoader worker (pid N) is killed by signal:
    Terminated": PyTorch's SIGCHLD handler, put back as the stop's SystemExit left training, ran as the loader shut its
    dead workers down at exit. It stays off on that way out; any other way out puts it back."""
    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    def pytorch_s(signum: int, frame: Any) -> None:  # as PyTorch's DataLoader sets one
        pass

    before = signal.getsignal(signal.SIGCHLD)
    try:
        for leaving, kept in ((SystemExit(130), True), (RuntimeError("another error"), False)):
            signal.signal(signal.SIGCHLD, pytorch_s)
            stop = namespace["GracefulStop"]()
            stop._received(signal.SIGTERM, None)
            with pytest.raises(type(leaving)):
                try:
                    raise leaving
                finally:
                    stop.close()
            assert signal.getsignal(signal.SIGCHLD) == (stop._child_ended if kept else pytorch_s), leaving
            assert signal.getsignal(signal.SIGTERM) != stop._received  # the stop handlers go back either way
    finally:
        signal.signal(signal.SIGCHLD, before)


@pytest.mark.slow
@pytest.mark.parametrize("signum", [2, 15, 1], ids=["SIGINT", "SIGTERM", "SIGHUP"])  # SIGHUP: a terminal closed (no nohup)
def test_ctrl_c_or_sigterm_stops_after_the_step_with_a_checkpoint_to_resume_from(
    synthetic_data: Path, tmp_path: Path, signum: int, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """A real signal to a real run's whole process group, its loader worker too (as a terminal's Ctrl-C reaches them):
    one line, exit 130, a checkpoint at the step it stopped after."""
    import time

    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    # The loader worker's multiprocessing directory (pymp-*) goes here. A short path: its socket path (pymp-*/listener-*)
    # under pytest-xdist's tmp_path passed the 107 bytes AF_UNIX allows, and the run hung at its first batches.
    temp = Path(tempfile.mkdtemp(prefix="at-", dir="/tmp"))
    request.addfinalizer(lambda: shutil.rmtree(temp, ignore_errors=True))
    proc = subprocess.Popen([sys.executable, str(script), "--epochs", "1000", "--print-freq", "1", "--output-dir", "out"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "TMPDIR": str(temp)})
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + RUN_TIMEOUT
        for line in proc.stdout:  # the second step logged: the loader's worker is running
            if line.startswith("step 2 ") or time.monotonic() > deadline:
                break
        os.killpg(proc.pid, signum)
        rest, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        proc.kill()
    name = signal.Signals(signum).name
    said = [line for line in rest.splitlines() if line.startswith("stopped by")]
    assert proc.returncode == 130 and "Traceback" not in err, f"exit {proc.returncode}\n{rest}\n{err}"
    assert len(said) == 1 and said[0].startswith(f"stopped by {name} after step ")
    if signum == signal.SIGINT:  # the worker was shut down, not killed at exit with its pymp-* directory left
        assert list(temp.glob("pymp-*")) == []  # (a SIGTERM to the whole job ends the worker itself, as it must)
    step = int(said[0].split("after step ")[1].split(";")[0])
    assert said[0].endswith("; checkpoint in out/checkpoint.pth; rerun with --resume to go on")
    checkpoint = _checkpoint(tmp_path / "out" / "checkpoint.pth")
    assert checkpoint["step"] == step >= 2 and checkpoint["epoch_step"] == step % 4 and checkpoint["epoch"] == step // 4
    resumed = run_here([str(script), "--resume", "--max-steps", str(step + 1), "--print-freq", "1", "--output-dir", "out"],
                       tmp_path, capfd, monkeypatch)
    assert f"resumed from out/checkpoint.pth at epoch {step // 4} step {step}" in resumed


def test_resume_on_data_of_another_size_is_refused_in_one_line(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The position in an epoch and its shuffle follow the number of samples: fewer of them crashed in islice, more
    resumed silently into another order."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "emit" / "train.py")
    run, fewer = tmp_path / "run", tmp_path / "fewer"
    run.mkdir()
    for name in sorted(p.name for p in synthetic_data.iterdir() if p.is_dir()):
        (fewer / name).mkdir(parents=True)
        for image in sorted((synthetic_data / name).iterdir())[:4]:
            (fewer / name / image.name).symlink_to(image)
    run_here([str(script), "--max-steps", "3", "--workers", "0", "--output-dir", "out"], run, capfd, monkeypatch)
    line, _ = in_process.refusal(script, ["--resume", "--workers", "0", "--data", str(fewer), "--output-dir", "out"], run, capfd,
                                 monkeypatch)
    assert line.startswith("error: --resume: out/checkpoint.pth was written for 64 samples per process, the data now holds ")
    assert line.endswith("resume with the data it was written for, or pass another --output-dir to start afresh")
    # A class folder renamed (as many images): the labels after it shift by one, and the resume went on silently.
    renamed = tmp_path / "renamed"
    classes = sorted(p.name for p in synthetic_data.iterdir() if p.is_dir())
    first = classes[0]
    for name in classes:
        shutil.copytree(synthetic_data / name, renamed / ("zz_last" if name == first else name))
    line, _ = in_process.refusal(script, ["--resume", "--workers", "0", "--data", str(renamed), "--output-dir", "out"], run, capfd,
                                 monkeypatch)
    assert line == (f"error: --resume: out/checkpoint.pth was written for other class folders (gone: {first}; new: zz_last): the "
                    "labels would change meaning; resume with the data it was written for, or pass another --output-dir to start "
                    "afresh")
    # Damaged bytes that still load (a weight turned NaN) are the file's fault, not the learning rate's.
    import torch

    checkpoint = _checkpoint(run / "out" / "checkpoint.pth")
    weight = next(key for key, value in checkpoint["model"].items() if value.is_floating_point() and value.numel() > 1)
    checkpoint["model"][weight] = torch.full_like(checkpoint["model"][weight], float("nan"))
    torch.save(checkpoint, run / "out" / "checkpoint.pth")
    line, _ = in_process.refusal(script, ["--resume", "--workers", "0", "--output-dir", "out"], run, capfd, monkeypatch)
    assert line.startswith("error: --resume: out/checkpoint.pth holds NaN or infinite weights") and "damaged" in line, line


def test_a_second_ctrl_c_during_a_checkpoint_write_leaves_no_partial_file(
    synthetic_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second Ctrl-C stops at once, also inside torch.save (Python runs the handler between the records it writes):
    the partial checkpoint.pth.tmp (a model's size) is removed, and the checkpoint written before it is kept."""
    import argparse

    import torch

    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    args = argparse.Namespace(output_dir=str(tmp_path), batch_size=8)
    namespace["save_checkpoint"](args, model, optimizer, None, {"epoch": 0, "epoch_step": 3, "step": 3})

    def interrupted(obj: Any, file: Any) -> None:
        file.write(b"PK partial")
        raise KeyboardInterrupt

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):  # undone here, not conftest's own patches
        patched.setattr(torch, "save", interrupted)
        namespace["save_checkpoint"](args, model, optimizer, None, {"epoch": 0, "epoch_step": 4, "step": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pth", "train.py"]
    assert torch.load(tmp_path / "checkpoint.pth", weights_only=True)["step"] == 3

    # Inside torch.save's C++ writer the interrupt comes out as its own RuntimeError: still the second Ctrl-C, not a
    # disk error (before: "error: cannot write .../checkpoint.pth: [enforce fail at inline_container.cc:672] ...", exit 1).
    def torn(obj: Any, file: Any) -> None:
        file.write(b"PK partial")
        namespace["GracefulStop"].at_once = True  # as the second signal's handler marks it
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 85975360 vs 85975248")

    with monkeypatch.context() as patched, pytest.raises(KeyboardInterrupt):
        patched.setattr(torch, "save", torn)
        namespace["save_checkpoint"](args, model, optimizer, None, {"epoch": 0, "epoch_step": 4, "step": 4})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pth", "train.py"]


def test_a_checkpoint_that_cannot_be_written_is_one_line_keeping_the_last_one(synthetic_data: Path, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save reports a full disk as a RuntimeError: one line naming the file, the partial .tmp removed, the
    checkpoint written before it kept."""
    import argparse

    import torch

    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    args = argparse.Namespace(output_dir=str(tmp_path), batch_size=8)
    namespace["save_checkpoint"](args, model, optimizer, None, {"epoch": 0, "epoch_step": 3, "step": 3})

    def full(obj: Any, file: Any) -> None:
        file.write(b"PK partial")
        raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0: No space left on device")

    with monkeypatch.context() as patched, pytest.raises(SystemExit) as stopped:
        patched.setattr(torch, "save", full)
        namespace["save_checkpoint"](args, model, optimizer, None, {"epoch": 0, "epoch_step": 4, "step": 4})
    assert str(stopped.value.code).startswith(f"error: cannot write {tmp_path / 'checkpoint.pth'}: [enforce fail")
    assert str(stopped.value.code).endswith("No space left on device; the checkpoint written before it is kept")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pth", "train.py"]
    assert torch.load(tmp_path / "checkpoint.pth", weights_only=True)["step"] == 3
    # The words torch really gave a probe's full tmpfs name no full disk: the free space, read before the partial file
    # goes, says it.

    def unsaid(obj: Any, file: Any) -> None:
        file.write(b"PK partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1216 vs 1110")

    class Full:
        f_frsize, f_bavail = 4096, 3

    with monkeypatch.context() as patched, pytest.raises(SystemExit) as stopped:
        patched.setattr(torch, "save", unsaid)
        patched.setattr(os, "statvfs", lambda path: Full())
        namespace["save_checkpoint"](args, model, optimizer, None, {"epoch": 0, "epoch_step": 4, "step": 4})
    assert str(stopped.value.code) == (f"error: cannot write {tmp_path / 'checkpoint.pth'}: No space left on device (12 KiB free; "
                                       "torch said: [enforce fail at inline_container.cc:672] . unexpected pos 1216 vs 1110); "
                                       "the checkpoint written before it is kept")


def test_a_checkpoint_is_on_disk_before_it_replaces_the_last_one(synthetic_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new checkpoint is fsynced, whole, before the rename: after a power cut the file is the old or the new one."""
    import argparse

    import torch

    namespace = load_script(write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py"))
    model = torch.nn.Linear(4, 2)
    args = argparse.Namespace(output_dir=str(tmp_path), batch_size=8)
    synced: list[tuple[str, int]] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        synced.append((os.path.basename(name), os.path.getsize(name)))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    namespace["save_checkpoint"](args, model, torch.optim.AdamW(model.parameters()), None, {"epoch": 0, "epoch_step": 3, "step": 3})
    assert synced == [("checkpoint.pth.tmp", (tmp_path / "checkpoint.pth").stat().st_size)]


@pytest.mark.parametrize("text", ["DataLoader worker (pid 5495) is killed by signal: Killed. ",
                                  "DataLoader worker (pid(s) 5495, 5496) exited unexpectedly"])
def test_a_loader_worker_killed_from_outside_is_one_line_in_both_scripts(synthetic_data: Path, tmp_path: Path, text: str) -> None:
    """The kernel's out-of-memory killer ends a loader worker mid-epoch (as kill -9 of the worker does): the DataLoader's
    RuntimeError reached the user as a 40-line traceback through the optimizer step it interrupted."""
    from test_task import _task_script

    import autotune

    classifier = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    task = _task_script(tmp_path / "task", "good", autotune.TrainSetup(batch_size=4))
    for script in (classifier, task):  # what the script exits with, outside the except clause
        said = text.strip().rstrip(".")
        assert load_script(script)["known_failure"](RuntimeError(text)) == (
                                     f"error: {said}: a loader worker process was ended from outside (most often by the "
                                     "kernel's out-of-memory killer); lower --workers or --prefetch-factor, then rerun "
                                     "with --resume to go on from the last checkpoint written, if any")


def test_a_loader_worker_ended_while_it_handed_a_batch_over_is_one_line_in_both_scripts(
    synthetic_data: Path, tmp_path: Path, broken_hand_over: BaseException
) -> None:
    """Killed while it hands a batch over, a worker closes the queue's connection before PyTorch sees it gone: the
    scripts ended in a bare EOFError's traceback. An EOFError from elsewhere is raised again, its traceback kept."""
    from test_task import _task_script

    import autotune

    classifier = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    task = _task_script(tmp_path / "task", "good", autotune.TrainSetup(batch_size=4))
    for script in (classifier, task):
        known_failure = load_script(script)["known_failure"]
        assert known_failure(broken_hand_over) == (
            "error: a DataLoader worker exited unexpectedly while it handed a batch over (EOFError): a loader worker process "
            "was ended from outside (most often by the kernel's out-of-memory killer); lower --workers or --prefetch-factor, "
            "then rerun with --resume to go on from the last checkpoint written, if any")
        with pytest.raises(EOFError, match="input ended"):
            known_failure(EOFError("input ended"))
        for own in _datasets_own_eof_errors():  # a truncated pickle the dataset reads: its own error, traceback kept
            with pytest.raises(EOFError):
                known_failure(own)
    # The script run as a program: its __main__ block caught no EOFError, so the line above was never said.
    patch = ("import multiprocessing, runpy, sys, torch.utils.data.dataloader as d\n"
             "reader, writer = multiprocessing.Pipe(duplex=False); writer.close()\n"
             "d._MultiProcessingDataLoaderIter._get_data = lambda self: reader.recv()\n"
             f"sys.argv = [{str(classifier)!r}, '--max-steps', '2', '--output-dir', {str(tmp_path / 'out')!r}]\n"
             f"runpy.run_path({str(classifier)!r}, run_name='__main__')\n")
    ran = subprocess.run([sys.executable, "-c", patch], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert ran.returncode == 1 and ran.stderr.strip().splitlines()[-1].startswith(
        "error: a DataLoader worker exited unexpectedly while it handed a batch over (EOFError)"), ran.stderr
    assert "Traceback" not in ran.stderr, ran.stderr


def _datasets_own_eof_errors() -> list[BaseException]:
    """A dataset's own EOFError (a truncated pickle it reads), fetched without workers and through one."""
    import pickle

    import torch
    from torch.utils.data import DataLoader, Dataset

    class Truncated(Dataset):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> torch.Tensor:
            return pickle.loads(b"")

    errors: list[BaseException] = []
    for workers in (0, 1):
        try:
            next(iter(DataLoader(Truncated(), batch_size=2, num_workers=workers)))
        except EOFError as exc:
            errors.append(exc)
    assert len(errors) == 2
    return errors


@pytest.mark.parametrize("text", [
    "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n  File \"x.py\"\n"
    "RuntimeError: unable to allocate shared memory(shm) for file </torch_3716_310_0>: No space left on device (28)\n",
    "DataLoader worker (pid 5495) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared "
    "memory. Please try to raise your shared memory limit.",
])
def test_loader_workers_that_found_dev_shm_full_are_one_line_naming_it_in_both_scripts(
    synthetic_data: Path, tmp_path: Path, text: str
) -> None:
    """A container's small /dev/shm (Docker's 64 MiB) fills with the batches in flight: one line naming /dev/shm, its size
    and the fixes (before: a 60-line traceback, or for a SIGBUS the out-of-memory killer's hint, the wrong cause)."""
    from test_task import _task_script

    import autotune

    classifier = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    task = _task_script(tmp_path / "task", "good", autotune.TrainSetup(batch_size=4))
    lead = ("the loader's workers ran out of shared memory" if "unable to allocate" in text else "a loader worker died of a "
            "bus error (SIGBUS), most often as /dev/shm ran full (else a memory-mapped file the dataset reads was cut short)")
    for script in (classifier, task):
        line = load_script(script)["known_failure"](RuntimeError(text))
        assert line.startswith(f"error: {lead} (/dev/shm holds ") and "\n" not in line, line
        assert line.endswith("; give the container more shared memory (docker run --shm-size=8g or --ipc=host), or lower "
                             "--workers, --prefetch-factor or --batch-size (--workers 0 uses none), then rerun with --resume to "
                             "go on from the last checkpoint written, if any"), line


@pytest.mark.slow
@pytest.mark.parametrize("filled", [False, True])
def test_the_classifier_script_on_a_real_full_dev_shm_says_so_in_one_line(synthetic_data: Path, tmp_path: Path, filled: bool) -> None:
    """A real 64 KiB /dev/shm (a tmpfs mounted in a private mount namespace, as a container's is), the script run there
    with loader workers: the batches in flight do not fit, and the script ends in the one line naming it, exit 1. Filled
    to its last byte, the workers' queue lock fails first (Python's OSError ENOSPC): a 32-line traceback before."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    run = [sys.executable, str(script), "--max-steps", "3", "--output-dir", str(tmp_path / "out"), "--batch-size", "16"]
    fill = " && { dd if=/dev/zero of=/dev/shm/fill bs=4k 2>/dev/null; true; }" if filled else ""
    mount = "mount --make-rprivate / && mount -t tmpfs -o size=64k tmpfs /dev/shm" + fill + " && exec \"$@\""
    allowed = subprocess.run(["unshare", "-m", "sh", "-c", mount, "sh", "true"], capture_output=True, timeout=60, check=False)
    if allowed.returncode != 0:
        pytest.skip(f"this process may not mount a private /dev/shm: {allowed.stderr.decode(errors='replace').strip()}")
    then_list = mount.replace(' && exec "$@"', ' && { "$@"; code=$?; ls -A /dev/shm; exit $code; }')
    result = subprocess.run(["unshare", "-m", "sh", "-c", then_list, "sh", *run], capture_output=True, text=True, timeout=300)
    line = result.stderr.strip().splitlines()[-1]
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    said = "as they started (/dev/shm holds 64 KiB, 0 KiB free): [Errno 28]" if filled else "(/dev/shm holds 64 KiB, "
    assert line.startswith(f"error: the loader's workers ran out of shared memory {said}"), line
    # The file the failed allocation left (torch_<pid>_...) is removed; before, one stayed per worker, unremoved.
    assert [name for name in result.stdout.split() if name.startswith("torch_")] == [], result.stdout


def test_data_whose_class_folders_are_splits_gets_the_search_s_warning(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """python train.py --data /data/imagenet (the level above train/ and val/) trained a 2-class model on the splits
    without a word, where the search warns about the same folder."""
    import shutil

    images = sorted(synthetic_data.rglob("*.jpg"))
    for split, files in (("train", images[:8]), ("val", images[8:12])):
        (tmp_path / "imagenet" / split / "n0").mkdir(parents=True)
        for file in files:
            shutil.copy(file, tmp_path / "imagenet" / split / "n0" / file.name)
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    code, out, err = in_process.run_script(
        script, ["--data", "imagenet", "--batch-size", "2", "--accum-steps", "1", "--workers", "0", "--max-steps", "1",
                 "--output-dir", "out"], tmp_path, capfd, monkeypatch)
    assert code == 0, err
    assert (f"warning: the class folders of imagenet are train, val, which look like dataset splits: did you mean --data "
            f"{Path('imagenet') / 'train'}?") in out


def test_a_temporary_directory_too_long_for_the_workers_sockets_is_one_line(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a TMPDIR past 75 bytes the loader worker's socket path passes 107 and the first batch never comes (a run
    hung until killed); --workers 0 needs no socket."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    deep = tmp_path / ("d" * (110 - len(str(tmp_path))))
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    line, _ = in_process.refusal(script, ["--output-dir", "out", "--max-steps", "1"], tmp_path, capfd, monkeypatch)
    assert line == (f"error: --workers 1: the temporary directory {deep} is too long for the loader workers' sockets (107 bytes); "
                    "set TMPDIR to a shorter directory (TMPDIR=/tmp), or pass --workers 0")
    code, out, err = in_process.run_script(script, ["--output-dir", "out", "--max-steps", "1", "--workers", "0"], tmp_path, capfd,
                                           monkeypatch)
    assert code == 0 and "done: step 1," in out, err


@pytest.mark.parametrize("task", [None, "task_factories:dict_batches"], ids=["model", "task"])
def test_ctrl_c_while_torch_loads_is_one_line(synthetic_data: Path, tmp_path: Path, task: str | None) -> None:
    """Ctrl-C in the seconds ``import torch`` takes: the one line and exit 130 of any other Ctrl-C, no traceback. A
    stand-in ``torch`` package that blocks in its import holds the script there, whatever the machine's load."""
    import time

    best = make_best(synthetic_data)
    if task is not None:
        best = dataclasses.replace(best, workload=dataclasses.replace(best.workload, task=task))
    script = write_script(best, tmp_path / "train.py")
    assert ("WORKLOAD = " in script.read_text()) == (task is not None)
    ready = tmp_path / "importing"
    (tmp_path / "stand-in" / "torch").mkdir(parents=True)
    (tmp_path / "stand-in" / "torch" / "__init__.py").write_text(
        f"import pathlib, time\npathlib.Path({str(ready)!r}).touch()\ntime.sleep({RUN_TIMEOUT})\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(tmp_path / "stand-in")})
    try:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 130, f"exit {proc.returncode}\n{out}\n{err}"
    assert err.strip().splitlines() == ["error: interrupted; --resume goes on from the last checkpoint written, if any"]


def test_short_epochs_write_a_checkpoint_at_most_every_checkpoint_every_seconds(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """On 64 images at batch 32 x 2 an epoch is one optimizer step, and the script wrote (and fsync'd) a checkpoint
    after each: by wall clock it ran at 0.4-0.5x the images/s it printed. An epoch's end now writes one when the last
    is --checkpoint-every seconds old (60 by default), and always at the last epoch and at a stop; 0 writes every one.
    An hour apart here: four epochs never take that long, however loaded the machine."""
    script = write_script(make_best(synthetic_data, batch_size=32, accumulation_steps=2, num_workers=0, prefetch_factor=None,
                                    persistent_workers=False), tmp_path / "train.py")
    real_replace, written = os.replace, []

    def replace(source: Any, target: Any) -> None:
        if str(target).endswith("checkpoint.pth"):
            written.append(str(target))
        real_replace(source, target)

    monkeypatch.setattr(os, "replace", replace)
    assert add_argument_default(script.read_text(), "--checkpoint-every") == 60.0
    for every, saves in (("3600", 2), ("0", 4)):  # the first epoch's end and the last's; every one
        written.clear()
        out = run_here([str(script), "--epochs", "4", "--output-dir", f"out-{every}", "--checkpoint-every", every], tmp_path,
                       capfd, monkeypatch)
        assert len(written) == saves and "epoch 3 done at step 4" in out, (every, written, out)
    resumed = run_here([str(script), "--epochs", "5", "--resume", "--output-dir", "out-3600"], tmp_path, capfd, monkeypatch)
    assert "resumed from" in resumed and "at epoch 4 step 4" in resumed  # the last epoch's checkpoint is there


def _saves_recorded(log: Path) -> str:
    """A ``sitecustomize`` module that records, in ``log``, the step and epoch step of every checkpoint.pth a process
    (each torchrun rank: they inherit ``PYTHONPATH``) puts in place."""
    return textwrap.dedent(f"""
        import os

        _replace = os.replace

        def replace(source, target, *args, **kwargs):
            if str(target).endswith("checkpoint.pth"):
                import torch
                saved = torch.load(source, map_location="cpu", weights_only=True)
                with open({str(log)!r}, "a") as file:
                    file.write(f"{{os.environ.get('RANK', '-')}} {{saved['epoch']}} {{saved['epoch_step']}} {{saved['step']}}\\n")
            return _replace(source, target, *args, **kwargs)

        os.replace = replace
    """)


def _long_epoch_in_this_process(script: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-process case of the test below: the sitecustomize's wrapper of os.replace, installed here."""
    namespace: dict[str, Any] = {}
    exec(_saves_recorded(tmp_path / "saves.log"), namespace)  # the test's own recorder
    monkeypatch.setattr(os, "replace", namespace["replace"])
    written = {}
    for every in ("0.0001", "3600"):
        out = run_here([str(script), "--max-steps", "4", "--print-freq", "1", "--output-dir", f"out-{every}", "--checkpoint-every", every],
                       tmp_path, capfd, monkeypatch)
        assert "done: step 4" in out and "epoch 0 done" not in out, out
        written[every] = (tmp_path / "saves.log").read_text().splitlines()
        (tmp_path / "saves.log").unlink()
    assert written == {"0.0001": ["- 0 1 1", "- 0 2 2", "- 0 3 3", "- 0 4 4"], "3600": ["- 0 4 4"]}


@pytest.mark.parametrize("torchrun", [False, True], ids=["one-process", "torchrun"])
def test_a_long_epoch_writes_checkpoints_inside_it_every_checkpoint_every_seconds(
    synthetic_data: Path, tmp_path: Path, torchrun: bool, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checkpoints were written at epochs' ends only: a crash (kill -9, the out-of-memory killer, a power cut) lost the
    whole epoch in progress, hours on a large dataset. Inside an epoch a step now writes one when the last (or the start
    of training) is --checkpoint-every seconds old. 64 images at batch 4: an epoch of 16 steps (8 per rank's 32 under
    torchrun), 4 trained. Every 0.0001 s, any step comes due; every hour, none before the stop's at step 4. Under
    torchrun rank 0's clock decides at the ranks' common checks (GracefulStop.now), and every rank takes part in the
    checkpoint's weight check (a collective): the run ends, rather than hanging, and rank 0 alone writes (every line is
    rank 0's). In one process the script runs here, its saves recorded by the same os.replace wrapper."""
    script = write_script(make_best(synthetic_data, batch_size=4, num_workers=0, prefetch_factor=None, persistent_workers=False,
                                    amp="off", channels_last=False), tmp_path / "train.py")
    if not torchrun:
        _long_epoch_in_this_process(script, tmp_path, capfd, monkeypatch)
        return
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    written = {}
    for every in ("0.0001", "3600"):
        log = tmp_path / f"saves-{every}.log"
        (hooks / "sitecustomize.py").write_text(_saves_recorded(log))
        prefix = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
        proc = subprocess.run([*prefix, str(script), "--max-steps", "4", "--print-freq", "1", "--output-dir", f"out-{every}",
                               "--checkpoint-every", every], cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(hooks), os.environ.get("PYTHONPATH", "")])})
        assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
        assert "done: step 4" in proc.stdout and "epoch 0 done" not in proc.stdout, proc.stdout
        written[every] = log.read_text().splitlines()
    # The first check comes after step 2; the next one 2 s of steps later, after step 3 only where a step took that long.
    first, *between, last = written["0.0001"]
    assert (first, last, written["3600"]) == ("0 0 2 2", "0 0 4 4", ["0 0 4 4"]) and set(between) <= {"0 0 3 3"}, written


def test_a_search_on_another_gpu_emits_a_script_that_trains_on_that_gpu(synthetic_data: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A search on --device cuda:1 (cuda:0 busy) emitted --device cuda, and the script trained on cuda:0, beside the job
    the user had avoided. Its default is now cuda:1; cuda (a search on cuda:0) stays rank K on cuda:K under torchrun, where
    a cuda:K names no rank's GPU (said once); an index past the visible GPUs or a bad name is one line. The GPU is chosen
    by the script's own functions with torch.cuda's count faked (no GPU here)."""
    import torch

    text = render_script(make_best(synthetic_data, device="cuda:1", batch_size=8))
    assert "--device\", default='cuda:1'" in text
    assert "--device\", default='cuda'," in render_script(make_best(synthetic_data, device="cuda:0", batch_size=8))
    script = tmp_path / "train.py"
    script.write_text(text)
    namespace = load_script(script)
    parser = namespace["get_args_parser"]()
    assert parser.parse_args([]).device == "cuda:1" and parser.parse_args(["--device", "cuda:3"]).device == "cuda:3"
    with pytest.raises(SystemExit):
        parser.parse_args(["--device", "gpu1"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    lines: list[str] = []
    monkeypatch.setitem(namespace["gpu_index"].__globals__, "log", lines.append)

    def index(device: str, local_rank: int | None = None, world: int = 2) -> int:
        distributed = local_rank is not None
        args = SimpleNamespace(device=device, distributed=distributed, local_rank=local_rank or 0, rank=local_rank or 0,
                               world_size=world if distributed else 1)
        return int(namespace["gpu_index"](args))

    assert (index("cuda"), index("cuda:1"), index("cuda", local_rank=1), lines) == (0, 1, 1, [])
    assert index("cuda:1", local_rank=0, world=1) == 1 and lines == []  # torchrun with one process: the search's GPU
    assert index("cuda:1", local_rank=0) == 0
    assert lines == ["note: --device cuda:1: under torchrun rank K trains on cuda:K; choose the GPUs with CUDA_VISIBLE_DEVICES"]
    with pytest.raises(SystemExit, match=r"^error: --device cuda:2: only 2 GPU\(s\) visible: cuda:0 to cuda:1$"):
        index("cuda:2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:  # torchrun --nproc_per_node 3 with two GPUs: not set_device's traceback
        index("cuda", local_rank=2, world=3)
    # Said by the rank that meets it (refusals every rank meets are rank 0's to say, and rank 0 never meets this one).
    assert refused.value.code == 1 and capsys.readouterr().err == (
        "error: process LOCAL_RANK=2 of this node has no GPU: 2 visible under CUDA_VISIBLE_DEVICES='4,5'; pass torchrun "
        "--nproc_per_node 2 or fewer (one process per GPU)\n")


def test_one_process_under_torchrun_runs_the_distributed_path(
    synthetic_data: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """torchrun with one process ran the script plainly (no process group, no DDP, no collectives), so the GPU check's
    "torchrun --nproc_per_node 1 (DDP on NCCL, one rank)" ran nothing of NCCL on a one-GPU machine. Under torchrun the
    script now always runs distributed: here gloo, DDP and the stop checks' all-reduce with a world of one."""
    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", str(script),
                           "--max-steps", "3", "--print-freq", "1", "--output-dir", "out"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "DDP: bucket_cap_mb" in proc.stdout and "1 process(es) on cpu" in proc.stdout, proc.stdout
    assert _checkpoint(tmp_path / "out" / "checkpoint.pth")["step"] == 3
    plain = run_here([str(script), "--max-steps", "1", "--output-dir", "plain"], tmp_path, capfd, monkeypatch)
    assert "DDP:" not in plain  # run plainly: no process group


@pytest.mark.slow
@pytest.mark.parametrize("every", ["0", "0.0001"], ids=["epoch-ends", "every-check"])
def test_a_sigterm_to_torchrun_with_loader_workers_stops_every_rank_together(synthetic_data: Path, tmp_path: Path, every: str) -> None:
    """torchrun's SIGTERM reaches the loader workers too, and each rank met its dead workers at its own micro-batch and
    stopped alone: one in the stop's weight check, one in DDP's next collective, hung until torchrun's SIGKILL 30 s
    later, without the stop's checkpoint (3 of 5 runs; 4 of 4 with a checkpoint at every stop check, where rank 0 wrote
    while rank 1 drained its queue). Under torchrun the workers leave SIGTERM to their rank, which stops at the ranks'
    next common check, and the ranks leave a checkpoint inside an epoch together."""
    import time

    script = write_script(dataclasses.replace(make_best(synthetic_data, batch_size=2, accumulation_steps=2, amp="off", num_workers=1,
                                                       prefetch_factor=2, persistent_workers=True), world_size=2), tmp_path / "train.py")
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script),
                             "--epochs", "1000", "--checkpoint-every", every, "--print-freq", "1", "--output-dir", "out"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + RUN_TIMEOUT
        for line in proc.stdout:  # a few steps, and checkpoints inside the epoch, behind it
            if line.startswith("step 4 ") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGTERM)
        rest, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = [line for line in rest.splitlines() if line.startswith("stopped by SIGTERM after step ")]
    assert len(said) == 1 and "forcefully exiting" not in err, f"{rest}\n{err[-3000:]}"
    step = int(said[0].split("after step ")[1].split(";")[0])
    assert _checkpoint(tmp_path / "out" / "checkpoint.pth")["step"] == step >= 4


@pytest.mark.slow
def test_a_resume_right_after_a_kill_9_is_not_refused_by_the_dead_run_s_loader_worker(synthetic_data: Path, tmp_path: Path) -> None:
    """OUTPUT_DIR/.train.lock's flock belongs to the open file, which a forked loader worker shares: after kill -9 of the
    run, its orphaned worker held it until it saw its parent gone (5 s), and a --resume at once was refused as "in use
    by another training run (pid <the dead one>)". A worker now closes its copy as it starts."""
    import time

    script = write_script(make_best(synthetic_data, **CPU_KNOBS), tmp_path / "train.py")
    proc = subprocess.Popen([sys.executable, str(script), "--epochs", "1000", "--print-freq", "1", "--output-dir", "out"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + RUN_TIMEOUT
        for line in proc.stdout:  # the loader's worker is running
            if line.startswith("step 2 ") or time.monotonic() > deadline:
                break
        workers = psutil.Process(proc.pid).children()
        assert workers, "no loader worker"
        for worker in workers:  # held still: an orphan exits within 5 s of its own, before the rerun or after it
            worker.suspend()
        proc.kill()
        proc.wait()
        assert all(worker.status() == psutil.STATUS_STOPPED for worker in workers)  # alive as the rerun starts
        resumed = run_script([str(script), "--resume", "--max-steps", "3", "--output-dir", "out"], tmp_path)
    finally:
        proc.kill()
        for worker in workers if "workers" in locals() else ():
            with contextlib.suppress(psutil.Error):
                worker.kill()
    assert "done: step 3" in resumed.stdout  # not refused (no checkpoint yet by step 2: it starts afresh, as documented)
