"""Where a search's time goes, run by run: each trial process's phase, wall, warm-up and measured windows.

Usage: ``python -m benchmarks.search_breakdown OUT_JSON -- SEARCH_ARGS...``, for example::

    python -m benchmarks.search_breakdown /tmp/bd.json -- search --model resnet18 --image-size 64 --trials 15 \\
        --confirm-top 3 --confirm-rounds 4 --no-ceilings --seed 0 --device cpu --out /tmp/bd

Runs ``autotune SEARCH_ARGS`` in this process with the search's trial runner wrapped, then writes every run
(phase, mode, batch, workers, amp, accumulation, status, wall, warm-up and measured seconds) and the totals per
phase to OUT_JSON and prints the totals. A run's warm-up counts from its process's start (model, data, loader,
warm-up steps); what is neither warm-up nor windows is the launch and the result's hand-over.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def main(argv: Sequence[str] | None = None) -> int:
    """Run the search, write the breakdown; return the search's exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 3 or args[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    out, search = Path(args[0]), args[2:]
    from autotune.tuner import timed

    runs: list[dict[str, Any]] = []
    original = timed.TimedRunner.__call__

    def recorded(self: Any, setup: Any, workload: Any, options: Any = None, *, on_window: Any = None) -> Any:
        began = time.monotonic()
        result = original(self, setup, workload, options, on_window=on_window)
        runs.append({"phase": self.timing.phase, "mode": getattr(options, "mode", None), "batch_size": setup.batch_size,
                     "num_workers": setup.num_workers, "amp": setup.amp, "accumulation_steps": setup.accumulation_steps,
                     "status": result.status, "wall_s": round(time.monotonic() - began, 2),
                     "warmup_s": round(result.warmup_s or 0.0, 2), "measured_s": round(result.measured_s or 0.0, 2)})
        return result

    timed.TimedRunner.__call__ = recorded  # type: ignore[method-assign]
    from autotune.cli import main as cli

    code = 0
    try:
        cli(search)
    except SystemExit as exc:
        code = int(exc.code or 0) if not isinstance(exc.code, str) else 1
    finally:
        totals: dict[str, dict[str, float]] = {}
        for run in runs:
            phase = totals.setdefault(run["phase"], {"runs": 0, "wall_s": 0.0, "warmup_s": 0.0, "measured_s": 0.0})
            phase["runs"] += 1
            for key in ("wall_s", "warmup_s", "measured_s"):
                phase[key] += run[key]
        out.write_text(json.dumps({"runs": runs, "totals": totals}, indent=1) + "\n", encoding="utf-8")
        for name, phase in totals.items():
            other = phase["wall_s"] - phase["warmup_s"] - phase["measured_s"]
            print(f"{name}: {phase['runs']:.0f} runs, wall {phase['wall_s']:.1f} s = warm-up {phase['warmup_s']:.1f} + "
                  f"windows {phase['measured_s']:.1f} + other {other:.1f}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
