"""OpenAI-compatible Chat Completions, streamed, over `agent.http_client`.

The transport (worker greenlet, abort, retries, timeouts) is `agent.models.http.HTTPModel`,
shared with the Anthropic adapter; this module is the Chat Completions wire format.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agent.http_client import Response
from agent.json_text import parse_json
from agent.model import (
    FinishReason,
    ModelError,
    ModelRequest,
    ModelResponse,
    ProgressSink,
    ToolCall,
    ToolSpec,
)
from agent.models.http import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_RETRIES,
    DEFAULT_READ_TIMEOUT,
    RETRY_STATUSES,
    HTTPModel,
    RetryHook,
    decode_arguments,
    drain,
    jsonable,
    read_body,
    sse_events,
)
from agent.usage import checked_usage

__all__ = [
    "DEFAULT_BASE_URL",
    "RETRY_STATUSES",
    "OpenAIModel",
    "RetryHook",
    "to_chat_messages",
    "to_chat_tools",
]

DEFAULT_BASE_URL = "https://api.openai.com/v1"

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "tool_calls": "tool_calls",
    "function_call": "tool_calls",
    "length": "max-tokens",
    "content_filter": "refusal",
}


# --- canonical messages -> Chat Completions -------------------------------------------------


def _text_of(content: str | Iterable[object] | None, where: str) -> str:
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
                                c.get("arguments") or {}, default=jsonable, ensure_ascii=False
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


def _usage_of(usage: Mapping[str, Any]) -> dict[str, int]:
    """Chat Completions usage in the runtime's disjoint shape (see `agent.usage`):
    `prompt_tokens` includes the cached ones, which count as `cache_read_input_tokens`."""
    out: dict[str, int] = {}
    prompt = usage.get("prompt_tokens")
    completion = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    if type(cached) is not int or cached < 0:
        cached = 0
    if type(prompt) is int and prompt >= 0:
        cached = min(cached, prompt)
        out["input_tokens"] = prompt - cached
        if cached:
            out["cache_read_input_tokens"] = cached
    if type(completion) is int and completion >= 0:
        out["output_tokens"] = completion
    return out


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

    def add(self, obj: object, key: str = "delta") -> str:
        """Take one chunk; returns the text delta to report as progress."""
        if not isinstance(obj, dict):
            raise ModelError(f"openai stream: expected a JSON object, got {obj!r:.200}")
        err = obj.get("error")
        if err:
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise ModelError(f"openai stream error: {msg}")
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = _usage_of(usage)
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

    def response(self, limit: int | None = None) -> ModelResponse:
        """The answer; past `limit` calls the rest are counted (`more_calls`), not decoded."""
        raw = self.finish
        finish: FinishReason
        if raw is None:
            finish = "tool_calls" if self.calls else "stop"
        elif raw in _FINISH:
            finish = _FINISH[raw]
        else:
            raise ModelError(f"openai: unknown finish_reason {raw!r}")
        calls: list[ToolCall] = []
        indexes = sorted(self.calls)
        more = 0
        if limit is not None and len(indexes) > limit:
            more = len(indexes) - limit
            indexes = indexes[:limit]
        for index in indexes:
            cid, name, frags = self.calls[index]
            args_text = "".join(frags)
            if not name:
                raise ModelError(f"openai: tool call #{index} has no function name")
            try:
                args, invalid = decode_arguments(args_text)
            except ValueError as e:
                if finish == "max-tokens":
                    continue  # cut off by the token limit: the call was never complete
                raise ModelError(
                    f"openai: tool call {name!r} has malformed JSON arguments ({e}): "
                    f"{args_text[:200]!r}"
                ) from None
            calls.append(ToolCall(cid or f"call_{index}", name, args, invalid))
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
        return ModelResponse(content, tuple(calls), finish, checked_usage(self.usage), more)


# --- the adapter ------------------------------------------------------------------------------


class OpenAIModel(HTTPModel):
    """A `ModelAdapter` for any OpenAI-compatible `/chat/completions` endpoint.

    `base_url` and `api_key` default to `OPENAI_BASE_URL` / `OPENAI_API_KEY`. Without a key the
    default (OpenAI) endpoint fails each call with a clear `ModelError`; another base URL is
    called without `Authorization` (local servers rarely need one). `timeout` sets the connect
    and read timeouts at once (`subagent run --timeout`). Retries and timeouts: see
    `agent.models.http`. `tls_context` (a `gevent.ssl.SSLContext`) is the TLS setup for an https
    endpoint behind a private CA or one that wants a client certificate; `proxy` and
    `trust_env` choose the HTTP proxy (by default the environment's `HTTPS_PROXY`/`NO_PROXY`).
    """

    label = "openai"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        retry_after_max: float = 60.0,
        connect_timeout: float = 10.0,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        timeout: float | None = None,
        pool_size: int = 1024,
        max_tokens_field: str = "max_tokens",
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        on_retry: RetryHook | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        tls_context: ssl.SSLContext | None = None,
        proxy: str | None = None,
        trust_env: bool = True,
    ) -> None:
        base = (base_url or os.environ.get("OPENAI_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self._api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        all_headers: dict[str, str] = {}
        if self._api_key:
            all_headers["Authorization"] = f"Bearer {self._api_key}"
        all_headers.update(headers or {})
        super().__init__(
            base_url=base,
            path="/chat/completions",
            headers=all_headers,
            max_retries=max_retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            retry_after_max=retry_after_max,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            timeout=timeout,
            pool_size=pool_size,
            on_retry=on_retry,
            max_response_bytes=max_response_bytes,
            tls_context=tls_context,
            proxy=proxy,
            trust_env=trust_env,
        )
        self._max_tokens_field = max_tokens_field
        self._extra_body = dict(extra_body or {})
        self._needs_key = not self._api_key and self.base_url == DEFAULT_BASE_URL

    def __enter__(self) -> OpenAIModel:
        return self

    def check_ready(self) -> None:
        if self._needs_key:
            raise ModelError(f"openai: no API key for {self.base_url} (set OPENAI_API_KEY)")

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

    def error_diagnostic(self, code: int, body: bytes) -> str:
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

    def read_answer(
        self, resp: Response, on_progress: ProgressSink | None, limit: int | None = None
    ) -> ModelResponse:
        ctype = resp.header("content-type") or ""
        if "text/event-stream" in ctype:
            return self._read_stream(resp, on_progress, limit)
        if "json" in ctype:
            return self._read_json(resp, on_progress, limit)
        raise ModelError(f"openai: unexpected content type {ctype!r}")

    def _read_json(
        self, resp: Response, on_progress: ProgressSink | None, limit: int | None
    ) -> ModelResponse:
        raw = read_body(resp, "openai", self.max_response_bytes)
        if not resp.complete:
            raise ModelError("openai: connection closed before the JSON answer ended")
        try:
            obj = parse_json(raw)
        except (ValueError, RecursionError) as e:
            raise ModelError(f"openai: malformed JSON answer ({e}): {raw[:200]!r}") from None
        answer = _Answer()
        try:
            text = answer.add(obj, key="message")
        except (AttributeError, TypeError, KeyError) as e:
            raise ModelError(f"openai: unexpected answer shape ({e}): {raw[:200]!r}") from None
        if text and on_progress is not None:
            on_progress({"type": "text", "text": text})
        return answer.response(limit)

    def _read_stream(
        self, resp: Response, on_progress: ProgressSink | None, limit: int | None
    ) -> ModelResponse:
        answer = _Answer()
        done = False
        for event in sse_events(resp, "openai", self.max_response_bytes):
            if event.data == "[DONE]":
                done = True
                break
            try:
                chunk = parse_json(event.data)
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
        if done:
            drain(resp)
        elif answer.finish is None:
            raise ModelError("openai stream: ended without a finish_reason or [DONE]")
        return answer.response(limit)
