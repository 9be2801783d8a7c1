"""Usage accounting on vs off: the fan-out phase with and without token usage in every reply.

`python -m benchmarks usage [--n N] [--quick] [--json]`. Runs `fanout._fanout` (N children x 10
steps through the full seam) in interleaved pairs, every run in its own fresh interpreter
(`benchmarks/_isolated.py`: no run inherits another's heap, GC generations or hub state),
alternating which side goes first, so a machine whose load drifts affects both sides alike.
Both sides are the same job at the same N with the runtime's default GC policy; CPU is the
process's user + system time, the cyclic GC and the final collection of deferred garbage
included. "On" means every scripted reply reports usage: it is logged on its `assistant/message`
event and charged up the child's account chain (what a real model adapter costs the runtime).
The scripted model's usage is an `agent.usage.Usage`, checked once when the model is made; a
real adapter checks each response's once, where it parses the response (`checked_usage`), which
this does not count. Reports the median CPU per child step and wall time of each side and their
ratios; the target is on/off within 5 %.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from benchmarks import _isolated, fanout

DEFAULT_N = 2_000
QUICK_N = 200
PAIRS = 12
QUICK_PAIRS = 2
TARGET = 1.05


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    n = n or (QUICK_N if quick else DEFAULT_N)
    pairs = QUICK_PAIRS if quick else PAIRS
    off: list[dict[str, Any]] = []
    on: list[dict[str, Any]] = []
    for i in range(pairs):
        # Each run in a fresh process (a run in the same process as another is slower: heap
        # growth, the collector's generations), and the side that goes first alternating
        # (off-on, on-off, ...), so neither order nor load drift favours a side.
        for usage in (False, True) if i % 2 == 0 else (True, False):
            figures = _isolated.run("benchmarks.fanout:_fanout", n, "default", usage)
            if figures.get("available") is False:
                raise RuntimeError(f"usage benchmark: a run failed: {figures.get('reason')}")
            (on if usage else off).append(figures)

    def median(runs: list[dict[str, Any]], key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    cpu_off = median(off, "cpu_per_child_step_us")
    cpu_on = median(on, "cpu_per_child_step_us")
    # On a loaded machine noise only adds CPU time: the fastest run of each side is the other
    # robust estimate (the ratios stay the medians').
    min_off = min(r["cpu_per_child_step_us"] for r in off)
    min_on = min(r["cpu_per_child_step_us"] for r in on)
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
        "cpu_per_child_step_us_min": {
            "off": min_off,
            "on": min_on,
            "on_over_off": round(min_on / min_off, 4),
        },
        "wall_s": {"off": wall_off, "on": wall_on},
        "runs": {"off": off, "on": on},
        "ratios": ratios,
        "target": f"<= {TARGET}",
        "meets_target": {k: v <= TARGET for k, v in ratios.items()},
        "notes": [
            "every run in its own fresh interpreter; pairs interleaved, order alternating "
            "(off-on, on-off); medians",
            f"usage on: every reply reports {fanout.USAGE}",
        ],
    }
