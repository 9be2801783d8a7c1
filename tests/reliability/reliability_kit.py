"""Helpers shared by the reliability tests: sizes and process-wide leak probes."""

from __future__ import annotations

import gc
import os
from typing import Any

import gevent
from greenlet import greenlet as raw_greenlet  # type: ignore[import-untyped]

# Set by conftest.py from `--chaos-full`; the environment variable works everywhere.
FULL_OPTION: list[bool] = [False]


def full_run() -> bool:
    """Whether the large (documented) sizes were asked for."""
    return FULL_OPTION[0] or os.environ.get("SUBAGENT_CHAOS_FULL", "") not in ("", "0")


def size(ci: int, full: int) -> int:
    return full if full_run() else ci


# -- leak probes ---------------------------------------------------------------------------------


# gevent's own: thread-pool workers (the pool grows when a store reads a big file off the hub)
# and hubs; they are the runtime's environment, not greenlets the runtime started.
_NOT_OURS = frozenset({"_WorkerGreenlet", "Hub"})


def _live_greenlet_ids() -> set[int]:
    gc.collect()
    return {
        id(g)
        for g in gc.get_objects()
        if isinstance(g, raw_greenlet)
        and not g.dead
        and g.parent is not None
        and type(g).__name__ not in _NOT_OURS
    }


def live_greenlets() -> set[int]:
    """Ids of every live greenlet but the main one, found through the garbage collector.

    The heap walk runs in the hub's thread pool: it holds the GIL for a while, but the hub is
    idle meanwhile, so the blocking monitor does not blame the test for it.
    """
    result: set[int] = gevent.get_hub().threadpool.apply(_live_greenlet_ids)
    return result


def describe_greenlets(ids: set[int]) -> list[str]:
    out: list[str] = []
    for g in gc.get_objects():
        if isinstance(g, raw_greenlet) and id(g) in ids:
            run: Any = getattr(g, "_run", None) or getattr(g, "run", None)
            out.append(f"{type(g).__name__} run={getattr(run, '__qualname__', run)!r}")
    return out
