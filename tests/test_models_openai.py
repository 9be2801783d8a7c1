"""The OpenAI-compatible adapter against the in-process stub server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import gevent
import gevent.socket
import openai_stub as st
import pytest
from gevent.event import Event
from openai_stub import OpenAIStub

from agent.model import ModelAdapter, ModelError, ModelRequest, ModelResponse, ToolCall, ToolSpec
from agent.models.openai import OpenAIModel, to_chat_messages
from agent.usage import Usage
from supervision.errors import Cancelled
from supervision.signal import AbortController, AbortError, AbortSignal


@pytest.fixture
def stub() -> Iterator[OpenAIStub]:
    with OpenAIStub() as server:
        yield server


def background(fn: Any, *args: Any) -> gevent.Greenlet:
    """Spawn a call whose exception comes back through `outcome` (not printed by the hub)."""

    def run() -> Any:
        try:
            return fn(*args)
        except (Exception, Cancelled) as e:  # an abort is a Cancelled, not an Exception
            return e

    return gevent.spawn(run)


def outcome(g: gevent.Greenlet) -> Any:
    result = g.get()
    if isinstance(result, (Exception, Cancelled)):
        raise result
    return result


class Retries:
    def __init__(self) -> None:
        self.calls: list[tuple[int, float, str]] = []
        self.event = Event()

    def __call__(self, attempt: int, delay: float, diagnostic: str) -> None:
        self.calls.append((attempt, delay, diagnostic))
        self.event.set()

    @property
    def delays(self) -> list[float]:
        return [d for _, d, _ in self.calls]


_models: list[OpenAIModel] = []


@pytest.fixture(autouse=True)
def _close_models() -> Iterator[None]:
    yield
    while _models:
        _models.pop().close()


def make(stub: OpenAIStub, **kw: Any) -> OpenAIModel:
    opts: dict[str, Any] = {
        "base_url": stub.base_url,
        "api_key": "sk-test",
        "max_retries": 2,
        "backoff_base": 0.001,
    }
    opts.update(kw)
    model = OpenAIModel(**opts)
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
        model="gpt-4o-mini",
        system=system,
        messages=messages
        if messages is not None
        else [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        tools=tools,
        signal=signal or AbortSignal.never(),
        max_tokens=max_tokens,
    )


def test_is_a_model_adapter(stub: OpenAIStub) -> None:
    assert isinstance(make(stub), ModelAdapter)


# --- happy paths --------------------------------------------------------------------------------


def test_streams_text_with_progress_and_usage(stub: OpenAIStub) -> None:
    usage = {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
    stub.enqueue(st.stream_text(["Hel", "lo"], usage=usage))
    got: list[Any] = []
    r = make(stub).complete(req(), got.append)
    assert r == ModelResponse(
        ({"type": "text", "text": "Hello"},),
        (),
        "stop",
        {"input_tokens": 7, "output_tokens": 2},
    )
    assert got == [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]


def test_request_carries_the_right_json_and_headers(stub: OpenAIStub) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": [],
            "tool_calls": [{"id": "c1", "name": "read", "arguments": {"path": "x"}}],
        },
        {
            "role": "tool",
            "tool_call_id": "c1",
            "name": "read",
            "content": [{"type": "text", "text": "data"}],
            "is_error": False,
        },
        {
            "role": "tool",
            "tool_call_id": "c2",
            "name": "read",
            "content": [{"type": "text", "text": "nope"}],
            "is_error": True,
        },
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
    ]
    tool = ToolSpec("read", "Read a file", {"type": "object", "properties": {}})
    make(stub).complete(req(messages=messages, tools=(tool,), max_tokens=50))
    (sent,) = stub.requests
    assert sent.method == "POST" and sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer sk-test"
    assert sent.headers["content-type"] == "application/json"
    assert sent.body == {
        "model": "gpt-4o-mini",
        "stream": True,
        "stream_options": {"include_usage": True},
        "max_tokens": 50,
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "read",
                    "description": "Read a file",
                    "parameters": {"type": "object", "properties": {}},
                },
            }
        ],
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "a\nb"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "read", "arguments": '{"path": "x"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "data"},
            {"role": "tool", "tool_call_id": "c2", "content": "Error: nope"},
            {"role": "assistant", "content": "done"},
        ],
    }


def test_optional_fields_are_left_out(stub: OpenAIStub) -> None:
    make(stub, max_tokens_field="max_completion_tokens").complete(req(system=""))
    body = stub.requests[0].body
    assert "tools" not in body and "max_tokens" not in body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    make(stub, max_tokens_field="max_completion_tokens").complete(req(max_tokens=5))
    assert stub.requests[1].body["max_completion_tokens"] == 5


def test_unsupported_content_is_a_model_error_before_any_request(stub: OpenAIStub) -> None:
    bad = [{"role": "user", "content": [{"type": "image", "data": "..."}]}]
    with pytest.raises(ModelError, match="unsupported content block 'image'"):
        make(stub).complete(req(messages=bad))
    with pytest.raises(ModelError, match="unknown message role 'robot'"):
        to_chat_messages("", [{"role": "robot", "content": []}])
    assert stub.requests == []


def test_base_url_and_key_from_environment(
    stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", stub.base_url + "/")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    with OpenAIModel() as model:
        model.complete(req())
    assert stub.requests[0].headers["authorization"] == "Bearer sk-env"
    assert stub.requests[0].path == "/v1/chat/completions"


def test_no_key_for_a_custom_server_sends_no_authorization(
    stub: OpenAIStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAIModel(base_url=stub.base_url) as model:
        model.complete(req())
    assert "authorization" not in stub.requests[0].headers


def test_no_key_for_openai_itself_is_a_model_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ModelError, match="no API key"):
        OpenAIModel().complete(req())


def test_bad_base_url() -> None:
    with pytest.raises(ValueError, match="http"):
        OpenAIModel(base_url="ftp://x")


def test_streamed_tool_calls_are_assembled_by_index(stub: OpenAIStub) -> None:
    stub.enqueue(
        st.sse(
            st.tool_call_events(
                [
                    ("call_a", "read", ['{"pa', 'th": ', '"x"}']),
                    ("call_b", "grep", ['{"q"', ': "y", "n": 2}']),
                ],
                content="Let me look.",
            )
        )
    )
    r = make(stub).complete(req())
    assert r.finish == "tool_calls"
    assert r.content == ({"type": "text", "text": "Let me look."},)
    assert r.tool_calls == (
        ToolCall("call_a", "read", {"path": "x"}),
        ToolCall("call_b", "grep", {"q": "y", "n": 2}),
    )


def test_tool_call_without_arguments_gets_an_empty_object(stub: OpenAIStub) -> None:
    stub.enqueue(st.sse(st.tool_call_events([("c", "now", [])])))
    assert make(stub).complete(req()).tool_calls == (ToolCall("c", "now", {}),)


@pytest.mark.parametrize("args", ['{"path": ', "[1, 2]", "not json"])
def test_malformed_tool_arguments_are_a_model_error(stub: OpenAIStub, args: str) -> None:
    stub.enqueue(st.sse(st.tool_call_events([("c", "read", [args])])))
    with pytest.raises(ModelError, match="tool call 'read' has malformed JSON arguments"):
        make(stub).complete(req())


def test_tool_arguments_too_deep_to_parse_are_an_invalid_call_not_a_crash(
    stub: OpenAIStub,
) -> None:
    """Issue 12 item 11: valid JSON nested past the parser's recursion limit raised
    RecursionError out of the adapter (the turn ended `error`). It is the model's mistake: the
    call comes back refused, with a reason the tool layer turns into an error result."""
    deep = '{"a": ' * 50_000 + "1" + "}" * 50_000
    stub.enqueue(st.sse(st.tool_call_events([("c", "read", [deep]), ("d", "now", ["{}"])])))
    r = make(stub).complete(req())
    assert r.finish == "tool_calls"
    first, second = r.tool_calls
    assert (first.id, first.name, first.arguments) == ("c", "read", {})
    assert first.invalid is not None and "nested deeper than" in first.invalid
    assert second == ToolCall("d", "now", {})


def test_truncated_tool_call_at_max_tokens_is_dropped(stub: OpenAIStub) -> None:
    stub.enqueue(st.sse(st.tool_call_events([("c", "read", ['{"pa'])], finish="length")))
    r = make(stub).complete(req())
    assert r.finish == "max-tokens" and r.tool_calls == ()


@pytest.mark.parametrize(
    ("raw", "mapped"),
    [("stop", "stop"), ("length", "max-tokens"), ("content_filter", "refusal"), (None, "stop")],
)
def test_finish_reason_mapping(stub: OpenAIStub, raw: str | None, mapped: str) -> None:
    stub.enqueue(st.stream_text(["x"], finish=raw))
    assert make(stub).complete(req()).finish == mapped


def test_unknown_finish_reason_is_a_model_error(stub: OpenAIStub) -> None:
    stub.enqueue(st.stream_text(["x"], finish="weird"))
    with pytest.raises(ModelError, match="unknown finish_reason 'weird'"):
        make(stub).complete(req())


def test_refusal_deltas_end_as_refusal(stub: OpenAIStub) -> None:
    chunk = {"choices": [{"index": 0, "delta": {"refusal": "I can't."}, "finish_reason": "stop"}]}
    stub.enqueue(st.sse([chunk]))
    r = make(stub).complete(req())
    assert r.finish == "refusal" and r.content == ({"type": "text", "text": "I can't."},)


def test_a_non_streamed_json_answer_is_accepted(stub: OpenAIStub) -> None:
    answer = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c",
                            "type": "function",
                            "function": {"name": "t", "arguments": '{"a": 1}'},
                        }
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
    }
    stub.enqueue(st.status(200, answer))
    r = make(stub).complete(req())
    assert r.tool_calls == (ToolCall("c", "t", {"a": 1}),) and r.finish == "tool_calls"
    assert r.usage == {"input_tokens": 1, "output_tokens": 2}


def test_cached_prompt_tokens_are_reported_apart(stub: OpenAIStub) -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 60},
    }
    stub.enqueue(st.stream_text(["ok"], usage=usage))
    r = make(stub).complete(req())
    assert r.usage == {"input_tokens": 40, "cache_read_input_tokens": 60, "output_tokens": 5}
    assert type(r.usage) is Usage  # checked once here: the loop logs and charges it as is


def test_a_server_that_accepts_and_never_answers_fails_after_bounded_attempts(
    stub: OpenAIStub,
) -> None:
    """Issue 12 item 6: each attempt times out, the call gives up after max_retries + 1."""
    stall = st.Stall(head=False)
    stub.default = stall
    retries = Retries()
    with pytest.raises(ModelError, match=r"timed out before a response.*gave up after 3 attempts"):
        make(stub, read_timeout=0.05, max_retries=2, on_retry=retries).complete(req())
    assert len(stub.requests) == 3
    assert [attempt for attempt, _, _ in retries.calls] == [1, 2]


def test_default_timeouts_fail_a_stuck_call_within_minutes() -> None:
    m = OpenAIModel(base_url="http://127.0.0.1:9/v1", api_key="k")
    worst = (m.max_retries + 1) * (m.read_timeout + m.connect_timeout)
    assert worst <= 5 * 60, worst
    with pytest.raises(TypeError):
        OpenAIModel(base_url="http://127.0.0.1:9/v1", max_retries=1.5)  # type: ignore[arg-type]


def test_keep_alive_reuses_one_connection(stub: OpenAIStub) -> None:
    m = make(stub)
    for _ in range(3):
        m.complete(req())
    assert stub.connections == 1 and len(stub.requests) == 3


# --- failures: each ends in ModelError with a diagnostic ------------------------------------


def test_malformed_sse_data(stub: OpenAIStub) -> None:
    stub.enqueue(st.sse([st.text_events(["a"])[0], "{not json"]))
    with pytest.raises(ModelError, match="malformed SSE data"):
        make(stub).complete(req())


def test_unexpected_chunk_shape(stub: OpenAIStub) -> None:
    stub.enqueue(st.sse([{"choices": [{"index": 0, "delta": {"content": ["x"]}}]}]))
    with pytest.raises(ModelError, match="content is not a string"):
        make(stub).complete(req())
    stub.enqueue(st.sse([{"choices": "nope"}]))
    with pytest.raises(ModelError, match="unexpected chunk shape"):
        make(stub).complete(req())
    stub.enqueue(st.sse(["[1, 2]"]))
    with pytest.raises(ModelError, match="expected a JSON object"):
        make(stub).complete(req())


def test_error_event_in_the_stream(stub: OpenAIStub) -> None:
    stub.enqueue(st.sse([{"error": {"message": "overloaded mid-stream"}}]))
    with pytest.raises(ModelError, match="overloaded mid-stream"):
        make(stub).complete(req())


def test_connection_dropped_mid_stream(stub: OpenAIStub) -> None:
    stub.enqueue(st.drop_after(st.text_events(["par", "tial"], finish=None)[:2]))
    got: list[Any] = []
    with pytest.raises(ModelError, match=r"mid-response|mid-stream"):
        make(stub).complete(req(), got.append)
    assert got == [{"type": "text", "text": "par"}]
    assert len(stub.requests) == 1  # a stream that started is never replayed


def test_stream_that_ends_without_finish_or_done(stub: OpenAIStub) -> None:
    stub.enqueue(st.sse(st.text_events(["x"], finish=None), done=False))
    with pytest.raises(ModelError, match=r"without a finish_reason or \[DONE\]"):
        make(stub).complete(req())


def test_stream_with_finish_but_no_done_is_accepted(stub: OpenAIStub) -> None:
    stub.enqueue(st.sse(st.text_events(["x"]), done=False))
    assert make(stub).complete(req()).content == ({"type": "text", "text": "x"},)


def test_unexpected_content_type(stub: OpenAIStub) -> None:
    stub.enqueue(st.status(200, b"<html>", {"Content-Type": "text/html"}))
    with pytest.raises(ModelError, match="unexpected content type 'text/html'"):
        make(stub).complete(req())


def test_client_errors_are_not_retried(stub: OpenAIStub) -> None:
    stub.enqueue(st.status(400, {"error": {"message": "bad model", "code": "model_not_found"}}))
    with pytest.raises(ModelError, match=r"HTTP 400: bad model \(model_not_found\)"):
        make(stub).complete(req())
    assert len(stub.requests) == 1


def test_429_storm_gives_up_after_bounded_attempts(stub: OpenAIStub) -> None:
    busy = st.status(429, {"error": {"message": "rate limited"}}, {"Retry-After": "0.002"})
    stub.default = busy
    retries = Retries()
    with pytest.raises(ModelError, match=r"HTTP 429: rate limited \(gave up after 3 attempts\)"):
        make(stub, on_retry=retries).complete(req())
    assert len(stub.requests) == 3
    assert retries.delays == [0.002, 0.002]  # Retry-After, not the backoff


def test_429_then_success_honours_retry_after(stub: OpenAIStub) -> None:
    stub.enqueue(
        st.status(429, {"error": {"message": "slow down"}}, {"Retry-After": "0.003"}),
        st.status(429, None, {"retry-after-ms": "4"}),
        st.stream_text(["ok"]),
    )
    retries = Retries()
    r = make(stub, on_retry=retries).complete(req())
    assert r.content == ({"type": "text", "text": "ok"},)
    assert retries.delays == [0.003, 0.004]
    assert "HTTP 429: slow down" in retries.calls[0][2]


def test_retry_after_is_capped(stub: OpenAIStub) -> None:
    stub.enqueue(st.status(429, None, {"Retry-After": "3600"}), st.stream_text())
    retries = Retries()
    make(stub, on_retry=retries, retry_after_max=0.001).complete(req())
    assert retries.delays == [0.001]


def test_5xx_then_success_with_exponential_backoff(stub: OpenAIStub) -> None:
    stub.enqueue(st.status(500), st.status(503), st.stream_text(["fine"]))
    retries = Retries()
    r = make(stub, on_retry=retries, backoff_base=0.001).complete(req())
    assert r.content == ({"type": "text", "text": "fine"},)
    assert retries.delays == [0.001, 0.002]
    assert [a for a, _, _ in retries.calls] == [1, 2]


def test_connection_dropped_before_the_response_is_retried(stub: OpenAIStub) -> None:
    stub.enqueue(st.drop_before_response(), st.stream_text(["back"]))
    retries = Retries()
    r = make(stub, on_retry=retries).complete(req())
    assert r.content == ({"type": "text", "text": "back"},)
    assert len(retries.calls) == 1 and "failed" in retries.calls[0][2]


def test_connection_refused_ends_in_model_error() -> None:
    probe = gevent.socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nobody listens there now
    m = OpenAIModel(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=1, backoff_base=0.001
    )
    with pytest.raises(ModelError, match=r"connection to .* failed.*gave up after 2 attempts"):
        m.complete(req())


def test_read_timeout_mid_stream(stub: OpenAIStub) -> None:
    stub.enqueue(st.Stall(st.text_events(["a"])[:2]))
    with pytest.raises(ModelError, match="read timed out mid-response"):
        make(stub, read_timeout=0.05, max_retries=0).complete(req())


def test_timeout_before_the_response(stub: OpenAIStub) -> None:
    stub.enqueue(st.Stall(head=False))
    with pytest.raises(ModelError, match=r"timed out before a response.*gave up after 1 attempt\)"):
        make(stub, read_timeout=0.05, max_retries=0).complete(req())


def test_progress_sink_errors_pass_through_unchanged(stub: OpenAIStub) -> None:
    class SinkBroke(Exception):
        pass

    def sink(_p: Any) -> None:
        raise SinkBroke

    with pytest.raises(SinkBroke):
        make(stub).complete(req(), sink)


# --- cancellation -------------------------------------------------------------------------------


def test_abort_mid_stream_abandons_the_connection(stub: OpenAIStub) -> None:
    stall = st.Stall(st.text_events(["first"])[:2])
    stub.enqueue(stall)
    c = AbortController()
    got: list[Any] = []
    g = background(make(stub).complete, req(signal=c.signal), got.append)
    stall.holding.wait()
    c.abort()
    with pytest.raises(AbortError):
        outcome(g)
    assert stall.client_gone.wait(10)
    # The pool is still usable afterwards.
    assert make(stub).complete(req()).finish == "stop"


def test_abort_before_headers(stub: OpenAIStub) -> None:
    stall = st.Stall(head=False)
    stub.enqueue(stall)
    c = AbortController()
    m = make(stub)
    g = background(m.complete, req(signal=c.signal))
    stall.holding.wait()
    reason = TimeoutError("deadline")
    c.abort(reason)
    with pytest.raises(AbortError) as info:
        outcome(g)
    assert info.value.reason is reason
    assert stall.client_gone.wait(10)
    assert m.complete(req()).finish == "stop"  # the pool slot came back


def test_abort_during_backoff(stub: OpenAIStub) -> None:
    stub.enqueue(st.status(429, None, {"Retry-After": "3600"}))
    retries = Retries()
    c = AbortController()
    g = background(make(stub, on_retry=retries).complete, req(signal=c.signal))
    retries.event.wait()
    c.abort()
    with pytest.raises(AbortError):
        outcome(g)
    assert len(stub.requests) == 1


def test_already_aborted_sends_nothing(stub: OpenAIStub) -> None:
    c = AbortController()
    c.abort()
    with pytest.raises(AbortError):
        make(stub).complete(req(signal=c.signal))
    assert stub.requests == []


def test_killing_the_caller_kills_the_request(stub: OpenAIStub) -> None:
    stall = st.Stall()
    stub.enqueue(stall)
    g = background(make(stub).complete, req())
    stall.holding.wait()
    g.kill()
    assert stall.client_gone.wait(10)


# --- concurrency --------------------------------------------------------------------------------


def test_many_concurrent_streams_proceed_together(stub: OpenAIStub) -> None:
    """Every response is held until all 200 requests arrived: only true concurrency passes."""
    n = 200
    gate = st.Gate(n, st.stream_text(["x"]))
    stub.default = gate
    m = make(stub, max_retries=0)
    jobs = [gevent.spawn(m.complete, req()) for _ in range(n)]
    results = [j.get() for j in jobs]
    assert gate.opened.is_set()
    assert all(r.content == ({"type": "text", "text": "x"},) for r in results)
    assert stub.connections == n


def test_payload_round_trips_through_json(stub: OpenAIStub) -> None:
    """Mappings that are not dicts (e.g. frozen tool schemas) still serialize."""
    from types import MappingProxyType

    tool = ToolSpec("t", "d", MappingProxyType({"type": "object"}))
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": [],
            "tool_calls": [{"id": "c", "name": "t", "arguments": MappingProxyType({"k": 1})}],
        }
    ]
    make(stub).complete(req(messages=messages, tools=(tool,)))
    body = stub.requests[0].body
    assert body["tools"][0]["function"]["parameters"] == {"type": "object"}
    assert json.loads(body["messages"][1]["tool_calls"][0]["function"]["arguments"]) == {"k": 1}


def test_tool_call_index_must_be_an_int(stub: OpenAIStub) -> None:
    bad = {"index": "0", "id": "c", "function": {"name": "t", "arguments": "{}"}}
    stub.enqueue(st.sse([{"choices": [{"index": 0, "delta": {"tool_calls": [bad]}}]}]))
    with pytest.raises(ModelError, match="tool call index is not an int"):
        make(stub).complete(req())


def test_retry_after_as_an_http_date(stub: OpenAIStub) -> None:
    past = "Wed, 21 Oct 2015 07:28:00 GMT"
    stub.enqueue(st.status(503, None, {"Retry-After": past}), st.stream_text())
    retries = Retries()
    make(stub, on_retry=retries).complete(req())
    assert retries.delays == [0.0]
