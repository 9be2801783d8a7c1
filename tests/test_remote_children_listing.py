"""The listings' view of a remote run whose log is in this store under another id (a one-shot
Ray child: its host's session, in the shared store): one row, under the run's id (the id its
parent was told), with the log's own children hanging under that row. Real session logs in a
real store; the run view is the service's shape (`RemoteRun`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.store import SessionStore
from subagent.listings import Listings, RemoteRun
from subagent.runtime import Runtime


@pytest.mark.parametrize(("ended", "activity"), [(False, "running"), (True, "ended")])
def test_a_run_whose_log_has_another_id_is_listed_once_under_the_run_id(
    tmp_path: Path, ended: bool, activity: str
) -> None:
    with Runtime(store=SessionStore(tmp_path)) as rt:
        parent = rt.agent()
        started = time.time()  # the run starts before its host writes its log
        # What a Ray host writes: the child's session (parent: the local parent), and a
        # grandchild it started on the host (parent: that session).
        hosted = rt.agent(parent_session=parent.id, origin="subagent", delegation_depth=1)
        grandchild = rt.agent(parent_session=hosted.id, origin="subagent", delegation_depth=2)
        hosted_id, grandchild_id = hosted.id, grandchild.id
        hosted.close("written")
        grandchild.close("written")
        run = RemoteRun(f"{parent.id}.ray-1", parent.id, started, hosted_id, ended=ended)
        listings = Listings(rt.store, remote_runs=lambda: [run])
        (row,) = listings.list_children(parent.id)
        assert (row["id"], row["mode"], row["activity"]) == (run.id, "one-shot", activity)
        assert (row["depth"], row["has_children"]) == (1, True)
        below = [
            (r["id"], r["parent_id"], r["depth"]) for r in listings.list_descendants(parent.id)
        ]
        assert below == [(run.id, parent.id, 1), (grandchild_id, run.id, 2)]
        assert [r["id"] for r in listings.list_children(run.id)] == [grandchild_id]
        assert listings.list_children(hosted_id) == []
        # Without the run (forgotten), the log is listed under its own id again.
        bare = Listings(rt.store)
        assert [r["id"] for r in bare.list_children(parent.id)] == [hosted_id]
