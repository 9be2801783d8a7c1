"""The typed seams below the face: where a Protocol-typed value is narrowed, it is checked.

The seam vocabulary names the parent agent, its options and the trace by types of its own
(`AgentView`, `OptionsView`, `TraceParent`); an in-process provider narrows the parent with
`agent.parent.parent_agent` and refuses options it cannot build from; a tool reaches its caller
through `ToolContext.caller`.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from seam_kit import kit

from agent import tracing
from agent.errors import ToolError
from agent.options import AgentOptions
from agent.parent import parent_agent
from agent.tools import ToolContext
from providers.inprocess import ForkProvider
from providers.ray_runtime import _StandInParent
from subagent import types
from supervision.signal import AbortSignal


def test_parent_agent_accepts_a_live_agent_and_rays_stand_in() -> None:
    with kit() as k:
        parent = k.parent()
        assert parent_agent(parent) is parent
        stand_in = _StandInParent(
            id="elsewhere", ctx=k.runtime.ctx, cwd="/", depth=1, options=AgentOptions()
        )
        assert parent_agent(stand_in) is stand_in


def test_parent_agent_refuses_what_is_not_an_agent_of_this_runtime() -> None:
    with kit() as k:
        no_ctx = SimpleNamespace(id="x", cwd="/", depth=0, options=AgentOptions(), ctx=object())
        loose_options = SimpleNamespace(
            id="x", cwd="/", depth=0, options=SimpleNamespace(model="scripted:x"), ctx=k.runtime.ctx
        )
        for bad in (no_ctx, loose_options, None):
            with pytest.raises(TypeError, match="agent of this runtime"):
                parent_agent(bad)  # type: ignore[arg-type]


def test_in_process_start_refuses_options_it_cannot_build_from() -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(TypeError, match="agent_options must be an AgentOptions"):
            k.start(parent, agent_options=SimpleNamespace(model="scripted:default"))
        # Refused before the child existed: no session, no live agent, no run.
        assert [h.id for h in k.store.list()] == [parent.id]
        assert list(k.runtime.ctx.agents) == [parent.id]
        assert k.service.runs() == []


def test_a_fork_needs_a_parent_with_its_session_log() -> None:
    with kit() as k:
        stand_in = _StandInParent(
            id="elsewhere", ctx=k.runtime.ctx, cwd="/", depth=0, options=AgentOptions()
        )
        with pytest.raises(TypeError, match="session log"):
            ForkProvider().seed_for(stand_in)
        assert ForkProvider().seed_for(k.parent()) == []  # a fresh parent: nothing completed


def test_tool_context_caller_is_the_agent_or_a_tool_error() -> None:
    bare = ToolContext(agent=None, session_id="s1", call_id="c1", signal=AbortSignal.never())
    with pytest.raises(ToolError, match="needs a calling agent"):
        _ = bare.caller
    with kit() as k:
        agent = k.parent()
        ctx = ToolContext(agent=agent, session_id=agent.id, call_id="c1", signal=bare.signal)
        assert ctx.caller is agent


def test_trace_parent_is_one_class_for_the_seam_and_the_tracer() -> None:
    assert tracing.TraceParent is types.TraceParent
