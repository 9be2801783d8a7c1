"""The service's table of remote runs (`RemoteRunTable`): live and ended runs by id and by
parent, the ended ones bounded (the oldest end forgotten first, one entry per child id), a
continuable child's new activation listed as the latest while its older end is kept. And the
service reads it one parent or one id at a time: a listing or an interrupt never asks the
registry for every live run (real one-shot ACP children; only the parent's model is scripted).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from acp_peers.support import peer_config
from seam_kit import Kit, kit
from test_remote_children_listing import Run

from providers.acp import AcpProvider
from subagent.errors import SubagentError
from subagent.remote_runs import RemoteRunTable

TIMEOUT = 60.0


def states(table: RemoteRunTable[Run], parent_id: str) -> list[tuple[str, bool]]:
    return [(r.id, r.ended) for r in table.children_of(parent_id)]


def end(table: RemoteRunTable[Run], run: Run, keep: int) -> None:
    run.settled = True
    table.ended(run, keep)


def test_ended_runs_are_bounded_oldest_end_first_across_parents() -> None:
    table: RemoteRunTable[Run] = RemoteRunTable()
    a1, b1, a2, b2 = Run("a1", "A"), Run("b1", "B"), Run("a2", "A"), Run("b2", "B")
    for run in (a1, b1, a2, b2):
        table.started(run)
    assert states(table, "A") == [("a1", False), ("a2", False)]
    end(table, b1, keep=2)
    end(table, a1, keep=2)
    end(table, a2, keep=2)  # the third end forgets the oldest: b1
    assert list(table.ended_ids()) == ["a1", "a2"]
    assert states(table, "B") == [("b2", False)]
    assert table.ended_under("b1") is None and table.live("b1") is None
    assert states(table, "A") == [("a1", True), ("a2", True)]
    end(table, b2, keep=2)  # forgets a1; A keeps a2
    assert list(table.ended_ids()) == ["a2", "b2"]
    assert states(table, "A") == [("a2", True)]
    assert (table.ended_under("a2"), table.ended_under("b2")) == ("A", "B")
    assert table.has_runs("A") and not table.has_runs("C")
    end(table, Run("c1", "C"), keep=0)  # a bound of 0 keeps no end at all
    assert list(table.ended_ids()) == [] and not table.has_runs("A")


def test_a_new_activation_is_listed_live_and_its_end_replaces_the_older_one() -> None:
    """A continuable child ends, another run ends after it, then the child's next activation
    starts: listed live (the latest), an interrupt finds it live; its end replaces its older
    end as the newest, so the other run's end is now the oldest and goes first."""
    table: RemoteRunTable[Run] = RemoteRunTable()
    first = Run("child", "P")
    table.started(first)
    end(table, first, keep=2)
    end(table, Run("other", "Q"), keep=2)
    again = Run("child", "P")
    table.started(again)
    assert states(table, "P") == [("child", False)]
    assert table.live("child") is again and table.ended_under("child") is None
    end(table, again, keep=2)
    assert list(table.ended_ids()) == ["other", "child"]
    assert states(table, "P") == [("child", True)]
    end(table, Run("third", "Q"), keep=2)
    assert list(table.ended_ids()) == ["child", "third"]
    # A stale activation's late end never removes the live one of its id.
    newest = Run("child", "P")
    table.started(newest)
    table.withdraw(first)
    assert table.live("child") is newest


@pytest.fixture
def k() -> Iterator[Kit]:
    with kit(keep_settled=2) as k:
        k.service.register(AcpProvider(peer_config("normal")))
        yield k


def test_listings_and_interrupts_never_walk_the_run_table(
    k: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a one-shot ACP child running and another ended, the parent's listings and its
    interrupts (of the ended one, the running one and an unknown id) ask the registry for no
    run list (`runs()`): each is one parent's or one id's look-up in the service's table."""
    parent = k.parent()
    ended = k.start(parent, "hello", provider="acp")
    try:
        assert ended.result.get(timeout=TIMEOUT).stop_reason == "completed"
    finally:
        ended.dispose()
    running = k.start(parent, "hang", provider="acp")
    calls: list[object] = []
    runs = k.service.runs
    monkeypatch.setattr(k.service, "runs", lambda *a: calls.append(a) or runs(*a))
    try:
        rows = k.service.list_children(parent.id)
        assert [(r["id"], r["activity"]) for r in rows] == [
            (ended.id, "ended"),
            (running.id, "running"),
        ]
        assert len(k.service.list_descendants(parent.id)) == 2
        assert k.service.interrupt(ended.id, by=parent) is False
        with pytest.raises(SubagentError) as info:
            k.service.interrupt("nobody", by=parent)
        assert info.value.code == "UNKNOWN_CHILD"
        assert k.service.interrupt(running.id, by=parent) is True
        assert calls == []
    finally:
        running.dispose()
