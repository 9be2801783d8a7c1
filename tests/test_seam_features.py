"""Composition controls: fork seeding, tool filter, persona, output schema, admission control."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gevent
import pytest
from seam_kit import Gate, Kit, assert_log_valid, kit, last_user_text

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.prompt import PERSONA_SECTION
from agent.tools import Tool, ToolContext
from subagent.types import ToolRestriction, text_block
from supervision.signal import AbortController

# -- fork ---------------------------------------------------------------------------------------


def test_fork_seeds_the_completed_turn_prefix_and_continues_turn_numbers() -> None:
    with kit() as k:
        parent = k.parent()
        k.respond = lambda r: S.text("parent answer")
        parent.send("first question").get()
        parent.when_idle().get(timeout=5)
        prefix_length = len(parent.log.events)
        k.respond = lambda r: S.text(f"child sees {len(r.messages)} messages")
        run = k.start(parent, "child task", provider="fork")
        result = run.result.get(timeout=5)
        # parent's user + assistant, then the child's prompt
        assert result.output == [text_block("child sees 3 messages")]
        run.dispose()
        events = assert_log_valid(k.store, run.id)
        header = k.store.load(run.id).header
        assert header.seed_length == prefix_length
        assert events[:prefix_length] == list(parent.log.events[:prefix_length])
        assert events[prefix_length]["type"] == "session/end-seed"
        turns = [e["data"]["turn"] for e in events if e["type"] == "turn/start"]
        assert turns == [1, 2]


def test_fork_excludes_the_in_flight_turn_and_never_returns_parent_text() -> None:
    with kit() as k:
        parent = k.parent()
        k.respond = lambda r: S.text("old answer")
        parent.send("turn one").get()
        parent.when_idle().get(timeout=5)
        forked: list[Any] = []

        def fork_tool(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            run = k.start(ctx.agent, "forked work", provider="fork")
            forked.append(run)
            return "forked"

        k.runtime.ctx.tools.register(
            Tool(name="fork_now", description="", parameters={"type": "object"}, fn=fork_tool)
        )

        def respond(request: ModelRequest) -> S.Step:
            if request.session_id == parent.id:
                if request.step == 1:
                    return S.tool_call("fork_now", {}, text="parent in-flight text")
                return S.text("parent done")
            return S.text("")  # the child says nothing at all

        k.respond = respond
        parent.send("turn two").get()
        parent.when_idle().get(timeout=5)
        (run,) = forked
        result = run.result.get(timeout=5)
        assert result.output == []  # never the parent's text
        run.dispose()
        events = assert_log_valid(k.store, run.id)
        texts = [e["data"]["message"]["content"] for e in events if e["type"] == "user/message"]
        assert [text_block("turn two")] not in texts  # the in-flight turn is excluded
        assert [text_block("turn one")] in texts


def test_fork_and_spawn_describe_context_inheritance() -> None:
    with kit() as k:
        assert k.service.get("fork").inherits_parent_context is True
        assert k.service.get("spawn").inherits_parent_context is False


# -- tool filter ---------------------------------------------------------------------------------


def register_tools(k: Kit, *names: str) -> list[str]:
    calls: list[str] = []
    for name in names:
        k.runtime.ctx.tools.register(
            Tool(
                name=name,
                description=name,
                parameters={"type": "object"},
                fn=lambda a, c, n=name: calls.append(n) or "ran",
            )
        )
    return calls


def test_tool_filter_hides_and_refuses_a_forged_call() -> None:
    with kit() as k:
        calls = register_tools(k, "read", "write")
        seen_tools: list[list[str]] = []

        def respond(request: ModelRequest) -> S.Step:
            seen_tools.append([t.name for t in request.tools])
            if request.step == 1:
                return S.tool_calls([("write", {}), ("read", {})])  # forged: write is hidden
            return S.text("done")

        k.respond = respond
        parent = k.parent()
        run = k.start(parent, tool_filter=ToolRestriction(deny=("write",)))
        assert run.result.get(timeout=5).stop_reason == "completed"
        run.dispose()
        assert seen_tools[0] == ["read"]
        assert calls == ["read"]
        events = assert_log_valid(k.store, run.id)
        results = {e["data"]["name"]: e["data"] for e in events if e["type"] == "tool/result"}
        assert results["write"]["is_error"] and results["write"]["code"] == "UNKNOWN_TOOL"
        # the parent still sees both
        assert [s.name for s in parent.tools.specs()] == ["read", "write"]


def test_tool_filter_allow_list() -> None:
    with kit() as k:
        register_tools(k, "a", "b", "c")
        seen: list[list[str]] = []
        k.respond = lambda r: seen.append([t.name for t in r.tools]) or S.text("ok")
        run = k.start(k.parent(), tool_filter=ToolRestriction(allow=("b",)))
        run.result.get(timeout=5)
        run.dispose()
        assert seen == [["b"]]


# -- persona ------------------------------------------------------------------------------------


def test_persona_shadows_the_deployment_persona_for_that_child_alone() -> None:
    with kit() as k:
        k.runtime.ctx.prompt.set_section(PERSONA_SECTION, "You are the deployment.", order=0)
        k.runtime.ctx.variables["team"] = "blue"
        systems: dict[str, str] = {}

        def respond(request: ModelRequest) -> S.Step:
            systems[last_user_text(request)] = request.system
            return S.text("ok")

        k.respond = respond
        parent = k.parent()
        with_persona = k.start(parent, "p", persona="You are a {{team}} reviewer.")
        without = k.start(parent, "n")
        for run in (with_persona, without):
            run.result.get(timeout=5)
            run.dispose()
        assert systems["p"].startswith("You are a blue reviewer.")
        assert "deployment" not in systems["p"]
        assert systems["n"].startswith("You are the deployment.")
        assert parent.prompt.render(k.runtime.ctx.variables).startswith("You are the deployment.")


# -- output schema ---------------------------------------------------------------------------

SCHEMA = {
    "type": "object",
    "properties": {"verdict": {"type": "string", "enum": ["yes", "no"]}},
    "required": ["verdict"],
    "additionalProperties": False,
}


def test_structured_output_retry_then_capture_concludes_the_turn() -> None:
    with kit() as k:
        register_tools(k, "other")
        replies = iter(
            [
                S.tool_call("structured_output", {"verdict": "maybe"}),  # invalid: retry
                S.tool_calls(
                    [("structured_output", {"verdict": "yes"}), ("other", {})]
                ),  # valid, then a refused call
            ]
        )
        k.respond = lambda r: next(replies)
        run = k.start(k.parent(), output_schema=SCHEMA)
        result = run.result.get(timeout=5)
        assert result.stop_reason == "completed"
        assert result.structured == {"verdict": "yes"}
        run.dispose()
        events = assert_log_valid(k.store, run.id)
        results = [e["data"] for e in events if e["type"] == "tool/result"]
        assert results[0]["code"] == "INVALID_ARGS"
        assert results[1]["is_error"] is False
        assert results[2]["is_error"] and results[2]["name"] == "other"
        assert sum(1 for e in events if e["type"] == "assistant/message") == 2  # two steps


def test_no_capture_at_a_clean_end_is_an_error_without_reprompt() -> None:
    with kit() as k:
        k.respond = lambda r: S.text("I forgot the tool")
        run = k.start(k.parent(), output_schema=SCHEMA)
        result = run.result.get(timeout=5)
        assert result.stop_reason == "error"
        assert result.structured is None
        assert "structured_output" in (result.diagnostic or "")
        assert len(k.model.requests_for(run.id)) == 1
        run.dispose()


def test_no_capture_when_cancelled_is_aborted() -> None:
    with kit() as k:
        k.respond = lambda r: S.hang()
        run = k.start(k.parent(), output_schema=SCHEMA)
        run.cancel("stop")
        assert run.result.get(timeout=5).stop_reason == "aborted"
        run.dispose()


def test_concurrent_children_see_their_own_schema() -> None:
    with kit() as k:
        schemas: dict[str, Any] = {}

        def respond(request: ModelRequest) -> S.Step:
            (tool,) = [t for t in request.tools if t.name == "structured_output"]
            schemas[last_user_text(request)] = tool.parameters
            key = next(iter(tool.parameters["properties"]))
            return S.tool_call("structured_output", {key: 1})

        k.respond = respond
        parent = k.parent()
        runs = []
        for key in ("alpha", "beta", "gamma"):
            schema = {"type": "object", "properties": {key: {"type": "integer"}}}
            runs.append((key, k.start(parent, key, output_schema=schema)))
        for key, run in runs:
            assert run.result.get(timeout=5).structured == {key: 1}
            run.dispose()
        assert {name: next(iter(s["properties"])) for name, s in schemas.items()} == {
            "alpha": "alpha",
            "beta": "beta",
            "gamma": "gamma",
        }


# -- admission control ----------------------------------------------------------------------------


def test_per_parent_cap_queues_fifo_and_never_exceeds_the_cap() -> None:
    with kit(max_children_per_parent=2) as k:
        gates: dict[str, Gate] = {str(i): Gate() for i in range(5)}
        running: list[str] = []
        peak = [0]

        def respond(request: ModelRequest) -> S.Step:
            name = last_user_text(request)
            running.append(name)
            peak[0] = max(peak[0], len(running))
            gates[name].wait(request.signal)
            running.remove(name)
            return S.text(name)

        k.respond = respond
        parent = k.parent()
        starters = [gevent.spawn(k.start, parent, str(i)) for i in range(5)]
        gates["0"].reached.wait()
        gates["1"].reached.wait()
        order: list[str] = []
        for i in range(5):
            gates[str(i)].open()
            if i + 2 < 5:
                gates[str(i + 2)].reached.wait()
                order.append(str(i + 2))
        runs = [g.get() for g in starters]
        for run in runs:
            run.result.get(timeout=5)
            run.dispose()
        assert peak[0] == 2
        assert order == ["2", "3", "4"]  # FIFO
        assert k.service.running_peak == 2


def test_a_waiting_start_is_cancelled_by_its_signal() -> None:
    with kit(max_children=1) as k:
        k.respond = lambda r: S.hang()
        parent = k.parent()
        first = k.start(parent)
        controller = AbortController()
        waiter = gevent.spawn(k.start, parent, signal=controller.signal)
        gevent.sleep(0)  # let the waiter reach the registry queue
        controller.abort("gave up waiting")
        with pytest.raises(Exception) as info:
            waiter.get()
        assert getattr(info.value, "code", None) == "ABORTED"
        first.dispose()
        assert [h.id for h in k.store.list()] == [parent.id, first.id]
