"""The registry actor: one mailbox serializes provider selection, start validation, depth,
admission, the run table and lifecycle-event fan-out, so those decisions happen in one order
for everyone.

It never waits on a provider. A start is one crossing (`Start`) when the provider's start runs
in place (`starts_in_place`: spawn, fork), a slot is free and the registry handles the message
in its caller's greenlet (`ask_now` on an idle registry): the handler admits, runs the caller's
`launch` (the provider's `start`, in that same greenlet) with the registry *open* meanwhile
(`GeventActor.run_open`: a start that switches, a durable store's fsync, or a nested ask from a
hook is handled as if between two messages), then enters the run in the table and emits
`subagent/start`, all before it replies. Otherwise (a remote provider, whose start may block
for long; a start that must wait for a slot; a busy registry) `Start` answers the admission
only, as `Admit` does, and the caller runs `provider.start` itself and tells `Published` (or
`Released` on failure). Publication enters the run, emits `subagent/start` and only then starts
observing the run's result (a done callback, no greenlet): its settlement comes back as `Ended`
through this same mailbox, so a run's end can never overtake its start, whatever the provider
did meanwhile.
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, NotRequired, Protocol, TypedDict, final

import gevent
from pykka import ActorDeadError

from actors.deferred import Deferred
from actors.gevent_actor import Asks, GeventActor, GeventFuture, outcome_of
from agent.fastinit import fast_init
from agent.usage import usd_to_pico
from subagent.errors import SubagentDepthError, SubagentError
from subagent.schema import check_output_schema
from subagent.types import (
    AgentView,
    ContentBlock,
    Resumable,
    SubagentProvider,
    SubagentResult,
    SubagentStartRequest,
    child_depth,
)

__all__ = [
    "Admission",
    "Admit",
    "CancelChildren",
    "Known",
    "Launched",
    "LifecycleEvent",
    "Listener",
    "ProviderEvent",
    "Published",
    "PublishedRun",
    "Register",
    "RegistryActor",
    "Released",
    "RunEndEvent",
    "RunStartEvent",
    "Runs",
    "Start",
    "Subscribe",
    "Sync",
    "Unregister",
]

log = logging.getLogger(__name__)

MAX_SAFE_INTEGER = 2**53 - 1
# Cancels handed out per hub turn by one `CancelChildren` (each runs the child's handler in
# place when it is idle, ~5-10 us): a 10,000-wide fan-out stays far below a 0.1 s hub block.
CANCEL_BATCH = 1_000


# -- lifecycle events: what a `Subscribe`d listener receives --------------------------------------
#
# Plain dicts at run time (TypedDicts for the checker): the fan-out is on every start and end,
# and a dict literal costs a third of a slotted dataclass; listeners read them with `[]` and
# `.get`, and the servers forward them as JSON unchanged. A listener gets the registry's one
# dict and must not change it (the next listener reads the same one).


@final  # no subclass adds keys: `"parent_id" in event` tells the kinds apart
class ProviderEvent(TypedDict):
    type: Literal["subagent/provider-added", "subagent/provider-removed"]
    provider: str


@final  # no subclass adds keys: `"parent_id" in event` tells the kinds apart
class RunStartEvent(TypedDict):
    """A run was published (emitted before `start()` returns)."""

    type: Literal["subagent/start"]
    run_id: str  # this runtime's id of the run (`r1`, ...)
    provider: str
    id: str  # the child's id (its session id for a local child)
    local: bool  # whether the child's agent lives in this process
    parent_id: str


@final  # no subclass adds keys: `"parent_id" in event` tells the kinds apart
class RunEndEvent(TypedDict):
    """A run's result settled: exactly one per `subagent/start`, after it."""

    type: Literal["subagent/end"]
    run_id: str
    provider: str
    id: str
    local: bool
    parent_id: str
    stop_reason: str  # "error" too when the result failed (an infrastructure fault)
    failure: NotRequired[str]  # that fault, `Type: message`
    usage: NotRequired[dict[str, int]]  # tokens of the child's subtree, when it reports them
    last_assistant_message: NotRequired[list[ContentBlock]]  # the result's output, if any


LifecycleEvent = ProviderEvent | RunStartEvent | RunEndEvent
Listener = Callable[[LifecycleEvent], None]
# `Admit`'s reply: the admitted provider, the new run's id and the child's depth (a resume's
# admission carries no depth: the resumed child keeps its header's).
Admission = tuple[SubagentProvider, str, int | None]


class PublishedRun(Protocol):
    """What the registry keeps of a published run (the face's run handle)."""

    run_id: str
    parent_id: str
    provider: str
    ticket: int

    @property
    def id(self) -> str: ...

    @property
    def local_agent(self) -> AgentView | None: ...

    @property
    def result(self) -> GeventFuture[SubagentResult]: ...

    def cancel(self, cause: object = None) -> None: ...


@dataclass(frozen=True, slots=True)
class Register(Asks[None]):
    provider: SubagentProvider


@dataclass(frozen=True, slots=True)
class Unregister(Asks[None]):
    provider: SubagentProvider


@dataclass(frozen=True, slots=True)
class Admit(Asks[Admission]):
    """Validate a start and wait for a slot. Replies `(provider, run_id, depth)`: `depth` is the
    child's delegation depth, computed here once, which the caller carries to the provider."""

    name: str
    request: SubagentStartRequest
    ticket: int
    parent_id: str | None
    require_resume: bool = False


@fast_init  # made once per child: a cheaper __init__, same fields (agent.fastinit)
@dataclass(frozen=True, slots=True)
class Start(Asks["PublishedRun | Launched | Admission"]):
    """Validate, admit and, when it can in this one crossing, start and publish (see the module
    docstring). Replies the published run; `Launched(run)` when it started the run but must
    leave its publication to a `Published` message (the registry was busy once the start
    returned); else the admission, as `Admit` does, for the caller to start and publish."""

    name: str
    request: SubagentStartRequest
    ticket: int
    parent_id: str | None
    # The caller's start: `launch(message, provider, run_id, depth)` returns the run to
    # publish; on failure it gives the slot back itself (`Released`) and raises.
    launch: Callable[[Start, SubagentProvider, str, int], PublishedRun]


@dataclass(frozen=True, slots=True)
class Launched:
    """`Start`'s reply for a run started in the crossing whose publication must be told: a
    message reached the registry while the provider's start ran (it had switched out)."""

    run: PublishedRun


@dataclass(frozen=True, slots=True)
class AdmitResume(Asks[Admission]):
    """Admission for a resume: a slot, no start-time validation. The provider is resolved by
    the caller, because a stored child resumes even after its provider was unregistered."""

    provider: SubagentProvider
    ticket: int
    parent_id: str | None


@dataclass(frozen=True, slots=True)
class Withdraw(Asks[None]):
    """The caller's signal aborted while it waited for a slot (`reason`: the signal's)."""

    ticket: int
    reason: object = None


@dataclass(frozen=True, slots=True)
class Released(Asks[None]):
    """The start failed after admission: give the slot back, emit nothing."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Published(Asks[None]):
    """Told once the provider's start returned: enter the run, emit `subagent/start`, observe
    its result."""

    run: PublishedRun


@dataclass(frozen=True, slots=True)
class Ended(Asks[None]):
    """Told by the run's result as it settles (never before `Published` was handled)."""

    run: PublishedRun


@dataclass(frozen=True, slots=True)
class Runs(Asks["list[PublishedRun]"]):
    """Replies with the live runs (all, or one parent's), in start order."""

    parent_id: str | None = None


@dataclass(frozen=True, slots=True)
class CancelChildren(Asks[None]):
    """Cancel every live run of one parent (its turn was cancelled), or with `subtree` every
    live run below it (its token budget is used up)."""

    parent_id: str
    cause: object = None
    subtree: bool = False


@dataclass(frozen=True, slots=True)
class Known(Asks["SubagentProvider | None"]):
    """Replies with the provider of that name ever registered (a stored child resumes with the
    provider named in its descriptor even after it was unregistered), or None."""

    name: str


@dataclass(frozen=True, slots=True)
class Subscribe(Asks[None]):
    listener: Listener
    parent_id: str | None = None


@dataclass(frozen=True, slots=True)
class Unsubscribe(Asks[None]):
    listener: Listener
    parent_id: str | None = None


@dataclass(frozen=True, slots=True)
class Providers(Asks["list[SubagentProvider]"]):
    pass


@dataclass(frozen=True, slots=True)
class Sync(Asks[None]):
    """Replies None once everything told before it was handled (a dispose waits for its end
    event with it); stateless, so one instance serves every caller (`SYNC`)."""


SYNC = Sync()


@dataclass(frozen=True, slots=True)
class GetProvider(Asks["SubagentProvider | None"]):
    name: str


@dataclass(frozen=True, slots=True)
class Emit(Asks[None]):
    """A registry-level event (provider added/removed) or one relayed from elsewhere."""

    event: LifecycleEvent


@dataclass(slots=True)
class _Waiting:
    ticket: int
    parent_id: str | None
    provider: SubagentProvider
    reply: Deferred[Admission]
    depth: int | None = None  # the child's, for a start (a resume keeps its header's)
    run_id: str = ""
    seq: int = 0


@dataclass(slots=True)
class _Slots:
    per_parent: dict[str | None, int] = field(default_factory=dict)
    total: int = 0


class RegistryActor(GeventActor):
    def __init__(
        self, max_children: int | None = None, max_children_per_parent: int | None = None
    ) -> None:
        super().__init__()
        for name, cap in (
            ("max_children", max_children),
            ("max_children_per_parent", max_children_per_parent),
        ):
            if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
                raise ValueError(f"{name} must be a positive int or None")
        self._providers: dict[str, SubagentProvider] = {}
        self._known: dict[str, SubagentProvider] = {}
        # The run table: live runs by run id, and by parent.
        self._live: dict[str, PublishedRun] = {}
        self._by_parent: dict[str, dict[str, PublishedRun]] = {}
        self._max_total = max_children
        self._max_per_parent = max_children_per_parent
        self._slots = _Slots()
        self._holders: dict[int, str | None] = {}
        # Starts waiting for a slot, per parent, each in FIFO order; `seq` orders them globally.
        self._waiting: dict[str | None, collections.deque[_Waiting]] = {}
        self._waiting_count = 0
        self._seqs = itertools.count()
        self._listeners: list[Listener] = []
        self._parent_listeners: dict[str, list[Listener]] = {}
        self._run_ids = itertools.count(1)
        self.running_peak = 0

    def on_stop(self) -> None:
        """Starts still waiting for a slot will never get one: tell them, never leave them
        hanging."""
        waiting, self._waiting = self._waiting, {}
        self._waiting_count = 0
        for entry in (e for queue in waiting.values() for e in queue):
            entry.reply.reject(SubagentError("RUNTIME_CLOSED", "the runtime closed first"))

    # Pykka's signature (`Actor.on_receive(message: Any) -> Any`) keeps `message: Any`: the
    # dispatch below is by `type(message) is X`, which the hot path needs and mypy does not
    # narrow through. The reply is opaque to the mailbox, as in the other actors.
    def on_receive(self, message: Any) -> object:
        kind = type(message)
        if kind is Start:
            return self._start(message)
        if kind is Admit:
            return self._admit(message)
        if kind is Published:
            self._run_published(message.run)
            return None
        if kind is Ended:
            self._run_ended(message.run)
            return None
        if kind is Runs:
            if message.parent_id is None:
                return list(self._live.values())
            return list(self._by_parent.get(message.parent_id, {}).values())
        if kind is CancelChildren:
            pending = [message.parent_id]
            cancelled = 0
            while pending:
                for run in list(self._by_parent.get(pending.pop(), {}).values()):
                    run.cancel(message.cause)  # an idle local child handles it in place
                    if message.subtree:
                        pending.append(run.id)
                    cancelled += 1
                    if cancelled % CANCEL_BATCH == 0:
                        # A wide fan-out's cancel lets the hub run between batches; the
                        # registry's next message waits (the loop holds it meanwhile).
                        gevent.sleep(0)
            return None
        if kind is Known:
            return self._known.get(message.name)
        if kind is Released:
            self._release(message.ticket)
            return None
        if kind is Withdraw:
            self._withdraw(message)
            return None
        if kind is AdmitResume:
            return self._admit_resume(message)
        if kind is Register:
            self._register(message.provider)
            return None
        if kind is Unregister:
            self._unregister(message.provider)
            return None
        if kind is Subscribe:
            self._subscribe(message)
            return None
        if kind is Unsubscribe:
            self._unsubscribe(message)
            return None
        if kind is Sync:
            return None
        if kind is Providers:
            return list(self._providers.values())
        if kind is GetProvider:
            return self._providers.get(message.name)
        if kind is Emit:
            event = message.event
            # `in` narrows the (final) TypedDicts, where `.get` would not.
            parent_id = event["parent_id"] if "parent_id" in event else None  # noqa: SIM401
            self._fan_out(event, parent_id)
            return None
        raise TypeError(f"RegistryActor does not understand {kind.__name__}")

    # -- providers -------------------------------------------------------------------------------

    def _register(self, provider: SubagentProvider) -> None:
        if not isinstance(provider, SubagentProvider):
            raise TypeError("provider must have name, capabilities, inherits_parent_context, start")
        name = provider.name
        if not isinstance(name, str) or not name:
            raise ValueError("provider name must be a non-empty string")
        if name in self._providers:
            raise SubagentError("DUPLICATE_PROVIDER", f"a provider named {name!r} is registered")
        self._providers[name] = provider
        self._known[name] = provider
        self._fan_out({"type": "subagent/provider-added", "provider": name})

    def _unregister(self, provider: SubagentProvider) -> None:
        if self._providers.get(provider.name) is provider:
            del self._providers[provider.name]
            self._fan_out({"type": "subagent/provider-removed", "provider": provider.name})

    # -- start validation, in the seed's order ---------------------------------------------------

    def _start(self, message: Start) -> object:
        provider, depth = self._check(message.name, message.request, False)
        parent_id = message.parent_id
        if not (
            getattr(provider, "starts_in_place", False) is True
            and not self._waiting_count
            and self._has_slot(parent_id)
            and self.handling_in_place()
        ):
            return self._enqueue(message.ticket, parent_id, provider, depth)
        run_id = self._take_slot(message.ticket, parent_id)
        run, idle = self.run_open(lambda: message.launch(message, provider, run_id, depth))
        if not idle:
            return Launched(run)
        self._run_published(run)
        return run

    def _admit(self, message: Admit) -> Deferred[Admission]:
        provider, depth = self._check(message.name, message.request, message.require_resume)
        return self._enqueue(message.ticket, message.parent_id, provider, depth)

    def _check(
        self, name: str, request: SubagentStartRequest, require_resume: bool
    ) -> tuple[SubagentProvider, int]:
        """The seed's start validation, in its order: the provider and the child's depth."""
        provider = self._providers.get(name)
        if provider is None:
            raise SubagentError("NO_PROVIDER", f"no provider named {name!r}")
        if (  # the usual start asks for no capability: nothing to check against the provider
            request.output_schema is not None
            or request.max_depth is not None
            or request.tool_filter is not None
            or request.persona is not None
            or request.token_budget is not None
            or request.cost_budget is not None
        ):
            _check_capabilities(provider, request)
        if require_resume and not isinstance(provider, Resumable):
            raise SubagentError(
                "UNSUPPORTED_CAPABILITY", f"provider {provider.name!r} cannot resume children"
            )
        max_depth = request.max_depth
        if max_depth is not None:
            # Checked here, after the provider and its capabilities (the seam's order). The type
            # wrong is a TypeError; an int out of the safe domain is a wrong value.
            if not isinstance(max_depth, int) or isinstance(max_depth, bool):
                raise TypeError(f"max_depth must be an int or None, got {max_depth!r}")
            if not 0 <= max_depth <= MAX_SAFE_INTEGER:
                raise ValueError(
                    f"max_depth must be at least 0 and at most 2**53-1, got {max_depth}"
                )
        if request.output_schema is not None:
            check_output_schema(request.output_schema)
        # The child's depth: computed here, once, and carried to the provider in the request.
        depth = child_depth(request.parent)
        if depth > MAX_SAFE_INTEGER:
            raise SubagentDepthError(depth, MAX_SAFE_INTEGER)
        if max_depth is not None and depth > max_depth:
            raise SubagentDepthError(depth, max_depth)
        _check_budget(request)
        return provider, depth

    def _admit_resume(self, message: AdmitResume) -> Deferred[Admission]:
        provider = message.provider
        if not isinstance(provider, Resumable):
            raise SubagentError(
                "UNSUPPORTED_CAPABILITY", f"provider {provider.name!r} cannot resume children"
            )
        return self._enqueue(message.ticket, message.parent_id, provider)

    # -- admission control -------------------------------------------------------------------------

    def _enqueue(
        self,
        ticket: int,
        parent_id: str | None,
        provider: SubagentProvider,
        depth: int | None = None,
    ) -> Deferred[Admission]:
        reply: Deferred[Admission] = Deferred()
        waiting = _Waiting(ticket, parent_id, provider, reply, depth)
        if not self._waiting_count and self._has_slot(parent_id):
            self._grant(waiting)
        else:
            waiting.seq = next(self._seqs)
            self._waiting.setdefault(parent_id, collections.deque()).append(waiting)
            self._waiting_count += 1
        return reply

    def _has_slot(self, parent_id: str | None) -> bool:
        if self._max_total is not None and self._slots.total >= self._max_total:
            return False
        return not (
            self._max_per_parent is not None
            and self._slots.per_parent.get(parent_id, 0) >= self._max_per_parent
        )

    def _grant(self, waiting: _Waiting) -> None:
        run_id = self._take_slot(waiting.ticket, waiting.parent_id)
        waiting.reply.resolve((waiting.provider, run_id, waiting.depth))

    def _take_slot(self, ticket: int, parent_id: str | None) -> str:
        """Hold a slot for `ticket` (one is free); the new run's id."""
        slots = self._slots
        slots.total += 1
        slots.per_parent[parent_id] = slots.per_parent.get(parent_id, 0) + 1
        if slots.total > self.running_peak:
            self.running_peak = slots.total
        self._holders[ticket] = parent_id
        return f"r{next(self._run_ids)}"

    def _release(self, ticket: int) -> None:
        if ticket not in self._holders:
            return
        parent_id = self._holders.pop(ticket)
        slots = self._slots
        slots.total -= 1
        left = slots.per_parent[parent_id] - 1
        if left:
            slots.per_parent[parent_id] = left
        else:
            del slots.per_parent[parent_id]
        self._drain()

    def _drain(self) -> None:
        """Grant waiting starts in FIFO order; a start blocked only by its own parent's cap does
        not hold back other parents' starts. O(parents with waiters) per grant."""
        while self._waiting_count:
            if self._max_total is not None and self._slots.total >= self._max_total:
                return
            best: collections.deque[_Waiting] | None = None
            for parent_id, queue in self._waiting.items():
                if (best is None or queue[0].seq < best[0].seq) and self._has_slot(parent_id):
                    best = queue
            if best is None:
                return
            waiting = best.popleft()
            self._waiting_count -= 1
            if not best:
                del self._waiting[waiting.parent_id]
            self._grant(waiting)

    def _withdraw(self, message: Withdraw) -> None:
        for parent_id, queue in self._waiting.items():
            for waiting in queue:
                if waiting.ticket == message.ticket:
                    queue.remove(waiting)
                    self._waiting_count -= 1
                    if not queue:
                        del self._waiting[parent_id]
                    waiting.reply.reject(
                        SubagentError("ABORTED", f"the start was aborted: {message.reason}")
                    )
                    return
        # Already granted: the caller releases the slot itself.

    # -- the run table ---------------------------------------------------------------------------

    def has_children(self, parent_id: str) -> bool:
        """Whether `parent_id` has live runs. A same-thread read of the table (no message), for
        a caller that only needs to know whether asking is worth it. Conservative: while
        messages are queued (a `Published` among them, perhaps), the answer is yes."""
        return parent_id in self._by_parent or not self.actor_inbox.empty()

    def _run_published(self, run: PublishedRun) -> None:
        run_id = run.run_id
        self._live[run_id] = run
        self._by_parent.setdefault(run.parent_id, {})[run_id] = run
        if self._listeners or run.parent_id in self._parent_listeners:  # else: nobody to tell
            self._fan_out(
                {
                    "type": "subagent/start",
                    "run_id": run_id,
                    "provider": run.provider,
                    "id": run.id,
                    "local": run.local_agent is not None,
                    "parent_id": run.parent_id,
                },
                run.parent_id,
            )
        # Observed only now: a result already settled reports at once, after the start above.
        me = self.actor_ref

        def ended(_future: GeventFuture[SubagentResult]) -> None:
            try:  # noqa: SIM105 - no context manager on this hot path
                me.tell(Ended(run))
            except ActorDeadError:  # the runtime closed meanwhile
                pass

        run.result.add_done_callback(ended)

    def _run_ended(self, run: PublishedRun) -> None:
        if self._live.pop(run.run_id, None) is None:
            return
        siblings = self._by_parent.get(run.parent_id)
        if siblings is not None:
            siblings.pop(run.run_id, None)
            if not siblings:
                del self._by_parent[run.parent_id]
        if self._listeners or run.parent_id in self._parent_listeners:
            self._fan_out(_end_event(run), run.parent_id)
        self._release(run.ticket)

    # -- lifecycle events ----------------------------------------------------------------------

    def _subscribe(self, message: Subscribe) -> None:
        if message.parent_id is None:
            self._listeners.append(message.listener)
        else:
            self._parent_listeners.setdefault(message.parent_id, []).append(message.listener)

    def _unsubscribe(self, message: Unsubscribe) -> None:
        if message.parent_id is None:
            listeners = self._listeners
        else:
            listeners = self._parent_listeners.get(message.parent_id, [])
        if message.listener in listeners:
            listeners.remove(message.listener)
        if message.parent_id is not None and not listeners:
            self._parent_listeners.pop(message.parent_id, None)

    def _fan_out(self, event: LifecycleEvent, parent_id: str | None = None) -> None:
        """Observe-only: a raising listener is logged and the others still run. A run's event
        goes to its parent's listeners too (`parent_id`: the run's parent)."""
        targets = list(self._listeners)
        if parent_id is not None:
            targets.extend(self._parent_listeners.get(parent_id, ()))
        for listener in targets:
            try:
                listener(event)
            except Exception:
                log.exception("subagent lifecycle listener raised; the others still run")


def _check_capabilities(provider: SubagentProvider, request: SubagentStartRequest) -> None:
    """Each start-time option the request uses needs its capability, in the seed's order."""
    caps = provider.capabilities
    for wanted, flag, present in (
        ("output_schema", "output_schema", request.output_schema is not None),
        ("max_depth", "depth_limit", request.max_depth is not None),
        ("tool_filter", "tool_filter", request.tool_filter is not None),
        ("persona", "persona", request.persona is not None),
        ("token_budget", "token_budget", request.token_budget is not None),
        ("cost_budget", "token_budget", request.cost_budget is not None),
    ):
        if present and not getattr(caps, flag):
            raise SubagentError(
                "UNSUPPORTED_CAPABILITY",
                f"provider {provider.name!r} lacks {flag} (needed for {wanted})",
            )


def _check_budget(request: SubagentStartRequest) -> None:
    """A budget is a positive int, and a parent with no tokens left starts no child."""
    budget = request.token_budget
    if budget is not None and (
        not isinstance(budget, int)
        or isinstance(budget, bool)
        or not 0 < budget <= MAX_SAFE_INTEGER
    ):
        raise TypeError(f"token_budget must be a positive int, got {budget!r}")
    cost = request.cost_budget
    if cost is not None and usd_to_pico(cost, "cost_budget") <= 0:
        raise ValueError(f"cost_budget must be a positive number of USD, got {cost!r}")
    account = getattr(request.parent, "usage", None)
    if account is None:
        return
    left = account.remaining()
    cost_left = account.cost_remaining()
    if (left is not None and left <= 0) or (cost_left is not None and cost_left <= 0):
        over = account.exceeded()
        raise SubagentError(
            "BUDGET_EXCEEDED", over.describe_exhausted() if over is not None else None
        )


def _end_event(run: PublishedRun) -> RunEndEvent:
    """The `subagent/end` event of a settled run."""
    outcome = outcome_of(run.result)
    result = None if isinstance(outcome, BaseException) else outcome
    event: RunEndEvent = {
        "type": "subagent/end",
        "run_id": run.run_id,
        "provider": run.provider,
        "id": run.id,
        "local": run.local_agent is not None,
        "parent_id": run.parent_id,
        "stop_reason": "error" if result is None else result.stop_reason,
    }
    if result is None:
        event["failure"] = f"{type(outcome).__name__}: {outcome}"
    else:
        usage = result.extra.get("usage")
        if usage:
            event["usage"] = dict(usage)
        if result.output:
            event["last_assistant_message"] = list(result.output)
    return event
