"""Usage accounting on vs off: the fan-out phase with and without token usage in every reply.

`python -m benchmarks usage [--n N] [--quick] [--json]`. Runs `fanout._fanout` (N children x 10
steps through the full seam) in interleaved pairs, each on a fresh runtime, alternating which
side goes first, so a machine whose load drifts and the order within a pair affect both sides
alike. "On" means every scripted reply reports
usage: it is logged on its `assistant/message` event and charged up the child's account chain
(what a real model adapter costs the runtime). Reports the median CPU per child step and wall
time of each side and their ratios; the target is on/off within 5 %.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from benchmarks import fanout

DEFAULT_N = 2_000
QUICK_N = 200
PAIRS = 6
QUICK_PAIRS = 2
TARGET = 1.05


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    n = n or (QUICK_N if quick else DEFAULT_N)
    pairs = QUICK_PAIRS if quick else PAIRS
    fanout._fanout(min(n, 200))  # warm-up: imports, caches, first-allocation costs
    off: list[dict[str, Any]] = []
    on: list[dict[str, Any]] = []
    for i in range(pairs):
        # Alternate which side goes first (off-on, on-off, ...): a run is slower after another
        # one in the same process (heap growth, the collector), and that must not favour a side.
        for usage in (False, True) if i % 2 == 0 else (True, False):
            (on if usage else off).append(fanout._fanout(n, usage=usage))

    def median(runs: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    cpu_off = median(off, "cpu_per_child_step_us")
    cpu_on = median(on, "cpu_per_child_step_us")
    wall_off = median(off, "wall_s")
    wall_on = median(on, "wall_s")
    ratios = {
        "cpu_on_over_off": round(cpu_on / cpu_off, 4),
        "wall_on_over_off": round(wall_on / wall_off, 4),
    }
    return {
        "n": n,
        "pairs": pairs,
        "cpu_per_child_step_us": {"off": cpu_off, "on": cpu_on},
        "wall_s": {"off": wall_off, "on": wall_on},
        "runs": {"off": off, "on": on},
        "ratios": ratios,
        "target": f"<= {TARGET}",
        "meets_target": {k: v <= TARGET for k, v in ratios.items()},
        "notes": [
            "pairs interleaved on fresh runtimes, order alternating (off-on, on-off); medians",
            f"usage on: every reply reports {fanout.USAGE}",
        ],
    }
