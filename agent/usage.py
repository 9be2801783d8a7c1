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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Final

from agent.log import events_of_types

__all__ = [
    "PICO",
    "USAGE_KEYS",
    "Price",
    "PriceTable",
    "Usage",
    "UsageAccount",
    "add_usage",
    "check_usage",
    "checked_usage",
    "child_budget",
    "child_cost_budget",
    "cost_of_events",
    "normalize_usage",
    "pack_usage",
    "pico_to_usd",
    "total_tokens",
    "unpack_usage",
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


# A usage packed into one int: the lane of bits [0, _LANE) holds the total, and kind i (in
# `USAGE_KEYS` order) the lane [(i + 1) * _LANE, (i + 2) * _LANE). A response's counts are at most
# `MAX_COUNT` (what the session log can carry), so a lane holds 2**62 responses before it could
# overflow: adding packed usages adds the total and every kind at once. A kind is listed when
# its lane is not 0, or when it was reported with a count of 0: only those (`zeros`, bit i for
# kind i) need a bit of their own, so a charge of non-zero counts (the common case) is one int
# addition per account and nothing else.
_LANE: Final = 128
_LANE_MASK: Final = (1 << _LANE) - 1
_LANES: Final = {key: ((index + 1) * _LANE, 1 << index) for index, key in enumerate(USAGE_KEYS)}
MAX_COUNT: Final = 2**64 - 1

# (total tokens, packed counts, kinds reported with a count of 0): a usage checked once.
CheckedUsage = tuple[int, int, int]


def check_usage(usage: Mapping[str, Any]) -> CheckedUsage | None:
    """`usage` checked and packed once, when it is already normalized (an exact dict of known
    keys and exact ints 0..`MAX_COUNT`: what the adapters hand over), else None.

    One pass per model response: a clean usage is what the session log can append without
    walking it (str keys, ints the strict encoder range-checks) and what `charge_checked` adds
    up the account chain, every kind in one int addition per account.
    """
    if type(usage) is not dict:
        return None
    total = packed = zeros = 0
    for key, value in usage.items():
        lane = _LANES.get(key)
        if lane is None or type(value) is not int or not 0 <= value <= MAX_COUNT:
            return None
        if value:
            total += value
            packed += value << lane[0]
        else:
            zeros |= lane[1]
    return total, packed + total, zeros


class Usage(Mapping[str, int]):
    """One model response's token usage, checked and packed where the adapter made it
    (`checked_usage`), so the agent loop logs and charges it without checking it again: the
    usage path of every step is then two attribute reads and one charge.

    A read-only mapping of its counts. `counts` is the exact dict the log records and
    `checked` what `check_usage` made of it: both may be shared by every response that reports
    the same `Usage` (a scripted model's fixed usage), so neither is ever mutated.
    """

    __slots__ = ("checked", "counts")

    counts: dict[str, int]
    checked: CheckedUsage

    def __init__(self, counts: Mapping[str, int]) -> None:
        own = dict(counts)
        checked = check_usage(own)
        if checked is None:
            raise ValueError(
                f"a usage takes int counts 0..2**64-1 of {', '.join(USAGE_KEYS)}, got {counts!r}"
            )
        _set_counts(self, own)
        _set_checked(self, checked)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Usage is read-only (tried to set {name!r})")

    def __reduce__(self) -> tuple[type[Usage], tuple[dict[str, int]]]:
        return (Usage, (self.counts,))

    def __getitem__(self, key: str) -> int:
        return self.counts[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.counts)

    def __len__(self) -> int:
        return len(self.counts)

    def __repr__(self) -> str:
        return f"Usage({self.counts!r})"


# The slots' own setters (the class refuses `setattr`), for `__init__` and `checked_usage`.
_set_counts: Final = Usage.counts.__set__  # type: ignore[attr-defined]
_set_checked: Final = Usage.checked.__set__  # type: ignore[attr-defined]
_new_usage: Final = Usage.__new__


def checked_usage(counts: Mapping[str, int]) -> Mapping[str, int]:
    """What an adapter hands over as a response's usage: a `Usage` when the log can carry it
    as is, else `counts` unchanged, so the loop's own check refuses it by name as it always
    has (a count beyond 64 bits, a float, an unknown key).

    Takes `counts` over (no copy): the adapter's own dict, made for this response, which it
    does not touch afterwards.
    """
    if type(counts) is Usage:
        return counts
    checked = check_usage(counts)
    if checked is None:
        return counts
    usage = _new_usage(Usage)
    _set_counts(usage, counts)
    _set_checked(usage, checked)
    return usage


def pack_usage(usage: Mapping[str, Any]) -> CheckedUsage:
    """`usage` normalized (`normalize_usage`) and packed: for sums read from logs and usage
    reported by remote children. ValueError for a count or a total a lane cannot hold (2**128
    tokens)."""
    total = packed = zeros = 0
    for key, value in normalize_usage(usage).items():
        if value > _LANE_MASK:
            raise ValueError(f"a token count of {key} beyond 2**128: {value}")
        shift, bit = _LANES[key]
        if value:
            total += value
            packed += value << shift
        else:
            zeros |= bit
    if total > _LANE_MASK:  # the total's lane (0) would carry into the first kind's
        raise ValueError(f"a token total beyond 2**128: {total}")
    return total, packed + total, zeros


def unpack_usage(packed: int, zeros: int) -> dict[str, int]:
    """The usage dict of a packed sum: every kind with a count, and those in `zeros` (reported
    with a count of 0), in `USAGE_KEYS` order."""
    out: dict[str, int] = {}
    for key, (shift, bit) in _LANES.items():
        value = (packed >> shift) & _LANE_MASK
        if value or zeros & bit:
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


# The events that carry a response's usage and cost.
_REPLIES: Final = frozenset({"assistant/message"})


def usage_of_events(events: Iterable[Mapping[str, Any]], seed_length: int = 0) -> dict[str, int]:
    """A session's own usage from its log: the `usage` of its `assistant/message` events.

    Events before `seed_length` were copied from the parent (a fork's seed): the parent paid
    for them, so they never count.
    """
    out: dict[str, int] = {}
    for event in events_of_types(events, _REPLIES, seed_length):
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
    for event in events_of_types(events, _REPLIES, seed_length):
        data = event.get("data")
        cost = data.get("cost_usd") if isinstance(data, Mapping) else None
        if isinstance(cost, (int, float)) and not isinstance(cost, bool) and math.isfinite(cost):
            total += round(cost * PICO)
    return total


ExceededHook = Callable[["UsageAccount"], None]


class UsageAccount:
    """One agent's spend (`own`), its subtree's (`subtree`, total `spent`) and its token
    budget (`limit`); with a price (`price`, its model route's), also its cost (`cost_own`,
    `cost_spent`, in picodollars) and cost budget (`cost_limit`).

    The sums are incremental: a charge adds to its own account and to the descendants' sum of
    each ancestor (O(depth), never a walk of the tree), and `subtree` is own + descendants'
    on read. Not thread-safe: like everything else, it lives on the gevent hub.
    """

    __slots__ = (
        "_fired",
        "cost_limit",
        "cost_own",
        "cost_spent",
        "limit",
        "on_exceeded",
        "owner",
        "packed_below",
        "packed_own",
        "parent",
        "price",
        "zeros_below",
        "zeros_own",
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
        # Own spend and what descendants spent (charged up to here), packed with their totals
        # (`check_usage`), and the kinds reported only as 0: a charge is one int addition per
        # account on the chain, whatever the kinds; `spent`, `own`, `below` and `subtree` are
        # read from the packed sums.
        _, self.packed_own, self.zeros_own = pack_usage(own) if own else (0, 0, 0)
        self.packed_below = 0
        self.zeros_below = 0
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

    @property
    def spent(self) -> int:
        """Tokens this agent and its descendants spent (what a token budget counts)."""
        return (self.packed_own + self.packed_below) & _LANE_MASK

    @property
    def own(self) -> dict[str, int]:
        """This agent's own spend, by kind (a new dict: a snapshot)."""
        return unpack_usage(self.packed_own, self.zeros_own)

    @property
    def below(self) -> dict[str, int]:
        """What its descendants spent, by kind (a snapshot)."""
        return unpack_usage(self.packed_below, self.zeros_below)

    @property
    def subtree(self) -> dict[str, int]:
        """This agent's and its descendants' spend, by kind (a snapshot)."""
        return unpack_usage(self.packed_own + self.packed_below, self.zeros_own | self.zeros_below)

    def over(self) -> bool:
        """Whether this account's own token or cost budget is used up."""
        limit = self.limit
        return (limit is not None and self.spent >= limit) or (
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
        _, packed, zeros = pack_usage(usage)
        self.packed_below += packed
        self.zeros_below |= zeros
        self.cost_spent += cost

    def charge(self, usage: Mapping[str, Any], cost: int | None = None) -> None:
        """Record one model response's usage (and its cost in picodollars: by default what
        `price` makes of it) here and in every ancestor's subtree."""
        if type(usage) is Usage:
            checked: CheckedUsage | None = usage.checked
            usage = usage.counts
        else:
            checked = check_usage(usage)
        if checked is None:
            usage = normalize_usage(usage)
            checked = pack_usage(usage)
        if usage:
            self.charge_checked(checked, usage, cost)

    def charge_checked(
        self, checked: CheckedUsage, usage: Mapping[str, int], cost: int | None = None
    ) -> None:
        """`charge` for a usage `check_usage` accepted (`checked` is what it returned): no
        second check, one int addition per account on the chain and one loop up it (O(depth),
        never a walk of the tree)."""
        if cost is None and self.price is not None:
            cost = self.price.cost(usage)
        if cost:
            _, packed, zeros = checked
            self._charge_cost(packed, zeros, cost)
        else:
            self.charge_tokens(checked)

    def charge_tokens(self, checked: CheckedUsage) -> None:
        """`charge_checked` of a response that costs nothing (no price: the common case), the
        hot path of every model response: per account on the chain, one int addition (the
        packed counts and their total), the zeros or'ed in only when some kind was reported as
        0, and the budget checked only where a hook listens (`on_exceeded` is set on accounts
        with a budget); each account is told it is over its budget before its ancestors count
        the spend."""
        _, packed, zeros = checked
        self.packed_own += packed
        if zeros:
            self.zeros_own |= zeros
        if self.on_exceeded is not None:
            self.check_budget()
        acc = self.parent
        while acc is not None:
            acc.packed_below += packed
            if zeros:
                acc.zeros_below |= zeros
            if acc.on_exceeded is not None:
                acc.check_budget()
            acc = acc.parent

    def _charge_cost(self, packed: int, zeros: int, cost: int) -> None:
        """`charge_checked` of a response with a cost (a priced route)."""
        self.packed_own += packed
        self.zeros_own |= zeros
        self.cost_own += cost
        self.cost_spent += cost
        if self.on_exceeded is not None:
            self.check_budget()
        if self.parent is not None:
            self.parent.add_to_subtree(packed, zeros, cost)

    def charge_remote(self, usage: Mapping[str, Any]) -> None:
        """Count what a remote child (ACP) reported spending against this account's subtree and
        its ancestors' (not its own): known only when the child's turn ends, it counts from the
        next step boundary on."""
        _, packed, zeros = pack_usage(usage)
        self.add_to_subtree(packed, zeros, 0, with_cost_limit=False)

    def add_to_subtree(
        self, packed: int, zeros: int, cost: int, *, with_cost_limit: bool = True
    ) -> None:
        """Count spend of this account's descendants (a packed usage, `pack_usage`, and its
        `cost`) here, then in every ancestor's; an account over its limit is told once, before
        its ancestors count the spend."""
        self.packed_below += packed
        self.zeros_below |= zeros
        if cost:
            self.cost_spent += cost
        if self.limit is not None or (with_cost_limit and self.cost_limit is not None):
            self.check_budget()
        if self.parent is not None:
            self.parent.add_to_subtree(packed, zeros, cost, with_cost_limit=with_cost_limit)

    def check_budget(self) -> None:
        """Tell `on_exceeded`, once, if this account's budget is used up."""
        if not self._fired and self.on_exceeded is not None and self.over():
            self._fired = True
            self.on_exceeded(self)

    def remaining(self) -> int | None:
        """Tokens left before the tightest budget on the chain is used up (None: no budget)."""
        return self._left_on_chain("limit", "spent")

    def cost_remaining(self) -> int | None:
        """Picodollars left before the tightest cost budget on the chain is used up (None: no
        cost budget)."""
        return self._left_on_chain("cost_limit", "cost_spent")

    def _left_on_chain(self, limit_name: str, spent_name: str) -> int | None:
        """The least `limit - spent` (floored at 0) over the accounts of the chain that have a
        limit; read when a child is given its budget, not on the step path."""
        left: int | None = None
        acc: UsageAccount | None = self
        while acc is not None:
            limit = getattr(acc, limit_name)
            if limit is not None:
                here = max(0, limit - getattr(acc, spent_name))
                left = here if left is None else min(left, here)
            acc = acc.parent
        return left

    def exceeded(self) -> UsageAccount | None:
        """The nearest account on the chain (this one first) whose budget is used up."""
        # Checked at every step boundary, mostly on chains with no budget at all: `over`
        # inlined, so an account without one costs two attribute reads.
        acc: UsageAccount | None = self
        while acc is not None:
            limit = acc.limit
            cost_limit = acc.cost_limit
            if (
                limit is not None and (acc.packed_own + acc.packed_below) & _LANE_MASK >= limit
            ) or (cost_limit is not None and acc.cost_spent >= cost_limit):
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
