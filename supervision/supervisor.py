"""A supervisor owns children, restarts them by policy, and disposes its subtree to quiescence.

The vocabulary is OTP's. Each child is registered with a `ChildSpec`; when a child ends, its
restart type says whether it should come back, the strategy says which siblings come back with
it, and the restart intensity bounds how often that may happen before the supervisor gives up,
stops everything it owns and exits *crashed*, so that its own parent's policy decides next.

A supervisor is itself a `Child`, so trees nest. Stopping flows down (a parent asks its children,
which ask theirs); release completes up (a supervisor ends only after its children have ended and
its resources are closed). See docs/supervision.md.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import monotonic as _monotonic
from typing import Literal, get_args

import gevent
from gevent import Greenlet
from gevent.event import Event

from supervision.child import Child, Exit, ExitNotices, notify
from supervision.errors import (
    AbortError,
    RestartIntensityExceeded,
    SupervisorClosedError,
    SupervisorError,
)

__all__ = [
    "ChildSpec",
    "RestartIntensityExceeded",
    "RestartType",
    "Strategy",
    "Supervisor",
    "SupervisorClosedError",
    "SupervisorError",
]

log = logging.getLogger(__name__)

Strategy = Literal["one_for_one", "one_for_all", "rest_for_one"]
RestartType = Literal["temporary", "transient", "permanent"]
ExitListener = Callable[[Exit], None]

_STRATEGIES: frozenset[str] = frozenset(get_args(Strategy))
_RESTART_TYPES: frozenset[str] = frozenset(get_args(RestartType))

# After a kill, how long to wait before complaining (and killing again) about a child that
# has still not ended. Dispose keeps waiting: it promises quiescence, not punctuality.
_KILL_NAG_SECONDS = 5.0

_RUNNING, _STOPPING, _STOPPED = "running", "stopping", "stopped"


def _check_seconds(what: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {type(value).__name__}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{what} must be positive and finite, got {value!r}")
    return float(value)


@dataclass(frozen=True, slots=True)
class ChildSpec:
    """How to (re)start one child and how to stop it.

    `start` is called for the first start and for every restart and must return a running
    `Child`. `shutdown` is the grace, in seconds, between asking the child to stop and killing it.
    """

    id: str
    start: Callable[[], Child]
    restart: RestartType = "permanent"
    shutdown: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str):
            raise TypeError(f"child id must be a str, got {type(self.id).__name__}")
        if not self.id:
            raise ValueError("child id must not be empty")
        if not callable(self.start):
            raise TypeError(f"start must be callable, got {type(self.start).__name__}")
        if self.restart not in _RESTART_TYPES:
            raise ValueError(
                f"unknown restart type {self.restart!r}; expected one of {sorted(_RESTART_TYPES)}"
            )
        object.__setattr__(self, "shutdown", _check_seconds("shutdown grace", self.shutdown))


def _never_restarted() -> Child:
    raise RuntimeError("an adopted child is temporary: it is never restarted")


class _Wave:
    """One countdown for a whole group of children being stopped: no greenlet per child."""

    __slots__ = ("event", "remaining")

    def __init__(self, remaining: int) -> None:
        self.remaining = remaining
        self.event = Event()
        if remaining == 0:
            self.event.set()

    def one_done(self) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            self.event.set()


class _Entry:
    """One incarnation of a child. A restart makes a new entry under the same id.

    Registered as its child's exit listener (`__call__`): no bound method or partial is made
    per child to carry the entry to its supervisor."""

    __slots__ = ("child", "exit", "spec", "stopping", "supervisor", "wave")

    def __init__(
        self,
        spec: ChildSpec,
        child: Child | None,
        exit: Exit | None = None,
        supervisor: Supervisor | None = None,
    ) -> None:
        self.supervisor = supervisor
        self.spec = spec
        self.child = child  # None: the (re)start itself failed; `exit` says how
        self.exit = exit
        self.stopping = False  # we asked it to stop: its exit is not a failure to handle
        self.wave: _Wave | None = None

    def __call__(self, exit: Exit) -> None:
        """The child's exit, for its supervisor."""
        supervisor = self.supervisor
        if supervisor is not None:
            supervisor._on_child_exit(self, exit)  # noqa: SLF001 - the supervisor's own entry

    @property
    def alive(self) -> bool:
        return self.child is not None and self.exit is None


def _should_restart(restart: RestartType, exit: Exit) -> bool:
    return restart == "permanent" or (restart == "transient" and exit.abnormal)


class Supervisor:
    """Owns children started from `ChildSpec`s; see the module docstring for the policy.

    Every method returns at once except `start_child` (it runs the start function), `stop_child`
    and `dispose` (they wait for children to end), `wait_handled` and `join`. Exit listeners and
    monitors may run in the hub, so they must not block; spawn a greenlet if they need to.
    `quiet=True` logs crashes and escalation at DEBUG, for an owner that reports them itself.
    """

    def __init__(
        self,
        name: str = "supervisor",
        *,
        strategy: Strategy = "one_for_one",
        max_restarts: int = 3,
        within_seconds: float = 5.0,
        on_exit: ExitListener | None = None,
        quiet: bool = False,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        if not name:
            raise ValueError("name must not be empty")
        if strategy not in _STRATEGIES:
            raise ValueError(
                f"unknown strategy {strategy!r}; expected one of {sorted(_STRATEGIES)}"
            )
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int):
            raise TypeError(f"max_restarts must be an int, got {type(max_restarts).__name__}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if not isinstance(quiet, bool):
            raise TypeError(f"quiet must be a bool, got {type(quiet).__name__}")
        self._name = name
        self.strategy: Strategy = strategy
        self.max_restarts = max_restarts
        self.within_seconds = _check_seconds("within_seconds", within_seconds)
        # An owner that reports crashes and escalation itself, as results (the continuation
        # manager tells the parent agent), asks for them at DEBUG: a contained crash is not a
        # line on an unconfigured host's stderr (docs/decisions.md).
        self._crash_level = logging.DEBUG if quiet else logging.WARNING
        self._escalation_level = logging.DEBUG if quiet else logging.ERROR
        self._children: dict[str, _Entry] = {}  # in start order; a restart keeps the slot
        self._resources: dict[int, tuple[str, Callable[[], object]]] = {}
        self._resource_keys = 0
        self._restarts: deque[float] = deque()
        self._pending: deque[tuple[_Entry, Exit]] = deque()
        self._worker: Greenlet | None = None
        self._state = _RUNNING
        self._brutal = False
        self._shutdown_greenlet: Greenlet | None = None
        self._exit: Exit | None = None
        self._notices = ExitNotices()
        self._done = Event()
        if on_exit is not None:
            self.add_exit_listener(on_exit)

    def __repr__(self) -> str:
        return f"<Supervisor {self._name!r} {self._state} children={len(self._children)}>"

    # -- Child protocol -----------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._name

    def request_stop(self, reason: object = None) -> None:
        """Begin disposing in the background; the exit is *cancelled*."""
        self._begin_shutdown(reason, Exit("cancelled", message=_describe(reason)))

    def kill(self) -> None:
        """Dispose without grace: every child, recursively, is killed at once."""
        self._brutal = True
        if self._state == _RUNNING:
            self._begin_shutdown(None, Exit("cancelled", "ChildKilled", "killed"))
        else:
            for entry in self._children.values():
                if entry.alive:
                    assert entry.child is not None
                    entry.child.kill()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until disposal is complete; returns whether it is."""
        if not self._done.wait(timeout):
            return False
        g = self._shutdown_greenlet
        if g is not None and g is not gevent.getcurrent():
            g.join(timeout)
            return bool(g.dead)
        return True

    def add_exit_listener(self, fn: ExitListener) -> None:
        self._notices.add(fn)

    # -- public API -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """True once disposal has begun: no new children or resources are accepted."""
        return self._state != _RUNNING

    @property
    def exit(self) -> Exit | None:
        """The supervisor's own exit, once disposal is complete."""
        return self._exit

    @property
    def quiescent(self) -> bool:
        """Disposed and nothing left: no child, resource, pending event or greenlet of ours."""
        g = self._shutdown_greenlet
        return (
            self._state == _STOPPED
            and not self._children
            and not self._resources
            and not self._pending
            and self._worker is None
            and (g is None or bool(g.dead))
        )

    @property
    def recent_restarts(self) -> int:
        """How many restarts fall within the current intensity window (`within_seconds`)."""
        window_start = _monotonic() - self.within_seconds
        return sum(1 for t in self._restarts if t >= window_start)

    def wait_handled(self, timeout: float | None = None) -> bool:
        """Wait until every exit delivered so far has been handled: restarted, forgotten or
        escalated. Returns whether it was within `timeout` (False at once if called from the
        restart worker itself). For an owner that acts on the decision, e.g. one that drops its
        own record of a child once the supervisor forgot it."""
        current = gevent.getcurrent()
        deadline = None if timeout is None else _monotonic() + timeout
        while (worker := self._worker) is not None:
            if worker is current:
                return False
            worker.join(None if deadline is None else max(0.0, deadline - _monotonic()))
            if not worker.dead:
                return False
        return True

    def children(self) -> dict[str, Child]:
        """The running children by id, in start order (a snapshot)."""
        return {cid: e.child for cid, e in self._children.items() if e.child is not None}

    def start_child(self, spec: ChildSpec) -> Child:
        """Start and register a child; returns it.

        Raises `SupervisorClosedError` if the supervisor is closed (the start function is not
        called; if it closed while the start function ran, the new child is stopped first), and
        `ValueError` for an id already in use. An exception from the start function propagates
        and nothing is registered.
        """
        if not isinstance(spec, ChildSpec):
            raise TypeError(f"start_child takes a ChildSpec, got {type(spec).__name__}")
        self._check_open()
        if spec.id in self._children:
            raise ValueError(f"{self._name}: child id {spec.id!r} is already in use")
        child = _call_start(spec)
        if self._state != _RUNNING:
            _stop_one(child, spec.shutdown)
            raise SupervisorClosedError(f"{self._name} closed while {spec.id!r} was starting")
        if spec.id in self._children:
            _stop_one(child, spec.shutdown)
            raise ValueError(f"{self._name}: child id {spec.id!r} is already in use")
        self._register(spec, child)
        return child

    def adopt(self, child_id: str, child: Child, *, shutdown: float) -> Child:
        """Register a child its caller already started, as a `temporary` one: never restarted,
        its end only forgotten; stopped (with `shutdown` grace) when this supervisor stops.

        For a caller that starts one child per request (a run per child agent): no start
        function and no `ChildSpec` validated per child. Raises as `start_child` does: the
        caller then still owns `child` and stops it itself."""
        if type(child_id) is not str or not child_id:
            raise ValueError(f"child id must be a non-empty str, got {child_id!r}")
        kind = type(child)
        if kind not in _child_types:
            if not isinstance(child, Child):
                raise TypeError(f"adopted {child_id!r} is a {kind.__name__}, not a Child")
            _child_types.add(kind)
        if self._state != _RUNNING:
            self._check_open()
        children = self._children
        if child_id in children:
            raise ValueError(f"{self._name}: child id {child_id!r} is already in use")
        # One per child: the checks, spec and registration spelled out here (no helper calls)
        # for the common case, a positive finite float grace; anything else is checked fully.
        if type(shutdown) is not float or not 0.0 < shutdown < math.inf:
            shutdown = _check_seconds("shutdown grace", shutdown)
        spec: ChildSpec = object.__new__(ChildSpec)
        setattr_ = object.__setattr__
        setattr_(spec, "id", child_id)
        setattr_(spec, "start", _never_restarted)
        setattr_(spec, "restart", "temporary")
        setattr_(spec, "shutdown", shutdown)
        entry = _Entry(spec, child, None, self)
        children[child_id] = entry
        child.add_exit_listener(entry)
        return child

    def stop_child(self, child_id: str, reason: object = None) -> Exit | None:
        """Stop one child for good (no restart, spec forgotten); returns its exit.

        Waits for the child's grace, then kills it. Returns None if it had no running child
        (its last restart failed).
        """
        entry = self._children.get(child_id)
        if entry is None:
            raise KeyError(child_id)
        del self._children[child_id]
        if entry.child is None:
            return None
        if entry.alive:
            self._stop_wave([entry], reason)
        return entry.exit

    def monitor(self, target: str | Child, fn: ExitListener) -> Callable[[], None]:
        """Deliver exactly one death notice for `target` to `fn(exit)`; returns a cancel function.

        A str names the current incarnation of one of this supervisor's children: a restart
        makes a new incarnation, which a new `monitor` call must watch. Any `Child` (including a
        supervisor) can be watched directly. If it has already ended, `fn` runs at once.
        """
        if not callable(fn):
            raise TypeError(f"monitor callback must be callable, got {type(fn).__name__}")
        done = False

        def once(exit: Exit) -> None:
            nonlocal done
            if not done:
                done = True
                notify(fn, exit)

        def cancel() -> None:
            nonlocal done
            done = True

        if isinstance(target, str):
            entry = self._children.get(target)
            if entry is None:
                raise KeyError(target)
            if entry.child is None:
                assert entry.exit is not None
                once(entry.exit)
                return cancel
            child = entry.child
        elif isinstance(target, Child):
            child = target
        else:
            raise TypeError(f"monitor takes a child id or a Child, got {type(target).__name__}")
        child.add_exit_listener(once)
        return cancel

    def register_resource(
        self, close: Callable[[], object], name: str | None = None
    ) -> Callable[[], None]:
        """Close `close()` at dispose, after every child has ended, newest first.

        Returns a function that unregisters it (without closing). Raises `SupervisorClosedError`
        once the supervisor is closed; the caller then still owns the resource.
        """
        if not callable(close):
            raise TypeError(f"close must be callable, got {type(close).__name__}")
        self._check_open()
        key = self._resource_keys
        self._resource_keys += 1
        self._resources[key] = (name or repr(close), close)

        def unregister() -> None:
            self._resources.pop(key, None)

        return unregister

    def dispose(self, reason: object = None) -> None:
        """Stop every child (recursively), close resources, and return at quiescence.

        Idempotent; concurrent callers all wait for the one disposal. Call from a greenlet,
        not from the hub. Children are asked to stop all at once (in reverse start order), each
        is killed when its grace has passed, and resources close only after all have ended.
        """
        if self._state == _RUNNING:
            self._begin_shutdown(reason, Exit("cancelled", message=_describe(reason)))
        if gevent.getcurrent() is self._shutdown_greenlet:
            return  # a resource or listener disposing its own supervisor: do not wait on itself
        self.join()

    # -- registration and exits ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._state != _RUNNING:
            raise SupervisorClosedError(f"{self._name} is {self._state}")

    def _register(self, spec: ChildSpec, child: Child) -> _Entry:
        entry = _Entry(spec, child, None, self)
        self._children[spec.id] = entry  # a restart keeps the id's place in start order
        child.add_exit_listener(entry)
        return entry

    def _on_child_exit(self, entry: _Entry, exit: Exit) -> None:
        # May run in the hub (greenlet children) or anywhere else: never blocks, never raises.
        entry.exit = exit
        wave = entry.wave
        if wave is not None:
            entry.wave = None
            wave.one_done()
        if entry.stopping or self._state != _RUNNING:
            return
        if self._children.get(entry.spec.id) is not entry:
            return
        if self._worker is None and not _should_restart(entry.spec.restart, exit):
            # Nothing to decide but forgetting it (a temporary child's end, a transient one's
            # normal end), and no earlier exit waiting: done here, without a restart worker.
            del self._children[entry.spec.id]
            return
        self._enqueue(entry, exit)

    def _enqueue(self, entry: _Entry, exit: Exit) -> None:
        self._pending.append((entry, exit))
        if self._worker is None:
            self._worker = gevent.spawn(self._drain)

    def _drain(self) -> None:
        """The restart worker: exists only while exits are waiting to be handled."""
        try:
            while self._pending and self._state == _RUNNING:
                entry, exit = self._pending.popleft()
                try:
                    self._handle_exit(entry, exit)
                except Exception as exc:  # a bug of ours: give up rather than run half-supervised
                    log.exception("%s: failed to handle the exit of %r", self._name, entry.spec.id)
                    self._begin_shutdown(exc, Exit.crashed(exc))
        finally:
            if self._worker is gevent.getcurrent():
                self._worker = None

    def _handle_exit(self, failed: _Entry, exit: Exit) -> None:
        spec = failed.spec
        if self._children.get(spec.id) is not failed:
            return  # stopped or replaced meanwhile
        if not _should_restart(spec.restart, exit):
            del self._children[spec.id]
            return
        if exit.kind == "crashed":
            log.log(
                self._crash_level,
                "%s: child %r crashed: %s: %s",
                self._name,
                spec.id,
                exit.exc_type,
                exit.message,
            )
        if self._intensity_exceeded():
            self._escalate(spec.id, exit)
            return
        if self.strategy == "one_for_one":
            group = [spec.id]  # O(1): large flat supervisors are the common case
        else:
            ids = list(self._children)
            group = ids if self.strategy == "one_for_all" else ids[ids.index(spec.id) :]
        entries = [self._children[cid] for cid in group]
        # Siblings that ended on their own before we got here follow their own restart rule.
        own_exits = {id(e) for e in entries if e.exit is not None}
        self._stop_wave([e for e in reversed(entries) if e.alive], None)
        if self._state != _RUNNING:
            return
        for entry in entries:
            cid = entry.spec.id
            if self._children.get(cid) is not entry:
                continue  # stopped by stop_child while we waited
            if entry is failed:
                restart = True
            elif id(entry) in own_exits:
                assert entry.exit is not None
                restart = _should_restart(entry.spec.restart, entry.exit)
            else:
                restart = entry.spec.restart != "temporary"
            if not restart:
                del self._children[cid]
                continue
            self._restart(entry.spec)
            if self._state != _RUNNING:
                return

    def _restart(self, spec: ChildSpec) -> None:
        try:
            child = _call_start(spec)
        except Exception as exc:
            # A failed restart counts as another failure of that child; the intensity bounds it.
            log.log(self._crash_level, "%s: restarting %r failed: %r", self._name, spec.id, exc)
            exit = Exit.crashed(exc)
            entry = _Entry(spec, None, exit)
            self._children[spec.id] = entry
            self._enqueue(entry, exit)
            return
        if self._state != _RUNNING:
            _stop_one(child, spec.shutdown)
            return
        self._register(spec, child)

    def _intensity_exceeded(self) -> bool:
        now = _monotonic()
        window_start = now - self.within_seconds
        restarts = self._restarts
        while restarts and restarts[0] < window_start:
            restarts.popleft()
        if len(restarts) >= self.max_restarts:
            return True
        restarts.append(now)
        return False

    def _escalate(self, child_id: str, last: Exit) -> None:
        message = (
            f"{self._name}: child {child_id!r} needed more than {self.max_restarts} restart(s) "
            f"within {self.within_seconds:g} s; last exit: {last.kind}"
            + (f" ({last.exc_type}: {last.message})" if last.exc_type else "")
        )
        log.log(self._escalation_level, "%s; stopping all children and escalating", message)
        exc = RestartIntensityExceeded(message)
        self._begin_shutdown(
            exc,
            Exit("crashed", type(exc).__qualname__, message, last.traceback),
        )

    # -- stopping ----------------------------------------------------------------------------------

    def _begin_shutdown(self, reason: object, exit: Exit) -> None:
        if self._state != _RUNNING:
            return
        if reason is None:
            # One reason object for the whole subtree: every signal below reports the same
            # cause, and a wave of 10,000 stops does not make 10,000 exceptions.
            reason = AbortError(exit.message or "stop requested")
        self._state = _STOPPING
        worker = self._worker
        if (
            (worker is None or worker is gevent.getcurrent())
            and not self._resources
            and not any(e.alive for e in self._children.values())
        ):
            # Nothing to stop, kill or close: end here, without a greenlet (an idle supervisor
            # stopped by its owner, or one escalating from its worker after its last child).
            self._pending.clear()
            self._children.clear()
            self._finish(exit)
            return
        self._shutdown_greenlet = gevent.spawn(self._shutdown, reason, exit)

    def _shutdown(self, reason: object, exit: Exit) -> None:
        try:
            worker = self._worker
            if worker is not None:
                worker.kill(block=True)  # it may be mid-restart; we take over from here
                self._worker = None
            self._pending.clear()
            self._stop_wave([e for e in reversed(self._children.values()) if e.alive], reason)
            self._children.clear()
            self._close_resources()
        except BaseException as exc:
            # Our own greenlet was killed or a bug struck: still end, and say so.
            exit = Exit.crashed(exc)
            self._children.clear()
            self._resources.clear()
            raise
        finally:
            self._finish(exit)

    def _finish(self, exit: Exit) -> None:
        self._state = _STOPPED
        self._exit = exit
        # Done before the listeners run: one that disposes or joins this supervisor from the
        # caller's own greenlet (an idle one ends there) must not wait on itself. Joiners
        # elsewhere still wake after them: they run only once this greenlet yields, and the
        # shutdown greenlet's joiners wait for that greenlet too.
        self._done.set()
        self._notices.deliver(exit)

    def _stop_wave(self, entries: Iterable[_Entry], reason: object) -> None:
        """Ask all `entries` to stop at once, kill each when its grace is over, wait for all."""
        by_grace: dict[float, list[_Entry]] = {}
        count = 0
        for entry in entries:
            if not entry.alive:
                continue
            entry.stopping = True
            by_grace.setdefault(entry.spec.shutdown, []).append(entry)
            count += 1
        wave = _Wave(count)
        if count == 0:
            return
        for group in by_grace.values():
            for entry in group:
                entry.wave = wave
        for group in by_grace.values():
            for entry in group:
                if entry.alive:  # an exit listener may already have run
                    assert entry.child is not None
                    if self._brutal:
                        entry.child.kill()
                    else:
                        entry.child.request_stop(reason)
        started = _monotonic()
        for grace in sorted(by_grace):
            if wave.remaining == 0:
                break
            if not self._brutal:
                wave.event.wait(max(0.0, started + grace - _monotonic()))
            _kill_alive(by_grace[grace])
        while not wave.event.wait(_KILL_NAG_SECONDS):
            stuck = [e.spec.id for g in by_grace.values() for e in g if e.alive]
            log.warning("%s: still waiting for killed children %s", self._name, stuck[:10])
            for group in by_grace.values():
                _kill_alive(group)

    def _close_resources(self) -> None:
        while self._resources:
            key = next(reversed(self._resources))
            name, close = self._resources.pop(key)
            try:
                close()
            except Exception:
                log.exception("%s: closing resource %s failed", self._name, name)


def _kill_alive(entries: list[_Entry]) -> None:
    for entry in entries:
        if entry.alive:
            assert entry.child is not None
            entry.child.kill()


# Types already seen to satisfy `Child`: a runtime-checkable Protocol `isinstance` costs tens of
# microseconds, too much for a start path that runs once per child run.
_child_types: set[type] = set()


def _call_start(spec: ChildSpec) -> Child:
    child = spec.start()
    kind = type(child)
    if kind in _child_types:
        return child
    if isinstance(child, Child):
        _child_types.add(kind)
    else:
        raise TypeError(
            f"start function of {spec.id!r} returned {type(child).__name__}, not a Child"
        )
    return child


def _stop_one(child: Child, grace: float) -> None:
    child.request_stop(SupervisorClosedError("supervisor closed"))
    if not child.join(grace):
        child.kill()
        child.join()


def _describe(reason: object) -> str:
    if reason is None:
        return "stop requested"
    return str(reason) if isinstance(reason, BaseException) else repr(reason)
