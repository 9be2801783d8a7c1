"""GeventActor / GeventFuture: the Pykka API on gevent, and the kill and mass-stop rules."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from types import TracebackType
from typing import Any, ClassVar

import gevent
import gevent.event
import pykka
import pytest
from pykka import ActorDeadError, ActorRegistry

from actors import gevent_actor
from actors.gevent_actor import ActorKilled, GeventActor, GeventFuture


class Echo(GeventActor):
    """Replies, raises, or parks in a handler until released, as told."""

    # Refs hold their actor weakly; keep the objects so tests can inspect them after death.
    instances: ClassVar[dict[str, Echo]] = {}

    def __init__(self) -> None:
        super().__init__()
        Echo.instances[self.actor_urn] = self
        self.started = gevent.event.Event()
        self.entered = gevent.event.Event()
        self.release = gevent.event.Event()
        self.failures: list[type[BaseException] | None] = []
        self.stopped_hook = False
        self.seen: list[Any] = []

    def on_start(self) -> None:
        self.started.set()

    def on_stop(self) -> None:
        self.stopped_hook = True

    def on_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.failures.append(exception_type)

    def on_receive(self, message: Any) -> Any:
        self.seen.append(message)
        if message == "park":
            self.entered.set()
            self.release.wait()
            return "released"
        if message == "boom":
            raise ValueError("boom")
        if message == "ask-self":
            return self.actor_ref.ask("x", timeout=0.05)
        return ("echo", message)

    def add(self, a: int, b: int) -> int:
        return a + b


def _actor(ref: pykka.ActorRef[Any]) -> Echo:
    return Echo.instances[ref.actor_urn]


@pytest.fixture(autouse=True)
def _forget_instances() -> Iterator[None]:
    yield
    Echo.instances.clear()


@pytest.fixture
def refs() -> Iterator[list[pykka.ActorRef[Echo]]]:
    made: list[pykka.ActorRef[Echo]] = []
    yield made
    for ref in made:
        gevent_actor.kill(ref)
    for ref in made:
        assert gevent_actor.join(ref, timeout=5)


def _start(refs: list[pykka.ActorRef[Echo]]) -> pykka.ActorRef[Echo]:
    ref = Echo.start()
    refs.append(ref)
    return ref


# -- the Pykka API ----------------------------------------------------------------------------


def test_ask_tell_and_proxy(refs: list[pykka.ActorRef[Echo]]) -> None:
    ref = _start(refs)
    assert ref.ask(1) == ("echo", 1)
    ref.tell(2)
    assert ref.ask(3) == ("echo", 3)
    assert _actor(ref).seen == [1, 2, 3]
    assert ref.proxy().add(2, 3).get() == 5
    assert ref.stop() is True
    assert ref.stop() is False
    assert _actor(ref).stopped_hook


def test_the_actor_loop_is_a_greenlet_that_runs_on_start(
    refs: list[pykka.ActorRef[Echo]],
) -> None:
    ref = _start(refs)
    assert _actor(ref).started.wait(5)
    assert ref.actor_stopped.wait(0) is False  # a gevent event: waits cooperatively


def test_future_get_with_timeout_raises_pykka_timeout(refs: list[pykka.ActorRef[Echo]]) -> None:
    ref = _start(refs)
    future = ref.ask("park", block=False)
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0.01)
    _actor(ref).release.set()
    assert future.get(timeout=5) == "released"


def test_future_rules_match_threading_future() -> None:
    future: GeventFuture[int] = GeventFuture()
    with pytest.raises(pykka.Timeout):
        future.get(timeout=0)
    future.set(1)
    assert future.get() == 1
    assert future.get(timeout=0) == 1
    with pytest.raises(gevent.queue.Full):
        future.set(2)
    hooked: GeventFuture[int] = GeventFuture()
    hooked.set_get_hook(lambda timeout: 7)
    assert hooked.get() == 7
    with pytest.raises(gevent.queue.Full):
        hooked.set(1)


def test_a_waiter_is_woken_by_set_from_another_greenlet() -> None:
    future: GeventFuture[str] = GeventFuture()
    gevent.spawn(future.set, "late")
    assert future.get(timeout=5) == "late"
    failing: GeventFuture[str] = GeventFuture()

    def fail() -> None:
        try:
            raise KeyError("k")
        except KeyError:
            failing.set_exception()

    gevent.spawn(fail)
    with pytest.raises(KeyError):
        failing.get(timeout=5)


def test_an_exception_in_an_ask_goes_to_the_caller_and_the_actor_lives(
    refs: list[pykka.ActorRef[Echo]],
) -> None:
    ref = _start(refs)
    with pytest.raises(ValueError, match="boom"):
        ref.ask("boom")
    assert ref.is_alive()
    assert ref.ask(1) == ("echo", 1)


def test_an_exception_in_a_tell_stops_the_actor_via_on_failure(
    refs: list[pykka.ActorRef[Echo]],
) -> None:
    ref = _start(refs)
    ref.tell("boom")
    assert gevent_actor.join(ref, timeout=5)
    assert _actor(ref).failures == [ValueError]
    assert ActorRegistry.get_by_urn(ref.actor_urn) is None
    assert isinstance(_actor(ref).crash, ValueError)


def test_asking_yourself_times_out_like_the_threading_runtime(
    refs: list[pykka.ActorRef[Echo]],
) -> None:
    ref = _start(refs)
    with pytest.raises(pykka.Timeout):
        ref.ask("ask-self")
    assert ref.ask(1) == ("echo", 1)


# -- kill -----------------------------------------------------------------------------------


def test_kill_in_a_handler_stops_that_actor_alone(refs: list[pykka.ActorRef[Echo]]) -> None:
    victim, bystander = _start(refs), _start(refs)
    current = victim.ask("park", block=False)
    queued = victim.ask(1, block=False)
    assert _actor(victim).entered.wait(5)
    gevent_actor.kill(victim)
    with pytest.raises(ActorDeadError):
        current.get(timeout=5)
    with pytest.raises(ActorDeadError):
        queued.get(timeout=5)
    assert gevent_actor.join(victim, timeout=5)
    assert not victim.is_alive()
    assert ActorRegistry.get_by_urn(victim.actor_urn) is None
    assert victim.actor_urn not in {r.actor_urn for r in gevent_actor.live_actors()}
    assert _actor(victim).failures == [ActorKilled]
    assert isinstance(_actor(victim).crash, ActorKilled)
    with pytest.raises(ActorDeadError):
        victim.ask(2)
    assert bystander.ask(3) == ("echo", 3)
    assert ActorRegistry.get_by_urn(bystander.actor_urn) is not None


def test_kill_of_an_idle_actor_leaves_no_zombie(refs: list[pykka.ActorRef[Echo]]) -> None:
    ref = _start(refs)
    assert ref.ask(1) == ("echo", 1)  # now idle in its inbox
    gevent_actor.kill(ref)
    assert gevent_actor.join(ref, timeout=5)
    assert ActorRegistry.get_by_urn(ref.actor_urn) is None
    with pytest.raises(ActorDeadError):
        ref.ask(2)


def test_kill_before_the_greenlet_first_ran_skips_on_start(
    refs: list[pykka.ActorRef[Echo]],
) -> None:
    ref = _start(refs)  # no switch yet: on_start has not run
    gevent_actor.kill(ref)
    assert gevent_actor.join(ref, timeout=5)
    assert not _actor(ref).started.is_set()
    assert ActorRegistry.get_by_urn(ref.actor_urn) is None


def test_kill_is_idempotent_and_harmless_after_death(refs: list[pykka.ActorRef[Echo]]) -> None:
    ref = _start(refs)
    ref.stop()
    gevent_actor.kill(ref)
    gevent_actor.kill(ref)
    assert gevent_actor.join(ref, timeout=5)
    assert _actor(ref).crash is None  # a clean stop stays clean


@pytest.mark.parametrize("idle", [True, False], ids=["idle", "busy"])
def test_a_bare_gevent_kill_stops_only_that_actor(
    refs: list[pykka.ActorRef[Echo]], idle: bool
) -> None:
    victim, bystander = _start(refs), _start(refs)
    pending = victim.ask(1 if idle else "park", block=False)
    if idle:
        assert pending.get(timeout=5) == ("echo", 1)
    else:
        assert _actor(victim).entered.wait(5)
    gevent.kill(_actor(victim)._greenlet)  # GreenletExit, not our ActorKilled
    assert gevent_actor.join(victim, timeout=5)
    if not idle:
        with pytest.raises(ActorDeadError):
            pending.get(timeout=5)
    assert ActorRegistry.get_by_urn(victim.actor_urn) is None
    assert bystander.is_alive()
    assert bystander.ask(2) == ("echo", 2)


def test_a_second_kill_interrupts_a_stuck_on_failure(refs: list[pykka.ActorRef[Echo]]) -> None:
    hold = gevent.event.Event()

    class Stubborn(Echo):
        def on_failure(self, *exc_info: Any) -> None:
            self.entered.set()
            hold.wait()

    ref = Stubborn.start()
    refs.append(ref)
    assert ref.ask(1) == ("echo", 1)
    gevent_actor.kill(ref)
    assert _actor(ref).entered.wait(5)
    assert not gevent_actor.join(ref, timeout=0)
    _actor(ref)._killed = None  # let a second kill through, as a supervisor's escalation would
    gevent_actor.kill(ref)
    assert gevent_actor.join(ref, timeout=5)


# -- the O(1) index and mass stop -------------------------------------------------------------


def test_live_index_follows_starts_and_stops(refs: list[pykka.ActorRef[Echo]]) -> None:
    base = gevent_actor.live_count()
    made = [_start(refs) for _ in range(5)]
    assert gevent_actor.live_count() == base + 5
    assert [r.actor_urn for r in gevent_actor.live_actors()][-5:] == [r.actor_urn for r in made]
    made[1].stop()
    made[3].tell("boom")
    gevent_actor.kill(made[4])
    for ref in (made[1], made[3], made[4]):
        assert gevent_actor.join(ref, timeout=5)
    assert gevent_actor.live_count() == base + 2
    alive = {r.actor_urn for r in gevent_actor.live_actors()}
    assert {made[0].actor_urn, made[2].actor_urn} <= alive


def test_stop_all_processes_queued_messages_then_stops_everyone() -> None:
    made = [Echo.start() for _ in range(300)]
    for ref in made:
        ref.tell("queued")
    asked = made[0].ask("last", block=False)
    assert gevent_actor.stop_all(timeout=10) == 300
    assert gevent_actor.live_count() == 0
    assert not ActorRegistry.get_by_class(Echo)
    assert asked.get(timeout=0) == ("echo", "last")
    assert all(_actor(r).seen == ["queued"] + (["last"] if r is made[0] else []) for r in made)
    assert all(_actor(r).stopped_hook for r in made)


def test_stop_all_leaves_other_runtimes_alone() -> None:
    threaded = pykka.ThreadingActor.start()
    try:
        Echo.start()
        gevent_actor.stop_all(timeout=10)
        assert threaded.is_alive()
    finally:
        threaded.stop()


def test_stop_all_raises_timeout_when_an_actor_will_not_stop(
    refs: list[pykka.ActorRef[Echo]],
) -> None:
    ref = _start(refs)
    ref.tell("park")
    assert _actor(ref).entered.wait(5)
    with pytest.raises(pykka.Timeout):
        gevent_actor.stop_all(timeout=0.01, refs=[ref])
    _actor(ref).release.set()
    assert gevent_actor.join(ref, timeout=5)


def test_join_reports_whether_the_loop_ended(refs: list[pykka.ActorRef[Echo]]) -> None:
    ref = _start(refs)
    assert gevent_actor.join(ref, timeout=0) is False
    ref.stop()
    assert gevent_actor.join(ref, timeout=5) is True


def test_kill_refuses_a_foreign_actor() -> None:
    threaded = pykka.ThreadingActor.start()
    try:
        with pytest.raises(TypeError):
            gevent_actor.kill(threaded)
    finally:
        threaded.stop()


def test_freeze_gc_freezes() -> None:
    try:
        gevent_actor.freeze_gc()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_ask_now_runs_an_idle_actors_handler_in_place_and_keeps_mailbox_order() -> None:
    """The run-to-completion shortcut: an idle actor answers in the caller's greenlet (no
    switch); a busy one (queued messages) answers in mailbox order, as a plain ask would."""
    import greenlet as _greenlet

    from actors.gevent_actor import Deferred, GeventActor

    seen: list[object] = []

    class Recorder(GeventActor):
        def on_receive(self, message: object) -> object:
            seen.append(message)
            if message == "later":
                reply: Deferred[str] = Deferred()
                reply.resolve("resolved")
                return reply
            if message == "boom":
                raise ValueError("boom")
            return ("handled in", _greenlet.getcurrent())

    ref = Recorder.start()
    actor = ref._actor_weakref()
    gevent.sleep(0)  # the loop is parked on its empty inbox
    assert actor.ask_now("idle") == ("handled in", _greenlet.getcurrent())
    assert actor.ask_now("later") == "resolved"
    assert actor.ask_now("later", block=False).get(timeout=1) == "resolved"
    with pytest.raises(ValueError):
        actor.ask_now("boom")
    with pytest.raises(ValueError):
        actor.ask_now("boom", block=False).get(timeout=1)
    ref.tell("queued first")
    where = actor.ask_now("busy")
    assert where[1] is not _greenlet.getcurrent()  # handled by the actor's own loop
    assert seen[-2:] == ["queued first", "busy"]
    ref.stop()


class Lazy(GeventActor):
    """A lazy actor: no greenlet until a message has to wait in its inbox."""

    lazy_loop = True

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[object] = []
        self.release = gevent.event.Event()

    def on_receive(self, message: object) -> object:
        self.seen.append(message)
        if message == "park":
            self.release.wait()
        if message == "boom":
            raise ValueError("boom")
        return message


def _loop_of(actor: GeventActor) -> object:
    return actor._greenlet  # what the laziness is about


def test_a_lazy_actor_has_no_loop_until_a_message_must_wait() -> None:
    import greenlet as _greenlet

    ref = Lazy.start()
    actor = gevent_actor.actor_of(ref)
    assert isinstance(actor, Lazy)
    assert _loop_of(actor) is None and gevent_actor.live_count() >= 1
    assert actor.ask_now("in place") == "in place"  # handled here, still no loop
    actor.tell_now("told in place")
    assert _loop_of(actor) is None
    assert actor.seen == ["in place", "told in place"]
    # A plain tell must wait in the inbox: that starts the loop, which handles it in order.
    ref.tell("queued")
    assert _loop_of(actor) is not None
    assert ref.ask("after") == "after"
    assert actor.seen[-2:] == ["queued", "after"]
    # Busy (a handler parked): tell_now queues behind it instead of running in place.
    ref.tell("park")
    gevent.sleep(0)
    actor.tell_now("behind the park")
    assert actor.seen[-1] == "park"
    actor.release.set()
    assert ref.ask("sync") == "sync"
    assert actor.seen[-3:] == ["park", "behind the park", "sync"]
    where: list[object] = []
    ref2 = Lazy.start()
    lazy2 = gevent_actor.actor_of(ref2)
    assert isinstance(lazy2, Lazy)
    lazy2.on_receive = lambda m: where.append(_greenlet.getcurrent())  # type: ignore[method-assign]
    lazy2.tell_now("x")
    assert where == [_greenlet.getcurrent()]
    ref.stop()
    ref2.stop()
    assert gevent_actor.join(ref, 5) and gevent_actor.join(ref2, 5)


def test_a_lazy_actor_never_started_still_stops_and_dies() -> None:
    stopped = Lazy.start()
    assert stopped.stop() is True  # the stop message starts the loop, which stops
    assert gevent_actor.join(stopped, 5)
    killed = Lazy.start()
    asked = killed.ask("x", block=False)  # queued: the loop starts to handle it
    gevent_actor.kill(killed)
    assert gevent_actor.join(killed, 5)
    with pytest.raises(ActorDeadError):
        asked.get(timeout=5)
    never = Lazy.start()
    actor = gevent_actor.actor_of(never)
    assert actor is not None and _loop_of(actor) is None
    gevent_actor.kill(never)  # no loop yet: the kill starts one, which dies at once
    assert gevent_actor.join(never, 5)
    assert not never.is_alive()


def test_a_told_handler_that_raises_in_place_crashes_the_actor() -> None:
    ref = Lazy.start()
    actor = gevent_actor.actor_of(ref)
    assert actor is not None
    actor.tell_now("boom")
    assert gevent_actor.join(ref, 5)
    assert isinstance(actor.crash, ValueError)
    assert not ref.is_alive()


def test_a_class_with_on_start_is_never_lazy() -> None:
    class Eager(Lazy):
        def on_start(self) -> None:
            self.seen.append("on_start")

    ref = Eager.start()
    actor = gevent_actor.actor_of(ref)
    assert actor is not None and _loop_of(actor) is not None
    assert ref.ask("x") == "x"
    assert isinstance(actor, Eager) and actor.seen == ["on_start", "x"]
    ref.stop()


class SelfStopping(Lazy):
    """Stops itself from its handler of "quit" (as a closing agent does)."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped_in: list[object] = []

    def on_receive(self, message: object) -> object:
        if message == "quit":
            self.stop()
            self.seen.append("after stop()")  # the rest of the handler still runs first
            return "bye"
        return super().on_receive(message)

    def on_stop(self) -> None:
        import greenlet as _greenlet

        self.stopped_in.append(_greenlet.getcurrent())


def test_a_lazy_actor_stopping_itself_in_place_ends_without_a_loop() -> None:
    """A lazy actor that never needed its loop and stops itself from a handler run in place
    ends right after that handler, in the caller's greenlet: on_stop, unregistering and the
    exit callbacks, and no loop greenlet made only to stop it. Later messages fail as usual."""
    import greenlet as _greenlet

    for run_in_place in ("ask_now", "tell_now"):
        ref = SelfStopping.start()
        actor = gevent_actor.actor_of(ref)
        assert isinstance(actor, SelfStopping)
        exits: list[GeventActor] = []
        actor.add_exit_callback(exits.append)
        if run_in_place == "ask_now":
            assert actor.ask_now("quit") == "bye"
        else:
            actor.tell_now("quit")
        assert actor.seen == ["after stop()"]
        assert _loop_of(actor) is None
        assert actor.stopped_in == [_greenlet.getcurrent()]
        assert exits == [actor] and not ref.is_alive()
        assert gevent_actor.join(ref, 0)  # ended: nothing left to wait for
        assert ref not in ActorRegistry.get_all()
        assert actor.crash is None
        with pytest.raises(ActorDeadError):
            ref.tell("late")
    # Through the mailbox (the loop runs the handler), a self-stop stops as Pykka's does.
    ref = SelfStopping.start()
    assert ref.ask("quit") == "bye"
    assert gevent_actor.join(ref, 5) and not ref.is_alive()


def test_actor_of_answers_as_isinstance_does_for_every_kind_of_ref() -> None:
    """The cached class check (`is_gevent_actor`) gives `isinstance`'s answers: a GeventActor
    subclass (seen or not), a plain Pykka actor's ref (TypeError) and a dead ref (None)."""

    class Fresh(GeventActor):
        pass

    class PlainPykka(pykka.ThreadingActor):
        pass

    ref = Fresh.start()
    actor = gevent_actor.actor_of(ref)
    assert isinstance(actor, Fresh) and gevent_actor.is_gevent_actor(actor)
    assert gevent_actor.actor_of(actor) is actor  # an actor object is its own answer
    assert gevent_actor.actor_of(ref) is actor  # the class is cached now: same answer
    assert not gevent_actor.is_gevent_actor(ref) and not gevent_actor.is_gevent_actor(object())
    with pytest.raises(TypeError):
        gevent_actor.actor_of(object())  # type: ignore[arg-type]
    plain = PlainPykka.start()
    try:
        with pytest.raises(TypeError):
            gevent_actor.actor_of(plain)
        assert not gevent_actor.is_gevent_actor(object.__new__(PlainPykka))
    finally:
        plain.stop()
    ref.stop()
    assert gevent_actor.join(ref, 5)
    del actor
    gc.collect()
    assert gevent_actor.actor_of(ref) is None


def test_ask_in_place_answers_unwrapped_when_idle_and_a_future_when_busy() -> None:
    """`ask_in_place`: an idle actor's handler answers right here, unwrapped (its exception
    raised here, the actor still alive); a busy one queues the message and gives its future,
    settled in mailbox order."""
    ref = Lazy.start()
    actor = gevent_actor.actor_of(ref)
    assert isinstance(actor, Lazy)
    assert actor.ask_in_place("now") == "now"  # a value, not a future
    with pytest.raises(ValueError, match="boom"):
        actor.ask_in_place("boom")
    assert ref.is_alive() and _loop_of(actor) is None
    ref.tell("park")
    gevent.sleep(0)
    queued = actor.ask_in_place("later")
    assert isinstance(queued, GeventFuture) and not queued.done
    actor.release.set()
    assert queued.get(timeout=5) == "later"
    assert actor.seen == ["now", "boom", "park", "later"]
    ref.stop()
    assert gevent_actor.join(ref, 5)
