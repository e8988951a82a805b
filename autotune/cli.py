"""The ``autotune`` command line: thin Typer commands over the library. Domain errors
(:class:`~autotune.errors.AutotuneError`) become one red line on stderr and a non-zero exit code; ``--debug`` or
``AUTOTUNE_DEBUG=1`` shows the traceback instead."""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.markup import escape

from autotune import cli_errors
from autotune._version import __version__
from autotune.cli_errors import check_flags_agree, echo_json, error_line, json_on_error, trial_flags_named
from autotune.cli_options import (
    CacheDirOpt,
    DataOpt,
    DeviceOpt,
    ImageSizeOpt,
    MaxMemoryOpt,
    ModelOpt,
    NprocOpt,
    OutOpt,
    SyntheticOpt,
    TimeoutOpt,
    TrialSecondsOpt,
    WorkloadOpt,
    directory_of,
    float_arg,
    int_arg,
    path_arg,
)
from autotune.errors import BEFORE_START, AutotuneError, ProbeError
from autotune.records import DEFAULT_TRIAL_SECONDS
from autotune.redact import recorded_command
from autotune.render import console
from autotune.teardown import without_teardown

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(name="autotune", help="Measure, don't guess: find the fastest DataLoader, batch, precision and accumulation setup.",
                  no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  rich_markup_mode=None)  # Click's help: it wraps at any terminal width (Rich's option table cut names at 80 columns)
out = console()
err = console(stderr=True)
_state = {"debug": False, "ran": False}


def _debug() -> bool:
    return _state["debug"] or os.environ.get("AUTOTUNE_DEBUG", "") not in ("", "0")


def fail(message: str, code: int = 1) -> typer.Exit:
    """Print one red error line and return the Exit to raise."""
    try:
        err.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    except MemoryError:  # Rich imports as it draws: with no memory left, plain text
        sys.stderr.write(f"error: {message}\n")
    return typer.Exit(code)


def handle_errors(func: F) -> F:
    """Turn AutotuneError (and unexpected bugs) into one line and an exit code."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _state["ran"] = True  # the command line is parsed
        try:
            return func(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except KeyboardInterrupt:  # one the command did not answer itself (Typer would exit 130 without a word)
            raise fail(cli_errors.stopped_line(func.__name__), 130) from None
        except Exception as exc:
            if _debug():
                exc.__suppress_context__ = False  # the user's own traceback (a Task's factory, a forward) under ours
                raise
            if cli_errors.reader_gone(exc):
                raise typer.Exit(1) from None
            raise fail(*error_line(exc)) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        out.print(f"autotune {__version__}", highlight=False)
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[Optional[bool], typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")] = None,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks instead of one-line errors.")] = False,
) -> None:
    """Measure, don't guess: find the fastest DataLoader, batch, precision and accumulation setup."""
    _state["debug"] = debug


@app.command()
@handle_errors
def probe(as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of tables.")] = False) -> None:
    """Report the hardware the search will use: CPU cores, RAM, /dev/shm, GPUs, versions."""
    import probes

    try:
        hardware = probes.collect()
    except AutotuneError:
        raise
    except Exception as exc:
        raise ProbeError(f"probe failed: {type(exc).__name__}: {exc}") from None
    if as_json:
        typer.echo(json.dumps(hardware.to_dict(), indent=2))
    else:
        out.print(probes.render(hardware))


@app.command()
@handle_errors
@json_on_error(status=None, samples_per_s=None)
def trial(
    ctx: typer.Context,
    model: ModelOpt = None,
    image_size: ImageSizeOpt = None,
    batch_size: Annotated[Optional[int], typer.Option("--batch-size", parser=int_arg, help="Micro-batch (default 32; a Task's batch_size).")] = None,
    workers: Annotated[int, typer.Option("--workers", parser=int_arg, help="DataLoader num_workers.")] = 0,
    prefetch: Annotated[Optional[int], typer.Option("--prefetch", parser=int_arg, help="DataLoader prefetch_factor (needs --workers > 0).")] = None,
    pin_memory: Annotated[bool, typer.Option("--pin-memory/--no-pin-memory", help="Pinned host memory (CUDA).")] = False,
    persistent_workers: Annotated[
        bool, typer.Option("--persistent-workers/--no-persistent-workers", help="Keep workers between epochs.")
    ] = False,
    amp: Annotated[str, typer.Option("--amp", help="off, bf16 or fp16.")] = "off",
    accum: Annotated[int, typer.Option("--accum", parser=int_arg, help="Gradient-accumulation steps.")] = 1,
    channels_last: Annotated[bool, typer.Option("--channels-last/--no-channels-last", help="NHWC memory format.")] = False,
    trial_seconds: TrialSecondsOpt = DEFAULT_TRIAL_SECONDS,
    device: DeviceOpt = "auto",
    data: DataOpt = None,
    timeout: TimeoutOpt = None,
    max_memory: Annotated[Optional[str], typer.Option(
        "--max-memory", help="A peak above it is an oom: 20GiB, or 20G (20e9 B); none by default.",
    )] = None,
    mode: Annotated[str, typer.Option("--mode", help="train, compute (no loader) or loader (no model).")] = "train",
    cache_dir: CacheDirOpt = None,
    synthetic_images: SyntheticOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the TrialResult as one JSON object.")] = False,
    workload: WorkloadOpt = None,
    knobs: Annotated[
        Optional[list[str]], typer.Option("--set", metavar="KNOB=VALUE", help="Any other knob, KNOB=VALUE (num_threads=2, compile=default, ...).")
    ] = None,
    nproc_per_node: NprocOpt = 1,
) -> None:
    """Run one short, isolated, measured training trial and report its throughput."""
    from autotune.api import cli_trial as run_one
    from autotune.render import render_trial
    from autotune.train_setup import TrainSetup

    pinned: dict[str, Any] = {}
    if knobs:
        from autotune.tuner.constraints import pinned_values

        pinned = pinned_values(knobs)
    flags = dict(num_workers=workers, prefetch_factor=prefetch, pin_memory=pin_memory, persistent_workers=persistent_workers,
                 batch_size=32 if batch_size is None else batch_size, accumulation_steps=accum, channels_last=channels_last, amp=amp.lower())
    check_flags_agree(ctx, flags, knobs or [])  # a flag left at its default gives way to its knob's --set
    from autotune.cli_errors import trial_interrupt_said
    from autotune.tuner.signals import sigterm_as_interrupt

    # SIGTERM unwinds like Ctrl-C: the trial and its directory are removed. A refused setup names the flags typed.
    with trial_interrupt_said(), sigterm_as_interrupt(), trial_flags_named(pinned):
        setup = TrainSetup(**{**flags, **pinned})  # a --set knob replaces its flag's value before the setup is checked
        outcome = run_one(
            workload,
            setup=setup,
            model=model,
            data=data,
            image_size=image_size,
            device=device,
            trial_seconds=trial_seconds,
            mode=mode,
            timeout_s=timeout,
            max_memory=max_memory,
            cache_dir=cache_dir,
            synthetic_images=synthetic_images,
            nproc_per_node=nproc_per_node,
            task_batch=batch_size is None and "batch_size" not in pinned,
            announce=lambda line: None if as_json and not line.startswith("warning:") else err.print(escape(line), highlight=False),
        )
    if as_json:
        echo_json(outcome.result.to_dict())
    else:
        out.print(render_trial(outcome.setup, outcome.result))
    if outcome.result.status != "ok":  # measured, and printed, but no throughput: a shell's `&&` must not go on
        raise typer.Exit(1)


@app.command()
@handle_errors
@json_on_error(best=None)
def search(
    model: ModelOpt = None,
    trials: Annotated[int, typer.Option("--trials", "-n", parser=int_arg, help="Finished trials wanted in the study (resume counts).")] = 30,
    data: DataOpt = None,
    image_size: ImageSizeOpt = None,
    device: DeviceOpt = "auto",
    effective_batch: Annotated[
        Optional[int], typer.Option("--effective-batch", parser=int_arg, help="Pin micro-batch x accumulation (keeps the training math).")
    ] = None,
    max_memory: MaxMemoryOpt = None,
    trial_seconds: TrialSecondsOpt = DEFAULT_TRIAL_SECONDS,
    set_: Annotated[
        Optional[list[str]],
        typer.Option("--set", metavar="KNOB=VALUE", help="Pin or bound a knob: KNOB=V, KNOB=A,B or KNOB=LO..HI (repeatable)."),
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", parser=path_arg, help="Output directory.")] = Path("autotune-out"),
    study: Annotated[Optional[str], typer.Option("--study", help="Study name (default from the workload).")] = None,
    storage: Annotated[
        Optional[str], typer.Option("--storage", help="Optuna storage URL (default sqlite in --out).")
    ] = None,
    seed: Annotated[int, typer.Option("--seed", parser=int_arg, help="Sampler seed.")] = 0,
    sampler: Annotated[str, typer.Option("--sampler", help="tpe (default) or random (a baseline).")] = "tpe",
    confirm_top: Annotated[int, typer.Option("--confirm-top", parser=int_arg, help="Finalists re-measured.")] = 3,
    confirm_rounds: Annotated[int, typer.Option("--confirm-rounds", parser=int_arg,
                                                help="Most interleaved re-measured rounds (stops once settled).")] = 4,
    ceilings: Annotated[
        bool, typer.Option("--ceilings/--no-ceilings", help="Measure the winner computing alone and loading alone (2 runs).")
    ] = True,
    lr: Annotated[float, typer.Option("--lr", parser=float_arg, help="AdamW rate at the reference batch (32 a rank, or --effective-batch).")] = 1e-3,
    timeout: TimeoutOpt = None,
    cache_dir: CacheDirOpt = None,
    synthetic_images: SyntheticOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the final summary as one JSON object.")] = False,
    workload: WorkloadOpt = None,
    nproc_per_node: NprocOpt = 1,
    devices: Annotated[
        Optional[str], typer.Option("--devices", help="Parallel trials, one per device: cuda:0,cuda:1 | all | cpu,cpu.")
    ] = None,
) -> None:
    """Search the fastest training setup with short, real, measured trials."""
    from autotune.api import cli_search as run_search
    from autotune.render import RichReporter, render_search

    with cli_errors.search_interrupt_said(as_json, out, err), RichReporter(err) as reporter:
        outcome = run_search(
            workload,
            model=model,
            data=data,
            image_size=image_size,
            trials=trials,
            device=device,
            out=out_dir,
            trial_seconds=trial_seconds,
            effective_batch=effective_batch,
            max_memory=max_memory,
            constraints=set_ or (),
            confirm_top=confirm_top,
            confirm_rounds=confirm_rounds,
            ceilings=ceilings,
            seed=seed,
            sampler=sampler,
            study=study,
            storage=storage,
            timeout_s=timeout,
            lr=lr,
            cache_dir=cache_dir,
            synthetic_images=synthetic_images,
            reporter=reporter,
            command=recorded_command(sys.argv),
            nproc_per_node=nproc_per_node,
            devices=devices,
        ).outcome
    from autotune.tuner.signals import stops_ignored

    with stops_ignored():  # the results are written: a stop now would call a finished search unfinished, exit 130
        if as_json:
            echo_json(outcome.to_dict())
        else:
            out.print(render_search(outcome), crop=False)


@app.command()
@handle_errors
def emit(
    directory: Annotated[Optional[Path], typer.Argument(parser=path_arg, help="A search output directory holding best.json (or that file; "
                                                        "default autotune-out).")] = None,
    output: Annotated[Optional[Path], typer.Option("--output", "-o", parser=lambda v: path_arg(v) / "train.py" if v.endswith("/") else path_arg(v),
                                                   help="The script (default DIR/train.py; a directory or DIR/ gets train.py; - for stdout).")] = None,
    out_dir: OutOpt = None,
) -> None:
    """Write a standalone, DDP-ready train.py from DIR/best.json."""
    from autotune.output.best import read_best
    from autotune.output.emit import render_script, write_script

    directory = directory_of(directory, out_dir) or Path("autotune-out")
    best = read_best(directory)
    if output == Path("-"):
        sys.stdout.write(render_script(best))
        return
    path = write_script(best, output or ((directory.parent if directory.is_file() else directory) / "train.py"), flag="--output")
    out.print(escape(f"wrote {path}"), highlight=False, soft_wrap=True)


@app.command()
@handle_errors
def report(
    directory: Annotated[Optional[Path], typer.Argument(parser=path_arg, help="A search output directory; report.html is written there "
                                                        "(default autotune-out).")] = None,
    storage: Annotated[Optional[str], typer.Option("--storage", help="Optuna storage URL (default DIR/study.db).")] = None,
    study: Annotated[Optional[str], typer.Option("--study", help="Study name (default: the one DIR/best.json names, else the only one there).")] = None,
    out_dir: OutOpt = None,
) -> None:
    """Rewrite DIR/report.html (plots of the search) from the study, finished or still running."""
    from autotune.tuner.study_report import report_study

    written = report_study(directory_of(directory, out_dir) or Path("autotune-out"), storage=storage, study=study,
                           warn=lambda why: err.print(escape(f"warning: {why}"), highlight=False, soft_wrap=True))
    for path in written[1:]:
        out.print(escape(f"wrote {path}"), highlight=False, soft_wrap=True)
    from autotune.output.report import report_holds

    out.print(escape(f"report: {written[0].resolve()} ({report_holds()}; open it in a browser)"), highlight=False, soft_wrap=True)


@app.command()
@handle_errors
@json_on_error(study=None, best=None, winner=None)
def status(
    directory: Annotated[Optional[Path], typer.Argument(parser=path_arg, help="A search's --out: its best.json is read "
                                                        "(default autotune-out).")] = None,
    storage: Annotated[Optional[str], typer.Option("--storage", help="The study storage URL (postgresql://, journal:///FILE.log, sqlite:///).")] = None,
    study: Annotated[Optional[str], typer.Option("--study", help="Study name (default: the one DIR/best.json names, else the only one there).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    out_dir: OutOpt = None,
) -> None:
    """Show a study's progress, the trials running on each worker and the confirmed winner."""
    from autotune.tuner.status import study_status
    from autotune.tuner.study_files import own_study, storage_of

    directory = directory_of(directory, out_dir)
    where = Path("autotune-out") if directory is None else directory  # with --storage, DIR's best.json is the lone search's winner
    found = study_status(storage_of(where, storage), own_study(where, storage, study), out=None if storage and directory is None else where)
    if as_json:
        echo_json(found.to_dict())
    else:
        for line in found.lines():
            out.print(escape(line), highlight=False, soft_wrap=True)


@without_teardown
def main(argv: list[str] | None = None) -> None:
    """Run the Typer app: called by :func:`autotune.entry.main`, the console script (which installs the signal handlers first).

    A usage error (an unknown or missing option, a value Typer cannot parse, an extra argument) is one ``error:`` line
    naming the command's ``--help``, exit 2, not Typer's boxed panel; with ``--json`` a command that prints a JSON object
    for its own errors (``trial``, ``search``, ``status``) prints that object for it too. ``--help`` or ``--version``
    that cannot be written (a full or closed stdout) is one line too."""
    _state["ran"] = False
    try:
        code = app(args=argv, standalone_mode=False)
    except KeyboardInterrupt:  # while Typer builds the command, before any command runs
        sys.exit(fail(BEFORE_START, 130).exit_code)
    except typer.Abort:  # an EOF at a prompt (a RuntimeError: caught before the ClickException family below)
        sys.exit(1)
    except Exception as exc:  # Typer's ClickException family (its click is vendored: matched by shape, not class)
        exit_code = getattr(exc, "exit_code", None)
        if not (hasattr(exc, "format_message") and isinstance(exit_code, int)):
            if isinstance(exc, OSError) and not _debug():  # --help or --version to /dev/full: one line, as every command says it
                sys.exit(fail(*error_line(exc)).exit_code)
            raise
        commands = {c.name or c.callback.__name__: c.callback.__name__ for c in app.registered_commands if c.callback}
        cli_errors.usage_error(exc, argv if argv is not None else sys.argv[1:], commands, err)
        sys.exit(exit_code)
    if code == 130 and not _state["ran"]:  # a stop while Typer parsed the command line: it exits 130 without a word
        fail(BEFORE_START)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    main()
