"""A process that starts a continuable ACP child and is then killed, for
tests/test_acp_continuable.py.

Usage: `python acp_child_process.py HOME PROMPT`. Starts a runtime over `HOME/sessions`, a root
parent, and one continuable child on the SDK peer (`normal` mode; `ACP_PEER_STATE` and
`ACP_PEER_NOTIFY` passed through by name, as a deployment passes an API key) with PROMPT. With
PROMPT `hang` it prints `{"parent", "child"}` as one JSON line at once (the peer reports when it
hangs); otherwise it waits for the first turn and the parent's handling of its settlement notice,
and adds `task_output`. Then it waits to be killed (`kill -9`). Run with `tests/` on PYTHONPATH
(for `acp_peers`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import gevent
from acp_peers.support import peer_config

from agent.store import SessionStore
from providers.acp import ResumableAcpProvider
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortSignal


def main(home: str, prompt: str) -> None:
    runtime = Runtime(store=SessionStore(Path(home) / "sessions"))
    provider = ResumableAcpProvider(
        peer_config("normal", pass_env=["ACP_PEER_STATE", "ACP_PEER_NOTIFY"])
    )
    runtime.subagents.register(provider)
    parent = runtime.agent()
    request = SubagentStartRequest(
        prompt=[text_block(prompt)], parent=parent, signal=AbortSignal.never()
    )
    started = runtime.subagents.start_continuable("acp", request, label="remote helper")
    line: dict[str, Any] = {"parent": parent.id, "child": started.child_id}
    if prompt != "hang":
        line["task_output"] = runtime.tasks.wait(started.task_id).output
        parent.when_idle().get()  # the turn the settlement notice woke
    sys.stdout.write(json.dumps(line) + "\n")
    sys.stdout.flush()
    while True:
        gevent.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
