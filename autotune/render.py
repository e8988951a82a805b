"""Rich renderings of trial and search results (no logic, only display)."""

from __future__ import annotations

import errno
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console, ConsoleOptions, ConsoleRenderable, RenderHook
from rich.markup import escape
from rich.table import Table

from autotune.output.best import DEFAULTS_KEPT
from autotune.redact import show_controls
from autotune.runner.measure import busy_threshold
from autotune.units import format_bytes
from probes.cpu import usable_cores

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console, Group, RenderableType
    from rich.progress import TaskID
    from rich.segment import Segment
    from rich.text import Text

    from autotune.records import TrialRecord, TrialResult
    from autotune.train_setup import TrainSetup
    from autotune.tuner import SearchOutcome

STATUS_STYLE = {
    "ok": "green",
    "pruned": "yellow",
    "interrupted": "yellow",
    "bad_data": "red",
    "oom": "red",
    "timeout": "red",
    "error": "red",
    "diverged": "red",
}


def fmt_rate(value: float | None) -> str:
    """Samples/s with one decimal, ``-`` for None."""
    return "-" if value is None else f"{value:.1f}"


def render_trial(setup: TrainSetup, result: TrialResult) -> Table:
    """One trial as a two-column table."""
    table = Table(title=escape(f"trial: {setup.describe()}"), show_header=False, title_justify="left")
    table.add_column("field", style="bold")
    table.add_column("value")
    style = STATUS_STYLE.get(result.status, "white")
    table.add_row("status", f"[{style}]{result.status}[/]")
    if result.error:
        table.add_row("error", escape(result.error))
    if result.samples_per_s is not None:
        spread = f" (spread {fmt_rate(result.samples_per_s_spread)})" if result.samples_per_s_spread is not None else ""
        table.add_row("samples/s", f"{fmt_rate(result.samples_per_s)}{spread}")
    if result.windows:
        table.add_row("windows", ", ".join(f"{w:.1f}" for w in result.windows))
    loading = result.mode == "loader"  # no model, no optimizer: a batch loaded is its step, and waiting is all it does
    if result.step_time_s is not None:
        table.add_row("batch time" if loading else "step time",
                      f"{result.step_time_s * 1000:.1f} ms per {'batch loaded' if loading else 'optimizer step'}")
    if result.data_wait_fraction is not None and not loading:
        table.add_row("data wait", f"{result.data_wait_fraction:.0%} of wall time blocked on the loader")
    table.add_row("peak memory", format_bytes(result.peak_memory_bytes))
    if result.warmup_s is not None:
        table.add_row("warm-up", f"{result.warmup_s:.1f} s (start-up included, not measured)")
    if result.measured_s is not None:
        table.add_row("measured", f"{result.measured_s:.1f} s")
    if result.other_cores is not None:  # two trials compared by hand: one may have met a busy machine
        busy = ": the figures hold for a machine that busy" if result.other_cores >= busy_threshold(usable_cores()) else ""
        table.add_row("other load", f"{result.other_cores:.1f} cores kept busy by other processes while it measured{busy}")
    return table


class RichReporter:
    """Live progress of a search on a Rich console (stderr by default).

    Implements :class:`autotune.tuner.Reporter`; use as a context manager
    around :func:`autotune.tuner.run_search`.
    """

    def __init__(self, console: Console, words: Callable[[str], str] = str) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.console = console
        self.words = words  # the Python API's: its keywords where a line names the CLI's flags (api_results.in_api_words)
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(bar_width=24),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._trials: TaskID | None = None
        self._confirm: TaskID | None = None
        # Jupyter draws a live bar through ipywidgets only: without it Rich warned "install ipywidgets" at each bar
        # (5 times a search). The lines are printed either way; the bar is left out there.
        self._bar_shown = not console.is_jupyter or importlib.util.find_spec("ipywidgets") is not None

    def __enter__(self) -> RichReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress.live.is_started:
            self.progress.stop()

    def _bar(self, description: str, total: int, completed: int = 0) -> TaskID:
        """A new bar; the display starts with the first one (an input refused before has no empty line above it)."""
        if not self.progress.live.is_started and self._bar_shown:
            self.progress.start()
        return self.progress.add_task(description, total=total, completed=completed)

    def message(self, text: str) -> None:
        """A progress line."""
        self.progress.console.print(f"[dim]{escape(self.words(text))}[/]", highlight=False, soft_wrap=True)  # paths stay whole to copy

    def trial_started(self, done: int, total: int, role: str, setup: TrainSetup) -> None:
        """Show the running trial."""
        if self._trials is None:
            self._trials = self._bar("trials", total, done)
        self.progress.update(self._trials, total=total, completed=done, description=escape(f"trial {done + 1}/{total} [{role}] {setup.describe()}"))

    def trial_finished(self, done: int, total: int, record: TrialRecord, best: float | None) -> None:
        """Print the finished trial above the bar."""
        if self._trials is not None:
            self.progress.update(self._trials, completed=done)
        result = record.result
        style = STATUS_STYLE.get(result.status, "white")
        value = f"{fmt_rate(result.samples_per_s)} samples/s" if result.samples_per_s is not None else ""
        if record.reused_from is not None:
            reused = f" (same setup as #{record.reused_from}: not run again{', not counted' if record.free else ''})"
        else:
            from autotune.tuner.explore import starved  # a stream too short for the step: found by running

            ran = "ran" if starved(result) else "not run"
            reused = f" ({ran}: not counted)" if record.free else ""
        why = f" - {escape(result.error)}" if result.error and not result.ok else ""
        self.progress.console.print(
            f"  {done}/{total} #{record.number} {escape(f'[{record.role}]')} {escape(record.setup.describe())}: "
            f"[{style}]{result.status}[/] {value}{reused}{why}   best {fmt_rate(best)}",
            highlight=False, soft_wrap=True,  # one line per trial in a log, however narrow (grep-able)
        )

    def confirm_progress(self, done: int, total: int, label: str, result: TrialResult) -> None:
        """One confirmation measurement done."""
        if self._trials is not None:
            self.progress.remove_task(self._trials)
            self._trials = None
        if self._confirm is None:
            self._confirm = self._bar("confirmation", max(total, 1))
        self.progress.update(self._confirm, completed=done, total=max(total, 1), description="confirmation (interleaved)")
        value = f"{fmt_rate(result.samples_per_s)} samples/s" if result.ok else f"{result.status}: {result.error}"
        self.progress.console.print(escape(f"  confirm {done}/{total} {label}: {value}"), highlight=False, soft_wrap=True)


def _line(*parts: str | tuple[str, str] | Text) -> Text:
    """A line to copy (a path, a command), from plain or ``(text, style)`` parts: never wrapped or
    cut, however narrow the terminal or log. The console must print it with ``crop=False``."""
    from rich.text import Text

    return Text.assemble(*parts, no_wrap=True, overflow="ignore")


#: Below this many columns the trials table leaves its setup column a few characters (at 80 about 10: a setup folded
#: over 7 lines, words split): each trial is then one line of its own.
TABLE_WIDTH = 110


class _TableOrLines:
    """``table`` where the console is :data:`TABLE_WIDTH` columns wide or more, else its title and ``lines`` (markup),
    one per row."""

    def __init__(self, table: Table, lines: list[str]) -> None:
        self.table, self.lines = table, lines

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[RenderableType]:
        from rich.text import Text

        if options.max_width >= TABLE_WIDTH:
            yield self.table
            return
        yield Text(str(self.table.title), style="italic")
        for line in self.lines:
            yield Text.from_markup(line, overflow="fold")


#: Up to this many trials the final table shows them all; a longer study (resumed runs, a shared study) its fastest
#: :data:`SHOWN_OF_MANY`, the defaults' and the finalists' (a 20,000-trial study printed 20,266 lines before the winner).
MAX_TRIAL_ROWS = 50
SHOWN_OF_MANY = 30


def _fastest_and_named(ordered: list[TrialRecord], outcome: SearchOutcome) -> list[TrialRecord]:
    """The :data:`SHOWN_OF_MANY` fastest of ``ordered`` and, wherever they rank, the PyTorch defaults' trial and each
    finalist's (the winner's among them) fastest trial, in ``ordered``'s order."""
    named = {c.candidate.setup for c in outcome.confirmed} | ({outcome.best.setup} if outcome.best else set())
    fastest_of: dict[TrainSetup, TrialRecord] = {}
    for record in ordered:
        fastest_of.setdefault(record.setup, record)
    keep = {id(r) for r in ordered[:SHOWN_OF_MANY]} | {id(r) for r in ordered if r.role == "defaults"}
    keep |= {id(fastest_of[setup]) for setup in named if setup in fastest_of}
    return [r for r in ordered if id(r) in keep]


def render_search(outcome: SearchOutcome) -> Group:
    """The final report: trials by throughput, confirmation, verdict, winner; print it with ``crop=False``."""
    from rich.console import Group
    from rich.text import Text

    trials = Table(title="trials (sorted by samples/s)", title_justify="left")
    for col in ("#", "role", "setup", "status", "samples/s", "spread", "data wait", "peak mem"):
        # In a narrow terminal a cell folds onto more lines instead of losing its end.
        trials.add_column(col, justify="right" if col in ("#", "samples/s", "spread", "data wait") else "left", overflow="fold")
    lines: list[str] = []
    # The trials that ran by throughput, then those that did not: a repeat (its earlier trial's figures) or a setup not run.
    ordered = sorted(outcome.records, key=lambda r: (r.ran, r.result.ok, r.result.samples_per_s or 0.0), reverse=True)
    shown = ordered if len(ordered) <= MAX_TRIAL_ROWS else _fastest_and_named(ordered, outcome)  # the rest: trials.csv
    for record in shown:
        res = record.result
        style = STATUS_STYLE.get(res.status, "white")
        status = f"[{style}]{res.status}[/]"
        figures: tuple[str, ...] = (fmt_rate(res.samples_per_s), fmt_rate(res.samples_per_s_spread),
                   "-" if res.data_wait_fraction is None else f"{res.data_wait_fraction:.0%}", format_bytes(res.peak_memory_bytes))
        if not record.ran:
            status = f"[dim]same setup as #{record.reused_from}[/]" if record.reused_from is not None else f"{status} [dim](not run)[/]"
            figures = ("-",) * len(figures) if record.reused_from is not None else figures
        trials.add_row(str(record.number), escape(record.role), escape(record.setup.describe()), status, *figures)
        named = ", ".join(f"{name} {value}" for name, value in zip(("spread", "data wait", "peak"), figures[1:], strict=True) if value != "-")
        lines.append(f"  #{record.number} {escape(f'[{record.role}]')} {escape(record.setup.describe())}: {status}"
                     + (f" {figures[0]} samples/s" if figures[0] != "-" else "") + (f" ({named})" if named else ""))
    if len(shown) < len(ordered):
        trials.caption = f"and {len(ordered) - len(shown)} more trials, slower or not measured: trials.csv has every one"
        lines.append(trials.caption)
    parts: list[RenderableType] = [_TableOrLines(trials, lines)]
    if outcome.confirmed:
        conf = Table(title="confirmation (interleaved re-measurement, median)", title_justify="left")
        for col in ("setup", "samples/s", "spread", "runs"):
            conf.add_column(col, justify="left" if col == "setup" else "right", overflow="fold")
        for c in sorted(outcome.confirmed, key=lambda c: c.median or 0.0, reverse=True):
            conf.add_row(escape(c.candidate.label), fmt_rate(c.median), fmt_rate(c.spread), str(len(c.values)))
        parts.append(conf)
    parts.append(_line(Text(f"bottleneck: {outcome.verdict}")))  # whole, as the lines below: grep-able
    best = outcome.best
    if best is not None:
        speed = f"{best.samples_per_s:.1f} samples/s"
        if best.defaults_won:
            speed += f", {DEFAULTS_KEPT}"
        elif best.speedup:
            how = best.speedup_basis
            speed += f", {best.speedup:.2f}x the PyTorch defaults ({best.defaults_samples_per_s:.1f} samples/s; {how})"
        title = "best so far (interrupted)" if outcome.interrupted else "winner"
        # The summary's lines stay whole in a log file or pipe (Rich would wrap them at 80 columns): grep-able.
        parts.append(_line(Text.from_markup(f"[bold green]{title}:[/] {escape(best.setup.describe())}: {escape(speed)}")))
        parts.append(_line(
            f"effective batch {best.effective_batch} (reference {best.reference_batch}), "
            f"learning rate {best.lr:g}, peak memory {format_bytes(best.peak_memory_bytes)}"
            + (f"; {best.world_size} DDP ranks: samples/s counts them all, batch and memory are per rank" if best.world_size > 1 else "")
        ))
        for note in best.notes:
            parts.append(_line((f"note: {note}", "yellow")))
    for file in outcome.files:
        parts.append(_line((f"wrote {file}", "dim")))
    script = next((f for f in outcome.files if f.endswith("train.py")), None)
    if best is not None and best.world_size > 1 and script is not None:
        from autotune.output.emit import run_command

        parts.append(_line((f"run it: {run_command(best, script)}", "bold")))
    report = next((f for f in outcome.files if f.endswith("report.html")), None)
    if report is not None:
        from autotune.output.report import report_holds

        parts.append(_line(("report:", "bold"), f" {Path(report).resolve()} ({report_holds()}; open it in a browser)"))
    elif outcome.files and best is not None:  # the results are written, the page failed (a full disk): said again at the end
        from autotune.tuner.study_report import report_command

        command = report_command(outcome.out, outcome.storage, best.study)
        parts.append(_line(("report:", "bold"), (f" not written (the line above says why); {command} writes it from the study", "yellow")))
    return Group(*parts)


#: Columns of output written to a file or a pipe (a log, `| tee`): Rich's 80 wrapped the tables' setups every few characters.
PIPE_WIDTH = 160


def console(stderr: bool = False) -> Console:
    """Rich's console for stdout (or stderr): a terminal's own width; to a file or a pipe :data:`PIPE_WIDTH` columns,
    unless ``COLUMNS`` says otherwise. Text is printed as typed: ``a:b:c`` or a path with ``:fire:`` in it stays text,
    not an emoji. Stderr's (the progress of a search) outlives its reader (:class:`ReaderMayLeave`)."""
    stream = sys.stderr if stderr else sys.stdout
    tty = stream is not None and stream.isatty()
    wide = tty or "COLUMNS" in os.environ
    # FORCE_COLOR (which CI services set for coloured logs) makes Rich take a file for a terminal: colours, yes, but the
    # progress display's redraws (10 a second) filled a search's log; off a terminal it prints one line per event.
    animate = None if tty else False
    if stderr and stream is not None:  # none under pythonw: Rich's own stand-in
        made = Console(file=ReaderMayLeave(), width=None if wide else PIPE_WIDTH, emoji=False,  # type: ignore[arg-type]
                       force_interactive=animate)
    else:
        made = Console(stderr=stderr, width=None if wide else PIPE_WIDTH, emoji=False, force_interactive=animate)
    made.push_render_hook(ControlsShown())
    return made


class ControlsShown(RenderHook):
    """Every line printed shows the control characters of its text as escapes (:func:`~autotune.redact.show_controls`):
    a class folder named ``cat<ESC>]0;title<ESC>\\`` in a downloaded dataset, printed in the search's ``data:`` line,
    set the terminal's title, and ``<ESC>[2J`` cleared the screen. Rich's own control codes (colours, the progress
    display's cursor moves) are segments of their own and pass."""

    def process_renderables(self, renderables: list[ConsoleRenderable]) -> list[ConsoleRenderable]:
        return [_Shown(renderable) for renderable in renderables]


class _Shown:
    def __init__(self, renderable: ConsoleRenderable) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        from rich.segment import Segment

        for segment in console.render(self.renderable, options):
            yield segment if segment.control else Segment(show_controls(segment.text), segment.style)


#: What a write to a reader that went away raises: a closed pipe, a closed terminal (a full disk is no such thing).
_GONE = (errno.EPIPE, errno.EIO)


class ReaderMayLeave:
    """``sys.stderr`` (looked up at each write, as Rich does) whose reader may go away mid-search (``2>&1 | head``, a
    ``tee`` that ended, a closed terminal): its lines then go to /dev/null and the search goes on, where a write's
    ``BrokenPipeError`` ended it, exit 1 without a word (nothing measured was lost: the rerun resumes it). While Rich's
    progress display holds ``sys.stderr`` (its proxy), the file under the proxy is the one written."""

    @staticmethod
    def _stream() -> Any:
        return getattr(sys.stderr, "rich_proxied_file", sys.stderr)

    def write(self, text: str) -> int:
        return int(self._outliving(lambda stream: stream.write(text)))

    def flush(self) -> None:
        self._outliving(lambda stream: stream.flush())

    def _outliving(self, step: Callable[[Any], Any]) -> Any:
        """``step`` on the stream; once more on /dev/null where its reader went away."""
        try:
            return step(self._stream())
        except OSError as exc:
            if exc.errno not in _GONE or not self._to_devnull():
                raise
            return step(self._stream())

    def _to_devnull(self) -> bool:
        """Point stderr's file descriptor at /dev/null (the text still buffered, and all that follows, is dropped there);
        False where it has none (a stream in memory)."""
        try:
            fd, devnull = self._stream().fileno(), os.open(os.devnull, os.O_WRONLY)
        except (OSError, ValueError):
            return False
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)
        return True

    def __getattr__(self, name: str) -> object:
        if name == "rich_proxied_file":  # Rich would write past this wrapper to the file its proxy holds
            raise AttributeError(name)
        return getattr(self._stream(), name)  # isatty, fileno, encoding: what Rich asks of its file
