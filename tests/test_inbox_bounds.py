"""An agent's inbox is bounded: pending steers and queued sends past the bound are refused.

A sender that never waits (a parent model in a loop, a client steering a session, code calling
`steer()` in a loop) would otherwise grow one child until the process dies. Past the bound the
steer's future fails, or the send raises, with `SubagentError("INBOX_FULL")` at once; nothing of
it is logged or queued; the messages accepted before keep their order; the child runs on.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import gevent
import pykka
import pytest
from gevent.event import Event
from test_agent_loop import is_done, of_type, wait_for

from agent.inbox import DEFAULT_MAX_PENDING_STEERS, DEFAULT_MAX_QUEUED_SENDS, InboxLimits
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore
from agent.tools import Tool, ToolContext
from providers.inprocess import SpawnProvider
from subagent import limits
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.scripted import ScriptedModel
from subagent.tools import SubagentToolConfig, install_subagent_tools
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortSignal


class Gates:
    """A `wait` tool: each call reports it was reached, then waits for its own opening."""

    def __init__(self) -> None:
        self.reached: list[Event] = [Event() for _ in range(8)]
        self.opened: list[Event] = [Event() for _ in range(8)]
        self.calls = 0

    def tool(self) -> Tool:
        def wait(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            index = self.calls
            self.calls += 1
            self.reached[index].set()
            self.opened[index].wait()
            return "opened"

        return Tool("wait", "Wait for the test.", {"type": "object"}, wait)


def _waits_then_answers(times: int) -> Any:
    """A model that calls `wait` `times` times, one per step, then says what it was told."""

    def model(request: ModelRequest) -> S.Step:
        done = sum(1 for m in request.messages if m["role"] == "tool")
        if done < times:
            return S.tool_call("wait", {})
        return S.text("done")

    return model


@contextmanager
def _runtime(model: Any, **limits_: int) -> Iterator[tuple[Runtime, Gates]]:
    gates = Gates()
    with Runtime(store=MemoryStore(), scripted=ScriptedModel(model), **limits_) as rt:
        rt.ctx.tools.register(gates.tool())
        yield rt, gates


def _refusal(future: pykka.Future[Any]) -> str:
    """The code of a future that failed already (a refusal is at once) with a SubagentError."""
    assert is_done(future), "a refusal must be at once"
    with pytest.raises(SubagentError) as caught:
        future.get(timeout=0)
    return caught.value.code


def _events(agent: Any) -> list[Any]:
    """A live agent's log as it stands (a store refuses to load a session mid-turn)."""
    return list(agent.log.events)


def _user_texts(agent: Any) -> list[str]:
    events = of_type(_events(agent), "user/message")
    return [e["data"]["message"]["content"][0]["text"] for e in events]


def test_defaults_are_in_the_thousands_and_named_with_the_other_limits() -> None:
    assert limits.DEFAULT_MAX_PENDING_STEERS == DEFAULT_MAX_PENDING_STEERS == 1_000
    assert limits.DEFAULT_MAX_QUEUED_SENDS == DEFAULT_MAX_QUEUED_SENDS == 1_000
    with Runtime(store=MemoryStore()) as rt:
        assert rt.ctx.inbox == InboxLimits(steers=1_000, sends=1_000)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"max_pending_steers": 0}, ValueError),
        ({"max_queued_sends": -1}, ValueError),
        ({"max_pending_steers": "5"}, TypeError),
        ({"max_queued_sends": True}, TypeError),
        ({"max_pending_steers": 2.0}, TypeError),
    ],
)
def test_a_bad_bound_is_refused_when_the_runtime_is_made(
    kwargs: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        Runtime(store=MemoryStore(), **kwargs)


def test_steers_past_the_bound_are_refused_and_the_accepted_ones_are_admitted_in_order() -> None:
    with _runtime(_waits_then_answers(1), max_pending_steers=3) as (rt, gates):
        rt.subagents.register(SpawnProvider())
        parent = rt.agent()
        run = rt.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=[text_block("go")], parent=parent, signal=AbortSignal.never()
            ),
        )
        assert gates.reached[0].wait(timeout=10)
        accepted = [run.steer(f"steer {i}") for i in range(3)]
        refused = run.steer("one too many")
        assert _refusal(refused) == "INBOX_FULL"
        # Nothing of the refused one was logged; the three are accepted, none admitted yet.
        events = _events(run.local_agent)
        steers = [e for e in of_type(events, "inbox/accepted") if e["data"]["kind"] == "steer"]
        assert [e["data"]["content"][0]["text"] for e in steers] == [
            "steer 0",
            "steer 1",
            "steer 2",
        ]
        assert not any(is_done(f) for f in accepted)
        gates.opened[0].set()
        ids = [f.get(timeout=10) for f in accepted]  # admitted, in order
        result = run.result.get(timeout=10)
        assert result.stop_reason == "completed"  # the child is unharmed
        assert _user_texts(run.local_agent) == ["go", "steer 0", "steer 1", "steer 2"]
        claimed = [
            e["data"]["message_id"] for e in of_type(_events(run.local_agent), "inbox/claimed")
        ]
        assert claimed[1:] == ids
        run.dispose()


def test_the_steer_bound_is_per_agent() -> None:
    with _runtime(_waits_then_answers(1), max_pending_steers=2) as (rt, gates):
        first, second = rt.agent(), rt.agent()
        first.send("go").get()
        assert gates.reached[0].wait(timeout=10)
        second.send("go").get()
        assert gates.reached[1].wait(timeout=10)
        full = [first.steer(f"a{i}") for i in range(2)]
        assert _refusal(first.steer("a2")) == "INBOX_FULL"
        # The other agent, as busy, still takes steers up to its own bound.
        other = [second.steer(f"b{i}") for i in range(2)]
        assert not any(is_done(f) for f in other)
        gates.opened[0].set()
        gates.opened[1].set()
        for future in full + other:
            future.get(timeout=10)
        first.when_idle().get(timeout=10)
        second.when_idle().get(timeout=10)
        assert _user_texts(first) == ["go", "a0", "a1"]
        assert _user_texts(second) == ["go", "b0", "b1"]


def test_room_comes_back_once_a_step_boundary_admits_the_pending_steers() -> None:
    with _runtime(_waits_then_answers(2), max_pending_steers=2) as (rt, gates):
        agent = rt.agent()
        agent.send("go").get()
        assert gates.reached[0].wait(timeout=10)
        first = [agent.steer("x0"), agent.steer("x1")]
        assert _refusal(agent.steer("x2")) == "INBOX_FULL"
        gates.opened[0].set()
        for future in first:
            future.get(timeout=10)
        assert gates.reached[1].wait(timeout=10)  # the next step's tool call
        again = [agent.steer("y0"), agent.steer("y1")]
        assert not any(is_done(f) for f in again)
        assert _refusal(agent.steer("y2")) == "INBOX_FULL"
        gates.opened[1].set()
        for future in again:
            future.get(timeout=10)
        assert agent.when_idle().get(timeout=10).reason == "completed"
        assert _user_texts(agent) == ["go", "x0", "x1", "y0", "y1"]


def test_sends_past_the_bound_are_refused_and_the_queued_ones_run_in_order() -> None:
    def model(request: ModelRequest) -> S.Step:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"][0]["text"] == "block":
            return S.tool_call("wait", {})
        if last["role"] == "tool":
            return S.text("unblocked")
        return S.text("ok")

    with _runtime(model, max_queued_sends=2) as (rt, gates):
        agent = rt.agent()
        agent.send("block").get()
        assert gates.reached[0].wait(timeout=10)
        queued = [agent.send("q0").get(), agent.send("q1").get()]
        with pytest.raises(SubagentError) as refused:
            agent.send("q2").get()
        assert refused.value.code == "INBOX_FULL"
        # The runtime's own notices to a parent are not refused: losing one loses the news.
        notice = agent.send("settled", MessageSource.subagent_settled("a child settled")).get()
        accepted = [e["data"]["message_id"] for e in of_type(_events(agent), "inbox/accepted")]
        assert accepted[1:] == [*queued, notice]  # nothing of q2
        gates.opened[0].set()
        agent.when_idle().get(timeout=10)
        assert _user_texts(agent) == ["block", "q0", "q1", "settled"]
        # The queue drained: room again.
        agent.send("later").get()
        agent.when_idle().get(timeout=10)
        assert _user_texts(agent)[-1] == "later"


def test_send_message_to_a_flooded_child_is_a_tool_error_result_for_the_parent(
    tmp_path: Any,
) -> None:
    """Continuable child busy in a tool, steer bound 1: one `send_message` waits for admission
    (it holds the one place); the parent model's own `send_message` meanwhile is refused at once
    with `INBOX_FULL`, as an error result the model reads, and the parent's turn goes on."""
    gates = Gates()
    seen: list[Mapping[str, Any]] = []

    def model(request: ModelRequest) -> S.Step:
        tools = [m for m in request.messages if m["role"] == "tool"]
        last = request.messages[-1]
        if request.session_id == parent_id[0]:
            if last["role"] == "tool":
                seen.append(last)
                return S.text("parent done")
            text = last["content"][0]["text"]
            if text == "delegate":
                arguments = {"description": "worker", "prompt": "work", "run_in_background": True}
                return S.tool_call("subagent", arguments)
            if text == "message":
                return S.tool_call("send_message", {"subagent_id": child_id[0], "message": "2nd"})
            return S.text("noted")
        if not tools:
            return S.tool_call("wait", {})
        return S.text("child done")

    parent_id: list[str] = []
    child_id: list[str] = []
    store = SessionStore(tmp_path, durability="none")
    with Runtime(store=store, scripted=ScriptedModel(model), max_pending_steers=1) as rt:
        rt.ctx.tools.register(gates.tool())
        rt.subagents.register(SpawnProvider())
        install_subagent_tools(rt, tools=[SubagentToolConfig("spawn", background="continuable")])
        parent = rt.agent()
        parent_id.append(parent.id)
        parent.send("delegate").get()
        assert gates.reached[0].wait(timeout=10)
        parent.when_idle().get(timeout=10)
        (row,) = rt.subagents.list_children(parent.id)
        child_id.append(row["id"])
        child = rt.ctx.agents[row["id"]]
        source = MessageSource.coordinator(parent.id)
        first = gevent.spawn(rt.subagents.send_message, parent, row["id"], "1st", source)
        try:
            wait_for(
                lambda: any(
                    e["type"] == "inbox/accepted" and e["data"]["kind"] == "steer"
                    for e in _events(child)
                ),
                "the first message queued as a steer",
            )
            parent.send("message").get()
            assert parent.when_idle().get(timeout=10).reason == "completed"
            refused = seen[-1]
            assert refused["name"] == "send_message" and refused["is_error"]
            text = refused["content"][0]["text"]
            assert "INBOX_FULL" in text and row["id"] in text
            assert not first.ready()  # the first still waits for its admission
            gates.opened[0].set()
            assert first.get(timeout=10).kind == "steered"
        finally:
            first.kill()
        steers = [
            e for e in of_type(_events(child), "inbox/accepted") if e["data"]["kind"] == "steer"
        ]
        assert [e["data"]["content"][0]["text"] for e in steers] == ["1st"]


def test_send_message_to_a_child_whose_steers_are_full_is_refused_not_retried(
    tmp_path: Any,
) -> None:
    """The child's own inbox full (steered directly): `send_message` fails `INBOX_FULL` at once
    instead of waiting, and nothing of it is logged in the child."""
    gates = Gates()

    def model(request: ModelRequest) -> S.Step:
        if not any(m["role"] == "tool" for m in request.messages):
            return S.tool_call("wait", {})
        return S.text("done")

    store = SessionStore(tmp_path, durability="none")
    with Runtime(store=store, scripted=ScriptedModel(model), max_pending_steers=1) as rt:
        rt.ctx.tools.register(gates.tool())
        rt.subagents.register(SpawnProvider())
        parent = rt.agent()
        request = SubagentStartRequest(
            prompt=[text_block("go")], parent=parent, signal=AbortSignal.never()
        )
        started = rt.subagents.start_continuable("spawn", request, label="worker")
        assert gates.reached[0].wait(timeout=10)
        child = rt.ctx.agents[started.child_id]
        direct = child.steer("direct")
        with pytest.raises(SubagentError) as refused:
            rt.subagents.send_message(
                parent, started.child_id, "via send_message", MessageSource.coordinator(parent.id)
            )
        assert refused.value.code == "INBOX_FULL"
        gates.opened[0].set()
        direct.get(timeout=10)
        assert _user_texts(child) == ["go", "direct"]
