"""The face's own classes, back from where the agent layer holds them.

`AgentContext` (the agent layer) lists the live agents and holds the services the face hangs
on it, but it cannot name the face's classes (a layer imports only downward), so it types them
by what it can name. The face narrows them here, with a check rather than a cast, where it needs
its own class: `ctx.agents` holds only `Agent`s (`actors.agents` publishes them there) and
`ctx.tasks` the runtime's `TaskService`, so in a runtime the checks always pass.
"""

from __future__ import annotations

from actors.agent_handle import Agent
from agent.context import AgentContext
from subagent.tasks import TaskService

__all__ = ["live_agent", "task_service"]


def live_agent(ctx: AgentContext, agent_id: str) -> Agent | None:
    """The live agent with that session id in this runtime, or None."""
    agent = ctx.agents.get(agent_id)
    return agent if isinstance(agent, Agent) else None


def task_service(ctx: AgentContext) -> TaskService | None:
    """The runtime's task service (`ctx.tasks`), or None where no runtime set one."""
    tasks = ctx.tasks
    return tasks if isinstance(tasks, TaskService) else None
