"""`ctx.tasks`: background work an agent started and may later list, wait for, or kill.

Each continuable activation is one task, so a model can poll or stop it by id long after the tool
call that started it returned. A task settles exactly once: the first of completion, failure, kill
or an outside `settle()` wins and every later attempt is ignored (returns False). That rule is
what makes "completion racing kill" safe without locks: on one gevent hub a settlement is a plain
check-and-set with no switch in between.

Two kinds of tasks:
- `start(label, owner, fn)`: `fn(signal)` runs in its own greenlet; returning completes the task,
  raising fails it. `kill()` aborts the signal (cooperative) and kills the greenlet after
  `kill_grace` seconds (forceful), so a task that ignores its signal still ends.
- `adopt(label, owner, kill=...)`: work owned elsewhere (a child run) that the owner settles via
  `settle()`; `kill()` marks it killed and calls `kill(reason)` to stop that work its own way.

A `Task` is an immutable snapshot; call `get()` again for fresh state. Listeners and waiters are
told after the settlement (and, for a kill, after the kill callable returned) on the settling
greenlet, so keep listeners short.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVarTuple

import gevent
import pykka
from gevent import Greenlet, GreenletExit

from actors.gevent_actor import Deferred
from subagent.errors import SubagentError, UnknownTaskError
from supervision.signal import AbortController, AbortSignal

__all__ = [
    "COMPLETED",
    "FAILED",
    "KILLED",
    "RUNNING",
    "SETTLED_STATUSES",
    "TASK_STATUSES",
    "Task",
    "TaskService",
    "UnknownTaskError",
]

log = logging.getLogger(__name__)

Ts = TypeVarTuple("Ts")

RUNNING: Final = "running"
COMPLETED: Final = "completed"
FAILED: Final = "failed"
KILLED: Final = "killed"
SETTLED_STATUSES: Final = frozenset({COMPLETED, FAILED, KILLED})
TASK_STATUSES: Final = frozenset({RUNNING, *SETTLED_STATUSES})

DEFAULT_KILL_GRACE: Final = 2.0
_CLOSE_REASON: Final = "task service closed"

TaskFn = Callable[[AbortSignal], Any]
KillFn = Callable[[str], None]
SettledListener = Callable[["Task"], None]


@dataclass(frozen=True, slots=True)
class Task:
    """A snapshot of one task. `output`/`detail` are set by the settlement that won."""

    id: str
    label: str
    owner: str
    status: str
    output: Any
    detail: str | None
    created_at: float
    ended_at: float | None
    # The agent the task is about (an adopted child run's id), or None: lets a caller that
    # waits on the task follow that agent's progress meanwhile.
    subject: str | None = None

    @property
    def settled(self) -> bool:
        return self.status != RUNNING

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "label": self.label,
            "owner": self.owner,
            "status": self.status,
            "output": self.output,
            "detail": self.detail,
            "created_at": self.created_at,
            "ended_at": self.ended_at,
            "subject": self.subject,
        }


# How many settled tasks stay readable (`get`, `list`, `wait`) before the oldest are forgotten:
# one record per activation would otherwise grow without bound in a long-lived process.
DEFAULT_KEEP_SETTLED = 10_000


class _Record:
    """The service's mutable state of one task."""

    __slots__ = (
        "controller",
        "created_at",
        "detail",
        "done",
        "ended_at",
        "entered",
        "greenlet",
        "id",
        "kill_fn",
        "label",
        "output",
        "owner",
        "status",
        "subject",
    )

    def __init__(
        self, task_id: str, label: str, owner: str, kill_fn: KillFn | None, now: float
    ) -> None:
        self.id = task_id
        self.label = label
        self.owner = owner
        self.kill_fn = kill_fn
        self.created_at = now
        self.ended_at: float | None = None
        self.status = RUNNING
        self.output: Any = None
        self.detail: str | None = None
        self.subject: str | None = None
        # The runtime's settle-once primitive: the first settlement wins (see `_mark`).
        self.done: Deferred[str] = Deferred()
        self.controller: AbortController | None = None
        self.greenlet: Greenlet | None = None
        self.entered = False

    def snapshot(self) -> Task:
        return Task(
            self.id,
            self.label,
            self.owner,
            self.status,
            self.output,
            self.detail,
            self.created_at,
            self.ended_at,
            self.subject,
        )


_SETTLED: Deferred[str] = Deferred()
_SETTLED.resolve("settled")


class TaskService:
    """Background tasks of the agents of one runtime (`ctx.tasks`)."""

    def __init__(
        self,
        *,
        kill_grace: float = DEFAULT_KILL_GRACE,
        clock: Callable[[], float] = time.time,
        keep_settled: int = DEFAULT_KEEP_SETTLED,
    ) -> None:
        if isinstance(kill_grace, bool) or not isinstance(kill_grace, (int, float)):
            raise TypeError(f"kill_grace must be a number, got {type(kill_grace).__name__}")
        if not (0 <= kill_grace < float("inf")):
            raise ValueError(f"kill_grace must be finite and >= 0, got {kill_grace}")
        if not callable(clock):
            raise TypeError("clock must be callable")
        if isinstance(keep_settled, bool) or not isinstance(keep_settled, int):
            raise TypeError("keep_settled must be an int")
        if keep_settled < 0:
            raise ValueError(f"keep_settled must be >= 0, got {keep_settled}")
        self._keep_settled = keep_settled
        self._settled_order: deque[str] = deque()
        self._grace = float(kill_grace)
        self._clock = clock
        self._ids = itertools.count(1)
        self._tasks: dict[str, _Record] = {}
        self._listeners: dict[int, SettledListener] = {}
        self._listener_keys = itertools.count()
        # Every greenlet we spawned that may still run: task bodies and reapers.
        self._greenlets: set[Greenlet] = set()
        self._closed = False

    # -- creating --------------------------------------------------------------------------

    def start(self, label: str, owner: str, fn: TaskFn, *, kill: KillFn | None = None) -> Task:
        """Run `fn(signal)` in a new greenlet as a task; returns at once with it running."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        rec = self._new(label, owner, kill, kill_required=False)
        rec.controller = AbortController()
        greenlet = Greenlet(self._body, rec, fn, rec.controller.signal)
        greenlet.name = f"task-{rec.id}"
        rec.greenlet = greenlet
        self._track(greenlet)
        greenlet.start()
        return rec.snapshot()

    def watch(self, fn: Callable[[*Ts], object], /, *args: *Ts) -> Greenlet:
        """Run `fn(*args)` in a greenlet the service owns: the settler of an `adopt`ed task,
        which waits for the work running elsewhere and then calls `settle`. `close` kills the
        task first, so the settler normally ends on its own; it is killed after the grace."""
        greenlet = Greenlet(fn, *args)
        self._track(greenlet)
        greenlet.start()
        return greenlet

    def adopt(self, label: str, owner: str, *, kill: KillFn, subject: str | None = None) -> Task:
        """Register work running elsewhere; its owner ends it with `settle()`. `subject` names
        the agent doing the work (a child run's id), when there is one."""
        if subject is not None and type(subject) is not str:
            raise TypeError(
                f"subject must be an agent id str or None, got {type(subject).__name__}"
            )
        if subject == "":
            raise ValueError("subject must be a non-empty agent id")
        rec = self._new(label, owner, kill, kill_required=True)
        rec.subject = subject
        return rec.snapshot()

    def _new(self, label: str, owner: str, kill: KillFn | None, *, kill_required: bool) -> _Record:
        if type(label) is not str:
            raise TypeError(f"label must be a str, got {type(label).__name__}")
        if not label.strip():
            raise ValueError("label must be a non-empty string")
        if type(owner) is not str:
            raise TypeError(f"owner must be an agent id str, got {type(owner).__name__}")
        if not owner:
            raise ValueError("owner must be a non-empty agent id")
        if kill is None and kill_required:
            raise TypeError("adopt() needs a kill callable: nothing else can stop the work")
        if kill is not None and not callable(kill):
            raise TypeError(f"kill must be callable, got {type(kill).__name__}")
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED", "the task service is closed")
        task_id = f"task-{next(self._ids)}"
        rec = _Record(task_id, label, owner, kill, self._clock())
        self._tasks[task_id] = rec
        return rec

    def _body(self, rec: _Record, fn: TaskFn, signal: AbortSignal) -> None:
        rec.entered = True
        failure: str | None = None
        try:
            output = fn(signal)
        except GreenletExit:
            # Killed: kill() settled first, or a foreign gevent.kill (then this settles it).
            self._settle(rec, KILLED, None, "the task's greenlet was killed")
            raise
        except Exception as exc:
            failure = f"{type(exc).__name__}: {exc}"
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: record, then let it go
            self._settle(rec, FAILED, None, f"{type(exc).__name__}: {exc}")
            raise
        # Settle outside the handler, so listeners do not run with the task's error as context.
        if failure is not None:
            self._settle(rec, FAILED, None, failure)
        else:
            self._settle(rec, COMPLETED, output, None)

    # -- reading ---------------------------------------------------------------------------

    def get(self, task_id: str) -> Task:
        return self._record(task_id).snapshot()

    def list(self, owner: str | None = None) -> list[Task]:
        """Tasks in creation order, optionally only those of one owner agent."""
        if owner is not None and type(owner) is not str:
            raise TypeError(f"owner must be a str or None, got {type(owner).__name__}")
        return [r.snapshot() for r in self._tasks.values() if owner is None or r.owner == owner]

    def wait(self, task_id: str, timeout: float | None = None) -> Task:
        """Block this greenlet until the task settles; raises TimeoutError if it did not."""
        if timeout is not None:
            if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
                raise TypeError(f"timeout must be a number or None, got {type(timeout).__name__}")
            if timeout < 0 or timeout != timeout:
                raise ValueError(f"timeout must be >= 0, got {timeout}")
        rec = self._record(task_id)
        try:
            rec.done.get(timeout=timeout)
        except pykka.Timeout:
            raise TimeoutError(f"task {task_id} did not settle within {timeout} s") from None
        return rec.snapshot()

    def _record(self, task_id: str) -> _Record:
        if type(task_id) is not str:
            raise TypeError(f"task id must be a str, got {type(task_id).__name__}")
        rec = self._tasks.get(task_id)
        if rec is None:
            raise UnknownTaskError(task_id)
        return rec

    # -- settling --------------------------------------------------------------------------

    def settle(
        self, task_id: str, status: str, output: object = None, detail: str | None = None
    ) -> bool:
        """Settle from outside (an adopted task's owner). False if the task already settled.

        Settling a `start()` task this way also stops its greenlet, whose result no longer counts.
        """
        if status not in SETTLED_STATUSES:
            raise ValueError(f"status must be one of {sorted(SETTLED_STATUSES)}, got {status!r}")
        if detail is not None and type(detail) is not str:
            raise TypeError(f"detail must be a str or None, got {type(detail).__name__}")
        rec = self._record(task_id)
        if not self._mark(rec, status, output, detail):
            return False
        self._stop_greenlet(rec, detail or f"settled as {status}")
        self._notify(rec)
        return True

    def kill(self, task_id: str, reason: str) -> bool:
        """Kill a running task. False if it had already settled (nothing is done then)."""
        if type(reason) is not str:
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        rec = self._record(task_id)
        if not self._mark(rec, KILLED, None, reason):
            return False
        self._stop_greenlet(rec, reason)
        if rec.kill_fn is not None:
            try:
                rec.kill_fn(reason)
            except Exception:
                log.exception("kill callable of task %s raised; the task stays killed", rec.id)
        self._notify(rec)
        return True

    def _settle(self, rec: _Record, status: str, output: object, detail: str | None) -> bool:
        if not self._mark(rec, status, output, detail):
            return False
        self._notify(rec)
        return True

    def _mark(self, rec: _Record, status: str, output: object, detail: str | None) -> bool:
        """The single check-and-set every settlement goes through: no switch can intervene."""
        if not rec.done.resolve(status):
            return False
        rec.status = status
        rec.output = output
        rec.detail = detail
        rec.ended_at = self._clock()
        return True

    def _stop_greenlet(self, rec: _Record, reason: str) -> None:
        """Ask the body to stop (signal), then force it after the grace."""
        if rec.controller is not None:
            rec.controller.abort(reason)
        greenlet = rec.greenlet
        if greenlet is None or greenlet.dead or greenlet is gevent.getcurrent():
            return
        if not rec.entered:
            greenlet.kill(block=False)  # never ran: it never will
            return
        reaper = Greenlet(self._reap, greenlet)
        reaper.name = f"reap-{rec.id}"
        self._track(reaper)
        reaper.start()

    def _reap(self, greenlet: Greenlet) -> None:
        if not greenlet.join(self._grace):
            greenlet.kill(block=True)

    def _notify(self, rec: _Record) -> None:
        # A settled task needs no way to stop what backs it: dropping the kill callable frees
        # that (a whole child run, for a continuable activation) for the collector.
        rec.kill_fn = None
        # Waiters already hold the settled future; later waits need none of their own.
        rec.done = _SETTLED
        self._settled_order.append(rec.id)
        while len(self._settled_order) > self._keep_settled:
            self._tasks.pop(self._settled_order.popleft(), None)
        task = rec.snapshot()
        for fn in list(self._listeners.values()):
            try:
                fn(task)
            except Exception:
                log.exception("task listener %r raised; the other listeners still run", fn)

    def on_settled(self, fn: SettledListener) -> Callable[[], None]:
        """Call `fn(task)` after every settlement. Returns its remover (idempotent)."""
        if not callable(fn):
            raise TypeError(f"listener must be callable, got {type(fn).__name__}")
        key = next(self._listener_keys)
        self._listeners[key] = fn

        def remove() -> None:
            self._listeners.pop(key, None)

        return remove

    # -- lifetime --------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def keep_settled(self) -> int:
        """How many settled tasks stay readable: the bound other records of ended work share
        (the service's ended remote children), so they are forgotten as their tasks are."""
        return self._keep_settled

    def close(self) -> None:
        """Kill every running task; return once none of our greenlets is left. Idempotent."""
        self._closed = True
        for rec in list(self._tasks.values()):
            if rec.status == RUNNING:
                self.kill(rec.id, _CLOSE_REASON)
        me = gevent.getcurrent()
        while True:
            pending = [g for g in self._greenlets if g is not me and not g.dead]
            if not pending:
                return
            gevent.joinall(pending, timeout=self._grace)
            gevent.killall([g for g in pending if not g.dead], block=True)

    def _track(self, greenlet: Greenlet) -> None:
        self._greenlets.add(greenlet)
        greenlet.rawlink(self._greenlets.discard)
