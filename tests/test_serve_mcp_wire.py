"""`McpServer` over real pipes, driven line by line in this process: what the SDK client of
`test_serve_mcp.py` cannot send (a reused request id) or cannot see (which call a progress
notification came with, a fault inside the server)."""

from __future__ import annotations

import json
import os
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
from subagent.serve.wiring import ServeConfig, build_served

INVALID_REQUEST = -32600
INTERNAL_ERROR = -32603


class Wire:
    """A raw MCP client: writes JSON-RPC lines, collects every message the server writes."""

    def __init__(self, tmp_path: Path) -> None:
        to_server_r, to_server_w = os.pipe()
        to_client_r, to_client_w = os.pipe()
        served = build_served(
            ServeConfig(store_dir=str(tmp_path / "sessions")), fork=False, child_options=True
        )
        pipes = ProtocolPipes(
            FileObjectPosix(to_server_r, "rb"), FileObjectPosix(to_client_w, "wb")
        )
        self.server = McpServer(served, pipes, cwd=str(tmp_path))
        self._out = FileObjectPosix(to_server_w, "wb")
        self._in = FileObjectPosix(to_client_r, "rb")
        self.answers: dict[str, Queue[dict[str, Any]]] = {}
        self.notes: Queue[dict[str, Any]] = Queue()
        self._serving = gevent.spawn(self.server.serve)
        self._reading = gevent.spawn(self._read)
        self.send({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {}})
        assert "result" in self.answer("init")

    def _read(self) -> None:
        while line := self._in.readline():
            message = json.loads(line)
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
    wire.call(rid, "list_agents", {})
    assert wire.answer(rid)["error"]["code"] == INVALID_REQUEST


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
