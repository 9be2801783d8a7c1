"""Waiting, without polling, until a root agent and everything it started have settled.

`subagent run` and the demo end when the root is idle and no task (a background child) runs.
Background children can take minutes; the wait must sleep on events, not spin: it wakes when
the root's turn ends (`when_idle`) or a task settles (`TaskService.on_settled`), nothing else.

A task settles `killed` the moment it is killed, before its child's run has ended; so before it
returns the wait also waits for every live run's result (`runs`), and then the barrier delivers
their `subagent/end` events: a view rendered after `wait()` shows every child's real end.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from gevent.event import Event

from subagent.tasks import TaskService

if TYPE_CHECKING:
    from pykka import Future

    from agent.loop import TurnOutcome
    from subagent.service import RunHandle

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
        runs: Callable[[], Iterable[RunHandle]] | None = None,
    ) -> None:
        self._root = root
        self._tasks = tasks
        # Called once everything looks settled (e.g. a registry round trip that delivers the
        # lifecycle events told so far); the check is repeated after it.
        self._barrier = barrier
        # The live runs (e.g. `SubagentService.runs`): awaited before returning, see above.
        self._runs = runs
        self.wakeups = 0

    def _settled(self) -> bool:
        return self._root.status == "idle" and all(t.settled for t in self._tasks.list())

    def _stop_tasks(self, reason: str) -> None:
        for task in self._tasks.list():
            if not task.settled:
                self._tasks.kill(task.id, reason)
        self._runs_ended()  # the killed children's ends reach the listeners first

    def _runs_ended(self) -> None:
        """Wait until every live run's result has settled (a killed task's child ends after
        the kill), then pass the barrier, which delivers their lifecycle events."""
        if self._runs is not None:
            while pending := [run for run in self._runs() if not run.result.done]:
                for run in pending:
                    with contextlib.suppress(Exception):  # how it ended is the run's own news
                        run.result.get()
        if self._barrier is not None:
            self._barrier()

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
                    if self._barrier is None and self._runs is None:
                        return outcome
                    self._runs_ended()
                    if self._settled():
                        return outcome
                    continue
                # Idle with tasks running: sleep until one settles (its notice may then start
                # a turn, which the next `when_idle` waits for).
                changed.wait()
                self.wakeups += 1
        finally:
            remove()
