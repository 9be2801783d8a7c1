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

import json
import math
import os
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Final

__all__ = [
    "PICO",
    "USAGE_KEYS",
    "Price",
    "PriceTable",
    "UsageAccount",
    "add_usage",
    "child_budget",
    "child_cost_budget",
    "cost_of_events",
    "normalize_usage",
    "pico_to_usd",
    "total_tokens",
    "usage_of_events",
    "usd_to_pico",
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


# Cost is counted in picodollars (1e-12 USD), as ints: a price of P USD per million tokens is
# P * 1e6 picodollars per token, exact for prices with up to six decimals, so sums and budget
# checks never drift the way float sums would.
PICO: Final = 10**12
_PRICE_FIELDS: Final = ("input", "output", "cache_read", "cache_write")


def usd_to_pico(usd: float | int | str | Decimal, what: str = "cost budget") -> int:
    """`usd` (a non-negative finite amount) in picodollars, rounded down."""
    if isinstance(usd, bool) or not isinstance(usd, (int, float, str, Decimal)):
        raise TypeError(f"a {what} must be a number of USD, got {usd!r}")
    try:
        value = Decimal(str(usd))
    except InvalidOperation:
        raise ValueError(f"a {what} must be a number of USD, got {usd!r}") from None
    if not value.is_finite() or value < 0:
        raise ValueError(f"a {what} must be a non-negative, finite number of USD, got {usd!r}")
    return int(value * PICO)


def pico_to_usd(pico: int) -> float:
    """Picodollars as USD (for display and JSON; sums stay in picodollars)."""
    return pico / PICO


@dataclass(frozen=True)
class Price:
    """What one model route costs, in USD per million tokens of each kind."""

    input: float
    output: float
    cache_read: float = 0.0
    cache_write: float = 0.0
    _rates: tuple[int, int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rates = []
        for name in _PRICE_FIELDS:
            per_million = usd_to_pico(getattr(self, name), f"price's {name}")
            # pico per token = USD per Mtok * 1e6; the division is exact up to 6 decimals.
            if per_million % 10**6:
                raise ValueError(
                    f"a price's {name} has more than six decimals: {getattr(self, name)!r}"
                )
            rates.append(per_million // 10**6)
        object.__setattr__(self, "_rates", tuple(rates))

    @classmethod
    def from_json(cls, data: object, route: str = "") -> Price:
        """A price from a `{input, output, cache_read?, cache_write?}` mapping."""
        if not isinstance(data, Mapping):
            raise ValueError(f"the price of {route!r} must be a table, got {data!r}")
        unknown = set(data) - set(_PRICE_FIELDS)
        missing = {"input", "output"} - set(data)
        if unknown or missing:
            raise ValueError(
                f"the price of {route!r} needs input and output (USD per million tokens) and "
                f"may have cache_read and cache_write; unknown: {sorted(unknown)}, "
                f"missing: {sorted(missing)}"
            )
        return cls(**{k: data[k] for k in data})

    def cost(self, usage: Mapping[str, Any]) -> int:
        """The picodollars one response's usage cost."""
        rate_in, rate_out, rate_read, rate_write = self._rates
        total = 0
        value = usage.get("input_tokens")
        if type(value) is int:
            total += value * rate_in
        value = usage.get("output_tokens")
        if type(value) is int:
            total += value * rate_out
        value = usage.get("cache_read_input_tokens")
        if type(value) is int:
            total += value * rate_read
        value = usage.get("cache_creation_input_tokens")
        if type(value) is int:
            total += value * rate_write
        return total


class PriceTable:
    """Prices by model route: an exact route (`anthropic:claude-sonnet-4-5`) wins over its
    prefix's wildcard (`anthropic:*`). A route with neither has no price."""

    __slots__ = ("_prices",)

    def __init__(self, prices: Mapping[str, Price | Mapping[str, Any]] | None = None) -> None:
        self._prices: dict[str, Price] = {}
        for route, price in (prices or {}).items():
            if not isinstance(route, str) or ":" not in route or route.startswith(":"):
                raise ValueError(f"a price table key must be a route 'prefix:model', got {route!r}")
            self._prices[route] = (
                price if isinstance(price, Price) else Price.from_json(price, route)
            )

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PriceTable:
        """A table from a JSON or TOML file (by suffix: `.toml` is TOML, anything else JSON)
        mapping routes to `{input, output, cache_read, cache_write}`."""
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        try:
            data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
        except (ValueError, tomllib.TOMLDecodeError) as exc:
            raise ValueError(f"{path}: not a valid price table: {exc}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: a price table maps routes to prices")
        return cls(data)

    def __len__(self) -> int:
        return len(self._prices)

    def __contains__(self, route: object) -> bool:
        return isinstance(route, str) and self.get(route) is not None

    def get(self, route: str) -> Price | None:
        """The price of `route`, or None when the table has none."""
        price = self._prices.get(route)
        if price is None:
            prefix, _, _ = route.partition(":")
            price = self._prices.get(prefix + ":*")
        return price


def cost_of_events(events: Iterable[Mapping[str, Any]], seed_length: int = 0) -> int:
    """A session's own cost in picodollars from its log (`cost_usd` of its responses)."""
    total = 0
    for index, event in enumerate(events):
        if index < seed_length or event.get("type") != "assistant/message":
            continue
        data = event.get("data")
        cost = data.get("cost_usd") if isinstance(data, Mapping) else None
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost):
            total += round(cost * PICO)
    return total


ExceededHook = Callable[["UsageAccount"], None]


class UsageAccount:
    """One agent's spend (`own`), its subtree's (`subtree`) and its token budget (`limit`);
    with a price (`price`, its model route's), also its cost (`cost_own`, `cost_spent`, in
    picodollars) and cost budget (`cost_limit`).

    Not thread-safe: like everything else, it lives on the gevent hub.
    """

    __slots__ = (
        "_fired",
        "cost_limit",
        "cost_own",
        "cost_spent",
        "limit",
        "on_exceeded",
        "own",
        "owner",
        "parent",
        "price",
        "spent",
        "subtree",
    )

    def __init__(
        self,
        *,
        owner: str = "",
        own: Mapping[str, int] | None = None,
        limit: int | None = None,
        price: Price | None = None,
        cost_own: int = 0,
        cost_limit: int | None = None,
    ) -> None:
        if limit is not None and (type(limit) is not int or limit < 0):
            raise ValueError(f"a token budget must be a non-negative int, got {limit!r}")
        if cost_limit is not None and (type(cost_limit) is not int or cost_limit < 0):
            raise ValueError(f"a cost budget must be non-negative picodollars, got {cost_limit!r}")
        self.owner = owner
        self.own: dict[str, int] = dict(own or {})
        self.subtree: dict[str, int] = dict(self.own)
        self.spent = total_tokens(self.subtree)
        self.limit = limit
        self.price = price
        self.cost_own = cost_own
        self.cost_spent = cost_own
        self.cost_limit = cost_limit
        self.parent: UsageAccount | None = None
        # Called once, on the charge that takes `spent` to the limit or past it.
        self.on_exceeded: ExceededHook | None = None
        self._fired = False

    def __repr__(self) -> str:
        return f"<UsageAccount {self.owner} spent={self.spent} limit={self.limit}>"

    def over(self) -> bool:
        """Whether this account's own token or cost budget is used up."""
        return (self.limit is not None and self.spent >= self.limit) or (
            self.cost_limit is not None and self.cost_spent >= self.cost_limit
        )

    def describe_exhausted(self) -> str:
        """The diagnostic of a turn this account's budget stopped."""
        who = self.owner or "this agent"
        if self.limit is not None and self.spent >= self.limit:
            return (
                f"token budget exhausted: the subtree of {who} spent "
                f"{self.spent} of its {self.limit} tokens"
            )
        return (
            f"cost budget exhausted: the subtree of {who} spent "
            f"${pico_to_usd(self.cost_spent):.6f} of its ${pico_to_usd(self.cost_limit or 0):.6f}"
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

    def add_subtree(self, usage: Mapping[str, Any], cost: int = 0) -> None:
        """Count spend that happened below this account before it was live (a cold resume)."""
        add_usage(self.subtree, usage)
        self.spent = total_tokens(self.subtree)
        self.cost_spent += cost

    def charge(self, usage: Mapping[str, Any], cost: int | None = None) -> None:
        """Record one model response's usage (and its cost in picodollars: by default what
        `price` makes of it) here and in every ancestor's subtree."""
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
        if cost is None:
            cost = 0 if self.price is None else self.price.cost(usage)
        self.cost_own += cost
        self.add_to_subtree(usage, total, cost)

    def charge_remote(self, usage: Mapping[str, Any]) -> None:
        """Count what a remote child (ACP) reported spending against this account's subtree and
        its ancestors' (not its own): known only when the child's turn ends, it counts from the
        next step boundary on."""
        usage = normalize_usage(usage)
        self.add_to_subtree(usage, total_tokens(usage), 0, with_cost_limit=False)

    def add_to_subtree(
        self, usage: Mapping[str, int], total: int, cost: int, *, with_cost_limit: bool = True
    ) -> None:
        """Count spend of this account's subtree (normalized `usage`, its token `total`, its
        `cost`) here, then in every ancestor's; an account over its limit is told once."""
        subtree = self.subtree
        for key, value in usage.items():
            subtree[key] = subtree.get(key, 0) + value
        self.spent += total
        self.cost_spent += cost
        limited = self.limit is not None or (with_cost_limit and self.cost_limit is not None)
        if limited and not self._fired and self.over():
            self._exhausted()
        if self.parent is not None:
            self.parent.add_to_subtree(usage, total, cost, with_cost_limit=with_cost_limit)

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

    def cost_remaining(self) -> int | None:
        """Picodollars left before the tightest cost budget on the chain is used up (None: no
        cost budget)."""
        left: int | None = None
        acc: UsageAccount | None = self
        while acc is not None:
            if acc.cost_limit is not None:
                here = max(0, acc.cost_limit - acc.cost_spent)
                left = here if left is None else min(left, here)
            acc = acc.parent
        return left

    def exceeded(self) -> UsageAccount | None:
        """The nearest account on the chain (this one first) whose budget is used up."""
        acc: UsageAccount | None = self
        while acc is not None:
            if acc.over():
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


def child_cost_budget(parent: UsageAccount | None, requested: int | None) -> int | None:
    """A child's cost budget (picodollars): as asked, never more than the parent has left."""
    if requested is None:
        return None
    left = None if parent is None else parent.cost_remaining()
    return requested if left is None else min(requested, left)
