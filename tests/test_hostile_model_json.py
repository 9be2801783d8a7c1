"""Pathological JSON from a model, in a tool call's arguments (the structured-output capture
included): nesting 100,000 deep, a 5,000-digit integer, NaN and Infinity, duplicate keys, a
16 MiB string, a value that contains itself. Through the HTTP adapters against stubs on
127.0.0.1 and through the scripted model.

Each is the model's mistake: an `INVALID_ARGS` result it can read and retry (duplicate keys: the
last one wins, as in every JSON decoder we know), the turn goes on, the hub is never held past
0.1 s (the suite's monitor), and the log resumes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
from anthropic_stub import AnthropicStub, tool_use_message
from model_support import hi_request
from openai_stub import OpenAIStub, sse, stream_text, text_events, tool_call_events
from seam_kit import assert_log_valid, kit
from test_model_tools import results, text_of

from agent.model import MAX_ARGUMENT_CHARS, ToolCall
from agent.models import ModelRegistry
from agent.models import scripted as S
from agent.models.anthropic import AnthropicModel
from agent.models.http import HTTPModel
from agent.models.openai import OpenAIModel
from agent.options import AgentOptions
from agent.store import MemoryStore, SessionStore
from agent.tools import Tool, ToolContext
from subagent.runtime import Runtime

DEEP = '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"
DIGITS = '{"n": ' + "9" * 5_000 + "}"
NAN = '{"x": NaN, "y": -Infinity}'
LONG = '{"s": "' + "x" * MAX_ARGUMENT_CHARS + '"}'

# (arguments as the model streams them, what the refusal says; None: the call is taken)
CASES = {
    "deep": (DEEP, "nested deeper than"),
    "digits": (DIGITS, "cannot be decoded"),
    "nan": (NAN, "is not a finite float"),
    "past 64 bits": ('{"n": ' + str(2**64) + "}", "outside the 64-bit range"),
    "long": (LONG, f"arguments of {len(LONG):,} characters"),
    "duplicate keys": ('{"k": 1, "k": 2}', None),
}


def _fragments(text: str, size: int = 60_000) -> list[str]:
    """As a stream carries it: in pieces, each one SSE event."""
    return [text[i : i + size] for i in range(0, len(text), size)]


Adapter = Callable[[], tuple[OpenAIStub, Callable[[str], HTTPModel], Any]]


def _openai(stub: OpenAIStub, text: str) -> None:
    stub.enqueue(sse(tool_call_events([("c1", "echo", _fragments(text))])))


def _anthropic(stub: OpenAIStub, text: str) -> None:
    stub.enqueue(tool_use_message([("c1", "echo", _fragments(text))]))


ADAPTERS = {
    "openai": (OpenAIStub, OpenAIModel, _openai),
    "anthropic": (AnthropicStub, AnthropicModel, _anthropic),
}


@pytest.mark.parametrize("adapter", list(ADAPTERS))
@pytest.mark.parametrize("case", list(CASES))
def test_the_adapters_make_bad_arguments_a_refused_call_not_a_failed_reply(
    adapter: str, case: str, models: list[Any]
) -> None:
    stub_type, model_type, enqueue = ADAPTERS[adapter]
    text, refusal = CASES[case]
    with stub_type() as stub:
        model = model_type(base_url=stub.base_url, api_key="k", max_retries=0)
        models.append(model)
        enqueue(stub, text)
        answer = model.complete(hi_request())
    (called,) = answer.tool_calls
    assert answer.finish == "tool_calls" and called.name == "echo"
    if refusal is None:
        assert called.invalid is None and dict(called.arguments) == {"k": 2}
    else:
        assert called.invalid is not None and refusal in called.invalid, called.invalid
        assert dict(called.arguments) == {}
        assert len(called.invalid) < 400


def _echo(rt: Runtime) -> list[Mapping[str, Any]]:
    seen: list[Mapping[str, Any]] = []

    def fn(arguments: Mapping[str, Any], _ctx: ToolContext) -> str:
        seen.append(dict(arguments))
        return "echoed"

    rt.ctx.tools.register(Tool("echo", "Echoes.", {"type": "object"}, fn))
    return seen


def test_an_openai_reply_of_bad_arguments_is_answered_and_the_session_resumes(
    tmp_path: Path, models: list[Any]
) -> None:
    """Over a socket, one reply: every bad call is answered `INVALID_ARGS` without running, the
    good one runs, the turn ends with the model's next answer, and the log resumes in a new
    runtime whose next turn re-sends all of it."""
    with OpenAIStub() as stub:
        model = OpenAIModel(base_url=stub.base_url, api_key="k", max_retries=0)
        models.append(model)
        registry = ModelRegistry()
        registry.register("openai", model)
        calls = [(f"c_{case}", "echo", _fragments(CASES[case][0])) for case in CASES]
        stub.enqueue(sse(tool_call_events(calls)), stream_text(["done"]))
        store = SessionStore(tmp_path, durability="none")
        with Runtime(store=store, models=registry) as rt:
            seen = _echo(rt)
            root = rt.agent(session_id="root", options=AgentOptions(model="openai:m"))
            root.send("go").get()
            outcome = root.when_idle().get()
            assert outcome.reason == "completed", outcome
            assert seen == [{"k": 2}]
            answered = {r["call_id"]: r for r in results(root)}
            for case, (_, refusal) in CASES.items():
                result = answered[f"c_{case}"]
                if refusal is None:
                    assert not result["is_error"]
                else:
                    assert result["code"] == "INVALID_ARGS" and refusal in text_of(result)
        assert_log_valid(store, "root")
        stub.enqueue(stream_text(["again"]))
        with Runtime(store=store, models=registry) as rt:
            _echo(rt)
            root = rt.resume_agent("root", options=AgentOptions(model="openai:m"))
            root.send("next").get()
            assert root.when_idle().get().output == [{"type": "text", "text": "again"}]
        resent = [m for m in stub.requests[-1].body["messages"] if m["role"] == "tool"]
        assert len(resent) == len(CASES)


def test_a_structured_result_with_a_5000_digit_integer_is_retried(models: list[Any]) -> None:
    """The capture tool's arguments come the same way: the model is told, and retries."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with OpenAIStub() as stub:
        model = OpenAIModel(base_url=stub.base_url, api_key="k", max_retries=0)
        models.append(model)
        registry = ModelRegistry()
        registry.register("openai", model)
        stub.enqueue(
            sse(tool_call_events([("c1", "structured_output", [DIGITS])])),
            sse(tool_call_events([("c2", "structured_output", ['{"n": 7}'])])),
        )
        with kit(models=registry) as k:
            run = k.start(
                k.parent(), output_schema=schema, agent_options=AgentOptions(model="openai:m")
            )
            result = run.result.get(timeout=30)
            assert result.stop_reason == "completed", result.diagnostic
            assert result.structured == {"n": 7}
            events = assert_log_valid(k.store, run.id)
            run.dispose()
    first = next(e["data"] for e in events if e["type"] == "tool/result")
    assert first["code"] == "INVALID_ARGS" and "cannot be decoded" in text_of(first)


def test_arguments_of_16_mib_from_any_adapter_are_refused_unrun(tmp_path: Path) -> None:
    """A scripted (or third-party) adapter hands over decoded arguments: the size is counted
    on their strings, nested or flat."""
    big = "x" * (16 * 1024 * 1024)
    store = SessionStore(tmp_path, durability="none")
    with Runtime(store=store, scripted=S.ScriptedModel()) as rt:
        seen = _echo(rt)
        calls = [("echo", {"s": big}), ("echo", {"a": [{"b": big}]}), ("echo", {"a": [big]})]
        rt.scripted.script("root", [S.tool_calls(calls), S.text("ok")])
        root = rt.agent(session_id="root")
        root.send("go").get()
        assert root.when_idle().get().reason == "completed"
        assert seen == []
        for result in results(root):
            assert result["code"] == "INVALID_ARGS"
            assert f"characters; a call takes at most {MAX_ARGUMENT_CHARS:,}" in text_of(result)
    assert_log_valid(store, "root")


def test_arguments_that_contain_themselves_are_refused_at_once() -> None:
    """Only code can make them (a scripted or third-party adapter): each level of the walk
    doubled, so the depth bound alone let it grow to 2**128 entries."""
    looped: dict[str, Any] = {}
    looped["a"] = looped
    looped["b"] = looped
    called = ToolCall("c1", "echo", {"x": looped})
    assert called.invalid is not None and "arrays and objects" in called.invalid
    assert called.arguments == {}


@pytest.mark.parametrize(
    ("extra", "diagnostic"),
    [
        ("9" * 5_000, "4300 digits"),
        ("[" * 100_000 + "]" * 100_000, "recursion"),
    ],
)
def test_a_streamed_chunk_past_the_decoder_ends_the_turn_with_a_diagnostic(
    extra: str, diagnostic: str, models: list[Any]
) -> None:
    """Not a tool call's arguments but the reply itself: the turn ends `error` saying why, the
    text streamed so far is kept, and the agent takes its next turn."""
    chunk = '{"choices":[{"index":0,"delta":{"content":"lost"}}],"x":' + extra + "}"
    with OpenAIStub() as stub:
        model = OpenAIModel(base_url=stub.base_url, api_key="k", max_retries=0)
        models.append(model)
        registry = ModelRegistry()
        registry.register("openai", model)
        head = text_events(["so far"], finish=None)
        stub.enqueue(sse([*head, chunk]), stream_text(["next"]))
        with Runtime(store=MemoryStore(), models=registry) as rt:
            root = rt.agent(session_id="root", options=AgentOptions(model="openai:m"))
            root.send("go").get()
            outcome = root.when_idle().get()
            assert outcome.reason == "error"
            assert "openai stream" in (outcome.message or "") and diagnostic in outcome.message
            assert len(outcome.message) < 1_000
            assert outcome.output == [{"type": "text", "text": "so far"}]
            root.send("again").get()
            assert root.when_idle().get().output == [{"type": "text", "text": "next"}]
            assert_log_valid(rt.store, "root")
