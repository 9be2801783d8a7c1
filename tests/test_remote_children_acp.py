"""An ended one-shot ACP child stays known to its parent as long as a settled task stays
readable: listed `ended` (nothing of it is stored here, so not `stored`), and an interrupt of it
answers "not running" as for an ended local child, not `UNKNOWN_CHILD`. The record is bounded
like the task results (`Runtime(keep_settled=...)`, the oldest end forgotten first). Real ACP
agent subprocesses (`acp_peers/sdk_agent.py`); only the parent's model is scripted."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from acp_peers.support import peer_config
from seam_kit import Kit, kit
from test_serve_mcp_wire import PEER, Wire, text_of

from providers.acp import AcpProvider
from subagent.errors import SubagentError

TIMEOUT = 60.0


def test_an_ended_background_acp_child_is_listed_ended_and_not_running(tmp_path: Path) -> None:
    """Through the model-facing tools: the child the start named is listed `ended` once its
    task settled (children and descendants), and `interrupt_agent` says it was not running."""
    wire = Wire(tmp_path, f"peer={sys.executable} {PEER} normal")
    try:
        child, task = wire.start_background(1, "hello")
        wire.call(2, "task_output", {"task_id": task, "wait": True})
        assert "echo: hello" in text_of(wire.answer(2, timeout=TIMEOUT))
        wire.call(3, "list_agents", {})
        (line,) = text_of(wire.answer(3)).splitlines()
        assert line.startswith(f"{child}  status=ended  mode=one-shot  depth=1  ")
        assert line.endswith("  label=remote")
        wire.call(4, "list_agents", {"scope": "descendants"})
        assert text_of(wire.answer(4)).startswith(f"{child}  status=ended  mode=one-shot  ")
        wire.call(5, "interrupt_agent", {"agent_id": child})
        answer = wire.answer(5)
        assert answer["result"]["isError"] is False, answer
        assert text_of(answer) == f"{child} was not running; nothing was interrupted."
        # Its task still holds its result: the two stay known together.
        wire.call(6, "task_output", {"task_id": task})
        assert "echo: hello" in text_of(wire.answer(6))
    finally:
        wire.close()


@pytest.fixture
def k() -> Iterator[Kit]:
    with kit(keep_settled=2) as k:
        k.service.register(AcpProvider(peer_config("normal")))
        yield k


def run_to_end(k: Kit, parent: object, prompt: str) -> str:
    """Start a one-shot ACP child of `parent`, wait for its end, dispose it; its id."""
    run = k.start(parent, prompt, provider="acp")
    try:
        assert run.local_agent is None
        assert run.result.get(timeout=TIMEOUT).stop_reason == "completed"
    finally:
        run.dispose()
    k.service.sync()  # the registry handled its end: its run table no longer holds it
    child_id: str = run.id
    return child_id


def test_an_ended_acp_child_keeps_its_place_and_the_ancestor_rule(k: Kit) -> None:
    """Ended under a local parent: listed under it (depth from it) and in the root's
    descendants; the parent and the grandparent are told it is not running; a stranger and the
    parent's sibling are refused, as for a running child."""
    root = k.parent()
    middle = k.start(root, "middle")
    uncle = k.start(root, "uncle")
    parent, sibling = middle.local_agent, uncle.local_agent
    assert parent is not None and sibling is not None
    try:
        child = run_to_end(k, parent, "hello")
        assert k.service.runs(parent.id) == []
        rows = k.service.list_children(parent.id)
        assert [(r["id"], r["mode"], r["activity"], r["depth"]) for r in rows] == [
            (child, "one-shot", "ended", 2)
        ]
        below = {r["id"]: r for r in k.service.list_descendants(root.id)}
        assert below[child]["activity"] == "ended" and below[child]["parent_id"] == parent.id
        assert below[parent.id]["has_children"] is True
        assert k.service.interrupt(child, by=parent) is False
        assert k.service.interrupt(child, by=root) is False
        for who in (k.parent(), sibling):
            with pytest.raises(SubagentError) as info:
                k.service.interrupt(child, by=who)
            assert info.value.code == "UNAUTHORIZED"
    finally:
        middle.dispose()
        uncle.dispose()


def test_ended_acp_children_are_forgotten_oldest_first_under_the_task_bound(k: Kit) -> None:
    """`keep_settled=2`: the third end forgets the first, whose id is then unknown, as a task
    past the bound is; the record never grows past the bound."""
    assert k.runtime.tasks.keep_settled == 2
    parent = k.parent()
    first = run_to_end(k, parent, "one")
    second = run_to_end(k, parent, "two")
    assert [r["id"] for r in k.service.list_children(parent.id)] == [first, second]
    third = run_to_end(k, parent, "three")
    rows = k.service.list_children(parent.id)
    assert [(r["id"], r["activity"]) for r in rows] == [(second, "ended"), (third, "ended")]
    with pytest.raises(SubagentError) as info:
        k.service.interrupt(first, by=parent)
    assert info.value.code == "UNKNOWN_CHILD"
    assert k.service.interrupt(second, by=parent) is False
    fourth = run_to_end(k, parent, "four")
    assert [r["id"] for r in k.service.list_children(parent.id)] == [third, fourth]
