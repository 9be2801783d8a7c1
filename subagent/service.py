"""`ctx.subagents`: the `SubagentService` facade over the registry actor.

`start()` runs in the caller's greenlet: it asks the registry to validate and admit the request
(in the seed's order, before any child exists), runs the provider's `start` itself, wraps the
returned run in a `RunActor`, and has the registry emit `subagent/start` before returning. The
run's end is reported through the same mailbox, so each run's start precedes its end for every
listener, and every start has exactly one end.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from pykka import ActorDeadError, Future

from actors import registry_actor as reg
from actors.agent_actor import Steer, check_content
from actors.gevent_actor import GeventFuture
from actors.local import start_local
from actors.registry_actor import RegistryActor
from actors.run_actor import CancelRun, DisposeRun, RunActor
from actors.supervised import ActorChild
from subagent import telemetry
from subagent.continuation import ContinuableStart, ContinuationManager, SendResult
from subagent.errors import SubagentError
from subagent.schema import UnsupportedSchemaError, check_output_schema
from subagent.types import (
    MessageSource,
    SubagentProvider,
    SubagentResult,
    SubagentResumeRequest,
    SubagentRun,
    SubagentStartRequest,
)
from supervision.offload import offload
from supervision.supervisor import ChildSpec, Supervisor, SupervisorClosedError

__all__ = ["RunHandle", "SteerableRunHandle", "SubagentService"]

log = logging.getLogger(__name__)

Listener = Callable[[Mapping[str, Any]], None]

# How long a run actor may take to dispose its run when its supervisor stops it (an ACP child's
# teardown graces fit well inside) before the supervisor kills the actor.
RUN_SHUTDOWN_GRACE = 60.0


class RunHandle:
    """What `start()` returns: the provider's run behind its own actor (`ref`).

    `result` resolves after the run's `subagent/end` was emitted. Always `dispose()`.
    """

    def __init__(
        self, service: SubagentService, run: SubagentRun, run_id: str, provider: str, parent_id: str
    ) -> None:
        self._service = service
        self._run = run
        self.run_id = run_id
        self.provider = provider
        self.parent_id = parent_id
        self.started_at = time.monotonic()
        self.result: GeventFuture[SubagentResult] = GeventFuture()
        self._ticket = 0
        self._published = False
        self._pending_end: SubagentResult | BaseException | None = None
        self._ended = False
        self._disposed = False
        self.ref: Any = None
        self._trace: Any = None  # the activation's span (agent.tracing.Activation), if tracing

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} provider={self.provider} run_id={self.run_id}>"

    @property
    def id(self) -> str:
        run_id: str = self._run.id
        return run_id

    @property
    def local_agent(self) -> Any:
        return self._run.local_agent

    @property
    def settled(self) -> bool:
        return self._ended

    @property
    def usage(self) -> dict[str, int]:
        """Tokens the child and its descendants spent so far (`agent.usage` keys); `{}` when
        the provider cannot see them (a remote child)."""
        agent = self.local_agent
        return {} if agent is None else dict(agent.usage.subtree)

    def cancel(self, cause: Any = None) -> None:
        """Abort the activation; the result settles `aborted` unless it already completed."""
        with contextlib.suppress(ActorDeadError):
            self.ref.tell(CancelRun(cause))

    def dispose(self) -> None:
        """Cancel what remains and return at quiescence (the result is settled). Idempotent."""
        self._disposed = True
        with contextlib.suppress(ActorDeadError):
            self.ref.ask(DisposeRun())
        # Quiescence includes the end event: wait for it whoever triggered the disposal. An
        # infrastructure fault is reported through `result`, not by dispose.
        with contextlib.suppress(Exception):
            self.result.get()

    # -- settlement, called by the run actor and the service --------------------------------------

    def _on_settled(self, outcome: SubagentResult | BaseException) -> None:
        if self._published:
            self._end(outcome)
        else:
            self._pending_end = outcome

    def _mark_published(self) -> None:
        self._published = True
        if self._pending_end is not None:
            outcome, self._pending_end = self._pending_end, None
            self._end(outcome)

    def _end(self, outcome: SubagentResult | BaseException) -> None:
        if self._ended:
            return
        self._ended = True
        if self._trace is not None:
            self._trace.end(outcome)
        self._service._emit_end(self, outcome)
        if isinstance(outcome, BaseException):
            self.result.set_exception((type(outcome), outcome, outcome.__traceback__))
        else:
            self.result.set(outcome)


class SteerableRunHandle(RunHandle):
    """A run whose provider offers live steering (the `Steerable` capability)."""

    def steer(self, content: Any, source: MessageSource | None = None) -> Future[None]:
        """Fulfils once the child's running turn admitted the message at a step boundary."""
        message = Steer(check_content(content), source or MessageSource.user())
        if self._disposed:
            return _failed(SubagentError("RUN_DISPOSED"))
        if not self.ref.is_alive():  # never Pykka's raw ActorDeadError
            closed = self._service.closed
            return _failed(SubagentError("RUNTIME_CLOSED" if closed else "RUN_DISPOSED"))
        future: Future[None] = self.ref.ask(message, block=False)
        return future


class SubagentService:
    """Provider registry, validated starts, lifecycle events. Thread: the gevent hub only."""

    def __init__(
        self,
        ctx: Any,
        *,
        max_children: int | None = None,
        max_children_per_parent: int | None = None,
    ) -> None:
        self._ctx = ctx
        self._registry, self._ref = start_local(
            RegistryActor, max_children, max_children_per_parent
        )
        self._tickets = itertools.count(1)
        self._live: dict[str, RunHandle] = {}
        self._by_parent: dict[str, dict[str, RunHandle]] = {}
        self._progress: list[Callable[[Mapping[str, Any]], None]] = []
        # Every provider ever registered: a stored child resumes with the provider named in its
        # descriptor even after that provider was unregistered (removal blocks new starts only).
        self._known: dict[str, SubagentProvider] = {}
        self._closed = False
        # The supervision tree: the runtime's root, one supervisor per parent agent holding the
        # actors of that parent's child runs, nested under the supervisor of the parent's own run.
        self._root = Supervisor("subagents")
        self._supervisors: dict[str, Supervisor] = {}
        self._continuation = ContinuationManager(self, ctx)
        ctx.on_agent_published.append(self._on_agent_published)
        ctx.on_agent_closing.append(self._on_parent_closing)
        ctx.on_agent_cancelled.append(self._on_parent_cancelled)

    # -- providers --------------------------------------------------------------------------------

    def register(self, provider: SubagentProvider) -> Callable[[], None]:
        """Register a provider; returns its unregister function. Removal blocks new starts only."""
        self._ask(reg.Register(provider))
        self._known[provider.name] = provider

        def unregister() -> None:
            self._ask(reg.Unregister(provider))

        return unregister

    def providers(self) -> list[SubagentProvider]:
        result: list[SubagentProvider] = self._ask(reg.Providers())
        return result

    def get(self, name: str) -> SubagentProvider | None:
        result: SubagentProvider | None = self._ask(reg.GetProvider(name))
        return result

    # -- events -----------------------------------------------------------------------------------

    def subscribe(self, listener: Listener, *, parent_id: str | None = None) -> Callable[[], None]:
        """Receive lifecycle events (all, or one parent's children). Listeners are observe-only
        and must return quickly; one that raises is logged and the others still run."""
        if not callable(listener):
            raise TypeError("listener must be callable")
        self._ask(reg.Subscribe(listener, parent_id))

        def remove() -> None:
            if self._ref.is_alive():
                self._ask(reg.Unsubscribe(listener, parent_id))

        return remove

    def subscribe_progress(self, listener: Listener) -> Callable[[], None]:
        """Receive every local child's progress events (tagged `agent_id`), from now on."""
        self._progress.append(listener)

        def remove() -> None:
            if listener in self._progress:
                self._progress.remove(listener)

        return remove

    def _on_agent_published(self, agent: Any) -> None:
        # Attached before the child's first turn runs, so a UI sees every event of it.
        if self._progress and agent.header.origin == "subagent":
            agent.add_progress_listener(self._relay_progress)
        self._account_for(agent)

    def _account_for(self, agent: Any) -> None:
        """Link a new agent's usage account under its parent's (a subtree's spend counts
        against every ancestor's budget) and have a used-up budget cancel its descendants."""
        account = agent.usage
        parent = self._ctx.agents.get(agent.header.parent_session or "")
        if parent is not None:
            account.attach(parent.usage)
        if account.limit is None:
            return
        events = agent.log.events
        seed_length = agent.header.seed_length
        if any(events[i]["type"] == "turn/start" for i in range(seed_length, len(events))):
            # A cold resume (its own turns are in the log, not only a fork's seed): what its
            # stored descendants spent still counts against its budget.
            for row in self._continuation.list_descendants(agent.id):
                account.add_subtree(row.get("usage") or {})
        agent_id = agent.id
        account.on_exceeded = lambda over: self._cancel_subtree(agent_id, over.describe_exhausted())

    def _cancel_subtree(self, agent_id: str, cause: str) -> None:
        """Cancel every live run below `agent_id`; the agent itself ends at its next step."""
        pending = [agent_id]
        while pending:
            for handle in self.runs(pending.pop()):
                handle.cancel(cause)
                pending.append(handle.id)

    def relay_progress(self, event: Mapping[str, Any]) -> None:
        """For remote providers: hand one child's progress event (tagged with its id) to the
        progress listeners, as local children's events are."""
        self._relay_progress(event)

    def _relay_progress(self, event: Mapping[str, Any]) -> None:
        for listener in list(self._progress):
            try:
                listener(event)
            except Exception:
                log.exception("progress listener raised")

    # -- runs -------------------------------------------------------------------------------------

    def runs(self, parent_id: str | None = None) -> list[RunHandle]:
        if parent_id is None:
            return list(self._live.values())
        return list(self._by_parent.get(parent_id, {}).values())

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def running_peak(self) -> int:
        """The most runs that held an admission slot at once (for admission-control checks)."""
        return self._registry.running_peak

    def start(self, name: str, request: SubagentStartRequest) -> RunHandle:
        """Validate, admit, start and publish a child run. Raises before any child exists."""
        if not isinstance(name, str):
            raise TypeError("provider name must be a string")
        if not isinstance(request, SubagentStartRequest):
            raise TypeError("request must be a SubagentStartRequest")
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED")
        if request.output_schema is not None:
            # Walk a large schema in a thread now; admission (which reports problems in the
            # seam's order) then finds the verdict remembered instead of walking on the hub.
            with contextlib.suppress(UnsupportedSchemaError):
                check_output_schema(request.output_schema, run=offload)
        parent_id = _parent_id(request.parent)
        ticket = next(self._tickets)
        admitted = self._admit(reg.Admit(name, request, ticket, parent_id), request.signal)
        provider, run_id = admitted
        request, trace = telemetry.begin_start(request, name, run_id, parent_id, provider)
        start = provider.start
        return self._launch(provider, run_id, ticket, parent_id, lambda: start(request), trace)

    def resume(self, request: SubagentResumeRequest, name: str | None = None) -> RunHandle:
        """The raw resume operation: dispatch a resolved request to the provider's `resume`.

        The provider is the one named in the request's descriptor unless `name` says otherwise;
        it need not be registered any more, only to have been (removal blocks new starts only).
        """
        if not isinstance(request, SubagentResumeRequest):
            raise TypeError("request must be a SubagentResumeRequest")
        if name is None:
            name = getattr(request.descriptor, "provider", None)
            if not isinstance(name, str):
                raise TypeError("request.descriptor names no provider; pass name=")
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED")
        parent_id = _parent_id(request.parent)
        known = self._known.get(name)
        if known is None:
            raise SubagentError("NO_PROVIDER", f"no provider named {name!r} was ever registered")
        ticket = next(self._tickets)
        provider, run_id = self._admit(reg.AdmitResume(known, ticket, parent_id), request.signal)
        store = self._ctx.store
        request, trace = telemetry.begin_resume(request, name, run_id, parent_id, store, provider)
        resume = provider.resume
        return self._launch(provider, run_id, ticket, parent_id, lambda: resume(request), trace)

    def _admit(self, message: Any, signal: Any) -> tuple[Any, str]:
        future = self._ref.ask(message, block=False)
        remove = signal.add_listener(lambda reason: self._withdraw(message.ticket, reason))
        try:
            admitted: tuple[Any, str] = future.get()
        finally:
            remove()
        if signal.aborted:
            self._release(message.ticket)
            raise SubagentError("ABORTED", f"the start was aborted: {signal.reason}")
        return admitted

    def _withdraw(self, ticket: int, reason: Any) -> None:
        with contextlib.suppress(ActorDeadError):
            self._ref.tell(reg.Withdraw(ticket, reason))

    def _release(self, ticket: int) -> None:
        """Give an admission slot back; a registry already stopped needs nothing back."""
        with contextlib.suppress(ActorDeadError):
            self._ref.tell(reg.Released(ticket))

    def _launch(
        self,
        provider: SubagentProvider,
        run_id: str,
        ticket: int,
        parent_id: str,
        start: Callable[[], SubagentRun],
        trace: Any = None,
    ) -> RunHandle:
        try:
            run = start()
        except BaseException as exc:
            self._release(ticket)
            if trace is not None:
                trace.failed(exc)
            raise
        # Method presence is the capability (the seed's narrowing); a direct attribute check is
        # exact and far cheaper than a runtime-checkable Protocol `isinstance` on every start.
        cls = SteerableRunHandle if callable(getattr(run, "steer", None)) else RunHandle
        handle = cls(self, run, run_id, provider.name, parent_id)
        handle._ticket = ticket
        if trace is not None:
            handle._trace = trace
            trace.published(run.id)
        try:
            supervisor = self._supervisor_for(parent_id)
            handle.ref = RunActor.start(run, handle._on_settled)
            supervisor.start_child(
                ChildSpec(
                    id=run_id,
                    start=lambda: ActorChild(handle.ref, name=f"run {run_id}"),
                    restart="temporary",
                    shutdown=RUN_SHUTDOWN_GRACE,
                )
            )
        except SupervisorClosedError:
            # The parent is being disposed while this child was starting: undo, emit nothing.
            if handle.ref is not None:
                handle.ref.ask(DisposeRun())
            else:
                run.dispose()
            self._release(ticket)
            failure = SubagentError("START_FAILED", "the parent is shutting down")
            if trace is not None:
                trace.failed(failure)
            raise failure from None
        self._live[run_id] = handle
        self._by_parent.setdefault(parent_id, {})[run_id] = handle
        agent = run.local_agent
        self._ask(
            reg.Published(
                ticket,
                {
                    "type": "subagent/start",
                    "run_id": run_id,
                    "provider": provider.name,
                    "id": run.id,
                    "local": agent is not None,
                    "parent_id": parent_id,
                },
            )
        )
        handle._mark_published()
        return handle

    def _emit_end(self, handle: RunHandle, outcome: SubagentResult | BaseException) -> None:
        event: dict[str, Any] = {
            "type": "subagent/end",
            "run_id": handle.run_id,
            "provider": handle.provider,
            "id": handle.id,
            "local": handle.local_agent is not None,
            "parent_id": handle.parent_id,
        }
        if isinstance(outcome, BaseException):
            event["stop_reason"] = "error"
            event["failure"] = f"{type(outcome).__name__}: {outcome}"
        else:
            event["stop_reason"] = outcome.stop_reason
            usage = outcome.extra.get("usage")
            if usage:
                event["usage"] = dict(usage)
            if outcome.output:
                event["last_assistant_message"] = list(outcome.output)
        self._live.pop(handle.run_id, None)
        siblings = self._by_parent.get(handle.parent_id)
        if siblings is not None:
            siblings.pop(handle.run_id, None)
            if not siblings:
                del self._by_parent[handle.parent_id]
        with contextlib.suppress(ActorDeadError):
            self._ref.tell(reg.Ended(handle._ticket, event))

    # -- continuable children (see subagent.continuation) -----------------------------------------

    def start_continuable(
        self, name: str, request: SubagentStartRequest, *, label: str, child_id: str | None = None
    ) -> ContinuableStart:
        """Start a durable child; resolves once its first prompt is accepted into its inbox."""
        if not isinstance(request, SubagentStartRequest):
            raise TypeError("request must be a SubagentStartRequest")
        return self._continuation.start_continuable(name, request, label=label, child_id=child_id)

    def send_message(
        self,
        parent: Any,
        child_id: str,
        content: Any,
        source: MessageSource,
        signal: Any = None,
    ) -> SendResult:
        """Steer the child's live activation, or cold-resume it with this message."""
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED")
        return self._continuation.send_message(
            parent, child_id, check_content(content), source, signal
        )

    def interrupt(self, child_id: str, *, by: Any) -> bool:
        """Cancel a child's current turn, keeping its inbox. Only an ancestor may."""
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED")
        return self._continuation.interrupt(child_id, by=by)

    def list_children(self, parent_session_id: str) -> list[dict[str, Any]]:
        return self._continuation.list_children(parent_session_id)

    def list_descendants(self, root_session_id: str) -> list[dict[str, Any]]:
        return self._continuation.list_descendants(root_session_id)

    # -- ownership: a parent's end reaches its children -------------------------------------------

    def _supervisor_for(self, parent_id: str) -> Supervisor:
        supervisor = self._supervisors.get(parent_id)
        if supervisor is not None:
            return supervisor
        if self._closed:
            raise SupervisorClosedError("the runtime is closing")
        supervisor = Supervisor(f"children of {parent_id}")
        parent = self._ctx.agents.get(parent_id)
        grandparent_id = None if parent is None else parent.header.parent_session
        owner = self._supervisors.get(grandparent_id or "", self._root)
        owner.start_child(
            ChildSpec(
                id=f"agent {parent_id}",
                start=lambda: supervisor,
                restart="temporary",
                shutdown=RUN_SHUTDOWN_GRACE,
            )
        )
        self._supervisors[parent_id] = supervisor
        return supervisor

    def _on_parent_closing(self, agent: Any) -> None:
        """Dispose the closing agent's children first (release completes child-first)."""
        supervisor = self._supervisors.pop(agent.id, None)
        if supervisor is not None:
            supervisor.dispose(f"parent {agent.id} closing")

    def _on_parent_cancelled(self, agent: Any, cause: Any) -> None:
        for handle in list(self._by_parent.get(agent.id, {}).values()):
            handle.cancel(cause)

    def close(self) -> None:
        """Dispose every live run, then stop the registry. Every start gets its end first."""
        self._closed = True
        self._continuation.close()
        self._root.dispose("runtime closing")
        self._supervisors.clear()
        # Let the registry deliver the last end events before it stops.
        self._ref.stop(block=True)

    def _ask(self, message: Any) -> Any:
        try:
            return self._ref.ask(message)
        except ActorDeadError:
            raise SubagentError("RUNTIME_CLOSED") from None


def _failed(exc: BaseException) -> GeventFuture[None]:
    future: GeventFuture[None] = GeventFuture()
    future.set_exception((type(exc), exc, None))
    return future


def _parent_id(parent: Any) -> str:
    parent_id = getattr(parent, "id", None)
    if not isinstance(parent_id, str):
        raise TypeError("request.parent must be an agent (with a string id)")
    return parent_id
