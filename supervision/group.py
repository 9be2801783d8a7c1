"""An owned group of plain greenlets, like a trio nursery: spawn into it; `close` kills and joins.

Every greenlet the library starts belongs to an owner that joins or kills it. A `Supervisor`
owns long-lived, restartable children; a `TaskGroup` owns the short helpers an object starts
for itself (a relay, a watcher, a reader loop) and ends them all when the object closes.

A spawn costs what `gevent.spawn` costs plus one set insertion and one rawlink: the group
forgets each greenlet as it dies, so it holds only the running ones. `close` never kills the
greenlet that calls it (an owner may close from one of its own helpers), and a group that was
closed refuses new spawns with `SupervisorClosedError`, so nothing can start behind its back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ParamSpec, TypeVar

import gevent
from gevent import Greenlet

from supervision.supervisor import SupervisorClosedError

__all__ = ["TaskGroup"]

P = ParamSpec("P")
T = TypeVar("T")


class TaskGroup:
    """Greenlets owned by one object; `close()` kills and joins every one still running."""

    __slots__ = ("_closed", "_running", "name")

    def __init__(self, name: str) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self.name = name
        self._running: set[Greenlet] = set()
        self._closed = False

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<TaskGroup {self.name!r} {state} running={len(self._running)}>"

    def __len__(self) -> int:
        """How many of the group's greenlets are still running."""
        return len(self._running)

    @property
    def closed(self) -> bool:
        return self._closed

    def spawn(self, fn: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs) -> Greenlet:
        """Start `fn(*args, **kwargs)` in a greenlet the group owns; returns that greenlet."""
        g = self._adopt(Greenlet(fn, *args, **kwargs))
        g.start()
        return g

    def spawn_later(
        self, seconds: float, fn: Callable[P, object], /, *args: P.args, **kwargs: P.kwargs
    ) -> Greenlet:
        """Start `fn` after `seconds`; `close` before then cancels it without it ever running."""
        g = self._adopt(Greenlet(fn, *args, **kwargs))
        g.start_later(seconds)
        return g

    def close(self, timeout: float | None = None, *, spare: Greenlet | None = None) -> bool:
        """Refuse new spawns, kill every running greenlet but the caller's, and join them.

        `spare` is one more greenlet left running: the one on whose behalf the owner closes (a
        disposer that is itself waiting for the owner to stop); it still ends on its own.
        Returns whether the others all ended within `timeout` (None waits as long as it takes).
        """
        self._closed = True
        current = gevent.getcurrent()
        victims = [g for g in self._running if g is not current and g is not spare]
        if not victims:
            return True
        gevent.killall(victims, block=False)
        done = gevent.joinall(victims, timeout=timeout)
        return len(done) == len(victims)

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every greenlet but the caller's has ended, without killing any."""
        current = gevent.getcurrent()
        waiting = [g for g in self._running if g is not current]
        done = gevent.joinall(waiting, timeout=timeout)
        return len(done) == len(waiting)

    def _adopt(self, g: Greenlet) -> Greenlet:
        if self._closed:
            raise SupervisorClosedError(f"task group {self.name!r} is closed")
        self._running.add(g)
        g.rawlink(self._running.discard)
        return g
