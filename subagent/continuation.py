"""Continuable children: a durable child session driven by a series of activations.

Each activation is one run (one turn) and one background task. `send_message` either steers the
live activation or cold-resumes the stored child through its provider's `resume`. Decisions for
one child are serialized by a per-child lock, so a message that races a settling activation
waits for the settlement and then starts a fresh activation: an accepted message is never
dropped silently (it is in the child's log, or the sender got an exception).

When an activation settles, its parent gets one settlement notice (a user message with source
`subagent-settled`) before the parent's ownership of the child run is released.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import gevent
from gevent.event import Event
from gevent.lock import Semaphore

from actors.agents import new_session_id
from agent.events import validate_session_id
from agent.store import SessionNotFoundError
from subagent.descriptor import (
    DescriptorError,
    SubagentDescriptor,
    Unclassifiable,
    authoritative_descriptor,
)
from subagent.errors import SubagentError
from subagent.types import (
    MessageSource,
    Resumable,
    SubagentContinuation,
    SubagentResult,
    SubagentResumeRequest,
    SubagentStartRequest,
)
from supervision.signal import AbortController, AbortSignal

__all__ = ["ContinuableStart", "ContinuationManager", "SendResult"]

log = logging.getLogger(__name__)


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
    lock: Semaphore = field(default_factory=Semaphore)
    handle: Any = None
    task_id: str | None = None
    settled: Event = field(default_factory=Event)
    restarts: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.settled.set()


class ContinuationManager:
    """Owns descriptor lookup and task association for continuable children."""

    def __init__(self, service: Any, ctx: Any, *, max_restarts: int = 3, within: float = 60.0):
        self._service = service
        self._ctx = ctx
        self._children: dict[str, _Child] = {}
        self.max_restarts = max_restarts
        self.within = within

    # -- starting ----------------------------------------------------------------------------

    def start_continuable(
        self,
        name: str,
        request: SubagentStartRequest,
        *,
        label: str,
        child_id: str | None = None,
    ) -> ContinuableStart:
        if not isinstance(label, str) or not label:
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
            if child_id in self._ctx.agents or self._ctx.store.exists(child_id):
                raise SubagentError("DUPLICATE_CHILD", f"child {child_id!r} is live or stored")
        options = request.agent_options
        model = options.model if options is not None else parent.options.model
        descriptor = SubagentDescriptor(
            provider=name,
            label=label,
            model=model,
            persona=request.persona,
            tool_filter=request.tool_filter,
        )
        # The caller's signal guards only the start: once accepted, the activation is its own.
        activation = AbortController()
        remove = request.signal.add_listener(activation.abort)
        started = replace(
            request,
            signal=activation.signal,
            continuation=SubagentContinuation(session_id=child_id, descriptor=descriptor),
        )
        child = self._child(child_id)
        with child.lock:
            try:
                handle = self._service.start(name, started)
            finally:
                remove()
            task_id = self._adopt(child, handle, label, parent.id)
        return ContinuableStart(child_id, _message_id(handle), task_id)

    # -- messages ----------------------------------------------------------------------------

    def send_message(
        self,
        parent: Any,
        child_id: str,
        content: Sequence[Mapping[str, Any]],
        source: MessageSource,
        signal: AbortSignal | None = None,
    ) -> SendResult:
        if not isinstance(source, MessageSource):
            raise TypeError("source must be a MessageSource")
        content = list(content)
        signal = signal or AbortSignal.never()
        self._require_continuation()
        child = self._child(child_id)
        while True:
            child.lock.acquire()
            try:
                self._authorize_direct_parent(parent, child_id)
                if signal.aborted:
                    raise SubagentError("ABORTED", f"the message was aborted: {signal.reason}")
                handle = child.handle
                if handle is not None and not handle.settled:
                    try:
                        handle.steer(content, source).get()
                        return SendResult("steered", "", child.task_id)
                    except SubagentError as exc:
                        if exc.code not in ("RUN_TERMINAL", "RUN_DISPOSED"):
                            raise
                    # Lost the race with settlement: wait for it, then resume cold.
                    waiting = child.settled
                elif not child.settled.is_set():
                    waiting = child.settled
                else:
                    return self._resume(parent, child, content, source, signal)
            finally:
                child.lock.release()
            waiting.wait()

    def resume_request(
        self,
        parent: Any,
        child_id: str,
        content: Sequence[Mapping[str, Any]],
        source: MessageSource,
        signal: AbortSignal,
    ) -> tuple[str, SubagentResumeRequest]:
        """Load and authorize a stored child and resolve its resume request."""
        header, descriptor = self._stored_descriptor(child_id)
        if header.parent_session != parent.id:
            raise SubagentError("UNAUTHORIZED", "only the child's recorded parent may resume it")
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
        parent: Any,
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
            handle = self._service.resume(provider, request)
        finally:
            remove()
        label = self._label(child.child_id)
        task_id = self._adopt(child, handle, label, parent.id)
        return SendResult("started", _message_id(handle), task_id)

    # -- interrupt ---------------------------------------------------------------------------

    def interrupt(self, child_id: str, *, by: Any) -> bool:
        """Cancel the child's current turn, keeping its inbox. Only an ancestor may."""
        self._authorize_ancestor(by, child_id)
        agent = self._ctx.agents.get(child_id)
        if agent is None or agent.status != "running":
            return False
        agent.cancel(f"interrupted by {by.id}", keep_inbox=True).get()
        return True

    # -- listings ------------------------------------------------------------------------------

    def list_children(self, parent_session_id: str) -> list[dict[str, Any]]:
        rows = self._rows()
        return [r for r in rows if r.get("parent_id") == parent_session_id]

    def list_descendants(self, root_session_id: str) -> list[dict[str, Any]]:
        rows = self._rows()
        by_parent: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_parent.setdefault(row.get("parent_id") or "", []).append(row)
        out: list[dict[str, Any]] = []
        frontier = [root_session_id]
        while frontier:
            nxt: list[str] = []
            for parent_id in frontier:
                for row in by_parent.get(parent_id, []):
                    out.append(row)
                    nxt.append(row["id"])
            frontier = nxt
        out.sort(key=lambda r: r.get("created_at", 0.0))
        return out

    def _rows(self) -> list[dict[str, Any]]:
        """Live-preferred merge of running agents and stored subagent headers."""
        store = self._ctx.store
        headers = {h.id: h for h in store.list() if h.origin == "subagent"}
        for agent_id, agent in list(self._ctx.agents.items()):
            if agent.header.origin == "subagent":
                headers[agent_id] = agent.header
        parents = {h.parent_session for h in headers.values()}
        rows: list[dict[str, Any]] = []
        for child_id, header in headers.items():
            row: dict[str, Any] = {
                "id": child_id,
                "parent_id": header.parent_session,
                "depth": header.delegation_depth,
                "created_at": header.created_at,
                "has_children": child_id in parents,
            }
            agent = self._ctx.agents.get(child_id)
            try:
                descriptor = self._descriptor_of(child_id, agent)
            except Exception as exc:  # one unreadable log never hides its siblings
                row.update(mode="unknown", label=None, activity=_diagnostic(exc), error=str(exc))
                rows.append(row)
                continue
            row["mode"] = "continuable" if descriptor is not None else "one-shot"
            row["label"] = descriptor.label if descriptor is not None else None
            if agent is None:
                row["activity"] = "stored"
            else:
                row["activity"] = "running" if agent.status == "running" else "idle"
            rows.append(row)
        rows.sort(key=lambda r: r["created_at"])
        return rows

    def _descriptor_of(self, child_id: str, agent: Any) -> SubagentDescriptor | None:
        if agent is not None:
            events = agent.log.events
            seed_length = agent.header.seed_length
        else:
            loaded = self._ctx.store.inspect(child_id)
            events, seed_length = loaded.events, loaded.header.seed_length
        found = authoritative_descriptor(events, seed_length)
        return found if isinstance(found, SubagentDescriptor) else None

    # -- internals -----------------------------------------------------------------------------

    def _require_continuation(self) -> None:
        if not getattr(self._ctx.store, "persistent", False):
            raise SubagentError("PERSISTENCE_UNAVAILABLE")
        if self._ctx.tasks is None or self._ctx.agents is None:
            raise SubagentError("CONTINUATION_UNAVAILABLE")

    def _child(self, child_id: str) -> _Child:
        child = self._children.get(child_id)
        if child is None:
            child = self._children[child_id] = _Child(child_id)
        return child

    def _header(self, child_id: str) -> Any:
        agent = self._ctx.agents.get(child_id)
        if agent is not None:
            return agent.header
        try:
            return self._ctx.store.inspect(child_id).header
        except (SessionNotFoundError, KeyError):
            raise SubagentError("UNKNOWN_CHILD", f"no live or stored child {child_id!r}") from None

    def _authorize_direct_parent(self, parent: Any, child_id: str) -> None:
        header = self._header(child_id)
        live = self._ctx.agents.get(getattr(parent, "id", None))
        if live is not parent or header.parent_session != parent.id:
            raise SubagentError(
                "UNAUTHORIZED", "only the exact live agent recorded as the child's parent may"
            )

    def _authorize_ancestor(self, by: Any, child_id: str) -> None:
        live = self._ctx.agents.get(getattr(by, "id", None))
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

    def _stored_descriptor(self, child_id: str) -> tuple[Any, SubagentDescriptor]:
        try:
            loaded = self._ctx.store.inspect(child_id)
        except (SessionNotFoundError, KeyError):
            raise SubagentError("UNKNOWN_CHILD", f"no stored child {child_id!r}") from None
        try:
            found = authoritative_descriptor(loaded.events, loaded.header.seed_length)
        except DescriptorError as exc:
            raise SubagentError("NOT_RESUMABLE", f"malformed descriptor: {exc}") from exc
        if found is None or isinstance(found, Unclassifiable):
            raise SubagentError("NOT_RESUMABLE", f"child {child_id!r} has no usable descriptor")
        return loaded.header, found

    def _label(self, child_id: str) -> str:
        try:
            return self._stored_descriptor(child_id)[1].label
        except SubagentError:
            return child_id

    def _adopt(self, child: _Child, handle: Any, label: str, owner: str) -> str:
        tasks = self._ctx.tasks
        task = tasks.adopt(label, owner, kill=lambda reason: handle.cancel(reason))
        child.handle = handle
        child.task_id = task.id
        child.settled.clear()
        gevent.spawn(self._settle, child, handle, task.id)
        return str(task.id)

    def _settle(self, child: _Child, handle: Any, task_id: str) -> None:
        """When the activation ends: notify the parent, release the run, settle the task."""
        outcome: SubagentResult | BaseException
        try:
            outcome = handle.result.get()
        except BaseException as exc:
            outcome = exc
        with child.lock:
            try:
                self._notify_parent(handle, outcome)
            finally:
                handle.dispose()
                if child.handle is handle:
                    child.handle = None
                self._settle_task(task_id, outcome)
                child.settled.set()
        if isinstance(outcome, BaseException):
            self._maybe_restart(child, handle, outcome)

    def _notify_parent(self, handle: Any, outcome: SubagentResult | BaseException) -> None:
        parent = self._ctx.agents.get(handle.parent_id)
        if parent is None:
            log.info("parent %s of %s is gone; settlement notice dropped", handle.parent_id, handle.id)
            return
        summary = _summary(handle.id, outcome)
        content: list[Mapping[str, Any]] = [{"type": "text", "text": summary}]
        if isinstance(outcome, SubagentResult):
            content.extend(outcome.output)
        try:
            parent.send(content, MessageSource.subagent_settled(summary)).get()
        except Exception:
            log.exception("could not deliver the settlement notice of %s", handle.id)

    def _settle_task(self, task_id: str, outcome: SubagentResult | BaseException) -> None:
        tasks = self._ctx.tasks
        if isinstance(outcome, BaseException):
            tasks.settle(task_id, "failed", detail=f"{type(outcome).__name__}: {outcome}")
        elif outcome.stop_reason == "completed":
            tasks.settle(task_id, "completed", output=list(outcome.output))
        elif outcome.stop_reason == "aborted":
            tasks.settle(task_id, "killed", output=list(outcome.output), detail=outcome.diagnostic)
        else:
            tasks.settle(
                task_id,
                "failed",
                output=list(outcome.output),
                detail=outcome.diagnostic or outcome.stop_reason,
            )

    def _maybe_restart(self, child: _Child, handle: Any, failure: BaseException) -> None:
        """Transient restart: a crashed activation is resumed cold, within the intensity."""
        now = time.monotonic()
        child.restarts = [t for t in child.restarts if now - t < self.within]
        parent = self._ctx.agents.get(handle.parent_id)
        if parent is None:
            return
        if len(child.restarts) >= self.max_restarts:
            note = f"child {child.child_id} crashed too often; it is left stored"
            parent.send([{"type": "text", "text": note}], MessageSource("subagent-report")).get()
            return
        child.restarts.append(now)
        try:
            self.send_message(
                parent,
                child.child_id,
                [{"type": "text", "text": f"Your last activation crashed ({failure}); continue."}],
                MessageSource("subagent-report"),
            )
        except Exception:
            log.exception("restarting %s by cold resume failed", child.child_id)

    def close(self) -> None:
        for child in list(self._children.values()):
            handle = child.handle
            if handle is not None:
                handle.dispose()
        for child in list(self._children.values()):
            child.settled.wait()


def _message_id(handle: Any) -> str:
    run = handle._run
    return str(getattr(run, "message_id", "") or "")


def _summary(child_id: str, outcome: SubagentResult | BaseException) -> str:
    if isinstance(outcome, BaseException):
        return f"Subagent {child_id} failed: {type(outcome).__name__}: {outcome}"
    if outcome.stop_reason == "completed":
        return f"Subagent {child_id} completed."
    detail = f": {outcome.diagnostic}" if outcome.diagnostic else ""
    return f"Subagent {child_id} ended {outcome.stop_reason}{detail}."


def _diagnostic(exc: BaseException) -> str:
    name = type(exc).__name__
    return "corrupt" if "Corrupt" in name or "Invariant" in name else "unavailable"
