"""The scripted stand-in model, for tests, demos and examples: `from subagent import scripted`.

A `ScriptedModel` plays `Step`s instead of calling an LLM: `text(...)`, `tool_call(...)`,
`tool_calls(...)`, `chunks(...)`, `max_tokens(...)`, `refusal(...)`, `error(...)`, `hang()`;
`echo` answers with the last user message. See docs/models.md.
"""

from __future__ import annotations

from agent.models.scripted import (
    DEFAULT,
    Responder,
    ScriptedModel,
    Step,
    StepKind,
    chunks,
    echo,
    error,
    hang,
    max_tokens,
    refusal,
    text,
    tool_call,
    tool_calls,
)

__all__ = [
    "DEFAULT",
    "Responder",
    "ScriptedModel",
    "Step",
    "StepKind",
    "chunks",
    "echo",
    "error",
    "hang",
    "max_tokens",
    "refusal",
    "text",
    "tool_call",
    "tool_calls",
]
