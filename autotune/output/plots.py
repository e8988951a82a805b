"""The report's figures: one function per plot, matplotlib only.

Every function takes records-level data and returns a ``matplotlib`` Figure
built without ``pyplot`` (no global state, no display: the Agg canvas
renders it); :func:`png` turns it into PNG bytes. Importing this module
needs matplotlib (the ``plots`` extra); :mod:`autotune.output.report`
checks for it first and writes a text-only report without it.
"""

from __future__ import annotations

import io
import textwrap
from collections import defaultdict
from collections.abc import Sequence

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, NullLocator

from autotune.files import PNG_MARK
from autotune.records import Calibration, TrialRecord
from autotune.rounds import Confirmed
from autotune.time_spent import TimeSpent
from autotune.units import format_bytes

#: One marker and colour per trial status (the same in every plot).
STATUS_STYLE: dict[str, tuple[str, str]] = {
    "ok": ("o", "#2a9d4b"),
    "pruned": ("v", "#e89a1c"),
    "oom": ("X", "#d62728"),
    "timeout": ("s", "#8c3fb5"),
    "error": ("D", "#555555"),
    "diverged": ("P", "#8c564b"),
}
#: Series colours, none of them a status colour (orange, red, purple, grey).
SERIES = ("#1f77b4", "#2ca02c", "#17becf", "#bcbd22", "#e377c2", "#7f7f7f", "#1f4e79", "#98df8a")
#: Series markers: with the colours, a distinct style for 32 series (9 in a loader plot of the default space: no workers
#: and prefetch 1 to 8, whose first and ninth shared a colour). The plots that use them draw no status with a circle.
SERIES_MARKERS = ("o", "^", "<", ">")
GIB = 2**30


def series_style(index: int) -> tuple[str, str]:
    """(colour, marker) of the ``index``-th series of a plot."""
    return SERIES[index % len(SERIES)], SERIES_MARKERS[(index // len(SERIES)) % len(SERIES_MARKERS)]


def marker_area(points: int) -> float:
    """A scatter's marker area for ``points`` points: full size up to 200, then smaller, so thousands of trials (a long
    shared study) stay points rather than a solid band."""
    return 46.0 if points <= 200 else max(6.0, 46.0 * (200 / points) ** 0.5)


def png(fig: Figure) -> bytes:
    """The figure as PNG bytes (100 dpi), marked as autotune's (:data:`autotune.files.PNG_MARK`, a PNG text chunk)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight", metadata={"Software": PNG_MARK.decode()})
    return buffer.getvalue()


def precision_label(amp: str, channels_last: bool) -> str:
    """``fp32``, ``bf16``, ``bf16 + channels_last``, ..."""
    name = "fp32" if amp == "off" else amp
    return f"{name} + channels_last" if channels_last else name


def plotted_rate(record: TrialRecord) -> float:
    """Where a trial sits on a samples/s axis: its rate (a pruned one's: the median of its windows so far); 0 if infeasible."""
    if record.result.ok or record.result.status == "pruned":
        return record.result.samples_per_s or 0.0
    return 0.0


def _repeat(record: TrialRecord) -> bool:
    """Whether a trial is a setup measured before, not run again: it holds its earlier trial's figure, no measurement of its own."""
    return record.free and record.reused_from is not None


def history(records: Sequence[TrialRecord], best: Sequence[float]) -> Figure:
    """Samples/s per trial in order, one marker per status, and ``best``, the best so far at each of them in that order
    (:func:`autotune.output.sections.best_so_far`)."""
    fig = Figure(figsize=(8.5, 4.2))
    ax = fig.add_subplot()
    ordered = sorted(records, key=lambda r: r.number)
    area, alpha = marker_area(len(ordered)), 1.0 if len(ordered) <= 200 else 0.6
    for layer, (status, (marker, colour)) in enumerate(STATUS_STYLE.items()):  # ok on top: a pruned marker hides none
        points = [(r.number, plotted_rate(r)) for r in ordered if r.result.status == status and not r.free]
        if points:
            ax.scatter([p[0] for p in points], [p[1] for p in points], marker=marker, color=colour, s=area, alpha=alpha,
                       label=f"{status} ({len(points)})", zorder=3 - 0.01 * layer)
    repeats = [r for r in ordered if _repeat(r)]
    if repeats:
        ax.scatter([r.number for r in repeats], [plotted_rate(r) for r in repeats], marker="o", facecolors="none", edgecolors="#888888",
                   s=area, label=f"not run: its earlier trial's figure ({len(repeats)})", zorder=3)
    unfed = [r for r in ordered if r.free and not _repeat(r)]  # a setup the data or /dev/shm cannot feed: no run, no failure
    if unfed:
        ax.scatter([r.number for r in unfed], [0.0] * len(unfed), marker="x", color="#bbbbbb", s=area * 36 / 46, alpha=alpha,
                   label=f"not run: the data or /dev/shm cannot feed it ({len(unfed)})", zorder=3)
    # From the first trial with a figure: a line at 0 before it (the defaults a --set excludes) read as a best of 0.
    line = [(r.number, b) for r, b in zip(ordered, best, strict=True)]
    line = line[next((k for k, (_, b) in enumerate(line) if b > 0), len(line)):]
    if line:
        ax.step([p[0] for p in line], [p[1] for p in line], where="post", color="#1f4e79", linewidth=1.6, label="best so far", zorder=2)
    defaults = [r for r in ordered if r.role == "defaults" and r.result.ok]
    if defaults:
        ax.axhline(defaults[0].result.samples_per_s or 0.0, color="#888888", linestyle=":", linewidth=1.2, zorder=2.5,
                   label=f"PyTorch defaults (trial #{defaults[0].number}, a single run)")  # above the best-so-far line it may equal
    ax.set_xlabel("trial number (order of the search)")
    ax.set_ylabel("throughput (samples/s)")
    ax.set_title("Optimization history: how soon the search found its best (infeasible trials at 0)")
    high = max(ax.get_ylim()[1], 1.0)
    ax.set_ylim(-0.03 * high, 1.06 * high)  # markers at 0 and at the top stay whole
    numbers = sorted({r.number for r in ordered})
    if len(numbers) == 1:  # one trial: one tick (a whole-number locator around it named trials that do not exist)
        ax.set_xlim(numbers[0] - 1, numbers[0] + 1)
        ax.set_xticks(numbers)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trial numbers are whole
    ax.grid(alpha=0.3)
    legend = ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), fontsize=8, ncol=4, frameon=False,  # below: it covers no
                       markerscale=(46.0 / area) ** 0.5)  # marker; its keys full size however many trials shrank the points
    for handle in legend.legend_handles:
        if handle is not None:
            handle.set_alpha(1.0)
    return fig


def ceilings(bars: Sequence[tuple[str, float, str]]) -> Figure:
    """Achieved throughput against the compute-only and loader-only ceilings: (label, samples/s, kind) per bar."""
    colours = {"ceiling": "#9aa5b1", "achieved": "#2a9d4b", "defaults": "#4a7ab5"}
    fig = Figure(figsize=(8.5, 0.9 + 0.75 * max(len(bars), 1)))
    ax = fig.add_subplot()
    values = [b[1] for b in bars]
    ax.barh(range(len(bars)), values, color=[colours.get(b[2], "#9aa5b1") for b in bars])
    for i, value in enumerate(values):
        ax.text(value, i, f" {value:.0f}", va="center", fontsize=9)
    ax.set_yticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("throughput (samples/s)")
    ax.set_title("Achieved vs ceilings: the gap to each ceiling is what that side leaves on the table")
    ax.set_xlim(0, max(values, default=1.0) * 1.15)
    ax.grid(axis="x", alpha=0.3)
    return fig


def batch_size(records: Sequence[TrialRecord], budget_bytes: int | None, limit_bytes: int | None = None) -> Figure:
    """Samples/s (top) and peak memory (bottom) against the micro-batch, one series per precision."""
    fig = Figure(figsize=(8.5, 6.4))
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    series: dict[str, list[TrialRecord]] = defaultdict(list)
    for r in records:
        series[precision_label(r.setup.amp, r.setup.channels_last)].append(r)
    for index, (label, group) in enumerate(sorted(series.items())):
        ok = sorted((r for r in group if r.result.ok), key=lambda r: r.setup.batch_size)
        colour, marker = series_style(index)
        if ok:
            top.plot([r.setup.batch_size for r in ok], [r.result.samples_per_s or 0.0 for r in ok], marker, color=colour, alpha=0.8,
                     linestyle="none", label=label)
            peaks = [r for r in ok if r.result.peak_memory_bytes]
            bottom.plot([r.setup.batch_size for r in peaks], [(r.result.peak_memory_bytes or 0) / GIB for r in peaks], marker,
                        color=colour, alpha=0.8, linestyle="none", label=label)
    for status in ("pruned", "oom", "timeout", "error", "diverged"):
        bad = [r for r in records if r.result.status == status]
        if bad:
            marker, colour = STATUS_STYLE[status]
            where = "windows so far" if status == "pruned" else "at 0"
            top.scatter([r.setup.batch_size for r in bad], [plotted_rate(r) for r in bad], marker=marker, color=colour, s=50,
                        label=f"{status} ({where})")
            peaks = [r for r in bad if r.result.peak_memory_bytes]
            if peaks:
                bottom.scatter([r.setup.batch_size for r in peaks], [(r.result.peak_memory_bytes or 0) / GIB for r in peaks],
                               marker=marker, color=colour, s=50, label=f"{status} peak")
    if budget_bytes:
        bottom.axhline(budget_bytes / GIB, color="#d62728", linestyle="--", linewidth=1.2,
                       label=f"budget the batch range was sized to, {format_bytes(budget_bytes)}")
    if limit_bytes and limit_bytes != budget_bytes:  # what a trial ran out of memory against: --max-memory
        bottom.axhline(limit_bytes / GIB, color="#7f0000", linestyle="-", linewidth=1.2,
                       label=f"--max-memory, a peak above it is oom: {format_bytes(limit_bytes)}")
    top.set_xscale("log", base=2)
    sizes = sorted({r.setup.batch_size for r in records})
    bottom.set_xticks(sizes, [str(b) for b in sizes])
    bottom.xaxis.set_minor_locator(NullLocator())
    top.set_ylabel("throughput (samples/s)")
    high = max(top.get_ylim()[1], 1.0)  # every trial at 0 (all failed): an axis of its own, not -0.03 to 0.05
    top.set_ylim(-0.03 * high, high)
    top.set_title("Batch size: where throughput stops rising, and how close each trial came to the memory budget")
    bottom.set_xlabel("micro-batch size (samples per step and rank, log scale)")
    bottom.set_ylabel("peak memory (GiB)")
    bottom.set_ylim(0, 1.1 * max(bottom.get_ylim()[1], (budget_bytes or 0) / GIB))  # markers at the top stay whole
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    return fig


def loader(records: Sequence[TrialRecord], calibration: Calibration | None) -> Figure:
    """Samples/s (top) and data-wait fraction (bottom) against loader workers, one series per prefetch."""
    fig = Figure(figsize=(8.5, 6.0))
    top, bottom = fig.subplots(2, 1, sharex=True)
    series: dict[int, list[TrialRecord]] = defaultdict(list)  # by prefetch depth, 0: no workers
    for r in records:
        if r.result.ok:
            series[(r.setup.prefetch_factor or 2) if r.setup.num_workers else 0].append(r)
    for index, (depth, group) in enumerate(sorted(series.items())):  # in order of depth: prefetch 2 before prefetch 10
        colour, marker = series_style(index)
        label = f"prefetch {depth}" if depth else "no workers"
        top.plot([r.setup.num_workers for r in group], [r.result.samples_per_s or 0.0 for r in group], marker, color=colour, alpha=0.8,
                 linestyle="none", label=label)
        waits = [r for r in group if r.result.data_wait_fraction is not None]
        bottom.plot([r.setup.num_workers for r in waits], [100 * (r.result.data_wait_fraction or 0.0) for r in waits], marker,
                    color=colour, alpha=0.8, linestyle="none", label=label)
    points = sorted((p for p in (calibration.loader if calibration else ()) if p.samples_per_s), key=lambda p: p.num_workers)
    if points:
        top.plot([p.num_workers for p in points], [p.samples_per_s or 0.0 for p in points], "k--", marker="_", label="loader alone (ceiling)")
    top.set_ylabel("throughput (samples/s)")
    highest = max([p.samples_per_s or 0.0 for p in points] + [r.result.samples_per_s or 0.0 for g in series.values() for r in g] + [1.0])
    top.set_ylim(0, 1.1 * highest)  # the ceiling's line and the top markers stay whole
    top.set_title("Loader workers: more workers help only while the loop waits on data")
    bottom.set_xlabel("DataLoader num_workers")
    bottom.set_ylabel("data wait (% of wall time)")
    bottom.set_ylim(0, 100)
    bottom.xaxis.get_major_locator().set_params(integer=True)
    for ax in (top, bottom):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    return fig


def importance(importances: dict[str, float], evaluator: str) -> Figure:
    """Knob importances as horizontal bars, largest first."""
    items = sorted(importances.items(), key=lambda kv: kv[1])
    fig = Figure(figsize=(8.5, 1.0 + 0.45 * max(len(items), 1)))
    ax = fig.add_subplot()
    ax.barh([k for k, _ in items], [100 * v for _, v in items], color="#4a7ab5")
    for i, (_, v) in enumerate(items):
        ax.text(100 * v, i, f" {100 * v:.0f} %", va="center", fontsize=9)
    ax.set_xlim(0, 110)
    ax.set_xlabel(f"importance (% of the total, {evaluator})")
    ax.set_title("Knob importance: which knob's value decided the throughput")
    ax.grid(axis="x", alpha=0.3)
    return fig


def confirmation(confirmed: Sequence[Confirmed]) -> Figure:
    """Every finalist's measurements per round, with the median, fastest on top."""
    ranked = sorted(confirmed, key=lambda c: c.median or 0.0, reverse=True)
    # A setup's whole label on lines of 30 characters: on one line the axis kept under half the width and, the page
    # scaling the figure to an 800-px window, the labels came out about 5 px tall.
    labels = [textwrap.fill(c.candidate.label, 30) for c in ranked]
    fig = Figure(figsize=(8.5, 1.2 + sum(0.3 + 0.16 * (label.count("\n") + 1) for label in labels) if labels else 1.8))
    ax = fig.add_subplot()
    rounds = max((len(c.values) for c in ranked), default=0)
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2")
    for k in range(rounds):
        pts = [(c.values[k], i) for i, c in enumerate(ranked) if len(c.values) > k]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=colours[k % len(colours)], s=40, alpha=0.85, label=f"measurement {k + 1}", zorder=3)
    medians = [(c.median, i) for i, c in enumerate(ranked) if c.median is not None]
    if medians:
        ax.scatter([m[0] for m in medians], [m[1] for m in medians], marker="|", s=600, color="black", linewidths=2.5, label="median", zorder=4)
    ax.set_yticks(range(len(ranked)), labels, fontsize=8)
    ax.set_ylim(len(ranked) - 0.5, -0.5)
    ax.set_xlim(left=0)  # from zero, as every throughput plot: an axis from 14.4 to 16.0 made 5 % look like half the width
    ax.set_xlabel("throughput (samples/s)")
    ax.set_title("Confirmation: interleaved re-measurement; the spread of the dots is the noise")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.5 / max(len(ranked), 1) - 0.12), ncol=min(rounds + 1, 6),
              frameon=False)  # below the axes: the figure keeps the page's width
    return fig


def time_spent(spent: TimeSpent) -> Figure:
    """Where the search's wall time went, one bar per part."""
    parts = spent.breakdown()
    total = spent.wall_s or sum(v for _, v in parts) or 1.0
    fig = Figure(figsize=(8.5, 1.0 + 0.42 * len(parts)))
    ax = fig.add_subplot()
    ax.barh([p[0] for p in parts], [p[1] for p in parts], color="#4a7ab5")
    for i, (_, v) in enumerate(parts):
        ax.text(v, i, f" {v:.0f} s ({v / total:.0%})" if v >= 10 else f" {v:.1f} s ({v / total:.0%})", va="center", fontsize=9)
    ax.invert_yaxis()
    ax.set_xlim(0, max((p[1] for p in parts), default=1.0) * 1.3 or 1.0)
    ax.set_xlabel("wall time (s)")
    ax.set_title("Search cost: measured windows are the useful part; the rest is overhead")
    ax.grid(axis="x", alpha=0.3)
    return fig
