"""A cooperative JSON-RPC 2.0 peer over newline-delimited pipes, on gevent.

The official ACP SDK is asyncio-only and cannot spawn under gevent, so this is our own: one reader
greenlet reads continuously (so the agent's requests are answered while ours is pending, and a
chatty agent never fills its stdout pipe), one writer greenlet owns stdin (so the reader never
waits on a full stdin pipe: the classic two-pipe deadlock). A malformed or oversize line is a
protocol failure: every pending request fails with `ConnectionClosed` carrying a diagnostic.
A long line is parsed off the hub (`agent.json_text`); at most `MAX_UNREAD_BYTES` of our
messages wait for a peer that does not read them, then the connection is given up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any, Protocol

import gevent
from gevent.event import AsyncResult, Event
from gevent.queue import Queue

from agent.errors import TooManyContainers
from agent.json_text import parse_json
from agent.jsoncheck import repair_surrogates
from providers.acp_text import clean_text, describe_data
from providers.errors import (
    ConnectionClosed,
    MethodNotFound,
    RequestAborted,
    RequestTimedOut,
    RpcError,
    RpcFault,
)
from supervision.group import TaskGroup
from supervision.signal import AbortSignal

__all__ = [
    "METHOD_NOT_FOUND",
    "NO_REPLY",
    "ConnectionClosed",
    "JsonRpcConnection",
    "MethodNotFound",
    "RequestAborted",
    "RequestTimedOut",
    "RpcError",
    "RpcFault",
    "StderrTail",
    "clean_text",
    "describe_data",
]

log = logging.getLogger(__name__)

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INTERNAL_ERROR = -32603

RequestHandler = Callable[[str, Any], Any]

# How many bytes of our messages may wait for a peer that does not read them before the
# connection is given up as dead (docs/decisions.md, "A peer that stops reading"). Measured: a
# turn's updates average 300 bytes each (a child's start, steps, tool calls and end), so a turn
# of 1,000 children and 50,000 streamed text chunks is some 12 MiB; and one message of a
# 16 MiB line replayed fits too, several times.
MAX_UNREAD_BYTES = 64 * 1024 * 1024

# How long the reader may go on reading lines without letting the hub run. A peer that writes
# faster than we read keeps the pipe full, so a read never waits and never yields: a flood of
# tiny messages (a million one-character chunks) held the hub for a second. Every this many
# seconds of reading the reader yields, so timers, other children and other clients run on.
READ_SLICE = 0.005
_LOOP_TURN = 1e-6


# An error's message quotes what it refuses (an id, a path, a method name): a peer that sends a
# megabyte-long one gets the start of it back, not the whole of it again.
MAX_ERROR_MESSAGE = 1024


def _bounded(message: str) -> str:
    if len(message) <= MAX_ERROR_MESSAGE:
        return message
    return f"{message[:MAX_ERROR_MESSAGE]}... ({len(message) - MAX_ERROR_MESSAGE} characters cut)"


class ReadPipe(Protocol):
    """A child's stderr as `StderrTail` drains it (a `gevent.subprocess` pipe)."""

    def read1(self, size: int = -1, /) -> bytes: ...


class LinePipe(Protocol):
    """The byte stream a connection reads its messages from, one line each."""

    def readline(self, size: int | None = -1, /) -> bytes: ...

    def close(self) -> object: ...


class WritePipe(Protocol):
    """The byte stream a connection writes its messages to."""

    def fileno(self) -> int: ...

    def write(self, data: bytes, /) -> object: ...

    def flush(self) -> object: ...

    def close(self) -> object: ...


NotificationHandler = Callable[[str, Any], None]


# A deferred handler (see `JsonRpcConnection`) that returns this sends no answer at all: the
# peer cancelled the request (MCP `notifications/cancelled`).
NO_REPLY: Any = object()


class StderrTail:
    """Drains a stderr pipe so a chatty child never blocks, keeping the tail for diagnostics."""

    def __init__(self, pipe: ReadPipe, keep: int = 8192) -> None:
        self._pipe = pipe
        self._keep = keep
        self._buf = bytearray()
        self._tasks = TaskGroup("stderr-tail")
        self._tasks.spawn(self._drain)

    def close(self, grace: float) -> None:
        """Let the drain read to the end for up to `grace` seconds, then end it."""
        self._tasks.join(grace)
        self._tasks.close()

    def _drain(self) -> None:
        try:
            while True:
                chunk = self._pipe.read1(65536)
                if not chunk:
                    return
                self._buf += chunk
                if len(self._buf) > 2 * self._keep:
                    del self._buf[: -self._keep]
        except (OSError, ValueError):
            return

    def text(self) -> str:
        """The kept tail, decoded, with terminal escapes stripped."""
        return clean_text(bytes(self._buf[-self._keep :]).decode("utf-8", "replace"))


def usable_id(ident: object) -> bool:
    """A JSON-RPC id we can echo: a string, an int, or a finite float (never a bool)."""
    kind = type(ident)
    return kind is str or kind is int or (kind is float and math.isfinite(ident))  # type: ignore[arg-type]


def unparsable(exc: ValueError | RecursionError) -> str:
    """What is wrong with a line `json.loads` refused, in our words (its own messages name
    Python functions, or nothing useful)."""
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply to read"
    if isinstance(exc, UnicodeDecodeError):
        return f"malformed JSON: not UTF-8 (byte {exc.start})"
    if isinstance(exc, json.JSONDecodeError):
        return f"malformed JSON: {exc.msg.lower()} at column {exc.colno}"
    if "digits" in str(exc):  # the interpreter's limit on int conversion (4,300 by default)
        return f"a JSON number has more than {sys.get_int_max_str_digits():,} digits"
    return "malformed JSON"


class JsonRpcConnection:
    """One JSON-RPC peer. Handlers run on the reader greenlet and must not block.

    A peer that writes a line that is not a JSON-RPC message is broken, and by default the
    connection ends on it (our ACP provider's stance towards an agent). A server passes
    `answer_bad_lines=True`: its client gets the JSON-RPC answer for the line (`-32700` parse
    error, `-32600` invalid request, with `id: null` when the line has no usable id) and the
    connection goes on, as JSON-RPC 2.0 asks of a server. A server also passes
    `require_version=True`: a request or notification without `"jsonrpc": "2.0"` is such a bad
    line (`-32600`, under its id when usable), as JSON-RPC 2.0 says it MUST carry it. Without it
    (our ACP provider) the member is not checked: every agent we run sends it, and a child's
    work is not thrown away over a missing version tag (docs/decisions.md).

    A request handler that needs to wait (a server running a tool) returns a `gevent.Greenlet`
    it spawned and owns: the answer is that greenlet's value (or its `RpcFault`/`MethodNotFound`,
    raised or returned: a returned fault is a client's bad request, not a crash for the hub to
    print), sent when it ends, so the reader keeps reading meanwhile.
    """

    def __init__(
        self,
        stdin: WritePipe,
        stdout: LinePipe,
        *,
        on_request: RequestHandler,
        on_notification: NotificationHandler,
        max_line_bytes: int,
        name: str = "acp",
        answer_bad_lines: bool = False,
        require_version: bool = False,
        max_unread_bytes: int = MAX_UNREAD_BYTES,
    ) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._on_request = on_request
        self._on_notification = on_notification
        self._max_line = max_line_bytes
        self._name = name
        self._answer_bad_lines = answer_bad_lines
        self._require_version = require_version
        self._next_id = 0
        self._pending: dict[int, tuple[str, AsyncResult, Callable[[], object] | None]] = {}
        # Our messages, encoded, waiting for the writer; `_unread` counts their bytes, and past
        # `max_unread_bytes` the peer is taken for dead (`_give_up`), never held in memory.
        self._outbox: Queue = Queue()
        self._unread = 0
        self._max_unread = max_unread_bytes
        self._gave_up = False
        self._closed: ConnectionClosed | None = None
        self._refusal: RpcFault | None = None
        self._request_id: object = None
        self.closed = Event()
        # The reader and writer loops; `shutdown` kills and joins them.
        self._tasks = TaskGroup(f"jsonrpc:{name}")
        self._tasks.spawn(self._read_loop)
        self._tasks.spawn(self._write_loop)

    @property
    def request_id(self) -> object:
        """The id of the peer's request whose handler is running (None outside a handler)."""
        return self._request_id

    @property
    def gave_up(self) -> bool:
        """Whether the connection ended because the peer stopped reading our messages."""
        return self._gave_up

    @property
    def failure(self) -> ConnectionClosed | None:
        """Why the connection ended, once it has."""
        return self._closed

    def request(
        self,
        method: str,
        params: object,
        *,
        signal: AbortSignal | None = None,
        timeout: float | None = None,
        on_answer: Callable[[], object] | None = None,
    ) -> object:
        """Send a request and wait cooperatively for its result.

        Raises `RpcError`, `ConnectionClosed`, `RequestAborted` when `signal` fires first, or
        `RequestTimedOut` when no answer came within `timeout` seconds. `on_answer` runs on the
        reader as the answer is read, before any later line is: the caller waiting for it
        wakes only later, after the reader may have dispatched more of the peer's messages.
        """
        if self._closed is not None:
            raise self._closed
        rid = self._next_id
        self._next_id += 1
        waiter: AsyncResult = AsyncResult()
        self._pending[rid] = (method, waiter, on_answer)
        remove = None
        if signal is not None:
            remove = signal.add_listener(
                lambda reason: waiter.ready() or waiter.set_exception(RequestAborted(reason))
            )
        try:
            if not waiter.ready():
                self._send({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            try:
                return waiter.get(timeout=timeout)
            except gevent.Timeout:
                raise RequestTimedOut(method, timeout or 0.0) from None
        finally:
            self._pending.pop(rid, None)
            if remove is not None:
                remove()

    def notify(self, method: str, params: object) -> bool:
        """Send a notification, best effort; returns whether it was queued."""
        if self._closed is not None:
            return False
        self._send({"jsonrpc": "2.0", "method": method, "params": params})
        return True

    def refuse_requests(self, fault: RpcFault) -> None:
        """From now on every request the peer sends is answered with `fault` at once, its
        handler never called: a server tearing down starts nothing its teardown could miss.
        Notifications (a cancel) are still handled."""
        self._refusal = fault

    def close_input(self) -> None:
        """Flush what is queued, then close the child's stdin (its cue to exit)."""
        self._outbox.put(None)

    def shutdown(self, reason: str = "connection closed") -> None:
        """Stop both greenlets and close the pipes; pending requests fail. Idempotent."""
        self._fail(ConnectionClosed(reason))
        self._outbox.put(None)
        self._tasks.close()
        if self._gave_up:
            self._discard_unwritten()
        for pipe in (self._stdin, self._stdout):
            with contextlib.suppress(OSError, ValueError):
                pipe.close()

    # -- internals ------------------------------------------------------------------------------

    def _send(self, message: dict[str, Any]) -> None:
        text = json.dumps(message, ensure_ascii=False, separators=(",", ":"))
        try:
            data = text.encode("utf-8")
        except UnicodeEncodeError:
            # A lone surrogate (a peer's JSON `\ud800` escape echoed back in a label, bytes
            # that are not UTF-8): the wire is UTF-8, so U+FFFD, as everywhere in the runtime
            # (docs/decisions.md). Only a failed encode pays for the repair.
            data = repair_surrogates(text).encode("utf-8")
        if self._gave_up:
            return  # the peer is gone as far as we are concerned; the warning said so
        size = len(data) + 1
        if self._unread and self._unread + size > self._max_unread:
            self._give_up(size)
            return
        # One message bigger than the bound still goes when nothing else waits.
        self._unread += size
        self._outbox.put(data + b"\n")

    def _give_up(self, size: int) -> None:
        """The peer has left `_max_unread` bytes of our messages unread: it is stuck or gone.
        Holding more would grow without limit, and blocking the senders would freeze every
        turn that reports to it, so the connection ends as on EOF (the server tears down)."""
        self._gave_up = True
        dropped = self._outbox.qsize()
        log.warning(
            "%s: the peer has not read %s bytes of our messages (%s queued, bound %s): the "
            "connection is given up; those and the next are dropped",
            self._name,
            f"{self._unread:,}",
            f"{dropped:,}",
            f"{self._max_unread:,}",
        )
        reason = f"the peer stopped reading: {self._unread + size:,} bytes of messages unread"
        self._fail(ConnectionClosed(reason))
        self._outbox.put(None)  # the writer stops at once, without a word more

    def _discard_unwritten(self) -> None:
        """Point our end of the pipe at /dev/null, so closing it flushes into nothing instead
        of waiting forever on a peer that does not read; the peer sees its end close."""
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stdin.fileno())
            finally:
                os.close(devnull)

    def _write_loop(self) -> None:
        try:
            while True:
                data = self._outbox.get()
                if data is None or self._gave_up:
                    break
                self._unread -= len(data)
                self._stdin.write(data)
                if self._outbox.empty():
                    self._stdin.flush()
        except (OSError, ValueError) as exc:  # broken pipe: the reader reports EOF
            log.debug("%s: write failed: %s", self._name, exc)
        if self._gave_up:
            return  # a close would flush into a peer that does not read: `shutdown` discards
        with contextlib.suppress(OSError, ValueError):
            self._stdin.close()

    def _fail(self, exc: ConnectionClosed) -> None:
        if self._closed is None:
            self._closed = exc
            self.closed.set()
        pending, self._pending = self._pending, {}
        for _method, waiter, _hook in pending.values():
            if not waiter.ready():
                waiter.set_exception(self._closed)

    def _read_loop(self) -> None:
        clock = time.perf_counter
        slice_end = clock() + READ_SLICE
        try:
            while self._closed is None:
                if clock() > slice_end:
                    # The peer keeps us busy: let the hub run (READ_SLICE). Not `sleep(0)`, which
                    # runs ready greenlets but may leave timers and I/O waiting (measured: up to
                    # 250 ms); nor `idle()`, which never returns while any greenlet spins on
                    # `sleep(0)`. The shortest timer: one turn of the loop, polling included.
                    gevent.sleep(_LOOP_TURN)
                    slice_end = clock() + READ_SLICE
                line = self._stdout.readline(self._max_line + 1)
                if not line:
                    self._fail(ConnectionClosed("the agent closed its stdout"))
                    return
                if len(line) > self._max_line and not (
                    len(line) == self._max_line + 1 and line.endswith(b"\n")
                ):
                    what = f"a line exceeds {self._max_line} bytes"
                    if not self._answer_bad_lines:
                        self._fail(ConnectionClosed(f"protocol error: {what}", protocol_error=True))
                        return
                    self._skip_rest_of_line(line)
                    self._bad_line(INVALID_REQUEST, what, line[:200], None)
                    continue
                if not line.strip():
                    continue
                self._dispatch(line)
        except (OSError, ValueError) as exc:
            self._fail(ConnectionClosed(f"reading stdout failed: {exc}"))

    def _skip_rest_of_line(self, head: bytes) -> None:
        """Read past the end of an over-long line, a bounded chunk at a time."""
        chunk = head
        while chunk and not chunk.endswith(b"\n"):
            chunk = self._stdout.readline(self._max_line + 1)

    def _dispatch(self, line: bytes) -> None:
        try:
            # Off the hub for a long line (agent/json_text.py).
            message = parse_json(line)
        except TooManyContainers as exc:  # valid JSON, but no message we take
            self._bad_line(INVALID_REQUEST, str(exc), line, None)
            return
        except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
            self._bad_line(PARSE_ERROR, unparsable(exc), line, None)
            return
        if not isinstance(message, dict):
            self._bad_line(INVALID_REQUEST, "not a JSON-RPC object", line, None)
            return
        method = message.get("method")
        if self._require_version and "method" in message and message.get("jsonrpc") != "2.0":
            what = 'a request must carry "jsonrpc": "2.0"'
            self._bad_line(INVALID_REQUEST, what, line, message.get("id"))
            return
        if isinstance(method, str):
            if "id" in message:
                rid = message["id"]
                if not usable_id(rid):
                    # An object, array, boolean, null or non-finite id cannot be echoed back
                    # (`1e400` parses to inf, which `json.dumps` would write as `Infinity`).
                    what = "a request id must be a string or a finite number"
                    self._bad_line(INVALID_REQUEST, what, line, None)
                    return
                self._answer(rid, method, message.get("params"))
            else:
                self._guard(self._on_notification, method, message.get("params"))
            return
        if "id" in message and ("result" in message or "error" in message):
            ident = message["id"]
            # bool is an int subclass, but JSON `false` is not the id 0 we sent.
            known = isinstance(ident, int) and not isinstance(ident, bool)
            entry = self._pending.get(ident) if known else None
            if entry is None:
                log.debug("%s: response to unknown request id %r", self._name, message["id"])
                return
            name, waiter, on_answer = entry
            if waiter.ready():
                return
            if on_answer is not None:
                try:
                    on_answer()
                except Exception:
                    log.exception("%s: the answer hook of %s raised", self._name, name)
            error = message.get("error")
            if error is not None:
                err = error if isinstance(error, dict) else {"message": error}
                waiter.set_exception(
                    RpcError(name, err.get("code"), err.get("message"), err.get("data"))
                )
            else:
                waiter.set(message.get("result"))
            return
        ident = message.get("id")
        self._bad_line(INVALID_REQUEST, "not a JSON-RPC message", line, ident)

    def _bad_line(self, code: int, what: str, line: bytes, ident: object) -> None:
        """A line that is not a message we can act on: answer it (a server) or end (a client)."""
        shown = line[:200]
        if not self._answer_bad_lines:
            self._fail(ConnectionClosed(f"protocol error: {what}: {shown!r}", protocol_error=True))
            return
        log.warning("%s: answered a bad line (%s): %r", self._name, what, shown)
        # JSON-RPC ids are strings, numbers or null; anything else cannot be echoed back.
        usable = usable_id(ident)
        kind = "parse error" if code == PARSE_ERROR else "invalid request"
        error = {"code": code, "message": f"{kind}: {what}"}
        self._send({"jsonrpc": "2.0", "id": ident if usable else None, "error": error})

    def _answer(self, rid: object, method: str, params: object) -> None:
        if self._refusal is not None:
            self._reply_error(rid, method, self._refusal)
            return
        self._request_id = rid
        try:
            result = self._on_request(method, params)
        except Exception as exc:
            self._reply_error(rid, method, exc)
            return
        finally:
            self._request_id = None
        if isinstance(result, gevent.Greenlet):
            # rawlink: the answer is queued from the hub callback itself (a non-blocking put).
            result.rawlink(lambda done: self._deferred(rid, method, done))
            return
        self._send({"jsonrpc": "2.0", "id": rid, "result": result})

    def _deferred(self, rid: object, method: str, done: gevent.Greenlet) -> None:
        if done.successful():
            if isinstance(done.value, (RpcFault, MethodNotFound)):
                self._reply_error(rid, method, done.value)
            elif done.value is not NO_REPLY:
                self._send({"jsonrpc": "2.0", "id": rid, "result": done.value})
        elif isinstance(done.exception, Exception):
            self._reply_error(rid, method, done.exception)
        # killed (GreenletExit): the connection is shutting down; nobody waits for an answer

    def _reply_error(self, rid: object, method: str, exc: Exception) -> None:
        error: dict[str, Any]
        if isinstance(exc, MethodNotFound):
            error = {"code": METHOD_NOT_FOUND, "message": _bounded(f"method not found: {method}")}
        elif isinstance(exc, RpcFault):
            error = {"code": exc.code, "message": _bounded(exc.message)}
            if exc.data is not None:
                error["data"] = exc.data
        else:
            log.error("%s: handler for %s raised", self._name, method, exc_info=exc)
            error = {"code": INTERNAL_ERROR, "message": "internal error"}
        self._send({"jsonrpc": "2.0", "id": rid, "error": error})

    def _guard(self, fn: NotificationHandler, method: str, params: object) -> None:
        try:
            fn(method, params)
        except Exception:
            log.exception("%s: notification handler for %s raised", self._name, method)
