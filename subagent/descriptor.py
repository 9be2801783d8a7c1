"""The continuable child's durable composition record (`subagent/descriptor` event payload).

A descriptor snapshots explicit fields, never the merge-extensible options object, so an unrelated
option cannot break a cold resume and a new composition input is a deliberate version bump. It
holds no depth (the stored header is the floor) and no output schema (that is an activation's
contract, not the child's composition).

Version 2 adds `token_budget` (the child's budget survives a cold resume). A descriptor without a
budget is still written as version 1, so a runtime that reads only version 1 can resume it.
Version 3 adds `cost_budget` (USD; written only when set, like the token budget).

Parsing distinguishes two failures on purpose: a descriptor of *this* version that is malformed is
a bug or corruption and raises `DescriptorError` naming the field; a descriptor this code cannot
classify (other version, no version, not an object) was perhaps written by a newer runtime, so it
comes back as an `Unclassifiable` value for the caller to report (`NOT_RESUMABLE`), never a crash.

Seam vocabulary: imports nothing of ours but `subagent.types`.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from subagent.errors import DescriptorError
from subagent.types import ToolRestriction

__all__ = [
    "DESCRIPTOR_EVENT",
    "DESCRIPTOR_VERSION",
    "DescriptorError",
    "EventsByType",
    "SubagentDescriptor",
    "Unclassifiable",
    "authoritative_descriptor",
    "parse_descriptor",
]

DESCRIPTOR_VERSION: Final = 3
DESCRIPTOR_EVENT: Final = "subagent/descriptor"

_REQUIRED: Final = ("provider", "label", "model")
_OPTIONAL: Final = ("persona", "tool_filter")
# The fields each readable version may carry.
_KNOWN_KEYS: Final = {
    1: frozenset({"version", *_REQUIRED, *_OPTIONAL}),
    2: frozenset({"version", *_REQUIRED, *_OPTIONAL, "token_budget"}),
    3: frozenset({"version", *_REQUIRED, *_OPTIONAL, "token_budget", "cost_budget"}),
}
_FILTER_KEYS: Final = frozenset({"allow", "deny"})


@dataclass(frozen=True, slots=True)
class Unclassifiable:
    """A descriptor this runtime cannot read (unknown version, not an object): not resumable."""

    reason: str


@dataclass(frozen=True, slots=True)
class SubagentDescriptor:
    """What a cold resume needs to rebuild the child: provider, label, model route, scoping."""

    provider: str
    label: str
    model: str
    persona: str | None = None
    tool_filter: ToolRestriction | None = None
    token_budget: int | None = None
    cost_budget: float | None = None

    def __post_init__(self) -> None:
        # Bad arguments are TypeError / ValueError (DescriptorError is a ValueError).
        for name in _REQUIRED:
            if type(getattr(self, name)) is not str:
                raise TypeError(f"{name} must be a str, got {type(getattr(self, name)).__name__}")
        if self.persona is not None and type(self.persona) is not str:
            raise TypeError(f"persona must be a str or None, got {type(self.persona).__name__}")
        if self.tool_filter is not None and not isinstance(self.tool_filter, ToolRestriction):
            raise TypeError(
                f"tool_filter must be a ToolRestriction or None, "
                f"got {type(self.tool_filter).__name__}"
            )
        if self.token_budget is not None and (
            type(self.token_budget) is not int or self.token_budget < 1
        ):
            raise DescriptorError(
                "token_budget", f"must be a positive integer or null, got {self.token_budget!r}"
            )
        if self.cost_budget is not None and not _positive_usd(self.cost_budget):
            raise DescriptorError(
                "cost_budget", f"must be a positive number or null, got {self.cost_budget!r}"
            )
        _check_values(self)

    @property
    def version(self) -> int:
        """The oldest version that holds every field set (1 unless there is a budget)."""
        if self.cost_budget is not None:
            return 3
        return 1 if self.token_budget is None else 2

    def to_json(self) -> dict[str, Any]:
        """Lossless JSON for the log; optional fields are present only when set."""
        out: dict[str, Any] = {
            "version": self.version,
            "provider": self.provider,
            "label": self.label,
            "model": self.model,
        }
        if self.persona is not None:
            out["persona"] = self.persona
        if self.tool_filter is not None:
            out["tool_filter"] = self.tool_filter.to_json()
        if self.token_budget is not None:
            out["token_budget"] = self.token_budget
        if self.cost_budget is not None:
            out["cost_budget"] = self.cost_budget
        return out


def _positive_usd(value: object) -> bool:
    return (
        type(value) in (int, float)
        and value == value  # not NaN
        and 0 < value < float("inf")  # type: ignore[operator]
    )


def _check_values(d: SubagentDescriptor) -> None:
    if not d.provider:
        raise DescriptorError("provider", "must be a non-empty string")
    if not d.label:
        raise DescriptorError("label", "must be a non-empty string")
    prefix, sep, name = d.model.partition(":")
    if not sep or not prefix or not name or prefix != prefix.strip():
        raise DescriptorError("model", f"must be a model route 'prefix:model', got {d.model!r}")
    if d.tool_filter is not None:
        for key in ("allow", "deny"):
            names = getattr(d.tool_filter, key)
            if names is None:
                continue
            for tool in names:
                if type(tool) is not str or not tool:
                    raise DescriptorError(
                        "tool_filter", f"{key} must list non-empty tool names, got {tool!r}"
                    )


def parse_descriptor(data: object) -> SubagentDescriptor | Unclassifiable:
    """Read a stored descriptor payload.

    Raises `DescriptorError` for a malformed current-version payload; returns `Unclassifiable`
    when the payload is not a versioned object of a version this code knows.
    """
    if not isinstance(data, Mapping):
        return Unclassifiable(f"descriptor is not an object but {type(data).__name__}")
    if "version" not in data:
        return Unclassifiable("descriptor has no version")
    version = data["version"]
    if type(version) is not int:
        return Unclassifiable(f"descriptor version {version!r} is not an integer")
    known = _KNOWN_KEYS.get(version)
    if known is None:
        return Unclassifiable(
            f"descriptor version {version} is not supported (this runtime reads "
            f"{', '.join(map(str, _KNOWN_KEYS))})"
        )
    for key in data:
        if key not in known:
            # Strict on purpose: a new composition input must come with a new version.
            raise DescriptorError(str(key), f"is not a field of a version {version} descriptor")
    for key in _REQUIRED:
        if key not in data:
            raise DescriptorError(key, "is missing")
        if type(data[key]) is not str:
            raise DescriptorError(key, f"must be a string, got {type(data[key]).__name__}")
    persona = data.get("persona")
    if persona is not None and type(persona) is not str:
        raise DescriptorError("persona", f"must be a string or null, got {type(persona).__name__}")
    budget = data.get("token_budget")
    if budget is not None and (type(budget) is not int or budget < 1):
        raise DescriptorError("token_budget", f"must be a positive integer or null, got {budget!r}")
    cost = data.get("cost_budget")
    if cost is not None and not _positive_usd(cost):
        raise DescriptorError("cost_budget", f"must be a positive number or null, got {cost!r}")
    return SubagentDescriptor(
        provider=data["provider"],
        label=data["label"],
        model=data["model"],
        persona=persona,
        tool_filter=_parse_tool_filter(data.get("tool_filter")),
        token_budget=budget,
        cost_budget=None if cost is None else float(cost),
    )


def _parse_tool_filter(raw: object) -> ToolRestriction | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise DescriptorError("tool_filter", f"must be an object or null, got {type(raw).__name__}")
    for key in raw:
        if key not in _FILTER_KEYS:
            raise DescriptorError("tool_filter", f"unknown key {key!r} (allowed: allow, deny)")
    lists: dict[str, tuple[str, ...] | None] = {}
    for key in ("allow", "deny"):
        names = raw.get(key)
        if names is None:
            lists[key] = None
            continue
        if not isinstance(names, list) or not all(type(n) is str and n for n in names):
            raise DescriptorError("tool_filter", f"{key} must be a list of non-empty strings")
        lists[key] = tuple(names)
    return ToolRestriction(allow=lists["allow"], deny=lists["deny"])


@runtime_checkable
class EventsByType(Protocol):
    """A log's events that can be read by type without decoding the others
    (`agent.log.EventView`, what `SessionStore.inspect` returns)."""

    def select(self, types: Collection[str], start: int = 0, /) -> Iterator[Mapping[str, Any]]:
        """The events of `types` from index `start` on, in order."""
        ...


_DESCRIPTOR_ONLY: Final = frozenset({DESCRIPTOR_EVENT})


def authoritative_descriptor(
    events: Iterable[Mapping[str, Any]], seed_length: int
) -> SubagentDescriptor | Unclassifiable | None:
    """The first descriptor after the fork prefix, or None when the log has none.

    Events before `seed_length` were copied from the parent (a fork's seed) and may carry the
    parent's own descriptor, so they never count. Later descriptors never override the first:
    the composition is fixed when the child is created. Stops reading at the first match, so a
    lazily read log is not consumed further. A malformed authoritative payload raises
    `DescriptorError` (an unreadable one is `Unclassifiable`); a later well-formed one does not
    rescue it.
    """
    if type(seed_length) is not int:
        raise TypeError(f"seed_length must be an int, got {type(seed_length).__name__}")
    if seed_length < 0:
        raise ValueError(f"seed_length must be >= 0, got {seed_length}")
    found: Iterable[Mapping[str, Any]]
    if isinstance(events, EventsByType):  # a stored log's view: decodes the descriptors alone
        found = events.select(_DESCRIPTOR_ONLY, seed_length)
    else:
        found = (
            event
            for index, event in enumerate(events)
            if index >= seed_length and event.get("type") == DESCRIPTOR_EVENT
        )
    for event in found:
        data = event.get("data")
        if not isinstance(data, Mapping) or "descriptor" not in data:
            return Unclassifiable("the subagent/descriptor event carries no descriptor payload")
        return parse_descriptor(data["descriptor"])
    return None
