"""A minimal ACP agent on the standard library alone: the benchmark's child.

The SDK peer spends ~0.35 s of CPU importing pydantic; a hundred of them on two cores would
measure import time, not the provider. This one answers initialize, session/new and
session/prompt (echo) and exits on stdin EOF, so its start-up is the interpreter's own.
"""

import json
import sys


def send(message: dict) -> None:  # type: ignore[type-arg]
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    for line in sys.stdin:
        msg = json.loads(line)
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1}})
        elif method == "session/new":
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "s1"}})
        elif method == "session/prompt":
            text = "".join(b.get("text", "") for b in params.get("prompt", []))
            update = {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": f"echo: {text}"},
            }
            send({"jsonrpc": "2.0", "method": "session/update",
                  "params": {"sessionId": "s1", "update": update}})  # fmt: skip
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})


if __name__ == "__main__":
    main()
