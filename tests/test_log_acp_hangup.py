"""A continuable ACP child whose agent closed its stdout and lived on is not said to have died.

The run ends when nobody can read the agent any more, and the agent is reaped then; the fault
that ends the activation (and the task's detail) says what happened: it hung up while still
running. An agent that really exits mid-turn is still reported as having died.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acp_peers.support import Notifier, peer_config

from agent.store import SessionStore
from providers.acp import AcpConfig, ResumableAcpProvider
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortSignal

HOSTILE = str(Path(__file__).parent / "acp_peers" / "hostile_agent.py")
TIMEOUT = 60.0


@pytest.fixture
def rt(tmp_path: Path, notifier: Notifier) -> Iterator[Runtime]:
    config = AcpConfig(
        command=sys.executable,
        args=[HOSTILE, "close_stdout"],
        eof_grace=1.0,
        terminate_grace=1.0,
        env=notifier.env,
    )
    with Runtime(store=SessionStore(tmp_path / "sessions")) as runtime:
        runtime.subagents.register(ResumableAcpProvider(config))
        yield runtime


def start(rt: Runtime, text: str) -> Any:
    request = SubagentStartRequest(
        prompt=[text_block(text)], parent=rt.agent(), signal=AbortSignal.never()
    )
    return rt.subagents.start_continuable("acp", request, label="hangs up")


def test_an_agent_that_hung_up_alive_is_not_reported_dead(rt: Runtime, notifier: Notifier) -> None:
    started = start(rt, "go")
    notifier.expect("closed")
    task = rt.tasks.wait(started.task_id, timeout=TIMEOUT)
    assert task.status == "failed"
    detail = task.detail or ""
    assert "died" not in detail
    assert "closed its stdout" in detail
    assert "still running" in detail


def test_an_agent_that_exits_mid_turn_is_still_reported_dead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "agent-state"
    state.mkdir()
    monkeypatch.setenv("ACP_PEER_STATE", str(state))
    with Runtime(store=SessionStore(tmp_path / "sessions")) as runtime:
        config = peer_config("normal", pass_env=["ACP_PEER_STATE"])
        runtime.subagents.register(ResumableAcpProvider(config))
        task = runtime.tasks.wait(start(runtime, "crash").task_id, timeout=TIMEOUT)
    assert task.status == "failed"
    assert "the ACP agent process died mid-turn" in (task.detail or "")
    assert "exit code 3" in (task.detail or "")
