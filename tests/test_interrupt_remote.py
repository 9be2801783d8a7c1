"""`interrupt_agent` on a child with no agent in this process (an ACP child): its one turn is
its run, so the interrupt cancels the run, which ends `aborted`; the agent process is reaped,
the task says so and the listings show it ended. Only an ancestor may, as for a local child."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from acp_peers.support import (
    Notifier,
    child_processes,
    group_alive,
    peer_config,
    pid_alive,
    wait_until,
)
from seam_kit import Kit, kit
from test_serve_mcp_wire import PEER, Wire, text_of

from agent.store import SessionStore
from providers.acp import AcpProvider, ResumableAcpProvider
from subagent.errors import SubagentError
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortSignal

TIMEOUT = 60.0


def peer_pids() -> set[int]:
    """The test peers this process started that are alive now (children of this process)."""
    return {pid for pid in child_processes() if _runs_peer(pid)}


def _runs_peer(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return str(PEER).encode() in f.read().split(b"\0")
    except OSError:  # it ended meanwhile
        return False


def test_interrupting_a_running_one_shot_acp_child_ends_it_aborted(tmp_path: Path) -> None:
    """The child `list_agents` shows as running is interrupted, not reported "not running": its
    run ends `aborted`, its task says killed, the listing shows it ended, its process is gone."""
    before = peer_pids()
    wire = Wire(tmp_path, f"peer={sys.executable} {PEER} wait")
    try:
        child, task = wire.start_background(1, "wait here")
        (pid,) = peer_pids() - before  # the agent's process: started before the answer
        wire.call(2, "list_agents", {})
        assert text_of(wire.answer(2)).startswith(f"{child}  status=running  mode=one-shot")
        wire.call(3, "interrupt_agent", {"agent_id": child})
        answer = wire.answer(3, timeout=TIMEOUT)
        assert answer["result"]["isError"] is False, answer
        said = text_of(answer)
        assert said.startswith(f"Interrupted {child}: ")
        assert "aborted" in said and "not running" not in said
        # Its end was handled before the answer: the next listing shows it ended.
        wire.call(4, "list_agents", {})
        assert text_of(wire.answer(4)).startswith(f"{child}  status=ended  mode=one-shot  ")
        wire.call(5, "task_output", {"task_id": task, "wait": True})
        output = text_of(wire.answer(5, timeout=TIMEOUT))
        assert output.startswith(f"[TASK_KILLED] Task {task} (remote): killed")
        assert "Subagent was cancelled before it finished." in output  # stop reason aborted
        # The task settles once its run was disposed, which reaps the agent's process group.
        assert not pid_alive(pid)
        assert not group_alive(pid)
        # Ended, yet known as long as its task is: not running, as an ended local child.
        wire.call(6, "interrupt_agent", {"agent_id": child})
        answer = wire.answer(6)
        assert answer["result"]["isError"] is False, answer
        assert text_of(answer) == f"{child} was not running; nothing was interrupted."
    finally:
        wire.close()


@pytest.fixture
def k() -> Iterator[Kit]:
    with kit() as k:
        k.service.register(AcpProvider(peer_config("wait")))
        yield k


def test_only_an_ancestor_may_interrupt_a_remote_run(k: Kit) -> None:
    """The run's parent is a local agent: the ancestor walk starts there. A stranger, the
    parent's sibling and the child's other relatives below are refused, as for a local child
    (`UNAUTHORIZED`), and the run goes on; the grandparent may, and the run ends `aborted`."""
    root = k.parent()
    middle = k.start(root, "middle")  # a local child of root: the ACP child's parent
    uncle = k.start(root, "uncle")
    parent = middle.local_agent
    assert parent is not None and uncle.local_agent is not None
    before = peer_pids()
    remote = k.start(parent, "wait here", provider="acp")
    (pid,) = peer_pids() - before
    assert remote.local_agent is None
    try:
        for who in (k.parent(), uncle.local_agent):
            with pytest.raises(SubagentError) as info:
                k.service.interrupt(remote.id, by=who)
            assert info.value.code == "UNAUTHORIZED"
        assert not remote.settled  # refused: nothing was done to it
        assert [run.id for run in k.service.runs(parent.id)] == [remote.id]
        assert k.service.interrupt(remote.id, by=root) is True  # its grandparent
        result = remote.result.get(timeout=0)  # settled before the interrupt returned
        assert result.stop_reason == "aborted"
        assert k.service.runs(parent.id) == []
    finally:
        remote.dispose()
        middle.dispose()
        uncle.dispose()
    assert not group_alive(pid)


def test_the_parent_interrupts_its_remote_run(k: Kit) -> None:
    parent = k.parent()
    before = peer_pids()
    remote = k.start(parent, "wait here", provider="acp")
    (pid,) = peer_pids() - before
    try:
        assert k.service.interrupt(remote.id, by=parent) is True
        result = remote.result.get(timeout=0)
        # The cause is the result's (`AcpRun.cancel`), not "the run was disposed".
        assert (result.stop_reason, result.diagnostic) == ("aborted", f"interrupted by {parent.id}")
        # The cancel reaps the agent itself, before the run is disposed.
        wait_until(lambda: not group_alive(pid) and not pid_alive(pid))
        # Ended: still its parent's child, not running (not an unknown id).
        assert k.service.interrupt(remote.id, by=parent) is False
        rows = k.service.list_children(parent.id)
        assert [(r["id"], r["activity"]) for r in rows] == [(remote.id, "ended")]
    finally:
        remote.dispose()


def test_a_running_continuable_acp_child_is_interrupted_and_resumes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A continuable ACP child has a header here but no agent: its running activation is the
    run cancelled. The child stays stored and `send_message` resumes it."""
    state = tmp_path / "agent-state"
    state.mkdir()
    monkeypatch.setenv("ACP_PEER_STATE", str(state))
    notifier = Notifier()
    monkeypatch.setenv("ACP_PEER_NOTIFY", notifier.path)
    try:
        with kit(store=SessionStore(tmp_path / "sessions")) as k:
            config = peer_config("normal", pass_env=["ACP_PEER_STATE", "ACP_PEER_NOTIFY"])
            k.service.register(ResumableAcpProvider(config))
            parent = k.parent()
            request = SubagentStartRequest(
                prompt=[text_block("hang")], parent=parent, signal=AbortSignal.never()
            )
            started = k.service.start_continuable("acp", request, label="remote helper")
            notifier.expect("hanging")  # its turn runs in the agent
            assert k.service.interrupt(started.child_id, by=parent) is True
            task = k.runtime.tasks.wait(started.task_id, timeout=TIMEOUT)
            assert task.status == "killed"
            rows = k.service.list_children(parent.id)
            assert [(r["id"], r["activity"]) for r in rows] == [(started.child_id, "stored")]
            source = MessageSource.coordinator(parent.id)
            sent = k.service.send_message(parent, started.child_id, "recall", source)
            assert sent.kind == "started"
            resumed = k.runtime.tasks.wait(str(sent.task_id), timeout=TIMEOUT)
            assert resumed.status == "completed"
            assert "".join(b.get("text", "") for b in resumed.output) == "recalled: hang"
    finally:
        notifier.close()
