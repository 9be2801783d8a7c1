"""list_children / list_descendants: a live-preferred merge of running agents and stored
subagent headers, ordered by creation, where one unreadable child becomes a diagnostic row and
never hides its healthy siblings."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from seam_kit import Gate, Kit, kit, last_user_text, wait_until

from actors.agents import create_agent
from agent.frames import CorruptSessionError
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.options import AgentOptions
from agent.store import SessionStore
from subagent.errors import SubagentError
from subagent.types import MessageSource

ROW_KEYS = {"id", "mode", "label", "activity", "has_children", "parent_id", "depth"}


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Kit]:
    with kit(store=SessionStore(tmp_path)) as the_kit:
        yield the_kit


def gated_on(prompts: dict[str, Gate]) -> Any:
    def respond(request: ModelRequest) -> S.Step:
        said = last_user_text(request)
        gate = prompts.get(said)
        if gate is not None:
            gate.wait(request.signal)
            request.signal.raise_if_aborted()
        return S.text(f"done: {said}")

    return respond


def start(k: Kit, parent: Any, prompt: str, label: str) -> Any:
    return k.service.start_continuable("spawn", k.request(parent, prompt), label=label)


def settle(k: Kit, started: Any) -> None:
    k.runtime.tasks.wait(started.task_id)
    wait_until(lambda: started.child_id not in k.runtime.ctx.agents)


def corrupt_mid_body(k: Kit, session_id: str) -> None:
    assert isinstance(k.store, SessionStore)
    path = k.store.root / f"{session_id}.session"
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptSessionError):
        k.store.inspect(session_id)


def brief(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["id"], r["label"], r["activity"]) for r in rows]


def test_rows_merge_live_and_stored_children_in_creation_order(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"slow": gate})
    parent = k.parent()
    other_parent = k.parent()
    done = start(k, parent, "quick", "first")
    settle(k, done)
    running = start(k, parent, "slow", "second")
    one_shot = k.start(parent, "plain")
    one_shot.result.get(timeout=5)
    one_shot.dispose()
    foreign = start(k, other_parent, "quick", "not yours")
    settle(k, foreign)
    rows = k.service.list_children(parent.id)
    assert all(set(row) >= ROW_KEYS for row in rows)
    assert brief(rows) == [
        (done.child_id, "first", "stored"),
        (running.child_id, "second", "running"),
        (one_shot.id, None, "stored"),
    ]
    assert [r["mode"] for r in rows] == ["continuable", "continuable", "one-shot"]
    assert all(r["parent_id"] == parent.id and r["depth"] == 1 for r in rows)
    assert not any(r["has_children"] for r in rows)
    gate.open()
    settle(k, running)
    assert [r["activity"] for r in k.service.list_children(parent.id)] == ["stored"] * 3
    assert k.service.list_children("snobody") == []


def test_a_corrupt_child_is_a_diagnostic_row_and_never_hides_its_siblings(k: Kit) -> None:
    parent = k.parent()
    children = [start(k, parent, f"task {i}", f"worker {i}") for i in range(3)]
    for child in children:
        settle(k, child)
    broken = children[1].child_id
    corrupt_mid_body(k, broken)
    rows = k.service.list_children(parent.id)
    assert [r["id"] for r in rows] == [c.child_id for c in children]
    healthy = [rows[0], rows[2]]
    assert [(r["label"], r["activity"]) for r in healthy] == [
        ("worker 0", "stored"),
        ("worker 2", "stored"),
    ]
    bad = rows[1]
    assert bad["activity"] == "corrupt"
    assert bad["label"] is None
    assert bad["parent_id"] == parent.id
    assert broken in bad["error"] or "offset" in bad["error"]
    descendants = k.service.list_descendants(parent.id)
    assert [r["activity"] for r in descendants] == ["stored", "corrupt", "stored"]
    # The parent may still address it: refused as not resumable, never a crash.
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, broken, "hello?", MessageSource.coordinator(parent.id))
    assert info.value.code == "NOT_RESUMABLE"
    stranger = k.parent()
    with pytest.raises(SubagentError) as info:  # authorization still comes first
        k.service.send_message(stranger, broken, "hi", MessageSource.coordinator(stranger.id))
    assert info.value.code == "UNAUTHORIZED"


def test_an_unreadable_child_is_an_unavailable_row(k: Kit, monkeypatch: pytest.MonkeyPatch) -> None:
    parent = k.parent()
    children = [start(k, parent, f"task {i}", f"worker {i}") for i in range(2)]
    for child in children:
        settle(k, child)
    broken = children[0].child_id
    real_reader = k.store._reader  # how a listing reads a stored log

    def reader(session_id: str) -> Any:
        if session_id == broken:
            raise OSError(5, "Input/output error")
        return real_reader(session_id)

    monkeypatch.setattr(k.store, "_reader", reader)
    rows = k.service.list_children(parent.id)
    assert [(r["id"], r["activity"]) for r in rows] == [
        (broken, "unavailable"),
        (children[1].child_id, "stored"),
    ]
    assert rows[1]["label"] == "worker 1"


def test_a_descriptor_of_an_unknown_version_is_listed_not_a_crash(k: Kit) -> None:
    parent = k.parent()
    agent = create_agent(
        k.runtime.ctx,
        options=AgentOptions(model="scripted:default"),
        parent_session=parent.id,
        origin="subagent",
        delegation_depth=1,
    )
    newer = {"version": 7, "provider": "spawn", "label": "from the future"}
    agent.before_first_request(
        lambda: agent.core.add_event("subagent/descriptor", {"descriptor": newer})
    )
    agent.send("hi").get()
    agent.when_idle().get()
    agent.close()
    [row] = k.service.list_children(parent.id)
    assert row["mode"] == "continuable"
    assert row["activity"] == "stored"
    assert row["label"] is None
    assert "version 7" in row["error"]


def test_list_descendants_walks_the_tree_with_parent_ids_and_depths(k: Kit) -> None:
    gates = {"a": Gate(), "grand": Gate()}
    k.respond = gated_on(gates)
    root = k.parent()
    a = start(k, root, "a", "child a")
    b = start(k, root, "b", "child b")
    settle(k, b)
    a_agent = k.runtime.ctx.agents[a.child_id]
    grand = start(k, a_agent, "grand", "grandchild")
    gates["grand"].reached.wait()
    rows = k.service.list_descendants(root.id)
    assert all(set(row) >= ROW_KEYS for row in rows)
    assert [(r["id"], r["parent_id"], r["depth"]) for r in rows] == [
        (a.child_id, root.id, 1),
        (b.child_id, root.id, 1),
        (grand.child_id, a.child_id, 2),
    ]
    assert [r["has_children"] for r in rows] == [True, False, False]
    assert [r["activity"] for r in rows] == ["running", "stored", "running"]
    assert [r["id"] for r in k.service.list_children(root.id)] == [a.child_id, b.child_id]
    assert [r["id"] for r in k.service.list_descendants(a.child_id)] == [grand.child_id]
    assert k.service.list_descendants(grand.child_id) == []
    gates["grand"].open()
    settle(k, grand)
    gates["a"].open()
    settle(k, a)
    rows = k.service.list_descendants(root.id)  # all stored now: from the headers alone
    assert [(r["id"], r["depth"], r["activity"]) for r in rows] == [
        (a.child_id, 1, "stored"),
        (b.child_id, 1, "stored"),
        (grand.child_id, 2, "stored"),
    ]
    assert rows[0]["has_children"] is True
