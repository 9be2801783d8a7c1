"""Model-facing control of children: `send_message`, `interrupt_agent`, `list_agents`.

These act for the calling agent only: the service authorizes every call against the caller's
lineage (direct parent for messages, any ancestor for interrupts), so a model cannot address a
child that is not its own. Failures come back as error tool results carrying the seam's code,
but for an id: another agent's child and no child at all get one answer (`UNKNOWN_CHILD`, the
same words), so a model cannot probe which ids exist, as the task tools answer `UNKNOWN_TASK`
for both. The service keeps its distinct codes for the host's own code (docs/tools.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from agent.events import validate_session_id
from agent.tools import Tool, ToolContext, ToolError
from subagent.errors import SubagentError
from subagent.live import calling_agent, live_agent
from subagent.tools.delegate import MAX_MESSAGE_CHARS, child_labels
from subagent.types import MessageSource, text_block

if TYPE_CHECKING:
    from subagent.listings import ChildRow
    from subagent.service import SubagentService

__all__ = [
    "INTERRUPT_AGENT",
    "LIST_AGENTS",
    "SEND_MESSAGE",
    "format_agent_rows",
    "interrupt_agent_tool",
    "list_agents_tool",
    "send_message_tool",
]

SEND_MESSAGE: Final = "send_message"
INTERRUPT_AGENT: Final = "interrupt_agent"
LIST_AGENTS: Final = "list_agents"


def _error(exc: SubagentError) -> ToolError:
    return ToolError(f"{exc.detail} ({exc.code})", code=exc.code)


# What an id that names none of the caller's subagents gets, whoever (if anyone) it names.
_NOT_YOURS = frozenset({"UNKNOWN_CHILD", "UNAUTHORIZED"})


def _unknown(agent_id: str) -> ToolError:
    return ToolError(
        f"none of your subagents has the id {agent_id[:200]!r} (UNKNOWN_CHILD)",
        code="UNKNOWN_CHILD",
    )


def _addressed(exc: SubagentError, agent_id: str) -> ToolError:
    """The service's refusal as the model reads it: not yours and not there are alike."""
    return _unknown(agent_id) if exc.code in _NOT_YOURS else _error(exc)


def _agent_id(value: object) -> str:
    """An id a model sent: one that cannot be a session id names no agent (`UNKNOWN_CHILD`),
    rather than reaching the service as a bad argument (a `ValueError`: `TOOL_FAILED`)."""
    agent_id = str(value)
    try:
        validate_session_id(agent_id)
    except ValueError:
        raise _unknown(agent_id) from None
    return agent_id


def send_message_tool(service: SubagentService) -> Tool:
    """Steer a running continuable child, or wake a stopped one with this message."""

    def fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        agent = calling_agent(ctx)
        child_id = _agent_id(arguments["subagent_id"])
        try:
            sent = service.send_message(
                agent,
                child_id,
                [text_block(str(arguments["message"]))],
                MessageSource.coordinator(agent.id),
                signal=ctx.signal,
            )
        except SubagentError as exc:
            raise _addressed(exc, child_id) from exc
        if ctx.on_child is not None:
            ctx.on_child(child_id)  # its progress from now on belongs to this call
        if sent.kind == "steered":
            return f"Delivered to the running subagent {child_id}; it sees it at its next step."
        return (
            f"Subagent {child_id} was stopped; it resumed with your message as task "
            f"{sent.task_id} and reports back when it settles."
        )

    return Tool(
        name=SEND_MESSAGE,
        description=(
            "Send a follow-up message to one of your continuable subagents (started with "
            "run_in_background). A running subagent receives it at its next step; a stopped "
            "one is resumed with its full session and this message."
        ),
        parameters={
            "type": "object",
            "properties": {
                "subagent_id": {"type": "string", "minLength": 1},
                "message": {"type": "string", "minLength": 1, "maxLength": MAX_MESSAGE_CHARS},
            },
            "required": ["subagent_id", "message"],
            "additionalProperties": False,
        },
        fn=fn,
        concurrency_safe=True,
    )


def interrupt_agent_tool(service: SubagentService) -> Tool:
    """Cancel a descendant's current turn; its queued messages are kept."""

    def fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        agent_id = _agent_id(arguments["agent_id"])
        by = calling_agent(ctx)
        # A child with no agent here (an ACP or Ray child) has one turn per run: the interrupt
        # ends that run, and the answer must not promise it waits with its queue.
        remote = live_agent(by.ctx, agent_id) is None
        try:
            stopped = service.interrupt(agent_id, by=by)
        except SubagentError as exc:
            raise _addressed(exc, agent_id) from exc
        if stopped and remote:
            return (
                f"Interrupted {agent_id}: its turn was cancelled, which ended its run (stop "
                "reason aborted). A one-shot subagent is over (its task holds what it produced); "
                "a continuable one can be resumed with send_message."
            )
        if stopped:
            return f"Interrupted {agent_id}: its current turn was cancelled; queued messages stay."
        return f"{agent_id} was not running; nothing was interrupted."

    return Tool(
        name=INTERRUPT_AGENT,
        description=(
            "Stop what one of your subagents (or their descendants) is doing right now. Its "
            "session is kept; a continuable subagent can be resumed later with send_message."
        ),
        parameters={
            "type": "object",
            "properties": {"agent_id": {"type": "string", "minLength": 1}},
            "required": ["agent_id"],
            "additionalProperties": False,
        },
        fn=fn,
        concurrency_safe=True,
    )


def format_agent_rows(rows: Sequence[ChildRow], labels: Mapping[str, str]) -> str:
    """One line per agent: id, status, mode, depth, parent, label."""
    if not rows:
        return "No subagents."
    lines = []
    for row in rows:
        # One line whatever the label holds (one set through the service, or stored by an
        # older version): each agent is one row.
        label = " ".join(str(row.get("label") or labels.get(row["id"]) or "").split()) or "-"
        lines.append(
            f"{row['id']}  status={row.get('activity')}  mode={row.get('mode')}  "
            f"depth={row.get('depth')}  parent={row.get('parent_id')}  label={label}"
        )
    return "\n".join(lines)


def list_agents_tool(service: SubagentService) -> Tool:
    """The caller's children (or whole subtree) with status running, idle, stored or ended."""

    def fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        agent = calling_agent(ctx)
        scope = arguments.get("scope", "children")
        if scope == "descendants":
            rows = service.list_descendants(agent.id)
        else:
            rows = service.list_children(agent.id)
        return format_agent_rows(rows, child_labels(agent.ctx))

    return Tool(
        name=LIST_AGENTS,
        description=(
            "List your subagents with their status: running (working now), idle (live, "
            "waiting), stored (not in memory; a continuable one resumes on send_message) or "
            "ended (a one-shot subagent that ran elsewhere and is over; its task holds what it "
            "produced). scope='descendants' includes their subagents too."
        ),
        parameters={
            "type": "object",
            "properties": {"scope": {"type": "string", "enum": ["children", "descendants"]}},
            "additionalProperties": False,
        },
        fn=fn,
        concurrency_safe=True,
    )
