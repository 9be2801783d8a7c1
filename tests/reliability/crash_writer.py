"""The writer the crash-safety harness SIGKILLs: real `SessionStore` appends, forever.

Usage: `python crash_writer.py ROOT SEED SESSIONS`. It opens (repairing) or creates SESSIONS
sessions under ROOT and appends whole turns to them, round robin, with a durability point at
every step and turn (`durability="step"`: flush, then fsync). After each checkpoint returns it
prints `D <session> <event count>`: from then on those events are in the file, so a SIGKILL must
not lose them. Every event it writes carries `tag = "<session>/<seq>"` (and payloads of random
size, some far above a page) so the harness can prove nothing was lost, duplicated or moved.
Prints `ready` once every session is open, so the harness kills it during appends.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

# Run as a script: the repository root (two levels up) holds the packages.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from agent.events import SessionHeader
from agent.log import SessionLog
from agent.store import SessionStore


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def tag(log: SessionLog) -> str:
    return f"{log.id}/{len(log.events)}"


def append(log: SessionLog, kind: str, data: dict[str, Any]) -> None:
    data["tag"] = tag(log)
    log.append(kind, data)


def last_turn(log: SessionLog) -> int:
    for event in reversed(log.events):
        if event["type"] in ("turn/start", "turn/end"):
            turn: int = event["data"]["turn"]
            return turn
    return 0


def write_turn(log: SessionLog, rng: random.Random) -> None:
    turn = last_turn(log) + 1
    size = rng.choice((16, 200, 3000, 70_000, 300_000, 4_000_000))
    text = "x" * size
    append(log, "turn/start", {"turn": turn})
    message = {
        "id": f"m{len(log.events)}",
        "role": "user",
        "content": [{"type": "text", "text": text}],
        "source": {"kind": "user"},
    }
    append(log, "user/message", {"message": message})
    steps = rng.randint(1, 3)
    for step in range(1, steps + 1):
        append(log, "step/start", {"turn": turn, "step": step})
        log.checkpoint("step")
        say(f"D {log.id} {len(log.events)}")
        last = step == steps
        call_id = f"c{turn}_{step}"
        calls = [] if last else [{"id": call_id, "name": "t", "arguments": {}}]
        reply = {
            "id": f"a{len(log.events)}",
            "role": "assistant",
            "content": [{"type": "text", "text": text[: size // 2]}],
            "tool_calls": calls,
        }
        append(
            log, "assistant/message", {"message": reply, "finish": "stop" if last else "tool_calls"}
        )
        if not last:
            append(log, "tool/call", {"call_id": call_id, "name": "t", "arguments": {}})
            log.checkpoint("step")
            say(f"D {log.id} {len(log.events)}")
            content = [{"type": "text", "text": text[: size // 3]}]
            append(
                log,
                "tool/result",
                {"call_id": call_id, "name": "t", "content": content, "is_error": False},
            )
        append(log, "step/end", {"turn": turn, "step": step})
    append(log, "turn/end", {"turn": turn, "reason": "completed"})
    log.checkpoint("turn")
    say(f"D {log.id} {len(log.events)}")


def main() -> None:
    root, seed, sessions = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = random.Random(seed)
    store = SessionStore(root, durability="step")
    logs: list[SessionLog] = []
    for n in range(sessions):
        sid = f"crash{n}"
        if store.exists(sid):
            log = store.open(sid)  # repairs a torn or open tail left by the last kill
        else:
            header = SessionHeader(id=sid, created_at=time.time(), cwd=root)
            log = store.create(header)
        say(f"O {sid} {len(log.events)}")
        logs.append(log)
    say("ready")
    while True:
        write_turn(rng.choice(logs), rng)


if __name__ == "__main__":
    main()
