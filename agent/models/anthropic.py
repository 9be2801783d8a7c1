"""Anthropic Messages API, streamed, over `agent.http_client` (route `anthropic:MODEL`).

Our own client, not the SDK: the transport (worker greenlet, abort, retries, timeouts) is the
shared `agent.models.http.HTTPModel`; this module is the Messages wire format. It follows the
SDK's conventions: `ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL` (without `/v1`), the `x-api-key`
and `anthropic-version` headers. The system prompt and the tool definitions carry
`cache_control` breakpoints, so a long-lived agent's fixed prefix is read from the prompt cache.

Stream events: `message_start` (usage), `content_block_start` / `content_block_delta`
(`text_delta`, `input_json_delta`) / `content_block_stop`, `message_delta` (stop reason,
cumulative usage), `message_stop`, `ping`, and `error`. An `overloaded_error` event (or HTTP 529)
before any output is retried like a 429; after output it fails the call.
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
    HTTPModel,
    Retryable,
    RetryHook,
    decode_arguments,
    drain,
    sse_events,
)
from agent.usage import checked_usage, normalize_usage

__all__ = [
    "ANTHROPIC_VERSION",
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_TOKENS",
    "AnthropicModel",
    "to_messages",
    "to_tools",
]

DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
# The Messages API requires max_tokens; used when the agent's options set none.
DEFAULT_MAX_TOKENS = 8192

_STOP: dict[str, FinishReason] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool_calls",
    "max_tokens": "max-tokens",
    "model_context_window_exceeded": "max-tokens",
    "refusal": "refusal",
}
_RETRYABLE_ERRORS = frozenset({"overloaded_error", "rate_limit_error", "api_error"})
_CACHE = {"type": "ephemeral"}


# --- canonical messages -> Messages API ---------------------------------------------------------


def _text_blocks(content: str | Iterable[object] | None, where: str) -> list[dict[str, Any]]:
    """Canonical text blocks, minus empty ones (the API refuses empty text blocks)."""
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    out: list[dict[str, Any]] = []
    for block in content:
        if not isinstance(block, Mapping) or block.get("type") != "text":
            kind = block.get("type") if isinstance(block, Mapping) else type(block).__name__
            raise ModelError(f"anthropic adapter: unsupported content block {kind!r} in {where}")
        text = str(block.get("text", ""))
        if text:
            out.append({"type": "text", "text": text})
    return out


def to_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Canonical history (see `ModelRequest`) to Messages API turns.

    Tool results become `tool_result` blocks of a user turn; consecutive turns of one role merge
    (the API wants them alternating); an empty assistant turn is left out.
    """
    out: list[dict[str, Any]] = []

    def put(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for i, m in enumerate(messages):
        role = m.get("role")
        where = f"message {i} ({role})"
        if role == "user":
            put("user", _text_blocks(m.get("content"), where))
        elif role == "assistant":
            blocks = _text_blocks(m.get("content"), where)
            for call in m.get("tool_calls") or ():
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["name"],
                        "input": dict(call.get("arguments") or {}),
                    }
                )
            put("assistant", blocks)
        elif role == "tool":
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.get("tool_call_id")}
            blocks = _text_blocks(m.get("content"), where)
            if blocks:  # an empty result is sent without content, never as an empty text block
                result["content"] = blocks
            if m.get("is_error"):
                result["is_error"] = True
            put("user", [result])
        else:
            raise ModelError(f"anthropic adapter: unknown message role {role!r} in message {i}")
    return out


def to_tools(tools: Sequence[ToolSpec], *, cache: bool = True) -> list[dict[str, Any]]:
    """Tool definitions; the last one carries the cache breakpoint for the whole list."""
    out: list[dict[str, Any]] = [
        {"name": t.name, "description": t.description, "input_schema": dict(t.parameters)}
        for t in tools
    ]
    if cache and out:
        out[-1]["cache_control"] = dict(_CACHE)
    return out


# --- the streamed answer ------------------------------------------------------------------------


class _Answer:
    """Assembles Messages stream events into a `ModelResponse`."""

    __slots__ = ("blocks", "emitted", "started", "stop", "stopped", "usage")

    def __init__(self) -> None:
        # index -> ["text", [fragments]] or ["tool_use", id, name, [json fragments]]
        self.blocks: dict[int, list[Any]] = {}
        self.stop: str | None = None
        self.usage: dict[str, int] = {}
        self.started = False
        self.stopped = False
        self.emitted = False  # any content arrived (an overloaded error after it is final)

    def add(self, kind: str, obj: Mapping[str, Any]) -> str:
        """Take one event; returns the text delta to report as progress."""
        if kind == "message_start":
            self.started = True
            message = obj.get("message") or {}
            self._usage(message.get("usage"))
        elif kind == "content_block_start":
            index = obj["index"]
            block = obj.get("content_block") or {}
            btype = block.get("type")
            if btype == "text":
                self.blocks[index] = ["text", [str(block.get("text") or "")]]
            elif btype == "tool_use":
                preset = block.get("input")
                frags = [json.dumps(preset)] if preset else []
                self.blocks[index] = ["tool_use", block.get("id"), block.get("name"), frags]
            # Other blocks (thinking, server tools) are not part of the canonical answer.
        elif kind == "content_block_delta":
            delta = obj.get("delta") or {}
            slot = self.blocks.get(obj["index"])
            dtype = delta.get("type")
            if dtype == "text_delta" and slot is not None and slot[0] == "text":
                text = delta.get("text")
                if not isinstance(text, str):
                    raise ModelError(f"anthropic stream: text is not a string: {text!r:.200}")
                slot[1].append(text)
                self.emitted = True
                return text
            if dtype == "input_json_delta" and slot is not None and slot[0] == "tool_use":
                part = delta.get("partial_json")
                if not isinstance(part, str):
                    raise ModelError(
                        f"anthropic stream: partial_json is not a string: {part!r:.200}"
                    )
                slot[3].append(part)
                self.emitted = True
        elif kind == "message_delta":
            delta = obj.get("delta") or {}
            if delta.get("stop_reason"):
                self.stop = str(delta["stop_reason"])
            self._usage(obj.get("usage"))
        elif kind == "message_stop":
            self.stopped = True
        elif kind == "error":
            err = obj.get("error") or {}
            etype = err.get("type") if isinstance(err, Mapping) else None
            message = err.get("message", err) if isinstance(err, Mapping) else err
            diagnostic = f"stream error: {message}" + (f" ({etype})" if etype else "")
            if etype in _RETRYABLE_ERRORS and not self.emitted:
                raise Retryable(diagnostic)
            raise ModelError(f"anthropic {diagnostic}")
        return ""

    def _usage(self, usage: object) -> None:
        # message_delta's counts are cumulative: a later value replaces an earlier one.
        if isinstance(usage, Mapping):
            self.usage.update(normalize_usage(usage))

    def response(self, limit: int | None = None) -> ModelResponse:
        """The answer; past `limit` tool calls the rest are counted (`more_calls`), not
        decoded."""
        if self.stop is None:
            raise ModelError("anthropic stream: ended without a stop_reason")
        if self.stop not in _STOP:
            raise ModelError(f"anthropic: unknown stop_reason {self.stop!r}")
        finish = _STOP[self.stop]
        texts: list[str] = []
        calls: list[ToolCall] = []
        more = 0
        for index in sorted(self.blocks):
            slot = self.blocks[index]
            if slot[0] == "text":
                texts.append("".join(slot[1]))
                continue
            if limit is not None and len(calls) >= limit:
                more += 1
                continue
            _, cid, name, frags = slot
            args_text = "".join(frags)
            if not name or not cid:
                raise ModelError(f"anthropic: tool_use block #{index} has no id or name")
            try:
                args, invalid = decode_arguments(args_text, "input")
            except ValueError as e:
                if finish == "max-tokens":
                    continue  # cut off by the token limit: the call was never complete
                raise ModelError(
                    f"anthropic: tool_use {name!r} has malformed JSON input ({e}): "
                    f"{args_text[:200]!r}"
                ) from None
            calls.append(ToolCall(cid, name, args, invalid))
        if finish == "tool_calls" and not calls:
            raise ModelError("anthropic: stop_reason 'tool_use' without a tool_use block")
        if calls and finish == "stop":
            finish = "tool_calls"
        text = "".join(texts)
        content = ({"type": "text", "text": text},) if text else ()
        return ModelResponse(content, tuple(calls), finish, checked_usage(self.usage), more)


# --- the adapter --------------------------------------------------------------------------------


class AnthropicModel(HTTPModel):
    """A `ModelAdapter` for the Anthropic Messages API (`POST {base}/v1/messages`, streamed).

    `base_url` and `api_key` default to `ANTHROPIC_BASE_URL` / `ANTHROPIC_API_KEY`. Without a
    key the default endpoint fails each call with a clear `ModelError`; another base URL (a
    proxy, a compatible server) is called without `x-api-key`. `cache=False` leaves out the
    `cache_control` breakpoints. `timeout` sets the connect and read timeouts at once
    (`subagent run --timeout`). Retries and timeouts: see `agent.models.http`. `tls_context` (a
    `gevent.ssl.SSLContext`) is the TLS setup for an https endpoint behind a private CA or one
    that wants a client certificate; `proxy` and `trust_env` choose the HTTP proxy (by default
    the environment's `HTTPS_PROXY`/`NO_PROXY`).
    """

    label = "anthropic"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        version: str = ANTHROPIC_VERSION,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        cache: bool = True,
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        retry_after_max: float = 60.0,
        connect_timeout: float = 10.0,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        timeout: float | None = None,
        pool_size: int = 1024,
        extra_body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        on_retry: RetryHook | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        tls_context: ssl.SSLContext | None = None,
        proxy: str | None = None,
        trust_env: bool = True,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        base = (base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        key = api_key if api_key is not None else os.environ.get("ANTHROPIC_API_KEY")
        all_headers = {"anthropic-version": version}
        if key:
            all_headers["x-api-key"] = key
        all_headers.update(headers or {})
        super().__init__(
            base_url=base,
            path="/v1/messages",
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
        self._needs_key = not key and self.base_url == DEFAULT_BASE_URL
        self._max_tokens = max_tokens
        self._cache = cache
        self._extra_body = dict(extra_body or {})

    def __enter__(self) -> AnthropicModel:
        return self

    def check_ready(self) -> None:
        if self._needs_key:
            raise ModelError(f"anthropic: no API key for {self.base_url} (set ANTHROPIC_API_KEY)")

    def payload(self, request: ModelRequest) -> dict[str, Any]:
        """The JSON body sent for `request` (public so tests and logs can show it)."""
        body: dict[str, Any] = {
            "model": request.model,
            "max_tokens": request.max_tokens or self._max_tokens,
            "messages": to_messages(request.messages),
            "stream": True,
        }
        if request.system:
            system: dict[str, Any] = {"type": "text", "text": request.system}
            if self._cache:
                system["cache_control"] = dict(_CACHE)
            body["system"] = [system]
        if request.tools:
            body["tools"] = to_tools(request.tools, cache=self._cache)
        body.update(self._extra_body)
        return body

    def error_diagnostic(self, code: int, body: bytes) -> str:
        detail = body[:500].decode("utf-8", "replace").strip()
        try:
            err = json.loads(body).get("error")
            if isinstance(err, dict) and err.get("message"):
                detail = str(err["message"])
                if err.get("type"):
                    detail += f" ({err['type']})"
        except (ValueError, AttributeError):
            pass
        return f"HTTP {code}: {detail}" if detail else f"HTTP {code}"

    def read_answer(
        self, resp: Response, on_progress: ProgressSink | None, limit: int | None = None
    ) -> ModelResponse:
        ctype = resp.header("content-type") or ""
        if "text/event-stream" not in ctype:
            raise ModelError(f"anthropic: unexpected content type {ctype!r}")
        answer = _Answer()
        for event in sse_events(resp, "anthropic", self.max_response_bytes):
            try:
                obj = parse_json(event.data)
            except (ValueError, RecursionError) as e:
                raise ModelError(
                    f"anthropic stream: malformed SSE data ({e}): {event.data[:200]!r}"
                ) from None
            if not isinstance(obj, dict):
                raise ModelError(f"anthropic stream: expected a JSON object: {event.data[:200]!r}")
            kind = obj.get("type") or event.event
            try:
                text = answer.add(str(kind), obj)
            except (AttributeError, TypeError, KeyError) as e:
                raise ModelError(
                    f"anthropic stream: unexpected {kind} event ({e!r}): {event.data[:200]!r}"
                ) from None
            if text and on_progress is not None:
                on_progress({"type": "text", "text": text})
            if answer.stopped:
                break
        if answer.stopped:
            drain(resp)
        elif answer.stop is None:
            raise ModelError("anthropic stream: ended without message_delta or message_stop")
        return answer.response(limit)
