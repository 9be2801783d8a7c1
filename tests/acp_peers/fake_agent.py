"""A stdlib-only fake ACP agent for behaviours the SDK cannot be made to show.

`python fake_agent.py MODE`:

- silent: reads stdin, never answers anything (not even `initialize`).
- silent_new: answers `initialize` (with loadSession), never `session/new` or `session/load`.
- hang: answers the handshake, never ends a prompt turn (reports `prompt` when one arrives).
- deaf: like hang, but ignores SIGTERM and outlives stdin EOF: only SIGKILL ends it.
- launcher [MODE]: a relaunching wrapper: spawns `fake_agent.py MODE` (default hang) as its child
  on the same stdio, reports `agent <pid>`, and waits for it (killing the launcher leaves the
  agent holding stdout).
- refusing: asks permission (options of all four kinds); if the answer is not an allow option
  it ends its turn `cancelled`, else `end_turn`. The chunk it says names the outcome.
- rpc_error: answers `session/prompt` with JSON-RPC error -32603 whose `data` carries the
  agent's reason (with terminal escapes), after writing coloured text to stderr.

When $ACP_PEER_NOTIFY names a unix socket, it reports `pid <pid>` (and `agent <pid>`) there.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

MODE = sys.argv[1] if len(sys.argv) > 1 else "hang"


def report(line: str) -> None:
    path = os.environ.get("ACP_PEER_NOTIFY")
    if path:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(path)
            s.sendall(line.encode() + b"\n")


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def result(rid: Any, value: Any) -> None:
    send({"jsonrpc": "2.0", "id": rid, "result": value})


def say(sid: str, text: str) -> None:
    update = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
    params = {"sessionId": sid, "update": update}
    send({"jsonrpc": "2.0", "method": "session/update", "params": params})


def main() -> None:
    report(f"pid {os.getpid()}")
    if MODE == "launcher":
        inner = sys.argv[2] if len(sys.argv) > 2 else "hang"
        agent = subprocess.Popen([sys.executable, __file__, inner])
        report(f"agent {agent.pid}")
        sys.exit(agent.wait())
    if MODE == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    asked: dict[Any, Any] = {}  # our request id -> the prompt request id it belongs to
    for line in sys.stdin:
        msg = json.loads(line)
        method, rid = msg.get("method"), msg.get("id")
        if MODE == "silent":
            continue
        if method is None and rid in asked:  # the answer to our permission request
            prompt_id = asked.pop(rid)
            outcome = msg.get("result", {}).get("outcome", {})
            chosen = outcome.get("optionId", outcome.get("outcome"))
            say("s1", f"permission: {chosen}")
            stop = "end_turn" if str(chosen).startswith("allow") else "cancelled"
            result(prompt_id, {"stopReason": stop})
            continue
        if method == "initialize":
            result(rid, {"protocolVersion": 1, "agentCapabilities": {"loadSession": True}})
        elif method in ("session/new", "session/load"):
            if MODE == "silent_new":
                continue
            result(rid, {"sessionId": "s1"} if method == "session/new" else {})
        elif method == "session/prompt":
            report("prompt")
            if MODE in ("hang", "deaf"):
                say("s1", "working")
                continue
            if MODE == "refusing":
                options = [
                    {"optionId": kind, "name": kind, "kind": kind}
                    for kind in ("allow_always", "allow_once", "reject_always", "reject_once")
                ]
                tool_call = {"toolCallId": "t1", "title": "rm -rf build"}
                ask_id = 1000 + len(asked)
                asked[ask_id] = rid
                send(
                    {
                        "jsonrpc": "2.0",
                        "id": ask_id,
                        "method": "session/request_permission",
                        "params": {"sessionId": "s1", "toolCall": tool_call, "options": options},
                    }
                )
                continue
            if MODE == "rpc_error":
                sys.stderr.write("\x1b[31mfatal:\x1b[0m model quota \x1b]0;title\x07exhausted\n")
                sys.stderr.flush()
                error = {
                    "code": -32603,
                    "message": "Internal error",
                    "data": {"details": "\x1b[1mquota exhausted\x1b[0m for model m-1"},
                }
                send({"jsonrpc": "2.0", "id": rid, "error": error})
        elif rid is not None and method is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})
    if MODE == "deaf":  # stdin closed: keep running anyway
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
