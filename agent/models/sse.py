"""Server-sent events, parsed line by line (the subset of the WHATWG rules that model APIs use)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SSEEvent", "SSEParser"]


@dataclass(frozen=True, slots=True)
class SSEEvent:
    event: str
    data: str


class SSEParser:
    """Feed decoded lines (with or without their line ending); an event comes out at the blank
    line that ends it. Comments (`:`), `id:` and `retry:` are ignored."""

    __slots__ = ("_data", "_event")

    def __init__(self) -> None:
        self._data: list[str] = []
        self._event = ""

    def feed(self, line: str) -> SSEEvent | None:
        line = line.rstrip("\r\n")
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None
        name, sep, value = line.partition(":")
        if sep and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        return None

    def flush(self) -> SSEEvent | None:
        """The event left open when the stream ended without a final blank line."""
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return SSEEvent(event or "message", "\n".join(data))
