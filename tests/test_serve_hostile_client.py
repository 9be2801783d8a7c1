"""`subagent acp` and `subagent mcp` (real subprocesses, offline model) against a client that
is hostile or dying: requests sent while SIGTERM tears the server down, huge lines, envelopes
that are not JSON-RPC 2.0, a client that stops reading its stdout."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import gevent
import pytest
from gevent import subprocess as gsub
from gevent.fileobject import FileObjectPosix
from gevent.subprocess import PIPE
from test_serve_acp_misbehaving import REPO, TIMEOUT, Client, _alive, _children, prompt, text

from agent import json_text
from agent.json_text import ON_HUB_BYTES
from agent.store import SessionStore
from providers import acp_rpc
from providers.acp_rpc import JsonRpcConnection
from subagent.serve.acp_agent import MAX_LINE_BYTES

SHUTTING_DOWN = -32000
FAKE_AGENT = REPO / "tests" / "acp_peers" / "fake_agent.py"


class McpClient(Client):
    """The same raw client, to `subagent --home HOME mcp ARGS...`."""

    def __init__(self, home: Path, *args: str) -> None:
        command = [sys.executable, "-m", "subagent.cli", "--home", str(home), "mcp", *args]
        self.proc = gsub.Popen(command, cwd=REPO, stdin=PIPE, stdout=PIPE, stderr=PIPE)
        self.seen = []
        self._taken = set()


def _given_up(client: Client) -> int:
    """Wait for a server that stopped being read to give its connection up and exit 1 with
    one warning and no traceback; how many bytes the warning says were left unread."""
    client.proc.wait(timeout=TIMEOUT)
    _, raw = client.proc.communicate(timeout=TIMEOUT)
    stderr = raw.decode("utf-8", "replace")
    assert client.proc.returncode == 1, stderr[-2000:]
    assert "Traceback" not in stderr, stderr[-2000:]
    (warning,) = [line for line in stderr.splitlines() if "the connection is given up" in line]
    return int(warning.split("has not read ")[1].split(" bytes")[0].replace(",", ""))


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
    prompt_params = {"sessionId": sid, "prompt": text("x"), "_meta": ["no"]}
    assert client.ask(10, "session/prompt", prompt_params)["error"]["code"] == -32602
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


# -- 2. a huge line is parsed off the hub ------------------------------------------------------


class Server:
    """A server-side `JsonRpcConnection` (as both servers make it) over real pipes, in this
    process; records what it was asked, and how many times a ticking greenlet ran while each
    line was parsed.

    The suite's hub-block detector cannot see this block: `json.loads` holds the GIL, so the
    detector's thread does not run until the parse is over (measured: a 1.3 s parse on the
    hub passed). What the rule is about is that other greenlets run meanwhile: counted."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ticks = 0
        self.ticks_while_parsing: list[tuple[int, int]] = []  # (line length, ticks)
        self._ticker = gevent.spawn(self._tick)

        def parse(line: bytes) -> object:
            before = self.ticks
            try:
                return json_text.parse_json(line)
            finally:
                self.ticks_while_parsing.append((len(line), self.ticks - before))

        monkeypatch.setattr(acp_rpc, "parse_json", parse)
        to_server_r, self._to_server_w = os.pipe()
        self._to_client_r, to_client_w = os.pipe()
        self.asked: list[tuple[str, Any]] = []
        self.conn = JsonRpcConnection(
            FileObjectPosix(to_client_w, "wb"),
            FileObjectPosix(to_server_r, "rb"),
            on_request=self._record,
            on_notification=lambda method, params: None,
            max_line_bytes=MAX_LINE_BYTES,
            name="server",
            answer_bad_lines=True,
            require_version=True,
        )
        self._out = FileObjectPosix(self._to_server_w, "wb")
        self._in = FileObjectPosix(self._to_client_r, "rb")

    def ask(self, line: bytes) -> dict[str, Any]:
        """Write `line`; the server's answer to it."""
        writer = gevent.spawn(self._write, line)
        answer: dict[str, Any] = json.loads(self._in.readline())
        writer.get()
        return answer

    def _write(self, line: bytes) -> None:
        self._out.write(line + b"\n")
        self._out.flush()

    def _record(self, method: str, params: object) -> dict[str, Any]:
        self.asked.append((method, params))
        return {}

    def _tick(self) -> None:
        while True:
            self.ticks += 1
            gevent.sleep(0.001)

    def others_ran_while_parsing(self, longer_than: int) -> bool:
        """Whether the ticker ran during the parse of every line longer than `longer_than`."""
        parses = [ticks for length, ticks in self.ticks_while_parsing if length > longer_than]
        return bool(parses) and min(parses) > 0

    def close(self) -> None:
        self._ticker.kill()
        self.conn.shutdown()
        self._out.close()
        self._in.close()


def _request(rid: int, params: object) -> bytes:
    message = {"jsonrpc": "2.0", "id": rid, "method": "session/prompt", "params": params}
    return json.dumps(message, separators=(",", ":")).encode()


def _repeated(item: bytes, count: int) -> bytes:
    """`item` `count` times, comma-joined, in slices with a yield between: encoding such a
    prompt whole (`json.dumps`, or one join of millions) held the test's own hub past the
    suite's 0.1 s on a loaded machine."""
    step = 50_000
    parts = []
    for start in range(0, count, step):
        parts.append(b",".join([item] * min(step, count - start)))
        gevent.sleep(0)
    return b",".join(parts)


@pytest.mark.parametrize(
    ("item", "count"),
    [
        pytest.param(b'{"type":"text","text":""}', 600_000, id="600,000 tiny blocks"),
        pytest.param(b"[]", 4_000_000, id="4,000,000 empty arrays"),
    ],
)
def test_a_line_of_tiny_containers_is_refused_without_holding_the_hub(
    item: bytes, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Such a line used to be parsed by `json.loads` on the hub: 0.15 s (600,000 blocks) to
    over a second (4,000,000 empty arrays: the cyclic collector rescans them as they are
    made) with every greenlet, every child, frozen; the suite's detector fails the second.
    It is parsed in the hub's thread pool by a scanner that gives the GIL back, and refused
    once it holds 100,000 containers."""
    server = Server(monkeypatch)
    try:
        prompt = b"[" + _repeated(item, count) + b"]"
        line = _request(1, {"sessionId": "s", "prompt": "PROMPT"}).replace(b'"PROMPT"', prompt)
        assert len(line) < MAX_LINE_BYTES
        answer = server.ask(line)
        assert answer["id"] is None
        assert answer["error"] == {
            "code": -32600,
            "message": "invalid request: a message holds more than 100,000 JSON arrays and objects",
        }
        assert server.asked == []
        assert server.ask(_request(2, {"small": True}))["result"] == {}  # the server goes on
        assert server.others_ran_while_parsing(MAX_LINE_BYTES // 2)
    finally:
        server.close()


# A ~10 MB line (its parse must outlast a few GIL switch intervals for the ticker to be seen
# running) and what `json.loads` reads of it, made at import: encoding and decoding it inside
# the test held the test's own hub past the suite's 0.1 s on a loaded machine.
_LONG_LINE = _request(
    1,
    {
        "sessionId": "s\u00e9\ud83d\ude00",
        "prompt": [{"type": "text", "text": f"{i} " + 'x\n"\\\u2028' * 400} for i in range(2000)],
        "numbers": [1, -2.5, 1e300, None, True, False, "\x00"],
        "nested": [[[[{"k": [{}]}]]]],
    },
)
_LONG_PARAMS = json.loads(_LONG_LINE)["params"]


def test_a_long_line_is_parsed_off_the_hub_to_the_same_message(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A long line under the bounds reaches the handler exactly as `json.loads` reads it; a
    long line that is not JSON, or not UTF-8, is the same parse error as a short one."""
    server = Server(monkeypatch)
    try:
        assert ON_HUB_BYTES < 100_000
        line = _LONG_LINE
        assert len(line) > 10 * ON_HUB_BYTES
        assert server.ask(line)["result"] == {}
        assert server.asked == [("session/prompt", _LONG_PARAMS)]
        broken = line[:-1]  # the closing brace missing
        error = server.ask(broken)["error"]
        assert error["code"] == -32700
        assert error["message"].startswith("parse error: malformed JSON: expecting ")
        error = server.ask(line.replace(b"x", b"\xff", 1))["error"]
        assert error["code"] == -32700 and "not UTF-8" in error["message"]
        assert len(server.asked) == 1
        assert server.others_ran_while_parsing(ON_HUB_BYTES)
    finally:
        server.close()


def test_acp_prompt_blocks_are_capped_and_a_huge_text_block_is_served(tmp_path: Path) -> None:
    """600,000 blocks used to be walked one by one on the hub; more than 10,000 is now
    `-32602` before any is looked at. A prompt whose one block is 8 MiB of text is served."""
    client = Client(tmp_path / "home")
    sid = client.start()
    many = [{"type": "text", "text": "a"}] * 10_001
    error = client.ask(1, "session/prompt", {"sessionId": sid, "prompt": many})["error"]
    assert error == {"code": -32602, "message": "a prompt holds at most 10,000 content blocks"}
    words = "y" * (8 << 20)
    assert client.ask(2, "session/prompt", {"sessionId": sid, "prompt": text(words)})["result"] == {
        "stopReason": "end_turn"
    }
    client.close()


# -- 4. a client that stops reading ------------------------------------------------------------


def test_acp_gives_up_a_client_that_stops_reading_and_tears_down(tmp_path: Path) -> None:
    """The server's outgoing queue had no bound: a client that kept asking while never
    reading made the server hold every message (here 80 MiB of replays) for as long as it
    lived. Past 64 MiB unread the connection is given up: one warning saying how much was
    unread, the same teardown as on EOF (turns cancelled, children ended, logs closed), exit 1.
    The client never reads stdout after the handshake."""
    client = Client(tmp_path / "home")
    sid = client.start()
    background = client.new_session()
    client.send(prompt(1, background, "/background /hang"))  # a child that runs until cancelled
    client.updates(lambda p: p["update"].get("toolCallId", "").startswith("child:"))
    words = "z" * (8 << 20)  # each replay of the session is 16 MiB: the prompt and its echo
    assert client.ask(2, "session/prompt", {"sessionId": sid, "prompt": text(words)})["result"]
    load = {"cwd": str(REPO), "mcpServers": [], "sessionId": sid}
    for rid in range(3, 9):  # 96 MiB of replays; nothing of it is read
        client.send({"id": rid, "method": "session/load", "params": load})
    unread = _given_up(client)  # with nothing read: it gave up by itself
    assert 48 << 20 < unread <= 64 << 20  # bounded: never more than the bound was held
    store = SessionStore(tmp_path / "home" / "sessions")
    (child,) = [s for s in store.ids() if store.header(s).parent_session == background]
    (end,) = [e["data"] for e in store.inspect(child).events if e["type"] == "turn/end"]
    assert end["reason"] == "aborted"


def test_a_connection_whose_peer_never_reads_gives_up_at_its_bound() -> None:
    """The same rule on the connection alone, as the `acp` provider uses it towards an agent
    that stops reading its stdin: a pending request fails with a diagnostic instead of the
    queue growing, later messages are dropped, and `shutdown` returns (it used to be unable to:
    closing the pipe flushed into a peer that never reads) and the peer's end sees EOF."""
    to_peer_r, to_peer_w = os.pipe()
    from_peer_r, from_peer_w = os.pipe()
    conn = JsonRpcConnection(
        FileObjectPosix(to_peer_w, "wb"),
        FileObjectPosix(from_peer_r, "rb"),
        on_request=lambda method, params: {},
        on_notification=lambda method, params: None,
        max_line_bytes=MAX_LINE_BYTES,
        name="client",
        max_unread_bytes=1 << 20,
    )
    try:
        chunk = "n" * 1000
        sent = 0
        while conn.notify("note", {"text": chunk}):  # nobody reads: the pipe fills, then the queue
            sent += 1
            if sent % 100 == 0:
                gevent.sleep(0)  # let the writer fill the pipe meanwhile
            assert sent < 10_000, "never gave up"
        assert conn.gave_up
        with pytest.raises(acp_rpc.ConnectionClosed, match="the peer stopped reading"):
            conn.request("session/prompt", {})
        assert conn.notify("note", {}) is False
    finally:
        conn.shutdown()
    os.close(from_peer_w)
    # The peer's end: what was written before the bound, then EOF (our end was closed).
    received = 0
    with os.fdopen(to_peer_r, "rb") as peer:
        while block := peer.read(1 << 16):
            received += len(block)
    assert 0 < received < sent * 1100


def test_mcp_gives_up_a_client_that_stops_reading_and_tears_down(tmp_path: Path) -> None:
    """`subagent mcp` the same way: a client that keeps sending `tools/list` (each answer a few
    KiB) and never reads used to make the server hold every answer; past 64 MiB unread the
    connection is given up, its background child is ended, and the server exits 1."""
    client = McpClient(tmp_path / "home")
    assert "result" in client.ask("init", "initialize", {"protocolVersion": "2025-06-18"})
    hang = {"description": "bg", "prompt": "/hang", "run_in_background": True}
    started = client.ask(1, "tools/call", {"name": "subagent", "arguments": hang})
    assert started["result"]["isError"] is False
    size = len(json.dumps(client.ask(2, "tools/list", {})))
    # Formatted, not `json.dumps`-ed one by one: that took ~0.05 s on the test's own hub.
    request = b'{"jsonrpc": "2.0", "id": %d, "method": "tools/list"}\n'
    flood = b"".join(
        [request % rid for rid in range(3, 3 + 2 * (64 << 20) // size)]  # twice the bound's worth
    )
    assert client.proc.stdin is not None
    try:
        client.proc.stdin.write(flood)
        client.proc.stdin.flush()
    except BrokenPipeError:
        pass  # it gave up before reading all of it
    unread = _given_up(client)  # nothing read: it gave up by itself
    assert 60 << 20 < unread <= 64 << 20
    store = SessionStore(tmp_path / "home" / "sessions")
    (child,) = [s for s in store.ids() if store.header(s).parent_session is not None]
    (end,) = [e["data"] for e in store.inspect(child).events if e["type"] == "turn/end"]
    assert end["reason"] == "aborted"
