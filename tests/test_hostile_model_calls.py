"""A hostile (or broken) model asks for more tool calls in one reply than any task needs.

The first `max_tool_calls_per_reply` calls of a reply run; the rest are dropped unrun, never
logged nor re-sent, and the model is told so in the last result; the turn goes on. Through the
scripted model and through the HTTP adapters against stubs on 127.0.0.1.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import gevent
import pytest
from anthropic_stub import AnthropicStub, tool_use_message
from model_support import hi_request
from openai_stub import SSE_HEAD, Conn, OpenAIStub, StubRequest, sse, stream_text, tool_call_events
from seam_kit import assert_log_valid
from test_model_tools import call, results, text_of

from agent.model import DEFAULT_MAX_TOOL_CALLS_PER_REPLY, ModelRequest
from agent.models import ModelRegistry
from agent.models import scripted as S
from agent.models.anthropic import AnthropicModel
from agent.models.openai import OpenAIModel
from agent.options import AgentOptions
from agent.store import MemoryStore
from agent.tools import Tool, ToolContext
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools


class Counted:
    """A cheap tool that counts its runs."""

    def __init__(self, rt: Runtime) -> None:
        self.runs = 0
        rt.ctx.tools.register(Tool("ping", "Answers pong.", {"type": "object"}, self._fn))

    def _fn(self, _arguments: Mapping[str, Any], _ctx: ToolContext) -> str:
        self.runs += 1
        return "pong"


@pytest.fixture
def rt() -> Iterator[Runtime]:
    runtime = Runtime(store=MemoryStore(), scripted=S.ScriptedModel(record=True))
    try:
        yield runtime
    finally:
        runtime.close()


def _turn(agent: Any, prompt: str = "go") -> Any:
    agent.send(prompt).get()
    return agent.when_idle().get()


def _tool_messages(request: ModelRequest) -> list[Mapping[str, Any]]:
    return [m for m in request.messages if m["role"] == "tool"]


def test_a_reply_of_100000_calls_runs_the_first_1024_and_the_turn_goes_on(rt: Runtime) -> None:
    ping = Counted(rt)
    n = 100_000
    rt.scripted.script("root", [S.tool_calls([("ping", {"i": i}) for i in range(n)]), S.text("ok")])
    root = rt.agent(session_id="root")
    outcome = _turn(root)
    assert outcome.reason == "completed"
    assert outcome.output == [{"type": "text", "text": "ok"}]
    limit = DEFAULT_MAX_TOOL_CALLS_PER_REPLY
    assert ping.runs == limit
    logged = results(root)
    assert len(logged) == limit and all(not r["is_error"] for r in logged)
    # The reply as logged holds the calls that ran; the dropped ones are nowhere.
    (reply,) = [e for e in root.log.events if e["type"] == "assistant/message"][:1]
    calls = reply["data"]["message"]["tool_calls"]
    assert [c["arguments"]["i"] for c in calls] == list(range(limit))
    note = text_of(logged[-1])
    assert note.startswith("pong")
    assert f"asked for {n:,} tool calls" in note and f"other {n - limit:,} were dropped" in note
    assert all(text_of(r) == "pong" for r in logged[:-1])
    # The next request re-sends the results of the calls that ran, no more.
    second = rt.scripted.requests_for("root")[1]
    assert len(_tool_messages(second)) == limit
    assert_log_valid(rt.store, "root")


def test_the_bound_is_the_runtimes_and_a_lone_call_past_it_gets_the_note() -> None:
    with Runtime(store=MemoryStore(), max_tool_calls_per_reply=1) as rt:
        ping = Counted(rt)
        rt.scripted.script("root", [S.tool_calls([("ping", {})] * 3), S.text("ok")])
        root = rt.agent(session_id="root")
        assert _turn(root).reason == "completed"
        assert ping.runs == 1
        (result,) = results(root)
        assert "asked for 3 tool calls" in text_of(result)
        assert "other 2 were dropped" in text_of(result)


def test_subagent_calls_past_the_bound_start_no_child() -> None:
    with Runtime(store=MemoryStore(), max_tool_calls_per_reply=3) as rt:
        rt.subagents.register(SpawnProvider())
        install_subagent_tools(rt, tools=[SubagentToolConfig("spawn", background="one-shot")])
        rt.scripted.script("*", [S.text("done")], repeat=True)
        batch = [("subagent", call(f"c{i}", f"task {i}", run_in_background=True)) for i in range(8)]
        rt.scripted.script("root", [S.tool_calls(batch), S.text("ok")])
        root = rt.agent(session_id="root")
        assert _turn(root).reason == "completed"
        assert len(results(root, "subagent")) == 3
        children = rt.subagents.list_children(root.id)
        assert len(children) == 3


@pytest.mark.parametrize("bad", [0, -1])
def test_a_bound_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="max_tool_calls_per_reply"):
        Runtime(store=MemoryStore(), max_tool_calls_per_reply=bad)


@pytest.mark.parametrize("bad", [True, 2.0, "8", None])
def test_a_bound_that_is_not_an_int_is_refused(bad: Any) -> None:
    with pytest.raises(TypeError, match="max_tool_calls_per_reply"):
        Runtime(store=MemoryStore(), max_tool_calls_per_reply=bad)


# -- the HTTP adapters: calls past the bound are counted, not decoded ---------------------------


# Calls 3 and 4 are not JSON: decoded, they would fail the whole reply (`ModelError`).
_CALLS = [
    ("c1", "ping", ['{"i": 1}']),
    ("c2", "ping", ['{"i": 2}']),
    ("c3", "ping", ["{not json"]),
    ("c4", "ping", ["[1, 2"]),
]


def test_openai_counts_the_calls_past_the_bound_without_decoding_them(
    models: list[Any],
) -> None:
    with OpenAIStub() as stub:
        model = OpenAIModel(base_url=stub.base_url, api_key="k", max_retries=0)
        models.append(model)
        stub.enqueue(sse(tool_call_events(_CALLS)))
        answer = model.complete(hi_request(2))
        assert [(c.id, dict(c.arguments)) for c in answer.tool_calls] == [
            ("c1", {"i": 1}),
            ("c2", {"i": 2}),
        ]
        assert answer.more_calls == 2


def test_anthropic_counts_the_calls_past_the_bound_without_decoding_them(
    models: list[Any],
) -> None:
    with AnthropicStub() as stub:
        model = AnthropicModel(base_url=stub.base_url, api_key="k", max_retries=0)
        models.append(model)
        stub.enqueue(tool_use_message(_CALLS, text="four"))
        answer = model.complete(hi_request(2))
        assert [(c.id, dict(c.arguments)) for c in answer.tool_calls] == [
            ("c1", {"i": 1}),
            ("c2", {"i": 2}),
        ]
        assert answer.more_calls == 2
        assert answer.content == ({"type": "text", "text": "four"},)


def _many_calls(n: int) -> Any:
    """A Chat Completions stream of `n` `ping` calls, made as text (the stub's own JSON
    encoding of each event would hold the hub longer than the runtime does) and sent in
    slices, so the stub shares the hub as a real server's socket would."""
    head = '{"choices":[{"index":0,"delta":{"tool_calls":[{"index":'
    events = [
        f'data: {head}{i},"id":"c{i}",'
        f'"function":{{"name":"ping","arguments":"{{\\"i\\": {i}}}"}}}}]}}}}]}}\n\n'
        for i in range(n)
    ]
    events.append('data: {"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}\n\n')
    events.append("data: [DONE]\n\n")

    def run(_req: StubRequest, conn: Conn) -> None:
        conn.head(200, SSE_HEAD)
        for start in range(0, len(events), 500):
            conn.chunk("".join(events[start : start + 500]).encode())
            gevent.sleep(0)
        conn.end()

    return run


def test_an_openai_reply_of_100000_calls_through_a_runtime(models: list[Any]) -> None:
    """End to end over a socket: the reply is read, 16 calls run, the next request carries
    their 16 results and the note, and the turn ends with the model's next answer."""
    n = 100_000
    with OpenAIStub() as stub:
        model = OpenAIModel(base_url=stub.base_url, api_key="k", max_retries=0)
        models.append(model)
        registry = ModelRegistry()
        registry.register("openai", model)
        stub.enqueue(_many_calls(n), stream_text(["done"]))
        with Runtime(store=MemoryStore(), models=registry, max_tool_calls_per_reply=16) as rt:
            ping = Counted(rt)
            root = rt.agent(session_id="root", options=AgentOptions(model="openai:m"))
            outcome = _turn(root)
            assert outcome.reason == "completed", outcome
            assert ping.runs == 16
            second = stub.requests[1].body["messages"]
            tool_messages = [m for m in second if m["role"] == "tool"]
            assert len(tool_messages) == 16
            assert f"other {n - 16:,} were dropped" in tool_messages[-1]["content"]
            assert_log_valid(rt.store, "root")
