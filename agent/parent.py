"""`ParentAgent`: the parent agent as a provider sees it.

A provider reads only these members of `request.parent`: its id for scoping, its context for
the store, models and tools a child shares, its working directory and depth, its options as
the child's defaults, its log and header for lineage. The live `actors.agent_actor.Agent`
has them all; so does Ray's stand-in for a parent in another process, which is why this is a
Protocol rather than the concrete class.
"""

from __future__ import annotations

from typing import Protocol

from agent.context import AgentContext
from agent.events import SessionHeader
from agent.log import SessionLog
from agent.options import AgentOptions

__all__ = ["ParentAgent"]


class ParentAgent(Protocol):
    """What a provider may read of the agent that spawns or resumes a child."""

    @property
    def id(self) -> str: ...

    @property
    def ctx(self) -> AgentContext: ...

    @property
    def cwd(self) -> str: ...

    @property
    def depth(self) -> int: ...

    @property
    def options(self) -> AgentOptions: ...

    @property
    def log(self) -> SessionLog: ...

    @property
    def header(self) -> SessionHeader: ...
