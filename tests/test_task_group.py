"""Structured concurrency: `TaskGroup` owns its greenlets, and the owners that use one (an ACP
run, the demo's whole runtime) leave no greenlet of theirs running once closed or disposed."""

from __future__ import annotations

import gc
from pathlib import Path

import gevent
import pytest
from acp_peers.support import Parent, peer_config, text_prompt
from gevent import Greenlet
from gevent.event import Event

from providers.acp import AcpProvider
from subagent.demo import Demo
from subagent.types import SubagentStartRequest
from supervision import SupervisorClosedError, TaskGroup
from supervision.signal import AbortSignal


def running_greenlets() -> set[Greenlet]:
    """Every gevent greenlet that is alive now (found through the garbage collector)."""
    return {o for o in gc.get_objects() if isinstance(o, Greenlet) and not o.dead}


# -- the primitive --------------------------------------------------------------------------------


def test_the_group_counts_only_running_greenlets() -> None:
    group = TaskGroup("count")
    release = Event()
    waiting = [group.spawn(release.wait) for _ in range(3)]
    quick = group.spawn(lambda: None)
    quick.join()
    assert len(group) == 3
    release.set()
    gevent.joinall(waiting)
    assert len(group) == 0


def test_close_kills_and_joins_every_greenlet_and_refuses_new_ones() -> None:
    group = TaskGroup("close")
    ended: list[str] = []

    def forever(name: str) -> None:
        try:
            Event().wait()
        finally:
            ended.append(name)

    greenlets = [group.spawn(forever, f"g{i}") for i in range(3)]
    gevent.sleep(0)
    assert group.close() is True
    assert sorted(ended) == ["g0", "g1", "g2"]  # joined: their `finally` ran before close returned
    assert all(g.dead for g in greenlets)
    assert len(group) == 0 and group.closed
    with pytest.raises(SupervisorClosedError):
        group.spawn(forever, "late")
    with pytest.raises(SupervisorClosedError):
        group.spawn_later(1.0, forever, "later")


def test_close_from_a_member_spares_the_caller_and_the_spared_one() -> None:
    group = TaskGroup("spare")
    release = Event()
    other = group.spawn(Event().wait)
    spared = group.spawn(release.wait)
    closed: list[bool] = []
    closer = group.spawn(lambda: closed.append(group.close()))
    closer.join()
    assert closed == [True] and closer.successful()
    assert other.dead and not closer.exception
    # `spare` protects one more greenlet (a disposer waiting for its owner to stop).
    group2 = TaskGroup("spare2")
    kept = group2.spawn(release.wait)
    group2.close(spare=kept)
    assert not kept.dead
    release.set()
    kept.join()
    spared.join()


def test_a_delayed_spawn_closed_before_its_time_never_runs() -> None:
    group = TaskGroup("later")
    ran: list[int] = []
    group.spawn_later(60.0, ran.append, 1)
    assert len(group) == 1
    assert group.close(timeout=5) is True
    gevent.sleep(0)
    assert ran == [] and len(group) == 0


def test_join_waits_without_killing() -> None:
    group = TaskGroup("join")
    release = Event()
    g = group.spawn(release.wait)
    assert group.join(timeout=0.01) is False and not g.dead
    release.set()
    assert group.join() is True and g.successful()


def test_bad_name_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        TaskGroup(3)  # type: ignore[arg-type]


# -- owners ---------------------------------------------------------------------------------------


def test_disposing_an_acp_run_leaves_none_of_its_greenlets_running(tmp_path: Path) -> None:
    before = running_greenlets()
    provider = AcpProvider(peer_config("ignore_cancel"))
    request = SubagentStartRequest(
        prompt=text_prompt("hello"), parent=Parent(cwd=str(tmp_path)), signal=AbortSignal.never()
    )
    run = provider.start(request)  # mid-turn: reader, writer, stderr drain, watcher, turn
    assert running_greenlets() - before
    run.dispose()
    assert running_greenlets() - before == set()


def test_closing_the_demo_leaves_no_greenlet_it_started_running(tmp_path: Path) -> None:
    """The whole runtime: agent actors, run actors, settlers, task watchers, the operator."""
    before = running_greenlets()
    demo = Demo(str(tmp_path / "sessions"), children=7, seed=42)
    try:
        demo.run()
    finally:
        demo.close()
    assert running_greenlets() - before == set()
