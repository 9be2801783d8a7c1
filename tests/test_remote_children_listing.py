"""The listings' view of remote runs, asked one parent at a time (`RemoteRunView`): a run with
no log here is listed from the run; a run whose log is here under its run id (a Ray child's, in
the shared store) is one row, from the log, its activity from the run while the service knows
it (`running`, `ended`), `stored` once forgotten. A listing asks the view only about the parents
it lists: never about every run the service knows. Real session logs in a real store; the view
is the service's own table (`RemoteRunTable`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.store import SessionStore
from subagent.listings import Listings, RemoteRun
from subagent.live import LiveAgents
from subagent.remote_runs import RemoteRunTable
from subagent.runtime import Runtime


@dataclass(eq=False)
class Run:
    """What the table reads of a live run (the service's `RunHandle` has these)."""

    id: str
    parent_id: str
    started_at: float = field(default_factory=time.monotonic)
    settled: bool = False


class Recording:
    """A view that records which parents a listing asked about."""

    def __init__(self, table: RemoteRunTable[Run]) -> None:
        self.table = table
        self.asked: list[str] = []

    def children_of(self, parent_id: str) -> Sequence[RemoteRun]:
        self.asked.append(parent_id)
        return self.table.children_of(parent_id)

    def has_runs(self, parent_id: str) -> bool:
        self.asked.append(parent_id)
        return self.table.has_runs(parent_id)


def test_a_run_whose_log_is_here_is_one_row_from_its_log(tmp_path: Path) -> None:
    with Runtime(store=SessionStore(tmp_path)) as rt:
        parent = rt.agent()
        run = Run(f"{parent.id}.ray-1", parent.id)
        # What a Ray host writes: the child's log under the run id (parent: the local parent),
        # and a grandchild it started on the host (parent: that log).
        hosted = rt.agent(
            session_id=run.id, parent_session=parent.id, origin="subagent", delegation_depth=1
        )
        grandchild = rt.agent(parent_session=run.id, origin="subagent", delegation_depth=2)
        grandchild_id = grandchild.id
        hosted.close("written")
        grandchild.close("written")
        table: RemoteRunTable[Run] = RemoteRunTable()
        listings = Listings(rt.store, remote_runs=table)
        table.started(run)

        def rows() -> list[tuple[str, str | None, str, str, bool]]:
            return [
                (r["id"], r["parent_id"], r["mode"], r["activity"], r["has_children"])
                for r in listings.list_children(parent.id)
            ]

        assert rows() == [(run.id, parent.id, "one-shot", "running", True)]
        below = [
            (r["id"], r["parent_id"], r["depth"]) for r in listings.list_descendants(parent.id)
        ]
        assert below == [(run.id, parent.id, 1), (grandchild_id, run.id, 2)]
        run.settled = True
        table.ended(run, keep=1)
        assert rows() == [(run.id, parent.id, "one-shot", "ended", True)]
        table.ended(Run(f"{parent.id}.acp-2", "elsewhere"), keep=1)  # forgets the first
        assert rows() == [(run.id, parent.id, "one-shot", "stored", True)]
        assert Listings(rt.store).list_children(parent.id) == listings.list_children(parent.id)


def test_a_run_with_no_log_is_listed_from_the_run_under_its_parent(tmp_path: Path) -> None:
    with Runtime(store=SessionStore(tmp_path)) as rt:
        parent = rt.agent()
        child = rt.agent(parent_session=parent.id, origin="subagent", delegation_depth=1)
        table: RemoteRunTable[Run] = RemoteRunTable()
        run = Run(f"{child.id}.acp-1", child.id)
        table.started(run)
        listings = Listings(rt.store, LiveAgents(rt.ctx), remote_runs=table)
        (row,) = listings.list_children(child.id)
        assert (row["id"], row["parent_id"], row["depth"], row["activity"]) == (
            run.id,
            child.id,
            2,
            "running",
        )
        (row,) = listings.list_children(parent.id)
        assert (row["id"], row["has_children"]) == (child.id, True)
        below = [(r["id"], r["activity"]) for r in listings.list_descendants(parent.id)]
        assert below == [(child.id, "idle"), (run.id, "running")]


def test_a_listing_asks_about_the_parents_it_lists_only(tmp_path: Path) -> None:
    """10 ended runs under one parent, 1 under a small parent's child: listing the small
    parent asks about it and its rows (has_children) only; its subtree, about the subtree's
    ids only. The big parent's runs are never asked for."""
    with Runtime(store=SessionStore(tmp_path)) as rt:
        big, small = rt.agent(), rt.agent()
        child = rt.agent(parent_session=small.id, origin="subagent", delegation_depth=1)
        table: RemoteRunTable[Run] = RemoteRunTable()
        for i in range(10):
            table.ended(Run(f"{big.id}.acp-{i}", big.id, settled=True), keep=100)
        table.ended(Run(f"{child.id}.acp-x", child.id, settled=True), keep=100)
        view = Recording(table)
        listings = Listings(rt.store, LiveAgents(rt.ctx), remote_runs=view)
        assert [r["id"] for r in listings.list_children(small.id)] == [child.id]
        assert set(view.asked) == {small.id, child.id}
        view.asked.clear()
        below = [r["id"] for r in listings.list_descendants(small.id)]
        assert below == [child.id, f"{child.id}.acp-x"]
        assert set(view.asked) == {small.id, child.id, f"{child.id}.acp-x"}
        assert big.id not in view.asked
