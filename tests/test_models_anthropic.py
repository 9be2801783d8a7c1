"""The Anthropic Messages adapter against the in-process Messages-compatible stub server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic_stub as an
import gevent
import openai_stub as st
import pytest
from anthropic_stub import AnthropicStub

from agent.model import ModelAdapter, ModelError, ModelRequest, ModelResponse, ToolCall, ToolSpec
from agent.models.anthropic import ANTHROPIC_VERSION, AnthropicModel, to_messages
from agent.usage import Usage
from supervision.errors import Cancelled
from supervision.signal import AbortController, AbortError, AbortSignal


@pytest.fixture
def stub() -> Iterator[AnthropicStub]:
    with AnthropicStub() as server:
        yield server


_models: list[AnthropicModel] = []


@pytest.fixture(autouse=True)
def _close_models() -> Iterator[None]:
    yield
    while _models:
        _models.pop().close()


class Retries:
    def __init__(self) -> None:
        self.calls: list[tuple[int, float, str]] = []

    def __call__(self, attempt: int, delay: float, diagnostic: str) -> None:
        self.calls.append((attempt, delay, diagnostic))


def make(stub: AnthropicStub, **kw: Any) -> AnthropicModel:
    opts: dict[str, Any] = {
        "base_url": stub.base_url,
        "api_key": "sk-ant-test",
        "max_retries": 2,
        "backoff_base": 0.001,
    }
    opts.update(kw)
    model = AnthropicModel(**opts)
    _models.append(model)
    return model


def req(
    *,
    signal: AbortSignal | None = None,
    messages: list[dict[str, Any]] | None = None,
    tools: tuple[ToolSpec, ...] = (),
    max_tokens: int | None = None,
    system: str = "be brief",
) -> ModelRequest:
    return ModelRequest(
        session_id="s1",
        model="claude-test",
        system=system,
        messages=messages
        if messages is not None
        else [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        tools=tools,
        signal=signal or AbortSignal.never(),
        max_tokens=max_tokens,
    )


def background(fn: Any, *args: Any) -> gevent.Greenlet:
    def run() -> Any:
        try:
            return fn(*args)
        except (Exception, Cancelled) as e:  # an abort is a Cancelled, not an Exception
            return e

    return gevent.spawn(run)


def test_is_a_model_adapter(stub: AnthropicStub) -> None:
    assert isinstance(make(stub), ModelAdapter)


# --- streaming ----------------------------------------------------------------------------------


def test_streams_text_with_progress_and_usage(stub: AnthropicStub) -> None:
    usage = {
        "input_tokens": 20,
        "output_tokens": 1,
        "cache_creation_input_tokens": 300,
        "cache_read_input_tokens": 0,
    }
    stub.enqueue(an.text_message(["Hel", "lo"], usage=usage, output_tokens=7))
    got: list[Any] = []
    r = make(stub).complete(req(), got.append)
    assert r == ModelResponse(
        ({"type": "text", "text": "Hello"},),
        (),
        "stop",
        {
            "input_tokens": 20,
            "output_tokens": 7,  # message_delta's cumulative count replaces message_start's
            "cache_creation_input_tokens": 300,
            "cache_read_input_tokens": 0,
        },
    )
    assert got == [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    assert type(r.usage) is Usage  # checked once here: the loop logs and charges it as is


def test_request_json_headers_and_prompt_caching(stub: AnthropicStub) -> None:
    tools = (
        ToolSpec("a", "first", {"type": "object"}),
        ToolSpec("b", "second", {"type": "object", "properties": {"x": {"type": "string"}}}),
    )
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "do it"}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "calling"}],
            "tool_calls": [
                {"id": "t1", "name": "a", "arguments": {}},
                {"id": "t2", "name": "b", "arguments": {"x": "y"}},
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "t1",
            "name": "a",
            "content": [{"type": "text", "text": "1"}],
        },
        {
            "role": "tool",
            "tool_call_id": "t2",
            "name": "b",
            "content": [{"type": "text", "text": "boom"}],
            "is_error": True,
        },
        {"role": "user", "content": [{"type": "text", "text": "and steer"}]},
    ]
    make(stub).complete(req(messages=messages, tools=tools, max_tokens=99))
    [r] = stub.requests
    assert r.method == "POST" and r.path == "/v1/messages"
    assert r.headers["x-api-key"] == "sk-ant-test"
    assert r.headers["anthropic-version"] == ANTHROPIC_VERSION
    assert "authorization" not in r.headers
    body = r.body
    assert body["model"] == "claude-test" and body["stream"] is True and body["max_tokens"] == 99
    assert body["system"] == [
        {"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}
    ]
    assert body["tools"] == [
        {"name": "a", "description": "first", "input_schema": {"type": "object"}},
        {
            "name": "b",
            "description": "second",
            "input_schema": {"type": "object", "properties": {"x": {"type": "string"}}},
            "cache_control": {"type": "ephemeral"},
        },
    ]
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "do it"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "calling"},
                {"type": "tool_use", "id": "t1", "name": "a", "input": {}},
                {"type": "tool_use", "id": "t2", "name": "b", "input": {"x": "y"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "1"}],
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "t2",
                    "content": [{"type": "text", "text": "boom"}],
                    "is_error": True,
                },
                {"type": "text", "text": "and steer"},
            ],
        },
    ]


def test_defaults_max_tokens_and_can_leave_caching_off(stub: AnthropicStub) -> None:
    make(stub, cache=False, max_tokens=321).complete(req(tools=(ToolSpec("a", "d", {}),)))
    body = stub.requests[0].body
    assert body["max_tokens"] == 321
    assert body["system"] == [{"type": "text", "text": "be brief"}]
    assert "cache_control" not in body["tools"][0]


def test_empty_assistant_turns_and_text_are_left_out() -> None:
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": []},
        {"role": "user", "content": [{"type": "text", "text": "b"}, {"type": "text", "text": ""}]},
    ]
    assert to_messages(messages) == [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    ]


def test_key_and_base_url_from_the_environment(
    stub: AnthropicStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_BASE_URL", stub.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "from-env")
    m = AnthropicModel(max_retries=0)
    _models.append(m)
    m.complete(req())
    assert stub.requests[0].headers["x-api-key"] == "from-env"


def test_no_key_for_anthropic_itself_is_a_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)
    with pytest.raises(ModelError, match="ANTHROPIC_API_KEY"):
        AnthropicModel().complete(req())


def test_a_server_that_never_answers_gives_up_after_bounded_attempts(stub: AnthropicStub) -> None:
    stub.default = st.Stall(head=False)
    retries = Retries()
    m = make(stub, timeout=0.05, max_retries=1, on_retry=retries)
    assert m.read_timeout == m.connect_timeout == 0.05
    with pytest.raises(ModelError, match=r"timed out before a response.*gave up after 2 attempts"):
        m.complete(req())
    assert len(stub.requests) == 2 and len(retries.calls) == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        AnthropicModel(base_url="ftp://x")
    with pytest.raises(ValueError):
        AnthropicModel(base_url="http://127.0.0.1:9", max_tokens=0)


# --- tool use -----------------------------------------------------------------------------------


def test_streamed_tool_use_is_assembled(stub: AnthropicStub) -> None:
    stub.enqueue(
        an.tool_use_message(
            [("toolu_1", "lookup", ['{"q": ', '"cats"}']), ("toolu_2", "noargs", [])],
            text="let me look",
        )
    )
    r = make(stub).complete(req())
    assert r.finish == "tool_calls"
    assert r.content == ({"type": "text", "text": "let me look"},)
    assert r.tool_calls == (
        ToolCall("toolu_1", "lookup", {"q": "cats"}),
        ToolCall("toolu_2", "noargs", {}),
    )


def test_malformed_tool_input_is_a_model_error(stub: AnthropicStub) -> None:
    stub.enqueue(an.tool_use_message([("toolu_1", "t", ['{"q": '])]))
    with pytest.raises(ModelError, match="malformed JSON input"):
        make(stub).complete(req())


def test_tool_input_too_deep_to_parse_is_an_invalid_call_not_a_crash(stub: AnthropicStub) -> None:
    deep = '{"a": ' * 50_000 + "1" + "}" * 50_000
    stub.enqueue(an.tool_use_message([("toolu_1", "read", [deep]), ("toolu_2", "now", ["{}"])]))
    r = make(stub).complete(req())
    first, second = r.tool_calls
    assert (first.id, first.name, first.arguments) == ("toolu_1", "read", {})
    assert first.invalid is not None and "nested deeper than" in first.invalid
    assert second == ToolCall("toolu_2", "now", {})


def test_tool_use_cut_off_at_max_tokens_is_dropped(stub: AnthropicStub) -> None:
    events = an.message_events([("tool_use", ("toolu_1", "t", ['{"q": ']))], "max_tokens")
    stub.enqueue(an.stream(events))
    r = make(stub).complete(req())
    assert r.finish == "max-tokens" and r.tool_calls == ()


# --- stop reasons -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "mapped"),
    [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "max-tokens"),
        ("refusal", "refusal"),
        ("model_context_window_exceeded", "max-tokens"),
    ],
)
def test_stop_reason_mapping(stub: AnthropicStub, raw: str, mapped: str) -> None:
    stub.enqueue(an.text_message(["x"], stop_reason=raw))
    assert make(stub).complete(req()).finish == mapped


def test_tool_use_stop_reason_maps_to_tool_calls(stub: AnthropicStub) -> None:
    stub.enqueue(an.tool_use_message([("toolu_1", "t", ["{}"])]))
    assert make(stub).complete(req()).finish == "tool_calls"


def test_unknown_stop_reason_is_a_model_error(stub: AnthropicStub) -> None:
    stub.enqueue(an.text_message(["x"], stop_reason="pause_turn"))
    with pytest.raises(ModelError, match="unknown stop_reason 'pause_turn'"):
        make(stub).complete(req())


def test_stream_without_a_stop_reason_is_a_model_error(stub: AnthropicStub) -> None:
    stub.enqueue(an.stream(an.message_events([("text", ["x"])], None, stop=False)))
    with pytest.raises(ModelError, match="ended without"):
        make(stub).complete(req())


def test_connection_dropped_mid_stream(stub: AnthropicStub) -> None:
    stub.enqueue(an.drop_after(an.message_events([("text", ["x"])], None, stop=False)))
    with pytest.raises(ModelError, match=r"connection closed mid-stream|connection lost"):
        make(stub).complete(req())


# --- retries ------------------------------------------------------------------------------------


def test_429_with_retry_after_is_honoured(stub: AnthropicStub) -> None:
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    stub.enqueue(st.status(429, body, {"retry-after": "0.02"}))
    retries = Retries()
    r = make(stub, on_retry=retries, backoff_base=5.0).complete(req())
    assert r.finish == "stop"
    assert len(stub.requests) == 2
    [(attempt, delay, diagnostic)] = retries.calls
    assert attempt == 1 and delay == pytest.approx(0.02)
    assert diagnostic == "HTTP 429: slow down (rate_limit_error)"


def test_529_overloaded_is_retried(stub: AnthropicStub) -> None:
    stub.enqueue(an.overloaded(), an.overloaded(retry_after="0"))
    retries = Retries()
    r = make(stub, on_retry=retries).complete(req())
    assert r.content == ({"type": "text", "text": "Hello"},)
    assert [d for _, _, d in retries.calls] == ["HTTP 529: Overloaded (overloaded_error)"] * 2
    assert retries.calls[1][1] == 0.0  # retry-after: 0 wins over the backoff


def test_529_storm_gives_up_after_bounded_attempts(stub: AnthropicStub) -> None:
    stub.default = an.overloaded()
    with pytest.raises(ModelError, match=r"HTTP 529: Overloaded .*gave up after 3 attempts"):
        make(stub).complete(req())
    assert len(stub.requests) == 3


def test_overloaded_error_event_before_output_is_retried(stub: AnthropicStub) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    stub.enqueue(an.stream([an.message_events([])[0], error]))
    retries = Retries()
    r = make(stub, on_retry=retries).complete(req())
    assert r.finish == "stop" and len(stub.requests) == 2
    assert "overloaded_error" in retries.calls[0][2]


def test_error_event_after_output_fails_the_call(stub: AnthropicStub) -> None:
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    events = an.message_events([("text", ["partial"])], None, stop=False)
    stub.enqueue(an.stream([*events, error]))
    with pytest.raises(ModelError, match="stream error: Overloaded"):
        make(stub).complete(req(), lambda _p: None)
    assert len(stub.requests) == 1


def test_client_errors_are_not_retried(stub: AnthropicStub) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}
    stub.enqueue(st.status(400, body))
    with pytest.raises(ModelError, match=r"anthropic: HTTP 400: bad \(invalid_request_error\)"):
        make(stub).complete(req())
    assert len(stub.requests) == 1


# --- abort --------------------------------------------------------------------------------------


def test_abort_mid_stream_closes_the_connection(stub: AnthropicStub) -> None:
    # Stall sends data-only events: the adapter reads the event kind from `type` as well.
    stall = st.Stall(an.message_events([("text", ["first"])], None, stop=False))
    stub.enqueue(stall)
    c = AbortController()
    got: list[Any] = []
    g = background(make(stub).complete, req(signal=c.signal), got.append)
    stall.holding.wait()
    c.abort("stop now")
    result = g.get()
    assert isinstance(result, AbortError)
    assert stall.client_gone.wait(10)
    assert make(stub).complete(req()).finish == "stop"  # the pool is still usable


def test_payload_round_trips_through_json(stub: AnthropicStub) -> None:
    m = make(stub)
    payload = m.payload(req(tools=(ToolSpec("t", "d", {"type": "object"}),)))
    assert json.loads(json.dumps(payload)) == payload
