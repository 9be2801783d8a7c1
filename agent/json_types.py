"""The type of JSON values, for the type checker.

Content blocks, event data and message sources are plain JSON-native dicts at run time (they
cross msgpack, ACP and Ray unchanged; `agent.jsoncheck` checks them where they are logged).
These aliases say so in signatures, in place of `Any`: a reader sees that the value is data,
and mypy that nothing but JSON goes in. Read-only shapes (`Sequence`, `Mapping`) so that a
caller's `list[dict[str, str]]` is one too, without a copy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

__all__ = ["JsonObject", "JsonValue"]

JsonValue: TypeAlias = (
    "bool | int | float | str | Sequence[JsonValue] | Mapping[str, JsonValue] | None"
)
# One JSON object: a content block, an event's data, a message source.
JsonObject: TypeAlias = Mapping[str, JsonValue]
