"""The model's chat history, read from the session log (canonical message dicts, see agent.model).

The conversation is held once: by the log, as the encoded frames of its `user/message`,
`assistant/message` and `tool/result` events. `Conversation` keeps only where those events sit
(an array of seqs, no Python object per message) and builds each message dict when it is read,
so a model request views the conversation instead of copying it, the history costs the cyclic
collector nothing per message, and what a request sees is exactly what the log holds.
Log-only events (request headers, descriptors, inbox accounting, seed markers) never reach the
model.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

from agent.log import event_positions, events_of_types

__all__ = [
    "MESSAGE_TYPES",
    "Conversation",
    "HistoryView",
    "history_from_events",
    "last_turn_number",
    "message_of",
    "with_tool_calls",
]

# The event types that are conversation messages (the rest of the log is not shown to a model).
MESSAGE_TYPES: frozenset[str] = frozenset({"user/message", "assistant/message", "tool/result"})


def message_of(event: Mapping[str, Any]) -> dict[str, Any]:
    """The canonical message an event of `MESSAGE_TYPES` stands for (a new dict each call)."""
    kind = event["type"]
    data = event["data"]
    if kind == "tool/result":
        return {
            "role": "tool",
            "tool_call_id": data["call_id"],
            "name": data["name"],
            "content": data["content"],
            "is_error": data["is_error"],
        }
    message = data["message"]
    if kind == "user/message":
        return {"role": "user", "content": message["content"]}
    entry: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if message.get("tool_calls"):
        entry["tool_calls"] = message["tool_calls"]
    return entry


class Conversation(Sequence[dict[str, Any]]):
    """The messages of a session, as positions in its log's events.

    Grows only by `note` (the loop calls it with each message event it appended); earlier
    messages never change, so a `view()` taken for one model request keeps showing exactly
    that request's conversation. Each read decodes a fresh copy from the log: a model adapter
    can mutate what it is given without touching the record.
    """

    __slots__ = ("_events", "_seqs")

    def __init__(self, events: Sequence[Mapping[str, Any]]) -> None:
        self._events = events
        # A log's view finds its loaded messages without decoding them.
        self._seqs = event_positions(events, MESSAGE_TYPES)

    def note(self, event: Mapping[str, Any]) -> None:
        """Record that `event` (just appended to the log) is the conversation's next message."""
        self._seqs.append(event["seq"])

    @property
    def note_seq(self) -> Callable[[int], None]:
        """`note` by seq: the bound append of the positions (the loop's hot path calls it)."""
        return self._seqs.append

    def view(self) -> HistoryView:
        """The conversation as it is now: later messages stay outside the view."""
        return HistoryView(self, len(self._seqs))

    def __len__(self) -> int:
        return len(self._seqs)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        events = self._events
        if isinstance(index, slice):
            return [message_of(events[seq]) for seq in self._seqs[index]]
        return message_of(events[self._seqs[index]])

    def __iter__(self) -> Iterator[dict[str, Any]]:
        events = self._events
        for seq in self._seqs:
            yield message_of(events[seq])

    def __repr__(self) -> str:
        return f"<Conversation of {len(self)} messages>"


class HistoryView(Sequence[dict[str, Any]]):
    """The first `length` messages of a conversation, without copying them.

    The conversation only ever grows by appending (earlier messages are never changed), so a
    view taken for a model request stays exactly what the request saw, at O(1) per step instead
    of a copy of the whole conversation per step (O(n^2) over a long turn)."""

    __slots__ = ("_items", "_length")

    def __init__(self, items: Sequence[dict[str, Any]], length: int | None = None) -> None:
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
            return [self._items[i] for i in range(*index.indices(self._length))]
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("history index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        items = self._items
        for i in range(self._length):
            yield items[i]

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
    """The conversation of `events` as a list (a copy: for readers of a stored log)."""
    return [message_of(event) for event in events if event["type"] in MESSAGE_TYPES]


def last_turn_number(events: Iterable[Mapping[str, Any]]) -> int:
    turn = 0
    for event in events_of_types(events, _TURN_START):
        turn = event["data"]["turn"]
    return turn


_TURN_START = frozenset({"turn/start"})


def with_tool_calls(
    events: Iterable[Mapping[str, Any]],
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """`(type, data)` of each event, with the steps and tool calls told the same way in every
    log format.

    Format-2 and -3 logs write no `tool/call` event: an assistant/message's `tool_calls` open its
    calls. For readers that show calls one by one (`subagent log`, the ACP `session/load`
    replay), this yields a `tool/call` `{call_id, name, arguments}` right after each
    assistant/message for each call it names, and skips a format-1 log's own `tool/call`
    event of a call its message already named. Format-3 logs write no `step/start` either: a
    `step/start` `{turn, step}` is yielded where the step began, before its steers, its request
    header and its reply (a step begins after the turn's prompt or after the previous step's
    last answer), so every format reads the same.
    """
    named: set[str] = set()
    open_calls: set[object] = set()
    turn: object = 0
    step = 0
    prompt = False  # the next user/message is the turn's prompt
    pending = False  # a step begins at the next user/message or reply (format 3)
    replied = False  # the current step has its reply
    for event in events:
        kind = event["type"]
        data = event["data"]
        if kind == "tool/call":
            if data.get("call_id") in named:
                continue
        elif kind == "turn/start":
            named.clear()
            open_calls.clear()
            turn = data.get("turn")
            step = 0
            prompt = True
            pending = replied = False
        elif kind == "step/start":
            step = data.get("step") if type(data.get("step")) is int else step + 1
            pending = replied = prompt = False
        elif kind == "request/header":
            if pending:  # the step's request header (format 3): the step has begun
                step += 1
                pending = False
                yield "step/start", {"turn": turn, "step": step}
        elif kind == "user/message":
            if prompt:
                prompt = False
                pending = True
            elif pending:
                step += 1
                pending = False
                yield "step/start", {"turn": turn, "step": step}
        elif kind == "assistant/message":
            if pending or replied or prompt:
                step += 1
                yield "step/start", {"turn": turn, "step": step}
            pending = prompt = False
            replied = True
        elif kind == "tool/result":
            open_calls.discard(data.get("call_id"))
            if replied and not open_calls:
                pending = True
                replied = False
        elif kind == "turn/end":
            pending = replied = prompt = False
        yield kind, data
        if kind == "assistant/message":
            message = data.get("message")
            calls = message.get("tool_calls") if isinstance(message, Mapping) else None
            for call in calls or ():
                if isinstance(call, Mapping):
                    named.add(call.get("id"))  # type: ignore[arg-type]
                    open_calls.add(call.get("id"))
                    yield (
                        "tool/call",
                        {
                            "call_id": call.get("id"),
                            "name": call.get("name"),
                            "arguments": call.get("arguments", {}),
                        },
                    )
