"""Model-facing access to background tasks: `task_output` and `task_kill`.

An agent sees only the tasks it owns: another agent's task id is refused exactly like an
unknown one, so ids leaking through a shared channel grant nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from agent.tools import Tool, ToolContext, ToolError
from subagent.live import calling_agent
from subagent.settlement import blocks_text
from subagent.tasks import Task, TaskService, UnknownTaskError

if TYPE_CHECKING:
    from actors.agent_handle import Agent

__all__ = ["TASK_KILL", "TASK_OUTPUT", "format_task", "task_kill_tool", "task_output_tool"]

TASK_OUTPUT: Final = "task_output"
TASK_KILL: Final = "task_kill"


def _own_task(tasks: TaskService, task_id: str, agent: Agent) -> Task:
    task: Task | None
    try:
        task = tasks.get(task_id)
    except UnknownTaskError:
        task = None
    if task is None or task.owner != agent.id:
        # The id is the model's own: quoted cut, never echoed whole (it may be megabytes).
        raise ToolError(f"no task {task_id[:200]!r} of yours", code="UNKNOWN_TASK")
    return task


def _text(value: object) -> str:
    """A task's output as a model reads it: a subagent task's content blocks become their text
    (`subagent.settlement`); another task's value, its string form."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, Mapping) for b in value):
        return blocks_text(value)
    if isinstance(value, list):
        return "\n".join(str(b) for b in value)
    return str(value)


def format_task(task: Task) -> str:
    """Status line, then the detail (for a failure), then the output."""
    lines = [f"Task {task.id} ({task.label}): {task.status}"]
    if task.detail and task.status != "completed":
        lines.append(task.detail)
    out = _text(task.output)
    if out and not (task.detail and out in task.detail):
        lines.append(out)
    return "\n".join(lines)


def task_output_tool(tasks: TaskService) -> Tool:
    def fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        task_id = str(arguments["task_id"])
        task = _own_task(tasks, task_id, calling_agent(ctx))
        if arguments.get("wait") and not task.settled:
            if task.subject is not None and ctx.on_child is not None:
                # The waiting call follows the child's progress until the task settles.
                ctx.on_child(task.subject)
            # Cooperative wait; the turn's signal ends it (the loop abandons the call).
            task = tasks.wait(task_id)
        text = format_task(task)
        if task.status in ("failed", "killed"):
            raise ToolError(text, code=f"TASK_{task.status.upper()}")
        return text

    return Tool(
        name=TASK_OUTPUT,
        description=(
            "Read the status and result of one of your background tasks. Status is running, "
            "completed, failed or killed. wait=true blocks until the task settles."
        ),
        parameters={
            "type": "object",
            "properties": {
                "task_id": {"type": "string", "minLength": 1},
                "wait": {"type": "boolean"},
            },
            "required": ["task_id"],
            "additionalProperties": False,
        },
        fn=fn,
        concurrency_safe=True,
    )


def task_kill_tool(tasks: TaskService) -> Tool:
    def fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        task_id = str(arguments["task_id"])
        agent = calling_agent(ctx)
        task = _own_task(tasks, task_id, agent)
        if tasks.kill(task_id, f"killed by {agent.id}"):
            return f"Task {task_id} ({task.label}) was killed."
        return f"Task {task_id} had already settled: {tasks.get(task_id).status}."

    return Tool(
        name=TASK_KILL,
        description="Stop one of your background tasks (and the subagent running it).",
        parameters={
            "type": "object",
            "properties": {"task_id": {"type": "string", "minLength": 1}},
            "required": ["task_id"],
            "additionalProperties": False,
        },
        fn=fn,
        concurrency_safe=True,
    )
