"""Log format 3 (header version 3, what new logs are written in): a step is its
`assistant/message` and its `tool/result`s; no `step/start` is written. A steer is logged after
the previous step's last result, before the next reply (docs/decisions.md, "Log format 3").

Format-2 logs keep their rules and, resumed, their format; format 3 replays, repairs and reads
(`subagent log`, the ACP `session/load` replay through `with_tool_calls`) the same as format 2.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gevent
import msgpack
import pytest
from gevent import subprocess as gsub
from test_agent_loop import Gate, Kit, of_type, types, wait_for
from test_log_format import _cli_log, assistant, log_of, result, state, user

from actors.agent_handle import Agent
from actors.agents import resume_agent
from agent.events import HEADER_VERSION, Event, SessionHeader
from agent.frames import decode_frames
from agent.history import history_from_events, with_tool_calls
from agent.log import InvariantError, closing_events, validate_log
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore, _MemoryFile
from agent.tools import ToolContext

HERE = Path(__file__).resolve().parent
V2 = SessionHeader(id="two", cwd="/work", version=2)
V3 = SessionHeader(id="three", cwd="/work")


def steer(text: str = "left") -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    return {"message": {"id": "s", "role": "user", "content": content, "source": {"kind": "user"}}}


def turn_pairs(turn: int, fmt: int) -> list[tuple[str, dict[str, Any]]]:
    """One turn of three steps (two calls; a steer, then one call; text) in format `fmt`."""

    def start(step: int) -> list[tuple[str, dict[str, Any]]]:
        return [("step/start", {"turn": turn, "step": step})] if fmt == 2 else []

    return [
        ("turn/start", {"turn": turn}),
        ("user/message", user()),
        *start(1),
        ("request/header", {"ref": "0" * 64}),
        ("assistant/message", assistant(f"a{turn}", f"b{turn}")),
        ("tool/result", result(f"a{turn}")),
        ("tool/result", result(f"b{turn}")),
        *start(2),
        ("user/message", steer()),
        ("assistant/message", assistant(f"c{turn}")),
        ("tool/result", result(f"c{turn}")),
        *start(3),
        ("assistant/message", assistant()),
        ("turn/end", {"turn": turn, "reason": "completed"}),
    ]


# -- the replay -------------------------------------------------------------------------------


def test_format3_replays_to_format2s_state_at_every_turn_and_step_boundary() -> None:
    two = log_of(turn_pairs(1, 2) + turn_pairs(2, 2))
    three = log_of(turn_pairs(1, 3) + turn_pairs(2, 3))
    assert "step/start" not in types(three) and types(two).count("step/start") == 6
    assert validate_log(three, V3).format == 3 and validate_log(two, V2).format == 2
    # The same conversation for the model, and the same reading for `subagent log` and ACP.
    assert history_from_events(two) == history_from_events(three)
    assert list(with_tool_calls(two)) == list(with_tool_calls(three))
    # Every event both formats share leaves the same state (turn, open turn, step, open calls)
    # wherever a turn or a step has ended: after turn/end, after a step's last result.
    shared = [i for i, e in enumerate(two) if e["type"] != "step/start"]
    assert len(shared) == len(three)
    compared = 0
    for n, i in enumerate(shared, start=1):
        s2 = state(validate_log(two[: i + 1], V2))
        s3 = state(validate_log(three[:n], V3))
        assert (s2[0], s2[1], s2[4]) == (s3[0], s3[1], s3[4]), (i, s2, s3)
        if three[n - 1]["type"] in ("turn/end", "tool/result", "assistant/message"):
            assert s2[2] == s3[2], (i, s2, s3)  # the step number
            compared += 1
    assert compared == 14


def test_format3_places_a_steer_only_at_a_step_boundary() -> None:
    def refused(pairs: list[tuple[str, dict[str, Any]]], match: str) -> None:
        with pytest.raises(InvariantError, match=match):
            validate_log(log_of(pairs), V3)

    head = [("turn/start", {"turn": 1}), ("user/message", user())]
    # Right after the prompt (a steer in step 1) and after a step's last answer: fine.
    validate_log(log_of([*head, ("user/message", steer())]), V3)
    two_calls = [*head, ("assistant/message", assistant("a", "b")), ("tool/result", result("a"))]
    validate_log(log_of([*two_calls, ("tool/result", result("b")), ("user/message", steer())]), V3)
    # Between a reply and its last answer, or after a reply with no calls: refused.
    refused([*two_calls, ("user/message", steer())], "once a step's calls are answered")
    refused([*head, ("assistant/message", assistant("a")), ("user/message", steer())], "only")
    refused([*head, ("assistant/message", assistant()), ("user/message", steer())], "only")
    # Format 2 keeps its rule: a steer only after step/start.
    with pytest.raises(InvariantError):
        validate_log(
            log_of([*two_calls, ("tool/result", result("b")), ("user/message", steer())]), V2
        )


def test_format3_keeps_the_call_rules_and_needs_a_turn_for_a_reply() -> None:
    def refused(pairs: list[tuple[str, dict[str, Any]]], match: str) -> None:
        with pytest.raises(InvariantError, match=match):
            validate_log(log_of(pairs), V3)

    head = [("turn/start", {"turn": 1}), ("user/message", user())]
    refused([("assistant/message", assistant())], "outside a turn")
    refused([*head, ("assistant/message", assistant("c1", "c1"))], "repeats within turn")
    refused([*head, ("tool/result", result("c9"))], "unknown call")
    once = [*head, ("assistant/message", assistant("c1")), ("tool/result", result("c1"))]
    refused([*once, ("tool/result", result("c1"))], "second tool/result")
    refused([*once, ("assistant/message", assistant("c1"))], "repeats within turn")
    # An explicit step/start (older writers, seeds) still has to carry the next number.
    replay = validate_log(log_of(once), V3)
    assert replay.step == 1
    refused([*once, ("step/start", {"turn": 1, "step": 1})], "was expected")
    validate_log(log_of([*once, ("step/start", {"turn": 1, "step": 2})]), V3)


def test_a_format3_fork_loads_a_seed_from_a_format1_or_format2_parent() -> None:
    from test_log_format import turn_pairs as old_pairs

    for fmt in (1, 2):
        seed = old_pairs(1, fmt)
        pairs = [*seed, ("session/end-seed", {"length": len(seed)}), *turn_pairs(2, 3)]
        header = SessionHeader(id="fork", cwd="/work", seed_length=len(seed))
        replay = validate_log(log_of(pairs), header)
        assert replay.turn == 2 and not replay.turn_open and replay.format == 3


def test_a_torn_format3_turn_closes_with_synthetic_results_only() -> None:
    pairs = turn_pairs(1, 3)
    for cut in range(1, len(pairs) + 1):
        events = log_of(pairs[:cut])
        replay = validate_log(events, V3)
        closing = closing_events(replay)
        if not replay.turn_open:
            assert closing == [] and cut == len(pairs)
            continue
        assert [t for t, _ in closing if t != "tool/result"] == ["turn/end"]
        full = events + log_of([("x", {})] * len(events) + closing)[len(events) :]
        assert not validate_log(full, V3).turn_open
        messages = history_from_events(full)
        asked = {c["id"] for m in messages for c in m.get("tool_calls", ())}
        answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
        assert asked == answered


# -- the loop ---------------------------------------------------------------------------------


def _noop(args: Mapping[str, Any], ctx: ToolContext) -> str:
    return "ok"


def _run_script(k: Kit, a: Agent) -> None:
    """Two turns on `a`: parallel calls, a steer while the next call runs, text; then text."""
    gate = Gate()
    k.tool("safe", _noop, safe=True)
    k.tool("slow", lambda args, ctx: (gate.wait(), "slow")[1])
    k.model.script(
        a.id,
        [
            S.tool_calls([("safe", {"n": 1}, "p1"), ("safe", {"n": 2}, "p2")]),
            S.tool_call("slow", {}, id="q1"),
            S.text("steered"),
            S.text("second turn"),
        ],
    )
    a.send("go").get()
    gate.reached.wait()
    admitted = a.steer("go left")
    wait_for(lambda: bool(a.actor._steers), "the steer reached the actor")
    gate.open()
    admitted.get()
    assert a.when_idle().get().reason == "completed"
    a.send("again").get()
    assert a.when_idle().get().reason == "completed"


def _shown(events: list[Event]) -> list[tuple[str, Any]]:
    """What a reader shows of a log: with_tool_calls, minus ids that depend on seq numbers."""
    out: list[tuple[str, Any]] = []
    for kind, data in with_tool_calls(events):
        if kind in ("request/header", "inbox/accepted", "inbox/claimed"):
            continue
        if kind in ("assistant/message", "user/message"):
            data = {**data, "message": {**data["message"], "id": "-"}}
        out.append((kind, data))
    return out


def test_the_loop_writes_format3_that_reads_and_replays_as_format2() -> None:
    """The same two turns (parallel calls, a steer, text) written by the loop in format 3 (a new
    session) and in format 2 (a version-2 session resumed): the same model requests, the same
    reading, the same replay state at every turn boundary; only step/start differs."""
    logs: dict[int, list[Event]] = {}
    requests: dict[int, list[ModelRequest]] = {}
    for fmt in (3, 2):
        k = Kit()
        try:
            if fmt == 3:
                a = k.agent()
            else:
                k.store.create(SessionHeader(id="v2", cwd="/work", version=2)).close()
                a = resume_agent(k.ctx, "v2")
            assert a.log.format == fmt
            _run_script(k, a)
            logs[fmt] = k.events(a)  # validates under its own header
            requests[fmt] = k.model.requests_for(a.id)
        finally:
            k.close()
    two, three = logs[2], logs[3]
    assert "step/start" not in types(three) and types(two).count("step/start") == 4
    assert [t for t in types(two) if t != "step/start"] == types(three)
    assert [r.messages for r in requests[2]] == [r.messages for r in requests[3]]
    assert [(r.turn, r.step) for r in requests[3]] == [(1, 1), (1, 2), (1, 3), (2, 1)]
    assert _shown(two) == _shown(three)
    # The steer is logged after step 2's result and before step 3's reply.
    kinds = types(three)
    at = next(i for i, e in enumerate(three) if e["type"] == "user/message" and i > 3)
    assert kinds[at - 1 : at + 3] == [
        "tool/result",
        "user/message",
        "inbox/claimed",
        "assistant/message",
    ]
    ends2 = [i for i, e in enumerate(two) if e["type"] == "turn/end"]
    ends3 = [i for i, e in enumerate(three) if e["type"] == "turn/end"]
    for i2, i3 in zip(ends2, ends3, strict=True):
        s2 = state(validate_log(two[: i2 + 1], SessionHeader(id="v2", cwd="/", version=2)))
        s3 = state(validate_log(three[: i3 + 1]))
        assert s2 == s3


def _loop_log() -> tuple[bytes, list[Event], MemoryStore]:
    """A format-3 log as the loop writes it: two turns, parallel calls, a steer, text (and the
    store, which holds the log's shared request header)."""
    store = MemoryStore(durability="none")
    k = Kit(store)
    try:
        a = k.agent()
        _run_script(k, a)
        sid = a.id
        events = k.events(a)
    finally:
        k.close()
    return bytes(store.files[sid].data), events, store


def test_every_cut_of_a_format3_log_repairs_to_a_balanced_conversation() -> None:
    """A SIGKILL can cut the file anywhere: every byte prefix loads as a prefix of the events,
    repaired (open calls answered INTERRUPTED, the turn ended `interrupted`, no step/start or
    step/end added), and every call the model asked for is answered, right after its reply."""
    data, full, store = _loop_log()
    header, events, good, torn = decode_frames(data, "full")
    assert header.version == 3 and (good, torn) == (len(data), False) and events == full
    boundaries = 0
    for cut in range(len(data) + 1):
        if cut % 16 == 0:
            gevent.sleep(0)  # a long loop: let the hub breathe
        try:
            _h, prefix, _good, _torn = decode_frames(data[:cut], "cut")
        except Exception:
            continue  # inside the header frame: no session at all
        store.files[header.id] = _MemoryFile(data[:cut])
        loaded = store.load(header.id)
        assert loaded.events[: len(prefix)] == prefix
        added = loaded.events[len(prefix) :]
        replay = validate_log(loaded.events, loaded.header)
        assert not replay.turn_open
        assert not {"step/start", "step/end"} & set(types(added))
        if added:
            assert types(added)[-1] == "turn/end" and added[-1]["data"]["reason"] == "interrupted"
            assert all(e["data"]["code"] == "INTERRUPTED" for e in of_type(added, "tool/result"))
        pending: set[str] = set()
        for message in history_from_events(loaded.events):
            if message["role"] == "tool":
                pending.remove(message["tool_call_id"])
            else:
                assert not pending, f"cut {cut}: a message before every call was answered"
                pending = {c["id"] for c in message.get("tool_calls", ())}
        assert not pending, f"cut {cut}: a call left unanswered"
        boundaries += len(prefix) == len(full) or _torn is False
    assert boundaries > len(full)


def test_a_format3_log_resumes_from_every_frame_boundary() -> None:
    """Resumed from each whole-frame prefix (a kill between two writes), a format-3 session
    repairs, keeps format 3 and runs a turn whose request holds a balanced conversation."""
    data, full, store = _loop_log()
    header, _e, _g, _t = decode_frames(data, "full")
    # Frame ends: each event's frame is 8 bytes of prefix plus its payload.
    sizes = [8 + len(msgpack.packb(e, use_bin_type=True)) for e in full]
    offset = len(data) - sum(sizes)
    ends = [offset]
    for size in sizes:
        offset += size
        ends.append(offset)
    assert ends[-1] == len(data)
    for cut in ends:
        store.files[header.id] = _MemoryFile(data[:cut])
        k = Kit(store)
        try:
            b = resume_agent(k.ctx, header.id)
            assert b.log.format == 3
            # A prompt accepted before the cut and never claimed runs first (restored inbox).
            k.model.script(header.id, [S.text("resumed")], repeat=True)
            b.send("after").get()
            outcome = b.when_idle().get()
            assert outcome.reason == "completed", (cut, outcome)
            events = k.events(b)
            request = k.model.requests_for(header.id)[-1]
            asked = {c["id"] for m in request.messages for c in m.get("tool_calls", ())}
            answered = {m["tool_call_id"] for m in request.messages if m["role"] == "tool"}
            assert asked == answered
            assert "step/start" not in types(events)
        finally:
            k.close()


def test_a_format2_log_resumes_in_format2() -> None:
    k = Kit()
    try:
        k.store.create(SessionHeader(id="old2", cwd="/work", version=2)).close()
        a = resume_agent(k.ctx, "old2")
        k.tool("noop", _noop)
        k.model.script("old2", [S.tool_call("noop", {}), S.text("done")])
        a.send("go").get()
        assert a.when_idle().get().reason == "completed"
        events = k.events(a)
        assert of_type(events, "step/start") and a.header.version == 2
    finally:
        k.close()


# -- readers ----------------------------------------------------------------------------------


def test_subagent_log_shows_format3_as_format2(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    for sid, fmt, version in (("f2", 2, 2), ("f3", 3, HEADER_VERSION)):
        with store.create(SessionHeader(id=sid, cwd="/work", version=version)) as log:
            for kind, data in turn_pairs(1, fmt):
                log.append(kind, data)
    two, three = _cli_log(tmp_path, "f2"), _cli_log(tmp_path, "f3")
    assert "  step 2" in two and "  step 3" in three
    assert two[1:] == three[1:]


# -- a real kill ------------------------------------------------------------------------------

CHILD = HERE / "format3_child.py"


def test_a_format3_session_killed_mid_turn_resumes(tmp_path: Path) -> None:
    """A process running a format-3 session is SIGKILLed while its model call of step 2 is in
    flight; the session then loads repaired (the turn `interrupted`), resumes in format 3, and
    the next turn's request shows every call answered."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent), str(HERE)])}
    proc = gsub.Popen(
        [sys.executable, str(CHILD), str(tmp_path)],
        stdout=gsub.PIPE,
        stderr=gsub.PIPE,
        env=env,
        cwd=str(HERE.parent),
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"format3_child.py died early: {proc.stderr.read().decode()}")
        sid = json.loads(line)["session"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    store = SessionStore(tmp_path)
    assert store.header(sid).version == 3
    loaded = store.load(sid)
    assert loaded.repaired
    kinds = types(loaded.events)
    assert "step/start" not in kinds and kinds[-1] == "turn/end"
    assert loaded.events[-1]["data"]["reason"] == "interrupted"
    k = Kit(SessionStore(tmp_path))
    try:
        b = resume_agent(k.ctx, sid)
        assert b.log.format == 3
        k.model.script(sid, [S.text("back")])
        b.send("again").get()
        assert b.when_idle().get().reason == "completed"
        (request,) = k.model.requests_for(sid)
        roles = [m["role"] for m in request.messages]
        assert roles == ["user", "assistant", "tool", "user", "user"]
        assert (request.turn, request.step) == (2, 1)
        assert "step/start" not in types(k.events(b))
    finally:
        k.close()
