"""Continuable children outliving failures: transient restart of a crashed activation (within
the restart intensity, then left stored and the parent told), and cold resume in a new process
after the old one was killed with SIGKILL mid-turn (a real subprocess: tests/crash_child.py)."""

from __future__ import annotations

import json
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from gevent import subprocess
from seam_kit import Kit, assert_log_valid, kit, last_user_text, wait_until

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import SessionStore
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.types import MessageSource, text_block

CRASH_CHILD = Path(__file__).with_name("crash_child.py")

Events = list[Mapping[str, Any]]


class FailingSink:
    """Wraps a session log's sink: every later write fails like a full disk."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def write(self, data: bytes | bytearray) -> None:
        raise OSError(28, "No space left on device")

    def sync(self) -> None:
        self.inner.sync()

    def close(self) -> None:
        self.inner.close()

    def read(self) -> bytes:
        data: bytes = self.inner.read()
        return data


def break_log_of(k: Kit, session_id: str) -> None:
    """From now on the child's log cannot be written: its turn-end checkpoint faults."""
    session_log = k.runtime.ctx.agents[session_id].log
    session_log._sink = FailingSink(session_log._sink)


def parent_whose_children_crash(k: Kit) -> Any:
    """A parent whose every child activation crashes (its log cannot be written), while the
    parent's own turns answer `done: PROMPT`."""
    parent = k.parent()

    def respond(request: ModelRequest) -> S.Step:
        if request.session_id != parent.id:
            break_log_of(k, request.session_id)
        return S.text(f"done: {last_user_text(request)}")

    k.respond = respond
    return parent


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Kit]:
    with kit(store=SessionStore(tmp_path)) as the_kit:
        yield the_kit


def inbox(parent: Any, kind: str) -> Events:
    return [
        e
        for e in parent.log.events
        if e["type"] == "inbox/accepted" and e["data"]["source"]["kind"] == kind
    ]


def turn_ends(events: Events) -> list[str]:
    return [e["data"]["reason"] for e in events if e["type"] == "turn/end"]


# -- transient restart ------------------------------------------------------------------------


def test_a_crashed_activation_is_restarted_by_cold_resume(k: Kit) -> None:
    crashes: list[str] = []

    def respond(request: ModelRequest) -> S.Step:
        said = last_user_text(request)
        if said == "first" and not crashes:
            crashes.append(request.session_id)
            break_log_of(k, request.session_id)
        return S.text(f"done: {said}")

    k.respond = respond
    parent = k.parent()
    started = k.service.start_continuable("spawn", k.request(parent, "first"), label="fragile")
    tasks = k.runtime.tasks
    crashed = tasks.wait(started.task_id)
    assert crashed.status == "failed"  # a failed required checkpoint: an infrastructure fault
    assert "No space left" in (crashed.detail or "")

    def both_settled() -> bool:
        owned = tasks.list(parent.id)
        return len(owned) == 2 and all(t.settled for t in owned)

    wait_until(both_settled)
    restarted = tasks.list(parent.id)[1]
    assert restarted.status == "completed"
    assert restarted.label == "fragile"
    assert restarted.output is not None
    assert restarted.output[0]["text"].startswith("done: Your last activation crashed")
    wait_until(lambda: started.child_id not in k.runtime.ctx.agents)
    events = assert_log_valid(k.store, started.child_id)
    assert turn_ends(events) == ["interrupted", "completed"]  # the lost tail was repaired
    assert [e["seq"] for e in events] == list(range(len(events)))
    k.flush_events()
    ends = k.events_of("subagent/end")
    assert [e["stop_reason"] for e in ends] == ["error", "completed"]
    assert "No space left" in ends[0]["failure"]
    assert [e["provider"] for e in k.events_of("subagent/start")] == ["spawn", "spawn"]
    notices = inbox(parent, "subagent-settled")
    assert len(notices) == 2  # one per activation
    assert "crashed" in notices[0]["data"]["source"]["summary"]


def test_past_the_restart_intensity_the_child_stays_stored_and_the_parent_is_told(
    k: Kit,
) -> None:
    k.service._continuation.max_restarts = 2

    parent = parent_whose_children_crash(k)
    started = k.service.start_continuable("spawn", k.request(parent, "first"), label="doomed")

    wait_until(lambda: len(inbox(parent, "subagent-report")) >= 1)
    tasks = k.runtime.tasks.list(parent.id)
    assert len(tasks) == 3  # the first activation and two restarts
    assert all(t.status == "failed" for t in tasks)
    [report] = inbox(parent, "subagent-report")
    text = report["data"]["content"][0]["text"]
    assert started.child_id in text and "not restarted" in text
    assert len(inbox(parent, "subagent-settled")) == 3
    wait_until(lambda: started.child_id not in k.runtime.ctx.agents)
    [row] = k.service.list_children(parent.id)
    assert (row["id"], row["activity"], row["label"]) == (started.child_id, "stored", "doomed")
    # Left stored, not lost: once the fault is gone, a message resumes it.
    k.respond = lambda request: S.text(f"done: {last_user_text(request)}")
    result = k.service.send_message(
        parent, started.child_id, "are you back?", MessageSource.coordinator(parent.id)
    )
    assert result.kind == "started"
    assert k.runtime.tasks.wait(result.task_id or "").output == [text_block("done: are you back?")]
    wait_until(lambda: started.child_id not in k.runtime.ctx.agents)
    events = assert_log_valid(k.store, started.child_id)
    assert turn_ends(events) == ["interrupted", "interrupted", "interrupted", "completed"]


def test_a_child_level_failure_is_not_restarted(k: Kit) -> None:
    k.respond = lambda request: (
        S.error("bad gateway")
        if request.session_id != parent.id
        else S.text(f"done: {last_user_text(request)}")
    )
    parent = k.parent()
    started = k.service.start_continuable("spawn", k.request(parent, "first"), label="x")
    assert k.runtime.tasks.wait(started.task_id).status == "failed"

    wait_until(lambda: parent.status == "idle")
    assert len(k.runtime.tasks.list(parent.id)) == 1
    assert inbox(parent, "subagent-report") == []


# -- a new process after kill -9 --------------------------------------------------------------


def test_cold_resume_in_a_new_process_after_kill_9_during_a_turn(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    proc = subprocess.Popen(
        [sys.executable, str(CRASH_CHILD), str(store_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"crash_child.py died early: {proc.stderr.read().decode()}")
        ids = json.loads(line)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    parent_id, finished_id, hanging_id = ids["parent"], ids["finished"], ids["hanging"]

    model = S.ScriptedModel(lambda request: S.text(f"after: {last_user_text(request)}"))
    with Runtime(store=SessionStore(store_dir), scripted=model) as rt:
        rt.subagents.register(SpawnProvider())
        assert rt.store.inspect(hanging_id).needs_repair  # it died inside the turn
        assert not rt.store.inspect(finished_id).needs_repair
        parent = rt.resume_agent(parent_id)
        rows = rt.subagents.list_children(parent_id)
        assert [(r["id"], r["label"], r["activity"], r["mode"]) for r in rows] == [
            (finished_id, "finisher", "stored", "continuable"),
            (hanging_id, "hanger", "stored", "continuable"),
        ]
        for child_id in (hanging_id, finished_id):
            result = rt.subagents.send_message(
                parent, child_id, "still there?", MessageSource.coordinator(parent_id)
            )
            assert result.kind == "started"
            task = rt.tasks.wait(result.task_id or "")
            assert task.status == "completed"
            assert task.output == [text_block("after: still there?")]

        wait_until(lambda: hanging_id not in rt.ctx.agents and finished_id not in rt.ctx.agents)
        for child_id, first_end in ((hanging_id, "interrupted"), (finished_id, "completed")):
            events = assert_log_valid(rt.store, child_id)
            seqs = [e["seq"] for e in events]
            assert seqs == list(range(len(events)))  # contiguous: none duplicated, none lost
            assert turn_ends(events) == [first_end, "completed"]
            turns = [e["data"]["turn"] for e in events if e["type"] == "turn/start"]
            assert turns == [1, 2]
            assert [e["type"] for e in events].count("subagent/descriptor") == 1
            # The request headers name content the killed process stored (durably) before it
            # logged them; this process reads it back.
            headers = [e["data"] for e in events if e["type"] == "request/header"]
            assert headers and all(set(h) == {"ref"} for h in headers)
            for h in headers:
                assert set(rt.store.request_header(h["ref"])) == {"system", "tools"}
        # Rebuilt only from its own log: the resumed turn saw the interrupted prompt.
        assert "hang" in repr(model.requests_for(hanging_id)[-1].messages)
        wait_until(lambda: parent.status == "idle")
        assert len(inbox(parent, "subagent-settled")) == 3  # 1 before the crash, 2 after
