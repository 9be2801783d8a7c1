"""A working directory whose name is not UTF-8 (docs/decisions.md, "Non-UTF-8 directories").

Python hands such a name over `surrogateescape`d; a session log, an ACP message and a trace are
UTF-8 text, so none can record it. Every path refuses it at start with a typed error naming the
directory (nothing spawned, no session made), instead of an encode error deep inside.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from acp_peers.support import Parent, text_prompt
from gevent import subprocess as gsub

from agent.store import SessionStore
from providers.acp import AcpConfig, AcpProvider
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest
from supervision.signal import AbortSignal

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def bad_dir(tmp_path: Path) -> str:
    """`<tmp>/café` with the é as the single Latin-1 byte 0xE9: a real directory."""
    raw = os.path.join(os.fsencode(tmp_path), b"caf\xe9")
    os.mkdir(raw)
    return os.fsdecode(raw)


def test_the_acp_provider_refuses_it_before_spawning(bad_dir: str, tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    config = AcpConfig(command=sys.executable, args=["-c", f"open({str(marker)!r}, 'w')"])
    request = SubagentStartRequest(
        prompt=text_prompt("hi"), parent=Parent(cwd=bad_dir), signal=AbortSignal.never()
    )
    with pytest.raises(SubagentError) as info:
        AcpProvider(config).start(request)
    assert info.value.code == "START_FAILED"
    assert "parent cwd" in info.value.detail and "is not valid UTF-8" in info.value.detail
    assert not marker.exists()


def test_an_acp_config_cwd_is_refused_when_configured(bad_dir: str) -> None:
    with pytest.raises(ValueError, match=r"cwd .* is not valid UTF-8"):
        AcpConfig(command=sys.executable, cwd=bad_dir)


def test_a_local_agent_there_is_refused_and_no_session_is_left(
    bad_dir: str, tmp_path: Path
) -> None:
    store = SessionStore(tmp_path / "store")
    runtime = Runtime(store=store)
    try:
        with pytest.raises(ValueError, match="is not valid UTF-8"):
            runtime.agent(cwd=bad_dir)
        assert list(store.list()) == []
        assert not list(runtime.ctx.agents)
    finally:
        runtime.close()


# `run` gets a base URL so its model route is ready (else that usage error would come first);
# nothing is ever sent there: the cwd is refused before the root agent exists.
RUN = ["run", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "hi"]


@pytest.mark.parametrize("command", [RUN, ["mcp"]])
def test_the_cli_there_says_so_in_one_line(
    bad_dir: str, tmp_path: Path, command: list[str]
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SUBAGENT_HOME"}
    env["PYTHONPATH"] = str(REPO)
    proc = gsub.run(
        [sys.executable, "-m", "subagent.cli", "--home", str(tmp_path / "home"), *command],
        cwd=os.fsencode(bad_dir),
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    assert "is not valid UTF-8" in proc.stderr, proc.stderr
    assert proc.stdout == ""
