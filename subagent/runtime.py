"""`Runtime`: wires the store, models, tools, the registry actor and the providers together.

A runtime is the unit of ownership: `close()` disposes every run child-first, closes every
agent, and stops every actor it started, returning only at quiescence.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypedDict, Unpack

from actors.agent_handle import Agent
from actors.agents import create_agent, resume_agent
from agent.context import AgentContext
from agent.inbox import InboxLimits
from agent.model import DEFAULT_MAX_TOOL_CALLS_PER_REPLY
from agent.models import ModelRegistry
from agent.models.scripted import ScriptedModel, echo
from agent.options import AgentOptions
from agent.prompt import SystemPrompt
from agent.store import MemoryStore, SessionStore
from agent.tools import ToolScope
from agent.usage import Price, PriceTable
from subagent import telemetry
from subagent.errors import SubagentError
from subagent.limits import DEFAULT_MAX_PENDING_STEERS, DEFAULT_MAX_QUEUED_SENDS
from subagent.service import SubagentService
from subagent.tasks import DEFAULT_KEEP_SETTLED, TaskService
from supervision.gc_policy import DEFAULT_FREEZE_EVERY, GcPolicy

__all__ = ["AgentExtras", "Runtime"]


class AgentExtras(TypedDict, total=False):
    """The rest of `Runtime.agent()`'s keywords, passed on to `actors.agents.create_agent`."""

    parent_session: str | None
    origin: Literal["subagent"] | None
    delegation_depth: int
    seed: Sequence[Mapping[str, Any]]
    tools: ToolScope | None
    prompt: SystemPrompt | None


class Runtime:
    """One process's subagent runtime. Use as a context manager, or call `close()`."""

    def __init__(
        self,
        *,
        store: SessionStore | MemoryStore | str | os.PathLike[str] | None = None,
        durability: str = "turn",
        models: ModelRegistry | None = None,
        scripted: ScriptedModel | None = None,
        max_children: int | None = None,
        max_children_per_parent: int | None = None,
        gc_policy: bool = True,
        gc_freeze_every: int | None = DEFAULT_FREEZE_EVERY,
        prices: PriceTable
        | Mapping[str, Price | Mapping[str, Any]]
        | str
        | os.PathLike[str]
        | None = None,
        keep_settled: int = DEFAULT_KEEP_SETTLED,
        max_pending_steers: int = DEFAULT_MAX_PENDING_STEERS,
        max_queued_sends: int = DEFAULT_MAX_QUEUED_SENDS,
        max_tool_calls_per_reply: int = DEFAULT_MAX_TOOL_CALLS_PER_REPLY,
    ) -> None:
        """The runtime owns a cyclic-GC policy by default (`supervision.gc_policy`): a larger
        young generation while it is open, and after every `gc_freeze_every` child starts what
        is alive moves to the collector's permanent generation (`gc.freeze()`), so full
        collections stop rescanning thousands of live children; `close()` undoes both.
        `gc_freeze_every=None` keeps the larger young generation but never freezes;
        `gc_policy=False` leaves the collector alone. See docs/performance.md.

        `prices`: what each model route costs (USD per million tokens), for costs in usage
        and cost budgets: a `PriceTable`, a mapping of routes to `Price` or
        `{input, output, cache_read, cache_write}`, or the path of a JSON/TOML file of that
        mapping. See docs/models.md.

        `keep_settled`: how many settled background tasks stay readable (`task_output`) before
        the oldest are forgotten; an ended child with nothing of it stored here (a one-shot ACP
        or Ray child) stays listed for as long, under the same bound.

        `max_pending_steers`, `max_queued_sends`: what one agent's inbox holds at most (steers
        waiting for a step boundary, sends waiting for a turn); one more is refused with
        `SubagentError("INBOX_FULL")`, so a sender in a loop cannot grow the process until it
        dies. See docs/runtime.md.

        `max_tool_calls_per_reply`: how many tool calls of one model reply run (1,024 by
        default); the calls past it are dropped unrun and the model is told so, its turn going
        on. See docs/tools.md."""
        # Every numeric option, checked before anything is made: a wrong type (`"3"`, `True`,
        # `2.0`) is a TypeError, a value out of range a ValueError, each naming the keyword.
        for name, value, least in (
            ("max_children", max_children, 1),
            ("max_children_per_parent", max_children_per_parent, 1),
            ("gc_freeze_every", gc_freeze_every, 1),
        ):
            if value is not None:
                _check_count(name, value, least, "an int or None")
        for name, value, least in (
            ("keep_settled", keep_settled, 0),
            ("max_pending_steers", max_pending_steers, 1),
            ("max_queued_sends", max_queued_sends, 1),
            ("max_tool_calls_per_reply", max_tool_calls_per_reply, 1),
        ):
            _check_count(name, value, least, "an int")
        if not isinstance(durability, str):
            raise TypeError(f"durability must be a str, got {type(durability).__name__}")
        inbox = InboxLimits(steers=max_pending_steers, sends=max_queued_sends)
        if not isinstance(gc_policy, bool):
            raise TypeError(f"gc_policy must be a bool, got {type(gc_policy).__name__}")
        if models is not None and not isinstance(models, ModelRegistry):
            raise TypeError(f"models must be a ModelRegistry or None, got {type(models).__name__}")
        if store is None:
            store = SessionStore(durability=durability)  # type: ignore[arg-type]
        elif isinstance(store, (str, os.PathLike)):
            _check_store_path(Path(store))
            store = SessionStore(Path(store), durability=durability)  # type: ignore[arg-type]
        elif not isinstance(store, (SessionStore, MemoryStore)):
            raise TypeError("store must be a SessionStore, a MemoryStore, a path or None")
        # OTEL_* set and no tracer provider yet: install one (a host's own is never replaced).
        telemetry.configure_from_env()
        if models is None:
            models = ModelRegistry()
        # The embedded default model echoes the last user message: no network, no keys.
        self.scripted = scripted if scripted is not None else ScriptedModel(echo, record=False)
        if "scripted" not in models:
            models.register("scripted", self.scripted)
        if "openai" not in models:
            from agent.models.openai import OpenAIModel

            models.register("openai", OpenAIModel())
        if "anthropic" not in models:
            from agent.models.anthropic import AnthropicModel

            models.register("anthropic", AnthropicModel())
        if prices is None:
            table = PriceTable()
        elif isinstance(prices, PriceTable):
            table = prices
        elif isinstance(prices, (str, os.PathLike)):
            table = PriceTable.load(prices)
        elif isinstance(prices, Mapping):
            table = PriceTable(prices)
        else:
            raise TypeError("prices must be a PriceTable, a mapping, a file path or None")
        self.ctx = AgentContext(
            store=store,
            models=models,
            prices=table,
            inbox=inbox,
            max_tool_calls_per_reply=max_tool_calls_per_reply,
        )
        self.tasks = TaskService(keep_settled=keep_settled)
        self.ctx.tasks = self.tasks
        self.subagents = SubagentService(
            self.ctx, max_children=max_children, max_children_per_parent=max_children_per_parent
        )
        self._gc: GcPolicy | None = None
        if gc_policy:
            self._gc = GcPolicy(freeze_every=gc_freeze_every)
            if gc_freeze_every is not None:
                # Counted where a child agent is made (no lifecycle event built per run just to
                # be counted: with no other listener, the registry builds none).
                self.ctx.lifecycle.on_published(self._count_start)
        self.ctx.subagents = self.subagents
        self._closed = False

    @property
    def store(self) -> SessionStore | MemoryStore:
        return self.ctx.store

    def agent(
        self,
        *,
        options: AgentOptions | None = None,
        cwd: str | None = None,
        session_id: str | None = None,
        **kwargs: Unpack[AgentExtras],
    ) -> Agent:
        """Create a root agent (depth 0)."""
        self._check_open()
        _check_options(options)
        return create_agent(self.ctx, options=options, cwd=cwd, session_id=session_id, **kwargs)

    def resume_agent(self, session_id: str, *, options: AgentOptions | None = None) -> Agent:
        """Rebuild a stored agent in this runtime; it waits for its next message."""
        self._check_open()
        _check_options(options)
        return resume_agent(self.ctx, session_id, options=options)

    def _check_open(self) -> None:
        """The close guard: a closed runtime makes nothing new (it would never be released)."""
        self.subagents.owner.check()
        if self._closed:
            raise SubagentError("RUNTIME_CLOSED", "the runtime is closed")

    def _count_start(self, agent: Agent) -> None:
        if self._gc is not None and agent.header.origin == "subagent":
            self._gc.child_started()

    def close(self) -> None:
        """Dispose every run, close every agent (children first), stop the registry."""
        self.subagents.owner.check()
        if self._closed:
            return
        self._closed = True
        self.ctx.closed = True
        self.subagents.close()
        self.tasks.close()
        # Deepest first, so a parent never outlives a child it owns.
        for agent in sorted(self.ctx.agents.values(), key=lambda a: -a.depth):
            agent.close("runtime closed")
        if self._gc is not None:
            self._gc.close()  # what was frozen is collectable again once released

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _check_options(options: object) -> None:
    """An agent's options, checked where the user passes them (a dict is a common slip)."""
    if options is not None and not isinstance(options, AgentOptions):
        raise TypeError(
            f"options must be an AgentOptions or None (AgentOptions(model=...)), "
            f"got {type(options).__name__}"
        )


def _check_count(name: str, value: object, least: int, what: str) -> None:
    """A count option: an int (not a bool) of at least `least`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    if value < least:
        raise ValueError(f"{name} must be at least {least}, got {value}")


def _check_store_path(path: Path) -> None:
    """A store path is a directory, or will be one: a file on the way is refused now, not at
    the first agent's log."""
    for folder in (path, *path.parents):
        if folder.exists():
            if not folder.is_dir():
                raise ValueError(f"store path {str(path)!r}: {str(folder)!r} is not a directory")
            return
