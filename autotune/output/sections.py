"""The sections of report.html: one per plot, each with its reading guide and data.

Each ``*_section`` function takes records-level data and returns a
:class:`Section`: a title that says what to read from the plot, the plot as
PNG bytes (None without matplotlib or without data), and the data behind it
as tables. :mod:`autotune.output.report` assembles them into the page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from autotune.output.best import Best
from autotune.output.importance import FEW_TRIALS, knob_importance, measured_trials
from autotune.records import Calibration, TrialRecord
from autotune.rounds import Ceilings, Confirmed
from autotune.time_spent import TimeSpent
from autotune.train_setup import TrainSetup
from autotune.units import counted, format_bytes


@dataclass(frozen=True)
class ReportInput:
    """What a report shows (records-level data only).

    Attributes:
        records: Every finished trial.
        calibration: The pre-search measurements, if the study holds them.
        confirmed: The confirmation rounds (empty if they did not run).
        best: The winner as in best.json, or None (no feasible trial, or a
            study still running).
        verdict: The bottleneck verdict in words, or None.
        time_spent: Where the search's time went, or None.
        time_complete: False when ``time_spent`` was rebuilt from the trial
            records alone (a study whose runs have not recorded their time).
        study: Study name.
        storage: Storage URL.
        status: One line on the state of the search (finished, interrupted, running).
        ceilings: The winner's own setup computing alone and loading alone,
            measured right after the confirmation, beside its confirmed median
            (None when not measured: the calibration's ceilings stand in).
        baseline_only: Trials whose setup the search's ``--set`` excludes (the
            PyTorch defaults it measured as the baseline): never the best so far.
        workload: What the search trains, in one line, as the study stored it (shown
            when there is no ``best``, whose own workload says it otherwise).
        max_memory_bytes: The search's ``--max-memory`` (a peak above it is an ``oom``), or None.
        world_size: Ranks per trial (``--nproc-per-node``) as the study stored them: with several, samples/s counts
            every rank and the batch and memory are one rank's (said also before ``best`` exists).
        elsewhere: Where ``best``'s best.json and train.py are when not beside the page (a shared study's winner, which
            the worker that confirmed it wrote in its own --out), in words; None where they are beside it.
    """

    records: tuple[TrialRecord, ...]
    calibration: Calibration | None
    confirmed: tuple[Confirmed, ...]
    best: Best | None
    verdict: str | None
    time_spent: TimeSpent | None
    study: str
    storage: str
    time_complete: bool = True
    status: str = "finished"
    ceilings: Ceilings | None = None
    baseline_only: frozenset[int] = frozenset()
    workload: str | None = None
    max_memory_bytes: int | None = None
    world_size: int = 1
    elsewhere: str | None = None


@dataclass(frozen=True)
class Table:
    """The data behind a plot."""

    caption: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class Section:
    """One plot of the report with its reading guide and data."""

    id: str
    title: str
    reading: str
    image: bytes | None
    tables: tuple[Table, ...]
    caveat: str | None = None
    alt: str = ""


def plotting() -> ModuleType | None:
    """The plotting module, or None when matplotlib cannot be imported (checked on every call).

    matplotlib's warnings as it imports are not printed: where its config and cache directories cannot be made (an
    unwritable HOME), it says so in two lines of its own and uses a temporary directory, which serves the report."""
    import logging

    quiet = logging.getLogger("matplotlib")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        try:
            import matplotlib  # noqa: F401
        except ImportError:  # the plots extra is not installed: the report says so
            return None
        from autotune.output import plots  # its matplotlib imports make the cache: quiet too; its own errors surface
    finally:
        quiet.setLevel(level)
    return plots


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _draw(plots: ModuleType | None, name: str, *args: Any) -> bytes | None:
    if plots is None:
        return None
    fig = getattr(plots, name)(*args)
    return bytes(plots.png(fig))


def _measured(record: TrialRecord) -> bool:
    """Whether the trial measured a throughput."""
    return record.result.ok and bool(record.result.samples_per_s)


def fastest_trial(records: Sequence[TrialRecord], baseline_only: frozenset[int] = frozenset()) -> TrialRecord | None:
    """The fastest trial that measured a throughput: of those the search's ``--set`` allows (not ``baseline_only``)
    when any did, else of all (the report's and ``autotune status``'s best so far)."""
    ok = [r for r in records if _measured(r)]
    return max([r for r in ok if r.number not in baseline_only] or ok, key=lambda r: r.result.samples_per_s or 0.0, default=None)


def _winner(data: ReportInput) -> tuple[float | None, str, float | None, str, TrainSetup | None]:
    """The achieved rate, its label, the defaults' rate, what that rests on, and the winner's setup
    (confirmed, or the best trial so far)."""
    if data.best is not None:
        label = "winner\n(confirmed median)" if data.best.confirmed else "best so far\n(not confirmed)"
        basis = data.best.speedup_basis  # their rounds, those of an interrupted confirmation, or their single trial
        rounds = "same rounds" if data.best.confirmed else "single trial" if basis.startswith("single") else "rounds so far"
        return data.best.samples_per_s, label, data.best.defaults_samples_per_s, rounds, data.best.setup
    top = fastest_trial(data.records, data.baseline_only)
    if top is None:
        return None, "", None, "", None
    defaults = next((r.result.samples_per_s for r in data.records if r.role == "defaults" and _measured(r)), None)
    return top.result.samples_per_s, f"best trial so far\n(#{top.number}, unconfirmed)", defaults, "single trial", top.setup


def ceiling_bars(data: ReportInput) -> list[tuple[str, float, str, str]]:
    """(label, samples/s, kind, what) per bar of the ceilings plot; kind: ceiling, achieved or defaults.

    The winner's own ceilings (measured right after its confirmation rounds) when the search
    measured them, else the calibration's (measured at a probe setup before the search).
    """
    achieved, label, defaults, rounds, winner = _winner(data)
    bars: list[tuple[str, float, str, str]] = []
    own, cal = data.ceilings, data.calibration
    if own is not None and own.compute and own.loader:
        bars.append(("compute alone\n(winner's setup)", own.compute, "ceiling", "the winner's model step, one batch in memory, after the rounds"))
        bars.append(("loader alone\n(winner's setup)", own.loader, "ceiling", "the winner's DataLoader, no model, after the rounds"))
        if own.together and own.together != achieved:  # else the winner's own bar below: one figure, not two that agree
            bars.append(("together\n(confirmed)", own.together, "achieved", "the winner's real loop, its median in the rounds just before"))
    elif cal is not None:
        # The bottleneck line's figures: compute at the winner's precision and layout, the loader at most its workers.
        compute, setup = cal.compute_samples_per_s, cal.compute_setup
        if winner is not None and (like := cal.precision_of(winner)) is not None:
            compute, setup = like.samples_per_s, replace(setup, amp=winner.amp, channels_last=winner.channels_last)
        if compute:
            bars.append(("compute only\n(calibration)", compute, "ceiling", f"model alone, one batch in memory ({setup.describe()})"))
        top = cal.fastest_loader(within=winner.num_workers if winner is not None else None)
        if top is not None:
            bars.append((f"loader only\n(calibration, {counted(top.num_workers, 'worker')})", top.samples_per_s or 0.0, "ceiling",
                         "DataLoader alone, no model"))
    # The winner (or best so far) is the defaults' own setup: one bar of one figure, not a winner's and the defaults' alike.
    kept = winner is not None and winner == next((r.setup for r in data.records if r.role == "defaults"), None)
    if achieved and kept:
        confirmed = data.best is not None and data.best.confirmed
        bars.append(("PyTorch defaults\n(kept: nothing beat them)" if confirmed else "PyTorch defaults\n(best so far, unconfirmed)",
                     achieved, "defaults", "the workload's batch, no workers, fp32"))
    elif achieved:
        bars.append((label, achieved, "achieved", "the training loop, loader and model together"))
    if defaults and not kept:
        bars.append((f"PyTorch defaults\n({rounds})", defaults, "defaults", "the workload's batch, no workers, fp32"))
    return bars


def summary_section(data: ReportInput, plots: ModuleType | None) -> Section:
    """The winner, the verdict and the ceilings."""
    bars = ceiling_bars(data)
    rows = tuple((label.replace("\n", " "), _rate(value), what) for label, value, _, what in bars)
    loader = [p for p in (data.calibration.loader if data.calibration else ())]
    calibration = tuple((counted(p.num_workers, "worker"), p.status, _rate(p.samples_per_s)) for p in loader)
    confirmed = data.best is not None and data.best.confirmed  # else the bars show the best trial so far, unconfirmed
    achieved = any(b[2] != "ceiling" for b in bars)  # none before a trial measured a throughput
    return Section(
        "summary", "Winner against the ceilings" if confirmed else "Best so far against the ceilings" if achieved else "Ceilings",
        "Each ceiling is one side measured alone: the model with one batch already in memory, and the DataLoader "
        "with no model. Training with both should reach neither (one short run of each can read low: the verdict then says "
        "unclear). The Bottleneck line above names the limit from these figures and the time training waited on the DataLoader.",
        # Drawn with a figure achieved: the winner's, or the kept defaults' (one bar of kind "defaults").
        _draw(plots, "ceilings", [(b[0], b[1], b[2]) for b in bars]) if achieved else None,
        (Table("ceilings and achieved throughput", ("measurement", "samples/s", "what"), rows),
         Table("loader alone per worker count (calibration)", ("workers", "status", "samples/s"), calibration)),
        alt="bar chart: compute-only and loader-only ceilings against the achieved throughput",
    )


def best_so_far(records: Sequence[TrialRecord], baseline_only: frozenset[int] = frozenset()) -> list[tuple[TrialRecord, float]]:
    """Each trial in the order it ran with the best feasible samples/s up to it (0 before any), never that of a
    ``baseline_only`` trial (one the search's ``--set`` excludes): the history's line and its table."""
    best, line = 0.0, []
    for r in sorted(records, key=lambda r: r.number):
        if r.result.ok and r.number not in baseline_only:
            best = max(best, r.result.samples_per_s or 0.0)
        line.append((r, best))
    return line


def history_section(records: Sequence[TrialRecord], plots: ModuleType | None, baseline_only: frozenset[int] = frozenset()) -> Section:
    """Samples/s per trial in order with the best so far (of the trials the ``--set`` allows: not ``baseline_only``)."""
    rows, line = [], best_so_far(records, baseline_only)
    for r, best in line:
        reused = f"same setup as #{r.reused_from}" if r.reused_from is not None else ""
        rows.append((str(r.number), r.role, r.setup.describe(), r.result.status, _rate(r.result.samples_per_s),
                     _rate(best or None), r.result.error or reused))
    return Section(
        "history", "Optimization history",
        "Each marker is one trial in the order it ran; the line is the best feasible throughput so far. A line that "
        "stops rising early means more trials would probably not help. Pruned trials sit at the window where they "
        "were stopped; oom, timeout and error trials sit at 0. Each marker is a single run under the machine's load of "
        "its moment (a resumed search's trials come from several runs, and a trial interrupted by Ctrl-C leaves a gap "
        "in the numbers): the confirmation rounds below compare setups under the same load.",
        _draw(plots, "history", [r for r, _ in line], [best for _, best in line]) if records else None,
        (Table("trials", ("#", "role", "setup", "status", "samples/s", "best so far", "note"), tuple(rows)),),
        alt="scatter of samples/s per trial with a best-so-far line",
    )


def batch_section(records: Sequence[TrialRecord], calibration: Calibration | None, plots: ModuleType | None,
                  limit: int | None = None) -> Section:
    """Samples/s and peak memory against the batch size (``limit``: the search's ``--max-memory``)."""
    budget = calibration.budget_bytes if calibration else None
    rows = tuple(
        (str(r.number), str(r.setup.batch_size), str(r.setup.accumulation_steps), r.setup.amp,
         "yes" if r.setup.channels_last else "no", r.result.status, _rate(r.result.samples_per_s),
         format_bytes(r.result.peak_memory_bytes))
        for r in sorted(records, key=lambda r: (r.setup.batch_size, r.number))
    )
    points = tuple((str(p.batch_size), p.status, format_bytes(p.peak_bytes), _rate(p.samples_per_s))
                   for p in (calibration.memory_points if calibration else ()))
    return Section(
        "batch-size", "Throughput and memory against batch size",
        "Top: samples/s per micro-batch size, one series per precision. Throughput usually rises and then flattens; "
        "past the knee a larger batch only costs memory (and changes the training math). Bottom: each trial's peak "
        f"memory against the budget the batch range was sized to ({format_bytes(budget)}: on a CPU 80 % of --max-memory or of "
        "half the available RAM split among DDP ranks and parallel trials, the rest left to loader workers; on a GPU 90 % of "
        "the free memory). A trial ran out of memory where its status says oom (on a CPU: above --max-memory, where one was "
        f"given{f', drawn too: {format_bytes(limit)}' if limit else ''}). Batch and memory are one rank's.",
        _draw(plots, "batch_size", records, budget, limit) if records else None,
        (Table("trials by batch size", ("#", "batch", "accumulation", "amp", "channels_last", "status", "samples/s", "peak memory"), rows),
         Table("memory pre-pass (calibration)", ("batch", "status", "peak memory", "samples/s"), points)),
        alt="two panels: samples/s and peak memory against micro-batch size",
    )


def loader_section(records: Sequence[TrialRecord], calibration: Calibration | None, plots: ModuleType | None) -> Section:
    """Samples/s and data wait against loader workers."""
    ok = sorted((r for r in records if r.result.ok), key=lambda r: (r.setup.num_workers, r.number))
    rows = tuple((str(r.number), str(r.setup.num_workers), str(r.setup.prefetch_factor or "-"), _rate(r.result.samples_per_s),
                  _pct(r.result.data_wait_fraction)) for r in ok)
    points = tuple((str(p.num_workers), p.status, _rate(p.samples_per_s)) for p in (calibration.loader if calibration else ()))
    return Section(
        "loader", "Throughput and data wait against loader workers",
        "Top: samples/s per DataLoader worker count, one series per prefetch factor; the dashed line is what the "
        "loader alone delivers. Bottom: the share of wall time the loop waited for data. Workers help while the wait "
        "is high; once it is near 0, more workers only take CPU from the model.",
        _draw(plots, "loader", records, calibration) if ok else None,
        (Table("feasible trials by workers", ("#", "workers", "prefetch", "samples/s", "data wait"), rows),
         Table("loader alone (calibration)", ("workers", "status", "samples/s"), points)),
        alt="two panels: samples/s and data-wait fraction against num_workers",
    )


def importance_section(records: Sequence[TrialRecord], plots: ModuleType | None) -> Section:
    """Which knob mattered (Optuna's importance evaluators)."""
    found = knob_importance(records)
    if found is None:
        count = len(measured_trials(records))
        why = (f"{counted(count, 'measured trial')} (the PyTorch defaults' and repeats left out), and importances need at "
               f"least {FEW_TRIALS}: with fewer, "
               "they follow the fastest trial's knobs, not what the others measured" if count < FEW_TRIALS else
               "no knob varied among the measured trials")
        return Section("importance", "Knob importance", "Which knobs set the fast setups apart (Optuna's parameter "
                       "importances), from the search's measured trials.", None, (), caveat=f"not computed: {why}")
    if found.top is None:
        reading = "the share of the throughput's variation each knob explains"
    else:
        reading = (f"how far each knob's values among the {found.top} fastest trials differ from its values over all "
                   f"{found.trials}: the knobs that set the fastest setups apart")
    rows = tuple((k, f"{100 * v:.1f} %") for k, v in found.values.items())
    return Section(
        "importance", "Knob importance",
        f"Bars are Optuna's parameter importances ({found.evaluator}) over the {found.trials} trials that measured a "
        f"throughput (a pruned trial counts with the median of its windows so far), the PyTorch defaults' left out: {reading}. "
        "A knob near 0 could be left at any value the search tried; read them as a hint beside the trials' own figures.",
        _draw(plots, "importance", found.values, found.evaluator),
        (Table("importance per knob", ("knob", "importance"), rows),),
        alt="horizontal bars: importance per knob",
    )


def confirmation_section(confirmed: Sequence[Confirmed], plots: ModuleType | None, status: str = "",
                         winner: TrainSetup | None = None) -> Section:
    """Every finalist's re-measurements with the median (``status``: the search's, which says why there are none); the
    ``winner``'s row is marked (within the noise a simpler setup wins over a higher median: the top row may not be it)."""
    confirmed = [replace(c, candidate=replace(c.candidate, label=f"{c.candidate.label} (winner)")) if c.candidate.setup == winner else c
                 for c in confirmed]
    rounds = max((len(c.values) for c in confirmed), default=0)
    ranked = sorted(confirmed, key=lambda c: c.median or 0.0, reverse=True)
    rows = tuple((c.candidate.label, *(_rate(c.values[k]) if k < len(c.values) else "-" for k in range(rounds)),
                  _rate(c.median), _rate(c.spread), c.remarks()) for c in ranked)
    headers = ("setup", *(f"measurement {k + 1}" for k in range(rounds)), "median", "spread", "failures / stopped")
    measured = any(c.values for c in confirmed)
    return Section(
        "confirmation", "Confirmation rounds",
        "The finalists and the PyTorch defaults re-measured in interleaved rounds (A B C A B C), so each round saw the "
        "same machine load. Dots are single measurements, the bar is the median the winner is chosen by. Dots of two "
        "setups that overlap mean the difference between them is within the noise.",
        _draw(plots, "confirmation", confirmed) if measured else None,
        (Table("confirmation measurements (samples/s)", headers, rows),),
        caveat=None if measured else "no confirmation rounds: no trial measured a throughput" if status.startswith("failed") else
        "no confirmation rounds: the search was interrupted before them (or is still running)",
        alt="dot plot: each finalist's measurements per round and their median",
    )


def time_section(spent: TimeSpent | None, complete: bool, plots: ModuleType | None) -> Section:
    """Where the search's time went."""
    reading = ("Bars are wall time per part of the search. Measured windows are the useful part; warm-ups, trial "
               "start/stop and calibration are the price of measuring in isolated processes, and pruned time is "
               "what stopping slow trials early still cost.")
    if spent is None:
        return Section("time", "Where the search's time went", reading, None, (), caveat="no timing recorded")
    parts = spent.breakdown()
    total = spent.wall_s or sum(v for _, v in parts) or 1.0
    rows = tuple((label, f"{value:.1f}", f"{value / total:.0%}") for label, value in parts)
    # Runs summed (resumed, or workers of a shared study) add their wall times: worker-seconds, not the study's clock time.
    wall = "wall time" if spent.searches <= 1 else f"wall time, summed over {spent.searches} runs of the search"
    rows += ((wall, f"{spent.wall_s:.1f}", "100%"), (f"trial runs: {spent.runs}", "", "")) if spent.wall_s else ()
    caveat = None if complete else (
        "rebuilt from the trial records only (the search has not recorded its time yet, e.g. it is still running): "
        "calibration, confirmation, start/stop and wall time are missing"
    )
    return Section("time", "Where the search's time went", reading, _draw(plots, "time_spent", spent),
                   (Table("time per part", ("part", "seconds", "share"), rows),), caveat=caveat,
                   alt="horizontal bars: seconds per part of the search")
