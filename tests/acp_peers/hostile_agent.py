"""A stdlib-only ACP agent that misbehaves on purpose: the parent must survive every mode.

`python hostile_agent.py MODE [ARG]`. Each mode answers the handshake (`initialize` with
`loadSession`, `session/new` with the session id `s1`) and then, at `session/prompt`:

- tiny_flood N: N tiny `agent_message_chunk` updates ("yz"), written as fast as the pipe takes
  them, then ends its turn `end_turn`.
- wide_answer N: answers in N chunks of 1 Mi characters of a three-byte script ("\u4e2d", 3 MiB
  of UTF-8 each), then ends its turn `end_turn`.
- big_usage: ends its turn with a usage whose counts are far beyond any real turn (10**40
  tokens), after a `usage_update` whose cost is an absurd number, and says "spent".
- surrogates: its chunk and a tool call hold lone surrogates (JSON `\\ud800` escapes),
  and it ends its turn `end_turn`.
- bogus_stop N: ends its turn with a stop reason N characters long, holding terminal escapes.
- rpc_error: answers `session/prompt` with a JSON-RPC error whose message is 100,000
  characters and whose code is a string, both holding terminal escapes.
- permission_flood N: asks permission N times, each for a tool call whose title is 10,000
  characters holding terminal escapes, then ends its turn `cancelled`.
- close_stdout: says "bye", closes its stdout and keeps running (reports `closed`).
- late_updates: says "working"; on `session/cancel` it sends 100 tool-call updates, a chunk
  and a permission request (an allow option), reports `answered <result JSON>` when the answer
  comes, and never ends its turn.
- requests: asks the client for everything it was not offered (fs read and write, terminal,
  an unknown method, an `_`-prefixed extension) and says the `clientCapabilities` it got in
  `initialize` and the error code of each answer.
- foreign_session: in one write, a chunk for another session id, "mine" for its own,
  answers to ids it was never sent, two answers to `session/prompt`, and a last chunk.

When $ACP_PEER_NOTIFY names a unix socket, it reports `pid <pid>` (and the lines above) there.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "tiny_flood"
ARG = int(sys.argv[2]) if len(sys.argv) > 2 else 0
SID = "s1"


def report(line: str) -> None:
    path = os.environ.get("ACP_PEER_NOTIFY")
    if path:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall(line.encode() + b"\n")


def line_of(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def send(message: dict[str, Any]) -> None:
    os.write(1, line_of(message))


def write_all(data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(1, view) :]


def result(rid: Any, value: Any) -> None:
    send({"jsonrpc": "2.0", "id": rid, "result": value})


def update(update: dict[str, Any], sid: str = SID) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {"sessionId": sid, "update": update},
    }


def chunk(text: str, sid: str = SID) -> dict[str, Any]:
    return update(
        {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}, sid
    )


def tool_call(ident: str, title: str) -> dict[str, Any]:
    return update({"sessionUpdate": "tool_call", "toolCallId": ident, "title": title})


ESCAPES = "\x1b[2J\x1b]0;pwned\x07[bold red]boom[/]\x9b31m"


class Agent:
    def __init__(self) -> None:
        self.next_id = 1000
        self.waiting: dict[int, str] = {}  # our request id -> what it asked for
        self.codes: list[str] = []
        self.prompt_id: Any = None
        self.asked = 0
        self.offered: Any = None  # the clientCapabilities of `initialize`

    def ask(self, method: str, params: dict[str, Any]) -> None:
        self.next_id += 1
        self.waiting[self.next_id] = method
        send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})

    def on_answer(self, message: dict[str, Any]) -> None:
        method = self.waiting.pop(message["id"], None)
        if MODE == "requests":
            error = message.get("error")
            self.codes.append(f"{method}={error['code'] if error else 'answered'}")
            if not self.waiting:
                offered = json.dumps(self.offered, sort_keys=True)
                send(chunk(f"offered {offered}; answered {' '.join(self.codes)}"))
                result(self.prompt_id, {"stopReason": "end_turn"})
        elif MODE == "late_updates":
            report(f"answered {json.dumps(message.get('result'))}")
        elif MODE == "permission_flood":
            self.asked += 1
            if self.asked == ARG:
                result(self.prompt_id, {"stopReason": "cancelled"})

    def on_prompt(self, rid: Any) -> None:
        self.prompt_id = rid
        report("prompt")
        if MODE == "tiny_flood":
            block = line_of(chunk("yz")) * 1000
            for _ in range(ARG // 1000):
                write_all(block)
            result(rid, {"stopReason": "end_turn"})
        elif MODE == "wide_answer":
            line = json.dumps(chunk("\u4e2d" * (1 << 20)), ensure_ascii=False).encode() + b"\n"
            for _ in range(ARG):
                write_all(line)
            result(rid, {"stopReason": "end_turn"})
        elif MODE == "big_usage":
            huge = 10**40
            cost = {"amount": float("inf"), "currency": "USD"}  # json writes it as Infinity
            send(
                update({"sessionUpdate": "usage_update", "used": huge, "size": huge, "cost": cost})
            )
            send(chunk("spent"))
            usage = {"inputTokens": huge, "outputTokens": huge, "totalTokens": 3 * huge}
            result(rid, {"stopReason": "end_turn", "usage": usage})
        elif MODE == "surrogates":  # json writes each lone half as a `\ud800` escape
            send(chunk("left \ud800 right"))
            send(tool_call("t\udfff", "odd \udc80 title"))
            result(rid, {"stopReason": "end_turn"})
        elif MODE == "bogus_stop":
            send(chunk("partial"))
            reason = (ESCAPES + "x" * ARG)[:ARG]
            result(rid, {"stopReason": reason})
        elif MODE == "rpc_error":
            message = ESCAPES + "m" * 100_000
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": ESCAPES, "message": message}})
        elif MODE == "permission_flood":
            title = (ESCAPES + "t" * 10_000)[:10_000]
            for n in range(ARG):
                call = {"toolCallId": f"t{n}", "title": title}
                options = [{"optionId": "no", "name": "No", "kind": "reject_once"}]
                self.ask(
                    "session/request_permission",
                    {"sessionId": SID, "toolCall": call, "options": options},
                )
        elif MODE == "close_stdout":
            send(chunk("bye"))
            os.close(1)
            report("closed")
            while True:
                time.sleep(3600)
        elif MODE == "late_updates":
            send(chunk("working"))
        elif MODE == "requests":
            self.ask("fs/read_text_file", {"sessionId": SID, "path": "/etc/passwd"})
            self.ask("fs/write_text_file", {"sessionId": SID, "path": "/tmp/x", "content": "x"})
            self.ask("terminal/create", {"sessionId": SID, "command": "true"})
            self.ask("no/such_method", {})
            self.ask("_vendor/extension", {})
        elif MODE == "foreign_session":
            # One write: the client reads every line of it before it could switch greenlets.
            messages = [
                chunk("theirs", sid="someone-else"),
                chunk("mine"),
                {"jsonrpc": "2.0", "id": 987654, "result": {"stopReason": "end_turn"}},
                {"jsonrpc": "2.0", "id": "bogus", "result": {}},
                {"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}},
                {"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "refusal"}},
                chunk("after the end"),
            ]
            write_all(b"".join(line_of(m) for m in messages))

    def on_cancel(self) -> None:
        if MODE == "late_updates":
            for n in range(100):
                send(tool_call(f"late-{n}", "still going"))
            send(chunk(" and more"))
            options = [{"optionId": "yes", "name": "Yes", "kind": "allow_once"}]
            call = {"toolCallId": "late", "title": "one more thing"}
            self.ask(
                "session/request_permission",
                {"sessionId": SID, "toolCall": call, "options": options},
            )


def main() -> None:
    report(f"pid {os.getpid()}")
    agent = Agent()
    for raw in sys.stdin:
        message = json.loads(raw)
        method, rid = message.get("method"), message.get("id")
        if method is None:
            agent.on_answer(message)
        elif method == "initialize":
            agent.offered = message.get("params", {}).get("clientCapabilities")
            result(rid, {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}})
        elif method == "session/new":
            result(rid, {"sessionId": SID})
        elif method == "session/load":
            result(rid, {})
        elif method == "session/prompt":
            agent.on_prompt(rid)
        elif method == "session/cancel":
            agent.on_cancel()
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": "no"}})


if __name__ == "__main__":
    main()
