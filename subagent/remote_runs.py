"""The service's table of runs with no local agent (ACP, Ray): live and ended, by id and parent.

A remote child has no agent here to ask, and a one-shot ACP child has no log here either: this
table is how the listings and `interrupt` know it. A run is entered live when it is started (its
parent is told its id once `start` returns), moves to ended when its result settles (in the
result's done callback, so no listing falls between), and an ended one is forgotten under a
bound, the oldest end first, as settled tasks are (`TaskService.keep_settled`).

Every look-up costs what its answer holds: a parent's runs are one dict of that parent's, an id
is one dict look-up. A coordinator that ended 10,000 one-shot remote children pays nothing for
them when it lists or interrupts another parent's children.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from subagent.listings import RemoteRun

__all__ = ["RemoteRunTable", "TableRun"]


class TableRun(Protocol):
    """What the table reads of a live run (`subagent.service.RunHandle`)."""

    @property
    def id(self) -> str: ...

    @property
    def parent_id(self) -> str: ...

    @property
    def started_at(self) -> float: ...  # `time.monotonic()` at its start

    @property
    def settled(self) -> bool: ...


R = TypeVar("R", bound=TableRun)


class RemoteRunTable(Generic[R]):
    """Live remote runs and the ended ones still remembered, indexed by run id and by parent.

    One entry per child id in each part: a continuable child's new activation is its live
    entry while an older activation's ended entry stays, and its end replaces that entry (as
    the newest). The hub's thread only: no method yields."""

    __slots__ = ("_ended", "_ended_by_parent", "_live", "_live_by_parent")

    def __init__(self) -> None:
        self._live: dict[str, R] = {}
        self._live_by_parent: dict[str, dict[str, R]] = {}
        # Oldest end first (insertion order): the eviction order.
        self._ended: dict[str, RemoteRun] = {}
        self._ended_by_parent: dict[str, dict[str, RemoteRun]] = {}

    def started(self, run: R) -> None:
        """Enter a run that is live from now on."""
        self._live[run.id] = run
        self._live_by_parent.setdefault(run.parent_id, {})[run.id] = run

    def ended(self, run: R, keep: int) -> None:
        """`run` settled: remember it as ended (the newest end), then forget the oldest ends
        beyond `keep`. A run that is not the live entry of its id (a stale activation) is
        remembered all the same: it ended, and it is the newest end of that id."""
        if self._live.get(run.id) is run:
            _drop(self._live, self._live_by_parent, run.id, run.parent_id)
        self._forget_ended(run.id)
        started = time.time() - (time.monotonic() - run.started_at)
        record = RemoteRun(run.id, run.parent_id, started, ended=True)
        self._ended[run.id] = record
        self._ended_by_parent.setdefault(run.parent_id, {})[run.id] = record
        ended = self._ended
        while len(ended) > keep:
            self._forget_ended(next(iter(ended)))

    def withdraw(self, run: R) -> None:
        """Forget a live run that was never published (its start was undone)."""
        if self._live.get(run.id) is run:
            _drop(self._live, self._live_by_parent, run.id, run.parent_id)

    def live(self, run_id: str) -> R | None:
        """The live run of `run_id`, if any."""
        return self._live.get(run_id)

    def ended_under(self, run_id: str) -> str | None:
        """The parent of `run_id` when it is remembered as ended (and not live again)."""
        if run_id in self._live:
            return None
        record = self._ended.get(run_id)
        return None if record is None else record.parent_id

    def has_runs(self, parent_id: str) -> bool:
        """Whether `parent_id` has a remote run, live or remembered as ended."""
        return parent_id in self._live_by_parent or parent_id in self._ended_by_parent

    def children_of(self, parent_id: str) -> list[RemoteRun]:
        """`parent_id`'s remote runs, live or remembered as ended (a live one is the latest)."""
        live = self._live_by_parent.get(parent_id)
        ended = self._ended_by_parent.get(parent_id)
        if live is None:
            return [] if ended is None else list(ended.values())
        found: list[RemoteRun] = []
        if ended is not None:
            found.extend(r for r in ended.values() if r.id not in live)
        wall, now = time.time(), time.monotonic()
        for run in live.values():
            started = wall - (now - run.started_at)
            found.append(RemoteRun(run.id, parent_id, started, ended=run.settled))
        return found

    def ended_ids(self) -> Iterator[str]:
        """The remembered ends' ids, oldest first (for tests and diagnostics)."""
        return iter(list(self._ended))

    def clear(self) -> None:
        self._live.clear()
        self._live_by_parent.clear()
        self._ended.clear()
        self._ended_by_parent.clear()

    def _forget_ended(self, run_id: str) -> None:
        record = self._ended.get(run_id)
        if record is not None:
            _drop(self._ended, self._ended_by_parent, run_id, record.parent_id)


T = TypeVar("T")


def _drop(by_id: dict[str, T], by_parent: dict[str, dict[str, T]], key: str, parent: str) -> None:
    """Remove `key` from both indexes; a parent left with no entry is removed too."""
    del by_id[key]
    siblings = by_parent.get(parent)
    if siblings is not None:
        siblings.pop(key, None)
        if not siblings:
            del by_parent[parent]
