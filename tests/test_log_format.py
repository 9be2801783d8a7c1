"""Log format 2 (header version 2): a step is `step/start`, `assistant/message` and its
`tool/result`s; the calls are opened by the assistant/message, no `tool/call` or `step/end`
is written (docs/decisions.md, "A step in three events"). Format-1 logs (with both) still
load, replay, repair, resume (in their own format) and show in `subagent log`. Format 3 (no
`step/start` either, what new logs are written in) has its own tests: tests/test_log_format3.py.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from gevent import subprocess as gsub
from test_agent_loop import Kit, of_type, types

import agent.loop
from actors.agents import resume_agent
from agent.events import HEADER_VERSION, Event, SessionHeader
from agent.history import history_from_events, with_tool_calls
from agent.log import InvariantError, LogReplay, closing_events, validate_log
from agent.models import scripted as S
from agent.store import SessionStore
from agent.tools import ToolContext

REPO = Path(__file__).resolve().parent.parent
TEXT = [{"type": "text", "text": "hi"}]
V1 = SessionHeader(id="old", cwd="/work", version=1)
V2 = SessionHeader(id="new", cwd="/work", version=2)


def user(text: str = "hi") -> dict[str, Any]:
    content = [{"type": "text", "text": text}]
    return {"message": {"id": "u", "role": "user", "content": content, "source": {"kind": "user"}}}


def assistant(*calls: str) -> dict[str, Any]:
    tool_calls = [{"id": c, "name": f"t{c}", "arguments": {"x": c}} for c in calls]
    message = {"id": "a", "role": "assistant", "content": TEXT, "tool_calls": tool_calls}
    return {"message": message, "finish": "tool_calls" if calls else "stop"}


def result(call_id: str) -> dict[str, Any]:
    return {"call_id": call_id, "name": f"t{call_id}", "content": TEXT, "is_error": False}


def turn_pairs(turn: int, fmt: int) -> list[tuple[str, dict[str, Any]]]:
    """One turn of two steps (two calls, then text) as format `fmt` writes it."""
    out: list[tuple[str, dict[str, Any]]] = [
        ("turn/start", {"turn": turn}),
        ("user/message", user()),
        ("step/start", {"turn": turn, "step": 1}),
        ("assistant/message", assistant("c1", "c2")),
    ]
    if fmt == 1:
        out += [
            ("tool/call", {"call_id": c, "name": f"t{c}", "arguments": {"x": c}})
            for c in ("c1", "c2")
        ]
    out += [("tool/result", result("c1")), ("tool/result", result("c2"))]
    if fmt == 1:
        out.append(("step/end", {"turn": turn, "step": 1}))
    out += [("step/start", {"turn": turn, "step": 2}), ("assistant/message", assistant())]
    if fmt == 1:
        out.append(("step/end", {"turn": turn, "step": 2}))
    out.append(("turn/end", {"turn": turn, "reason": "completed"}))
    return out


def log_of(pairs: list[tuple[str, dict[str, Any]]]) -> list[Event]:
    return [{"type": t, "seq": i, "time": 0.0, "data": d} for i, (t, d) in enumerate(pairs)]


def state(replay: LogReplay) -> tuple[object, ...]:
    return (replay.turn, replay.turn_open, replay.step, replay.step_open, replay.open_calls)


# -- the structural property: three events a step ------------------------------------------


def _noop(args: Mapping[str, Any], ctx: ToolContext) -> str:
    return "ok"


def test_a_tool_step_appends_two_events_and_a_text_step_one() -> None:
    """Format 3 (what new logs are written in): a step is its reply and its results."""
    k = Kit()
    try:
        k.tool("noop", _noop)
        a = k.agent()
        steps = [S.tool_call("noop", {}) for _ in range(4)] + [S.text("done")]
        k.model.script(a.id, steps)
        a.send("go").get()
        assert a.when_idle().get().reason == "completed"
        events = k.events(a)
        assert a.header.version == HEADER_VERSION == 3
        assert not {"tool/call", "step/end", "step/start"} & set(types(events))
        starts = [i for i, e in enumerate(events) if e["type"] == "assistant/message"]
        end = next(i for i, e in enumerate(events) if e["type"] == "turn/end")
        per_step = [
            [t for t in types(events[s:e]) if t != "request/header"]
            for s, e in zip(starts, [*starts[1:], end], strict=True)
        ]
        assert per_step == [["assistant/message", "tool/result"]] * 4 + [["assistant/message"]]
        # The model saw every call answered, in order, from the log alone.
        last = k.model.requests_for(a.id)[-1].messages
        assert [m["role"] for m in last] == ["user"] + ["assistant", "tool"] * 4
    finally:
        k.close()


# -- the replay: the same state from both formats -------------------------------------------


def test_both_formats_replay_to_the_same_state_at_every_boundary() -> None:
    old = log_of(turn_pairs(1, 1) + turn_pairs(2, 1))
    new = log_of(turn_pairs(1, 2) + turn_pairs(2, 2))
    assert types(old).count("tool/call") == 4 and "tool/call" not in types(new)
    # Same conversation for the model.
    assert history_from_events(old) == history_from_events(new)
    # The same state after each event both formats share (tool/call and step/end are format 1's).
    shared = [i for i, e in enumerate(old) if e["type"] not in ("tool/call", "step/end")]
    assert len(shared) == len(new)
    for n_new, i_old in enumerate(shared, start=1):
        s_old = state(validate_log(old[: i_old + 1], V1))
        s_new = state(validate_log(new[:n_new], V2))
        # Format 1's calls open at their tool/call, its steps close at step/end: compare what a
        # resume would act on (turn, open turn, open calls once its tool/calls are in).
        if (
            old[i_old]["type"] == "assistant/message"
            and old[i_old]["data"]["message"]["tool_calls"]
        ):
            s_old = state(validate_log(old[: i_old + 3], V1))
        assert s_old[:3] == s_new[:3] and s_old[4] == s_new[4], (i_old, s_old, s_new)


def test_a_torn_format2_turn_closes_with_synthetic_results_and_no_step_end() -> None:
    pairs = turn_pairs(1, 2)
    for cut in range(1, len(pairs)):
        events = log_of(pairs[:cut])
        replay = validate_log(events, V2)
        closing = closing_events(replay)
        if not replay.turn_open:
            assert closing == []
            continue
        assert "step/end" not in [t for t, _ in closing]
        synthetic = [d["call_id"] for t, d in closing if t == "tool/result"]
        assert synthetic == list(replay.open_calls)
        assert all(d["code"] == "INTERRUPTED" for t, d in closing if t == "tool/result")
        full = events + log_of([("x", {})] * len(events) + closing)[len(events) :]
        assert not validate_log(full, V2).turn_open
        # The model sees every call answered.
        messages = history_from_events(full)
        asked = {c["id"] for m in messages for c in m.get("tool_calls", ())}
        answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
        assert asked == answered


def test_a_format1_log_torn_between_its_reply_and_tool_call_repairs_as_before() -> None:
    pairs = turn_pairs(1, 1)
    cut = [t for t, _ in pairs].index("tool/call")  # the reply is in, its tool/calls are not
    replay = validate_log(log_of(pairs[:cut]), V1)
    assert replay.open_calls == {}
    assert [t for t, _ in closing_events(replay)] == ["step/end", "turn/end"]


def test_format2_refuses_what_format1_refused_for_calls() -> None:
    def refused(pairs: list[tuple[str, dict[str, Any]]], match: str) -> None:
        with pytest.raises(InvariantError, match=match):
            validate_log(log_of(pairs), V2)

    head: list[tuple[str, dict[str, Any]]] = [
        ("turn/start", {"turn": 1}),
        ("user/message", user()),
        ("step/start", {"turn": 1, "step": 1}),
    ]
    refused([*head, ("assistant/message", assistant("c1", "c1"))], "repeats within turn")
    refused([*head, ("tool/result", result("c9"))], "unknown call")
    twice = [*head, ("assistant/message", assistant("c1")), ("tool/result", result("c1"))]
    refused([*twice, ("tool/result", result("c1"))], "second tool/result")
    again = [*twice, ("step/start", {"turn": 1, "step": 2})]
    refused([*again, ("assistant/message", assistant("c1"))], "repeats within turn")
    bad = assistant()
    bad["message"]["tool_calls"] = [{"id": 1, "name": "t"}]
    refused([*head, ("assistant/message", bad)], "str id and name")
    refused([*head[:1], ("assistant/message", assistant())], "outside a step")
    # A step still needs its turn and its number.
    refused([*head, ("step/start", {"turn": 1, "step": 3})], "was expected")


def test_format1_keeps_its_step_end_rule() -> None:
    head = [("turn/start", {"turn": 1}), ("step/start", {"turn": 1, "step": 1})]
    with pytest.raises(InvariantError, match="step 1 is open"):
        validate_log(log_of([*head, ("turn/end", {"turn": 1, "reason": "error"})]), V1)
    ended = validate_log(log_of([*head, ("turn/end", {"turn": 1, "reason": "error"})]), V2)
    assert not ended.turn_open and not ended.step_open


def test_a_format2_fork_of_a_format1_parent_loads_its_seed() -> None:
    seed = turn_pairs(1, 1)
    pairs = [*seed, ("session/end-seed", {"length": len(seed)}), *turn_pairs(2, 2)]
    header = SessionHeader(id="fork", cwd="/work", seed_length=len(seed), version=2)
    replay = validate_log(log_of(pairs), header)
    assert replay.turn == 2 and not replay.turn_open and replay.format == 2


def test_readers_tell_the_calls_of_both_formats_alike() -> None:
    old = list(with_tool_calls(log_of(turn_pairs(1, 1))))
    new = list(with_tool_calls(log_of(turn_pairs(1, 2))))
    calls = [d for t, d in new if t == "tool/call"]
    assert calls == [
        {"call_id": "c1", "name": "tc1", "arguments": {"x": "c1"}},
        {"call_id": "c2", "name": "tc2", "arguments": {"x": "c2"}},
    ]
    assert [(t, d) for t, d in old if t != "step/end"] == new


# -- an old log, end to end: load, resume, `subagent log` ---------------------------------------


def _old_session(store: SessionStore) -> str:
    """A format-1 log as the loop wrote it before format 2: one completed turn, two calls."""
    header = SessionHeader(id="old1", cwd="/work", version=1)
    with store.create(header) as log:
        for kind, data in turn_pairs(1, 1):
            log.append(kind, data)
    return header.id


def test_an_old_log_resumes_in_its_own_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(agent.loop, "_message_ids", itertools.count(1))
    sid = _old_session(SessionStore(tmp_path))
    k = Kit(SessionStore(tmp_path))
    try:
        k.tool("tc3", _noop)
        b = resume_agent(k.ctx, sid)
        assert b.log.format == 1
        k.model.script(sid, [S.tool_call("tc3", {}, id="c3"), S.text("two")])
        b.send("again").get()
        assert b.when_idle().get().reason == "completed"
        (first, _second) = k.model.requests_for(sid)
        roles = [m["role"] for m in first.messages]
        assert roles == ["user", "assistant", "tool", "tool", "assistant", "user"]
        events = k.events(b)  # validates with its version-1 header
        second_turn = types(events[len(turn_pairs(1, 1)) :])
        assert "tool/call" in second_turn and second_turn.count("step/end") == 2
    finally:
        k.close()
    loaded = SessionStore(tmp_path).load(sid)
    assert loaded.header.version == 1 and not loaded.repaired


def test_an_open_old_log_is_repaired_on_resume(tmp_path: Path) -> None:
    store = SessionStore(tmp_path)
    with store.create(SessionHeader(id="old2", cwd="/work", version=1)) as log:
        for kind, data in turn_pairs(1, 1)[:6]:  # both tool/calls in, no result
            log.append(kind, data)
    loaded = store.load("old2")
    assert loaded.repaired
    tail = types(loaded.events[6:])
    assert tail == ["tool/result", "tool/result", "step/end", "turn/end"]


def _cli_log(home: Path, sid: str) -> list[str]:
    proc = gsub.run(
        [sys.executable, "-m", "subagent.cli", "--home", str(home), "log", sid],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        input="",
    )
    assert proc.returncode == 0, proc.stderr
    return [line for line in proc.stdout.splitlines() if line.startswith(" ")]


def test_subagent_log_shows_both_formats_alike(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    _old_session(store)
    with store.create(SessionHeader(id="new1", cwd="/work")) as log:
        for kind, data in turn_pairs(1, 2):
            log.append(kind, data)
    old_lines = _cli_log(tmp_path, "old1")
    new_lines = _cli_log(tmp_path, "new1")
    calls = [line.strip() for line in new_lines if "tool call" in line]
    assert calls == ['tool call tc1 {"x": "c1"}', 'tool call tc2 {"x": "c2"}']
    # The header line differs (id, created); the turns read the same.
    assert old_lines[1:] == new_lines[1:]
    assert of_type(store.load("old1").events, "tool/call")


def test_a_reply_repeating_a_call_id_ends_the_turn_and_leaves_a_balanced_log() -> None:
    """The reply's append refuses it (format 2 opens calls there): no tool runs, the turn ends
    `error` naming the repeat, the log stays valid and the next turn works."""
    ran: list[str] = []
    k = Kit()
    try:
        k.tool("noop", lambda args, ctx: (ran.append("x"), "ok")[1])
        a = k.agent()
        twice = S.tool_calls([("noop", {}, "same"), ("noop", {}, "same")])
        k.model.script(a.id, [twice, S.text("fine")])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert outcome.reason == "error" and "repeats" in (outcome.message or "")
        assert ran == []
        a.send("again").get()
        assert a.when_idle().get().reason == "completed"
        events = k.events(a)  # validates
        assert of_type(events, "tool/result") == []
        assert [e["data"]["reason"] for e in of_type(events, "turn/end")] == ["error", "completed"]
    finally:
        k.close()
