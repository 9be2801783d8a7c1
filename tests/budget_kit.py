"""What the token-budget and cost-budget tests share: a fan-out tree whose capped branch would
spend forever, and small readers of requests and logs."""

from __future__ import annotations

from typing import Any

from seam_kit import last_user_text

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.tools import Tool


def last_is_tool_result(request: ModelRequest) -> bool:
    return bool(request.messages) and request.messages[-1].get("role") == "tool"


def noop_tool() -> Tool:
    return Tool(
        name="noop", description="noop", parameters={"type": "object"}, fn=lambda a, c: "ok"
    )


def fan_out_responder(request: ModelRequest) -> S.Step:
    """root fans out to a capped 'greedy' child (tool `capped`) and an uncapped 'modest' one;
    greedy fans out to two workers that would call a tool forever: only a budget stops them."""
    said = last_user_text(request)
    if said == "fan":
        if last_is_tool_result(request):
            return S.text("root done")
        return S.tool_calls(
            [
                ("capped", {"description": "greedy", "prompt": "greedy"}),
                ("subagent", {"description": "modest", "prompt": "modest"}),
            ]
        )
    if said == "greedy":
        if last_is_tool_result(request):
            return S.text("greedy done")
        return S.tool_calls(
            [
                ("subagent", {"description": "w1", "prompt": "work"}),
                ("subagent", {"description": "w2", "prompt": "work"}),
            ]
        )
    if said == "work":
        return S.tool_call("noop", {})
    return S.text("modest done")


def first_prompt(runtime: Any, session_id: str) -> str:
    """The text of a stored session's first user message."""
    for e in runtime.ctx.store.load(session_id).events:
        if e["type"] == "user/message":
            return "".join(b["text"] for b in e["data"]["message"]["content"])
    return ""


def start_budgeted_child(runtime: Any, prompt: str, **budget: Any) -> tuple[Any, Any]:
    """A continuable spawn child of a fresh root, started with `budget` (token_budget=...,
    cost_budget=...) and left to settle; returns (the parent agent, the child's id)."""
    from seam_kit import wait_until

    from subagent import AbortController, SubagentStartRequest, text_block

    parent = runtime.agent()
    started = runtime.subagents.start_continuable(
        "spawn",
        SubagentStartRequest(
            prompt=[text_block(prompt)],
            parent=parent,
            signal=AbortController().signal,
            **budget,
        ),
        label="budgeted",
    )
    wait_until(lambda: runtime.tasks.get(started.task_id).settled)
    return parent, started.child_id
