"""Token usage: one normalized shape for every model, summed per session and per subtree.

A model response's `usage` uses these keys (any may be absent): `input_tokens` (input not read
from a prompt cache), `output_tokens`, `cache_creation_input_tokens`, `cache_read_input_tokens`
(the Anthropic convention; the OpenAI adapter splits `prompt_tokens` into uncached and cached
parts). The four are disjoint, so `total_tokens` is their sum, and a token budget counts that
total.

`UsageAccount` is one agent's ledger: its own spend, its subtree's spend (its own plus every
descendant's, charged up the chain as it happens), and an optional limit. The agent loop charges
each response and checks `exceeded()` at every step boundary; the subagent layer links a child's
account to its parent's, so a descendant's spend counts against every ancestor's budget and a
child can never spend more than its parent has left.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

__all__ = [
    "USAGE_KEYS",
    "UsageAccount",
    "add_usage",
    "child_budget",
    "normalize_usage",
    "total_tokens",
    "usage_of_events",
]

USAGE_KEYS: Final = (
    "input_tokens",
    "output_tokens",
    "cache_creation_input_tokens",
    "cache_read_input_tokens",
)
_KNOWN: Final = frozenset(USAGE_KEYS)


def normalize_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """The known, non-negative integer counts of `usage` (anything else is dropped)."""
    out: dict[str, int] = {}
    for key in USAGE_KEYS:
        value = usage.get(key)
        if type(value) is int and value >= 0:
            out[key] = value
    return out


def add_usage(into: dict[str, int], usage: Mapping[str, Any]) -> None:
    """Add the known integer counts of `usage` to `into`, in place."""
    for key in USAGE_KEYS:
        value = usage.get(key)
        if type(value) is int:
            into[key] = into.get(key, 0) + value


def total_tokens(usage: Mapping[str, Any]) -> int:
    """Every token the usage counts (the four kinds are disjoint)."""
    total = 0
    for key in USAGE_KEYS:
        value = usage.get(key)
        if type(value) is int:
            total += value
    return total


def usage_of_events(events: Iterable[Mapping[str, Any]], seed_length: int = 0) -> dict[str, int]:
    """A session's own usage from its log: the `usage` of its `assistant/message` events.

    Events before `seed_length` were copied from the parent (a fork's seed): the parent paid
    for them, so they never count.
    """
    out: dict[str, int] = {}
    for index, event in enumerate(events):
        if index < seed_length or event.get("type") != "assistant/message":
            continue
        data = event.get("data")
        usage = data.get("usage") if isinstance(data, Mapping) else None
        if isinstance(usage, Mapping):
            add_usage(out, usage)
    return out


ExceededHook = Callable[["UsageAccount"], None]


class UsageAccount:
    """One agent's spend (`own`), its subtree's (`subtree`) and its token budget (`limit`).

    Not thread-safe: like everything else, it lives on the gevent hub.
    """

    __slots__ = ("_fired", "limit", "on_exceeded", "own", "owner", "parent", "spent", "subtree")

    def __init__(
        self,
        *,
        owner: str = "",
        own: Mapping[str, int] | None = None,
        limit: int | None = None,
    ) -> None:
        if limit is not None and (type(limit) is not int or limit < 0):
            raise ValueError(f"a token budget must be a non-negative int, got {limit!r}")
        self.owner = owner
        self.own: dict[str, int] = dict(own or {})
        self.subtree: dict[str, int] = dict(self.own)
        self.spent = total_tokens(self.subtree)
        self.limit = limit
        self.parent: UsageAccount | None = None
        # Called once, on the charge that takes `spent` to the limit or past it.
        self.on_exceeded: ExceededHook | None = None
        self._fired = False

    def __repr__(self) -> str:
        return f"<UsageAccount {self.owner} spent={self.spent} limit={self.limit}>"

    def describe_exhausted(self) -> str:
        """The diagnostic of a turn this account's budget stopped."""
        return (
            f"token budget exhausted: the subtree of {self.owner or 'this agent'} spent "
            f"{self.spent} of its {self.limit} tokens"
        )

    def attach(self, parent: UsageAccount) -> None:
        """Count this account's future spend against `parent` and its ancestors too.

        What was spent before attaching is not carried up: the parent already counted it (it
        was live then) or read it from the logs when it was rebuilt.
        """
        acc: UsageAccount | None = parent
        while acc is not None:
            if acc is self:
                raise ValueError("a usage account cannot be its own ancestor")
            acc = acc.parent
        self.parent = parent

    def add_subtree(self, usage: Mapping[str, Any]) -> None:
        """Count spend that happened below this account before it was live (a cold resume)."""
        add_usage(self.subtree, usage)
        self.spent = total_tokens(self.subtree)

    def charge(self, usage: Mapping[str, Any]) -> None:
        """Record one model response's usage here and in every ancestor's subtree."""
        # On the hot path (every model response): adapters hand over normalized usage, so one
        # pass validates and totals it; anything else is normalized first (the slow path).
        total = 0
        for key, value in usage.items():
            if type(value) is not int or key not in _KNOWN:
                usage = normalize_usage(usage)
                total = total_tokens(usage)
                break
            total += value
        if not usage:
            return
        own = self.own
        for key, value in usage.items():
            own[key] = own.get(key, 0) + value
        self.add_to_subtree(usage, total)

    def add_to_subtree(self, usage: Mapping[str, int], total: int) -> None:
        """Count usage spent in this account's subtree here, then in every ancestor's."""
        subtree = self.subtree
        for key, value in usage.items():
            subtree[key] = subtree.get(key, 0) + value
        self.spent += total
        if self.limit is not None and self.spent >= self.limit and not self._fired:
            self._exhausted()
        if self.parent is not None:
            self.parent.add_to_subtree(usage, total)

    def _exhausted(self) -> None:
        if self.on_exceeded is not None:
            self._fired = True
            self.on_exceeded(self)

    def remaining(self) -> int | None:
        """Tokens left before the tightest budget on the chain is used up (None: no budget)."""
        left: int | None = None
        acc: UsageAccount | None = self
        while acc is not None:
            if acc.limit is not None:
                here = max(0, acc.limit - acc.spent)
                left = here if left is None else min(left, here)
            acc = acc.parent
        return left

    def exceeded(self) -> UsageAccount | None:
        """The nearest account on the chain (this one first) whose budget is used up."""
        acc: UsageAccount | None = self
        while acc is not None:
            if acc.limit is not None and acc.spent >= acc.limit:
                return acc
            acc = acc.parent
        return None


def child_budget(parent: UsageAccount | None, requested: int | None) -> int | None:
    """The budget a child gets: what was asked for, never more than the parent has left.

    With no request the child has no budget of its own; its parent's still holds it, since its
    account is on the child's chain.
    """
    if requested is None:
        return None
    left = None if parent is None else parent.remaining()
    return requested if left is None else min(requested, left)
