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

from providers.acp import AcpConfig, AcpProvider
from subagent.types import SubagentStartRequest
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
