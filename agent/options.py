"""Per-agent options. Merge-extensible in spirit: `extra` carries what other layers add."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, TypedDict, Unpack

__all__ = ["AgentOptions", "OptionChanges"]


class OptionChanges(TypedDict, total=False):
    """The fields `AgentOptions.with_` may replace (a typo is a type error)."""

    model: str
    max_tokens: int | None
    max_steps: int
    subagent_depth: int | None
    token_budget: int | None
    cost_budget: float | Decimal | None
    extra: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """How an agent runs.

    `model` is a route `prefix:model` resolved by the model registry. `subagent_depth` is the
    runtime half of delegation depth (the durable half is the session header); the loop never
    reads it, the subagent seam owns both.
    """

    model: str = "scripted:default"
    max_tokens: int | None = None
    max_steps: int = 50
    subagent_depth: int | None = None
    # The most tokens (agent.usage.total_tokens) this agent and its descendants may spend; the
    # loop checks it at every step boundary and ends the turn `budget-exceeded`.
    token_budget: int | None = None
    # The most USD this agent and its descendants may spend, priced by the runtime's price
    # table (agent.usage.PriceTable); the agent's model route must have a price.
    cost_budget: float | Decimal | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or ":" not in self.model:
            raise ValueError(f"model must be a route 'prefix:model', got {self.model!r}")
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int) or isinstance(self.max_tokens, bool)
        ):
            raise TypeError("max_tokens must be an int or None")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ValueError("max_tokens must be positive")
        if not isinstance(self.max_steps, int) or isinstance(self.max_steps, bool):
            raise TypeError("max_steps must be an int")
        if self.max_steps <= 0:
            raise ValueError("max_steps must be positive")
        if self.subagent_depth is not None and (
            not isinstance(self.subagent_depth, int)
            or isinstance(self.subagent_depth, bool)
            or self.subagent_depth < 0
        ):
            raise ValueError("subagent_depth must be a non-negative int or None")
        if self.token_budget is not None and (
            not isinstance(self.token_budget, int)
            or isinstance(self.token_budget, bool)
            or self.token_budget < 0
        ):
            raise ValueError("token_budget must be a non-negative int or None")
        if self.cost_budget is not None:
            from agent.usage import usd_to_pico

            usd_to_pico(self.cost_budget, "cost_budget")  # TypeError / ValueError when bad

    def with_(self, **changes: Unpack[OptionChanges]) -> AgentOptions:
        return replace(self, **changes)
