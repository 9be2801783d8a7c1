"""ActorChild: a GeventActor under supervision delivers the right Exit, exactly once."""

from __future__ import annotations

from typing import Any

import gevent
import gevent.event
import pykka
import pytest

from actors import gevent_actor
from actors.gevent_actor import GeventActor
from actors.supervised import ActorChild, spawn_actor_child
from supervision.child import Child, Exit


class Worker(GeventActor):
    def __init__(self, fail_on_start: bool = False) -> None:
        super().__init__()
        self.fail_on_start = fail_on_start
        self.handled: list[Any] = []

    def on_start(self) -> None:
        if self.fail_on_start:
            raise RuntimeError("cannot start")

    def on_receive(self, message: Any) -> Any:
        self.handled.append(message)
        if message == "crash":
            raise ValueError("handler crashed")
        if message == "quit":
            self.stop()
        return message


class Exits:
    """Collects exits and wakes a waiter on the first one."""

    def __init__(self) -> None:
        self.seen: list[Exit] = []
        self.event = gevent.event.Event()

    def __call__(self, exit: Exit) -> None:
        self.seen.append(exit)
        self.event.set()

    def one(self, child: ActorChild) -> Exit:
        assert self.event.wait(5), "no exit delivered"
        assert child.join(5)
        gevent.sleep(0)  # a duplicate notice, if any, would arrive by now
        assert len(self.seen) == 1, self.seen
        return self.seen[0]


def _watched(fail_on_start: bool = False) -> tuple[ActorChild, Exits]:
    child = spawn_actor_child(Worker, fail_on_start, name="w")
    exits = Exits()
    child.add_exit_listener(exits)
    return child, exits


def test_it_is_a_child() -> None:
    child, _ = _watched()
    assert isinstance(child, Child)
    assert child.name == "w"
    child.request_stop()
    assert child.join(5)


def test_a_crash_in_on_start_is_crashed() -> None:
    child, exits = _watched(fail_on_start=True)
    exit = exits.one(child)
    assert exit.kind == "crashed"
    assert exit.exc_type == "RuntimeError"
    assert exit.message == "cannot start"
    assert exit.traceback and "cannot start" in exit.traceback


def test_a_crash_in_a_told_handler_is_crashed() -> None:
    child, exits = _watched()
    child.ref.tell("crash")
    exit = exits.one(child)
    assert (exit.kind, exit.exc_type) == ("crashed", "ValueError")
    assert exit.abnormal


def test_an_exception_returned_to_an_asker_is_not_a_crash() -> None:
    child, exits = _watched()
    with pytest.raises(ValueError):
        child.ref.ask("crash")
    assert child.ref.is_alive()
    child.request_stop()
    assert exits.one(child).kind == "cancelled"


def test_a_kill_is_crashed_and_fails_pending_asks() -> None:
    child, exits = _watched()
    pending = child.ref.ask("hello", block=False)
    child.kill()
    exit = exits.one(child)
    assert (exit.kind, exit.exc_type) == ("crashed", "ActorKilled")
    with pytest.raises(pykka.ActorDeadError):
        pending.get(timeout=5)


def test_a_requested_stop_is_cancelled_after_queued_messages() -> None:
    child, exits = _watched()
    actor = child.ref._actor_weakref()
    assert isinstance(actor, Worker)
    child.ref.tell(1)
    child.ref.tell(2)
    child.request_stop("enough")
    child.request_stop("twice is harmless")
    assert exits.one(child) == Exit("cancelled")
    assert actor.handled == [1, 2]


class SlowToStop(Worker):
    """Its on_stop waits for ever: only a kill ends it."""

    def on_stop(self) -> None:
        gevent.event.Event().wait()


def test_a_kill_finishing_a_requested_stop_is_cancelled_not_crashed() -> None:
    child = spawn_actor_child(SlowToStop, name="slow")
    exits = Exits()
    child.add_exit_listener(exits)
    child.request_stop("shutting down")
    assert not child.join(0.01)  # stuck in on_stop
    child.kill()
    assert exits.one(child).kind == "cancelled"


def test_a_self_stop_is_normal() -> None:
    child, exits = _watched()
    child.ref.tell("quit")
    assert exits.one(child) == Exit("normal")


def test_a_stop_through_the_ref_is_normal() -> None:
    child, exits = _watched()
    child.ref.stop()
    assert exits.one(child) == Exit("normal")


def test_exit_notices_are_exactly_once_per_listener() -> None:
    child, exits = _watched()
    second = Exits()
    child.add_exit_listener(second)

    def broken(exit: Exit) -> None:
        raise RuntimeError("listener bug")

    child.add_exit_listener(broken)
    third = Exits()
    child.add_exit_listener(third)
    child.request_stop()
    child.kill()  # racing a kill after the stop request still yields one notice each
    child.kill()
    first_exit = exits.one(child)
    assert second.one(child) == first_exit
    assert third.one(child) == first_exit
    late = Exits()
    child.add_exit_listener(late)  # after the end: called at once, once
    assert late.seen == [first_exit]
    child.request_stop()
    child.kill()
    gevent.sleep(0)
    assert [len(e.seen) for e in (exits, second, third, late)] == [1, 1, 1, 1]
    assert child.exit == first_exit


def test_join_times_out_while_running() -> None:
    child, exits = _watched()
    assert child.join(0) is False
    child.request_stop()
    assert exits.one(child).kind == "cancelled"


def test_wrapping_a_foreign_actor_is_refused() -> None:

    ref = pykka.ThreadingActor.start()
    try:
        with pytest.raises(TypeError):
            ActorChild(ref)
    finally:
        ref.stop()


def test_under_a_supervisor_a_crash_restarts_and_dispose_stops_everything() -> None:
    supervisor_mod = pytest.importorskip("supervision.supervisor")
    sup = supervisor_mod.Supervisor("actors")
    started: list[ActorChild] = []
    restarted = gevent.event.Event()

    def start() -> ActorChild:
        child = spawn_actor_child(Worker)
        started.append(child)
        if len(started) == 2:
            restarted.set()
        return child

    sup.start_child(supervisor_mod.ChildSpec(id="worker", start=start, restart="permanent"))
    first = started[0]
    first.ref.tell("crash")
    assert restarted.wait(5)
    assert first.exit is not None and first.exit.kind == "crashed"
    sup.dispose("test over")
    assert started[1].exit == Exit("cancelled")
    assert gevent_actor.live_count() == 0
