"""`ctx.subagents`: the `SubagentService` facade over the registry actor.

`start()` runs in the caller's greenlet and crosses the registry once: the registry validates
and admits the request (in the seed's order, before any child exists), the provider's `start`
runs (in this greenlet, the registry open meanwhile) and the registry publishes the run (the
seam wants `subagent/start` emitted before `start()` returns), all in one `ask_now`. A remote
provider's start (ACP, Ray: it may block for long), a start that waits for a slot, or a busy
registry take two crossings instead: admission, then the start here, then publication.
The registry owns the run table, emits
`subagent/start`, and observes the run's result; its end comes back through the same mailbox,
so each run's start precedes its end for every listener, and every start has exactly one end.
A local child's own actor is its run's actor; only a remote run gets a `RunActor`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any, TypeVar, cast

import gevent
from pykka import ActorDeadError

from actors import gevent_actor
from actors import registry_actor as reg
from actors.agent_handle import Agent, check_source
from actors.agent_messages import Steer, check_content
from actors.deferred import Deferred
from actors.gevent_actor import GeventFuture, outcome_of, reply_of
from actors.local import start_local
from actors.local_run import LocalRun
from actors.registry_actor import RegistryActor
from actors.run_actor import CancelRun, DisposeRun, RunActor
from actors.supervised import ActorChild
from agent import tracing
from agent.context import AgentContext
from agent.events import validate_session_id
from agent.usage import PICO
from subagent import telemetry
from subagent.continuation import ContinuableStart, ContinuationManager, SendResult
from subagent.errors import SubagentError
from subagent.listings import ChildRow, Listings
from subagent.live import LiveAgents, live_agent, task_service
from subagent.remote_runs import RemoteRunTable
from subagent.schema import UnsupportedSchemaError, check_output_schema
from subagent.tasks import DEFAULT_KEEP_SETTLED
from subagent.types import (
    ContentBlock,
    MessageSource,
    Resumable,
    SubagentProvider,
    SubagentResult,
    SubagentResumeRequest,
    SubagentRun,
    SubagentStartRequest,
    ToolRestriction,
)
from supervision.group import TaskGroup
from supervision.offload import offload
from supervision.signal import AbortSignal
from supervision.supervisor import ChildSpec, Supervisor, SupervisorClosedError

__all__ = ["RunHandle", "SteerableRunHandle", "SubagentService"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# A lifecycle listener gets `subagent/start`, `subagent/end` and provider events (the
# registry's TypedDicts); a progress listener gets a child's progress events (docs/events.md).
Listener = reg.Listener
ProgressListener = Callable[[Mapping[str, Any]], None]
# What a caller may steer or message a child with: text, or a list of content blocks
# (`actors.agent_messages.check_content` checks it at the call).
Content = str | Sequence[ContentBlock]

# How long a run actor may take to dispose its run when its supervisor stops it (an ACP child's
# teardown graces fit well inside) before the supervisor kills the actor.
RUN_SHUTDOWN_GRACE = 60.0

# A start whose registry is idle makes no greenlet switch; one start in this many yields.
YIELD_EVERY = 8
# A run's stop message (stateless and frozen: one for every run's supervisor entry).
_DISPOSE_RUN = DisposeRun()

# A start request's fields but its last, `depth`, which the service sets. The copy that carries
# the depth is made slot by slot through the slots' own descriptors (the request is a frozen,
# slotted dataclass): a third cheaper than its `__init__` (one `object.__setattr__` a field),
# and half of `dataclasses.replace` (once per start).
_REQUEST_FIELDS = tuple(f.name for f in fields(SubagentStartRequest))
assert _REQUEST_FIELDS[-1] == "depth", "the service copies requests with depth last"
_REQUEST_SLOTS: tuple[tuple[Callable[[object, object], None], Callable[..., object]], ...] = tuple(
    (slot.__set__, slot.__get__)
    for slot in (SubagentStartRequest.__dict__[name] for name in _REQUEST_FIELDS[:-1])
)
_set_depth: Callable[[object, object], None] = SubagentStartRequest.__dict__["depth"].__set__


def _with_depth(request: SubagentStartRequest, depth: int) -> SubagentStartRequest:
    """A copy of `request` carrying `depth` (the caller's request is never changed)."""
    copy: SubagentStartRequest = object.__new__(SubagentStartRequest)
    for set_slot, get_slot in _REQUEST_SLOTS:
        set_slot(copy, get_slot(request))
    _set_depth(copy, depth)
    return copy


class RunHandle:
    """What `start()` returns: the provider's run, its id in this runtime and its actor (`ref`).

    For a local child `ref` is the child's own `AgentActor`; for a remote one it is the run's
    `RunActor`. `result` is the run's own future (settled once by whoever produces the run);
    the registry emits `subagent/end` when it settles. Always `dispose()`.
    """

    __slots__ = (
        "_disposed",
        "_run",
        "_service",
        "_trace",
        "parent_id",
        "provider",
        "ref",
        "result",
        "run_id",
        "started_at",
        "ticket",
    )

    def __init__(
        self,
        service: SubagentService,
        run: SubagentRun,
        run_id: str,
        provider: str,
        parent_id: str,
        ticket: int,
        result: GeventFuture[SubagentResult],
    ) -> None:
        self._service = service
        self._run = run
        self.run_id = run_id
        self.provider = provider
        self.parent_id = parent_id
        self.ticket = ticket
        self.started_at = time.monotonic()
        self.result = result
        self._disposed = False
        # The run's actor: the child's `AgentActor` for a local run, else its `RunActor`.
        self.ref: Any = None
        self._trace: tracing.Activation | None = None  # the activation's span, if tracing

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} provider={self.provider} run_id={self.run_id}>"

    @property
    def id(self) -> str:
        run_id: str = self._run.id
        return run_id

    @property
    def local_agent(self) -> Agent | None:
        agent = self._run.local_agent  # the seam's view of it; the face's own class in-process
        return agent if isinstance(agent, Agent) else None

    @property
    def message_id(self) -> str:
        """The id of the activation's prompt, where the provider tells it ("" otherwise)."""
        return str(getattr(self._run, "message_id", "") or "")

    @property
    def session_id(self) -> str:
        """The id of the child's session log: the provider's `session_id` where it tells one,
        else the run's id (every provider here logs a child under its run id, a Ray host too)."""
        session_id = getattr(self._run, "session_id", None)
        return session_id if isinstance(session_id, str) and session_id else self.id

    @property
    def settled(self) -> bool:
        return self.result.done

    @property
    def usage(self) -> dict[str, int]:
        """Tokens the child and its descendants spent so far (`agent.usage` keys); `{}` when
        the provider cannot see them (a remote child)."""
        agent = self.local_agent
        return {} if agent is None else dict(agent.usage.subtree)

    def cancel(self, cause: object = None) -> None:
        """Abort the activation; the result settles `aborted` unless it already completed.

        A local child's actor handles the cancel in place when it is idle (as a steer): a tree's
        cancel then reaches every child with no mailbox hop and no loop greenlet made for it."""
        self._service.owner.check()
        try:
            actor = None if self._run.local_agent is None else gevent_actor.actor_of(self.ref)
            if actor is not None:
                actor.tell_now(CancelRun(cause))
            else:
                self.ref.tell(CancelRun(cause))
        except ActorDeadError:  # already disposed: nothing left to cancel
            pass

    def dispose(self) -> None:
        """Cancel what remains and return at quiescence (the result settled, `subagent/end`
        emitted). Idempotent; the run's actor disposes the run exactly once."""
        self._service.owner.check()
        self._disposed = True
        run = self._run
        if type(run) is LocalRun:
            # A local run (its actor is the child's own) is disposed in the caller's greenlet,
            # which waits for it anyway: an idle child's actor handles the close in place, with
            # no disposer greenlet and no mailbox round trip. The actor still answers a told
            # DisposeRun (its supervisor's stop) the same way, once.
            run.dispose()
        else:
            with contextlib.suppress(ActorDeadError):
                self.ref.ask(DisposeRun())
        gevent_actor.join(self.ref)
        # An infrastructure fault is reported through `result`, not by dispose.
        with contextlib.suppress(Exception):
            self.result.get()
        self._service.sync()


class SteerableRunHandle(RunHandle):
    """A run whose provider offers live steering (the `Steerable` capability)."""

    __slots__ = ()

    def steer(
        self, content: Content, source: MessageSource | None = None
    ) -> GeventFuture[str | None]:
        """Fulfils once the child's running turn admitted the message at a step boundary: with
        the admitted message's id for a local child, with what the provider's `steer` gives
        (None, by the seam) for a remote one. From another thread than the runtime's it raises
        `WRONG_THREAD` at once (the child's actor runs on its thread's hub)."""
        self._service.owner.check()
        reply: Deferred[str | None] = Deferred()
        message = Steer(check_content(content), check_source(source), reply)
        if self._disposed:
            return _failed(SubagentError("RUN_DISPOSED"))
        if not self.ref.is_alive():  # never Pykka's raw ActorDeadError
            closed = self._service.closed
            return _failed(SubagentError("RUNTIME_CLOSED" if closed else "RUN_DISPOSED"))
        if self.result.done:
            return _failed(SubagentError("RUN_TERMINAL", "the run has settled"))
        try:
            actor = None if self._run.local_agent is None else gevent_actor.actor_of(self.ref)
            if actor is not None:
                # The child's own actor: told in place when it is idle (no hub switch before
                # the steer is accepted), else queued behind what it is handling.
                actor.tell_now(message)
            else:
                # One tell; the run's actor settles `reply` itself (no ask future to bind).
                self.ref.tell(message)
        except ActorDeadError:
            return _failed(SubagentError("RUN_DISPOSED"))
        return reply


class SubagentService:
    """Provider registry, validated starts, lifecycle events. Thread: the gevent hub only."""

    def __init__(
        self,
        ctx: AgentContext,
        *,
        max_children: int | None = None,
        max_children_per_parent: int | None = None,
    ) -> None:
        self._ctx = ctx
        # Starts, resumes and close from another thread are refused (`agent.owner_thread`): the
        # thread of the context, whose hub runs the agents.
        self.owner = ctx.owner
        self._registry, self._ref = start_local(
            RegistryActor, max_children, max_children_per_parent
        )
        self._tickets = itertools.count(1)
        self._progress: list[ProgressListener] = []
        # Greenlets that wait on the results of foreign runs (a provider whose result is not
        # one of our futures cannot be observed with a done callback).
        self._relays = TaskGroup("service-relays")
        self._closed = False
        # The supervision tree: the runtime's root, one supervisor per parent agent holding the
        # actors of that parent's child runs, nested under the supervisor of the parent's own run.
        self._root = Supervisor("subagents")
        self._supervisors: dict[str, Supervisor] = {}
        self._continuation = ContinuationManager(self, ctx)
        # Runs with no local agent (ACP, Ray), by id and by parent: live from their start, then
        # ended, still known to their parent (listed `ended`; an interrupt finds them not
        # running) as long as a settled task stays readable, under the task service's bound
        # (`_remember_ended`). The listings and `interrupt` read it one parent or one id at a
        # time: never every run the service ever knew.
        self._remote: RemoteRunTable[RunHandle] = RemoteRunTable()
        self._listings = Listings(
            ctx.store, LiveAgents(ctx), self._continuation.activation, self._remote
        )
        ctx.lifecycle.on_published(self._on_agent_published)
        ctx.lifecycle.on_closing(self._on_parent_closing)
        ctx.lifecycle.on_cancelled(self._on_parent_cancelled)

    # -- providers --------------------------------------------------------------------------------

    def register(self, provider: SubagentProvider) -> Callable[[], None]:
        """Register a provider; returns its unregister function. Removal blocks new starts only."""
        with _registry_open():
            reply_of(self._ref, reg.Register(provider))

        def unregister() -> None:
            with _registry_open():
                reply_of(self._ref, reg.Unregister(provider))

        return unregister

    def providers(self) -> list[SubagentProvider]:
        with _registry_open():
            return reply_of(self._ref, reg.Providers())

    def get(self, name: str) -> SubagentProvider | None:
        with _registry_open():
            return reply_of(self._ref, reg.GetProvider(name))

    # -- events -----------------------------------------------------------------------------------

    def subscribe(self, listener: Listener, *, parent_id: str | None = None) -> Callable[[], None]:
        """Receive lifecycle events (all, or one parent's children). Listeners are observe-only
        and must return quickly; one that raises is logged and the others still run."""
        if not callable(listener):
            raise TypeError("listener must be callable")
        with _registry_open():
            reply_of(self._ref, reg.Subscribe(listener, parent_id))

        def remove() -> None:
            if self._ref.is_alive():
                with _registry_open():
                    reply_of(self._ref, reg.Unsubscribe(listener, parent_id))

        return remove

    def subscribe_progress(self, listener: ProgressListener) -> Callable[[], None]:
        """Receive every local child's progress events (tagged `agent_id`), from now on."""
        self._progress.append(listener)

        def remove() -> None:
            if listener in self._progress:
                self._progress.remove(listener)

        return remove

    def _on_agent_published(self, agent: Agent) -> None:
        # Attached before the child's first turn runs, so a UI sees every event of it.
        if self._progress and agent.header.origin == "subagent":
            agent.add_progress_listener(self._relay_progress)
        self._account_for(agent)

    def _account_for(self, agent: Agent) -> None:
        """Link a new agent's usage account under its parent's (a subtree's spend counts
        against every ancestor's budget) and have a used-up budget cancel its descendants."""
        account = agent.usage
        parent = live_agent(self._ctx, agent.header.parent_session or "")
        if parent is not None:
            account.attach(parent.usage)
        if account.limit is None and account.cost_limit is None:
            return
        events = agent.log.events
        seed_length = agent.header.seed_length
        if any(events[i]["type"] == "turn/start" for i in range(seed_length, len(events))):
            # A cold resume (its own turns are in the log, not only a fork's seed): what its
            # stored descendants spent still counts against its budget.
            for row in self._listings.list_descendants(agent.id):
                account.add_subtree(
                    row.get("usage") or {}, round(float(row.get("cost_usd") or 0) * PICO)
                )
        agent_id = agent.id
        account.on_exceeded = lambda over: self._cancel_subtree(agent_id, over.describe_exhausted())

    def _cancel_subtree(self, agent_id: str, cause: str) -> None:
        """Cancel every live run below `agent_id`; the agent itself ends at its next step. Told
        to the registry (it holds the run table): this runs inside a turn, which must not wait."""
        with contextlib.suppress(ActorDeadError):
            self._ref.tell(reg.CancelChildren(agent_id, cause, subtree=True))

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
        """The live runs (all, or one parent's), from the registry's run table."""
        self.owner.check()
        with _registry_open():
            runs = reply_of(self._ref, reg.Runs(parent_id))
        # The registry's runs are what `_publish` gave it: this service's handles, no other.
        return cast("list[RunHandle]", runs)

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
        _check_request(request)
        self.owner.check()
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED")
        if request.output_schema is not None:
            # Walk a large schema in a thread now; admission (which reports problems in the
            # seam's order) then finds the verdict remembered instead of walking on the hub.
            with contextlib.suppress(UnsupportedSchemaError):
                check_output_schema(request.output_schema, run=offload)
        parent_id = _parent_id(request.parent)
        ticket = next(self._tickets)
        if ticket % YIELD_EVERY == 0:
            # An idle registry answers in place (no switch), so a loop of starts would never
            # yield: give the other greenlets the hub now and then.
            gevent.sleep(0)
        # One crossing: an idle registry admits, runs `_start_admitted` (the provider's start,
        # here in this greenlet) and publishes, all in this one `ask_now`, when the provider's
        # start runs in place. Otherwise it answers the admission and the start and the
        # publication follow here (a remote provider, a wait for a slot, a busy registry).
        message = reg.Start(name, request, ticket, parent_id, self._start_admitted)
        answer = self._registry.ask_in_place(message)
        if isinstance(answer, GeventFuture):  # queued, or waiting for a slot
            answer = (
                answer.get() if answer.done else self._wait_admitted(answer, ticket, request.signal)
            )
        if isinstance(answer, RunHandle):  # started and published in the crossing
            return answer
        if isinstance(answer, reg.Launched):
            run = answer.run  # our `_start_admitted`'s handle, started in the crossing
            assert isinstance(run, RunHandle)
            return self._publish(run)
        if type(answer) is not tuple:
            raise TypeError(f"the registry answered a start with {answer!r}")
        provider, run_id, depth = answer
        return self._publish(self._start_admitted(message, provider, run_id, depth))

    def _start_admitted(
        self, message: reg.Start, provider: SubagentProvider, run_id: str, depth: int
    ) -> RunHandle:
        """The provider's start of an admitted request, in the caller's greenlet; the run is
        adopted by its parent's supervisor, not yet published. Gives the slot back on failure."""
        request, ticket, parent_id = message.request, message.ticket, message.parent_id
        assert parent_id is not None
        if request.signal.aborted:
            self._release(ticket)
            raise SubagentError("ABORTED", f"the start was aborted: {request.signal.reason}")
        request, trace = telemetry.begin_start(
            request, message.name, run_id, parent_id, provider, depth
        )
        if request.depth != depth:
            # The depth the registry computed travels with the request (a copy: the caller's
            # request is never changed), so no provider computes it again.
            request = _with_depth(request, depth)
        start = provider.start
        return self._started(provider, run_id, ticket, parent_id, lambda: start(request), trace)

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
        self.owner.check()
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED")
        parent_id = _parent_id(request.parent)
        with _registry_open():
            known = reply_of(self._ref, reg.Known(name))
        if known is None:
            raise SubagentError("NO_PROVIDER", f"no provider named {name!r} was ever registered")
        if not isinstance(known, Resumable):
            # The registry refuses it as well; checked here first, so `known.resume` is typed
            # and nothing is admitted for a resume that cannot run.
            raise SubagentError(
                "UNSUPPORTED_CAPABILITY", f"provider {known.name!r} cannot resume children"
            )
        ticket = next(self._tickets)
        # The registry admits `known` itself (a resume names its provider, registered or not).
        _admitted, run_id, _ = self._admit(
            reg.AdmitResume(known, ticket, parent_id), request.signal
        )
        store = self._ctx.store
        request, trace = telemetry.begin_resume(request, name, run_id, parent_id, store, known)
        resume = known.resume
        run = self._started(known, run_id, ticket, parent_id, lambda: resume(request), trace)
        return self._publish(run)

    def _admit(self, message: reg.Admit | reg.AdmitResume, signal: AbortSignal) -> reg.Admission:
        """The admitted provider, the run id and (for a start) the child's depth."""
        future = self._registry.ask_now(message, block=False)
        if future.done:  # granted at once (a free slot): nothing to withdraw while waiting
            admitted = future.get()
        else:
            admitted = self._wait_admitted(future, message.ticket, signal)
        if signal.aborted:
            self._release(message.ticket)
            raise SubagentError("ABORTED", f"the start was aborted: {signal.reason}")
        return admitted

    def _wait_admitted(self, future: GeventFuture[T], ticket: int, signal: AbortSignal) -> T:
        """Wait for a slot; an abort meanwhile withdraws the start (the reply then fails)."""
        remove = signal.add_listener(lambda reason: self._withdraw(ticket, reason))
        try:
            return future.get()
        finally:
            remove()

    def _charge_remote(self, parent_id: str, future: GeventFuture[SubagentResult]) -> None:
        outcome = outcome_of(future)
        if isinstance(outcome, BaseException):
            return
        usage = outcome.extra.get("usage")
        parent = live_agent(self._ctx, parent_id)
        if usage and parent is not None:
            parent.usage.charge_remote(usage)

    def _withdraw(self, ticket: int, reason: object) -> None:
        with contextlib.suppress(ActorDeadError):
            self._ref.tell(reg.Withdraw(ticket, reason))

    def _release(self, ticket: int) -> None:
        """Give an admission slot back; a registry already stopped needs nothing back."""
        with contextlib.suppress(ActorDeadError):
            self._ref.tell(reg.Released(ticket))

    def _started(
        self,
        provider: SubagentProvider,
        run_id: str,
        ticket: int,
        parent_id: str,
        start: Callable[[], SubagentRun],
        trace: tracing.Activation | None = None,
    ) -> RunHandle:
        """Run the provider's start; the handle, adopted by the parent's supervisor."""
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
        handle = cls(self, run, run_id, provider.name, parent_id, ticket, self._result_of(run))
        if trace is not None:
            handle._trace = trace
            trace.published(run.id)
            # The activation's span ends with its result (a done callback: no greenlet).
            result = handle.result
            result.add_done_callback(lambda _settled: _end_span(trace, result))
        if run.local_agent is None:
            # A remote child's reported spend (ACP) counts in its parent's subtree.
            handle.result.add_done_callback(lambda future: self._charge_remote(parent_id, future))
        try:
            supervisor = self._supervisor_for(parent_id)
            # A local child's own actor is the run's actor; a remote run gets one.
            ref = getattr(run, "ref", None)
            handle.ref = ref if ref is not None else RunActor.start(run)
            # A run is a temporary child of its parent's supervisor: adopted as started.
            supervisor.adopt(
                run_id,
                ActorChild(handle.ref, name=f"run {run_id}", stop_message=_DISPOSE_RUN),
                shutdown=RUN_SHUTDOWN_GRACE,
            )
        except SupervisorClosedError:
            # The parent is being disposed while this child was starting: undo, emit nothing.
            if handle.ref is not None:
                with contextlib.suppress(ActorDeadError):
                    handle.ref.ask(DisposeRun())
            else:
                run.dispose()
            self._release(ticket)
            failure = SubagentError("START_FAILED", "the parent is shutting down")
            if trace is not None:
                trace.failed(failure)
            raise failure from None
        if run.local_agent is None:
            # Known to the listings and `interrupt` from now on (its start event follows), and
            # remembered as ended by its result's done callback: before the registry handles
            # its end, so no listing misses it between.
            self._remote.started(handle)
            handle.result.add_done_callback(lambda _settled: self._remember_ended(handle))
        return handle

    def _publish(self, handle: RunHandle) -> RunHandle:
        """The registry enters the run, emits its start (before start() returns, as the seam
        says), then observes its result."""
        try:
            self._registry.ask_now(reg.Published(handle))
        except ActorDeadError:
            handle.dispose()
            raise SubagentError("RUNTIME_CLOSED") from None
        return handle

    def _remember_ended(self, handle: RunHandle) -> None:
        """Keep what the listings and `interrupt` need of an ended remote run (nothing of it
        may be stored here: a one-shot ACP child), bounded as the settled tasks are
        (`TaskService.keep_settled`, the oldest forgotten first)."""
        if self._closed:
            self._remote.withdraw(handle)
            return
        tasks = task_service(self._ctx)
        self._remote.ended(
            handle, tasks.keep_settled if tasks is not None else DEFAULT_KEEP_SETTLED
        )

    def _result_of(self, run: SubagentRun) -> GeventFuture[SubagentResult]:
        """The run's result as one of our futures. Ours are already; a foreign provider's
        future is relayed by a greenlet this service owns (joined at close)."""
        result = run.result
        if isinstance(result, GeventFuture):
            return result
        relayed: Deferred[SubagentResult] = Deferred()

        def relay() -> None:
            try:
                relayed.resolve(result.get())
            except BaseException as exc:
                relayed.reject(exc)

        self._relays.spawn(relay)
        return relayed

    def sync(self) -> None:
        """Wait until the registry handled everything told so far (e.g. a run's end)."""
        with contextlib.suppress(ActorDeadError):
            # In place when the registry is idle: everything told so far is handled already.
            self._registry.ask_now(reg.SYNC)

    # -- continuable children (see subagent.continuation) -----------------------------------------

    def start_continuable(
        self, name: str, request: SubagentStartRequest, *, label: str, child_id: str | None = None
    ) -> ContinuableStart:
        """Start a durable child; resolves once its first prompt is accepted into its inbox."""
        _check_request(request)
        self.owner.check()
        return self._continuation.start_continuable(name, request, label=label, child_id=child_id)

    def send_message(
        self,
        parent: Agent,
        child_id: str,
        content: Content,
        source: MessageSource,
        signal: AbortSignal | None = None,
    ) -> SendResult:
        """Steer the child's live activation, or cold-resume it with this message."""
        self.owner.check()
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED")
        _parent_id(parent)
        _check_session_id(child_id, "child_id")
        if not isinstance(source, MessageSource):  # required here: the caller says who sends
            raise TypeError(f"source must be a MessageSource, got {type(source).__name__}")
        if signal is not None and not isinstance(signal, AbortSignal):
            raise TypeError(f"signal must be an AbortSignal or None, got {type(signal).__name__}")
        blocks = check_content(content)
        if not blocks or (isinstance(content, str) and not content):
            # A resume with nothing to say would wake the child for an empty turn.
            raise ValueError("the message holds nothing: give the child something to act on")
        return self._continuation.send_message(parent, child_id, blocks, source, signal)

    def interrupt(self, child_id: str, *, by: Agent) -> bool:
        """Cancel a child's current turn, keeping its inbox. Only an ancestor may.

        A child with no agent in this process (ACP, Ray) is interrupted through its live run (one
        look-up in the service's table of remote runs): its one turn is cancelled, so the run
        ends `aborted` (the provider's cancel; an ACP agent is reaped once the run's owner
        disposes it). True once it settled so and the registry handled its end: a listing asked
        after this shows it `ended`. One that ended already is not running (False), for as long
        as it stays listed."""
        self.owner.check()
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED")
        validate_session_id(child_id)
        remote = ended_under = None
        if live_agent(self._ctx, child_id) is None:
            remote = self._remote.live(child_id)
            ended_under = None if remote is not None else self._remote.ended_under(child_id)
        stopped = self._continuation.interrupt(
            child_id, by=by, remote=remote, ended_under=ended_under
        )
        if stopped and remote is not None:
            self.sync()  # the registry has seen its end
        return stopped

    def list_children(self, parent_session_id: str) -> list[ChildRow]:
        self.owner.check()
        _check_session_id(parent_session_id, "parent_session_id")
        return self._listings.list_children(parent_session_id)

    def list_descendants(self, root_session_id: str) -> list[ChildRow]:
        self.owner.check()
        _check_session_id(root_session_id, "root_session_id")
        return self._listings.list_descendants(root_session_id)

    # -- ownership: a parent's end reaches its children -------------------------------------------

    def _supervisor_for(self, parent_id: str) -> Supervisor:
        supervisor = self._supervisors.get(parent_id)
        if supervisor is not None:
            return supervisor
        if self._closed:
            raise SupervisorClosedError("the runtime is closing")
        supervisor = Supervisor(f"children of {parent_id}")
        parent = live_agent(self._ctx, parent_id)
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

    def _on_parent_closing(self, agent: Agent) -> None:
        """Dispose the closing agent's children first (release completes child-first)."""
        supervisor = self._supervisors.pop(agent.id, None)
        if supervisor is not None:
            supervisor.dispose(f"parent {agent.id} closing")

    def _on_parent_cancelled(self, agent: Agent, cause: object) -> None:
        if not self._registry.has_children(agent.id):
            return  # most agents (every leaf child) started no run: no message at all
        with contextlib.suppress(ActorDeadError):
            self._ref.tell(reg.CancelChildren(agent.id, cause))

    def close(self) -> None:
        """Dispose every live run, then stop the registry. Every start gets its end first."""
        self.owner.check()
        self._closed = True
        self._remote.clear()
        self._continuation.close()
        self._root.dispose("runtime closing")
        self._supervisors.clear()
        # Let the registry deliver the last end events before it stops.
        self._ref.stop(block=True)
        self._relays.close()


@contextlib.contextmanager
def _registry_open() -> Iterator[None]:
    """Around an ask of the registry: a registry already stopped means the runtime closed.

    The reply's type is the message's (each message in `actors.registry_actor` says what it
    replies); the caller names it where it binds the reply."""
    try:
        yield
    except ActorDeadError:
        raise SubagentError("RUNTIME_CLOSED") from None


def _end_span(trace: tracing.Activation, result: GeventFuture[SubagentResult]) -> None:
    """End a run's activation span with its settled result."""
    outcome = outcome_of(result)
    trace.end(outcome)


def _failed(exc: BaseException) -> GeventFuture[str | None]:
    future: GeventFuture[str | None] = GeventFuture()
    future.set_exception((type(exc), exc, None))
    return future


def _check_request(request: object) -> None:
    """The request's shape, checked before anything is admitted: a user's wrong type is a
    `TypeError` naming the field, never an `AttributeError` from deep inside a provider."""
    if not isinstance(request, SubagentStartRequest):
        raise TypeError("request must be a SubagentStartRequest")
    if not isinstance(request.signal, AbortSignal):
        raise TypeError(
            f"request.signal must be an AbortSignal (e.g. AbortController().signal), "
            f"got {type(request.signal).__name__}"
        )
    if request.tool_filter is not None and not isinstance(request.tool_filter, ToolRestriction):
        raise TypeError(
            f"request.tool_filter must be a ToolRestriction or None, "
            f"got {type(request.tool_filter).__name__}"
        )
    prompt: object = request.prompt
    if isinstance(prompt, (list, tuple)) and not prompt:
        # The child's first user message: an empty one is a mistake, not a task.
        raise ValueError("request.prompt holds no content block: give the child its task")


def _check_session_id(value: object, what: str) -> None:
    """A session id argument: a str (else `TypeError`) of the id syntax (else `ValueError`)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a session id (a str), got {type(value).__name__}")
    validate_session_id(value)


def _parent_id(parent: object) -> str:
    """The id of a request's parent, checked: the request's `parent` is not typed below."""
    parent_id = getattr(parent, "id", None)
    if not isinstance(parent_id, str):
        raise TypeError("request.parent must be an agent (with a string id)")
    return parent_id
