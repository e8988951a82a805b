"""Bad input and what a user reads: one line, printed as typed, nothing written first."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import app

runner = CliRunner()


def run(tmp_path: Path, cache_dir: Path, *extra: str) -> tuple[int, str, Path]:
    """``autotune search`` with the tiny settings and ``extra``; (exit code, output, --out)."""
    out = tmp_path / "out"
    args = ["search", "--model", "resnet18", "--image-size", "32", "--trials", "2", "--device", "cpu",
            "--out", str(out), "--cache-dir", str(cache_dir), "--synthetic-images", "64", *extra]
    result = runner.invoke(app, args)
    return result.exit_code, result.output, out


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
