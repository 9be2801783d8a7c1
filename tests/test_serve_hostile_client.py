"""`subagent acp` and `subagent mcp` (real subprocesses, offline model) against a client that
is hostile or dying: requests sent while SIGTERM tears the server down, huge lines, envelopes
that are not JSON-RPC 2.0, a client that stops reading its stdout."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

from gevent import subprocess as gsub
from gevent.subprocess import PIPE
from test_serve_acp_misbehaving import REPO, TIMEOUT, Client, _alive, _children, prompt, text

from agent.store import SessionStore

SHUTTING_DOWN = -32000
FAKE_AGENT = REPO / "tests" / "acp_peers" / "fake_agent.py"


class McpClient(Client):
    """The same raw client, to `subagent --home HOME mcp ARGS...`."""

    def __init__(self, home: Path, *args: str) -> None:
        command = [sys.executable, "-m", "subagent.cli", "--home", str(home), "mcp", *args]
        self.proc = gsub.Popen(command, cwd=REPO, stdin=PIPE, stdout=PIPE, stderr=PIPE)
        self.seen = []
        self._taken = set()


def _refused_while_stopping(client: Client, first_probe: int) -> int:
    """Probe with an unknown method until the answer says the server is shutting down (before
    the signal is handled it is `-32601`); the next free request id."""
    rid = first_probe
    while True:
        error = client.ask(rid, "_probe/teardown", {})["error"]
        rid += 1
        if error["code"] == SHUTTING_DOWN:
            assert error["message"] == "server is shutting down"
            return rid
        assert error["code"] == -32601, error


# -- 1. requests during SIGTERM teardown -----------------------------------------------------


def test_acp_requests_during_sigterm_teardown_are_refused_and_start_nothing(
    tmp_path: Path,
) -> None:
    """A request read after the first SIGTERM used to be served: a `session/new` made a
    coordinator and a `session/prompt` started a turn (and its child) that the teardown, already
    past its cancel, never saw. Each is now refused at once; the process still exits 143 with
    every child ended. A deaf ACP child (it ignores SIGTERM) keeps the teardown open for its
    terminate grace, so the requests surely arrive inside it."""
    deaf = f"deaf={sys.executable} {FAKE_AGENT} deaf"
    client = Client(tmp_path / "home", "--acp", deaf)
    busy = client.start()
    idle = client.new_session()
    call = json.dumps({"description": "deaf", "prompt": "work"})
    client.send(prompt(1, busy, f"/call subagent_deaf {call}"))
    client.updates(lambda p: p["update"].get("toolCallId", "").startswith("child:"))
    processes = _children(client.proc.pid)
    assert processes, "the ACP child runs"
    client.proc.send_signal(signal.SIGTERM)
    rid = _refused_while_stopping(client, 100)
    refused = [
        client.ask(rid, "session/new", {"cwd": str(REPO), "mcpServers": []}),
        client.ask(
            rid + 1, "session/prompt", {"sessionId": idle, "prompt": text("/delegate /hang")}
        ),
        client.ask(rid + 2, "session/load", {"cwd": str(REPO), "sessionId": idle}),
        client.ask(rid + 3, "initialize", {"protocolVersion": 1}),
    ]
    for answer in refused:
        assert answer["error"] == {"code": SHUTTING_DOWN, "message": "server is shutting down"}
    assert client.reply(1)["result"] == {"stopReason": "cancelled"}
    _, raw = client.proc.communicate(timeout=TIMEOUT)
    stderr = raw.decode("utf-8", "replace")
    assert client.proc.returncode == 143, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    assert not [pid for pid in processes if _alive(pid)]
    store = SessionStore(tmp_path / "home" / "sessions")
    # Nothing started in the idle session, and no session was made besides the two.
    assert not [e for e in store.inspect(idle).events if e["type"] == "user/message"]
    assert sorted(s for s in store.ids() if "." not in s) == sorted([busy, idle])


def test_mcp_requests_during_sigterm_teardown_are_refused_and_start_nothing(
    tmp_path: Path,
) -> None:
    """The same for `subagent mcp`: a `tools/call` read after SIGTERM used to start its child."""
    deaf = f"deaf={sys.executable} {FAKE_AGENT} deaf"
    client = McpClient(tmp_path / "home", "--acp", deaf)
    assert "result" in client.ask("init", "initialize", {"protocolVersion": "2025-06-18"})
    args = {"description": "deaf", "prompt": "work"}
    call = {"name": "subagent_deaf", "arguments": args, "_meta": {"progressToken": "p"}}
    client.send({"id": 1, "method": "tools/call", "params": call})
    while "started" not in client._next().get("params", {}).get("message", ""):
        pass  # progress: the ACP child has started (its handshake done)
    processes = _children(client.proc.pid)
    client.proc.send_signal(signal.SIGTERM)
    first = _refused_while_stopping(client, 100)
    hang = {"name": "subagent", "arguments": {"description": "late", "prompt": "/hang"}}
    for rid, method, params in [
        (first, "tools/call", hang),
        (first + 1, "tools/list", {}),
        (first + 2, "ping", {}),
    ]:
        answer = client.ask(rid, method, params)
        assert answer["error"] == {"code": SHUTTING_DOWN, "message": "server is shutting down"}
    _, raw = client.proc.communicate(timeout=TIMEOUT)
    stderr = raw.decode("utf-8", "replace")
    assert client.proc.returncode == 143, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    assert not [pid for pid in processes if _alive(pid)]
    assert not client.answers(1)  # the call was cancelled: MCP sends no answer for it
    store = SessionStore(tmp_path / "home" / "sessions")
    late = [s for s in store.ids() if store.header(s).parent_session is not None]
    assert late == []  # the refused call started no child (the ACP child has no log here)


# -- 3. the JSON-RPC envelope and `_meta` ------------------------------------------------------

NO_VERSION = [
    # (the line, the id its answer carries)
    ('{"id": 1, "method": "session/new", "params": {}}', 1),
    ('{"jsonrpc": "1.0", "id": "two", "method": "session/new", "params": {}}', "two"),
    ('{"jsonrpc": 2.0, "id": 3, "method": "session/new", "params": {}}', 3),
    ('{"jsonrpc": null, "id": [4], "method": "session/new", "params": {}}', None),
    ('{"method": "session/cancel", "params": {"sessionId": "s"}}', None),  # a notification
]
ENVELOPE = 'invalid request: a request must carry "jsonrpc": "2.0"'


def _raw(client: Client, *lines: str) -> None:
    client.send(*(line.encode() for line in lines))


def test_acp_refuses_a_request_without_jsonrpc_2_0_and_a_meta_that_is_no_object(
    tmp_path: Path,
) -> None:
    """Both used to be served: a request with no `"jsonrpc": "2.0"` (JSON-RPC 2.0: MUST) ran,
    and a `_meta` that is not an object was ignored (so a depth in it was silently lost)."""
    client = Client(tmp_path / "home")
    sid = client.start()
    _raw(client, *(line for line, _ in NO_VERSION))
    for line, rid in NO_VERSION:
        error = client.reply(rid)["error"]
        assert error == {"code": -32600, "message": ENVELOPE}, line
    cwd = str(REPO)
    for rid, meta in enumerate([[], "depth", 7, True]):
        params: dict[str, Any] = {"cwd": cwd, "mcpServers": [], "_meta": meta}
        error = client.ask(rid, "session/new", params)["error"]
        assert error["code"] == -32602 and error["message"].startswith("params._meta must be an")
    params = {"sessionId": sid, "prompt": text("x"), "_meta": ["no"]}
    assert client.ask(10, "session/prompt", params)["error"]["code"] == -32602
    assert client.ask(11, "initialize", {"protocolVersion": 1, "_meta": 1})["error"]["code"] == (
        -32602
    )
    # An object, or null (what an SDK writes for an absent field), is fine.
    for rid, meta in [(12, {}), (13, None)]:
        params = {"cwd": cwd, "mcpServers": [], "_meta": meta}
        assert "sessionId" in client.ask(rid, "session/new", params)["result"]
    # Nothing ran: the only turn is the next one.
    assert client.ask(14, "session/prompt", {"sessionId": sid, "prompt": text("on")})["result"]
    store = SessionStore(tmp_path / "home" / "sessions")
    turns = [e for e in store.inspect(sid).events if e["type"] == "user/message"]
    assert len(turns) == 1
    assert len(store.ids()) == 3  # the first session and the two made with a good `_meta`
    stderr = client.close()
    assert stderr.count('a request must carry "jsonrpc": "2.0"') == len(NO_VERSION)


def test_mcp_refuses_a_request_without_jsonrpc_2_0_and_a_meta_that_is_no_object(
    tmp_path: Path,
) -> None:
    client = McpClient(tmp_path / "home")
    _raw(client, '{"id": "init", "method": "initialize", "params": {}}')
    assert client.reply("init")["error"] == {"code": -32600, "message": ENVELOPE}
    assert "result" in client.ask("init", "initialize", {"protocolVersion": "2025-06-18"})
    _raw(client, '{"jsonrpc": "2", "id": 1, "method": "tools/list"}')
    assert client.reply(1)["error"] == {"code": -32600, "message": ENVELOPE}
    call = {"name": "list_agents", "arguments": {}, "_meta": "token"}
    error = client.ask(2, "tools/call", call)["error"]
    assert error == {"code": -32602, "message": "params._meta must be an object, not a string"}
    call["_meta"] = {"progressToken": 1}
    assert client.ask(3, "tools/call", call)["result"]["isError"] is False
    client.close()
