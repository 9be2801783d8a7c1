"""An answer that streams without end fails the call at `max_response_bytes`, for both HTTP
adapters and both answer shapes; long JSON is parsed off the hub (docs/models.md)."""

from __future__ import annotations

import json
from typing import Any

import anthropic_stub as an
import openai_stub as st
import pytest
from anthropic_stub import AnthropicStub
from model_support import hi_request
from openai_stub import Conn, OpenAIStub, StubRequest

from agent import json_text
from agent.model import ModelError
from agent.models.anthropic import AnthropicModel
from agent.models.http import DEFAULT_MAX_RESPONSE_BYTES, HTTPModel
from agent.models.openai import OpenAIModel

LIMIT = 64 * 1024
# The most a stub sends before it gives up on its own: far past LIMIT, so a call that read it
# all has ignored the limit; bounded, so the test ends either way.
STUB_SENDS = 16 * LIMIT


def _endless(event: bytes, first: bytes = b"") -> st.Behaviour:
    """A 200 event stream of `first`, then `event` again and again until STUB_SENDS bytes went
    (or the client left)."""

    def run(_req: StubRequest, conn: Conn) -> None:
        conn.head(200, st.SSE_HEAD)
        conn.chunk(first)
        sent = 0
        try:
            while sent < STUB_SENDS:
                conn.chunk(event * 16)
                sent += len(event) * 16
            conn.end()
        except OSError:  # the client gave up, as it should
            conn.drop()

    return run


def test_an_endless_openai_stream_fails_at_the_limit(models: list[HTTPModel]) -> None:
    delta = {"choices": [{"index": 0, "delta": {"content": "y" * 200}}]}
    with OpenAIStub() as stub:
        stub.enqueue(_endless(f"data: {json.dumps(delta)}\n\n".encode()))
        model = OpenAIModel(base_url=stub.base_url, api_key="k", max_response_bytes=LIMIT)
        models.append(model)
        progress: list[Any] = []
        with pytest.raises(ModelError, match=rf"ran past {LIMIT} bytes \(max_response_bytes\)"):
            model.complete(hi_request(), progress.append)
        # What streamed before the limit was shown; not a byte past it was read as an answer.
        shown = sum(len(p["text"]) for p in progress)
        assert 0 < shown <= LIMIT
        assert len(stub.requests) == 1  # a stream that started is never replayed


def test_an_endless_anthropic_stream_fails_at_the_limit(models: list[HTTPModel]) -> None:
    start, *_ = an.message_events([("text", ["x"])])
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "y" * 200},
    }
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }

    first = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in (start, block))
    event = f"event: content_block_delta\ndata: {json.dumps(delta)}\n\n"
    with AnthropicStub() as stub:
        stub.enqueue(_endless(event.encode(), first.encode()))
        model = AnthropicModel(base_url=stub.base_url, api_key="k", max_response_bytes=LIMIT)
        models.append(model)
        with pytest.raises(ModelError, match=rf"ran past {LIMIT} bytes"):
            model.complete(hi_request())


def test_a_json_answer_past_the_limit_fails(models: list[HTTPModel]) -> None:
    answer = {"choices": [{"index": 0, "message": {"content": "z" * (2 * LIMIT)}}]}
    with OpenAIStub() as stub:
        stub.enqueue(st.status(200, answer))
        model = OpenAIModel(base_url=stub.base_url, api_key="k", max_response_bytes=LIMIT)
        models.append(model)
        with pytest.raises(ModelError, match=rf"ran past {LIMIT} bytes"):
            model.complete(hi_request())
        # The same answer under a limit it fits is read whole.
        stub.enqueue(st.status(200, answer))
        roomy = OpenAIModel(base_url=stub.base_url, api_key="k", max_response_bytes=4 * LIMIT)
        models.append(roomy)
        assert roomy.complete(hi_request()).content == (
            {"type": "text", "text": "z" * (2 * LIMIT)},
        )


def test_long_json_is_parsed_off_the_hub(
    models: list[HTTPModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long answer goes to `agent.json_text`'s thread-pool parse (the pure-Python scanner,
    which gives the GIL back); a short event is parsed on the hub."""
    offloaded: list[int] = []
    real = json_text.offload

    def counting(fn: Any, *args: Any) -> Any:
        offloaded.append(len(args[0]))
        return real(fn, *args)

    monkeypatch.setattr(json_text, "offload", counting)
    big = "w" * (2 * json_text.ON_HUB_BYTES)
    with OpenAIStub() as stub:
        stub.enqueue(st.status(200, {"choices": [{"index": 0, "message": {"content": big}}]}))
        stub.enqueue(st.stream_text(["short"]))
        model = OpenAIModel(base_url=stub.base_url, api_key="k")
        models.append(model)
        assert model.complete(hi_request()).content == ({"type": "text", "text": big},)
        assert model.complete(hi_request()).content == ({"type": "text", "text": "short"},)
    assert len(offloaded) == 1 and offloaded[0] > 2 * json_text.ON_HUB_BYTES  # the long one


@pytest.mark.parametrize("bad", [0, -1])
def test_a_limit_below_one_byte_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match="max_response_bytes"):
        OpenAIModel(base_url="http://127.0.0.1:9", api_key="k", max_response_bytes=bad)


@pytest.mark.parametrize("bad", [1.5, "10", True])
def test_a_limit_that_is_not_an_int_is_refused(bad: Any) -> None:
    with pytest.raises(TypeError, match="max_response_bytes"):
        AnthropicModel(base_url="http://127.0.0.1:9", api_key="k", max_response_bytes=bad)


def test_the_default_limit_leaves_room_for_the_longest_real_answers() -> None:
    # 128k output tokens streamed one a chunk at ~300 bytes an SSE event is ~40 MB.
    assert DEFAULT_MAX_RESPONSE_BYTES >= 128_000 * 300 * 4
    model = OpenAIModel(base_url="http://127.0.0.1:9", api_key="k")
    assert model.max_response_bytes == DEFAULT_MAX_RESPONSE_BYTES
    model.close()
