"""What every agent of one runtime shares: the store, models, global tools, the deployment prompt.

Upper layers hang their services here (`subagents`, `tasks`) so an agent reaches them through
`agent.ctx` the way the seed's `parent.ctx` does, without the agent layer importing them.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Protocol

from agent.inbox import InboxLimits
from agent.lifecycle import AgentLifecycle
from agent.model import DEFAULT_MAX_TOOL_CALLS_PER_REPLY
from agent.models import ModelRegistry
from agent.options import AgentOptions
from agent.owner_thread import OwnerThread
from agent.prompt import SystemPrompt
from agent.store import MemoryStore, SessionStore
from agent.tools import ToolHost, ToolRegistry
from agent.usage import PriceTable
from subagent.types import AgentView
from supervision.supervisor import Supervisor

__all__ = ["AgentContext", "InboxLimits", "LiveAgent"]


class LiveAgent(AgentView, Protocol):
    """A live agent as `ctx.agents` lists it (`actors.agent_handle.Agent`, a layer up): the
    seam's view of it, its context, options and loop, and the close its owner calls. Its loop
    holds it too (`AgentCore.agent`), to hand it to tools (`ToolContext.agent`)."""

    @property
    def ctx(self) -> AgentContext: ...

    @property
    def options(self) -> AgentOptions: ...

    @property
    def core(self) -> ToolHost: ...

    def close(self, cause: object = None) -> None: ...


@dataclass(eq=False)
class AgentContext:
    store: SessionStore | MemoryStore
    models: ModelRegistry
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    prompt: SystemPrompt = field(default_factory=SystemPrompt)
    variables: MutableMapping[str, str | None] = field(default_factory=dict)
    # Prices by model route (USD per million tokens): what costs and cost budgets count.
    prices: PriceTable = field(default_factory=PriceTable)
    # What each agent's inbox holds at most before it refuses (`INBOX_FULL`).
    inbox: InboxLimits = field(default_factory=InboxLimits)
    # The most tool calls of one model reply that run; the loop drops the rest unrun.
    max_tool_calls_per_reply: int = DEFAULT_MAX_TOOL_CALLS_PER_REPLY
    # The thread whose hub runs this runtime's agents: their handles refuse any other.
    owner: OwnerThread = field(default_factory=OwnerThread)
    # Live agents by session id (`ctx.agents`): the one place that knows who is running.
    agents: MutableMapping[str, LiveAgent] = field(default_factory=dict)
    # Services of upper layers, set by the runtime wiring (`subagent.SubagentService`,
    # `subagent.tasks.TaskService`): opaque here, held for the face, which holds them typed too
    # (`Runtime.subagents`, `Runtime.tasks`).
    subagents: object = None
    tasks: object = None
    supervisor: Supervisor | None = None
    # Who hears when an agent is published, closing or cancelled: register through its
    # methods (`ctx.lifecycle.on_published(fn)` returns the remover).
    lifecycle: AgentLifecycle = field(default_factory=AgentLifecycle)
    # Set by the owner (the `Runtime`) when it closes: what was live is gone for good, and a
    # call that reaches a stopped agent is told `RUNTIME_CLOSED` rather than a raw actor error.
    closed: bool = False
