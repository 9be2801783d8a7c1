"""Session log cost: load + validate a long log, append per event, one typical step.

`python -m benchmarks load [--n EVENTS] [--json] [--quick]`. Targets: load of 10,000 events
<= 50 ms; a typical step (5 appends + a step checkpoint) well inside the ~35 us framework
budget per step. Peer: the same events as JSON lines (`json.loads` per line, no checks),
measured in the same process, so the ratio says what framing, CRC and invariants cost.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.events import SessionHeader
from agent.frames import decode_frames
from agent.log import SessionLog, validate_log
from agent.store import SessionStore

TEXT = "The quick brown fox jumps over the lazy dog. " * 4


def _step(log: SessionLog, turn: int, step: int) -> None:
    """A typical step: 5 appends (a steer, a reply with three tool calls, their results) and the
    step checkpoint (log format 3: no step/start, tool/call or step/end events)."""
    log.append(
        "user/message",
        {
            "message": {
                "id": f"s{turn}.{step}",
                "role": "user",
                "content": [{"type": "text", "text": "also check the tests"}],
                "source": {"kind": "user"},
            }
        },
    )
    calls = [
        {"id": f"c{step}.{i}", "name": "read_file", "arguments": {"path": f"src/m{i}.py"}}
        for i in range(3)
    ]
    log.append(
        "assistant/message",
        {
            "message": {
                "id": f"a{turn}.{step}",
                "role": "assistant",
                "content": [{"type": "text", "text": TEXT}],
                "tool_calls": calls,
            },
            "finish": "tool_calls",
            "usage": {"input_tokens": 1200, "output_tokens": 80},
        },
    )
    # Log format 2: the reply's tool_calls open the calls (no tool/call, no step/end).
    for c in calls:
        log.append(
            "tool/result",
            {
                "call_id": c["id"],
                "name": c["name"],
                "content": [{"type": "text", "text": TEXT}],
                "is_error": False,
            },
        )
    log.checkpoint("step")


def _fill(log: SessionLog, n: int) -> tuple[int, float]:
    """Append turns of 4 steps until `n` events; returns (steps, seconds spent in steps)."""
    turn = steps = 0
    spent = 0.0
    while len(log.events) < n:
        turn += 1
        log.append("turn/start", {"turn": turn})
        log.append(
            "user/message",
            {
                "message": {
                    "id": f"u{turn}",
                    "role": "user",
                    "content": [{"type": "text", "text": TEXT}],
                    "source": {"kind": "user"},
                }
            },
        )
        for step in range(1, 5):
            start = time.process_time()
            _step(log, turn, step)
            spent += time.process_time() - start
            steps += 1
        log.append("turn/end", {"turn": turn, "reason": "completed"})
        log.checkpoint("turn")
    return steps, spent


def _best(fn: Callable[[], Any], repeats: int) -> float:
    """Median CPU time of `fn` in seconds (process time: steadier than wall on a busy host)."""
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append(time.process_time() - start)
    return statistics.median(times)


def _wall(fn: Callable[[], Any], repeats: int) -> float:
    """Median wall time of `fn` in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def run(n: int | None, options: Any) -> dict[str, Any]:
    quick = bool(getattr(options, "quick", False))
    n = n or (1000 if quick else 10_000)
    repeats = 3 if quick else 15
    with tempfile.TemporaryDirectory() as tmp:
        store = SessionStore(Path(tmp), durability="turn")
        log = store.create(SessionHeader(id="bench", created_at=0.0, cwd=tmp))
        steps, step_seconds = _fill(log, n)
        log.close()
        events_n = len(log.events)
        path = Path(tmp) / "bench.session"
        data = path.read_bytes()
        header = log.header

        load_s = _best(lambda: store.load("bench"), repeats)
        load_wall_s = _wall(lambda: store.load("bench"), repeats)
        decode_s = _best(lambda: decode_frames(data, "bench"), repeats)
        events = decode_frames(data, "bench")[1]
        validate_s = _best(lambda: validate_log(events, header), repeats)

        # Append cost alone: replay the events into a log whose sink discards.
        class Null:
            def write(self, data: bytes | bytearray) -> None:
                pass

            def sync(self) -> None:
                pass

            def close(self) -> None:
                pass

        def append_all() -> None:
            target = SessionLog(header, [], Null(), "none")
            for e in events:
                target.append(e["type"], e["data"])

        append_s = _best(append_all, max(1, repeats // 3))

        lines = [json.dumps(e) for e in events]
        jsonl_s = _best(lambda: [json.loads(line) for line in lines], repeats)

    load_ms = load_s * 1e3
    return {
        "events": events_n,
        "file_bytes": len(data),
        "load_ms": round(load_ms, 2),
        "load_wall_ms": round(load_wall_s * 1e3, 2),
        "load_target_ms": 50,
        "load_within_target": load_ms <= 50 * max(events_n, 10_000) / 10_000,
        "decode_ms": round(decode_s * 1e3, 2),
        "validate_ms": round(validate_s * 1e3, 2),
        "append_us_per_event": round(append_s / events_n * 1e6, 2),
        "step_us": round(step_seconds / steps * 1e6, 2),
        "step_shape": "5 appends + checkpoint('step') (write, no fsync)",
        "peers": {"jsonl_loads_ms": round(jsonl_s * 1e3, 2)},
        "ratios": {"load_vs_jsonl_loads": round(load_s / jsonl_s, 2)},
    }
