"""The model seam: what the agent loop asks of an LLM and what it gets back.

Adapters are plain objects called from the turn's worker greenlet. They block cooperatively
(gevent I/O), honour `request.signal` by raising `AbortError` promptly, and turn every transport
or model failure into `ModelError` so the loop can end the turn `error` with a diagnostic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from supervision.signal import AbortSignal

__all__ = [
    "FinishReason",
    "ModelAdapter",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ProgressSink",
    "ToolCall",
    "ToolSpec",
]

# Why a model call ended. `tool_calls` means "run these and call me again".
FinishReason = Literal["stop", "tool_calls", "max-tokens", "refusal"]

# Receives streaming progress: {"type": "text", "text": ...} deltas and similar JSON dicts.
ProgressSink = Callable[[Mapping[str, Any]], None]


class ModelError(Exception):
    """A model or transport failure: the turn ends `error` with this message as diagnostic."""


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """One model call.

    `messages` is the chat history in canonical JSON form:
    - `{"role": "user", "content": [blocks]}`
    - `{"role": "assistant", "content": [blocks], "tool_calls": [{"id", "name", "arguments"}]}`
    - `{"role": "tool", "tool_call_id": str, "name": str, "content": [blocks], "is_error": bool}`
    Content blocks are `{"type": "text", "text": str}` dicts.
    """

    session_id: str
    model: str
    system: str
    messages: Sequence[Mapping[str, Any]]
    tools: Sequence[ToolSpec]
    signal: AbortSignal
    max_tokens: int | None = None
    # Which turn and step of the session this request serves (1-based); scripted models key on it.
    turn: int = 1
    step: int = 1


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """One model answer. `usage` is its token usage in `agent.usage`'s shape (`input_tokens`,
    `output_tokens`, `cache_creation_input_tokens`, `cache_read_input_tokens`; any may be
    absent); the loop logs it on the `assistant/message` event and charges the agent's account."""

    content: Sequence[Mapping[str, Any]]
    tool_calls: Sequence[ToolCall] = ()
    finish: FinishReason = "stop"
    usage: Mapping[str, int] = field(default_factory=dict)


@runtime_checkable
class ModelAdapter(Protocol):
    """One registered model route prefix (`scripted`, `openai`, ...)."""

    def complete(
        self, request: ModelRequest, on_progress: ProgressSink | None = None
    ) -> ModelResponse:
        """Run one model call. Raises `ModelError` on failure, `AbortError` when
        `request.signal` aborts (promptly: an in-flight call is abandoned)."""
        ...
