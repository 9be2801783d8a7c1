"""What every HTTP model adapter shares: the request prologue, retries, abort handling, SSE lines.

An adapter (`OpenAIModel`, `AnthropicModel`) subclasses `HTTPModel` and supplies only its wire
format: the JSON body, how an error body reads, and how a 200 response becomes a
`ModelResponse`. Everything else lives here once:

- Each call runs its HTTP exchange in a worker greenlet owned by the caller. When the request's
  signal aborts, the worker is killed where it waits (connect, recv or a backoff sleep), which
  closes its half-read connection, and the caller raises `AbortError` at once.
- Retries cover 408/409/429/5xx (so Anthropic's 529 `overloaded`), connection failures and
  timeouts before a response started, and whatever the adapter marks `Retryable` (an
  `overloaded_error` event before any output). `retry-after` / `retry-after-ms` win over the
  exponential backoff, capped by `retry_after_max`.
- Every transport or protocol failure becomes `ModelError` with a diagnostic; only on_progress's
  own exceptions pass through unchanged.
- The exchange is the runtime's one HTTP client's (`agent.http_client`: a pool of kept-alive
  connections per adapter). A streamed body is cut into lines as it arrives, each byte searched
  once, and bounded as it arrives: `max_response_bytes` for the body, `MAX_LINE_BYTES` for one
  line; each event goes to the adapter as soon as its blank line is in.
- `tls_context` (a `gevent.ssl.SSLContext`) replaces the default verified context for an
  https `base_url`: a private CA, a client certificate, a pinned gateway (docs/models.md).
- `proxy` names the HTTP proxy for every call; else, unless `trust_env=False`, the
  environment's (`HTTPS_PROXY`, `NO_PROXY`, ...: `agent.http_proxy`). A query in `base_url`
  (Azure OpenAI's `?api-version=`) is kept on every request.

Defaults (issue 12): a server that accepts and never answers fails a call after
`max_retries + 1` attempts of `read_timeout` seconds each, i.e. about 3 minutes, not half an hour.
"""

from __future__ import annotations

import contextlib
import email.utils
import http.client
import json
import logging
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any
from urllib.parse import urlsplit

import gevent
import gevent.ssl

from agent.errors import ResponseTooLarge, Retryable
from agent.http_client import HTTPPool, Response
from agent.http_proxy import ProxyError
from agent.json_text import parse_json
from agent.model import (
    MAX_ARGUMENT_CHARS,
    MAX_ARGUMENT_DEPTH,
    ModelError,
    ModelRequest,
    ModelResponse,
    ProgressSink,
    too_long,
)
from agent.models.sse import SSEEvent, SSEParser
from supervision.errors import AbortError, Cancelled
from supervision.group import TaskGroup
from supervision.signal import AbortSignal

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_READ_TIMEOUT",
    "MAX_LINE_BYTES",
    "RETRY_STATUSES",
    "USER_AGENT",
    "HTTPModel",
    "RetryHook",
    "Retryable",
    "aborted",
    "decode_arguments",
    "drain",
    "jsonable",
    "read_body",
    "read_capped",
    "retry_after",
    "sse_events",
]

log = logging.getLogger(__name__)

RETRY_STATUSES = frozenset({408, 409, 429}) | frozenset(range(500, 600))
# Seconds without a byte from the server before an attempt fails, and retries after the first.
DEFAULT_READ_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2
_ERROR_BODY_LIMIT = 64 * 1024
# The most one answer may stream, in bytes of body. A model's longest answer is tens of MB of
# SSE (128k tokens at ~300 bytes an event); a server that streams without end (a broken proxy, a
# wrong base URL serving a download, a hostile endpoint) would otherwise fill the memory of the
# whole process through one child.
DEFAULT_MAX_RESPONSE_BYTES = 256 * 1024 * 1024
# The longest line a streamed answer may hold. The longest real SSE line is one event carrying a
# whole tool call's arguments or a whole answer (servers that do not stream them in pieces): at
# most a model's longest output, 128k tokens (~0.5 MB of text, ~1 MB once JSON-escaped). 16 MiB
# is many times that, and the most memory a line without an end can take before it is refused.
MAX_LINE_BYTES = 16 * 1024 * 1024
USER_AGENT = "subagent-runtime"
_DRAIN_LIMIT = 64 * 1024

# Called before each retry with (attempt that failed, delay in seconds, diagnostic).
RetryHook = Callable[[int, float, str], None]


class _Abandoned(Cancelled, gevent.GreenletExit):  # type: ignore[misc]
    """Kills a worker whose request was aborted (a GreenletExit, so the hub prints nothing)."""


def aborted(signal: AbortSignal) -> AbortError:
    """The `AbortError` to raise for an aborted signal (its own reason when it is one)."""
    reason = signal.reason
    if isinstance(reason, AbortError):
        return reason
    return AbortError(f"aborted: {reason!r}", reason=reason)


def jsonable(obj: object) -> dict[object, object]:
    """`json.dumps` default: read-only mappings (e.g. tool arguments) serialize as objects."""
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def decode_arguments(text: str, what: str = "arguments") -> tuple[dict[str, Any], str | None]:
    """A tool call's JSON arguments as the model streamed them: `(arguments, None)`, or
    `({}, why)` for valid JSON the runtime will not take (nested past the parser's reach, an
    integer past Python's digit limit, more containers than `agent.json_text` decodes), which
    the tool layer answers `INVALID_ARGS` so the model can retry. Raises `ValueError` for text
    that is not JSON, or not an object. A long text is decoded off the hub (`parse_json`); one
    past `MAX_ARGUMENT_CHARS` is not decoded at all."""
    if len(text) > MAX_ARGUMENT_CHARS:
        return {}, too_long(len(text))
    if not text.strip():
        return {}, None
    try:
        value = parse_json(text)
    except RecursionError:
        return {}, f"{what} nested deeper than {MAX_ARGUMENT_DEPTH} levels"
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        # Valid JSON past a decoding limit: `int()`'s digit limit, or too many containers.
        return {}, f"{what} cannot be decoded: {str(exc)[:200]}"
    if not isinstance(value, dict):
        raise ValueError(f"{what} are a {type(value).__name__}, not an object")
    return value, None


def retry_after(resp: Response) -> float | None:
    """Seconds the server asked us to wait (`retry-after-ms`, `retry-after` seconds or date)."""
    ms = resp.header("retry-after-ms")
    if ms is not None:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = resp.header("retry-after")
    if value is None:
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


def read_capped(resp: Response, limit: int = _ERROR_BODY_LIMIT) -> bytes:
    """At most `limit` bytes of a body (an error page can be anything)."""
    return resp.read(limit)


def _too_large(label: str, limit: int) -> ModelError:
    return ModelError(
        f"{label}: the answer ran past {limit} bytes (max_response_bytes); the rest was not read"
    )


def read_body(resp: Response, label: str, limit: int) -> bytes:
    """A whole (unstreamed) body, refused once it runs past `limit` bytes."""
    body = resp.read(limit + 1)
    if len(body) > limit:
        raise _too_large(label, limit)
    return body


def sse_events(
    resp: Response,
    label: str,
    limit: int = DEFAULT_MAX_RESPONSE_BYTES,
    max_line: int = MAX_LINE_BYTES,
) -> Iterator[SSEEvent]:
    """The server-sent events of a streamed response, each as soon as its blank line arrived.

    Ends when the body ends; raises `ModelError` when the connection closes mid-body, a line
    is not UTF-8 or runs past `max_line` bytes, or the body runs past `limit` bytes (counted as
    the bytes arrive, not line by line). The caller decides whether the stream was complete.
    """
    parser = SSEParser()
    try:
        for raw in resp.lines(max_line, limit):
            try:
                event = parser.feed(raw.decode("utf-8"))
            except UnicodeDecodeError as e:
                raise ModelError(f"{label} stream: invalid UTF-8 ({e})") from None
            if event is not None:
                yield event
    except ResponseTooLarge as e:
        if e.what == "body":
            raise _too_large(label, limit) from None
        raise ModelError(
            f"{label} stream: a line ran past {max_line} bytes without an end "
            f"({e.received} bytes of body read); the rest was not read"
        ) from None
    except http.client.IncompleteRead:
        raise ModelError(f"{label}: connection closed mid-stream") from None
    event = parser.flush()
    if event is not None:
        yield event


def drain(resp: Response) -> None:
    """Read the (normally empty) rest so the connection can go back to the pool; a server that
    keeps the stream open after its end, or sends more, costs its connection, not our time."""
    if not resp.complete:
        with gevent.Timeout(1.0, False), contextlib.suppress(OSError, http.client.HTTPException):
            resp.read(_DRAIN_LIMIT)


class HTTPModel:
    """The shared machinery of a streamed JSON-over-HTTP model adapter (see the module doc).

    Subclasses set `label` and implement `payload`, `read_answer` and `error_diagnostic`, and
    may override `check_ready` (e.g. a missing API key).
    """

    label = "http"

    def __init__(
        self,
        *,
        base_url: str,
        path: str,
        headers: Mapping[str, str],
        max_retries: int = DEFAULT_MAX_RETRIES,
        backoff_base: float = 0.5,
        backoff_max: float = 30.0,
        retry_after_max: float = 60.0,
        connect_timeout: float = 10.0,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        timeout: float | None = None,
        pool_size: int = 1024,
        on_retry: RetryHook | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        tls_context: ssl.SSLContext | None = None,
        proxy: str | None = None,
        trust_env: bool = True,
    ) -> None:
        if timeout is not None:  # `subagent run --timeout`: both timeouts at once
            connect_timeout = read_timeout = timeout
        base = base_url.rstrip("/")
        try:
            parts = urlsplit(base)
            valid = parts.scheme in ("http", "https") and bool(parts.hostname)
            parts.port  # noqa: B018  (raises for a port that is not a number or out of range)
        except ValueError as exc:  # `http://[::1`: urlsplit's own words say little
            raise ValueError(f"base_url must be an http(s) URL, got {base!r}: {exc}") from None
        if not valid:
            raise ValueError(f"base_url must be an http(s) URL, got {base!r}")
        if parts.fragment:
            raise ValueError(f"base_url cannot have a #fragment, got {base!r}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int):
            raise TypeError("max_retries must be an int")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int):
            raise TypeError("pool_size must be an int")
        if max_retries < 0 or pool_size < 1:
            raise ValueError("max_retries must be >= 0 and pool_size >= 1")
        if isinstance(max_response_bytes, bool) or not isinstance(max_response_bytes, int):
            raise TypeError("max_response_bytes must be an int")
        if max_response_bytes < 1:
            raise ValueError("max_response_bytes must be >= 1")
        if tls_context is not None and not isinstance(tls_context, gevent.ssl.SSLContext):
            # A standard-library context would make every model call block the hub.
            raise TypeError(
                "tls_context must be a gevent.ssl.SSLContext (agent.http_client.tls_context() "
                f"makes one), not {type(tls_context).__module__}.{type(tls_context).__name__}"
            )
        for name, value in (
            ("backoff_base", backoff_base),
            ("backoff_max", backoff_max),
            ("retry_after_max", retry_after_max),
            ("connect_timeout", connect_timeout),
            ("read_timeout", read_timeout),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of seconds")
            if not value >= 0:
                raise ValueError(f"{name} must be >= 0")
        self.base_url = base
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self.retry_after_max = retry_after_max
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.pool_size = pool_size
        self.max_response_bytes = max_response_bytes
        self._on_retry = on_retry
        # A query (Azure OpenAI's `?api-version=...`) is kept on every request's path.
        self._path = (parts.path or "") + path + (f"?{parts.query}" if parts.query else "")
        # Every call streams JSON; `headers` add the adapter's auth and the caller's extras.
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "User-Agent": USER_AGENT,  # some gateways refuse a request without one
        }
        self._headers.update(headers)
        # One keep-alive pool per adapter (= per base URL), sized for many concurrent streams.
        self._pool = HTTPPool(
            base,
            max_connections=pool_size,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            tls_context=tls_context,
            proxy=proxy,
            trust_env=trust_env,
        )
        self.proxy = self._pool.proxy  # the proxy every call goes through, or None
        # In-flight calls' workers; each call joins or kills its own before returning.
        self._calls = TaskGroup(f"http-model:{self.base_url}")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base_url}>"

    def close(self) -> None:
        """Close the idle pooled connections; in-flight ones close as they finish."""
        self._pool.close()

    def __enter__(self) -> HTTPModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what a subclass supplies -------------------------------------------------------------

    def payload(self, request: ModelRequest) -> dict[str, Any]:
        raise NotImplementedError

    def read_answer(
        self, resp: Response, on_progress: ProgressSink | None, limit: int | None = None
    ) -> ModelResponse:
        """Turn a 200 response into the answer (raise `ModelError` or `Retryable`); tool calls
        past `limit` (`ModelRequest.max_tool_calls`) are counted, not decoded."""
        raise NotImplementedError

    def error_diagnostic(self, code: int, body: bytes) -> str:
        detail = body[:500].decode("utf-8", "replace").strip()
        return f"HTTP {code}: {detail}" if detail else f"HTTP {code}"

    def check_ready(self) -> None:
        """Raise `ModelError` when no call can succeed (e.g. no API key)."""

    # -- the call -------------------------------------------------------------------------------

    def complete(
        self, request: ModelRequest, on_progress: ProgressSink | None = None
    ) -> ModelResponse:
        signal = request.signal
        if signal.aborted:
            raise aborted(signal)
        self.check_ready()
        try:
            body = json.dumps(
                self.payload(request), default=jsonable, ensure_ascii=False, allow_nan=False
            ).encode("utf-8")
        except (TypeError, ValueError) as e:
            raise ModelError(f"{self.label}: request is not JSON-serializable: {e}") from None
        worker = self._calls.spawn(self._guarded, body, on_progress, request.max_tool_calls)
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
            raise aborted(signal)
        if isinstance(outcome, BaseException):
            raise outcome
        raise ModelError(f"{self.label}: unexpected worker outcome {outcome!r}")  # pragma: no cover

    def _guarded(
        self, body: bytes, on_progress: ProgressSink | None, limit: int | None = None
    ) -> ModelResponse | Exception:
        # Errors come back as values: an exception escaping a greenlet is printed by the hub.
        try:
            return self._with_retries(body, on_progress, limit)
        except Exception as e:
            return e

    def _with_retries(
        self, body: bytes, on_progress: ProgressSink | None, limit: int | None = None
    ) -> ModelResponse:
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._attempt(body, on_progress, limit)
            except Retryable as e:
                if attempt > self.max_retries:
                    tries = "1 attempt" if attempt == 1 else f"{attempt} attempts"
                    raise ModelError(
                        f"{self.label}: {e.diagnostic} (gave up after {tries})"
                    ) from None
                if e.retry_after is not None:
                    delay = min(e.retry_after, self.retry_after_max)
                else:
                    delay = min(self.backoff_max, self.backoff_base * 2 ** (attempt - 1))
                log.debug("%s: %s; retry %d in %.3fs", self.label, e.diagnostic, attempt, delay)
                if self._on_retry is not None:
                    self._on_retry(attempt, delay, e.diagnostic)
                gevent.sleep(delay)

    def _attempt(
        self, body: bytes, on_progress: ProgressSink | None, limit: int | None = None
    ) -> ModelResponse:
        # Leaving the exchange keeps the connection only when the answer was read to its end.
        with self._pool.exchange() as exchange:
            try:
                resp = exchange.request("POST", self._path, body, self._headers)
            except TimeoutError as e:
                raise Retryable(
                    f"timed out before a response from {self.base_url} "
                    f"(no answer within {self.read_timeout}s: {e})"
                ) from None
            except ProxyError as e:
                if e.status is not None and 400 <= e.status < 500:  # credentials, a policy
                    raise ModelError(f"{self.label}: {e}") from None
                raise Retryable(f"connection to {self.base_url} failed: {e}") from None
            except (OSError, http.client.HTTPException) as e:
                raise Retryable(f"connection to {self.base_url} failed: {e!r}") from None
            except (RuntimeError, ValueError) as e:
                raise ModelError(f"{self.label}: request to {self.base_url} failed: {e}") from None
            try:
                code = resp.status
                if code != 200:
                    try:
                        err_body = read_capped(resp)
                    except (OSError, http.client.HTTPException):
                        err_body = b""
                    diagnostic = self.error_diagnostic(code, err_body)
                    if code in RETRY_STATUSES:
                        raise Retryable(diagnostic, retry_after(resp))
                    raise ModelError(f"{self.label}: {diagnostic}")
                return self.read_answer(resp, on_progress, limit)
            except TimeoutError:
                raise ModelError(
                    f"{self.label}: read timed out mid-response (no data for {self.read_timeout}s)"
                ) from None
            except (OSError, http.client.HTTPException) as e:
                raise ModelError(f"{self.label}: connection lost mid-response: {e!r}") from None
