"""`subagent run --base-url URL --model NAME`: a real root agent on an OpenAI-compatible
endpoint (the stub, on 127.0.0.1, in this process) delegating to a spawned child."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gevent.event
from openai_stub import Conn, OpenAIStub, StubRequest, sse, text_events, tool_call_events
from test_cli import cli

from agent.log import validate_log
from agent.store import SessionStore


def _last_user_text(body: Any) -> str:
    for message in reversed(body["messages"]):
        if message["role"] == "user":
            content = message["content"]
            return content if isinstance(content, str) else str(content)
    return ""


def _route(req: StubRequest, conn: Conn) -> None:
    """Answer by what the request is: the root's task, the child's task, or the root's wrap-up."""
    messages = req.body["messages"]
    roles = [m["role"] for m in messages]
    if _last_user_text(req.body) == "count the files" and "tool" not in roles:
        arguments = '{"description": "count", "prompt": "please count"}'
        sse(tool_call_events([("call_1", "subagent_fork", [arguments])]))(req, conn)
    elif _last_user_text(req.body) == "please count":
        sse(text_events(["there are ", "3 files"]))(req, conn)
    else:
        sse(text_events(["root: done"]))(req, conn)


def test_run_against_an_openai_compatible_endpoint(tmp_path: Path) -> None:
    with OpenAIStub(default=_route) as stub:
        proc = cli(
            "run",
            "count the files",
            "--base-url",
            stub.base_url,
            "--model",
            "stub-model",
            "--no-live",
            home=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        assert "root: done" in proc.stdout
        models = {r.body["model"] for r in stub.requests}
        assert models == {"stub-model"}
        # The root asked, the child answered, the root wrapped up: at least three requests.
        assert len(stub.requests) >= 3
    store = SessionStore(tmp_path / "sessions")
    headers = store.list()
    assert len(headers) == 2
    child = next(h for h in headers if h.origin == "subagent")
    events = store.load(child.id).events
    validate_log(events)
    texts = [
        block["text"]
        for e in events
        if e["type"] == "assistant/message"
        for block in e["data"]["message"]["content"]
    ]
    assert texts == ["there are 3 files"]


def test_run_caps_the_children_one_agent_runs_at_once(tmp_path: Path) -> None:
    """`--max-children-per-parent 1`: of three background `subagent` calls in one reply, a
    child's model request never arrives while another child's is still being answered. The
    first child to ask is held until a second arrives or 1.5 s pass: without the cap the
    second arrives at once."""
    live: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    arrived = gevent.event.Event()
    held: list[str] = []

    def route(req: StubRequest, conn: Conn) -> None:
        messages = req.body["messages"]
        roles = [m["role"] for m in messages]
        text = _last_user_text(req.body)
        if text == "fan out" and "tool" not in roles:
            calls = []
            for i in range(3):
                arguments = {
                    "description": f"c{i}",
                    "prompt": f"child {i}",
                    "run_in_background": True,
                }
                calls.append((f"call_{i}", "subagent", [json.dumps(arguments)]))
            sse(tool_call_events(calls))(req, conn)
        elif text.startswith("child "):
            if live:
                overlaps.append((*live, text))
                arrived.set()
            live.append(text)
            try:
                if not held:
                    held.append(text)
                    arrived.wait(timeout=1.5)  # bounded: with the cap, nobody else comes
                sse(text_events([f"{text}: done"]))(req, conn)
            finally:
                live.remove(text)
        else:
            sse(text_events(["root: done"]))(req, conn)

    with OpenAIStub(default=route) as stub:
        proc = cli(
            "run",
            "fan out",
            "--base-url",
            stub.base_url,
            "--model",
            "stub-model",
            "--max-children-per-parent",
            "1",
            "--no-live",
            home=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        assert "root: done" in proc.stdout
    assert overlaps == []
    children = [h for h in SessionStore(tmp_path / "sessions").list() if h.origin == "subagent"]
    assert len(children) == 3
