"""Fold a session log into the model's chat history (canonical message dicts, see agent.model).

Log-only events (request headers, descriptors, inbox accounting, seed markers) never reach the
model: only user, assistant and tool-result messages do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["history_from_events", "last_turn_number"]


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
