"""Continuable children: a durable child session driven by a series of activations.

Each activation is one run (one turn) and one background task. `send_message` either steers the
live activation or cold-resumes the stored child through its provider's `resume`. Decisions for
one child are serialized by a per-child lock, so a message that races a settling activation
waits for the settlement and then starts a fresh activation: an accepted message is never
dropped silently (it is in the child's log, or the sender got an exception).

When an activation settles, its parent gets one settlement notice (a user message with source
`subagent-settled`: a one-line summary, then the child's closing message) before the parent's
ownership of the child run is released. An activation that crashed (its result is an
infrastructure fault, e.g. a failed durability checkpoint) is a `transient` child: it is
restarted by cold resume from its log, at most `max_restarts` times within `within` seconds;
past that, or when the restart itself fails, the child stays stored and the parent is told with a
`subagent-report` message. A child-level failure (`stop_reason` error, refusal...) is reported,
never restarted.

This module is the lifecycle only (start, message, restart, settlement); the rows of
`list_children` / `list_descendants` are built by `subagent.listings`, which needs no runtime.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
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
    MessageSource,
    Resumable,
    Steerable,
    SubagentContinuation,
    SubagentProvider,
    SubagentResult,
    SubagentResumeRequest,
    SubagentStartRequest,
)
from supervision.group import TaskGroup
from supervision.signal import AbortController, AbortSignal

__all__ = ["ActivationRun", "ContinuableStart", "ContinuationManager", "RunStarter", "SendResult"]

log = logging.getLogger(__name__)


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


@dataclass
class _Child:
    child_id: str
    label: str = ""
    users: int = 0  # callers between `_use` and `_release`: the record must stay
    lock: Semaphore = field(default_factory=Semaphore)
    handle: ActivationRun | None = None
    task_id: str | None = None
    settled: Event = field(default_factory=Event)
    restarts: list[float] = field(default_factory=list)

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
        self._service = service
        self._ctx = ctx
        self._children: dict[str, _Child] = {}
        self.max_restarts = max_restarts
        self.within = within
        self._closed = False
        self._settlers = TaskGroup("continuation-settlers")

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
                try:
                    handle = self._service.start(name, started)
                except SessionExistsError:  # created by another process meanwhile
                    raise SubagentError(
                        "DUPLICATE_CHILD", f"child {child_id!r} is already stored"
                    ) from None
                child.label = label
                task_id = self._adopt(child, handle, label, parent.id)
        finally:
            remove()
            self._release(child)
        return ContinuableStart(child_id, _message_id(handle), task_id)

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
        child = self._use(child_id)
        try:
            return self._send(parent, child, content, source, signal)
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
                    waiting = child.settled
                elif not child.settled.is_set():
                    # Settling, or live but not steerable: the next activation takes it.
                    waiting = child.settled
                else:
                    return self._resume(parent, child, content, source, signal)
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
            try:
                handle = self._service.resume(request, provider)
            except SessionLogError as exc:  # the log is damaged past the descriptor
                raise SubagentError(
                    "NOT_RESUMABLE", f"the log of child {child.child_id!r} cannot be read: {exc}"
                ) from exc
        finally:
            remove()
        child.label = request.descriptor.label
        task_id = self._adopt(child, handle, child.label, parent.id)
        return SendResult("started", _message_id(handle), task_id)

    # -- interrupt ---------------------------------------------------------------------------

    def interrupt(self, child_id: str, *, by: Agent) -> bool:
        """Cancel the child's current turn, keeping its inbox. Only an ancestor may."""
        validate_session_id(child_id)
        self._authorize_ancestor(by, child_id)
        agent = live_agent(self._ctx, child_id)
        if agent is None or agent.status != "running":
            return False
        agent.cancel(f"interrupted by {by.id}", keep_inbox=True).get()
        return True

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
        if (
            child.users == 0
            and child.handle is None
            and child.settled.is_set()
            and not child.restarts
            and self._children.get(child.child_id) is child
        ):
            del self._children[child.child_id]

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

    def _adopt(self, child: _Child, handle: ActivationRun, label: str, owner: str) -> str:
        if self._closed:
            # close() already took its census: an activation it cannot see must not live on.
            handle.dispose()
            raise SubagentError("RUNTIME_CLOSED", "the runtime closed while the child started")
        try:
            task = self._tasks().adopt(label, owner, kill=lambda reason: handle.cancel(reason))
        except BaseException:
            handle.dispose()  # an activation nobody tracks must not keep running
            raise
        child.handle = handle
        child.task_id = task.id
        child.settled.clear()
        child.users += 1  # released by `_settle`
        # No greenlet waits for the activation: one is started when its result settles.
        handle.result.add_done_callback(lambda _f: self._start_settling(child, handle, task.id))
        return str(task.id)

    def _start_settling(self, child: _Child, handle: ActivationRun, task_id: str) -> None:
        self._settlers.spawn(self._settle, child, handle, task_id)

    def _settle(self, child: _Child, handle: ActivationRun, task_id: str) -> None:
        """When the activation ends: notify the parent, release the run, settle the task."""
        try:
            outcome = settlement.outcome_of(handle.result)
            with child.lock:
                try:
                    self._notify_parent(child, handle, outcome)
                finally:
                    handle.dispose()
                    if child.handle is handle:
                        child.handle = None
                    settlement.settle_task(self._tasks(), task_id, outcome)
                    child.settled.set()
            if isinstance(outcome, Exception):
                self._maybe_restart(child, handle, outcome)
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

    def _maybe_restart(self, child: _Child, handle: ActivationRun, failure: BaseException) -> None:
        """Transient restart: a crashed activation is resumed cold, within the intensity.

        Past the intensity, or when the restart itself fails, the child is left stored and the
        parent is told (a `subagent-report` message).
        """
        if self._closed:
            return
        parent = live_agent(self._ctx, handle.parent_id)
        if parent is None:
            log.info("parent of crashed child %s is gone; not restarting", child.child_id)
            return
        now = time.monotonic()
        child.restarts = [t for t in child.restarts if now - t < self.within]
        if len(child.restarts) >= self.max_restarts:
            self._report(
                parent,
                f"Subagent {child.child_id} crashed {len(child.restarts) + 1} times within "
                f"{self.within:g} s; it is not restarted and stays stored.",
            )
            return
        child.restarts.append(now)
        try:
            self.send_message(
                parent,
                child.child_id,
                [{"type": "text", "text": f"Your last activation crashed ({failure}); continue."}],
                MessageSource("subagent-report"),
            )
        except Exception as exc:
            log.exception("restarting %s by cold resume failed", child.child_id)
            self._report(
                parent,
                f"Subagent {child.child_id} crashed and could not be restarted "
                f"({settlement.one_line(f'{type(exc).__name__}: {exc}')}); it stays stored.",
            )

    def _report(self, parent: Agent, text: str) -> None:
        try:
            parent.send([{"type": "text", "text": text}], MessageSource("subagent-report")).get()
        except Exception:
            log.exception("could not tell %s: %s", parent.id, text)

    def close(self) -> None:
        """Dispose every live activation and wait for their settlements (notices included)."""
        self._closed = True
        for child in list(self._children.values()):
            handle = child.handle
            if handle is not None:
                handle.dispose()
        for child in list(self._children.values()):
            child.settled.wait()
        # A settlement may still be telling the parent or restarting after `settled` is set;
        # quiescence means those greenlets have ended too.
        self._settlers.join()
        self._settlers.close()


def _message_id(handle: ActivationRun) -> str:
    return handle.message_id
