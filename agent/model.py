"""The model seam: what the agent loop asks of an LLM and what it gets back.

Adapters are plain objects called from the turn's worker greenlet. They block cooperatively
(gevent I/O), honour `request.signal` by raising `AbortError` promptly, and turn every transport
or model failure into `ModelError` so the loop can end the turn `error` with a diagnostic.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

import msgpack

from agent.errors import ModelError
from agent.fastinit import fast_init
from agent.jsoncheck import check_json, is_lossless, repair_surrogates
from supervision.signal import AbortSignal

__all__ = [
    "DEFAULT_MAX_TOOL_CALLS_PER_REPLY",
    "MAX_ARGUMENT_CHARS",
    "MAX_ARGUMENT_CONTAINERS",
    "MAX_ARGUMENT_DEPTH",
    "FinishReason",
    "ModelAdapter",
    "ModelError",
    "ModelRequest",
    "ModelResponse",
    "ProgressSink",
    "ToolCall",
    "ToolSpec",
    "arguments_problem",
    "too_long",
    "without_lone_surrogates",
]

# Why a model call ended. `tool_calls` means "run these and call me again".
FinishReason = Literal["stop", "tool_calls", "max-tokens", "refusal"]

# The most tool calls of one model reply that run (`Runtime(max_tool_calls_per_reply=...)`);
# the loop drops the rest unrun and tells the model so (docs/decisions.md, q17). Real replies
# hold a handful, a wide fan-out some dozens; a reply of 100,000 would start 100,000 children,
# or leave 100,000 results in the history that every later request re-sends.
DEFAULT_MAX_TOOL_CALLS_PER_REPLY = 1_024

# Receives streaming progress: {"type": "text", "text": ...} deltas and similar JSON dicts.
ProgressSink = Callable[[Mapping[str, Any]], None]


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """A tool as the model sees it."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@fast_init  # made on every step: a cheaper __init__, same fields (agent.fastinit)
@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call a model asked for.

    Its arguments come from a model, so they are screened here, where every adapter makes
    them: arguments nested more than `MAX_ARGUMENT_DEPTH` levels, or not lossless JSON (NaN,
    an int beyond 64 bits, a tuple, a non-string key...), could not be logged, walked or
    validated safely. They are the model's mistake, not a crash: `arguments` becomes `{}` and
    `invalid` says why, so the tool layer answers with an `INVALID_ARGS` error result the model
    can read and retry, and the turn goes on (docs/decisions.md).
    """

    id: str
    name: str
    arguments: Mapping[str, Any]
    # Why the model's arguments were refused before anything ran (then `arguments` is {}).
    invalid: str | None = None

    def __post_init__(self) -> None:
        if self.invalid is not None:
            if not isinstance(self.invalid, str):
                raise TypeError("ToolCall.invalid must be a str or None")
            object.__setattr__(self, "arguments", {})
            return
        problem = arguments_problem(self.arguments)
        if problem is not None:
            object.__setattr__(self, "arguments", {})
            object.__setattr__(self, "invalid", problem)


# Deep enough for any real call, and well inside what the log accepts around it
# (`agent.jsoncheck.MAX_DEPTH` counts the event's own envelope too).
MAX_ARGUMENT_DEPTH = 128
# Characters in one call's arguments (its string values; for an HTTP adapter, its JSON text,
# which bounds keys too). A model writes at most its output limit per reply (128k tokens, about
# 512 KB of text, today's largest), so past this no model wrote them; and what is taken is
# logged and re-sent with every later request: 16 MiB would stall the hub encoding each request
# and fill any context window, so every later request of the session would fail
# (docs/decisions.md, q17).
MAX_ARGUMENT_CHARS = 4 * 1024 * 1024
# Arrays and objects in one call's arguments: as many as `agent.json_text` decodes in one text.
MAX_ARGUMENT_CONTAINERS = 100_000
# A refusal names the problem without flooding the model's context.
_MAX_PROBLEM_CHARS = 300


def too_long(size: int) -> str:
    """The refusal of arguments of `size` characters (past `MAX_ARGUMENT_CHARS`)."""
    return (
        f"arguments of {size:,} characters; a call takes at most {MAX_ARGUMENT_CHARS:,} "
        "(pass large content in smaller calls)"
    )


def arguments_problem(arguments: object) -> str | None:
    """Why `arguments` cannot be a tool call's arguments, or None when they can.

    Never recurses on the value's own depth, so no nesting (nor a cycle) can raise
    `RecursionError`: the depth is measured level by level, counting characters (at most
    `MAX_ARGUMENT_CHARS`) and containers (at most `MAX_ARGUMENT_CONTAINERS`) as it goes, and
    the lossless-JSON check runs only on what is known to be shallow and bounded."""
    if type(arguments) is dict:
        if not arguments:
            return None
        size = 0
        for x in arguments.values():
            t = type(x)
            if t is str:
                size += len(x)
            elif t is dict or t is list:
                break
        else:
            # Flat (the common case): no depth to measure; any other container type in it is
            # refused by the lossless check below.
            if size > MAX_ARGUMENT_CHARS:
                return too_long(size)
            return None if is_lossless(arguments) else _json_problem(arguments)
    elif not isinstance(arguments, Mapping):
        return f"arguments must be an object, got {type(arguments).__name__}"
    problem = _walk(arguments)
    if problem is not None:
        return problem
    return _json_problem(arguments if type(arguments) is dict else dict(arguments))


def _walk(arguments: Mapping[Any, Any]) -> str | None:
    """Nesting, size and containers of nested arguments, measured level by level."""
    level: list[Any] = [arguments]
    size = 0
    containers = 1
    for _ in range(MAX_ARGUMENT_DEPTH):
        below: list[Any] = []
        for container in level:
            if isinstance(container, Mapping):
                for k, x in container.items():
                    if type(k) is str:
                        size += len(k)
                    if type(x) is str:
                        size += len(x)
                    elif isinstance(x, (Mapping, list)):
                        below.append(x)
            else:
                for x in container:
                    if type(x) is str:
                        size += len(x)
                    elif isinstance(x, (Mapping, list)):
                        below.append(x)
        if size > MAX_ARGUMENT_CHARS:
            return too_long(size)
        containers += len(below)
        if containers > MAX_ARGUMENT_CONTAINERS:
            return f"arguments hold more than {MAX_ARGUMENT_CONTAINERS:,} arrays and objects"
        if not below:
            return None
        level = below
    return f"arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"


def _json_problem(arguments: dict[Any, Any]) -> str | None:
    try:
        check_json(arguments, where="arguments")
    except TypeError as exc:
        text = str(exc)
        if len(text) > _MAX_PROBLEM_CHARS:
            text = text[: _MAX_PROBLEM_CHARS - 3] + "..."
        return text
    return None


@fast_init  # made on every step: a cheaper __init__, same fields (agent.fastinit)
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
    # The most tool calls of the reply the loop will run: an adapter may stop decoding calls
    # past it and count them in `ModelResponse.more_calls` (the loop drops the rest either way).
    max_tool_calls: int | None = None


@fast_init  # made on every step: a cheaper __init__, same fields (agent.fastinit)
@dataclass(frozen=True, slots=True)
class ModelResponse:
    """One model answer. `usage` is its token usage in `agent.usage`'s shape (`input_tokens`,
    `output_tokens`, `cache_creation_input_tokens`, `cache_read_input_tokens`; any may be
    absent); the loop logs it on the `assistant/message` event and charges the agent's account."""

    content: Sequence[Mapping[str, Any]]
    tool_calls: Sequence[ToolCall] = ()
    finish: FinishReason = "stop"
    usage: Mapping[str, int] = field(default_factory=dict)
    # Calls the model asked for past `ModelRequest.max_tool_calls`, counted but not decoded
    # (not in `tool_calls`): the loop tells the model they were dropped.
    more_calls: int = 0


@runtime_checkable
class ModelAdapter(Protocol):
    """One registered model route prefix (`scripted`, `openai`, ...)."""

    def complete(
        self, request: ModelRequest, on_progress: ProgressSink | None = None
    ) -> ModelResponse:
        """Run one model call. Raises `ModelError` on failure, `AbortError` when
        `request.signal` aborts (promptly: an in-flight call is abandoned)."""
        ...


# msgpack's encoder refuses a lone surrogate exactly as UTF-8 does, in C and without building a
# string: about a seventh of the cost of `json.dumps(...).encode()` on every model reply.
_probe_pack = msgpack.Packer(use_bin_type=True, autoreset=True).pack


def _encodes(value: object) -> bool:
    try:
        _probe_pack(value)
    except UnicodeEncodeError:
        return False
    except (TypeError, ValueError, OverflowError):
        return True  # not JSON at all: the log's own check reports it
    return True


def without_lone_surrogates(response: ModelResponse) -> ModelResponse:
    """The response with lone UTF-16 halves in its text and tool calls replaced by U+FFFD.

    A model's JSON may carry an unpaired `\\ud83d` escape; such text cannot be encoded as UTF-8,
    so it must not reach a tool, a log or a wire as is (docs/decisions.md). Returns `response`
    itself when nothing needs repair (the common case).
    """
    calls = response.tool_calls
    if not calls:
        probe: object = response.content
    elif len(calls) == 1:  # the common cases without a comprehension (a frame each)
        c = calls[0]
        probe = [response.content, c.id, c.name, c.arguments, c.invalid]
    else:
        probe = [response.content, [[c.id, c.name, c.arguments, c.invalid] for c in calls]]
    if _encodes(probe):
        return response
    content = repair_surrogates([dict(block) for block in response.content])
    fixed = [
        ToolCall(
            repair_surrogates(c.id),
            repair_surrogates(c.name),
            repair_surrogates(dict(c.arguments)),
            None if c.invalid is None else repair_surrogates(c.invalid),
        )
        for c in calls
    ]
    return replace(response, content=content, tool_calls=fixed)
