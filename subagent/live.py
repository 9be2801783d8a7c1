"""The face's own classes, back from where the agent layer holds them.

`AgentContext` (the agent layer) lists the live agents and holds the services the face hangs
on it, but it cannot name the face's classes (a layer imports only downward), so it types them
by what it can name. The face narrows them here, with a check rather than a cast, where it needs
its own class: `ctx.agents` holds only `Agent`s (`actors.agents` publishes them there) and
`ctx.tasks` the runtime's `TaskService`, so in a runtime the checks always pass.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from actors.agent_handle import Agent
from agent.context import AgentContext
from agent.errors import TOOL_FAILED
from agent.tools import ToolContext, ToolError
from subagent.tasks import TaskService

__all__ = ["LiveAgents", "calling_agent", "live_agent", "task_service"]


def live_agent(ctx: AgentContext, agent_id: str) -> Agent | None:
    """The live agent with that session id in this runtime, or None."""
    agent = ctx.agents.get(agent_id)
    return agent if isinstance(agent, Agent) else None


def calling_agent(ctx: ToolContext) -> Agent:
    """The agent whose turn runs a model-facing tool; a `ToolError` for a loop run without
    one (a bare `AgentCore`), since every subagent tool acts for its caller."""
    agent = ctx.agent
    if not isinstance(agent, Agent):
        raise ToolError("this tool needs a calling agent", code=TOOL_FAILED)
    return agent


class LiveAgents(Mapping[str, Agent]):
    """`ctx.agents` seen as the face's `Agent`s: a live view (no copy) for the listings."""

    __slots__ = ("_ctx",)

    def __init__(self, ctx: AgentContext) -> None:
        self._ctx = ctx

    def __getitem__(self, agent_id: str) -> Agent:
        agent = live_agent(self._ctx, agent_id)
        if agent is None:
            raise KeyError(agent_id)
        return agent

    def __iter__(self) -> Iterator[str]:
        return iter([k for k, a in list(self._ctx.agents.items()) if isinstance(a, Agent)])

    def __len__(self) -> int:
        return sum(1 for a in list(self._ctx.agents.values()) if isinstance(a, Agent))


def task_service(ctx: AgentContext) -> TaskService | None:
    """The runtime's task service (`ctx.tasks`), or None where no runtime set one."""
    tasks = ctx.tasks
    return tasks if isinstance(tasks, TaskService) else None
