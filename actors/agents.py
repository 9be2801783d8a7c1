"""Making agents: a fresh one, a seeded one (fork), or one rebuilt from its stored log (resume).

Creation is a small transaction: if anything fails after the session was created, the session is
deleted again before the error propagates, so a failed creation leaves nothing behind.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, cast

from actors.agent_handle import Agent
from actors.agent_messages import QueuedSend
from agent.context import AgentContext
from agent.events import Event, SessionHeader
from agent.log import SessionLog, events_of_types
from agent.loop import AgentCore
from agent.model import ModelAdapter
from agent.options import AgentOptions
from agent.prompt import SystemPrompt
from agent.tools import ToolScope

__all__ = ["create_agent", "new_session_id", "pending_inbox", "resume_agent"]


# Session ids: 64 random bits from a generator seeded by the OS (reseeded in a forked child),
# as unpredictable across processes as `os.urandom` without a syscall per child.
_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))


def new_session_id() -> str:
    return f"s{_ids.getrandbits(64):016x}"


def create_agent(
    ctx: AgentContext,
    *,
    options: AgentOptions | None = None,
    cwd: str | None = None,
    session_id: str | None = None,
    parent_session: str | None = None,
    origin: Literal["subagent"] | None = None,
    delegation_depth: int = 0,
    seed: Sequence[Mapping[str, Any]] = (),
    tools: ToolScope | None = None,
    prompt: SystemPrompt | None = None,
) -> Agent:
    """Create and publish an agent. `tools`/`prompt` are its scopes (a new flat scope over the
    runtime's globals when omitted)."""
    options = options or AgentOptions()
    adapter, model_name = ctx.models.resolve(options.model)
    header = SessionHeader(
        id=session_id or new_session_id(),
        created_at=time.time(),
        cwd=cwd if cwd is not None else os.getcwd(),
        parent_session=parent_session,
        origin=origin,
        delegation_depth=delegation_depth,
        seed_length=len(seed),
    )
    session_log = ctx.store.create(header, cast(Sequence[Event], seed))
    try:
        if seed:
            session_log.append("session/end-seed", {"length": len(seed)})
        agent = _build(ctx, session_log, options, adapter, model_name, tools, prompt)
    except BaseException:
        _discard_session(ctx, header.id, session_log)
        raise
    return _publish(ctx, agent)


def resume_agent(
    ctx: AgentContext,
    session_id: str,
    *,
    options: AgentOptions | None = None,
    tools: ToolScope | None = None,
    prompt: SystemPrompt | None = None,
) -> Agent:
    """Rebuild an agent from its stored log. It continues turn numbering, keeps pending inbox
    work queued, and waits for a message rather than waking itself."""
    if session_id in ctx.agents:
        raise ValueError(f"agent {session_id} is already live")
    session_log = ctx.store.open(session_id)
    try:
        options = options or AgentOptions()
        adapter, model_name = ctx.models.resolve(options.model)
        agent = _build(ctx, session_log, options, adapter, model_name, tools, prompt)
        agent.actor.restore_queue(pending_inbox(session_log.events))
    except BaseException:
        session_log.close()
        raise
    return _publish(ctx, agent)


def _build(
    ctx: AgentContext,
    session_log: SessionLog,
    options: AgentOptions,
    adapter: ModelAdapter,
    model_name: str,
    tools: ToolScope | None,
    prompt: SystemPrompt | None,
) -> Agent:
    """The agent over an open log: a new flat tool scope and prompt scope unless given."""
    tools = tools if tools is not None else ToolScope(ctx.tools)
    prompt = prompt if prompt is not None else SystemPrompt(parent=ctx.prompt)
    header = session_log.header
    core = AgentCore(
        session_id=header.id,
        log=session_log,
        options=options,
        model=adapter,
        model_name=model_name,
        tools=tools,
        prompt=prompt,
        variables=ctx.variables,
        price=ctx.prices.get(options.model),
    )
    return Agent(ctx=ctx, core=core, header=header, tools=tools, prompt=prompt, options=options)


def _publish(ctx: AgentContext, agent: Agent) -> Agent:
    """Make the agent visible (`ctx.agents`) and tell the hooks, before its first turn runs."""
    ctx.agents[agent.id] = agent
    ctx.lifecycle.published(agent)
    return agent


_INBOX = frozenset({"inbox/accepted", "inbox/claimed", "inbox/discarded"})


def pending_inbox(events: Iterable[Mapping[str, Any]]) -> list[QueuedSend]:
    """Accepted sends that were never claimed nor discarded, in acceptance order."""
    pending: dict[str, QueuedSend] = {}
    for event in events_of_types(events, _INBOX):
        kind = event["type"]
        if kind == "inbox/accepted" and event["data"]["kind"] == "send":
            data = event["data"]
            pending[data["message_id"]] = {
                "id": data["message_id"],
                "content": data["content"],
                "source": data["source"],
            }
        elif kind in ("inbox/claimed", "inbox/discarded"):
            pending.pop(event["data"]["message_id"], None)
    return list(pending.values())


def _discard_session(ctx: AgentContext, session_id: str, session_log: SessionLog) -> None:
    try:
        session_log.close()
    finally:
        if ctx.store.exists(session_id):
            ctx.store.delete(session_id)
