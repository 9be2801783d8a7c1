"""Continuable ACP children are first-class children (issue 15): recorded in the parent's store
(header, descriptor, ACP record), listed, continued by `send_message` (`started`: steering an ACP
agent is impossible), restarted after a crash by the same policy as local children, and
cold-resumed by `subagent send` in a new process after the one that started them died."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gevent
import pytest
from acp_peers.support import Notifier, fake_config, peer_config, pid_alive
from gevent import subprocess
from seam_kit import assert_log_valid, wait_until

import providers.acp as acp_module
from agent.store import SessionStore
from providers.acp import ResumableAcpProvider, provider_for_stored_child
from providers.acp_log import ACP_RECORD_EVENT
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortSignal

HERE = Path(__file__).parent
CHILD_PROCESS = HERE / "acp_child_process.py"
TIMEOUT = 60.0

Events = list[Mapping[str, Any]]


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the SDK peer persists its sessions (as a real agent does), passed by name."""
    where = tmp_path / "agent-state"
    where.mkdir()
    monkeypatch.setenv("ACP_PEER_STATE", str(where))
    return where


@pytest.fixture
def rt(tmp_path: Path, state: Path) -> Iterator[Runtime]:
    with Runtime(store=SessionStore(tmp_path / "sessions")) as runtime:
        runtime.subagents.register(
            ResumableAcpProvider(peer_config("normal", pass_env=["ACP_PEER_STATE"]))
        )
        yield runtime


def start(rt: Runtime, parent: Any, text: str, label: str = "remote helper") -> Any:
    request = SubagentStartRequest(
        prompt=[text_block(text)], parent=parent, signal=AbortSignal.never()
    )
    return rt.subagents.start_continuable("acp", request, label=label)


def output_text(task: Any) -> str:
    return "".join(block.get("text", "") for block in task.output)


def user_texts(events: Events) -> list[str]:
    return [
        "".join(b.get("text", "") for b in e["data"]["message"]["content"])
        for e in events
        if e["type"] == "user/message"
    ]


def turn_ends(events: Events) -> list[str]:
    return [e["data"]["reason"] for e in events if e["type"] == "turn/end"]


def test_a_continuable_acp_child_is_recorded_listed_and_continued(rt: Runtime) -> None:
    parent = rt.agent()
    started = start(rt, parent, "first")
    header = rt.store.header(started.child_id)
    assert header.parent_session == parent.id
    assert header.origin == "subagent"
    assert header.delegation_depth == parent.depth + 1

    [row] = rt.subagents.list_children(parent.id)
    assert (row["id"], row["mode"], row["label"]) == (
        started.child_id,
        "continuable",
        "remote helper",
    )
    first = rt.tasks.wait(started.task_id, timeout=TIMEOUT)
    assert first.status == "completed"
    assert output_text(first).startswith("echo: first [session sess-")

    # Sent right after the first turn settled, or while it still ran: either way a new activation
    # (an ACP agent cannot be steered), which loads the agent's session and sees the first turn.
    sent = rt.subagents.send_message(
        parent, started.child_id, "recall", MessageSource.coordinator(parent.id)
    )
    assert sent.kind == "started"
    second = rt.tasks.wait(sent.task_id or "", timeout=TIMEOUT)
    assert second.status == "completed"
    assert output_text(second) == "recalled: first"

    wait_until(lambda: rt.subagents.list_children(parent.id)[0]["activity"] == "stored")
    events = assert_log_valid(rt.store, started.child_id)
    assert user_texts(events) == ["first", "recall"]
    assert turn_ends(events) == ["completed", "completed"]
    assert [e["type"] for e in events].count("subagent/descriptor") == 1
    [record] = [e["data"] for e in events if e["type"] == ACP_RECORD_EVENT]
    assert record["command"] == sys.executable
    assert record["pass_env"] == ["ACP_PEER_STATE"]
    assert record["acp_session_id"].startswith("sess-")
    assert "ACP_PEER_STATE" not in json.dumps(record["args"])  # names only, never values


def test_a_message_mid_turn_starts_the_next_activation_once_the_turn_ends(
    tmp_path: Path,
) -> None:
    """The fake agent never ends a turn by itself: the child is `running` until its task is
    killed, and a message sent meanwhile waits, then starts a new activation (`started`)."""
    with Runtime(store=SessionStore(tmp_path / "sessions")) as rt:
        rt.subagents.register(ResumableAcpProvider(fake_config("hang")))
        parent = rt.agent()
        started = start(rt, parent, "first")
        [row] = rt.subagents.list_children(parent.id)
        assert row["activity"] == "running"
        sending = gevent.spawn(
            rt.subagents.send_message,
            parent,
            started.child_id,
            "second",
            MessageSource.coordinator(parent.id),
        )
        gevent.sleep(0)  # let it reach the child's lock and wait for the settlement
        assert not sending.ready()
        rt.tasks.kill(started.task_id, "enough")
        sent = sending.get(timeout=TIMEOUT)
        assert sent.kind == "started"
        assert rt.tasks.wait(started.task_id, timeout=TIMEOUT).status == "killed"
        assert rt.subagents.list_children(parent.id)[0]["activity"] == "running"
        rt.tasks.kill(sent.task_id or "", "enough")
        rt.tasks.wait(sent.task_id or "", timeout=TIMEOUT)
        wait_until(lambda: rt.subagents.list_children(parent.id)[0]["activity"] == "stored")
        events = assert_log_valid(rt.store, started.child_id)
        assert user_texts(events) == ["first", "second"]
        assert turn_ends(events) == ["aborted", "aborted"]


def test_a_second_start_under_the_same_id_is_a_duplicate(rt: Runtime) -> None:
    parent = rt.agent()
    started = start(rt, parent, "first")
    rt.tasks.wait(started.task_id, timeout=TIMEOUT)
    request = SubagentStartRequest(
        prompt=[text_block("again")], parent=parent, signal=AbortSignal.never()
    )
    with pytest.raises(SubagentError) as info:
        rt.subagents.start_continuable("acp", request, label="x", child_id=started.child_id)
    assert info.value.code == "DUPLICATE_CHILD"


def test_a_crashed_acp_activation_is_restarted_by_cold_resume(rt: Runtime) -> None:
    parent = rt.agent()
    started = start(rt, parent, "crash")
    crashed = rt.tasks.wait(started.task_id, timeout=TIMEOUT)
    assert crashed.status == "failed"
    assert "exit code 3" in (crashed.detail or "")

    def restarted() -> bool:
        tasks = [t for t in rt.tasks.list() if t.id != started.task_id]
        return bool(tasks) and all(t.settled for t in tasks)

    wait_until(restarted, limit=60_000)
    [again] = [t for t in rt.tasks.list() if t.id != started.task_id]
    assert again.status == "completed"
    assert "Your last activation crashed" in output_text(again)
    events = assert_log_valid(rt.store, started.child_id)
    assert turn_ends(events) == ["error", "completed"]
    assert user_texts(events)[0] == "crash"


@pytest.mark.parametrize("when", ["after its turn", "mid-turn"])
def test_cold_resume_by_subagent_send_in_a_new_process(
    tmp_path: Path, state: Path, when: str
) -> None:
    """The process that started the child is killed (-9) after the child's first turn, or during
    it (the agent then dies with it: PR_SET_PDEATHSIG); a new process continues the child with
    `subagent send`, and the agent sees the first turn."""
    home = tmp_path / "home"
    notifier = Notifier()
    env = {**os.environ, **notifier.env, "PYTHONPATH": os.pathsep.join(sys.path)}
    first = "first" if when == "after its turn" else "hang"
    proc = subprocess.Popen(
        [sys.executable, str(CHILD_PROCESS), str(home), first],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"acp_child_process.py died early: {proc.stderr.read().decode()}")
        ids = json.loads(line)
        if when == "mid-turn":
            agent = int(notifier.expect_all("pid", "hanging")["pid"])
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        notifier.close()
    assert proc.returncode == -signal.SIGKILL
    if when == "mid-turn":
        wait_until(lambda: not pid_alive(agent), limit=60_000)  # died with its parent
    else:
        assert "".join(b["text"] for b in ids["task_output"]).startswith("echo: first")

    env.pop("ACP_PEER_NOTIFY")  # that socket is gone

    def cli(*argv: str) -> Any:
        done = subprocess.run(
            [sys.executable, "-m", "subagent.cli", "--home", str(home), *argv],
            capture_output=True,
            env=env,
            timeout=TIMEOUT,
        )
        assert done.returncode == 0, done.stderr.decode()
        return json.loads(done.stdout)

    [row] = cli("ls", ids["parent"], "--json")
    assert (row["id"], row["mode"], row["label"]) == (ids["child"], "continuable", "remote helper")

    sent = cli("send", ids["child"], "recall", "--json")
    assert sent["delivery"] == "started"
    assert sent["status"] == "completed", sent["detail"]
    assert sent["output"] == f"recalled: {first}"  # the agent saw the first turn (session/load)

    events = assert_log_valid(SessionStore(home / "sessions"), ids["child"])
    assert user_texts(events) == [first, "recall"]
    first_end = "completed" if when == "after its turn" else "interrupted"  # repaired on open
    assert turn_ends(events) == [first_end, "completed"]

    shown = subprocess.run(
        [sys.executable, "-m", "subagent.cli", "--home", str(home), "log", ids["child"]],
        capture_output=True,
        env=env,
        timeout=TIMEOUT,
    )
    assert shown.returncode == 0, shown.stderr.decode()
    assert b"(ACP agent: " in shown.stdout
    assert f"recalled: {first}".encode() in shown.stdout


def test_a_child_of_another_agent_is_refused(rt: Runtime, state: Path) -> None:
    parent, stranger = rt.agent(), rt.agent()
    started = start(rt, parent, "first")
    rt.tasks.wait(started.task_id, timeout=TIMEOUT)
    with pytest.raises(SubagentError) as info:
        rt.subagents.send_message(stranger, started.child_id, "hi", MessageSource.user())
    assert info.value.code == "UNAUTHORIZED"


def test_a_child_whose_log_is_held_elsewhere_is_not_started_twice(
    rt: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process driving the child holds its log: the resume is refused before any agent
    is started (it would load the same ACP session twice)."""
    parent = rt.agent()
    started = start(rt, parent, "first")
    rt.tasks.wait(started.task_id, timeout=TIMEOUT)
    wait_until(lambda: rt.subagents.list_children(parent.id)[0]["activity"] == "stored")
    before = len(rt.store.inspect(started.child_id).events)

    def no_spawn(*_args: Any, **_kwargs: Any) -> None:
        raise AssertionError("an agent was started for a busy child")

    monkeypatch.setattr(acp_module, "ProcessGroup", no_spawn)
    held = rt.store.open(started.child_id)  # as another process's activation would
    try:
        with pytest.raises(SubagentError) as info:
            rt.subagents.send_message(
                parent, started.child_id, "again", MessageSource.coordinator(parent.id)
            )
    finally:
        held.close()
    assert info.value.code == "START_FAILED"
    assert "already active" in info.value.detail
    assert len(rt.store.inspect(started.child_id).events) == before


def test_a_damaged_record_is_not_resumable(rt: Runtime, tmp_path: Path) -> None:
    parent = rt.agent()
    started = start(rt, parent, "first")
    rt.tasks.wait(started.task_id, timeout=TIMEOUT)
    wait_until(lambda: rt.subagents.list_children(parent.id)[0]["activity"] == "stored")
    assert provider_for_stored_child(rt.store, started.child_id) is not None
    assert provider_for_stored_child(rt.store, parent.id) is None  # not an ACP child

    path = tmp_path / "sessions" / f"{started.child_id}.session"
    data = bytearray(path.read_bytes())
    where = data.index(b"acp_session_id")
    data[where : where + 3] = b"XYZ"  # the frame's checksum no longer matches
    path.write_bytes(bytes(data))
    with pytest.raises(SubagentError) as info:
        provider_for_stored_child(rt.store, started.child_id)
    assert info.value.code == "NOT_RESUMABLE"


def test_a_turn_ended_cancelled_after_a_refusal_is_a_failed_task_not_a_killed_one(
    tmp_path: Path,
) -> None:
    with Runtime(store=SessionStore(tmp_path / "sessions")) as rt:
        rt.subagents.register(ResumableAcpProvider(fake_config("refusing")))
        parent = rt.agent()
        started = start(rt, parent, "clean up")
        task = rt.tasks.wait(started.task_id, timeout=TIMEOUT)
        assert task.status == "failed"
        assert "refused permission for: rm -rf build" in (task.detail or "")
        wait_until(lambda: rt.subagents.list_children(parent.id)[0]["activity"] == "stored")
        assert turn_ends(assert_log_valid(rt.store, started.child_id)) == ["error"]
