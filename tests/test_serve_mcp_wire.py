"""`McpServer` over real pipes, driven line by line in this process: what the SDK client of
`test_serve_mcp.py` cannot send (a reused request id) or cannot see (which call a progress
notification came with, a fault inside the server)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import pytest
from gevent.fileobject import FileObjectPosix
from gevent.queue import Queue

from subagent.serve import mcp_server
from subagent.serve.mcp_server import McpServer
from subagent.serve.stdio import ProtocolPipes
from subagent.serve.wiring import ServeConfig, acp_config_from_flag, build_served

INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603
INVALID_PARAMS = -32602


class Wire:
    """A raw MCP client: writes JSON-RPC lines, collects every message the server writes."""

    def __init__(self, tmp_path: Path, *acp: str) -> None:
        to_server_r, to_server_w = os.pipe()
        to_client_r, to_client_w = os.pipe()
        config = ServeConfig(
            store_dir=str(tmp_path / "sessions"),
            acp=tuple(acp_config_from_flag(flag) for flag in acp),
        )
        served = build_served(config, fork=False, child_options=True)
        pipes = ProtocolPipes(
            FileObjectPosix(to_server_r, "rb"), FileObjectPosix(to_client_w, "wb")
        )
        self.server = McpServer(served, pipes, cwd=str(tmp_path))
        self._out = FileObjectPosix(to_server_w, "wb")
        self._in = FileObjectPosix(to_client_r, "rb")
        self.answers: dict[str, Queue[dict[str, Any]]] = {}
        self.notes: Queue[dict[str, Any]] = Queue()
        self.seen: list[dict[str, Any]] = []  # every message, in arrival order
        self._serving = gevent.spawn(self.server.serve)
        self._reading = gevent.spawn(self._read)
        self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}})
        assert "result" in self.answer("init")

    def _read(self) -> None:
        while line := self._in.readline():
            message = json.loads(line)
            self.seen.append(message)
            if "id" in message and "method" not in message:
                self.answers.setdefault(json.dumps(message["id"]), Queue()).put(message)
            else:
                self.notes.put(message)

    def send(self, message: dict[str, Any]) -> None:
        self._out.write(json.dumps(message).encode() + b"\n")
        self._out.flush()

    def answer(self, rid: Any, timeout: float = 30) -> dict[str, Any]:
        """The next answer to request id `rid`."""
        got: dict[str, Any] = self.answers.setdefault(json.dumps(rid), Queue()).get(timeout=timeout)
        return got

    def call(self, rid: Any, name: str, arguments: dict[str, Any], **meta: Any) -> None:
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if meta:
            params["_meta"] = meta
        self.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params})

    def start_background(self, rid: Any, prompt: str, timeout: float = 60) -> tuple[str, str]:
        """Start a background one-shot child of the `peer` ACP agent (labelled `remote`), as
        request `rid`; its child id and task id, read from the answer."""
        args = {"description": "remote", "prompt": prompt, "run_in_background": True}
        self.call(rid, "subagent_peer", args)
        words = text_of(self.answer(rid, timeout=timeout)).split()
        return words[2], words[8].rstrip(".")

    def close(self) -> None:
        self._out.close()  # the client hangs up: the server shuts down
        self._serving.get(timeout=30)
        self._reading.get(timeout=30)
        self._in.close()


@pytest.fixture
def wire(tmp_path: Path) -> Iterator[Wire]:
    w = Wire(tmp_path)
    try:
        yield w
    finally:
        w.close()


def hang(rid: Any, wire: Wire) -> str:
    """A foreground child that runs until interrupted (a call that stays in flight); its id."""
    wire.call(rid, "subagent", {"description": "hang", "prompt": "/hang"}, progressToken=rid)
    started = wire.notes.get(timeout=30)["params"]
    assert started["progressToken"] == rid
    child: str = started["message"].split()[0]
    return child


def test_a_request_id_still_in_flight_is_refused(wire: Wire) -> None:
    """Two running calls under one id could not be cancelled or answered apart."""
    child = hang(7, wire)
    wire.call(7, "list_agents", {})
    assert wire.answer(7)["error"]["code"] == INVALID_REQUEST
    wire.call(8, "interrupt_agent", {"agent_id": child})
    assert wire.answer(8)["result"]["isError"] is False
    assert "result" in wire.answer(7)  # the first call, ended by the interrupt
    # Once it is over, its id may be used again.
    wire.call(7, "list_agents", {})
    assert wire.answer(7)["result"]["isError"] is False


@pytest.mark.parametrize("rid", [{"an": "object"}, [1], None, True])
def test_a_call_id_must_be_a_string_or_a_number(wire: Wire, rid: Any) -> None:
    """Refused as an invalid request whose answer carries `id: null` (JSON-RPC 2.0: an id that
    cannot be read is answered with null, never echoed as an object or a boolean)."""
    wire.call(rid, "list_agents", {})
    assert wire.answer(None)["error"]["code"] == INVALID_REQUEST


def test_a_call_that_fails_before_it_runs_leaves_nothing_behind(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault while the call is being set up (here: building its `ToolCall`) answers an internal
    error, and the id is free again: no running call is left registered under it."""

    def broken(*_args: object, **_kwargs: object) -> object:
        raise RuntimeError("simulated fault while setting up the call")

    monkeypatch.setattr(mcp_server, "ToolCall", broken)
    wire.call(5, "list_agents", {})
    assert wire.answer(5)["error"]["code"] == INTERNAL_ERROR
    monkeypatch.undo()
    wire.call(5, "list_agents", {})
    assert wire.answer(5)["result"]["isError"] is False


def progress_of(wire: Wire, token: Any) -> list[str]:
    return [
        m["params"]["message"]
        for m in wire.seen
        if m.get("method") == "notifications/progress" and m["params"]["progressToken"] == token
    ]


def test_a_background_childs_progress_goes_to_the_call_waiting_on_it(wire: Wire) -> None:
    """Progress belongs to a request: once the call that started a background child returned,
    the child's later events go to the call that waits for it (`task_output` with wait)."""
    wire.call(1, "subagent", {"description": "bg", "prompt": "/hang", "run_in_background": True})
    started = wire.answer(1)["result"]["content"][0]["text"]
    child, task = started.split()[3], started.split()[5].rstrip(").")
    wire.call(2, "task_output", {"task_id": task, "wait": True}, progressToken="wait")
    # Calls start in order, and task_output claims the child before it first waits: call 2 is
    # waiting by the time call 3 is answered.
    wire.call(3, "list_agents", {})
    assert "result" in wire.answer(3)
    wire.call(4, "interrupt_agent", {"agent_id": child})
    assert wire.answer(4)["result"]["isError"] is False
    waited = wire.answer(2)
    assert task in waited["result"]["content"][0]["text"]
    seen = progress_of(wire, "wait")
    assert seen, "the waiting call heard nothing of the child"
    assert all(line.startswith(f"{child} (bg): ") for line in seen)
    # Progress only while the request is active: all of it before the answer.
    answer_at = wire.seen.index(waited)
    assert all(
        i < answer_at
        for i, m in enumerate(wire.seen)
        if m.get("method") == "notifications/progress" and m["params"]["progressToken"] == "wait"
    )


def test_every_call_waiting_on_a_child_hears_its_progress(wire: Wire) -> None:
    wire.call(1, "subagent", {"description": "bg", "prompt": "/hang", "run_in_background": True})
    started = wire.answer(1)["result"]["content"][0]["text"]
    child, task = started.split()[3], started.split()[5].rstrip(").")
    wire.call(2, "task_output", {"task_id": task, "wait": True}, progressToken="first")
    wire.call(3, "task_output", {"task_id": task, "wait": True}, progressToken="second")
    wire.call(4, "list_agents", {})  # calls start in order: both wait by the time this answers
    assert "result" in wire.answer(4)
    wire.call(5, "interrupt_agent", {"agent_id": child})
    assert wire.answer(5)["result"]["isError"] is False
    assert "result" in wire.answer(2) and "result" in wire.answer(3)
    assert progress_of(wire, "first") == progress_of(wire, "second") != []


def text_of(answer: dict[str, Any]) -> str:
    text: str = answer["result"]["content"][0]["text"]
    return text


def test_a_background_child_is_in_the_next_listing(wire: Wire) -> None:
    """Once an answer names a child, a call sent after it lists that child: the spawn child is
    a live agent with its log stored before the answer is written, whether it still runs or
    already ended."""
    for prompt in ("/hang", "quick"):
        wire.call(
            prompt, "subagent", {"description": prompt, "prompt": prompt, "run_in_background": True}
        )
        child = text_of(wire.answer(prompt)).split()[3]
        wire.call(f"list {prompt}", "list_agents", {})
        assert f"{child}  status=" in text_of(wire.answer(f"list {prompt}"))


PEER = Path(__file__).resolve().parent / "acp_peers" / "sdk_agent.py"


def test_a_background_acp_child_is_listed_while_it_runs(tmp_path: Path) -> None:
    """A one-shot ACP child has no local agent and no log in the store: it is listed from the
    service's run table, from the answer that names it until it ends, then as ended."""
    wire = Wire(tmp_path, f"peer={sys.executable} {PEER} wait")
    try:
        child, task = wire.start_background(1, "wait here")
        wire.call(2, "list_agents", {})
        (line,) = text_of(wire.answer(2)).splitlines()
        assert line.startswith(f"{child}  status=running  mode=one-shot  depth=1  ")
        assert line.endswith("  label=remote")
        wire.call(3, "list_agents", {"scope": "descendants"})
        assert text_of(wire.answer(3)).startswith(f"{child}  status=running  ")
        wire.call(4, "task_kill", {"task_id": task})
        assert wire.answer(4)["result"]["isError"] is False
        wire.call(5, "task_output", {"task_id": task, "wait": True})
        assert "killed" in text_of(wire.answer(5, timeout=60))
        # Ended: listed so as long as its task is kept (nothing else of it is kept here).
        wire.call(6, "list_agents", {})
        (line,) = text_of(wire.answer(6)).splitlines()
        assert line.startswith(f"{child}  status=ended  mode=one-shot  depth=1  ")
    finally:
        wire.close()


@pytest.mark.parametrize(
    "request_",
    [
        {"method": "ping"},
        {"method": "tools/list"},
        {"method": "initialize", "params": {}},
        {"method": "tools/call", "params": {"name": "list_agents", "arguments": {}}},
    ],
    ids=["ping", "tools/list", "initialize", "tools/call"],
)
def test_any_request_reusing_a_running_calls_id_is_refused(
    wire: Wire, request_: dict[str, Any]
) -> None:
    """Whatever its method, a request under the id of a call still running is an invalid
    request: answering it would give the client two answers under one id."""
    child = hang(7, wire)
    wire.send({"jsonrpc": "2.0", "id": 7, **request_})
    refused = wire.answer(7)
    assert refused["error"]["code"] == INVALID_REQUEST
    assert "still running" in refused["error"]["message"]
    wire.call(8, "interrupt_agent", {"agent_id": child})
    assert wire.answer(8)["result"]["isError"] is False
    ended = wire.answer(7)  # the running call's own answer, once
    assert "result" in ended
    answers = [m for m in wire.seen if m.get("id") == 7 and "method" not in m]
    assert answers == [refused, ended]
    wire.call(7, "list_agents", {})  # over: the id may be used again
    assert wire.answer(7)["result"]["isError"] is False


def test_a_progress_token_of_a_running_call_is_refused(wire: Wire) -> None:
    """MCP: a progress token is unique among the active requests; a second call under a token
    in use could not be told apart in the progress stream, so it is refused, not run."""
    child = hang("first", wire)
    wire.call("second", "list_agents", {}, progressToken="first")
    refused = wire.answer("second")
    assert refused["error"]["code"] == INVALID_PARAMS
    assert "progressToken" in refused["error"]["message"]
    wire.call("stop", "interrupt_agent", {"agent_id": child})
    assert wire.answer("stop")["result"]["isError"] is False
    assert "result" in wire.answer("first")
    wire.call("third", "list_agents", {}, progressToken="first")  # free again
    assert wire.answer("third")["result"]["isError"] is False


def test_the_server_sends_no_requests_of_its_own(wire: Wire) -> None:
    """Server-to-client traffic is answers and notifications only: the server has no request
    id of its own to reuse (docs/decisions.md)."""
    hang("a", wire)
    wire.call("b", "subagent", {"description": "bg", "prompt": "hi", "run_in_background": True})
    wire.answer("b")
    wire.call("c", "tools/list", {})
    wire.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "a"}})
    wire.send({"jsonrpc": "2.0", "id": "d", "method": "ping"})
    wire.answer("d")
    assert wire.seen
    for message in wire.seen:
        assert ("method" in message) != ("id" in message), message
