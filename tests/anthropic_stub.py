"""An Anthropic Messages-compatible stub on 127.0.0.1, for the adapter and CLI tests.

The same raw server as `openai_stub` (every byte under a behaviour's control); what differs is
the wire format: named SSE events (`event: message_start` ...), `POST /v1/messages`, and the base
URL without `/v1` (as `ANTHROPIC_BASE_URL` is).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from openai_stub import SSE_HEAD, Behaviour, Conn, OpenAIStub, StubRequest, status

__all__ = [
    "AnthropicStub",
    "Behaviour",
    "Conn",
    "StubRequest",
    "drop_after",
    "message_events",
    "overloaded",
    "status",
    "stream",
    "text_message",
    "tool_use_message",
]

Usage = Mapping[str, int]
DEFAULT_USAGE: Usage = {"input_tokens": 12, "output_tokens": 1}


def named(conn: Conn, event: Mapping[str, Any]) -> None:
    """One SSE event named after its `type`, as the Messages API sends them."""
    conn.chunk(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())


def message_events(
    blocks: Iterable[tuple[str, Any]],
    stop_reason: str | None = "end_turn",
    *,
    usage: Usage = DEFAULT_USAGE,
    output_tokens: int = 5,
    stop: bool = True,
) -> list[dict[str, Any]]:
    """A streamed message: blocks are ("text", [parts]) or ("tool_use", (id, name, [json
    parts])); `usage` goes in message_start, `output_tokens` in message_delta."""
    events: list[dict[str, Any]] = [
        {
            "type": "message_start",
            "message": {
                "id": "msg_stub",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "stub",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": dict(usage),
            },
        },
        {"type": "ping"},
    ]
    for index, (kind, spec) in enumerate(blocks):
        if kind == "text":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "text", "text": ""},
                }
            )
            for part in spec:
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "text_delta", "text": part},
                    }
                )
        else:
            cid, name, parts = spec
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {"type": "tool_use", "id": cid, "name": name, "input": {}},
                }
            )
            for part in parts:
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": part},
                    }
                )
        events.append({"type": "content_block_stop", "index": index})
    if stop_reason is not None:
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                "usage": {"output_tokens": output_tokens},
            }
        )
    if stop:
        events.append({"type": "message_stop"})
    return events


def stream(events: Iterable[Mapping[str, Any]]) -> Behaviour:
    """A 200 event stream of exactly these events."""
    items = list(events)

    def run(_req: StubRequest, conn: Conn) -> None:
        conn.head(200, SSE_HEAD)
        for e in items:
            named(conn, e)
        conn.end()

    return run


def text_message(
    parts: Iterable[str] = ("Hel", "lo"), stop_reason: str = "end_turn", **kw: Any
) -> Behaviour:
    return stream(message_events([("text", list(parts))], stop_reason, **kw))


def tool_use_message(
    calls: Iterable[tuple[str, str, Iterable[str]]], text: str = "", **kw: Any
) -> Behaviour:
    blocks: list[tuple[str, Any]] = [("text", [text])] if text else []
    blocks += [("tool_use", (cid, name, list(parts))) for cid, name, parts in calls]
    return stream(message_events(blocks, "tool_use", **kw))


def drop_after(events: Iterable[Mapping[str, Any]]) -> Behaviour:
    """Start a stream, send `events`, then close the connection mid-response."""
    items = list(events)

    def run(_req: StubRequest, conn: Conn) -> None:
        conn.head(200, SSE_HEAD)
        for e in items:
            named(conn, e)
        conn.drop()

    return run


def overloaded(retry_after: str | None = None) -> Behaviour:
    """HTTP 529 with Anthropic's overloaded_error body."""
    headers = {"retry-after": retry_after} if retry_after is not None else {}
    body = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return status(529, body, headers)


@dataclass
class AnthropicStub(OpenAIStub):
    default: Behaviour = field(default_factory=text_message)

    def start(self) -> AnthropicStub:
        super().start()
        return self

    def __enter__(self) -> AnthropicStub:
        return self.start()

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self._server.server_port}"
