"""The benchmark report: a markdown table and a grouped-bar plot.

Reads ``benchmarks/results/*.json``; only the plot needs matplotlib (the
``plots`` extra: ``pip install -e ".[plots]"``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

METHOD_ORDER = ("defaults", "recipe", "max_batch", "random_15", "random", "autotune_15", "autotune", "emitted", "grid")


class MissingMatplotlib(RuntimeError):
    """The plot was asked for but matplotlib is not installed."""


def load_results(directory: Path) -> list[dict[str, Any]]:
    """Every ``<workload>.json`` in ``directory``, sorted by name."""
    results = []
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict) and "methods" in data and "workload" in data:
            results.append(data)
    return results


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown_table(results: list[dict[str, Any]]) -> str:
    """One row per workload and method: pick, samples/s, ratio to grid, cost."""
    lines = [
        "| workload | method | pick | samples/s (median) | x grid | trials | search wall s |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    notes = []
    for result in results:
        name = result["workload"]["name"]
        for method in METHOD_ORDER:
            m = result["methods"].get(method)
            if m is None:
                continue
            lines.append(
                f"| {name} | {method} | {m.get('describe', '')} | {_num(m.get('samples_per_s'), '.1f')} "
                f"| {_num(m.get('ratio_to_grid'), '.2f')} | {m.get('trials', 0)} | {_num(m.get('wall_s'), '.0f')} |"
            )
        at = result["methods"].get("autotune", {})
        cost = at.get("search_cost") or {}
        notes.append(
            f"* {name}: autotune reached 95 % of the grid's best after "
            f"{at.get('trials_to_95pct_grid') or 'never (within budget)'} trial(s) "
            f"(random: {result['methods'].get('random', {}).get('trials_to_95pct_grid') or 'never'}); "
            f"search wall {cost.get('wall_s')} s vs {cost.get('measured_s')} s measured "
            f"= {cost.get('wall_over_measured')}x"
        )
        for goal in result.get("goals", []):
            if not goal["ok"]:
                notes.append(f"  * MISSED: {goal['goal']} ({goal['detail']})")
    return "\n".join(lines + [""] + notes)


def measurements_table(results: list[dict[str, Any]]) -> str:
    """The final interleaved rounds behind each median: one row per workload."""
    methods = [m for m in METHOD_ORDER if any(m in r["methods"] for r in results)]
    lines = ["| workload | " + " | ".join(methods) + " |", "| --- |" + " --- |" * len(methods)]
    for result in results:
        cells = []
        for method in methods:
            values = (result["methods"].get(method) or {}).get("measurements") or []
            cells.append(", ".join(_num(v, ".1f") for v in values) or "-")
        lines.append(f"| {result['workload']['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals_table(results: list[dict[str, Any]]) -> str:
    """Each workload's goals as the run checked them: OK or MISSED, with the figures."""
    goals = [g["goal"] for g in (results[0].get("goals") or [])] if results else []
    lines = ["| workload | " + " | ".join(goals) + " |", "| --- |" + " --- |" * len(goals)]
    for result in results:
        found = {g["goal"]: g for g in result.get("goals") or []}
        cells = [
            f"{'OK' if found[g]['ok'] else 'MISSED'} ({found[g]['detail']})" if g in found else "-" for g in goals
        ]
        lines.append(f"| {result['workload']['name']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_plot(results: list[dict[str, Any]], path: Path) -> Path:
    """Grouped bars: samples/s of each method normalised to the grid, per workload.

    Raises:
        MissingMatplotlib: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingMatplotlib(
            'the plot needs matplotlib: pip install -e ".[plots]" (or --no-plot for the table only)'
        ) from None
    workloads = [r["workload"]["name"] for r in results]
    methods = [m for m in METHOD_ORDER if any(m in r["methods"] for r in results)]
    width = 0.8 / max(1, len(methods))
    fig, ax = plt.subplots(figsize=(max(6.0, 2.2 * len(workloads) + 2), 4.2))
    for i, method in enumerate(methods):
        xs = [w + (i - (len(methods) - 1) / 2) * width for w in range(len(workloads))]
        ys = [r["methods"].get(method, {}).get("ratio_to_grid") or 0.0 for r in results]
        ax.bar(xs, ys, width, label=method)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.95, color="gray", linewidth=0.8, linestyle="--")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set_ylabel("samples/s / grid's best (median, same run)")
    ax.set_title("Pick quality per method (interleaved re-measurement)")
    ax.legend(ncol=min(4, len(methods)), fontsize="small", loc="lower center", bbox_to_anchor=(0.5, -0.35))
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path
