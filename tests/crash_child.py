"""A process that dies mid-turn, for tests/test_continuation_restart.py.

Usage: `python crash_child.py STORE_DIR`. Starts a runtime over a `SessionStore` at STORE_DIR,
a root parent, one continuable child that finishes its turn (`finisher`) and one whose model
hangs mid-turn (`hanger`). Once the hanging request is in flight (its step is flushed to the
log) and the parent has handled the finisher's settlement notice, it prints one JSON line
`{"parent": ..., "finished": ..., "hanging": ...}` and waits to be killed (`kill -9`).
"""

from __future__ import annotations

import json
import sys

import gevent
from gevent.event import Event

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import SessionStore
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortController


def last_user_text(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if message["role"] == "user":
            return "".join(b.get("text", "") for b in message["content"])
    return ""


def main(root: str) -> None:
    hung = Event()

    def respond(request: ModelRequest) -> S.Step:
        said = last_user_text(request)
        if said == "hang":
            hung.set()
            return S.hang()
        return S.text(f"done: {said}")

    runtime = Runtime(store=SessionStore(root), scripted=S.ScriptedModel(respond))
    runtime.subagents.register(SpawnProvider())
    parent = runtime.agent()

    def request(prompt: str) -> SubagentStartRequest:
        return SubagentStartRequest(
            prompt=[text_block(prompt)], parent=parent, signal=AbortController().signal
        )

    finished = runtime.subagents.start_continuable("spawn", request("finish"), label="finisher")
    runtime.tasks.wait(finished.task_id)
    parent.when_idle().get()  # the turn the settlement notice woke
    hanging = runtime.subagents.start_continuable("spawn", request("hang"), label="hanger")
    hung.wait()
    ids = {"parent": parent.id, "finished": finished.child_id, "hanging": hanging.child_id}
    sys.stdout.write(json.dumps(ids) + "\n")
    sys.stdout.flush()
    while True:  # until SIGKILL: never closes anything
        gevent.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
