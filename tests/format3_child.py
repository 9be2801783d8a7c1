"""A process that dies mid-step, for tests/test_log_format3.py.

Usage: `python format3_child.py STORE_DIR`. Runs one agent over a `SessionStore` at STORE_DIR
(a new session: log format 3): step 1 calls a tool, which holds until a steer is queued; step 2's
model call then hangs. Once that call is in flight (its step checkpoint has written the step's
events to the file), it prints `{"session": ID}` and waits to be killed (`kill -9`).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import gevent
from gevent.event import Event

from actors.agents import create_agent
from agent.context import AgentContext
from agent.model import ModelRequest
from agent.models import ModelRegistry
from agent.models import scripted as S
from agent.store import SessionStore
from agent.tools import Tool, ToolContext


def main(root: str) -> None:
    in_flight = Event()
    steered = Event()
    reached = Event()

    def respond(request: ModelRequest) -> S.Step:
        if request.step == 1:
            return S.tool_call("hold", {})
        in_flight.set()
        return S.hang()

    def hold(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        reached.set()
        steered.wait()
        return "held"

    models = ModelRegistry()
    models.register("scripted", S.ScriptedModel(respond))
    ctx = AgentContext(store=SessionStore(root), models=models)
    ctx.tools.register(Tool("hold", "holds", {"type": "object"}, hold))
    agent = create_agent(ctx)
    agent.send("go").get()
    reached.wait()
    agent.steer("left")
    while not agent.actor._steers:
        gevent.sleep(0.001)
    steered.set()
    in_flight.wait()
    sys.stdout.write(json.dumps({"session": agent.id}) + "\n")
    sys.stdout.flush()
    gevent.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1])
