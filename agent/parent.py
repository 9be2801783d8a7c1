"""`ParentAgent`: the parent agent as an in-process provider sees it.

A request names its parent by the seam's `subagent.types.AgentView` (id, working directory,
depth, options): the vocabulary cannot name the agent layer. A provider that builds the child in
this process also needs the parent's context (the store, models, tools and prompt a child shares)
and its real options, so it narrows with `parent_agent`, which checks them. The live
`actors.agent_handle.Agent` has these members and more; so does Ray's stand-in for a parent in
another process (`providers.ray_runtime`), which is why this is a Protocol rather than the class.
"""

from __future__ import annotations

from typing import Protocol, TypeGuard

from agent.context import AgentContext
from agent.options import AgentOptions
from subagent.types import AgentView

__all__ = ["ParentAgent", "parent_agent"]


class ParentAgent(AgentView, Protocol):
    """What an in-process provider may read of the agent that spawns or resumes a child."""

    @property
    def ctx(self) -> AgentContext: ...

    @property
    def options(self) -> AgentOptions: ...


def _is_parent_agent(parent: AgentView | None) -> TypeGuard[ParentAgent]:
    return isinstance(getattr(parent, "ctx", None), AgentContext) and isinstance(
        getattr(parent, "options", None), AgentOptions
    )


def parent_agent(agent: AgentView | None) -> ParentAgent:
    """`agent` (a request's parent, a tool's caller) as a `ParentAgent`; TypeError when it is
    not an agent of this runtime (no agent context or no real options)."""
    if not _is_parent_agent(agent):
        raise TypeError(f"expected an agent of this runtime (with ctx and options), got {agent!r}")
    return agent
