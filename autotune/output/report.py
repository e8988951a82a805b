"""report.html: a self-contained page that shows a search as plots, from the winner to where its time went.

One HTML file with inline CSS and inline base64 PNGs (no script, no font,
no network request), so it opens offline from a file manager. At a glance
first: the winner, its speedup over the defaults measured in the same rounds,
the bottleneck verdict and the ceilings; then one section per plot
(:mod:`autotune.output.sections`), each with a title that says what to read
from it and the data behind it in a collapsible ``<details>`` table. PNG
copies of the headline plots are written next to it. Without matplotlib the
page holds the tables only and says which extra to install.
"""

from __future__ import annotations

import base64
import datetime as _dt
from collections import Counter
from dataclasses import replace
from html import escape
from pathlib import Path

from autotune.errors import EmitError
from autotune.files import atomic_write_all
from autotune.output.best import DEFAULTS_KEPT
from autotune.output.compile_payoff import compile_section
from autotune.output.emit import run_command
from autotune.output.sections import (
    ReportInput,
    Section,
    Table,
    batch_section,
    confirmation_section,
    fastest_trial,
    history_section,
    importance_section,
    loader_section,
    plotting,
    summary_section,
    time_section,
)
from autotune.redact import hide_url_password
from autotune.units import counted, format_bytes

__all__ = ["HEADLINE", "PLOTS_HINT", "REPORT", "ReportInput", "render_report", "report_holds", "write_rendered", "write_report"]

REPORT = "report.html"
#: Sections whose plot is also written as ``report-<id>.png`` next to the HTML.
HEADLINE = ("summary", "history", "confirmation")
PLOTS_HINT = 'Plots need matplotlib, which is not installed: pip install "matplotlib>=3.8" (the tables below hold all the data).'


def report_holds() -> str:
    """What a report.html written now holds, for the line that names it: plots, or tables only without matplotlib."""
    return "plots" if plotting() is not None else 'tables only: pip install "matplotlib>=3.8" for its plots'

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1100px;padding:1.5em;color:#1d2733;background:#fff}
h1{font-size:1.6em;margin-bottom:.2em}h2{font-size:1.25em;margin-top:2em;border-bottom:1px solid #d8dee4;padding-bottom:.2em}
.meta{color:#5b6773;font-size:.9em}.winner{font-size:1.15em;background:#eef8f0;border-left:4px solid #2a9d4b;padding:.6em .9em}
.verdict{background:#f3f6fa;border-left:4px solid #4a7ab5;padding:.6em .9em}.caveat{background:#fff6e5;border-left:4px solid #e89a1c;padding:.4em .9em}
.hint{background:#fdecec;border-left:4px solid #d62728;padding:.6em .9em}.reading{color:#34414e}
img{max-width:100%;height:auto;display:block;margin:.6em 0}
table{border-collapse:collapse;font-size:.85em;margin:.5em 0}th,td{border:1px solid #d8dee4;padding:.2em .55em;text-align:left}
th{background:#f3f6fa}td{font-variant-numeric:tabular-nums}summary{cursor:pointer;color:#1f4e79}
code{background:#f3f6fa;padding:0 .25em}
"""


def _table(table: Table) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in table.headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in row) + "</tr>" for row in table.rows)
    return f"<table><caption>{escape(table.caption)}</caption><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _section(section: Section) -> str:
    parts = [f'<section id="{section.id}"><h2>{escape(section.title)}</h2>']
    if section.caveat:
        parts.append(f'<p class="caveat">{escape(section.caveat)}</p>')
    parts.append(f'<p class="reading">{escape(section.reading)}</p>')
    if section.image:
        data = base64.b64encode(section.image).decode("ascii")
        parts.append(f'<img src="data:image/png;base64,{data}" alt="{escape(section.alt)}">')
    tables = [t for t in section.tables if t.rows]
    if tables:
        rows = sum(len(t.rows) for t in tables)
        what = "data behind this plot" if section.image else "the data (no plot drawn)"
        parts.append(f"<details><summary>{what} ({counted(rows, 'row')})</summary>{''.join(map(_table, tables))}</details>")
    parts.append("</section>")
    return "".join(parts)


def _header(data: ReportInput) -> str:
    best = data.best
    ran = [r for r in data.records if not r.free]  # the trials that ran: a repeat or an unfed setup is said apart
    counts = Counter(r.result.status for r in ran)
    tally = ", ".join(f"{n} {status}" for status, n in counts.most_common())
    free = len(data.records) - len(ran)
    others = f"; {free} more not run (a setup measured before, or one the data or /dev/shm cannot feed)" if free else ""
    lines = [f"<h1>autotune report: {escape(data.study)}</h1>"]
    meta = [f"{counted(len(ran), 'trial')} ({tally or 'none'}{others})", f"search {escape(data.status, quote=False)}",  # quotes kept: text
            f"storage <code>{escape(hide_url_password(data.storage))}</code>"]
    # A Task's reference and sample count; the classifier's model, size and data (before best.json: as the study stored them).
    workload = best.workload.describe(best.world_size) if best is not None else data.workload
    if workload:
        meta.insert(0, escape(workload))
    if best is not None and best.command:
        meta.append(f"command <code>{escape(best.command)}</code>")
    meta.append(f"written {_dt.datetime.now(_dt.timezone.utc).isoformat(timespec='seconds')}")
    lines.append(f'<p class="meta">{" &middot; ".join(meta)}</p>')
    if best is not None:
        runs = next((len(c.values) for c in data.confirmed if c.candidate.setup == best.setup), None)
        # One confirmation run has no spread; an unconfirmed pick's figure may be its trial's, whose windows have one.
        one = runs == 1 and not best.samples_per_s_spread
        spread = "one measurement: no spread" if one else f"spread {best.samples_per_s_spread:.1f} samples/s"
        speed = f"{best.samples_per_s:.1f} samples/s ({spread})"
        if best.defaults_won:
            speed += f", {DEFAULTS_KEPT}"
        elif best.speedup:  # bold once confirmed; single trials or cut rounds are a lead, not a result
            how, ratio = best.speedup_basis, f"{best.speedup:.2f}x"
            speed += f", {f'<b>{ratio}</b>' if best.confirmed else ratio} the PyTorch defaults ({best.defaults_samples_per_s:.1f} samples/s; {how})"
        title = "Winner" if best.confirmed else "Best so far (not confirmed)"
        world = (f"; DDP with {best.world_size} ranks: samples/s counts every rank, the batch in the setup and the peak "
                 "memory are one rank's") if best.world_size > 1 else ""
        lines.append(f'<p class="winner">{title}: <code>{escape(best.setup.describe())}</code>: {speed}; effective batch '
                     f"{best.effective_batch}, learning rate {best.lr:g}, peak memory {escape(format_bytes(best.peak_memory_bytes))}{world}</p>")
        lines.extend(f'<p class="caveat">note: {escape(n)}</p>' for n in best.notes)
        where = "beside this page" if data.elsewhere is None else f"in the directory of {escape(data.elsewhere)}, not beside this page,"
        lines.append(f'<p class="next">Use it: <code>{escape(run_command(best))}</code> {where} trains with it (its flags default to '
                     'this setup), or read <code>best.json</code> in your own loop with <code>autotune.load_setup("best.json")</code>.</p>')
    else:
        top = fastest_trial(data.records, data.baseline_only)  # as the plots and `autotune status` name it
        if top is not None:
            world = (f"; DDP trials of {data.world_size} ranks: samples/s counts every rank, the batch and the memory are one "
                     "rank's") if data.world_size > 1 else ""
            lines.append(f'<p class="winner">Best trial so far (not confirmed): #{top.number} '
                         f"<code>{escape(top.setup.describe())}</code>: {top.result.samples_per_s:.1f} samples/s{world}</p>")
        elif ran:
            lines.append('<p class="caveat">No feasible trial: every trial failed (see the history table for why).</p>')
        else:
            lines.append('<p class="caveat">No trial finished yet: the ceilings below are the calibration\'s.</p>')
    if data.verdict:
        lines.append(f'<p class="verdict">Bottleneck: {escape(data.verdict)}</p>')
    return "".join(lines)


def render_report(data: ReportInput) -> tuple[str, dict[str, bytes]]:
    """The report page and the PNG of each section that has a plot.

    Returns:
        The HTML text, and PNG bytes per section id.
    """
    plots = plotting()
    records = data.records
    ran = [r for r in records if not r.free]  # a repeat (its earlier trial's figure) or a setup not run measured nothing
    sections = [
        summary_section(data, plots),
        history_section(records, plots, data.baseline_only),
        batch_section(ran, data.calibration, plots, data.max_memory_bytes),
        loader_section(ran, data.calibration, plots),
        importance_section(records, plots),
        confirmation_section(data.confirmed, plots, data.status, data.best.setup if data.best is not None and data.best.confirmed else None),
        time_section(data.time_spent, data.time_complete, plots),
    ]
    compiled = compile_section(records)
    if compiled is not None:
        sections.insert(-2, compiled)
    sections[1:] = [replace(s, title=f"{n}. {s.title}") for n, s in enumerate(sections[1:], 1)]  # below the summary, numbered
    hint = "" if plots is not None else f'<p class="hint">{escape(PLOTS_HINT)}</p>'
    body = _header(data) + hint + "".join(_section(s) for s in sections)
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>autotune report: {escape(data.study)}</title><style>{_CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )
    return page, {s.id: s.image for s in sections if s.image}


def write_report(out: Path, data: ReportInput) -> tuple[Path, ...]:
    """Write ``report.html`` and PNG copies of the headline plots into ``out``, atomically.

    PNG copies left by an earlier report whose plot is gone now are removed.

    Returns:
        The paths written, report.html first.

    Raises:
        EmitError: A file cannot be written (a read-only or full disk), named (not its temporary copy).
    """
    return write_rendered(out, *render_report(data))


def write_rendered(out: Path, page: str, images: dict[str, bytes]) -> tuple[Path, ...]:
    """:func:`write_report` for a page and images :func:`render_report` drew (the seconds of drawing apart from the
    milliseconds of writing, which a caller may keep whole: a page and PNGs of one report, never of two)."""
    files = {out / REPORT: page.encode("utf-8", errors="backslashreplace"),
             **{out / f"report-{name}.png": images[name] for name in HEADLINE if name in images}}
    path = out / REPORT
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_all(files)  # the page and its PNGs, all or none
        for name in HEADLINE:
            if name not in images:
                (path := out / f"report-{name}.png").unlink(missing_ok=True)
    except OSError as exc:
        raise EmitError(f"cannot write {exc.filename or path}: {exc.strerror or exc}") from None
    return tuple(files)
