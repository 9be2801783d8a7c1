"""Handlers run in the caller's greenlet (`ask_now`/`tell_now`: Cancel, CancelRun, Steer, a
local run's dispose) finish their work even when a listener they call switches out and the
caller is killed meanwhile: the turn is still aborted, the other listeners still hear, the
child still closes. A listener that waits is legal; a killed caller must not leave the actor
half-done (as Close's end, a `finally`, already guarantees)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gevent
from gevent.event import Event

from subagent import (
    AbortController,
    MemoryStore,
    Runtime,
    SpawnProvider,
    SubagentStartRequest,
    Tool,
    text_block,
)
from subagent import scripted as S
from subagent.service import RunHandle, SteerableRunHandle
from supervision.signal import AbortSignal


def _model(request: Any) -> Any:
    """Calls `hold` once, then answers."""
    if any(m["role"] == "tool" for m in request.messages):
        return S.text("done")
    return S.tool_call("hold", {})


def _hold(arguments: Any, ctx: Any) -> str:
    ctx.signal.wait()  # until the turn is cancelled
    ctx.signal.raise_if_aborted()
    return "held"


@contextmanager
def _child() -> Iterator[tuple[Runtime, RunHandle, Event]]:
    """A runtime and one child waiting in `hold` (the third item is set once it is there)."""
    holding = Event()

    def hold(arguments: Any, ctx: Any) -> str:
        holding.set()
        return _hold(arguments, ctx)

    with Runtime(store=MemoryStore(), scripted=S.ScriptedModel(_model)) as rt:
        rt.ctx.tools.register(Tool("hold", "Hold until cancelled.", {"type": "object"}, hold))
        rt.subagents.register(SpawnProvider())
        parent = rt.agent()
        run = rt.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=[text_block("go")], parent=parent, signal=AbortController().signal
            ),
        )
        assert isinstance(run, RunHandle)
        assert holding.wait(10), "the child never reached its tool"
        yield rt, run, holding
        run.dispose()


def _kill_while_listening(call: Any, entered: Event) -> None:
    """Run `call` in a greenlet, and kill it once a listener it reached has switched out."""
    caller = gevent.spawn(call)
    assert entered.wait(10), "the switching listener was never reached"
    caller.kill()
    assert caller.dead


def test_a_cancel_whose_caller_is_killed_in_a_switching_listener_still_aborts_the_turn() -> None:
    """`run.cancel()` runs CancelRun in place; a cancel listener that waits, and a caller killed
    there, used to skip the turn's abort: the child held its tool for ever."""
    with _child() as (rt, run, _):
        entered, release = Event(), Event()
        calls: list[str] = []

        def waits(agent: Any, cause: object) -> None:
            calls.append("waits")
            if len(calls) == 1:
                entered.set()
                release.wait()

        remove = rt.ctx.lifecycle.on_cancelled(waits)
        later: list[object] = []
        remove_later = rt.ctx.lifecycle.on_cancelled(lambda agent, cause: later.append(cause))
        _kill_while_listening(lambda: run.cancel("stop"), entered)
        release.set()
        result = run.result.get(timeout=10)
        assert result.stop_reason == "aborted"
        assert later, "a listener after the switching one never heard of the cancel"
        remove()
        remove_later()


def test_an_agent_cancel_whose_caller_is_killed_in_a_listener_still_reaches_the_actor() -> None:
    """`Agent.cancel` tells the lifecycle in the caller, then asks Cancel: a kill in between
    used to drop the Cancel."""
    with _child() as (rt, run, _):
        entered, release = Event(), Event()

        def waits(agent: Any, cause: object) -> None:
            entered.set()
            release.wait()

        remove = rt.ctx.lifecycle.on_cancelled(waits)
        child = run.local_agent
        assert child is not None
        _kill_while_listening(lambda: child.cancel("stop"), entered)
        remove()
        release.set()
        assert run.result.get(timeout=10).stop_reason == "aborted"


def test_a_dispose_whose_caller_is_killed_in_a_closing_listener_still_closes_the_child() -> None:
    """A local run is disposed in the caller's greenlet; the closing listeners (the service's
    disposes the child's own children there) may switch. A caller killed there used to leave
    the child open and its turn running."""
    with _child() as (rt, run, _):
        entered, release = Event(), Event()

        def waits(agent: Any) -> None:
            if agent is run.local_agent:
                entered.set()
                release.wait()

        remove = rt.ctx.lifecycle.on_closing(waits)
        _kill_while_listening(run.dispose, entered)
        remove()
        release.set()
        assert run.result.get(timeout=10).stop_reason == "aborted"
        with gevent.Timeout(10, AssertionError("the child's actor never stopped")):
            run.dispose()
        assert not run.ref.is_alive()


def test_a_steer_whose_caller_is_killed_in_a_listener_is_still_queued_and_told() -> None:
    """The steer is queued before its listeners are told, and every listener hears of it even
    if the first one switches out and the caller is killed there."""
    with _child() as (_rt, run, _):
        assert isinstance(run, SteerableRunHandle)
        child = run.local_agent
        assert child is not None
        entered, release = Event(), Event()
        heard: list[str] = []

        def waits(message_id: str) -> None:
            entered.set()
            release.wait()

        child.add_steer_listener(waits)
        child.add_steer_listener(heard.append)
        _kill_while_listening(lambda: run.steer("and also this"), entered)
        release.set()
        assert len(heard) == 1, "the second steer listener never heard of the steer"
        run.cancel("done")
        assert run.result.get(timeout=10).stop_reason == "aborted"


def test_an_abort_listener_that_switches_does_not_cost_the_others_their_notice() -> None:
    """`AbortSignal`'s listeners run in the aborter's greenlet: a kill there (one listener
    waiting) still tells the others."""
    controller = AbortController()
    signal: AbortSignal = controller.signal
    entered, release = Event(), Event()
    heard: list[object] = []

    def waits(reason: object) -> None:
        entered.set()
        release.wait()

    signal.add_listener(waits)
    signal.add_listener(heard.append)
    _kill_while_listening(lambda: controller.abort("why"), entered)
    release.set()
    assert heard == ["why"]
    assert signal.aborted


def test_a_done_callback_that_switches_does_not_leave_waiters_asleep() -> None:
    """A settled future wakes its waiters and calls its other callbacks even if the settler is
    killed while one callback switched out."""
    from actors.deferred import Deferred

    future: Deferred[int] = Deferred()
    entered, release = Event(), Event()
    seen: list[int] = []

    def waits(done: Any) -> None:
        entered.set()
        release.wait()

    future.add_done_callback(waits)
    future.add_done_callback(lambda done: seen.append(done.get()))
    waiter = gevent.spawn(future.get)
    gevent.sleep(0)  # the waiter parks on the future
    _kill_while_listening(lambda: future.resolve(7), entered)
    release.set()
    assert waiter.get(timeout=10) == 7
    assert seen == [7]
