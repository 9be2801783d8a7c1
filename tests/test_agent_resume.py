"""Resume (issue [2 of 8], part 3): an agent rebuilt from its stored log in a new context.

Each "process" is a fresh `AgentContext` over a new `SessionStore` on the same directory, with a
fresh scripted model, and the process-wide id counter reset as a new interpreter would have it.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from test_agent_loop import Kit, of_type, types, wait_for

import agent.loop
from actors.agents import pending_inbox, resume_agent
from agent.events import SessionHeader
from agent.log import validate_log
from agent.models import scripted as S
from agent.store import SessionStore


def _process(root: Path, monkeypatch: pytest.MonkeyPatch) -> Kit:
    monkeypatch.setattr(agent.loop, "_message_ids", itertools.count(1))
    return Kit(SessionStore(root))


def test_resume_continues_turn_numbering_and_history(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _process(tmp_path, monkeypatch)
    a = first.agent()
    first.model.script(a.id, [S.text("one"), S.text("two")])
    a.send("first").get()
    a.send("second").get()
    assert a.when_idle().get().turn == 2
    sid = a.id
    first.close()

    second = _process(tmp_path, monkeypatch)
    try:
        b = resume_agent(second.ctx, sid)
        assert b.core.turn == 2
        assert second.ctx.agents[sid] is b
        second.model.script(sid, [S.text("three")])
        b.send("third").get()
        outcome = b.when_idle().get()
        assert (outcome.turn, outcome.reason) == (3, "completed")
        (request,) = second.model.requests_for(sid)
        texts = [m["content"][0]["text"] for m in request.messages]
        assert texts == ["first", "one", "second", "two", "third"]
        events = second.events(b)
        accepted = [e["data"]["message_id"] for e in of_type(events, "inbox/accepted")]
        assert len(accepted) == len(set(accepted)) == 3  # ids stay unique across processes
        with pytest.raises(ValueError):
            resume_agent(second.ctx, sid)  # already live
    finally:
        second.close()


def test_resume_restores_pending_sends_and_waits_for_a_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _process(tmp_path, monkeypatch)
    a = first.agent()
    first.model.script(a.id, [S.hang()])
    a.send("running").get()
    a.send("pending 1").get()
    a.send("pending 2").get()
    wait_for(lambda: bool(first.model.requests_for(a.id)))
    sid = a.id
    a.close()  # aborts the running turn; queued sends stay accepted, unclaimed
    stored = first.store.load(sid).events
    assert of_type(stored, "turn/end")[-1]["data"]["reason"] == "aborted"
    assert [m["content"][0]["text"] for m in pending_inbox(stored)] == ["pending 1", "pending 2"]
    first.close()

    second = _process(tmp_path, monkeypatch)
    try:
        b = resume_agent(second.ctx, sid)
        second.model.script(sid, [S.text("r1"), S.text("r2"), S.text("r3")])
        # It does not wake itself: idle, nothing claimed, no model call.
        assert b.status == "idle"
        assert b.when_idle().get() is None
        assert second.model.requests_for(sid) == []
        assert types(b.log.events)[-1] == "turn/end"
        b.send("new").get()
        assert b.when_idle().get().turn == 4
        prompts = [
            e["data"]["message"]["content"][0]["text"]
            for e in second.events(b)
            if e["type"] == "user/message"
        ]
        assert prompts == ["running", "pending 1", "pending 2", "new"]
        assert pending_inbox(b.log.events) == []
    finally:
        second.close()


def test_a_torn_tail_is_repaired_and_the_open_turn_reads_interrupted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A process that died mid-tool-call: the turn is open and the last frame is half-written.
    store = SessionStore(tmp_path)
    log = store.create(SessionHeader(id="crashed", cwd=str(tmp_path)))
    content = [{"type": "text", "text": "do it"}]
    log.append(
        "inbox/accepted",
        {"message_id": "m0", "kind": "send", "content": content, "source": {"kind": "user"}},
    )
    log.append("inbox/claimed", {"message_id": "m0"})
    log.append("turn/start", {"turn": 1})
    log.append(
        "user/message",
        {"message": {"id": "m0", "role": "user", "content": content, "source": {"kind": "user"}}},
    )
    log.append("step/start", {"turn": 1, "step": 1})
    call = {"id": "c1", "name": "work", "arguments": {}}
    log.append(
        "assistant/message",
        {
            "message": {"id": "a5", "role": "assistant", "content": [], "tool_calls": [call]},
            "finish": "tool_calls",
        },
    )
    log.append("tool/call", {"call_id": "c1", "name": "work", "arguments": {}})
    log.close()
    path = tmp_path / "crashed.session"
    with path.open("ab") as f:
        f.write(b"\x00\x00\x01\x00torn")  # a frame prefix promising bytes that never came

    k = _process(tmp_path, monkeypatch)
    try:
        b = resume_agent(k.ctx, "crashed")
        events = k.events(b)
        assert of_type(events, "turn/end")[-1]["data"]["reason"] == "interrupted"
        (result,) = of_type(events, "tool/result")
        assert result["data"]["is_error"] and result["data"]["call_id"] == "c1"
        assert b.core.turn == 1
        assert b.status == "idle"
        k.model.script("crashed", [S.text("after the crash")])
        b.send("again").get()
        outcome = b.when_idle().get()
        assert (outcome.turn, outcome.reason) == (2, "completed")
        (request,) = k.model.requests_for("crashed")
        assert [m["role"] for m in request.messages] == ["user", "assistant", "tool", "user"]
    finally:
        k.close()
    validate_log(SessionStore(tmp_path).load("crashed").events)
