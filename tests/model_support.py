"""What the HTTP model adapter tests share: a one-message request (the adapters a test made are
the `models` fixture, in conftest.py)."""

from __future__ import annotations

from agent.model import ModelRequest
from supervision.signal import AbortSignal


def hi_request(max_tool_calls: int | None = None) -> ModelRequest:
    return ModelRequest(
        session_id="s1",
        model="m",
        system="",
        messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        tools=(),
        signal=AbortSignal.never(),
        max_tool_calls=max_tool_calls,
    )
