"""The model seam: what the agent loop asks of an LLM and what it gets back.

Adapters are plain objects called from the turn's worker greenlet. They block cooperatively
(gevent I/O), honour `request.signal` by raising `AbortError` promptly, and turn every transport
or model failure into `ModelError` so the loop can end the turn `error` with a diagnostic.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from agent.jsoncheck import repair_surrogates
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
    "without_lone_surrogates",
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


def _encodes(value: Any) -> bool:
    try:
        json.dumps(value, ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return False
    except (TypeError, ValueError):
        return True  # not JSON at all: the log's own check reports it
    return True


def without_lone_surrogates(response: ModelResponse) -> ModelResponse:
    """The response with lone UTF-16 halves in its text and tool calls replaced by U+FFFD.

    A model's JSON may carry an unpaired `\\ud83d` escape; such text cannot be encoded as UTF-8,
    so it must not reach a tool, a log or a wire as is (docs/decisions.md). Returns `response`
    itself when nothing needs repair (the common case).
    """
    calls = response.tool_calls
    probe = [response.content, [[c.id, c.name, c.arguments] for c in calls]]
    if _encodes(probe):
        return response
    content = repair_surrogates([dict(block) for block in response.content])
    fixed = [
        ToolCall(
            repair_surrogates(c.id),
            repair_surrogates(c.name),
            repair_surrogates(dict(c.arguments)),
        )
        for c in calls
    ]
    return replace(response, content=content, tool_calls=fixed)
