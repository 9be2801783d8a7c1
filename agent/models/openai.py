"""OpenAI-compatible Chat Completions, streamed, over geventhttpclient.

Each call runs its HTTP exchange in a worker greenlet owned by the caller: when the request's
signal aborts, the worker is killed where it waits (connect, recv or a backoff sleep), which
closes its half-read connection, and the caller raises `AbortError` at once. Every transport or
protocol failure becomes `ModelError` with a diagnostic; only on_progress's own exceptions pass
through unchanged.
"""

from __future__ import annotations

import email.utils
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import gevent
from geventhttpclient import HTTPClient
from geventhttpclient.response import HTTPParseError

from agent.model import (
    MAX_ARGUMENT_DEPTH,
    FinishReason,
    ModelError,
    ModelRequest,
    ModelResponse,
    ProgressSink,
    ToolCall,
    ToolSpec,
)
from agent.models.sse import SSEParser
from supervision.signal import AbortError, AbortSignal

__all__ = ["DEFAULT_BASE_URL", "OpenAIModel", "RetryHook", "to_chat_messages", "to_chat_tools"]

log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "https://api.openai.com/v1"
RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
_ERROR_BODY_LIMIT = 64 * 1024

# Called before each retry with (attempt that failed, delay in seconds, diagnostic).
RetryHook = Callable[[int, float, str], None]

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "max-tokens",
    "content_filter": "refusal",
}


class _Abandoned(gevent.GreenletExit):  # type: ignore[misc]
    """Kills a worker whose request was aborted (a GreenletExit, so the hub prints nothing)."""


class _Retryable(Exception):
    def __init__(self, diagnostic: str, retry_after: float | None = None) -> None:
        super().__init__(diagnostic)
        self.diagnostic = diagnostic
        self.retry_after = retry_after


def _aborted(signal: AbortSignal) -> AbortError:
    reason = signal.reason
    if isinstance(reason, AbortError):
        return reason
    return AbortError(f"aborted: {reason!r}", reason=reason)


# --- canonical messages -> Chat Completions -------------------------------------------------


def _text_of(content: Any, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for block in content:
        if not isinstance(block, Mapping) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise ModelError(f"openai adapter: unsupported content block {kind!r} in {where}")
        parts.append(str(block.get("text", "")))
    return "\n".join(parts)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def to_chat_messages(system: str, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Canonical history (see `ModelRequest`) to Chat Completions messages, system first."""
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(messages):
        role = m.get("role")
        where = f"message {i} ({role})"
        if role in ("user", "system"):
            out.append({"role": role, "content": _text_of(m.get("content"), where)})
        elif role == "assistant":
            text = _text_of(m.get("content"), where)
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            calls = m.get("tool_calls") or ()
            if calls:
                msg["tool_calls"] = [
                    {
                        "id": c["id"],
                        "type": "function",
                        "function": {
                            "name": c["name"],
                            "arguments": json.dumps(
                                c.get("arguments") or {}, default=_jsonable, ensure_ascii=False
                            ),
                        },
                    }
                    for c in calls
                ]
                if not text:
                    msg["content"] = None
            out.append(msg)
        elif role == "tool":
            text = _text_of(m.get("content"), where)
            if m.get("is_error"):
                text = "Error: " + text
            out.append({"role": "tool", "tool_call_id": m.get("tool_call_id"), "content": text})
        else:
            raise ModelError(f"openai adapter: unknown message role {role!r} in message {i}")
    return out


def to_chat_tools(tools: Sequence[ToolSpec]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
            },
        }
        for t in tools
    ]


# --- the streamed answer ----------------------------------------------------------------------


class _Answer:
    """Assembles stream chunks (or one non-streamed message) into a `ModelResponse`."""

    __slots__ = ("calls", "finish", "refusal", "text", "usage")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.refusal: list[str] = []
        # index -> [id, name, argument fragments]
        self.calls: dict[int, list[Any]] = {}
        self.finish: str | None = None
        self.usage: dict[str, int] = {}

    def add(self, obj: Any, key: str = "delta") -> str:
        """Take one chunk; returns the text delta to report as progress."""
        if not isinstance(obj, dict):
            raise ModelError(f"openai stream: expected a JSON object, got {obj!r:.200}")
        err = obj.get("error")
        if err:
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise ModelError(f"openai stream error: {msg}")
        usage = obj.get("usage")
        if isinstance(usage, dict):
            for src, dst in (
                ("prompt_tokens", "input_tokens"),
                ("completion_tokens", "output_tokens"),
                ("total_tokens", "total_tokens"),
            ):
                v = usage.get(src)
                if isinstance(v, int):
                    self.usage[dst] = v
        delta_text = ""
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get(key) or {}
            content = delta.get("content")
            if content:
                if not isinstance(content, str):
                    raise ModelError(f"openai stream: content is not a string: {content!r:.200}")
                self.text.append(content)
                delta_text += content
            refusal = delta.get("refusal")
            if refusal:
                self.refusal.append(str(refusal))
            for pos, tc in enumerate(delta.get("tool_calls") or ()):
                index = tc.get("index", pos)
                if not isinstance(index, int):
                    raise ModelError(f"openai: tool call index is not an int: {index!r:.50}")
                slot = self.calls.get(index)
                if slot is None:
                    slot = self.calls[index] = [None, None, []]
                if tc.get("id"):
                    slot[0] = tc["id"]
                fn = tc.get("function") or {}
                if fn.get("name"):
                    slot[1] = fn["name"]
                if fn.get("arguments"):
                    args = fn["arguments"]
                    # Some servers send arguments as an object in non-streamed answers.
                    slot[2].append(args if isinstance(args, str) else json.dumps(args))
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return delta_text

    def response(self) -> ModelResponse:
        raw = self.finish
        finish: FinishReason
        if raw is None:
            finish = "tool_calls" if self.calls else "stop"
        elif raw in _FINISH:
            finish = _FINISH[raw]
        else:
            raise ModelError(f"openai: unknown finish_reason {raw!r}")
        calls: list[ToolCall] = []
        for index in sorted(self.calls):
            cid, name, frags = self.calls[index]
            args_text = "".join(frags)
            if not name:
                raise ModelError(f"openai: tool call #{index} has no function name")
            try:
                args = json.loads(args_text) if args_text.strip() else {}
                if not isinstance(args, dict):
                    raise ValueError(f"arguments are a {type(args).__name__}, not an object")
            except RecursionError:
                # Valid JSON nested too deep for the parser: the model's mistake to retry.
                invalid = f"arguments nested deeper than {MAX_ARGUMENT_DEPTH} levels"
                calls.append(ToolCall(cid or f"call_{index}", name, {}, invalid=invalid))
                continue
            except ValueError as e:
                if finish == "max-tokens":
                    continue  # cut off by the token limit: the call was never complete
                raise ModelError(
                    f"openai: tool call {name!r} has malformed JSON arguments ({e}): "
                    f"{args_text[:200]!r}"
                ) from None
            calls.append(ToolCall(cid or f"call_{index}", name, args))
        if calls and finish == "stop":
            finish = "tool_calls"
        if finish == "tool_calls" and not calls:
            raise ModelError("openai: finish_reason 'tool_calls' without a tool call")
        if self.refusal:
            finish = "refusal"
            text = "".join(self.refusal)
        else:
            text = "".join(self.text)
        content = ({"type": "text", "text": text},) if text else ()
        return ModelResponse(content, tuple(calls), finish, self.usage)


# --- the adapter ------------------------------------------------------------------------------


def _retry_after(resp: Any) -> float | None:
    ms = resp.get("retry-after-ms")
    if isinstance(ms, str):
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = resp.get("retry-after")
    if not isinstance(value, str):
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _error_diagnostic(code: int, body: bytes) -> str:
    detail = body[:500].decode("utf-8", "replace").strip()
    try:
        err = json.loads(body).get("error")
        if isinstance(err, dict) and err.get("message"):
            detail = str(err["message"])
            if err.get("code") or err.get("type"):
                detail += f" ({err.get('code') or err.get('type')})"
        elif isinstance(err, str):
            detail = err
    except (ValueError, AttributeError):
        pass
    return f"HTTP {code}: {detail}" if detail else f"HTTP {code}"


def _read_capped(resp: Any, limit: int = _ERROR_BODY_LIMIT) -> bytes:
    data = bytearray()
    while len(data) < limit:
        block = resp.read(4096)
        if not block:
            break
        data += block
    return bytes(data)


class OpenAIModel:
    """A `ModelAdapter` for any OpenAI-compatible `/chat/completions` endpoint.

    `base_url` and `api_key` default to `OPENAI_BASE_URL` / `OPENAI_API_KEY`. Without a key the
    default (OpenAI) endpoint fails each call with a clear `ModelError`; another base URL is
    called without `Authorization` (local servers rarely need one). Retries cover 408/409/429/
    5xx and connection failures before a response started; `Retry-After` wins over the backoff.
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = 4,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        retry_after_max: float = 60.0,
        connect_timeout: float = 10.0,
        read_timeout: float = 300.0,
        pool_size: int = 1024,
        max_tokens_field: str = "max_tokens",
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        on_retry: RetryHook | None = None,
    ) -> None:
        base = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"base_url must be an http(s) URL, got {base!r}")
        if max_retries < 0 or pool_size < 1:
            raise ValueError("max_retries must be >= 0 and pool_size >= 1")
        for name, value in (
            ("backoff_base", backoff_base),
            ("backoff_max", backoff_max),
            ("retry_after_max", retry_after_max),
            ("connect_timeout", connect_timeout),
            ("read_timeout", read_timeout),
        ):
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0")
        self.base_url = base
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_max = retry_after_max
        self.read_timeout = read_timeout
        self.pool_size = pool_size
        self._max_tokens_field = max_tokens_field
        self._extra_body = dict(extra_body or {})
        self._on_retry = on_retry
        self._path = (parts.path or "") + "/chat/completions"
        self._headers: dict[str, str] = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
        }
        if self._api_key:
            self._headers["Authorization"] = f"Bearer {self._api_key}"
        self._headers.update(headers or {})
        self._needs_key = not self._api_key and base == DEFAULT_BASE_URL
        # One keep-alive pool per adapter (= per base URL), sized for many concurrent streams.
        # Made on first use: building it creates an SSL context, tens of milliseconds of CPU that
        # a runtime which never calls this model should not spend on the hub.
        self._client_options = {
            "concurrency": pool_size,
            "connection_timeout": connect_timeout,
            "network_timeout": read_timeout,
        }
        self._client_base = base
        self._client_instance: HTTPClient | None = None

    def __repr__(self) -> str:
        return f"<OpenAIModel {self.base_url}>"

    @property
    def _client(self) -> HTTPClient:
        if self._client_instance is None:
            self._client_instance = HTTPClient.from_url(self._client_base, **self._client_options)
        return self._client_instance

    def close(self) -> None:
        """Close the idle pooled connections; in-flight ones close as they finish."""
        if self._client_instance is not None:
            self._client_instance.close()

    def __enter__(self) -> OpenAIModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def payload(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (public so tests and logs can show it)."""
        body: dict[str, Any] = {
            "model": request.model,
            "messages": to_chat_messages(request.system, request.messages),
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = to_chat_tools(request.tools)
        if request.max_tokens is not None:
            body[self._max_tokens_field] = request.max_tokens
        body.update(self._extra_body)
        return body

    def complete(
        self, request: ModelRequest, on_progress: ProgressSink | None = None
    ) -> ModelResponse:
        signal = request.signal
        if signal.aborted:
            raise _aborted(signal)
        if self._needs_key:
            raise ModelError(f"openai: no API key for {self.base_url} (set OPENAI_API_KEY)")
        try:
            body = json.dumps(
                self.payload(request), default=_jsonable, ensure_ascii=False, allow_nan=False
            ).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ModelError(f"openai: request is not JSON-serializable: {e}") from None
        worker = gevent.spawn(self._guarded, body, on_progress)
        remove = signal.add_listener(lambda _reason: worker.kill(_Abandoned, block=False))
        try:
            outcome = worker.get()
        finally:
            remove()
            if not worker.dead:  # our caller was killed: take the worker down with it
                worker.kill(_Abandoned, block=True)
        if isinstance(outcome, ModelResponse):
            return outcome
        if isinstance(outcome, _Abandoned) or signal.aborted:
            raise _aborted(signal)
        if isinstance(outcome, BaseException):
            raise outcome
        raise ModelError(f"openai: unexpected worker outcome {outcome!r}")  # pragma: no cover

    def _guarded(self, body: bytes, on_progress: ProgressSink | None) -> Any:
        # Errors come back as values: an exception escaping a greenlet is printed by the hub.
        try:
            return self._with_retries(body, on_progress)
        except Exception as e:
            return e

    def _with_retries(self, body: bytes, on_progress: ProgressSink | None) -> ModelResponse:
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._attempt(body, on_progress)
            except _Retryable as e:
                if attempt > self.max_retries:
                    raise ModelError(
                        f"openai: {e.diagnostic} (gave up after {attempt} attempts)"
                    ) from None
                if e.retry_after is not None:
                    delay = min(e.retry_after, self.retry_after_max)
                else:
                    delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
                log.debug("openai: %s; retry %d in %.3fs", e.diagnostic, attempt, delay)
                if self._on_retry is not None:
                    self._on_retry(attempt, delay, e.diagnostic)
                gevent.sleep(delay)

    def _attempt(self, body: bytes, on_progress: ProgressSink | None) -> ModelResponse:
        try:
            resp = self._client.request("POST", self._path, body=body, headers=self._headers)
        except TimeoutError as e:
            raise _Retryable(f"timed out before a response from {self.base_url}: {e}") from None
        except (OSError, HTTPParseError) as e:
            raise _Retryable(f"connection to {self.base_url} failed: {e!r}") from None
        except (RuntimeError, ValueError) as e:
            raise ModelError(f"openai: request to {self.base_url} failed: {e}") from None
        try:
            code = resp.status_code
            if code != 200:
                try:
                    err_body = _read_capped(resp)
                except (OSError, HTTPParseError):
                    err_body = b""
                diagnostic = _error_diagnostic(code, err_body)
                if code in RETRY_STATUSES:
                    raise _Retryable(diagnostic, _retry_after(resp))
                raise ModelError(f"openai: {diagnostic}")
            ctype = str(resp.get("content-type") or "")
            if "text/event-stream" in ctype:
                return self._read_stream(resp, on_progress)
            if "json" in ctype:
                return self._read_json(resp, on_progress)
            raise ModelError(f"openai: unexpected content type {ctype!r}")
        except TimeoutError:
            raise ModelError(
                f"openai: read timed out mid-response (no data for {self.read_timeout}s)"
            ) from None
        except (OSError, HTTPParseError) as e:
            raise ModelError(f"openai: connection lost mid-response: {e!r}") from None
        finally:
            resp.release()

    def _read_json(self, resp: Any, on_progress: ProgressSink | None) -> ModelResponse:
        raw = resp.read()
        if not resp.message_complete:
            raise ModelError("openai: connection closed before the JSON answer ended")
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError) as e:
            raise ModelError(f"openai: malformed JSON answer ({e}): {raw[:200]!r}") from None
        answer = _Answer()
        try:
            text = answer.add(obj, key="message")
        except (AttributeError, TypeError, KeyError) as e:
            raise ModelError(f"openai: unexpected answer shape ({e}): {raw[:200]!r}") from None
        if text and on_progress is not None:
            on_progress({"type": "text", "text": text})
        return answer.response()

    def _read_stream(self, resp: Any, on_progress: ProgressSink | None) -> ModelResponse:
        parser = SSEParser()
        answer = _Answer()
        done = False
        while not done:
            line = resp.readline(b"\n")
            if not line:
                if not resp.message_complete:
                    raise ModelError("openai: connection closed mid-stream")
                tail = resp.read()
                lines = [*tail.split(b"\n"), b""] if tail else [b""]
            else:
                lines = [line]
            for raw in lines:
                try:
                    event = parser.feed(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise ModelError(f"openai stream: invalid UTF-8 ({e})") from None
                if event is None:
                    continue
                if event.data == "[DONE]":
                    done = True
                    break
                try:
                    chunk = json.loads(event.data)
                except (ValueError, RecursionError) as e:
                    raise ModelError(
                        f"openai stream: malformed SSE data ({e}): {event.data[:200]!r}"
                    ) from None
                try:
                    text = answer.add(chunk)
                except (AttributeError, TypeError, KeyError) as e:
                    raise ModelError(
                        f"openai stream: unexpected chunk shape ({e}): {event.data[:200]!r}"
                    ) from None
                if text and on_progress is not None:
                    on_progress({"type": "text", "text": text})
            if not line:
                break
        if done:
            # Drain the (normally empty) rest so the connection can go back to the pool; a server
            # that keeps the stream open after [DONE] costs its connection, not our time.
            if not resp.message_complete:
                with gevent.Timeout(1.0, False):
                    resp.read()
        elif answer.finish is None:
            raise ModelError("openai stream: ended without a finish_reason or [DONE]")
        return answer.response()
