"""Fork: CPU per fork of a parent with a long history (q7).

`python -m benchmarks fork [--n EVENTS] [--quick] [--json]`, or run as a file
(`python benchmarks/fork.py`) with another tree first on `PYTHONPATH` for a same-run A/B: it
uses only what every tree has (`ForkProvider.seed_for`, `SessionStore.create`).

A parent's log of ~EVENTS events (default 5,000: turns of tool steps whose results are ~1 KB;
half written, closed and resumed with `open`, half appended live), with a turn in flight, as
when its model calls the fork tool. Then FORKS (200) children are seeded from it as the fork
provider seeds one (`create_agent`'s part: the provider's seed, `create` with it, the child's
`session/end-seed`, then the log closed), on a directory store with durability "none" (no
fsync: the CPU of the seed, not the disk's). CPU is `process_time` (every thread: a big seed's
work in the hub's pool counts), per fork; the children are deleted after each one.

`first_request_*` (q11): a forked child's first model request reads its conversation, the
seed's messages decoded one by one (each request's are fresh copies); its CPU per read.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent.events import SessionHeader
from agent.history import Conversation, last_turn_number
from agent.log import SessionLog
from agent.store import SessionStore
from agent.usage import usage_of_events
from providers.inprocess import ForkProvider

DEFAULT_EVENTS = 5_000
QUICK_EVENTS = 500
FORKS = 200
QUICK_FORKS = 20
ROUNDS = 3
RESULT = [{"type": "text", "text": "line of a tool's output\n" * 40}]  # ~1 KB


def _turn(log: SessionLog, number: int, steps: int) -> None:
    log.append("turn/start", {"turn": number})
    log.append("user/message", {"message": {"role": "user", "content": [_text("go")]}})
    for step in range(steps):
        call_id = f"c{number}.{step}"
        log.append(
            "assistant/message",
            {
                "message": {
                    "role": "assistant",
                    "content": [_text("reading")],
                    "tool_calls": [{"id": call_id, "name": "read", "arguments": {"n": step}}],
                },
                "finish": "tool_calls",
                "usage": {"input": 1_000 + step, "output": 20},
            },
        )
        log.append(
            "tool/result",
            {"call_id": call_id, "name": "read", "content": RESULT, "is_error": False},
        )
    log.append(
        "assistant/message",
        {"message": {"role": "assistant", "content": [_text("done")]}, "finish": "stop"},
    )
    log.append("turn/end", {"turn": number, "reason": "completed"})


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _parent(store: SessionStore, events: int) -> SessionLog:
    steps = 24  # 2 events a step, 4 a turn: ~52 a turn
    turns = max(2, events // (2 * steps + 4))
    header = SessionHeader(id="parent", created_at=time.time(), cwd="/work")
    log = store.create(header)
    for number in range(1, turns // 2 + 1):
        _turn(log, number, steps)
    log.close()
    log = store.open("parent")
    for number in range(turns // 2 + 1, turns + 1):
        _turn(log, number, steps)
    # The turn in flight: its reply calls the fork tool.
    log.append("turn/start", {"turn": turns + 1})
    log.append("user/message", {"message": {"role": "user", "content": [_text("fork")]}})
    log.append(
        "assistant/message",
        {
            "message": {
                "role": "assistant",
                "content": [],
                "tool_calls": [{"id": "f", "name": "subagent_fork", "arguments": {}}],
            },
            "finish": "tool_calls",
        },
    )
    return log


def _first_request(store: SessionStore, parent: SessionLog, forks: int) -> list[float]:
    """CPU of a forked child's first request's conversation (q11): what `AgentCore` reads of
    its log when it is built (the conversation's positions, the turn number, the usage after
    the seed) and the messages read once, as a model adapter reads `request.messages`."""
    seed = provider_seed(parent)
    header = SessionHeader(
        id="reader",
        created_at=time.time(),
        cwd="/work",
        parent_session=parent.id,
        seed_length=len(seed),
    )
    child = store.create(header, seed)
    child.append("session/end-seed", {"length": len(seed)})
    samples = []
    for _ in range(forks):
        gc.collect()
        t0 = time.process_time()
        history = Conversation(child.events)
        # The turn number as `AgentCore` learns it (the replay's since q11; an older tree reads
        # it from the events).
        _turn_now = child.turn if hasattr(child, "turn") else last_turn_number(child.events)
        usage_of_events(child.events, child.header.seed_length)
        for _message in history.view():
            pass
        samples.append(time.process_time() - t0)
    child.close()
    store.delete(header.id)
    return samples


def _forks(store: SessionStore, parent: SessionLog, forks: int) -> list[float]:
    provider = ForkProvider()
    holder = SimpleNamespace(log=parent, id=parent.id)
    samples = []
    for i in range(forks):
        gc.collect()
        t0 = time.process_time()
        seed = provider.seed_for(holder)
        header = SessionHeader(
            id=f"child{i}",
            created_at=time.time(),
            cwd="/work",
            parent_session=parent.id,
            origin="subagent",
            delegation_depth=1,
            seed_length=len(seed),
        )
        child = store.create(header, seed)  # type: ignore[arg-type]
        child.append("session/end-seed", {"length": len(seed)})
        child.close()
        samples.append(time.process_time() - t0)
        store.delete(header.id)
    return samples


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    quick = bool(getattr(args, "quick", False))
    events = n or (QUICK_EVENTS if quick else DEFAULT_EVENTS)
    forks = QUICK_FORKS if quick else FORKS
    root = Path(tempfile.mkdtemp(prefix="bench-fork-"))
    try:
        store = SessionStore(root / "sessions", durability="none")
        parent = _parent(store, events)
        seed_length = len(provider_seed(parent))
        count = len(parent.events)
        per_round = [statistics.median(_forks(store, parent, forks)) for _ in range(ROUNDS)]
        reads = [statistics.median(_first_request(store, parent, forks)) for _ in range(ROUNDS)]
        messages = len(Conversation(parent.events)) if reads else 0
        parent.close()  # its buffered appends written: the file's whole size
        size = (root / "sessions" / "parent.session").stat().st_size
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "parent_events": count,
        "parent_log_bytes": size,
        "seed_events": seed_length,
        "forks_per_round": forks,
        "rounds": ROUNDS,
        "cpu_per_fork_ms_median": round(statistics.median(per_round) * 1e3, 3),
        "cpu_per_fork_ms_rounds": [round(x * 1e3, 3) for x in per_round],
        "first_request_messages": messages,
        "first_request_cpu_ms_median": round(statistics.median(reads) * 1e3, 3),
        "first_request_cpu_ms_rounds": [round(x * 1e3, 3) for x in reads],
        "tree": str(Path(sys.modules["agent"].__file__ or "").parent.parent),
    }


def provider_seed(parent: SessionLog) -> Any:
    return ForkProvider().seed_for(SimpleNamespace(log=parent, id=parent.id))


if __name__ == "__main__":
    import json

    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    print(json.dumps(run(options.n, options), sort_keys=True))
