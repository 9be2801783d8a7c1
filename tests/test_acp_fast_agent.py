"""The ACP provider against a real third-party agent: `fast-agent acp --model passthrough`.

fast-agent (PyPI `fast-agent-mcp`) needs Python >= 3.12, so it lives in its own environment:
`ACP_FAST_AGENT` names its `fast-agent` executable, else `fast-agent` is looked up on PATH.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from acp_peers.support import Parent, group_alive, text_prompt

from agent.store import SessionStore
from providers.acp import (
    AcpConfig,
    AcpProvider,
    ResumableAcpProvider,
    discover_acp_provider,
    provider_for_stored_child,
)
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.types import MessageSource, SubagentStartRequest
from supervision.signal import AbortController, AbortSignal

FAST_AGENT = os.environ.get("ACP_FAST_AGENT") or shutil.which("fast-agent")

pytestmark = pytest.mark.skipif(
    FAST_AGENT is None,
    reason=(
        "fast-agent is not installed: it needs Python >= 3.12 (pip install fast-agent-mcp into "
        "such an environment) and ACP_FAST_AGENT naming its fast-agent executable"
    ),
)


def config(**overrides: object) -> AcpConfig:
    assert FAST_AGENT is not None
    return AcpConfig(
        command=FAST_AGENT,
        args=["acp", "--model", "passthrough"],
        env={"NO_COLOR": "1"},
        **overrides,  # type: ignore[arg-type]
    )


def test_fast_agent_passthrough_turn(tmp_path: Path) -> None:
    provider = AcpProvider(config())
    run = provider.start(
        SubagentStartRequest(
            prompt=text_prompt("ping from the parent"),
            parent=Parent(cwd=str(tmp_path)),
            signal=AbortSignal.never(),
        )
    )
    try:
        result = run.result.get(timeout=60)
    finally:
        run.dispose()
    assert not group_alive(run.pid)
    assert result.stop_reason == "completed", result.diagnostic
    assert "ping from the parent" in "".join(b["text"] for b in result.output)


def test_fast_agent_abort_then_dispose_leaves_nothing(tmp_path: Path) -> None:
    controller = AbortController()
    run = AcpProvider(config(eof_grace=1.0, terminate_grace=1.0)).start(
        SubagentStartRequest(
            prompt=text_prompt("hello"), parent=Parent(cwd=str(tmp_path)), signal=controller.signal
        )
    )
    controller.abort()
    assert run.result.get(timeout=60).stop_reason == "aborted"
    run.dispose()
    assert not group_alive(run.pid)


def test_fast_agent_child_is_continued_cold_from_its_record(tmp_path: Path) -> None:
    """A continuable fast-agent child, continued by a new runtime whose provider is rebuilt from
    the child's ACP record alone: fast-agent loads its session (`session/load`), so the second
    turn lands in the same conversation as the first."""
    work = tmp_path / "work"
    work.mkdir()
    store_dir = tmp_path / "sessions"
    provider = ResumableAcpProvider(config(cwd=str(work)))
    with Runtime(store=SessionStore(store_dir)) as rt:
        rt.subagents.register(provider)
        parent = rt.agent()
        request = SubagentStartRequest(
            prompt=text_prompt("alpha one"), parent=parent, signal=AbortSignal.never()
        )
        started = rt.subagents.start_continuable("acp", request, label="fast")
        first = rt.tasks.wait(started.task_id, timeout=60)
        assert first.status == "completed", first.detail
        parent_id, child_id = parent.id, started.child_id

    with Runtime(store=SessionStore(store_dir)) as rt:
        again = provider_for_stored_child(rt.store, child_id)
        assert again is not None and again.config.command == FAST_AGENT
        rt.subagents.register(again)
        parent = rt.resume_agent(parent_id)
        [row] = rt.subagents.list_children(parent_id)
        assert (row["id"], row["label"], row["activity"]) == (child_id, "fast", "stored")
        sent = rt.subagents.send_message(parent, child_id, "beta two", MessageSource.user())
        assert sent.kind == "started"
        second = rt.tasks.wait(sent.task_id or "", timeout=60)
        assert second.status == "completed", second.detail
        assert "beta two" in "".join(b["text"] for b in second.output)

    # fast-agent's own transcript of the session holds both turns, in order.
    [history] = (work / ".fast-agent" / "sessions").glob("*/history_agent.json")
    text = history.read_text()
    assert text.index("alpha one") < text.index("beta two")


def test_fast_agent_discovery_takes_a_signal(tmp_path: Path) -> None:
    controller = AbortController()
    provider = discover_acp_provider(config(), cwd=str(tmp_path), signal=controller.signal)
    assert isinstance(provider, ResumableAcpProvider)
    controller.abort()
    with pytest.raises(SubagentError) as info:
        discover_acp_provider(config(), cwd=str(tmp_path), signal=controller.signal)
    assert info.value.code == "ABORTED"
