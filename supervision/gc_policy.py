"""The runtime's cyclic-GC policy: what a process full of live children needs by default.

CPython's collector is tuned for programs whose objects die young. A runtime with thousands of
live children is the opposite: every child is a few dozen long-lived tracked objects, so each
full collection rescans all of them, and with CPython's default thresholds (700, 10, 10) the
collector ends up as a third to a half of all CPU. Two measures, both process-wide (the
collector is), both undone when the last runtime that applied them closes:

- a larger young generation (`gen0` allocations between young collections instead of 700), so
  the short-lived per-step objects are reclaimed by reference counting long before a pass;
- a middle generation collected every `DEFAULT_GEN1` (2) young collections instead of 10: a
  middle pass scans what survived that many young ones, and with a 20,000-object young
  generation ten of them made one pass of ~30 ms CPU in a 10,000-child fan-out, a hub pause
  that a loaded machine stretched past 0.1 s; two keep it under ~10 ms for the same total;
- after every `freeze_every` child starts, `gc.freeze()`: what is alive then (mostly live
  children) moves to the permanent generation, which no collection scans. Frozen objects are
  still freed by reference counting; only cycles among them wait until the policy is released
  (`gc.unfreeze()`), which is why the runtime breaks its own cycles when a child closes.

A host that tuned the collector itself (thresholds other than CPython's defaults, or the
collector disabled) keeps its settings: the policy then only freezes. `Runtime(gc_policy=False)`
opts out entirely. See docs/performance.md and docs/decisions.md.
"""

from __future__ import annotations

import gc
import logging

__all__ = ["DEFAULT_FREEZE_EVERY", "DEFAULT_GEN0", "DEFAULT_GEN1", "GcPolicy"]

log = logging.getLogger(__name__)

DEFAULT_GEN0 = 20_000
DEFAULT_GEN1 = 2
DEFAULT_FREEZE_EVERY = 1_000
_CPYTHON_DEFAULTS = (700, 10, 10)


class _Process:
    """The process-wide state shared by every policy holder (the collector is global)."""

    holders = 0
    saved: tuple[int, int, int] | None = None
    froze = False


class GcPolicy:
    """One runtime's hold on the process's GC policy. `close()` releases it (idempotent)."""

    __slots__ = ("_closed", "_freeze_every", "_starts")

    def __init__(
        self, *, freeze_every: int | None = DEFAULT_FREEZE_EVERY, gen0: int = DEFAULT_GEN0
    ) -> None:
        if freeze_every is not None and (
            not isinstance(freeze_every, int) or isinstance(freeze_every, bool) or freeze_every < 1
        ):
            raise ValueError("freeze_every must be a positive int or None")
        if not isinstance(gen0, int) or isinstance(gen0, bool) or gen0 < 1:
            raise ValueError("gen0 must be a positive int")
        self._freeze_every = freeze_every
        self._starts = 0
        self._closed = False
        if _Process.holders == 0 and gc.isenabled() and gc.get_threshold() == _CPYTHON_DEFAULTS:
            _Process.saved = gc.get_threshold()
            gc.set_threshold(gen0, DEFAULT_GEN1, _CPYTHON_DEFAULTS[2])
        _Process.holders += 1

    def child_started(self) -> None:
        """Count one child start; freeze what is alive after every `freeze_every`."""
        self._starts += 1
        every = self._freeze_every
        if every is not None and self._starts % every == 0:
            gc.freeze()
            _Process.froze = True

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _Process.holders -= 1
        if _Process.holders:
            return
        if _Process.froze:
            _Process.froze = False
            gc.unfreeze()  # what was frozen is collectable again once released
        saved, _Process.saved = _Process.saved, None
        if saved is not None and gc.get_threshold()[0] != saved[0]:
            gc.set_threshold(*saved)
