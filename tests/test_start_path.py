"""The start path's shortcuts, seen from the seam: a parked child has no actor-loop greenlet
until something has to queue for it, and a steer to an idle child is accepted (logged
`inbox/accepted`) before `steer()` returns, with no hub switch in between."""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event
import pytest
from seam_kit import Gate, blocking_tool, kit, wait_until

from actors import gevent_actor, registry_actor
from agent import store as store_module
from agent.models import scripted as S
from subagent.service import SteerableRunHandle


def test_a_parked_child_has_no_loop_greenlet_and_takes_a_steer_in_place() -> None:
    with kit() as k:
        gate = Gate()
        k.runtime.ctx.tools.register(blocking_tool("wait", gate))

        def respond(request: object) -> S.Step:
            messages = getattr(request, "messages", [])
            if getattr(request, "step", 1) > 1 and messages[-1]["role"] == "user":
                return S.text("steered")
            return S.tool_call("wait", {})

        k.respond = respond  # type: ignore[assignment]
        parent = k.parent()
        run = k.start(parent)
        assert isinstance(run, SteerableRunHandle)
        wait_until(gate.reached.is_set)
        actor = run.local_agent.actor
        assert actor._greenlet is None  # nothing ever had to queue for it
        events = run.local_agent.log.events
        before = len(events)
        admitted = run.steer("wrap up")
        # Accepted in place: logged before steer() returned, no switch to the child's loop.
        accepted = [e for e in events[before:] if e["type"] == "inbox/accepted"]
        assert [e["data"]["kind"] for e in accepted] == ["steer"]
        assert actor._greenlet is None
        gate.open()
        assert admitted.get(timeout=5) == accepted[0]["data"]["message_id"]
        assert run.result.get(timeout=5).output == [{"type": "text", "text": "steered"}]
        run.dispose()  # a dispose must queue (it waits for the close): the loop starts for it
        assert not actor.actor_ref.is_alive()


def test_a_tree_cancel_reaches_each_idle_child_in_place() -> None:
    """A parent's cancel reaches its children (and theirs) as in-place handler calls: every
    child's turn ends `aborted` before any of their actors had to make a loop greenlet."""
    with kit() as k:
        k.respond = lambda request: S.hang()  # type: ignore[assignment,misc]
        parent = k.parent()
        children = [k.start(parent) for _ in range(3)]
        grandchildren = [k.start(c.local_agent) for c in children for _ in range(2)]
        runs = children + grandchildren
        wait_until(lambda: all(r.local_agent.turn_running for r in runs))
        loop_at_turn_end: list[bool] = []
        for run in runs:
            actor = run.local_agent.actor
            assert actor._greenlet is None  # parked: nothing had to queue for it yet
            run.local_agent.add_turn_listener(
                lambda outcome, a=actor: loop_at_turn_end.append(a._greenlet is not None)
            )
        parent.cancel("stop the tree")
        assert {r.result.get(timeout=5).stop_reason for r in runs} == {"aborted"}
        # The cancel took no mailbox hop: no child needed its loop for it.
        assert loop_at_turn_end == [False] * len(runs)


def test_a_wide_cancel_lets_the_hub_run_between_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry hands a fan-out's cancels out in batches of `CANCEL_BATCH` and lets other
    greenlets run in between, so a very wide fan-out never holds the hub for its whole width."""
    monkeypatch.setattr(registry_actor, "CANCEL_BATCH", 2)
    with kit() as k:
        k.respond = lambda request: S.hang()  # type: ignore[assignment,misc]
        parent = k.parent()
        runs = [k.start(parent) for _ in range(6)]
        wait_until(lambda: all(r.local_agent.turn_running for r in runs))
        children = {r.local_agent.id for r in runs}
        order: list[str] = []
        remove = k.runtime.ctx.lifecycle.on_cancelled(
            lambda agent, cause: order.append("cancel") if agent.id in children else None
        )
        done = gevent.event.Event()

        def tick() -> None:
            while not done.is_set():
                order.append("tick")
                gevent.sleep(0)

        ticker = gevent.spawn(tick)
        try:
            parent.cancel("stop them all")
            assert {r.result.get(timeout=5).stop_reason for r in runs} == {"aborted"}
        finally:
            done.set()
            ticker.join(timeout=5)
            remove()
        cancels = "".join("c" if e == "cancel" else "t" for e in order).strip("t")
        # Six cancels in three batches of two, the hub running between them.
        assert cancels.replace("t", "") == "cccccc"
        assert [len(batch) for batch in cancels.split("t") if batch] == [2, 2, 2]


def test_siblings_build_their_shared_request_header_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Children sharing a prompt and tools name one shared header, and only the first of them
    builds, checks and hashes its content: the others find it by prompt and tool identity."""
    built: list[str] = []
    real = store_module.request_header_data

    def counting(system: str, tools: Any) -> dict[str, Any]:
        built.append(system)
        return real(system, tools)

    monkeypatch.setattr(store_module, "request_header_data", counting)
    with kit() as k:
        k.respond = lambda request: S.hang()  # type: ignore[assignment,misc]
        parent = k.parent()
        runs = [k.start(parent) for _ in range(5)]
        wait_until(lambda: all(r.local_agent.turn_running for r in runs))
        refs = {
            e["data"]["ref"]
            for r in runs
            for e in r.local_agent.log.events
            if e["type"] == "request/header"
        }
        assert len(refs) == 1
        assert len(built) == 1
        for run in runs:
            run.cancel("done")
            run.result.get(timeout=5)


def test_a_parked_child_appends_five_events_and_its_start_one() -> None:
    """What a start writes: `inbox/accepted` before `start()` returns, then the first turn up to
    its model call (four more: format 3 writes no step/start). A new event on this path is a
    cost per child: this pins it."""
    with kit() as k:
        k.respond = lambda request: S.hang()  # type: ignore[assignment,misc]
        parent = k.parent()
        k.start(parent)  # a first sibling made the shared header
        run = k.start(parent)
        events = run.local_agent.log.events
        assert [e["type"] for e in events] == ["inbox/accepted"]  # start() has returned
        wait_until(lambda: run.local_agent.turn_running and len(events) == 5)
        assert [e["type"] for e in events] == [
            "inbox/accepted",
            "inbox/claimed",
            "turn/start",
            "user/message",
            "request/header",
        ]
        run.cancel("done")
        run.result.get(timeout=5)


def test_disposing_a_settled_child_takes_no_greenlet_and_no_mailbox_hop() -> None:
    """A settled local child's dispose runs in the caller's greenlet: its actor closes and
    stops in place (no loop greenlet, no disposer), and dispose still returns at quiescence:
    the actor ended, the run's supervisor entry gone, `subagent/end` emitted."""
    with kit() as k:
        parent = k.parent()
        run = k.start(parent)
        assert run.result.get(timeout=5).stop_reason == "completed"
        actor = run.local_agent.actor
        agent = run.local_agent
        run.dispose()
        assert actor._greenlet is None  # no loop was ever made for this child
        assert actor._tasks is None  # nor a disposer group
        assert not run.ref.is_alive() and gevent_actor.join(run.ref, 0)
        assert agent.log.closed
        assert [e["run_id"] for e in k.events_of("subagent/end")] == [run.run_id]
        assert k.service.runs() == []
        run.dispose()  # idempotent


def test_each_childs_prompt_names_its_own_parent_when_parents_alternate() -> None:
    """A provider shares one prompt source among siblings started in a row: children of two
    parents started alternately each log their own parent as the coordinator."""
    with kit() as k:
        k.respond = lambda request: S.hang()  # type: ignore[assignment,misc]
        first, second = k.parent(), k.parent()
        runs = [k.start(parent) for parent in (first, second, second, first, first)]
        for run, parent in zip(runs, (first, second, second, first, first), strict=True):
            accepted = [e for e in run.local_agent.log.events if e["type"] == "inbox/accepted"]
            assert accepted[0]["data"]["source"] == {
                "kind": "coordinator",
                "sender_session_id": parent.id,
            }
