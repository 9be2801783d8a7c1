"""A process that starts a continuable ACP child and is then killed, for
tests/test_acp_continuable.py.

Usage: `python acp_child_process.py HOME`. Starts a runtime over `HOME/sessions`, a root parent,
and one continuable child on the SDK peer (`normal` mode, `ACP_PEER_STATE` passed through by
name, as a deployment passes an API key). Once the child's first turn completed and the parent
handled its settlement notice, it prints `{"parent", "child", "task_output"}` as one JSON line
and waits to be killed (`kill -9`). Run with `tests/` on PYTHONPATH (for `acp_peers`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gevent
from acp_peers.support import peer_config

from agent.store import SessionStore
from providers.acp import ResumableAcpProvider
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortSignal


def main(home: str) -> None:
    runtime = Runtime(store=SessionStore(Path(home) / "sessions"))
    provider = ResumableAcpProvider(peer_config("normal", pass_env=["ACP_PEER_STATE"]))
    runtime.subagents.register(provider)
    parent = runtime.agent()
    request = SubagentStartRequest(
        prompt=[text_block("first")], parent=parent, signal=AbortSignal.never()
    )
    started = runtime.subagents.start_continuable("acp", request, label="remote helper")
    task = runtime.tasks.wait(started.task_id)
    parent.when_idle().get()  # the turn the settlement notice woke
    line = {"parent": parent.id, "child": started.child_id, "task_output": task.output}
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    while True:
        gevent.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
