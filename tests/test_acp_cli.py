"""`subagent run --acp` leaves nothing behind when it dies (issue 15): SIGTERM and a second Ctrl-C
reap the agents' process groups before exiting, and an agent dies with the CLI even on SIGKILL
(`PR_SET_PDEATHSIG`). Real CLI processes, a real stdlib agent that ignores SIGTERM and stdin EOF;
every wait is on process state or on the agent's own reports, never a sleep."""

from __future__ import annotations

import os
import shlex
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from acp_peers.support import FAKE, Notifier, pid_alive, wait_until
from gevent import subprocess

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only"
)


def run_cli(tmp_path: Path, notifier: Notifier, agent: str) -> Any:
    """`subagent run --acp AGENT` with the notify socket passed through `--acp-env`."""
    env = {**os.environ, **notifier.env, "PYTHONPATH": os.pathsep.join(sys.path)}
    command = shlex.join([sys.executable, FAKE, *agent.split()])
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "subagent.cli",
            "--home",
            str(tmp_path / "home"),
            "run",
            "--no-live",
            "--acp",
            command,
            "--acp-env",
            "ACP_PEER_NOTIFY",
            "do the task",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )


def reap(proc: Any) -> int:
    code: int = proc.wait(timeout=60)
    return code


def test_an_agent_dies_with_the_cli_even_on_sigkill(tmp_path: Path, notifier: Notifier) -> None:
    cli = run_cli(tmp_path, notifier, "deaf")
    agent = int(notifier.expect_all("pid", "prompt")["pid"])
    assert pid_alive(agent)
    cli.kill()  # SIGKILL: no handler runs in the CLI
    assert reap(cli) == -signal.SIGKILL
    wait_until(lambda: not pid_alive(agent))  # the kernel killed it (it ignores EOF and TERM)


def test_sigterm_reaps_the_agents_group_first(tmp_path: Path, notifier: Notifier) -> None:
    cli = run_cli(tmp_path, notifier, "launcher deaf")
    seen = notifier.expect_all("pid", "agent", "prompt")
    launcher, agent = int(seen["pid"]), int(seen["agent"])
    cli.send_signal(signal.SIGTERM)
    assert reap(cli) == 143
    # The grandchild is out of PR_SET_PDEATHSIG's reach: only the group kill takes it.
    wait_until(lambda: not pid_alive(agent))
    wait_until(lambda: not pid_alive(launcher))


def test_a_second_ctrl_c_reaps_the_agents_group_first(tmp_path: Path, notifier: Notifier) -> None:
    cli = run_cli(tmp_path, notifier, "launcher deaf")
    seen = notifier.expect_all("pid", "agent", "prompt")
    launcher, agent = int(seen["pid"]), int(seen["agent"])
    cli.send_signal(signal.SIGINT)
    assert cli.stderr is not None
    assert b"interrupted; cancelling" in cli.stderr.readline()
    cli.send_signal(signal.SIGINT)
    assert reap(cli) == 130
    wait_until(lambda: not pid_alive(agent))
    wait_until(lambda: not pid_alive(launcher))
