"""The runtime's one HTTP/1.1 client: kept-alive connections to one origin, over gevent sockets
(or plain ones, for a thread with no hub), with a body read as it arrives.

The model adapters (`agent.models.http`) and the OTLP exporter (`subagent.otlp`) both post
through an `HTTPPool`. Why a client of our own (docs/decisions.md, "One HTTP client"):
geventhttpclient, used before, buffered a whole line of a streamed answer and searched that
buffer from its start on every `recv`, so a stream with no newline cost quadratic CPU and
unbounded memory; the standard library's `http.client` reads linearly but spends Python calls
on every chunk of a chunked body and parses headers with the `email` package, ~25 % more CPU
per streamed model call than before. This module frames HTTP/1.1 (a status line, headers,
then a body by `Content-Length`, `chunked` or the connection's end) and nothing else:

- `Response.read1()` returns everything that has arrived (decoding every complete chunk in the
  buffer at once), or waits for one `recv`; `Response.lines()` cuts it into lines, searching
  each byte once, with a bound per line and per body counted as bytes arrive.
- Bounds on what a server can make us hold: a head of at most 64 KiB and 100 headers, a chunk
  size line of at most 1 KiB, trailers within the head's bound.
- `HTTPPool(url, max_connections=...)`: at most that many connections at once (a caller past
  the bound waits for a slot); idle ones are kept, the most recent first, for at most
  `max_idle` seconds (a connection a NAT or a server dropped without a word would cost a whole
  read timeout), and one the server closed meanwhile is noticed (readable while idle) before
  it is used.
- `pool.exchange()`: a context manager holding one slot; `request()` sends the request in one
  write and returns the `Response` once its head arrived. Leaving the block keeps the
  connection when the body was read to its end and the server keeps it open, and closes it
  otherwise (a half-read body, a kill, an error): a connection is never reused out of step.
- A request on a kept-alive connection that the server closed before answering (its idle
  timeout raced ours) is sent once more on a new connection; every other failure is the
  caller's (the model adapters' retries stay theirs).
- Timeouts: `connect_timeout` bounds the connect and the TLS handshake, `read_timeout` each
  later socket call. TLS is the default verified context (`gevent.ssl`'s for gevent sockets),
  or the pool's `tls_context` (e.g. one that trusts a private CA).

Failures are the standard library's: `OSError` (`TimeoutError` for a timeout) from the socket,
`http.client.HTTPException` (`RemoteDisconnected`, `BadStatusLine`, `LineTooLong`,
`IncompleteRead`) for what the server sent, `ValueError` for a header we cannot send.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import select
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Protocol
from urllib.parse import urlsplit

import gevent
import gevent.lock
import gevent.socket
import gevent.ssl

from agent.errors import ResponseTooLarge

__all__ = ["BLOCK", "MAX_HEAD", "MAX_HEADERS", "Exchange", "HTTPPool", "Response"]

# The most one read asks of the socket.
BLOCK = 64 * 1024
# The most a response's head (status line and headers, or a chunked body's trailers) may hold.
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
# A chunk's size line: hex digits and extensions nobody sends.
_MAX_SIZE_LINE = 1024
# A stream read without ever waiting (the data was always there) lets the hub run this often.
_YIELD_BYTES = 1024 * 1024

# What a kept-alive connection the server closed while it was idle fails with, before any answer.
_STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_STATUS = re.compile(rb"HTTP/1\.([01]) (\d{3})(?: ([^\r\n]*))?\r?")

# Body framings.
_LENGTH, _CHUNKED, _TO_CLOSE = 0, 1, 2
# Where a chunked body is.
_SIZE, _DATA, _DATA_END, _TRAILER, _DONE = 0, 1, 2, 3, 4


class _Slots(Protocol):
    def acquire(self) -> object: ...

    def release(self) -> object: ...


class _Connection:
    """A socket to the origin and the bytes received on it that nothing has read yet."""

    __slots__ = ("cooperative", "generation", "idle_since", "rest", "sock")

    def __init__(self, sock: socket.socket, generation: int, cooperative: bool) -> None:
        self.sock = sock
        self.rest = b""
        self.generation = generation  # the pool's when made: one made before `close()` goes
        self.cooperative = cooperative
        self.idle_since = 0.0

    def recv(self) -> bytes:
        return self.sock.recv(BLOCK)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def dropped(self) -> bool:
        """True when the idle connection is readable: the server closed it (or sent what
        nobody asked for); either way it cannot carry the next exchange."""
        if self.rest:
            return True
        try:
            if hasattr(select, "poll"):
                poller = select.poll()
                poller.register(self.sock.fileno(), select.POLLIN)
                return bool(poller.poll(0))
            readable, _, _ = select.select([self.sock], [], [], 0)
            return bool(readable)
        except (OSError, ValueError):
            return True


_contexts: dict[bool, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def _default_context(cooperative: bool) -> ssl.SSLContext:
    """The default verified TLS context (the server's certificate and name checked against
    the system's certificates), made once per kind: making one loads those certificates,
    milliseconds not worth spending per pool. For gevent sockets it must be gevent's
    `SSLContext` class: `gevent.ssl.create_default_context` is the standard library's function
    and returns a standard context, whose sockets block the hub."""
    with _contexts_lock:
        context = _contexts.get(cooperative)
        if context is None:
            if cooperative:
                context = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.load_default_certs()
            else:
                context = ssl.create_default_context()
            _contexts[cooperative] = context
        return context


def _head_of(conn: _Connection) -> bytes:
    """The next head on the connection (through its blank line); what followed stays in
    `conn.rest`. Linear: each received byte is searched once (from 3 before the new bytes),
    and the head grows in a `bytearray`."""
    data = bytearray(conn.rest)
    start = 0
    while True:
        crlf = data.find(b"\r\n\r\n", start)
        bare = data.find(b"\n\n", start)  # a server that ends its lines with LF alone
        if crlf >= 0 and not 0 <= bare < crlf:
            end = crlf + 4
        elif bare >= 0:
            end = bare + 2
        else:
            end = 0
        if end > MAX_HEAD or (not end and len(data) > MAX_HEAD):
            raise http.client.LineTooLong(f"a response head of more than {MAX_HEAD} bytes")
        if end:
            conn.rest = bytes(data[end:])
            return bytes(data[:end])
        more = conn.recv()
        if not more:
            if data:
                raise http.client.IncompleteRead(bytes(data))
            raise http.client.RemoteDisconnected("the server closed the connection unanswered")
        start = max(0, len(data) - 3)
        data += more


def _fields(lines: list[bytes], what: str) -> dict[str, str]:
    """Header (or trailer) lines as a dict of lower-case names; repeated ones joined by ", "."""
    if len(lines) > MAX_HEADERS:
        raise http.client.HTTPException(f"more than {MAX_HEADERS} {what}")
    fields: dict[str, str] = {}
    for raw in lines:
        name, sep, value = raw.decode("latin-1").partition(":")
        name = name.strip().lower()
        if not sep or not name:
            raise http.client.HTTPException(f"a malformed {what[:-1]} line: {raw[:100]!r}")
        value = value.strip()
        fields[name] = f"{fields[name]}, {value}" if name in fields else value
    return fields


class Response:
    """The status, headers and body of one answer; the body is read as it arrives."""

    __slots__ = (
        "_chunk_left",
        "_conn",
        "_framing",
        "_left",
        "_state",
        "complete",
        "headers",
        "reason",
        "received",
        "status",
        "will_close",
    )

    def __init__(self, conn: _Connection, head_only: bool = False) -> None:
        while True:
            head = _head_of(conn)
            lines = head.split(b"\n")
            match = _STATUS.fullmatch(lines[0])
            if match is None:
                raise http.client.BadStatusLine(lines[0][:100].decode("latin-1"))
            status = int(match.group(2))
            if not 100 <= status < 200 or status == 101:
                break  # an interim 1xx answer is followed by the real one
        self._conn = conn
        self.status = status
        self.reason = (match.group(3) or b"").decode("latin-1")
        self.headers = _fields([line.rstrip(b"\r") for line in lines[1:-2]], "headers")
        connection = self.headers.get("connection", "").lower()
        self.will_close = "close" in connection or (
            match.group(1) == b"0" and "keep-alive" not in connection
        )
        self.received = 0  # bytes of body handed over so far
        self.complete = False  # the body was read to its end
        self._state = _SIZE
        self._chunk_left = 0
        self._left = 0
        coding = self.headers.get("transfer-encoding", "").lower()
        length = self.headers.get("content-length")
        if head_only or status in (101, 204, 304):
            self._framing, self.complete = _LENGTH, True
        elif coding:
            if coding.rsplit(",", 1)[-1].strip() != "chunked":
                raise http.client.HTTPException(f"unsupported transfer-encoding {coding!r}")
            self._framing = _CHUNKED
        elif length is not None:
            if not length.isdigit():
                raise http.client.HTTPException(f"a malformed content-length {length!r}")
            self._framing, self._left = _LENGTH, int(length)
            self.complete = self._left == 0
        else:
            self._framing, self.will_close = _TO_CLOSE, True

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def read1(self, n: int = BLOCK) -> bytes:
        """What has arrived of the body (everything decodable, at most about `n` bytes), or,
        when nothing has, what one read of the socket brings. b"" at the end;
        `http.client.IncompleteRead` when the connection closed before the body's end."""
        if self.complete:
            return b""
        data = self._read_chunked(n) if self._framing == _CHUNKED else self._read_plain(n)
        self.received += len(data)
        return data

    def _read_plain(self, n: int) -> bytes:
        conn = self._conn
        data = conn.rest or conn.recv()
        if self._framing == _LENGTH:
            if not data:
                raise http.client.IncompleteRead(b"", self._left)
            take = min(n, self._left)
            data, conn.rest = data[:take], data[take:]
            self._left -= len(data)
            self.complete = self._left == 0
        else:
            take = min(n, len(data))
            data, conn.rest = data[:take], data[take:]
            self.complete = not data
        return data

    def _read_chunked(self, n: int) -> bytes:
        conn = self._conn
        out: list[bytes] = []
        size = 0
        while True:
            buf, pos = conn.rest, 0
            end = len(buf)
            while pos < end and size < n:
                state = self._state
                if state == _DATA:
                    take = min(self._chunk_left, end - pos, n - size)
                    out.append(buf[pos : pos + take])
                    pos += take
                    size += take
                    self._chunk_left -= take
                    if not self._chunk_left:
                        self._state = _DATA_END
                    continue
                eol = buf.find(b"\n", pos)
                if eol < 0:
                    if end - pos > (_MAX_SIZE_LINE if state != _TRAILER else MAX_HEAD):
                        raise http.client.LineTooLong("a chunk size or trailer line")
                    break
                line = buf[pos:eol].rstrip(b"\r")
                pos = eol + 1
                if state == _DATA_END:
                    if line:
                        raise http.client.IncompleteRead(b"", 0)  # framing lost
                    self._state = _SIZE
                elif state == _SIZE:
                    digits = line.split(b";", 1)[0].strip()
                    try:
                        if len(digits) > 16:
                            raise ValueError(digits)
                        chunk = int(digits, 16)
                    except ValueError:
                        raise http.client.IncompleteRead(b"", 0) from None  # framing lost
                    if chunk:
                        self._chunk_left, self._state = chunk, _DATA
                    else:
                        self._state = _TRAILER
                elif not line:  # the blank line after the trailers: the body's end
                    self._state = _DONE
                    self.complete = True
                    break
                else:  # a trailer, not kept; all of them within the bound of a head
                    self._left += len(line)
                    if self._left > MAX_HEAD:
                        raise http.client.LineTooLong(f"trailers of more than {MAX_HEAD} bytes")
            conn.rest = buf[pos:]
            if out or self.complete:
                return b"".join(out)
            more = conn.recv()
            if not more:
                raise http.client.IncompleteRead(b"", self._chunk_left or None)
            conn.rest += more

    def read(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body (all of it when it is shorter)."""
        out = bytearray()
        while len(out) < limit:
            data = self.read1(limit - len(out))
            if not data:
                break
            out += data
        return bytes(out)

    def lines(self, max_line: int, max_body: int) -> Iterator[bytes]:
        """Each line of the body (without its b"\\n") as soon as it is complete, then whatever
        followed the last newline when the body ends.

        Linear in the bytes received: each read's bytes are searched for newlines once, and an
        unfinished line waits in a buffer that only grows. Raises `ResponseTooLarge` once a line
        runs past `max_line` bytes, or the body past `max_body`, as the bytes arrive.
        """
        pending = bytearray()
        pause_at = _YIELD_BYTES
        while True:
            data = self.read1(BLOCK)
            if self.received > max_body:
                raise ResponseTooLarge("body", max_body, self.received)
            if self.received >= pause_at:
                # A socket that always has data never waits, so never yields: let the hub run.
                pause_at = self.received + _YIELD_BYTES
                if self._conn.cooperative:
                    gevent.sleep(0)
            if not data:
                if pending:
                    yield bytes(pending)
                return
            if b"\n" not in data:  # the middle of a long line: kept, never searched again
                if len(pending) + len(data) > max_line:
                    raise ResponseTooLarge("line", max_line, self.received)
                pending += data
                continue
            lines = data.split(b"\n")
            if pending:
                lines[0] = bytes(pending) + lines[0]
                pending.clear()
            tail = lines.pop()
            if len(tail) > max_line or max(map(len, lines)) > max_line:
                raise ResponseTooLarge("line", max_line, self.received)
            pending += tail
            yield from lines


class Exchange:
    """One request and its answer on a pooled connection (see the module doc)."""

    __slots__ = ("_conn", "_cut", "_pool", "response")

    def __init__(self, pool: HTTPPool) -> None:
        self._pool = pool
        self._conn: _Connection | None = None
        self._cut = False
        self.response: Response | None = None

    def __enter__(self) -> Exchange:
        self._pool.slots.acquire()
        return self

    def request(self, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> Response:
        """Send the request; the answer once its status line and headers arrived."""
        message = self._pool.message(method, path, body, headers)
        for attempt in (1, 2):
            if self._cut:
                raise TimeoutError("the exchange was cut before it started")
            conn, reused = self._pool.take()
            self._conn = conn
            try:
                conn.sock.sendall(message)
                response = Response(conn, head_only=method == "HEAD")
            except _STALE:
                self._conn = None
                conn.close()
                if reused and attempt == 1:
                    continue  # the server had closed it while idle: once more, on a new one
                raise
            except BaseException:
                self._conn = None
                conn.close()
                raise
            self.response = response
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    def cut(self) -> None:
        """Shut the connection down from another thread (a deadline): the blocked read ends."""
        self._cut = True
        conn = self._conn
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn, self._conn = self._conn, None
        response = self.response
        try:
            if conn is None:
                return
            reusable = response is not None and response.complete and not response.will_close
            if reusable and not self._cut and not conn.rest:
                self._pool.give_back(conn)
            else:
                conn.close()
        finally:
            self._pool.slots.release()


class HTTPPool:
    """Kept-alive HTTP/1.1 connections to the origin of `url` (see the module doc)."""

    def __init__(
        self,
        url: str,
        *,
        max_connections: int = 64,
        connect_timeout: float = 10.0,
        read_timeout: float = 60.0,
        cooperative: bool = True,
        tls_context: ssl.SSLContext | None = None,
        max_idle: float = 60.0,
    ) -> None:
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"not an http(s) URL: {url!r}: {exc}") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        if isinstance(max_connections, bool) or not isinstance(max_connections, int):
            raise TypeError("max_connections must be an int")
        if max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if isinstance(max_idle, bool) or not isinstance(max_idle, (int, float)):
            raise TypeError("max_idle must be a number of seconds")
        if not max_idle >= 0:
            raise ValueError("max_idle must be >= 0")
        if tls_context is not None:
            # A standard-library context would wrap a gevent socket in a blocking one.
            kind = gevent.ssl.SSLContext if cooperative else ssl.SSLContext
            if not isinstance(tls_context, kind):
                raise TypeError(f"tls_context must be a {kind.__module__}.SSLContext here")
        self._tls_context = tls_context
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        default = http.client.HTTPS_PORT if self.tls else http.client.HTTP_PORT
        self.port = port or default
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.cooperative = cooperative
        self.max_idle = max_idle
        self.connections_made = 0
        self.slots: _Slots = (
            gevent.lock.BoundedSemaphore(max_connections)
            if cooperative
            else threading.BoundedSemaphore(max_connections)
        )
        self._idle: deque[_Connection] = deque()
        self._generation = 0
        host = f"[{self.host}]" if ":" in self.host else self.host
        authority = host if self.port == default else f"{host}:{self.port}"
        self._fixed = f"Host: {authority}\r\nAccept-Encoding: identity\r\n"
        self._create: Callable[..., socket.socket] = (
            gevent.socket.create_connection if cooperative else socket.create_connection
        )

    def __repr__(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"<HTTPPool {scheme}://{self.host}:{self.port}>"

    def exchange(self) -> Exchange:
        return Exchange(self)

    def message(self, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
        """The request's bytes: its head and body, written at once (one segment when small)."""
        if not _TOKEN.fullmatch(method) or not path.startswith("/") or _bad(path):
            raise ValueError(f"cannot send {method!r} {path!r}")
        head = [f"{method} {path} HTTP/1.1\r\n", self._fixed]
        for name, value in headers.items():
            if not _TOKEN.fullmatch(name) or _bad(value):
                raise ValueError(f"cannot send the header {name!r}: {value!r}")
            head.append(f"{name}: {value}\r\n")
        head.append(f"Content-Length: {len(body)}\r\n\r\n")
        return "".join(head).encode("latin-1") + body

    def take(self) -> tuple[_Connection, bool]:
        """An idle connection that is still open (True), else a new one."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if now - conn.idle_since >= self.max_idle:
                self._close_idle(conn)  # the most recent is too old: so are the others
                break
            if not conn.dropped():
                return conn, True
            conn.close()
        return self._connect(), False

    def _connect(self) -> _Connection:
        sock = self._create((self.host, self.port), self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls:  # the handshake is bounded by the connect timeout too
                context = self._tls_context or _default_context(self.cooperative)
                sock = context.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self.read_timeout)
        except BaseException:
            sock.close()
            raise
        self.connections_made += 1
        return _Connection(sock, self._generation, self.cooperative)

    def give_back(self, conn: _Connection) -> None:
        if conn.generation != self._generation:
            conn.close()
        else:
            conn.idle_since = time.monotonic()
            self._idle.append(conn)

    def close(self) -> None:
        """Close the idle connections; the ones in use close as their exchanges end (a later
        exchange opens a new one)."""
        self._generation += 1
        self._close_idle()

    def _close_idle(self, *also: _Connection) -> None:
        for conn in also:
            conn.close()
        while self._idle:
            self._idle.pop().close()


def _bad(text: str) -> bool:
    """A header value or path that would end the line or the head early."""
    return "\r" in text or "\n" in text or "\0" in text
