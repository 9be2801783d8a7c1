"""A streamed answer is read as it arrives, bounded per line and per body, on kept-alive
connections (agent/http_client.py, docs/models.md): real servers on 127.0.0.1."""

from __future__ import annotations

import json
import re
from typing import Any

import anthropic_stub as an
import gevent
import openai_stub as st
import pytest
from anthropic_stub import AnthropicStub
from gevent.event import Event
from model_support import hi_request
from openai_stub import SSE_HEAD, Conn, OpenAIStub, StubRequest

from agent.http_client import BLOCK
from agent.model import ModelError
from agent.models.anthropic import AnthropicModel
from agent.models.http import MAX_LINE_BYTES, USER_AGENT, HTTPModel
from agent.models.openai import OpenAIModel


def _openai(stub: OpenAIStub, models: list[HTTPModel], **kw: Any) -> OpenAIModel:
    opts: dict[str, Any] = {"base_url": stub.base_url, "api_key": "k", "backoff_base": 0.001}
    opts.update(kw)
    model = OpenAIModel(**opts)
    models.append(model)
    return model


def _wait_until_gone(conn: Conn) -> None:
    """Hold the response open until the client closes its end (it must not wait for us)."""
    try:
        while conn.sock.recv(4096):
            pass
    except OSError:
        pass
    conn.drop()


class _Held:
    """A behaviour that sends `first`, then `n` bytes of one line with no end, then holds."""

    def __init__(self, n: int, first: bytes = b"") -> None:
        self.n = n
        self.first = first
        self.sent = 0
        self.gone = Event()

    def __call__(self, _req: StubRequest, conn: Conn) -> None:
        conn.head(200, SSE_HEAD)
        conn.chunk(self.first)
        piece = b"y" * BLOCK
        try:
            conn.chunk(b"data: ")
            while self.sent < self.n:
                part = piece[: self.n - self.sent]
                conn.chunk(part)
                self.sent += len(part)
        except OSError:
            pass
        _wait_until_gone(conn)
        self.gone.set()


def test_a_line_without_an_end_is_refused_at_the_line_limit(models: list[HTTPModel]) -> None:
    """The server sends one byte past the limit and then waits: the call fails at once (it
    does not wait for the line's end), having read no more than the limit and one block."""
    held = _Held(MAX_LINE_BYTES + 1)
    with OpenAIStub() as stub:
        stub.enqueue(held)
        model = _openai(stub, models, read_timeout=30)
        with pytest.raises(ModelError, match="a line ran past 16777216 bytes without an end") as e:
            model.complete(hi_request())
        assert held.gone.wait(10)  # the client closed the connection
        read = int(re.search(r"\((\d+) bytes of body read\)", str(e.value)).group(1))  # type: ignore[union-attr]
        assert MAX_LINE_BYTES < read <= MAX_LINE_BYTES + BLOCK
        assert len(stub.requests) == 1  # not retried


def test_a_long_line_is_counted_against_max_response_bytes_as_it_arrives(
    models: list[HTTPModel],
) -> None:
    """A line below the line limit but past `max_response_bytes`: refused as its bytes
    arrive, not when (if ever) its end comes."""
    limit = 64 * 1024
    held = _Held(4 * limit)
    with OpenAIStub() as stub:
        stub.enqueue(held)
        model = _openai(stub, models, read_timeout=30, max_response_bytes=limit)
        with pytest.raises(ModelError, match=rf"ran past {limit} bytes \(max_response_bytes\)"):
            model.complete(hi_request())
        assert held.gone.wait(10)
        assert len(stub.requests) == 1


def test_long_lines_below_the_limits_are_read_whole(models: list[HTTPModel]) -> None:
    """A whole tool call's arguments in one event of several MB: read, across many reads."""
    text = "z" * (3 * 1024 * 1024)
    with OpenAIStub() as stub:
        stub.enqueue(st.stream_text([text, "!"]))
        answer = _openai(stub, models).complete(hi_request())
        assert answer.content == ({"type": "text", "text": text + "!"},)


def test_each_delta_is_delivered_as_soon_as_its_event_arrives(models: list[HTTPModel]) -> None:
    """The server sends one event, then waits for the client to report its delta before it
    sends the rest: the call only completes if the first delta came out mid-stream."""
    shown = Event()
    seen_by_server: list[bool] = []

    def stepwise(_req: StubRequest, conn: Conn) -> None:
        events = st.text_events(["first ", "second"])
        conn.head(200, SSE_HEAD)
        conn.event(events[0])
        conn.event(events[1])
        seen_by_server.append(shown.wait(10))
        for event in events[2:]:
            conn.event(event)
        conn.event("[DONE]")
        conn.end()

    progress: list[Any] = []

    def on_progress(delta: Any) -> None:
        progress.append(delta)
        shown.set()

    with OpenAIStub() as stub:
        stub.enqueue(stepwise)
        answer = _openai(stub, models).complete(hi_request(), on_progress)
    assert seen_by_server == [True]
    assert progress == [{"type": "text", "text": "first "}, {"type": "text", "text": "second"}]
    assert answer.content == ({"type": "text", "text": "first second"},)


def test_an_anthropic_delta_is_delivered_mid_stream_too(models: list[HTTPModel]) -> None:
    shown = Event()
    seen_by_server: list[bool] = []
    events = an.message_events([("text", ["one ", "two"])])

    def stepwise(_req: StubRequest, conn: Conn) -> None:
        conn.head(200, SSE_HEAD)
        for event in events[:4]:  # message_start, ping, content_block_start, the first delta
            an.named(conn, event)
        seen_by_server.append(shown.wait(10))
        for event in events[4:]:
            an.named(conn, event)
        conn.end()

    with AnthropicStub() as stub:
        stub.enqueue(stepwise)
        model = AnthropicModel(base_url=stub.base_url, api_key="k")
        models.append(model)
        answer = model.complete(hi_request(), lambda _delta: shown.set())
    assert seen_by_server == [True]
    assert answer.content == ({"type": "text", "text": "one two"},)


# --- kept-alive connections ----------------------------------------------------------------------


def test_one_connection_carries_streams_errors_and_json_answers(models: list[HTTPModel]) -> None:
    answer = {"choices": [{"index": 0, "message": {"content": "json"}}]}
    with OpenAIStub() as stub:
        stub.enqueue(
            st.stream_text(["a"]),
            st.status(429, {"error": {"message": "wait"}}, {"Retry-After": "0"}),
            st.stream_text(["b"]),
            st.status(200, answer),
            st.status(400, {"error": {"message": "no"}}),
            st.stream_text(["c"]),
        )
        model = _openai(stub, models)
        assert model.complete(hi_request()).content == ({"type": "text", "text": "a"},)
        assert model.complete(hi_request()).content == ({"type": "text", "text": "b"},)
        assert model.complete(hi_request()).content == ({"type": "text", "text": "json"},)
        with pytest.raises(ModelError, match="HTTP 400"):
            model.complete(hi_request())
        assert model.complete(hi_request()).content == ({"type": "text", "text": "c"},)
        assert len(stub.requests) == 6 and stub.connections == 1


def test_anthropic_keeps_its_connection_alive(models: list[HTTPModel]) -> None:
    with AnthropicStub() as stub:
        model = AnthropicModel(base_url=stub.base_url, api_key="k")
        models.append(model)
        for _ in range(3):
            assert model.complete(hi_request()).finish == "stop"
        assert len(stub.requests) == 3 and stub.connections == 1


def test_a_half_read_answer_is_never_reused(models: list[HTTPModel]) -> None:
    """A stream refused mid-body leaves bytes on its connection: the next call opens another."""
    stall = st.Stall(["{not json"])  # the rest of the stream never comes
    with OpenAIStub() as stub:
        stub.enqueue(stall)
        model = _openai(stub, models)
        with pytest.raises(ModelError, match="malformed SSE data"):
            model.complete(hi_request())
        assert stall.client_gone.wait(10)  # closed, not put back
        assert model.complete(hi_request()).finish == "stop"
        assert stub.connections == 2


def test_a_connection_the_server_closed_while_idle_is_not_used(models: list[HTTPModel]) -> None:
    """The server answers and then closes the connection without saying so: the next call
    goes out on a new one, with no retry counted."""

    def answer_then_close(req: StubRequest, conn: Conn) -> None:
        st.stream_text(["one"])(req, conn)
        conn.drop()

    retries: list[Any] = []
    with OpenAIStub() as stub:
        stub.enqueue(answer_then_close)
        model = _openai(stub, models, on_retry=lambda *a: retries.append(a))
        assert model.complete(hi_request()).finish == "stop"
        gevent.sleep(0)  # nothing to wait for: the close happened before the answer ended
        assert model.complete(hi_request()).content == ({"type": "text", "text": "Hello"},)
    assert retries == [] and stub.connections == 2 and len(stub.requests) == 2


def test_a_request_the_server_drops_on_a_kept_connection_goes_once_more(
    models: list[HTTPModel],
) -> None:
    """The race of an idle timeout: the server takes the request on a kept-alive connection and
    closes it unanswered. Sent again on a new connection, not counted as a retry."""
    retries: list[Any] = []
    with OpenAIStub() as stub:
        stub.enqueue(st.stream_text(["one"]), st.drop_before_response(), st.stream_text(["two"]))
        model = _openai(stub, models, on_retry=lambda *a: retries.append(a))
        assert model.complete(hi_request()).content == ({"type": "text", "text": "one"},)
        assert model.complete(hi_request()).content == ({"type": "text", "text": "two"},)
    assert retries == [] and stub.connections == 2 and len(stub.requests) == 3


def test_pool_size_bounds_the_connections_and_later_calls_wait_their_turn(
    models: list[HTTPModel],
) -> None:
    active = [0]
    most = [0]
    release = Event()

    def counted(req: StubRequest, conn: Conn) -> None:
        active[0] += 1
        most[0] = max(most[0], active[0])
        release.wait(10)
        st.stream_text(["x"])(req, conn)
        active[0] -= 1

    with OpenAIStub() as stub:
        stub.default = counted
        model = _openai(stub, models, pool_size=2, max_retries=0)
        calls = [gevent.spawn(model.complete, hi_request()) for _ in range(6)]
        assert stub.wait_for_requests(2)
        gevent.sleep(0.05)  # give the other four every chance to (wrongly) get through
        assert len(stub.requests) == 2
        release.set()
        assert all(c.get(timeout=10).finish == "stop" for c in calls)
    assert most[0] == 2 and stub.connections == 2


# --- a connection closed mid-stream --------------------------------------------------------------


def _cut_in_a_chunk(_req: StubRequest, conn: Conn) -> None:
    """Declares a chunk of 100 bytes, sends 30 of it, closes."""
    conn.head(200, SSE_HEAD)
    conn.event(st.text_events(["par"])[1])
    conn.sock.sendall(b"64\r\ndata: " + b"y" * 24)
    conn.drop()


def _cut_short_of_its_length(_req: StubRequest, conn: Conn) -> None:
    conn.head(200, {"Content-Type": "text/event-stream", "Content-Length": "10000"})
    conn.sock.sendall(b"data: " + json.dumps(st.text_events(["par"])[1]).encode() + b"\n\n")
    conn.drop()


def _cut_between_chunks(req: StubRequest, conn: Conn) -> None:
    st.drop_after(st.text_events(["par"], finish=None)[:2])(req, conn)


@pytest.mark.parametrize(
    "behaviour", [_cut_in_a_chunk, _cut_short_of_its_length, _cut_between_chunks]
)
def test_a_stream_closed_mid_body_fails_keeps_its_partial_output_and_is_not_replayed(
    models: list[HTTPModel], behaviour: st.Behaviour
) -> None:
    progress: list[Any] = []
    with OpenAIStub() as stub:
        stub.enqueue(behaviour)
        model = _openai(stub, models)
        with pytest.raises(ModelError, match="connection closed mid-stream"):
            model.complete(hi_request(), progress.append)
        assert progress == [{"type": "text", "text": "par"}]
        assert len(stub.requests) == 1
        assert model.complete(hi_request()).finish == "stop"  # a new connection serves the next
        assert stub.connections == 2


def test_an_anthropic_stream_cut_in_a_chunk_fails(models: list[HTTPModel]) -> None:
    with AnthropicStub() as stub:
        stub.enqueue(_cut_in_a_chunk)
        model = AnthropicModel(base_url=stub.base_url, api_key="k", max_retries=0)
        models.append(model)
        with pytest.raises(ModelError, match="connection closed mid-stream"):
            model.complete(hi_request())


def test_a_user_agent_is_sent_unless_the_caller_names_one(models: list[HTTPModel]) -> None:
    with OpenAIStub() as stub:
        _openai(stub, models).complete(hi_request())
        _openai(stub, models, headers={"User-Agent": "mine/1"}).complete(hi_request())
    assert [r.headers["user-agent"] for r in stub.requests] == [USER_AGENT, "mine/1"]
