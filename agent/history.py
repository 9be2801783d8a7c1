"""Fold a session log into the model's chat history (canonical message dicts, see agent.model).

Log-only events (request headers, descriptors, inbox accounting, seed markers) never reach the
model: only user, assistant and tool-result messages do.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

__all__ = ["HistoryView", "history_from_events", "last_turn_number"]


class HistoryView(Sequence[dict[str, Any]]):
    """The first `length` messages of an agent's history, without copying them.

    The history only ever grows by appending (earlier entries are never changed), so a view
    taken for a model request stays exactly what the request saw, at O(1) per step instead of
    a copy of the whole conversation per step (O(n^2) over a long turn)."""

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[dict[str, Any]], length: int | None = None) -> None:
        self._items = items
        self._length = len(items) if length is None else length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return self._items[: self._length][index]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("history index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return itertools.islice(self._items, self._length)

    def __reversed__(self) -> Iterator[dict[str, Any]]:
        items = self._items
        for i in range(self._length - 1, -1, -1):
            yield items[i]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (HistoryView, list, tuple)):
            return len(other) == self._length and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(list(self))


def history_from_events(events: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = []
    for event in events:
        kind = event["type"]
        data = event["data"]
        if kind == "user/message":
            message = data["message"]
            history.append({"role": "user", "content": message["content"]})
        elif kind == "assistant/message":
            message = data["message"]
            entry: dict[str, Any] = {"role": "assistant", "content": message["content"]}
            if message.get("tool_calls"):
                entry["tool_calls"] = message["tool_calls"]
            history.append(entry)
        elif kind == "tool/result":
            history.append(
                {
                    "role": "tool",
                    "tool_call_id": data["call_id"],
                    "name": data["name"],
                    "content": data["content"],
                    "is_error": data["is_error"],
                }
            )
    return history


def last_turn_number(events: Iterable[Mapping[str, Any]]) -> int:
    turn = 0
    for event in events:
        if event["type"] == "turn/start":
            turn = event["data"]["turn"]
    return turn
