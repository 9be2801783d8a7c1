"""Continuable children: a durable child session driven by a series of activations.

Each activation is one run (one turn) and one background task. `send_message` either steers the
live activation or cold-resumes the stored child through its provider's `resume`. Decisions for
one child are serialized by a per-child lock, so a message that races a settling activation
waits for the settlement and then starts a fresh activation: an accepted message is never
dropped silently (it is in the child's log, or the sender got an exception).

When an activation settles, its parent gets one settlement notice (a user message with source
`subagent-settled`: a one-line summary, then the child's closing message) before the parent's
ownership of the child run is released.

Restarts are supervision's, not a policy of this module: each continuable child has its own
`Supervisor` (intensity `max_restarts` in `within` seconds), and each activation is a
`transient` child of it (`ChildSpec`). An activation that crashed (its result is an
infrastructure fault, e.g. a failed durability checkpoint) is restarted by the supervisor, and
the restart is a cold resume from the child's log; one that ended normally (whatever its stop
reason: a child-level failure is reported, never restarted) or was cancelled is not. Past the
intensity the supervisor escalates: it exits crashed, the child stays stored and the parent is
told with a `subagent-report` message. The per-child supervisors are `temporary` children of
the manager's own supervisor, which `close()` disposes.

This module is the lifecycle only (start, message, restart, settlement); the rows of
`list_children` / `list_descendants` are built by `subagent.listings`, which needs no runtime.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

from gevent.event import Event
from gevent.lock import Semaphore

from actors.agent_handle import Agent
from actors.agents import new_session_id
from actors.gevent_actor import GeventFuture
from agent.context import AgentContext
from agent.events import SessionHeader, SessionLogError, validate_session_id
from agent.store import SessionExistsError, SessionNotFoundError
from subagent import settlement
from subagent.descriptor import (
    DescriptorError,
    SubagentDescriptor,
    Unclassifiable,
    authoritative_descriptor,
)
from subagent.errors import SubagentError
from subagent.listings import Activation
from subagent.live import live_agent, task_service
from subagent.tasks import TaskService
from subagent.types import (
    ABORTED,
    MessageSource,
    Resumable,
    Steerable,
    SubagentContinuation,
    SubagentProvider,
    SubagentResult,
    SubagentResumeRequest,
    SubagentStartRequest,
)
from supervision.child import Exit, ExitNotices
from supervision.errors import SupervisorClosedError
from supervision.group import TaskGroup
from supervision.signal import AbortController, AbortSignal
from supervision.supervisor import ChildSpec, Supervisor

__all__ = ["ActivationRun", "ContinuableStart", "ContinuationManager", "RunStarter", "SendResult"]

log = logging.getLogger(__name__)

# How long a stopped activation has to settle (its run cancelled, the parent told) before it is
# disposed outright; the same grace the service gives a child run.
ACTIVATION_SHUTDOWN_GRACE = 60.0


class ActivationRun(Protocol):
    """What the manager holds of one activation: the service's `RunHandle` (named here as a
    Protocol because the service module imports this one)."""

    @property
    def id(self) -> str: ...

    @property
    def parent_id(self) -> str: ...

    @property
    def message_id(self) -> str: ...

    @property
    def settled(self) -> bool: ...

    @property
    def result(self) -> GeventFuture[SubagentResult]: ...

    def cancel(self, cause: object = None) -> None: ...

    def dispose(self) -> None: ...


class RunStarter(Protocol):
    """What the manager asks of the `SubagentService` that owns it."""

    def get(self, name: str) -> SubagentProvider | None: ...

    def start(self, name: str, request: SubagentStartRequest) -> ActivationRun: ...

    def resume(self, request: SubagentResumeRequest, name: str | None = None) -> ActivationRun: ...


@dataclass(frozen=True, slots=True)
class ContinuableStart:
    child_id: str
    message_id: str
    task_id: str


@dataclass(frozen=True, slots=True)
class SendResult:
    """`kind` is `steered` (the live activation admitted it) or `started` (a fresh one began)."""

    kind: str
    message_id: str
    task_id: str | None = None


class _Activation:
    """One activation as the `Child` its supervisor owns.

    It ends when its settlement is done (the parent told, the task settled, the run disposed),
    not when the run's result settles: that is what a restart, `close()` and a stop wave must
    wait for. An activation made by a restart exists before its run does (the cold resume runs
    in its own greenlet); a stop asked for meanwhile reaches the run as soon as it is bound.
    """

    __slots__ = ("_ended", "_group", "_notices", "_stop", "handle", "name")

    def __init__(self, name: str, group: TaskGroup) -> None:
        self.name = name
        self.handle: ActivationRun | None = None
        self._group = group  # where a kill's blocking dispose runs
        self._notices = ExitNotices()
        self._stop: tuple[object] | None = None  # (reason,) once a stop was asked for
        self._ended: Event | None = None

    def __repr__(self) -> str:
        return f"<_Activation {self.name!r} ended={self.exit is not None}>"

    @property
    def exit(self) -> Exit | None:
        return self._notices.exit

    def bind(self, handle: ActivationRun) -> None:
        self.handle = handle
        if self._stop is not None:
            handle.cancel(self._stop[0])

    def request_stop(self, reason: object = None) -> None:
        """Cancel the run; the activation ends once the cancelled run has settled."""
        if self.exit is not None:
            return
        self._stop = (reason,)
        if self.handle is not None:
            self.handle.cancel(reason)

    def kill(self) -> None:
        """Dispose the run outright (in a greenlet of the manager: a dispose waits)."""
        if self.exit is not None:
            return
        if self._stop is None:
            self._stop = (None,)
        if self.handle is not None:
            with contextlib.suppress(SupervisorClosedError):  # the manager already closed
                self._group.spawn(self.handle.dispose)

    def join(self, timeout: float | None = None) -> bool:
        if self.exit is not None:
            return True
        if self._ended is None:
            self._ended = Event()
        return bool(self._ended.wait(timeout))

    def add_exit_listener(self, fn: Callable[[Exit], None]) -> None:
        self._notices.add(fn)

    def end(self, exit: Exit) -> None:
        """Called once its settlement is done: its supervisor decides what comes next."""
        if self._notices.deliver(exit) and self._ended is not None:
            self._ended.set()


@dataclass(eq=False)
class _Child:
    child_id: str
    label: str = ""
    users: int = 0  # callers between `_use` and `_release`: the record must stay
    # Messages in `send_message` (each waits for the one before it to be admitted): bounded by
    # the inbox's steer bound, as the steers they become are.
    senders: int = 0
    lock: Semaphore = field(default_factory=Semaphore)
    handle: ActivationRun | None = None
    task_id: str | None = None
    parent_id: str | None = None  # the owner of its last activation: who a restart reports to
    # Set: nothing runs and nothing is pending. Clear while an activation runs, and after a
    # crash until its supervisor has restarted it or given up.
    settled: Event = field(default_factory=Event)
    changed: Event | None = None  # made by a waiting sender; set at the next state change
    supervisor: Supervisor | None = None  # restarts its crashed activations
    activations: int = 0  # numbers the activations' child specs
    begin: Callable[[], _Activation] | None = None  # the caller's start, for `_start_activation`
    failure: BaseException | None = None  # the last crash, for the restart's message
    restart_error: Exception | None = None  # why the last restart could not start

    def __post_init__(self) -> None:
        self.settled.set()


class ContinuationManager:
    """Owns descriptor lookup and task association for continuable children."""

    def __init__(
        self,
        service: RunStarter,
        ctx: AgentContext,
        *,
        max_restarts: int = 3,
        within: float = 60.0,
    ) -> None:
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int):
            raise TypeError(f"max_restarts must be an int, got {type(max_restarts).__name__}")
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        if isinstance(within, bool) or not isinstance(within, (int, float)):
            raise TypeError(f"within must be a number of seconds, got {type(within).__name__}")
        if not (within > 0 and math.isfinite(within)):
            raise ValueError(f"within must be positive and finite, got {within!r}")
        self._service = service
        self._ctx = ctx
        self._children: dict[str, _Child] = {}
        # The restart intensity each child's supervisor gets (read when it is made).
        self.max_restarts = max_restarts
        self.within = float(within)
        self._closed = False
        self._settlers = TaskGroup("continuation-settlers")
        # Owns one supervisor per continuable child with an activation (or restart history).
        self._supervisor = Supervisor("continuable children")
        self._supervisor_ids = itertools.count(1)

    # -- starting ----------------------------------------------------------------------------

    def start_continuable(
        self,
        name: str,
        request: SubagentStartRequest,
        *,
        label: str,
        child_id: str | None = None,
    ) -> ContinuableStart:
        if not isinstance(label, str):
            raise TypeError(f"label must be a str, got {type(label).__name__}")
        if not label.strip():
            raise ValueError("label must be a non-empty string")
        provider = self._service.get(name)
        if provider is None:
            raise SubagentError("NO_PROVIDER", f"no provider named {name!r}")
        if not isinstance(provider, Resumable):
            raise SubagentError(
                "UNSUPPORTED_CAPABILITY", f"provider {name!r} cannot resume children"
            )
        self._require_continuation()
        parent = request.parent
        if child_id is None:
            child_id = new_session_id()
        else:
            validate_session_id(child_id)
        options = request.agent_options
        model = options.model if options is not None else parent.options.model
        descriptor = SubagentDescriptor(
            provider=name,
            label=label,
            model=model,
            persona=request.persona,
            tool_filter=request.tool_filter,
            token_budget=request.token_budget,
            cost_budget=None if request.cost_budget is None else float(request.cost_budget),
        )
        # The caller's signal guards only the start: once accepted, the activation is its own.
        activation = AbortController()
        remove = request.signal.add_listener(activation.abort)
        started = replace(
            request,
            signal=activation.signal,
            continuation=SubagentContinuation(session_id=child_id, descriptor=descriptor),
        )
        child = self._use(child_id)
        try:
            with child.lock:
                # Checked under the child's lock: two starts with one id cannot both pass.
                if child.handle is not None or self._exists(child_id):
                    raise SubagentError("DUPLICATE_CHILD", f"child {child_id!r} is live or stored")

                def begin() -> _Activation:
                    try:
                        handle = self._service.start(name, started)
                    except SessionExistsError:  # created by another process meanwhile
                        raise SubagentError(
                            "DUPLICATE_CHILD", f"child {child_id!r} is already stored"
                        ) from None
                    child.label = label
                    return self._adopt(child, handle, label, parent.id)

                handle = self._launch(child, begin)
                task_id = child.task_id
        finally:
            remove()
            self._release(child)
        return ContinuableStart(child_id, _message_id(handle), str(task_id))

    def _exists(self, child_id: str) -> bool:
        return child_id in self._ctx.agents or bool(self._ctx.store.exists(child_id))

    # -- messages ----------------------------------------------------------------------------

    def send_message(
        self,
        parent: Agent,
        child_id: str,
        content: Sequence[Mapping[str, Any]],
        source: MessageSource,
        signal: AbortSignal | None = None,
    ) -> SendResult:
        if not isinstance(source, MessageSource):
            raise TypeError("source must be a MessageSource")
        validate_session_id(child_id)
        content = list(content)
        signal = signal or AbortSignal.never()
        self._require_continuation()
        # Authorized before it is counted too: messages another agent may not send never take
        # the room of the parent's own.
        self._authorize_direct_parent(parent, child_id)
        child = self._use(child_id)
        try:
            if child.senders >= self._ctx.inbox.steers:
                raise SubagentError(
                    "INBOX_FULL",
                    f"child {child_id} already has {child.senders} messages waiting to be "
                    "delivered; send more once it has taken them",
                )
            child.senders += 1
            try:
                return self._send(parent, child, content, source, signal)
            finally:
                child.senders -= 1
        finally:
            self._release(child)

    def _send(
        self,
        parent: Agent,
        child: _Child,
        content: list[Mapping[str, Any]],
        source: MessageSource,
        signal: AbortSignal,
    ) -> SendResult:
        child_id = child.child_id
        while True:
            child.lock.acquire()
            try:
                self._authorize_direct_parent(parent, child_id)
                if signal.aborted:
                    raise SubagentError("ABORTED", f"the message was aborted: {signal.reason}")
                handle = child.handle
                if handle is not None and not handle.settled and isinstance(handle, Steerable):
                    try:
                        admitted = handle.steer(content, source).get()
                        # The admitted message's id, once the agent's steer reply carries it.
                        message_id = admitted if isinstance(admitted, str) else ""
                        return SendResult("steered", message_id, child.task_id)
                    except SubagentError as exc:
                        if exc.code not in ("RUN_TERMINAL", "RUN_DISPOSED"):
                            raise
                    # Lost the race with settlement: wait for it, then resume cold.
                elif child.settled.is_set():
                    return self._resume(parent, child, content, source, signal)
                # Settling, restarting after a crash, or live but not steerable: wait for the
                # next change (an activation bound, or the child settled), then decide again.
                if child.changed is None:
                    child.changed = Event()
                waiting = child.changed
            finally:
                child.lock.release()
            waiting.wait()

    def resume_request(
        self,
        parent: Agent,
        child_id: str,
        content: Sequence[Mapping[str, Any]],
        source: MessageSource,
        signal: AbortSignal,
    ) -> tuple[str, SubagentResumeRequest]:
        """Load and authorize a stored child and resolve its resume request."""
        if self._header(child_id).parent_session != getattr(parent, "id", None):
            raise SubagentError("UNAUTHORIZED", "only the child's recorded parent may resume it")
        _header, descriptor = self._stored_descriptor(child_id)
        request = SubagentResumeRequest(
            session_id=child_id,
            prompt=list(content),
            source=source,
            parent=parent,
            signal=signal,
            descriptor=descriptor,
        )
        return descriptor.provider, request

    def _resume(
        self,
        parent: Agent,
        child: _Child,
        content: list[Mapping[str, Any]],
        source: MessageSource,
        signal: AbortSignal,
    ) -> SendResult:
        activation = AbortController()
        remove = signal.add_listener(activation.abort)
        try:
            provider, request = self.resume_request(
                parent, child.child_id, content, source, activation.signal
            )

            def begin() -> _Activation:
                try:
                    handle = self._service.resume(request, provider)
                except SessionLogError as exc:  # the log is damaged past the descriptor
                    raise SubagentError(
                        "NOT_RESUMABLE",
                        f"the log of child {child.child_id!r} cannot be read: {exc}",
                    ) from exc
                child.label = request.descriptor.label
                return self._adopt(child, handle, child.label, parent.id)

            handle = self._launch(child, begin)
        finally:
            remove()
        return SendResult("started", _message_id(handle), child.task_id)

    # -- interrupt ---------------------------------------------------------------------------

    def interrupt(
        self,
        child_id: str,
        *,
        by: Agent,
        remote: ActivationRun | None = None,
        ended_under: str | None = None,
    ) -> bool:
        """Cancel the child's current turn, keeping its inbox. Only an ancestor may.

        `remote` is the child's live run when it has no agent in this process (a one-shot ACP
        or Ray child, a continuable ACP child's activation: the service's `RemoteRunTable`).
        Such a run is one turn, so interrupting the turn cancels the run: it settles `aborted`
        through the provider's cancellation, and True means it did. Its parent is a local agent (it
        may have no header here at all): the ancestor walk starts from there.

        `ended_under` is the parent of such a run that ended (the service still knows it, as
        long as a settled task stays readable): not running, so False for an ancestor of it,
        as for any child that is not running; not an unknown child.
        """
        validate_session_id(child_id)
        if remote is not None:
            return self._interrupt_run(remote, by)
        if ended_under is not None:
            self._authorize_run(by, ended_under)
            return False
        self._authorize_ancestor(by, child_id)
        agent = live_agent(self._ctx, child_id)
        if agent is None or agent.status != "running":
            return False
        agent.cancel(f"interrupted by {by.id}", keep_inbox=True).get()
        return True

    def _interrupt_run(self, run: ActivationRun, by: Agent) -> bool:
        """Cancel a remote run for an ancestor of it; wait until its result settled."""
        self._authorize_run(by, run.parent_id)
        if run.settled:
            return False
        run.cancel(f"interrupted by {by.id}")
        # The provider settles it `aborted` (or it had completed just before: not interrupted).
        outcome = settlement.outcome_of(run.result)
        return not isinstance(outcome, BaseException) and outcome.stop_reason == ABORTED

    def _authorize_run(self, by: Agent, parent_id: str) -> None:
        """`by` is the parent of a run with no agent here, or an ancestor of that parent."""
        if self._live(by) is not by:
            raise SubagentError("UNAUTHORIZED", "the sender is not a live agent")
        if parent_id != by.id:
            try:
                self._authorize_ancestor(by, parent_id)  # `by` above the run's parent
            except SubagentError as exc:
                if exc.code != "UNKNOWN_CHILD":
                    raise
                # A parent known nowhere (closed meanwhile) has no ancestor `by` can be.
                raise SubagentError(
                    "UNAUTHORIZED", "only an ancestor may interrupt a child"
                ) from None

    # -- the listings' view -------------------------------------------------------------------

    def activation(self, child_id: str) -> Activation | None:
        """What `subagent.listings` needs of a tracked child: its label, whether it runs."""
        record = self._children.get(child_id)
        if record is None:
            return None
        handle = record.handle
        return Activation(record.label, handle is not None and not handle.settled)

    # -- internals -----------------------------------------------------------------------------

    def _require_continuation(self) -> None:
        if not getattr(self._ctx.store, "persistent", False):
            raise SubagentError("PERSISTENCE_UNAVAILABLE")
        tasks = self._tasks()
        if self._closed or tasks.closed:
            raise SubagentError("RUNTIME_CLOSED", "the runtime is closing")

    def _tasks(self) -> TaskService:
        """The runtime's task service, which continuation needs (a runtime always sets one)."""
        tasks = task_service(self._ctx)
        if tasks is None:
            raise SubagentError("CONTINUATION_UNAVAILABLE")
        return tasks

    def _use(self, child_id: str) -> _Child:
        """The child's record, held until `_release`: one record (one lock) per child id."""
        child = self._children.get(child_id)
        if child is None:
            child = self._children[child_id] = _Child(child_id)
        child.users += 1
        return child

    def _release(self, child: _Child) -> None:
        """Drop the record of a child nobody holds and nothing runs for (e.g. an unknown id)."""
        child.users -= 1
        self._forget_if_idle(child)

    def _forget_if_idle(self, child: _Child) -> None:
        """Forget an idle record and end its supervisor, once that holds no activation and no
        restart that still counts toward the intensity (a child crashing again soon must meet
        it)."""
        supervisor = child.supervisor
        if (
            child.users == 0
            and child.handle is None
            and child.settled.is_set()
            and (
                supervisor is None
                or (not supervisor.children() and supervisor.recent_restarts == 0)
            )
            and self._children.get(child.child_id) is child
        ):
            del self._children[child.child_id]
            if supervisor is not None:
                child.supervisor = None
                supervisor.request_stop("idle")  # it has no live child; it ends at once

    def _header(self, child_id: str) -> SessionHeader:
        """The live agent's header, else the stored one (read alone: the body may be corrupt)."""
        validate_session_id(child_id)  # never a path outside the store
        agent = live_agent(self._ctx, child_id)
        if agent is not None:
            header: SessionHeader = agent.header
            return header
        store = self._ctx.store
        try:
            return store.header(child_id)
        except (SessionNotFoundError, KeyError):
            raise SubagentError("UNKNOWN_CHILD", f"no live or stored child {child_id!r}") from None
        except (SessionLogError, OSError) as exc:
            raise SubagentError(
                "NOT_RESUMABLE", f"the header of child {child_id!r} cannot be read: {exc}"
            ) from exc

    def _live(self, agent: object) -> Agent | None:
        """The live agent of `agent`'s id (None for an unknown id, or a caller that passed
        something other than an agent: authorization then refuses it)."""
        agent_id = getattr(agent, "id", None)
        return live_agent(self._ctx, agent_id) if isinstance(agent_id, str) else None

    def _authorize_direct_parent(self, parent: Agent, child_id: str) -> None:
        header = self._header(child_id)
        live = self._live(parent)
        if live is not parent or header.parent_session != parent.id:
            raise SubagentError(
                "UNAUTHORIZED", "only the exact live agent recorded as the child's parent may"
            )

    def _authorize_ancestor(self, by: Agent, child_id: str) -> None:
        live = self._live(by)
        if live is not by:
            raise SubagentError("UNAUTHORIZED", "the sender is not a live agent")
        header = self._header(child_id)
        seen = set()
        parent_id = header.parent_session
        while parent_id is not None and parent_id not in seen:
            if parent_id == by.id:
                return
            seen.add(parent_id)
            try:
                parent_id = self._header(parent_id).parent_session
            except SubagentError:
                break
        raise SubagentError("UNAUTHORIZED", "only an ancestor may interrupt a child")

    def _stored_descriptor(self, child_id: str) -> tuple[SessionHeader, SubagentDescriptor]:
        """The stored header and authoritative descriptor. The log is scanned lazily up to the
        descriptor (the first turn), not decoded whole: resume opens and validates it anyway."""
        store = self._ctx.store
        try:
            header = store.header(child_id)
            events = store.scan(child_id, start=header.seed_length)
            found = authoritative_descriptor(events, 0)
        except (SessionNotFoundError, KeyError):
            raise SubagentError("UNKNOWN_CHILD", f"no stored child {child_id!r}") from None
        except (SessionLogError, OSError) as exc:  # corrupt, unreadable file
            raise SubagentError(
                "NOT_RESUMABLE", f"the log of child {child_id!r} cannot be read: {exc}"
            ) from exc
        except DescriptorError as exc:
            raise SubagentError("NOT_RESUMABLE", f"malformed descriptor: {exc}") from exc
        if found is None or isinstance(found, Unclassifiable):
            raise SubagentError("NOT_RESUMABLE", f"child {child_id!r} has no usable descriptor")
        return header, found

    # -- activations under supervision ----------------------------------------------------------

    def _launch(self, child: _Child, begin: Callable[[], _Activation]) -> ActivationRun:
        """Start an activation (`begin`, under the child's lock) as a `transient` child of the
        child's supervisor; returns its run. `begin`'s exception propagates and nothing is
        registered."""
        supervisor = child.supervisor
        if supervisor is None or supervisor.closed:
            supervisor = child.supervisor = self._new_supervisor(child)
        child.activations += 1
        spec = ChildSpec(
            f"activation {child.activations}",
            partial(self._start_activation, child),
            restart="transient",  # a crash comes back; a normal or cancelled end is final
            shutdown=ACTIVATION_SHUTDOWN_GRACE,
        )
        child.begin = begin
        try:
            supervisor.start_child(spec)
        except SupervisorClosedError:
            raise SubagentError("RUNTIME_CLOSED", "the runtime is closing") from None
        finally:
            child.begin = None
        handle = child.handle
        assert handle is not None  # bound by `begin`, and nothing settles it under the lock
        return handle

    def _new_supervisor(self, child: _Child) -> Supervisor:
        supervisor = Supervisor(
            f"continuable {child.child_id}",
            max_restarts=self.max_restarts,
            within_seconds=self.within,
            quiet=True,  # a crash is reported to the parent as a result, not on stderr
        )
        supervisor.add_exit_listener(partial(self._on_supervisor_exit, child, supervisor))
        try:
            self._supervisor.start_child(
                ChildSpec(
                    f"{child.child_id} {next(self._supervisor_ids)}",
                    lambda: supervisor,
                    restart="temporary",
                    shutdown=2 * ACTIVATION_SHUTDOWN_GRACE,
                )
            )
        except SupervisorClosedError:
            raise SubagentError("RUNTIME_CLOSED", "the runtime is closing") from None
        return supervisor

    def _start_activation(self, child: _Child) -> _Activation:
        """The activations' `ChildSpec.start`: the caller's start, or a restart after a crash."""
        begin = child.begin
        if begin is not None:
            child.begin = None
            return begin()
        # A restart, called by the supervisor's restart worker. The cold resume waits on the
        # provider, so it runs in a greenlet of its own, never the worker (a disposal kills the
        # worker): the activation is registered at once and bound when its run exists.
        activation = _Activation(child.child_id, self._settlers)
        self._settlers.spawn(self._restart, child, activation)
        return activation

    def _restart(self, child: _Child, activation: _Activation) -> None:
        """Cold-resume a crashed child, telling it its last activation crashed."""
        parent = None if child.parent_id is None else live_agent(self._ctx, child.parent_id)
        if parent is None or self._closed:
            why = "the runtime is closing" if self._closed else "its parent is gone"
            log.info("crashed child %s is not restarted: %s", child.child_id, why)
            self._mark_settled(child)
            activation.end(Exit("cancelled", message=f"not restarted: {why}"))
            return
        try:
            with child.lock:
                self._require_continuation()
                self._authorize_direct_parent(parent, child.child_id)
                text = f"Your last activation crashed ({child.failure}); continue."
                provider, request = self.resume_request(
                    parent,
                    child.child_id,
                    [{"type": "text", "text": text}],
                    MessageSource("subagent-report"),
                    AbortSignal.never(),
                )
                try:
                    handle = self._service.resume(request, provider)
                except SessionLogError as exc:
                    raise SubagentError(
                        "NOT_RESUMABLE",
                        f"the log of child {child.child_id!r} cannot be read: {exc}",
                    ) from exc
                child.label = request.descriptor.label
                self._adopt(child, handle, child.label, parent.id, activation)
                child.restart_error = None
        except Exception as exc:
            # A restart that cannot start is another failure of the child: its supervisor
            # tries again within the intensity, then gives up (the parent is told why).
            log.debug("restarting %s by cold resume failed", child.child_id, exc_info=True)
            child.restart_error = exc
            activation.end(Exit.crashed(exc))

    def _on_supervisor_exit(self, child: _Child, supervisor: Supervisor, exit: Exit) -> None:
        """A child's supervisor ended: given up past the intensity, or disposed. Runs in the
        supervisor's greenlet, so the report (which waits on the parent) gets its own."""
        if child.supervisor is supervisor:
            child.supervisor = None
        if child.handle is None:
            self._mark_settled(child)  # nothing runs and no restart is pending any more
        if exit.kind == "crashed" and not self._closed:
            self._settlers.spawn(self._report_escalation, child, supervisor)
        self._forget_if_idle(child)

    def _report_escalation(self, child: _Child, supervisor: Supervisor) -> None:
        parent = None if child.parent_id is None else live_agent(self._ctx, child.parent_id)
        if parent is None:
            log.info("parent of crashed child %s is gone; not told", child.child_id)
            return
        failed = child.restart_error
        if failed is not None:
            why = settlement.one_line(f"{type(failed).__name__}: {failed}")
            text = (
                f"Subagent {child.child_id} crashed and could not be restarted ({why}); "
                "it stays stored."
            )
        else:
            text = (
                f"Subagent {child.child_id} crashed {supervisor.max_restarts + 1} times within "
                f"{supervisor.within_seconds:g} s; it is not restarted and stays stored."
            )
        self._report(parent, text)

    def _mark_settled(self, child: _Child) -> None:
        child.settled.set()
        self._changed(child)

    @staticmethod
    def _changed(child: _Child) -> None:
        """Wake the senders waiting for this child's next state change."""
        woken = child.changed
        if woken is not None:
            child.changed = None
            woken.set()

    def _adopt(
        self,
        child: _Child,
        handle: ActivationRun,
        label: str,
        owner: str,
        activation: _Activation | None = None,
    ) -> _Activation:
        if self._closed:
            # close() already took its census: an activation it cannot see must not live on.
            _abandon(handle, "the runtime closed while the child started")
            raise SubagentError("RUNTIME_CLOSED", "the runtime closed while the child started")
        try:
            task = self._tasks().adopt(
                label, owner, kill=lambda reason: handle.cancel(reason), subject=child.child_id
            )
        except BaseException as exc:
            # An activation nobody tracks must not keep running: the caller sees `exc`.
            _abandon(handle, f"its task could not be registered: {type(exc).__name__}: {exc}")
            raise
        if activation is None:
            activation = _Activation(child.child_id, self._settlers)
        activation.bind(handle)
        child.handle = handle
        child.task_id = task.id
        child.parent_id = owner
        child.settled.clear()
        child.users += 1  # released by `_settle`
        self._changed(child)
        # No greenlet waits for the activation: one is started when its result settles.
        handle.result.add_done_callback(
            lambda _f: self._start_settling(child, activation, handle, task.id)
        )
        return activation

    def _start_settling(
        self, child: _Child, activation: _Activation, handle: ActivationRun, task_id: str
    ) -> None:
        self._settlers.spawn(self._settle, child, activation, handle, task_id)

    def _settle(
        self, child: _Child, activation: _Activation, handle: ActivationRun, task_id: str
    ) -> None:
        """When the activation's run ends: notify the parent, release the run, settle the
        task; then end the activation, so its supervisor decides whether it comes back."""
        try:
            outcome = settlement.outcome_of(handle.result)
            exit = _exit_of(outcome)
            with child.lock:
                try:
                    self._notify_parent(child, handle, outcome)
                finally:
                    handle.dispose()
                    if child.handle is handle:
                        child.handle = None
                    settlement.settle_task(self._tasks(), task_id, outcome)
                    if exit.kind == "crashed":
                        child.failure = outcome if isinstance(outcome, Exception) else None
                    else:
                        self._mark_settled(child)
                    activation.end(exit)
            supervisor = child.supervisor
            if supervisor is not None:
                # Let it decide (restart, or forget a normal or cancelled end) before the
                # record is released: an idle record is dropped only once its supervisor is.
                supervisor.wait_handled()
        finally:
            self._release(child)

    def _notify_parent(
        self, child: _Child, handle: ActivationRun, outcome: settlement.Outcome
    ) -> None:
        parent = live_agent(self._ctx, handle.parent_id)
        if parent is None:
            log.info(
                "parent %s of %s is gone; settlement notice dropped", handle.parent_id, handle.id
            )
            return
        summary = settlement.summary(child.label, handle.id, outcome)
        content: list[Mapping[str, Any]] = [{"type": "text", "text": summary}]
        if isinstance(outcome, SubagentResult):
            content.extend(outcome.output)
        settlement.tell_parent(parent, content, summary)

    def _report(self, parent: Agent, text: str) -> None:
        try:
            parent.send([{"type": "text", "text": text}], MessageSource("subagent-report")).get()
        except Exception:
            log.exception("could not tell %s: %s", parent.id, text)

    def close(self) -> None:
        """Stop every live activation and pending restart, and wait for their settlements
        (notices included): the supervisors' disposal returns when every activation ended."""
        self._closed = True
        self._supervisor.dispose("runtime closing")
        # A settlement may still be telling the parent, or a cancelled restart finishing, after
        # its activation ended; quiescence means those greenlets have ended too.
        self._settlers.join()
        self._settlers.close()


def _abandon(handle: ActivationRun, why: str) -> None:
    """Stop a started activation nothing took ownership of: cancel (with why), then dispose,
    which returns once its end is emitted. A failing dispose is logged, not raised over the
    caller's error."""
    try:
        handle.cancel(why)
        handle.dispose()
    except Exception:
        log.exception("disposing abandoned activation %s failed", handle.id)


def _exit_of(outcome: settlement.Outcome) -> Exit:
    """How an activation ended, for its `transient` restart type: only a crash comes back."""
    if isinstance(outcome, Exception):
        return Exit.crashed(outcome)  # an infrastructure fault: the run's result raised
    if isinstance(outcome, BaseException) or outcome.stop_reason == ABORTED:
        return Exit("cancelled", message=f"{type(outcome).__name__}")
    return Exit("normal")  # any stop reason, a child-level failure included: reported


def _message_id(handle: ActivationRun) -> str:
    return handle.message_id
