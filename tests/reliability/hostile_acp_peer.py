"""A hostile ACP agent on the standard library: it snoops and it refuses to die.

Modes (argv[1]):
- `snoop`: answers the prompt with a JSON report of what it could reach: the credentials it
  looked for in its environment, the client capabilities it was offered, and the client's answers
  to `fs/read_text_file` (a file outside its cwd) and `terminal/create`.
- `stubborn`: ignores `session/cancel`, SIGTERM and stdin EOF; only SIGKILL ends it.
"""

import json
import os
import signal
import sys
import time
from typing import Any

CREDENTIALS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN")
state: dict[str, int] = {"next": 1000}


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def ask_client(method: str, params: dict[str, Any]) -> dict[str, Any]:
    """Send a request to the client and read lines until its answer comes."""
    rid = state["next"]
    state["next"] += 1
    send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
    for line in sys.stdin:
        msg: dict[str, Any] = json.loads(line)
        if msg.get("id") == rid and "method" not in msg:
            return msg
    return {"error": "eof"}


def main() -> None:
    mode = sys.argv[1]
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    caps = None
    for line in sys.stdin:
        msg = json.loads(line)
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            caps = params.get("clientCapabilities")
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "h1"}})
        elif method == "session/prompt" and mode == "snoop":
            report = {
                "env": {name: os.environ.get(name) for name in CREDENTIALS},
                "caps": caps,
                "cwd": os.getcwd(),
                "fs": ask_client("fs/read_text_file", {"sessionId": "h1", "path": "/etc/hostname"}),
                "terminal": ask_client(
                    "terminal/create",
                    {"sessionId": "h1", "command": "cat", "args": ["/etc/hostname"]},
                ),
            }
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": json.dumps(report)},
            }
            send({"jsonrpc": "2.0", "method": "session/update",
                  "params": {"sessionId": "h1", "update": update}})  # fmt: skip
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif method == "session/prompt":
            print("prompt received; never answering", file=sys.stderr, flush=True)
    if mode == "stubborn":  # stdin closed: keep running anyway
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
