"""The runtime's one HTTP/1.1 client: kept-alive connections to one origin, on the standard
library's `http.client`, over gevent sockets (or plain ones, for a thread with no hub).

The model adapters (`agent.models.http`) and the OTLP exporter (`subagent.otlp`) both post
through an `HTTPPool`. Why `http.client` rather than a third-party client: its `read1` hands over
what has arrived (at most one `recv`), so a streamed answer is read as it comes and cut into
lines here, each byte searched once; its chunked decoding is linear and its header parsing
bounded (65,536 bytes a line, 100 headers). geventhttpclient, used before, buffered a whole line
and searched that buffer from its start on every `recv`: a stream with no newline cost
quadratic CPU and unbounded memory (docs/decisions.md).

- `HTTPPool(url, max_connections=...)`: at most that many connections at once (a caller past
  the bound waits for a slot); idle ones are kept for the next exchange, the most recent first,
  and one the server has closed meanwhile is noticed before it is used.
- `pool.exchange()`: a context manager holding one slot; `request()` sends and returns the
  `Response` once its head arrived. Leaving the block puts the connection back when the body
  was read to its end and the server keeps it open, and closes it otherwise (a half-read body,
  a kill, an error), so a connection is never reused out of step.
- A request on a kept-alive connection that the server closed before answering (its idle
  timeout raced ours) is sent once more on a new connection; every other failure is the
  caller's (the model adapters' retries stay theirs).
- Timeouts: `connect_timeout` bounds the connect and the TLS handshake, `read_timeout` each
  later socket call. TLS is the default verified context (`gevent.ssl`'s for gevent sockets).
"""

from __future__ import annotations

import contextlib
import http.client
import select
import socket
import ssl
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Protocol
from urllib.parse import urlsplit

import gevent.lock
import gevent.socket
import gevent.ssl

from agent.errors import ResponseTooLarge

__all__ = ["BLOCK", "Exchange", "HTTPPool", "Response", "ResponseTooLarge"]

# The most one read asks of the socket.
BLOCK = 64 * 1024

# What a kept-alive connection the server closed while it was idle fails with, before any answer.
_STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)


class _Slots(Protocol):
    def acquire(self) -> object: ...

    def release(self) -> object: ...


class _Connection(http.client.HTTPConnection):
    """An HTTP/1.1 connection whose socket this module opens: gevent's or the standard one,
    wrapped in TLS when the pool has a context."""

    def __init__(
        self,
        host: str,
        port: int,
        connect_timeout: float,
        read_timeout: float,
        tls: ssl.SSLContext | None,
        cooperative: bool,
    ) -> None:
        super().__init__(host, port, timeout=connect_timeout)
        self.read_timeout = read_timeout
        self.tls = tls
        self.cooperative = cooperative
        self.generation = 0  # the pool's when made: one made before a `close()` is not kept

    def connect(self) -> None:
        create = gevent.socket.create_connection if self.cooperative else socket.create_connection
        sock = create((self.host, self.port), self.timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:  # the handshake is bounded by the connect timeout too
                sock = self.tls.wrap_socket(sock, server_hostname=self.host)
            sock.settimeout(self.read_timeout)
        except BaseException:
            sock.close()
            raise
        self.sock = sock


class _TLSConnection(_Connection):
    # The `Host` header leaves out the scheme's default port.
    default_port = http.client.HTTPS_PORT


def _dropped(sock: socket.socket | None) -> bool:
    """True when an idle connection is readable: the server closed it (or sent what nobody
    asked for); either way it cannot carry the next exchange."""
    if sock is None:
        return True
    try:
        if hasattr(select, "poll"):
            poller = select.poll()
            poller.register(sock.fileno(), select.POLLIN)
            return bool(poller.poll(0))
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable)
    except (OSError, ValueError):
        return True


_contexts: dict[bool, ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def _default_context(cooperative: bool) -> ssl.SSLContext:
    """The default verified TLS context, made once per kind (making one loads the system's
    certificates: milliseconds not worth spending per pool)."""
    with _contexts_lock:
        context = _contexts.get(cooperative)
        if context is None:
            maker = gevent.ssl.create_default_context if cooperative else ssl.create_default_context
            context = _contexts[cooperative] = maker()
        return context


class Response:
    """The status, headers and body of one answer; the body is read as it arrives."""

    __slots__ = ("_raw", "complete", "reason", "received", "status")

    def __init__(self, raw: http.client.HTTPResponse) -> None:
        self._raw = raw
        self.status = raw.status
        self.reason = raw.reason
        self.received = 0  # bytes of body handed over so far
        self.complete = False  # the body was read to its end

    def header(self, name: str) -> str | None:
        return self._raw.getheader(name)

    @property
    def will_close(self) -> bool:
        """The server ends the connection with this answer."""
        return bool(self._raw.will_close)

    def read1(self, n: int = BLOCK) -> bytes:
        """At most `n` bytes of the body, with at most one read of the socket: what has arrived
        (or the next piece to). b"" at the end; `http.client.IncompleteRead` when the
        connection closed before the body's end."""
        if self.complete:
            return b""
        raw = self._raw
        if raw.length == 0 and not raw.chunked:  # a Content-Length body, all read
            raw.close()
            self.complete = True
            return b""
        data = raw.read1(n)
        if data:
            self.received += len(data)
            return data
        if raw.length:  # the connection closed short of the Content-Length
            raise http.client.IncompleteRead(b"", raw.length)
        self.complete = True
        return b""

    def read(self, limit: int) -> bytes:
        """Up to `limit` bytes of the body (all of it when it is shorter)."""
        out = bytearray()
        while len(out) < limit:
            data = self.read1(min(BLOCK, limit - len(out)))
            if not data:
                break
            out += data
        return bytes(out)

    def lines(self, max_line: int, max_body: int) -> Iterator[bytes]:
        """Each line of the body (with its b"\\n") as soon as it is complete, then whatever
        followed the last newline when the body ends.

        Linear in the bytes received: each read's bytes are searched for a newline once, and an
        unfinished line waits in a buffer that only grows. Raises `ResponseTooLarge` once a line
        runs past `max_line` bytes, or the body past `max_body`, as the bytes arrive.
        """
        pending = bytearray()
        while True:
            data = self.read1(BLOCK)
            if self.received > max_body:
                raise ResponseTooLarge("body", max_body, self.received)
            if not data:
                if pending:
                    yield bytes(pending)
                return
            start = 0
            while True:
                end = data.find(b"\n", start) + 1
                if not end:
                    break
                if len(pending) + end - start > max_line:
                    raise ResponseTooLarge("line", max_line, self.received)
                if pending:
                    pending += memoryview(data)[start:end]
                    line = bytes(pending)
                    pending.clear()
                    yield line
                else:
                    yield data[start:end]
                start = end
            if start < len(data):
                if len(pending) + len(data) - start > max_line:
                    raise ResponseTooLarge("line", max_line, self.received)
                pending += memoryview(data)[start:]

    def close(self) -> None:
        self._raw.close()


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
        for attempt in (1, 2):
            if self._cut:
                raise TimeoutError("the exchange was cut before it started")
            conn, reused = self._pool.take()
            self._conn = conn
            try:
                conn.request(method, path, body, dict(headers))
                raw = conn.getresponse()
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
            self.response = Response(raw)
            return self.response
        raise AssertionError("unreachable")  # pragma: no cover

    def cut(self) -> None:
        """Shut the connection down from another thread (a deadline): the blocked read ends."""
        self._cut = True
        conn = self._conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

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
            if reusable and not self._cut:
                self._pool.give_back(conn)
                return
            if response is not None:
                response.close()
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
        self.host = parts.hostname
        self.tls = parts.scheme == "https"
        self.port = port or (http.client.HTTPS_PORT if self.tls else http.client.HTTP_PORT)
        self.max_connections = max_connections
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.cooperative = cooperative
        self.connections_made = 0
        self.slots: _Slots = (
            gevent.lock.BoundedSemaphore(max_connections)
            if cooperative
            else threading.BoundedSemaphore(max_connections)
        )
        self._idle: deque[_Connection] = deque()
        self._generation = 0

    def __repr__(self) -> str:
        scheme = "https" if self.tls else "http"
        return f"<HTTPPool {scheme}://{self.host}:{self.port}>"

    def exchange(self) -> Exchange:
        return Exchange(self)

    def take(self) -> tuple[_Connection, bool]:
        """An idle connection that is still open (True), else a new one, not yet connected."""
        while self._idle:
            conn = self._idle.pop()
            if not _dropped(conn.sock):
                return conn, True
            conn.close()
        kind = _TLSConnection if self.tls else _Connection
        context = _default_context(self.cooperative) if self.tls else None
        self.connections_made += 1
        conn = kind(
            self.host, self.port, self.connect_timeout, self.read_timeout, context, self.cooperative
        )
        conn.generation = self._generation
        return conn, False

    def give_back(self, conn: _Connection) -> None:
        if conn.generation != self._generation:
            conn.close()
        else:
            self._idle.append(conn)

    def close(self) -> None:
        """Close the idle connections; the ones in use close as their exchanges end (a later
        exchange opens a new one)."""
        self._generation += 1
        while self._idle:
            self._idle.pop().close()
