"""The registry actor: one mailbox serializes provider selection, start validation, admission and
lifecycle-event fan-out, so those decisions happen in one order for everyone.

It never waits on a provider: `Admit` answers with the provider once the request passed every
check and a concurrency slot is free; the caller's own greenlet then runs `provider.start` and
reports back with `Published` (or `Released` on failure).
"""

from __future__ import annotations

import collections
import itertools
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from actors.deferred import Deferred
from actors.gevent_actor import GeventActor
from agent.usage import usd_to_pico
from subagent.errors import SubagentDepthError, SubagentError
from subagent.schema import check_output_schema
from subagent.types import Resumable, SubagentProvider, SubagentStartRequest

__all__ = [
    "Admit",
    "Ended",
    "Published",
    "Register",
    "RegistryActor",
    "Released",
    "Subscribe",
    "Unregister",
]

log = logging.getLogger(__name__)

MAX_SAFE_INTEGER = 2**53 - 1

Listener = Callable[[Mapping[str, Any]], None]


@dataclass(frozen=True, slots=True)
class Register:
    provider: SubagentProvider


@dataclass(frozen=True, slots=True)
class Unregister:
    provider: SubagentProvider


@dataclass(frozen=True, slots=True)
class Admit:
    """Validate a start and wait for a slot. Replies `(provider, run_id)`."""

    name: str
    request: SubagentStartRequest
    ticket: int
    parent_id: str | None
    require_resume: bool = False


@dataclass(frozen=True, slots=True)
class AdmitResume:
    """Admission for a resume: a slot, no start-time validation. The provider is resolved by
    the caller, because a stored child resumes even after its provider was unregistered."""

    provider: SubagentProvider
    ticket: int
    parent_id: str | None


@dataclass(frozen=True, slots=True)
class Withdraw:
    """The caller's signal aborted while it waited for a slot."""

    ticket: int
    reason: Any = None


@dataclass(frozen=True, slots=True)
class Released:
    """The start failed after admission: give the slot back, emit nothing."""

    ticket: int


@dataclass(frozen=True, slots=True)
class Published:
    ticket: int
    event: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Ended:
    ticket: int
    event: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Subscribe:
    listener: Listener
    parent_id: str | None = None


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    listener: Listener
    parent_id: str | None = None


@dataclass(frozen=True, slots=True)
class Providers:
    pass


@dataclass(frozen=True, slots=True)
class GetProvider:
    name: str


@dataclass(frozen=True, slots=True)
class Emit:
    """A registry-level event (provider added/removed) or one relayed from elsewhere."""

    event: Mapping[str, Any]


@dataclass(slots=True)
class _Waiting:
    ticket: int
    parent_id: str | None
    provider: SubagentProvider
    reply: Deferred
    run_id: str = ""


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
        self._max_total = max_children
        self._max_per_parent = max_children_per_parent
        self._slots = _Slots()
        self._holders: dict[int, str | None] = {}
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._listeners: list[Listener] = []
        self._parent_listeners: dict[str, list[Listener]] = {}
        self._run_ids = itertools.count(1)
        self.running_peak = 0

    def on_stop(self) -> None:
        """Starts still waiting for a slot will never get one: tell them, never leave them
        hanging."""
        waiting, self._waiting = self._waiting, collections.deque()
        for entry in waiting:
            entry.reply.reject(SubagentError("RUNTIME_CLOSED", "the runtime closed first"))

    def on_receive(self, message: Any) -> Any:
        kind = type(message)
        if kind is Admit:
            return self._admit(message)
        if kind is Published:
            self._fan_out(message.event)
            return None
        if kind is Ended:
            self._fan_out(message.event)
            self._release(message.ticket)
            return None
        if kind is Released:
            self._release(message.ticket)
            return None
        if kind is Withdraw:
            self._withdraw(message)
            return None
        if kind is AdmitResume:
            return self._admit_resume(message)
        if kind is Register:
            return self._register(message.provider)
        if kind is Unregister:
            return self._unregister(message.provider)
        if kind is Subscribe:
            self._subscribe(message)
            return None
        if kind is Unsubscribe:
            self._unsubscribe(message)
            return None
        if kind is Providers:
            return list(self._providers.values())
        if kind is GetProvider:
            return self._providers.get(message.name)
        if kind is Emit:
            self._fan_out(message.event)
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
        self._fan_out({"type": "subagent/provider-added", "provider": name})

    def _unregister(self, provider: SubagentProvider) -> None:
        if self._providers.get(provider.name) is provider:
            del self._providers[provider.name]
            self._fan_out({"type": "subagent/provider-removed", "provider": provider.name})

    # -- start validation, in the seed's order ---------------------------------------------------

    def _admit(self, message: Admit) -> Deferred:
        request = message.request
        provider = self._providers.get(message.name)
        if provider is None:
            raise SubagentError("NO_PROVIDER", f"no provider named {message.name!r}")
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
        if message.require_resume and not isinstance(provider, Resumable):
            raise SubagentError(
                "UNSUPPORTED_CAPABILITY", f"provider {provider.name!r} cannot resume children"
            )
        max_depth = request.max_depth
        if max_depth is not None and (
            not isinstance(max_depth, int)
            or isinstance(max_depth, bool)
            or not 0 <= max_depth <= MAX_SAFE_INTEGER
        ):
            raise TypeError(f"max_depth must be a non-negative int, got {max_depth!r}")
        if request.output_schema is not None:
            check_output_schema(request.output_schema)
        parent_depth = getattr(request.parent, "depth", 0)
        attempted = parent_depth + 1
        if attempted > MAX_SAFE_INTEGER:
            raise SubagentDepthError(attempted, MAX_SAFE_INTEGER)
        if max_depth is not None and attempted > max_depth:
            raise SubagentDepthError(attempted, max_depth)
        _check_budget(request)
        return self._enqueue(message.ticket, message.parent_id, provider)

    def _admit_resume(self, message: AdmitResume) -> Deferred:
        provider = message.provider
        if not isinstance(provider, Resumable):
            raise SubagentError(
                "UNSUPPORTED_CAPABILITY", f"provider {provider.name!r} cannot resume children"
            )
        return self._enqueue(message.ticket, message.parent_id, provider)

    # -- admission control -------------------------------------------------------------------------

    def _enqueue(self, ticket: int, parent_id: str | None, provider: SubagentProvider) -> Deferred:
        reply = Deferred()
        waiting = _Waiting(ticket, parent_id, provider, reply)
        if not self._waiting and self._has_slot(parent_id):
            self._grant(waiting)
        else:
            self._waiting.append(waiting)
        return reply

    def _has_slot(self, parent_id: str | None) -> bool:
        if self._max_total is not None and self._slots.total >= self._max_total:
            return False
        return not (
            self._max_per_parent is not None
            and self._slots.per_parent.get(parent_id, 0) >= self._max_per_parent
        )

    def _grant(self, waiting: _Waiting) -> None:
        slots = self._slots
        slots.total += 1
        slots.per_parent[waiting.parent_id] = slots.per_parent.get(waiting.parent_id, 0) + 1
        self.running_peak = max(self.running_peak, slots.total)
        self._holders[waiting.ticket] = waiting.parent_id
        waiting.reply.resolve((waiting.provider, f"r{next(self._run_ids)}"))

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
        not hold back other parents' starts."""
        if not self._waiting:
            return
        kept: collections.deque[_Waiting] = collections.deque()
        while self._waiting:
            waiting = self._waiting.popleft()
            if self._max_total is not None and self._slots.total >= self._max_total:
                kept.append(waiting)
                kept.extend(self._waiting)
                self._waiting.clear()
                break
            if self._has_slot(waiting.parent_id):
                self._grant(waiting)
            else:
                kept.append(waiting)
        self._waiting = kept

    def _withdraw(self, message: Withdraw) -> None:
        for waiting in self._waiting:
            if waiting.ticket == message.ticket:
                self._waiting.remove(waiting)
                waiting.reply.reject(
                    SubagentError("ABORTED", f"the start was aborted: {message.reason}")
                )
                return
        # Already granted: the caller releases the slot itself.

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

    def _fan_out(self, event: Mapping[str, Any]) -> None:
        """Observe-only: a raising listener is logged and the others still run."""
        targets = list(self._listeners)
        parent_id = event.get("parent_id")
        if parent_id is not None:
            targets.extend(self._parent_listeners.get(parent_id, ()))
        for listener in targets:
            try:
                listener(event)
            except Exception:
                log.exception("subagent lifecycle listener raised; the others still run")


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
