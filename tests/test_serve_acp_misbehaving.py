"""`subagent acp` (a real subprocess, offline model) driven by a client that gets things wrong:
requests out of order, malformed input, a reused id, a cancel sent as a request, a client that
hangs up mid-turn. Each answer is a JSON-RPC error with the right code (or, for what cannot be
answered, a line on stderr), one answer per request, and the server goes on serving.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from gevent import subprocess as gsub
from gevent.subprocess import PIPE

from providers.acp_process import process_stats

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 60.0


def text(words: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": words}]


class Client:
    """Raw JSON-RPC lines to `subagent acp`; keeps every message it read, in order."""

    def __init__(self, home: Path, *args: str) -> None:
        """`subagent --home HOME acp ARGS...`."""
        command = [sys.executable, "-m", "subagent.cli", "--home", str(home), "acp", *args]
        self.proc = gsub.Popen(command, cwd=REPO, stdin=PIPE, stdout=PIPE, stderr=PIPE)
        self.seen: list[dict[str, Any]] = []
        self._taken: set[int] = set()  # indexes in `seen` of the answers `reply` returned

    def send(self, *messages: dict[str, Any] | bytes) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        for m in messages:
            stdin.write(m if isinstance(m, bytes) else json.dumps({"jsonrpc": "2.0", **m}).encode())
            stdin.write(b"\n")
        stdin.flush()

    def _next(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        with gevent.Timeout(TIMEOUT):
            line = self.proc.stdout.readline()
        assert line, "the server closed its stdout"
        message: dict[str, Any] = json.loads(line)
        self.seen.append(message)
        return message

    def reply(self, rid: object) -> dict[str, Any]:
        """The next answer to `rid` not yet returned (read already, or waited for)."""
        index = 0
        while True:
            while index < len(self.seen):
                message = self.seen[index]
                answers = "method" not in message and message.get("id") == rid
                if answers and index not in self._taken:
                    self._taken.add(index)
                    return message
                index += 1
            self._next()

    def ask(self, rid: object, method: str, params: object) -> dict[str, Any]:
        self.send({"id": rid, "method": method, "params": params})
        return self.reply(rid)

    def updates(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first session/update's params (read or to come) that satisfy `predicate`."""
        index = 0
        while True:
            while index < len(self.seen):
                message = self.seen[index]
                index += 1
                if message.get("method") == "session/update":
                    params: dict[str, Any] = message["params"]
                    if predicate(params):
                        return params
            self._next()

    def answers(self, rid: object) -> list[dict[str, Any]]:
        return [m for m in self.seen if "method" not in m and m.get("id") == rid]

    def start(self) -> str:
        assert "result" in self.ask("init", "initialize", {"protocolVersion": 1})
        return self.new_session()

    def new_session(self) -> str:
        answer = self.ask(
            f"new-{len(self.seen)}", "session/new", {"cwd": str(REPO), "mcpServers": []}
        )
        return str(answer["result"]["sessionId"])

    def close(self) -> str:
        """Hang up; the server's stderr, after it exited 0 without a traceback."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        _, raw = self.proc.communicate(timeout=TIMEOUT)
        stderr: str = raw.decode("utf-8", "replace")
        assert self.proc.returncode == 0, stderr[-2000:]
        assert "Traceback" not in stderr, stderr[-2000:]
        return stderr


def prompt(rid: object, sid: str, words: str) -> dict[str, Any]:
    return {
        "id": rid,
        "method": "session/prompt",
        "params": {"sessionId": sid, "prompt": text(words)},
    }


def cancel(sid: object) -> dict[str, Any]:
    return {"method": "session/cancel", "params": {"sessionId": sid}}


# -- a reused id, a cancel with an id ----------------------------------------------------------


def test_an_id_reused_while_its_prompt_runs_is_refused_and_not_run(tmp_path: Path) -> None:
    """Used to run: the second prompt (another session) was answered under the same id as the
    first, so the client could not tell the two answers apart."""
    client = Client(tmp_path / "home")
    first = client.start()
    second = client.new_session()
    client.send(prompt(5, first, "/delegate /hang"))
    client.updates(lambda p: p["update"].get("toolCallId", "").startswith("child:"))
    refused = client.ask(5, "session/prompt", {"sessionId": second, "prompt": text("not run")})
    assert refused["error"]["code"] == -32600
    assert refused["error"]["message"] == "a request with this id is still running"
    client.send(cancel(first))
    assert client.reply(5)["result"] == {"stopReason": "cancelled"}
    # The refused prompt never ran: the second session's first turn is the next one.
    assert client.ask(5, "session/prompt", {"sessionId": second, "prompt": text("now")})[
        "result"
    ] == {"stopReason": "end_turn"}  # the id is free again once answered
    chunks = [
        m["params"]["update"]["content"]["text"]
        for m in client.seen
        if m.get("method") == "session/update" and m["params"]["sessionId"] == second
    ]
    assert chunks == ["(offline scripted model) received: now"]
    assert len(client.answers(5)) == 3  # refusal, cancelled, end_turn: one per request
    client.close()


def test_a_cancel_sent_with_an_id_cancels_and_says_it_is_a_notification(tmp_path: Path) -> None:
    """Used to be `-32601 method not found` with the turn left running: the user's stop did
    nothing. The cancel is done, and the answer tells the client what it got wrong."""
    client = Client(tmp_path / "home")
    sid = client.start()
    client.send(prompt(3, sid, "/delegate /hang"))
    client.updates(lambda p: p["update"].get("toolCallId", "").startswith("child:"))
    error = client.ask(4, "session/cancel", {"sessionId": sid})["error"]
    assert error["code"] == -32600
    assert "session/cancel is a notification" in error["message"]
    assert "cancelled all the same" in error["message"]
    assert client.reply(3)["result"] == {"stopReason": "cancelled"}
    unknown = client.ask(6, "session/cancel", {"sessionId": "s-nope"})["error"]
    assert unknown["code"] == -32600 and "(no such session)" in unknown["message"]
    assert client.ask(7, "session/prompt", {"sessionId": sid, "prompt": text("on")})["result"] == {
        "stopReason": "end_turn"
    }
    client.close()


def test_what_a_notification_cannot_be_answered_for_is_said_on_stderr(tmp_path: Path) -> None:
    """A request sent without an id, a cancel for no session or without params: no answer is
    possible, so each is one warning line on stderr (it used to vanish without a word), and
    nothing runs."""
    client = Client(tmp_path / "home")
    sid = client.start()
    client.send(
        {"method": "session/prompt", "params": {"sessionId": sid, "prompt": text("x")}},
        cancel("s-" + "n" * 500),
        {"method": "session/cancel", "params": [sid]},
        {"method": "_zed/unknown_extension", "params": {}},
    )
    assert "result" in client.ask(9, "session/new", {"cwd": str(REPO), "mcpServers": []})
    assert not [m for m in client.seen if m.get("method") == "session/update"]
    stderr = client.close()
    assert "session/prompt sent as a notification (no id): ignored" in stderr
    assert "session/cancel for unknown session 's-nnnn" in stderr
    assert "... (404 cut): nothing to cancel" in stderr  # a huge id is quoted by its start
    assert "session/cancel without an object of params: ignored" in stderr
    assert "_zed/unknown_extension" not in stderr  # an extension notification is fine


# -- malformed params -------------------------------------------------------------------------


def test_prompt_blocks_with_wrong_fields_are_refused_naming_the_field(tmp_path: Path) -> None:
    """A text block whose text is not a string used to be refused as an "unsupported prompt
    block type 'text'", and a resource whose uri was a number was accepted."""
    client = Client(tmp_path / "home")
    sid = client.start()
    refusals = {
        "prompt block 0 (text): text must be a string": [{"type": "text", "text": 5}],
        "prompt block 1 (resource_link): uri must be a string": [
            {"type": "text", "text": "ok"},
            {"type": "resource_link", "name": "x"},
        ],
        "prompt block 0 (resource) resource: uri must be a string": [
            {"type": "resource", "resource": {"uri": 5, "text": "t"}}
        ],
        "prompt block 0 (resource): resource must be an object": [
            {"type": "resource", "resource": "file:///x"}
        ],
        "only text resources are supported": [
            {"type": "resource", "resource": {"uri": "file:///x", "blob": "AAAA"}}
        ],
        "unsupported prompt block type 'image'": [
            {"type": "image", "data": "AAAA", "mimeType": "image/png"}
        ],
        "unsupported prompt block type 'dict'": [{"type": {"nested": 1}}],
        "unsupported prompt block type None": ["just a string"],
        "prompt must be a non-empty list of content blocks": [],
    }
    for rid, (message, blocks) in enumerate(refusals.items()):
        error = client.ask(rid, "session/prompt", {"sessionId": sid, "prompt": blocks})["error"]
        assert (error["code"], error["message"]) == (-32602, message)
    # Fields the runtime does not use are ignored, as ACP allows.
    bogus = [{"type": "text", "text": "fine", "annotations": {"x": 1}, "bogus": [1], "_meta": {}}]
    ok = client.ask(20, "session/prompt", {"sessionId": sid, "prompt": bogus})
    assert ok["result"] == {"stopReason": "end_turn"}
    client.close()


def test_params_of_the_wrong_types_are_invalid_params(tmp_path: Path) -> None:
    """Held already: each is `-32602` and the server goes on."""
    client = Client(tmp_path / "home")
    sid = client.start()
    cwd = str(REPO)
    for rid, (method, params) in enumerate(
        [
            ("session/new", None),
            ("session/new", [cwd]),
            ("session/new", {"cwd": 7, "mcpServers": []}),
            ("session/new", {"cwd": "relative", "mcpServers": []}),
            ("session/new", {"cwd": cwd, "mcpServers": {}}),
            ("session/new", {"cwd": cwd, "_meta": {"subagent-runtime/depth": "1"}}),
            ("session/prompt", {"sessionId": sid, "prompt": "hi"}),
            ("session/prompt", {"sessionId": 12, "prompt": text("hi")}),
            ("session/load", {"cwd": cwd, "sessionId": 12}),
        ]
    ):
        assert client.ask(rid, method, params)["error"]["code"] == -32602, (method, params)
    assert client.ask(30, "session/prompt", {"sessionId": sid, "prompt": text("on")})["result"]
    client.close()


# -- out of order -----------------------------------------------------------------------------


def test_requests_out_of_order_are_refused_and_the_server_goes_on(tmp_path: Path) -> None:
    """Held already: before `initialize`, for an unknown session, a second prompt on a busy
    session, unknown methods; a cancel of an idle session or of another session touches no
    running turn."""
    client = Client(tmp_path / "home")
    early = client.ask(1, "session/prompt", {"sessionId": "s1", "prompt": text("hi")})["error"]
    assert (early["code"], early["message"]) == (-32600, "initialize first")
    assert client.ask(2, "session/new", {"cwd": str(REPO)})["error"]["code"] == -32600
    busy, idle = client.start(), client.new_session()
    unknown = client.ask(3, "session/prompt", {"sessionId": "s-gone", "prompt": text("x")})
    assert unknown["error"]["code"] == -32602 and "unknown session" in unknown["error"]["message"]
    assert client.ask(4, "session/close", {"sessionId": busy})["error"]["code"] == -32601
    assert client.ask(5, "session/set_mode", {"sessionId": busy})["error"]["code"] == -32601
    client.send(prompt(6, busy, "/delegate /hang"))
    client.updates(lambda p: p["update"].get("toolCallId", "").startswith("child:"))
    again = client.ask(7, "session/prompt", {"sessionId": busy, "prompt": text("too")})["error"]
    assert (again["code"], again["message"]) == (
        -32602,
        "a prompt is already running in this session",
    )
    client.send(cancel(idle))  # nothing running there; the busy session's turn goes on
    assert client.ask(8, "session/prompt", {"sessionId": idle, "prompt": text("hi")})["result"] == {
        "stopReason": "end_turn"
    }
    assert not client.answers(6)  # still running
    client.send(cancel(busy))
    assert client.reply(6)["result"] == {"stopReason": "cancelled"}
    assert len(client.answers(6)) == 1
    client.close()


def test_session_load_of_a_malformed_id_or_a_path_is_invalid_params(tmp_path: Path) -> None:
    """Held already: an id that is no session id (a path, empty, a NUL) never reaches the
    file system."""
    client = Client(tmp_path / "home")
    client.start()
    for rid, bad in enumerate(["../../etc/passwd", "/etc/passwd", "", "a\x00b", "s" * 200]):
        params = {"cwd": str(REPO), "mcpServers": [], "sessionId": bad}
        error = client.ask(rid, "session/load", params)["error"]
        assert error["code"] == -32602 and "invalid session id" in error["message"], bad
    client.close()


def test_loading_a_session_another_client_has_open_is_refused_by_name(tmp_path: Path) -> None:
    """Another `subagent acp` on the same home has the session: it used to be `-32603` with
    two tracebacks on stderr; it is invalid params saying so, and the owner goes on."""
    owner, other = Client(tmp_path / "home"), Client(tmp_path / "home")
    sid = owner.start()
    owner.ask(1, "session/prompt", {"sessionId": sid, "prompt": text("mine")})
    other.ask("init", "initialize", {"protocolVersion": 1})
    params = {"cwd": str(REPO), "mcpServers": [], "sessionId": sid}
    error = other.ask(2, "session/load", params)["error"]
    assert error == {
        "code": -32602,
        "message": f"session {sid} is open in another process; close it there first",
    }
    assert other.ask(3, "session/prompt", {"sessionId": sid, "prompt": text("x")})["error"]
    assert owner.ask(4, "session/prompt", {"sessionId": sid, "prompt": text("still mine")})[
        "result"
    ] == {"stopReason": "end_turn"}
    owner.close()
    assert "result" in other.ask(5, "session/load", params)  # free once its owner is gone
    other.close()


def test_a_replayed_message_is_a_plain_message_chunk(tmp_path: Path) -> None:
    """`session/load` replays text as `{sessionUpdate, content}`; it used to carry a stray
    `type: "content"` (a tool call's content wrapper) beside them."""
    client = Client(tmp_path / "home")
    sid = client.start()
    client.ask(1, "session/prompt", {"sessionId": sid, "prompt": text("remember")})
    mark = len(client.seen)
    client.ask(2, "session/load", {"cwd": str(REPO), "mcpServers": [], "sessionId": sid})
    replay = [m["params"]["update"] for m in client.seen[mark:] if m.get("method")]
    assert replay == [
        {"sessionUpdate": "user_message_chunk", "content": {"type": "text", "text": "remember"}},
        {
            "sessionUpdate": "agent_message_chunk",
            "content": {"type": "text", "text": "(offline scripted model) received: remember"},
        },
    ]
    client.close()


def test_two_loads_of_one_stored_session_at_once_both_replay(tmp_path: Path) -> None:
    """An editor that retries `session/load` before the first answer: the second used to fail
    (`agent ... is already live`) while the first was still resuming the session; it waits for
    it and replays, as a load of a live session does."""
    first = Client(tmp_path / "home")
    sid = first.start()
    first.ask(1, "session/prompt", {"sessionId": sid, "prompt": text("remember")})
    first.close()
    client = Client(tmp_path / "home")
    client.ask("init", "initialize", {"protocolVersion": 1})
    params = {"cwd": str(REPO), "mcpServers": [], "sessionId": sid}
    client.send({"id": 1, "method": "session/load", "params": params})
    client.send({"id": 2, "method": "session/load", "params": params})
    assert client.reply(1) == {"jsonrpc": "2.0", "id": 1, "result": {}}
    assert client.reply(2) == {"jsonrpc": "2.0", "id": 2, "result": {}}
    replayed = [
        m["params"]["update"]["content"]["text"]
        for m in client.seen
        if m.get("method") == "session/update"
        and m["params"]["update"]["sessionUpdate"] == "user_message_chunk"
    ]
    assert replayed == ["remember", "remember"]  # once per load
    after = client.ask(3, "session/prompt", {"sessionId": sid, "prompt": text("on")})
    assert after["result"] == {"stopReason": "end_turn"}
    client.close()


def test_a_corrupt_stored_session_is_an_internal_error_and_one_warning(tmp_path: Path) -> None:
    """Not the client's fault, so `-32603`, naming the damage; stderr used to get the same
    traceback three times (logged, then the greenlet's failure printed by the hub)."""
    first = Client(tmp_path / "home")
    sid = first.start()
    first.close()
    (log,) = (tmp_path / "home" / "sessions").glob(f"{sid}*")
    log.write_bytes(b"")
    client = Client(tmp_path / "home")
    client.ask("init", "initialize", {"protocolVersion": 1})
    params = {"cwd": str(REPO), "mcpServers": [], "sessionId": sid}
    error = client.ask(1, "session/load", params)["error"]
    assert error["code"] == -32603
    assert error["message"].startswith("CorruptSessionError: ") and "empty file" in error["message"]
    assert "sessionId" in client.ask(2, "session/new", params)["result"]
    stderr = client.close()  # exit 0, no traceback
    (line,) = [line for line in stderr.splitlines() if "CorruptSessionError" in line]
    assert line.startswith("WARNING:subagent.serve.acp_agent:acp server: CorruptSessionError: ")


# -- malformed lines --------------------------------------------------------------------------


def test_a_50_mb_line_a_batch_and_bad_json_are_answered_and_serving_goes_on(
    tmp_path: Path,
) -> None:
    """Held already: each is one `id: null` error and the next request is served."""
    client = Client(tmp_path / "home")
    sid = client.start()
    batch = json.dumps([prompt(1, sid, "in a batch")]).encode()
    client.send(b"x" * (50 * 1024 * 1024), batch, b'{"jsonrpc": "2.0", "id": 2, "method"')
    assert client.ask(3, "session/prompt", {"sessionId": sid, "prompt": text("on")})["result"]
    errors = [(m["error"]["code"], m["id"]) for m in client.seen if "error" in m]
    assert errors == [(-32600, None), (-32600, None), (-32700, None)]
    assert not client.answers(1)  # a batch is not run
    client.close()


def test_text_from_the_model_is_data_on_the_wire(tmp_path: Path) -> None:
    """Held already: terminal escapes in the model's text reach the client as JSON escapes
    inside the update's text (the editor renders it), never as raw bytes on the wire."""
    client = Client(tmp_path / "home")
    sid = client.start()
    assert client.proc.stdout is not None
    evil = "\x1b[2J\x1b]0;owned\x07red\x1b[31m"
    client.send(prompt(1, sid, evil))
    raw = b""
    while b'"id":1,' not in raw:
        with gevent.Timeout(TIMEOUT):
            line = client.proc.stdout.readline()
        assert line
        raw += line
    assert b"\x1b" not in raw and b"\x07" not in raw
    chunk = json.loads(raw.splitlines()[0])["params"]["update"]["content"]["text"]
    assert chunk == f"(offline scripted model) received: {evil}"
    client.close()


# -- a client that goes away mid-turn ---------------------------------------------------------


def _children(pid: int) -> list[int]:
    return [p for p, fields in process_stats() if len(fields) > 1 and int(fields[1]) == pid]


def _alive(pid: int) -> bool:
    return any(p == pid and fields[0] not in (b"Z", b"X") for p, fields in process_stats())


def _mid_turn(home: Path) -> tuple[Client, list[int]]:
    """A coordinator whose turn runs an in-process child and an ACP child (another
    `subagent acp`, whose own coordinator runs a child): all of them hanging."""
    inner = f"inner={sys.executable} -m subagent.cli --home {home / 'inner'} acp"
    client = Client(home, "--acp", inner)
    sid = client.start()
    call = json.dumps(
        {"description": "far", "prompt": "/delegate /hang", "run_in_background": True}
    )
    client.send(prompt(1, sid, f"/call subagent_inner {call}\n/delegate /hang"))
    # The ACP child's own child reported (the inner process is mid-turn), and our local child.
    client.updates(lambda p: "tool_call subagent" in json.dumps(p["update"].get("content")))
    client.updates(
        lambda p: (
            ".acp-" not in p["update"].get("toolCallId", "")
            and "(offline task): step 1" in json.dumps(p["update"].get("content"))
        )
    )
    processes = _children(client.proc.pid)
    assert processes, "the ACP child runs"
    return client, processes


def test_a_client_that_closes_stdin_mid_turn_leaves_nothing_running(tmp_path: Path) -> None:
    client, processes = _mid_turn(tmp_path)
    client.close()  # exit 0, no traceback
    assert not [pid for pid in processes if _alive(pid)]


def test_a_server_killed_mid_turn_leaves_no_acp_child_behind(tmp_path: Path) -> None:
    """SIGKILL runs no teardown: the ACP child sees its stdin close and ends by itself."""
    client, processes = _mid_turn(tmp_path)
    client.proc.kill()
    client.proc.wait(timeout=TIMEOUT)
    with gevent.Timeout(TIMEOUT, AssertionError(f"still running: {processes}")):
        while [pid for pid in processes if _alive(pid)]:
            gevent.sleep(0.05)
