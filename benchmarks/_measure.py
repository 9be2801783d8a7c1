"""Small measuring helpers every benchmark uses: RSS, percentiles, units, ratios."""

from __future__ import annotations

import os

__all__ = ["pct", "ratio", "rss_bytes", "us"]


def rss_bytes() -> int:
    """This process's resident set size, from /proc (no dependency)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def pct(samples: list[float], q: float) -> float:
    """The q-quantile (0..1) of `samples`, nearest rank."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def us(seconds: float) -> float:
    return round(seconds * 1e6, 2)


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either side was not measured."""
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 4)
