"""What every agent of one runtime shares: the store, models, global tools, the deployment prompt.

Upper layers hang their services here (`subagents`, `tasks`) so an agent reaches them through
`agent.ctx` the way the seed's `parent.ctx` does, without the agent layer importing them.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

from agent.lifecycle import AgentLifecycle
from agent.models import ModelRegistry
from agent.prompt import SystemPrompt
from agent.store import MemoryStore, SessionStore
from agent.tools import ToolRegistry
from agent.usage import PriceTable

__all__ = ["AgentContext"]


@dataclass(eq=False)
class AgentContext:
    store: SessionStore | MemoryStore
    models: ModelRegistry
    tools: ToolRegistry = field(default_factory=ToolRegistry)
    prompt: SystemPrompt = field(default_factory=SystemPrompt)
    variables: MutableMapping[str, str | None] = field(default_factory=dict)
    # Prices by model route (USD per million tokens): what costs and cost budgets count.
    prices: PriceTable = field(default_factory=PriceTable)
    # Live agents by session id (`ctx.agents`): the one place that knows who is running.
    agents: MutableMapping[str, Any] = field(default_factory=dict)
    # Services of upper layers, set by the runtime wiring.
    subagents: Any = None
    tasks: Any = None
    supervisor: Any = None
    # Who hears when an agent is published, closing or cancelled: register through its
    # methods (`ctx.lifecycle.on_published(fn)` returns the remover).
    lifecycle: AgentLifecycle = field(default_factory=AgentLifecycle)
    # Set by the owner (the `Runtime`) when it closes: what was live is gone for good, and a
    # call that reaches a stopped agent is told `RUNTIME_CLOSED` rather than a raw actor error.
    closed: bool = False
