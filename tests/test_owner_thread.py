"""A runtime belongs to the thread that made it: its entry points refuse another thread's call
with `WRONG_THREAD` before anything is made, and the runtime still closes (docs/seam.md)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import gevent
import gevent.event
import pytest
from gevent._hub_local import get_hub_if_exists

from subagent import (
    AbortController,
    MemoryStore,
    Runtime,
    SpawnProvider,
    SubagentError,
    SubagentStartRequest,
    Tool,
    text_block,
)
from subagent import scripted as RS


def _in_another_thread(call: Callable[[], Any]) -> BaseException | None:
    """What `call` raised in a new thread (None if it returned), waited for cooperatively."""
    caught: list[BaseException | None] = []

    def body() -> None:
        try:
            call()
        except BaseException as exc:
            caught.append(exc)
        else:
            caught.append(None)
        finally:
            hub = get_hub_if_exists()
            if hub is not None:  # the thread's own hub (and its thread pool) goes with it
                hub.destroy(destroy_loop=True)

    thread = threading.Thread(target=body)
    thread.start()
    while thread.is_alive():
        gevent.sleep(0.01)  # the hub stays free: the other thread may need nothing of it
    return caught[0]


def _refused_in_another_thread(calls: dict[str, Callable[[], Any]]) -> None:
    """Each call, made from another thread, fails `WRONG_THREAD` naming the owning thread."""
    for name, call in calls.items():
        raised = _in_another_thread(call)
        assert isinstance(raised, SubagentError), name
        assert raised.code == "WRONG_THREAD", name
        assert "MainThread" in str(raised), name


def test_every_entry_point_refuses_another_thread_and_nothing_is_made() -> None:
    with Runtime(store=MemoryStore()) as rt:
        rt.subagents.register(SpawnProvider())
        parent = rt.agent()
        request = SubagentStartRequest(
            prompt=[text_block("hi")], parent=parent, signal=AbortController().signal
        )
        service = rt.subagents
        calls: dict[str, Callable[[], Any]] = {
            "agent": rt.agent,
            "resume_agent": lambda: rt.resume_agent(parent.session_id),
            "start": lambda: service.start("spawn", request),
            "start_continuable": lambda: service.start_continuable("spawn", request, label="x"),
            "send_message": lambda: service.send_message(parent, "s0", "hi", None),  # type: ignore[arg-type]
            "interrupt": lambda: service.interrupt("s0", by=parent),
            "runs": service.runs,
            "list_children": lambda: service.list_children(parent.session_id),
            "list_descendants": lambda: service.list_descendants(parent.session_id),
            "close": rt.close,
        }
        agents_before = set(rt.ctx.agents)
        _refused_in_another_thread(calls)
        assert set(rt.ctx.agents) == agents_before  # nothing was made
        assert service.runs() == []
        # The owning thread still works, and the runtime closes (it used to wait for ever).
        run = service.start("spawn", request)
        assert run.result.get(timeout=10).stop_reason == "completed"
        run.dispose()
    assert rt.subagents.closed


def test_a_runtime_made_in_a_thread_belongs_to_that_thread() -> None:
    made: list[Runtime] = []
    results: list[str] = []

    def body() -> None:
        with Runtime(store=MemoryStore()) as rt:
            made.append(rt)
            rt.subagents.register(SpawnProvider())
            parent = rt.agent()
            run = rt.subagents.start(
                "spawn",
                SubagentStartRequest(
                    prompt=[text_block("from a thread")],
                    parent=parent,
                    signal=AbortController().signal,
                ),
            )
            results.append(run.result.get(timeout=10).stop_reason)
            run.dispose()

    assert _in_another_thread(body) is None
    assert results == ["completed"]
    with pytest.raises(SubagentError) as refused:
        made[0].agent()  # closed, and not this thread's: the thread is said first
    assert refused.value.code == "WRONG_THREAD"


def test_a_runs_handle_refuses_another_thread_and_the_run_goes_on() -> None:
    """`steer`, `cancel` and `dispose` reach the child's actor, which runs on the runtime's hub:
    from another thread they fail `WRONG_THREAD`, and the run is untouched."""
    admitted = gevent.event.Event()

    def model(request: Any) -> Any:
        said = [m for m in request.messages if m["role"] == "user"]
        if len(said) == 1:
            return RS.tool_call("wait", {})
        return RS.text(f"steered: {said[-1]['content'][0]['text']}")

    def wait(arguments: Any, ctx: Any) -> str:
        admitted.wait(10)
        return "waited"

    with Runtime(store=MemoryStore(), scripted=RS.ScriptedModel(model)) as rt:
        rt.ctx.tools.register(Tool("wait", "Waits.", {"type": "object"}, wait))
        rt.subagents.register(SpawnProvider())
        run = rt.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=[text_block("go")], parent=rt.agent(), signal=AbortController().signal
            ),
        )
        _refused_in_another_thread(
            {
                "steer": lambda: run.steer("from elsewhere"),
                "cancel": run.cancel,
                "dispose": run.dispose,
            }
        )
        steered = run.steer("here")
        admitted.set()
        steered.get(timeout=10)
        result = run.result.get(timeout=10)
        assert (result.stop_reason, result.output[0]["text"]) == ("completed", "steered: here")
        run.dispose()


def test_an_agents_handle_refuses_another_thread_and_the_agent_goes_on() -> None:
    """`send`, `steer`, `cancel`, `when_idle` and `close` reach the agent's actor on the
    runtime's hub: from another thread they fail `WRONG_THREAD`, and the agent is untouched."""
    with Runtime(store=MemoryStore()) as rt:
        agent = rt.agent()
        _refused_in_another_thread(
            {
                "send": lambda: agent.send("from elsewhere"),
                "steer": lambda: agent.steer("from elsewhere"),
                "cancel": agent.cancel,
                "when_idle": agent.when_idle,
                "close": agent.close,
            }
        )
        assert agent.status == "idle" and agent.log.turn == 0  # nothing was queued or run
        agent.send("here").get(timeout=10)
        outcome = agent.when_idle().get(timeout=10)
        assert outcome is not None and outcome.reason == "completed"


def test_a_future_waited_on_from_another_thread_is_refused_and_read_once_settled() -> None:
    """A future is settled on the runtime's hub: another thread's wait would hang (or make
    gevent refuse the hub's own waiters later), so it fails `WRONG_THREAD` at once; once
    settled, the value may be read from anywhere (docs/decisions.md)."""
    with Runtime(store=MemoryStore(), scripted=RS.ScriptedModel(lambda r: RS.hang())) as rt:
        rt.subagents.register(SpawnProvider())
        run = rt.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=[text_block("go")], parent=rt.agent(), signal=AbortController().signal
            ),
        )
        waiting = gevent.spawn(run.result.get, timeout=10)  # the hub's own waiter
        gevent.sleep(0)
        raised = _in_another_thread(lambda: run.result.get(timeout=5))
        assert isinstance(raised, SubagentError) and raised.code == "WRONG_THREAD"
        assert "waited on from thread" in str(raised)
        run.cancel("enough")
        assert waiting.get(timeout=10).stop_reason == "aborted"  # it still wakes
        read: list[Any] = []
        assert _in_another_thread(lambda: read.append(run.result.get())) is None
        assert read[0].stop_reason == "aborted"
        run.dispose()
