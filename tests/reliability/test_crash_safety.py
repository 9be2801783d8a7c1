"""Crash safety: SIGKILL a writer at random moments during durable writes, then load every log.

`crash_writer.py` appends whole turns to a few sessions through the real `SessionStore` (flush +
fsync at every step and turn) and reports each durability point it passed. The harness kills it
after a seeded random delay, then checks every session file:

- it loads (a torn tail is repaired, an open turn closed `interrupted`), never
  `CorruptSessionError` and never another exception;
- `validate_log` passes: seq contiguous from 0, turns and steps balanced;
- nothing reported durable was lost, and every event the writer wrote sits at the seq it was
  written with (its `tag`), so nothing is duplicated, missing or moved before the repaired
  point; the only untagged events are the repair's own closing events.

The next writer reopens the same files, so each file lives through many kill/repair cycles.
The same properties are then checked exhaustively for every byte prefix of a log (what any
torn write leaves behind), and for zero-filled tails (a crash after the size grew).
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any

import gevent
import gevent.subprocess
import pytest
from reliability_kit import size

from agent.events import SessionHeader
from agent.frames import CorruptSessionError, decode_frames
from agent.log import validate_log
from agent.store import MemoryStore, SessionStore, _MemoryFile

WRITER = str(Path(__file__).with_name("crash_writer.py"))
KILLS = size(24, 240)
SESSIONS = 3
SYNTHETIC = {"tool/result", "step/end", "turn/end"}


def run_and_kill(root: Path, seed: int, delay: float) -> tuple[dict[str, int], int]:
    """One writer life: start, wait until ready, sleep `delay`, SIGKILL. Returns the durable
    event count per session it reported, and how many durability points it passed."""
    proc: Any = gevent.subprocess.Popen(
        [sys.executable, WRITER, str(root), str(seed), str(SESSIONS)],
        stdout=gevent.subprocess.PIPE,
        stderr=gevent.subprocess.PIPE,
    )
    durable: dict[str, int] = {}
    points = 0
    try:
        while True:
            line = proc.stdout.readline()
            if not line:
                err = proc.stderr.read().decode(errors="replace")
                raise AssertionError(f"the writer died before it was ready: {err[-2000:]}")
            if line.strip() == b"ready":
                break
        gevent.sleep(delay)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        rest = proc.stdout.read()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    for raw in rest.splitlines():
        parts = raw.decode().split()
        if len(parts) == 3 and parts[0] == "D":
            durable[parts[1]] = max(durable.get(parts[1], 0), int(parts[2]))
            points += 1
    return durable, points


def check_session(store: SessionStore, sid: str, durable: int) -> tuple[bool, int]:
    """Load one session after a kill and prove the properties. Returns (repaired, torn bytes)."""
    seen = store.inspect(sid)  # raises CorruptSessionError if a torn tail were misread
    loaded = store.load(sid)
    validate_log(loaded.events, loaded.header)
    written = 0
    for seq, event in enumerate(loaded.events):
        assert event["seq"] == seq
        tag = event["data"].get("tag")
        if tag is None:
            # Only a repair's closing events are untagged.
            assert event["type"] in SYNTHETIC, event
            if event["type"] == "turn/end":
                assert event["data"]["reason"] == "interrupted"
            if event["type"] == "tool/result":
                assert event["data"]["code"] == "INTERRUPTED"
        else:
            assert tag == f"{sid}/{seq}", f"event at seq {seq} was written as {tag}"
            written = seq + 1
    assert written >= durable, f"{sid}: {durable} events were durable, {written} survived"
    return loaded.repaired, seen.torn_bytes


@pytest.mark.timeout(600)
def test_sigkill_during_durable_writes_never_loses_or_corrupts(tmp_path: Path) -> None:
    rng = random.Random(20261130)
    store = SessionStore(tmp_path, durability="step")
    last_durable: dict[str, int] = {}
    repaired = torn = points = 0
    for _kill in range(KILLS):
        delay = rng.choice((0.0, 0.001, rng.uniform(0.0, 0.05), rng.uniform(0.0, 0.3)))
        durable, passed = run_and_kill(tmp_path, rng.randrange(1 << 30), delay)
        points += passed
        last_durable.update(durable)
        for sid in sorted(f"crash{n}" for n in range(SESSIONS)):
            was_repaired, torn_bytes = check_session(store, sid, last_durable.get(sid, 0))
            repaired += was_repaired
            torn += torn_bytes > 0
            if (tmp_path / f"{sid}.session").stat().st_size > 24 << 20:
                store.delete(sid)  # keep the disk small: the next life starts it afresh
                last_durable.pop(sid, None)
    print(
        f"\ncrash safety: kills={KILLS} durability points={points} repaired loads={repaired} "
        f"torn tails={torn} unreadable logs=0 lost events=0"
    )


# -- every torn prefix -------------------------------------------------------------------------


def _sample_log() -> bytes:
    """A real log of a few turns with tool calls, as the writer would leave it."""
    store = MemoryStore(durability="none")
    header = SessionHeader(id="prefix", created_at=time.time(), cwd="/")
    log = store.create(header)
    for turn in (1, 2):
        log.append("turn/start", {"turn": turn})
        message = {"id": f"m{turn}", "role": "user", "content": [{"type": "text", "text": "hi"}]}
        log.append("user/message", {"message": message})
        log.append("step/start", {"turn": turn, "step": 1})
        call = {"id": f"c{turn}", "name": "t", "arguments": {}}
        reply = {"id": f"a{turn}", "role": "assistant", "content": [], "tool_calls": [call]}
        log.append("assistant/message", {"message": reply, "finish": "tool_calls"})
        log.append("tool/call", {"call_id": f"c{turn}", "name": "t", "arguments": {}})
        content = [{"type": "text", "text": "r" * 40}]
        log.append(
            "tool/result",
            {"call_id": f"c{turn}", "name": "t", "content": content, "is_error": False},
        )
        log.append("step/end", {"turn": turn, "step": 1})
        log.append("turn/end", {"turn": turn, "reason": "completed"})
    log.close()
    return bytes(store.files["prefix"].data)


def test_every_byte_prefix_of_a_log_loads_as_a_repaired_prefix() -> None:
    data = _sample_log()
    _header, full_events, good, torn = decode_frames(data, "sample")
    assert (good, torn) == (len(data), False)
    header_end = None
    for cut in range(len(data) + 1):
        if cut % 64 == 0:
            gevent.sleep(0)
        try:
            _h, events, good, _torn = decode_frames(data[:cut], "cut")
        except CorruptSessionError:
            # Only a cut inside the header frame may fail: then there is no session at all.
            assert header_end is None, f"cut at {cut}: a torn tail was reported as corruption"
            continue
        if header_end is None:
            header_end = cut
        assert events == full_events[: len(events)], f"cut at {cut}: not a prefix"
        assert good <= cut
        # Loading it through a store repairs it into a valid, closed log.
        store = MemoryStore(durability="none")
        store.files["prefix"] = _MemoryFile(data[:cut])
        loaded = store.load("prefix")
        replay = validate_log(loaded.events, loaded.header)
        assert not replay.turn_open
        assert loaded.events[: len(events)] == events


@pytest.mark.parametrize("zeros", [1, 7, 8, 9, 4096])
def test_a_zero_filled_tail_is_torn_not_corrupt(zeros: int) -> None:
    data = _sample_log()
    _h, events, _good, _torn = decode_frames(data, "sample")
    _h, got, good, torn = decode_frames(data + bytes(zeros), "zeros")
    assert (got, good, torn) == (events, len(data), True)
