"""Waiting, without polling, until a root agent and everything it started have settled.

`subagent run` and the demo end when the root is idle and no task (a background child) runs.
Background children can take minutes; the wait must sleep on events, not spin: it wakes when
the root's turn ends (`when_idle`) or a task settles (`TaskService.on_settled`), nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from gevent.event import Event

from subagent.tasks import TaskService

if TYPE_CHECKING:
    from pykka import Future

    from agent.loop import TurnOutcome

__all__ = ["Quiescence", "RootAgent"]


class RootAgent(Protocol):
    """What the wait reads of the root agent."""

    @property
    def status(self) -> str: ...

    def when_idle(self) -> Future[TurnOutcome | None]: ...


class Quiescence:
    """`wait()` returns the root's last turn outcome once it is idle and no task runs, or at
    once when that turn ended in an infrastructure fault (the caller reports it).

    `wakeups` counts the times the wait woke up for a settlement: one per settled task at
    most, however long the tasks run.
    """

    def __init__(
        self,
        root: RootAgent,
        tasks: TaskService,
        *,
        barrier: Callable[[], object] | None = None,
    ) -> None:
        self._root = root
        self._tasks = tasks
        # Called once everything looks settled (e.g. a registry round trip that delivers the
        # lifecycle events told so far); the check is repeated after it.
        self._barrier = barrier
        self.wakeups = 0

    def _settled(self) -> bool:
        return self._root.status == "idle" and all(t.settled for t in self._tasks.list())

    def _stop_tasks(self, reason: str) -> None:
        for task in self._tasks.list():
            if not task.settled:
                self._tasks.kill(task.id, reason)
        if self._barrier is not None:
            self._barrier()  # the kills' lifecycle events reach the listeners first

    def wait(self) -> TurnOutcome | None:
        changed = Event()
        remove = self._tasks.on_settled(lambda _task: changed.set())
        try:
            while True:
                changed.clear()
                outcome = self._root.when_idle().get()
                fault = None if outcome is None else outcome.fault
                if fault is not None:
                    # The root's log failed: it can never take another turn or hear a
                    # settlement, so waiting for what it started would never end. Stop it.
                    self._stop_tasks(f"the root's log could not be written: {fault}")
                    return outcome
                if self._root.status != "idle":
                    continue  # a new turn began (a settlement notice): wait for its end
                if self._settled():
                    if self._barrier is None:
                        return outcome
                    self._barrier()
                    if self._settled():
                        return outcome
                    continue
                # Idle with tasks running: sleep until one settles (its notice may then start
                # a turn, which the next `when_idle` waits for).
                changed.wait()
                self.wakeups += 1
        finally:
            remove()
