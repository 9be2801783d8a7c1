"""The runtime's one HTTP/1.1 client: kept-alive connections to one origin, over gevent sockets
(or plain ones, for a thread with no hub), with a body read as it arrives.

The model adapters (`agent.models.http`) and the OTLP exporter (`subagent.otlp`) both post
through an `HTTPPool`. Why a client of our own (docs/decisions.md, "One HTTP client"):
geventhttpclient, used before, buffered a whole line of a streamed answer and searched that
buffer from its start on every `recv`, so a stream with no newline cost quadratic CPU and
unbounded memory; the standard library's `http.client` reads linearly but spends Python calls
on every chunk of a chunked body and parses headers with the `email` package, ~25 % more CPU
per streamed model call than before. The pool, the requests, the keep-alive rules and the
bounds are this module's; a response's framing (status line, headers, a body by
`Content-Length`, `chunked` or the connection's end) is llhttp's, Node.js's parser, through
`httptools`: each received block goes through it once, in C, and its callbacks (`Response`)
keep what it hands over. It costs less CPU than the framing we wrote before it
(docs/performance.md, "The HTTP client's framing on llhttp").

- `Response.read1()` returns everything that has arrived (every complete chunk in the block
  decoded at once), or waits for one `recv`; `Response.lines()` cuts it into lines, searching
  each byte once, with a bound per line and per body counted as bytes arrive.
- Bounds on what a server can make us hold, enforced in llhttp's callbacks since it has none:
  a head of at most 64 KiB (a head not ended within 64 KiB received is refused) and 100
  headers; a chunked body's bytes other than data (size lines, extensions, trailers) at most
  1 KiB a chunk, with at most 64 KiB past that over the blocks since; trailers within 64 KiB.
- `HTTPPool(url, max_connections=...)`: at most that many connections at once (a caller past
  the bound waits for a slot); idle ones are kept, the most recent first, for at most
  `max_idle` seconds (a connection a NAT or a server dropped without a word would cost a whole
  read timeout), and one the server closed meanwhile is noticed (readable while idle) before
  it is used.
- `pool.exchange()`: a context manager holding one slot; `request()` sends the request in one
  write and returns the `Response` once its head arrived. Leaving the block keeps the
  connection when the body was read to its end and the server keeps it open, and closes it
  otherwise (a half-read body, a kill, an error, bytes after the answer, a `101`, an answer to
  `HEAD`: llhttp cannot be told it has no body): a connection is never reused out of step.
- A request on a kept-alive connection that the server closed before answering (its idle
  timeout raced ours) is sent once more on a new connection; every other failure is the
  caller's (the model adapters' retries stay theirs).
- Timeouts: `connect_timeout` bounds the connect and the TLS handshake, `read_timeout` each
  later socket call. TLS is the default verified context (`gevent.ssl`'s for gevent sockets),
  or the pool's `tls_context` (e.g. one that trusts a private CA).
- Proxies (`agent.http_proxy`): the pool's `proxy` URL, else the environment's
  (`HTTPS_PROXY`, `NO_PROXY`, ... as curl reads them) unless `trust_env=False`; an https
  origin through a `CONNECT` tunnel, bounded by `connect_timeout` with the handshake.

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
import httptools

from agent.errors import ResponseTooLarge
from agent.http_proxy import Proxy, open_tunnel, proxy_from_env

__all__ = ["BLOCK", "MAX_HEAD", "MAX_HEADERS", "Exchange", "HTTPPool", "Response"]

# The most one read asks of the socket.
BLOCK = 64 * 1024
# The most a response's head (status line and headers, or a chunked body's trailers) may hold.
MAX_HEAD = 64 * 1024
MAX_HEADERS = 100
# What a chunk may spend on its size line (hex digits, extensions nobody sends) and line ends.
_MAX_SIZE_LINE = 1024
# A stream read without ever waiting (the data was always there) lets the hub run this often.
_YIELD_BYTES = 1024 * 1024

# What a kept-alive connection the server closed while it was idle fails with, before any answer.
_STALE = (ConnectionResetError, BrokenPipeError, ConnectionAbortedError)
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


class _Slots(Protocol):
    def acquire(self) -> object: ...

    def release(self) -> object: ...


class _Connection:
    """A socket to the origin."""

    __slots__ = ("cooperative", "generation", "idle_since", "sock")

    def __init__(self, sock: socket.socket, generation: int, cooperative: bool) -> None:
        self.sock = sock
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


class _Stop(Exception):
    """Raised in a parser callback to stop llhttp where it is: the answer ended and more bytes
    followed (nobody asked for them)."""


class Response:
    """The status, headers and body of one answer; the body is read as it arrives.

    The framing is llhttp's (`httptools.HttpResponseParser`, fed each received block once, in
    C); this class is its callbacks: it keeps what llhttp hands over and enforces the bounds
    llhttp does not (the head's size and count, a chunked body's framing bytes, trailers), and
    names llhttp's errors as `http.client` does."""

    __slots__ = (
        "_body",
        "_conn",
        "_debt",
        "_done",
        "_error",
        "_fed",
        "_head_done",
        "_head_size",
        "_header_count",
        "_interim",
        "_parser",
        "_reason",
        "_to_close",
        "headers",
        "reason",
        "received",
        "status",
        "will_close",
    )

    def __init__(self, conn: _Connection, head_only: bool = False) -> None:
        self._conn = conn
        self.status = 0
        self.reason = ""
        self.headers: dict[str, str] = {}
        self.will_close = False
        self.received = 0  # bytes of body handed over so far
        self._body: list[bytes] = []  # decoded by llhttp, not handed over yet
        self._done = False  # llhttp saw the answer's end
        self._error: BaseException | None = None  # what a callback raised, to raise as is
        self._fed = 0  # bytes received before the head's end
        self._head_done = False
        self._head_size = 0  # the bytes of the head's (later: the trailers') lines
        self._header_count = 0
        self._interim = False  # a 1xx answer is being read: the real one follows
        self._reason: list[bytes] = []
        self._debt = -1  # framing bytes of a chunked body beyond its chunks' due (-1: not one)
        self._to_close = False  # the body ends with the connection
        parser = httptools.HttpResponseParser(self)
        self._parser: httptools.HttpResponseParser | None = parser
        parser.set_dangerous_leniencies(lenient_optional_cr_before_lf=True)  # LF-only lines
        while not self._head_done:
            data = conn.recv()
            if not data:
                if self._fed:
                    raise http.client.IncompleteRead(b"")
                raise http.client.RemoteDisconnected("the server closed the connection unanswered")
            self._fed += len(data)
            self._feed(data)
            if not self._head_done and self._fed > MAX_HEAD:
                raise http.client.LineTooLong(f"a response head of more than {MAX_HEAD} bytes")
        if head_only:
            # llhttp cannot be told that an answer to HEAD has no body, so where it ended in
            # what was received is unknown: the connection is not used again.
            self._done = self.will_close = True
            self._body.clear()
            self._parser = None

    # --- llhttp's callbacks (called from `feed_data`) -----------------------------------------

    def on_message_begin(self) -> None:
        if self._done:
            self.will_close = True
            self._fail(_Stop())

    def on_status(self, piece: bytes) -> None:
        self._reason.append(piece)  # in pieces when it spans reads
        self._head_size += len(piece)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4
        if self._head_size > MAX_HEAD:
            what = "trailers" if self._head_done else "a response head"
            self._fail(http.client.LineTooLong(f"{what} of more than {MAX_HEAD} bytes"))
        if self._head_done:  # a trailer, not kept
            return
        self._header_count += 1
        if self._header_count > MAX_HEADERS:
            self._fail(http.client.HTTPException(f"more than {MAX_HEADERS} headers"))
        headers = self.headers
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1").strip()
        headers[key] = f"{headers[key]}, {text}" if key in headers else text

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None  # a callback: llhttp is parsing
        status = parser.get_status_code()
        if 100 <= status < 200 and status != 101:  # an interim answer, followed by the real one
            self._interim = True
            self.headers, self._reason, self._head_size, self._header_count = {}, [], 0, 0
            return
        self.status = status
        self.reason = b"".join(self._reason).decode("latin-1").strip()
        self._head_done = True
        self._head_size = 0  # from here on: the trailers' lines
        # A 101 switched the connection to another protocol: never an HTTP connection again.
        self.will_close = status == 101 or not parser.should_keep_alive()
        coding = self.headers.get("transfer-encoding")
        if coding is not None:
            # llhttp reads any other last coding to the connection's end; we decode none.
            if coding.rsplit(",", 1)[-1].strip().lower() != "chunked":
                self._fail(http.client.HTTPException(f"unsupported transfer-encoding {coding!r}"))
            self._debt = 0
        elif "content-length" not in self.headers and status not in (204, 304):
            self._to_close = True

    def on_body(self, piece: bytes) -> None:
        self._body.append(piece)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
        else:
            self._done = True

    def _fail(self, error: BaseException) -> None:
        """Raise `error` out of the callback; `_feed` raises it again out of llhttp."""
        self._error = error
        raise error

    # --- reading ------------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        """Parse one received block; llhttp's errors named as `http.client` names them. Once
        the answer's end is seen the parser is dropped: it holds this object (its callbacks),
        and a cycle per answer would be left to the cyclic collector."""
        parser = self._parser
        if parser is None:  # the answer ended: nothing more is read
            return
        try:
            parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # after a 101: what follows is not HTTP
            self._done = True
        except httptools.HttpParserCallbackError as exc:
            error, self._error = self._error, None
            if isinstance(error, _Stop):
                return
            if error is None:  # pragma: no cover - every callback raises through `_fail`
                raise http.client.HTTPException(str(exc)) from None
            raise error from None
        except httptools.HttpParserError as exc:
            if not self._head_done:
                if not (self._reason or self._header_count or parser.get_status_code()):
                    raise http.client.BadStatusLine(repr(data[:100])) from None
                raise http.client.HTTPException(f"a malformed response head: {exc}") from None
            if "overflow" in str(exc):  # a chunk size of more hex digits than 64 bits hold
                raise http.client.LineTooLong("a chunk size line") from None
            raise http.client.IncompleteRead(b"", 0) from None  # the framing is lost
        finally:
            if self._done:
                self._parser = None

    @property
    def complete(self) -> bool:
        """The body was read to its end (llhttp saw its end, and all of it was handed over)."""
        return self._done and not self._body

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    def read1(self, n: int = BLOCK) -> bytes:
        """What has arrived of the body (everything decoded, at most about `n` bytes), or,
        when nothing has, what one read of the socket brings. b"" at the end;
        `http.client.IncompleteRead` when the connection closed before the body's end."""
        body = self._body
        while not body:
            if self._done:
                return b""
            data = self._conn.recv()
            if not data:
                if self._to_close:
                    self._done, self._parser = True, None
                    return b""
                raise http.client.IncompleteRead(b"", self._left())
            self._feed(data)
            if self._debt >= 0 and not self._done:
                self._bound_framing(len(data))
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        if len(data) > n:
            data, rest = data[:n], data[n:]
            body.append(rest)
        self.received += len(data)
        return data

    def _bound_framing(self, size: int) -> None:
        """Bound what llhttp reads of a chunked body without handing over anything (size lines,
        extensions, trailers: it holds none of it but a trailer being read): a block may hold
        `_MAX_SIZE_LINE` of those bytes a piece of data it held, and what runs past that, over
        the blocks since, at most `MAX_HEAD`. Without it an endless extension or trailer would
        be read for ever, uncounted by any bound."""
        body = self._body
        due = len(body) * (_MAX_SIZE_LINE + 4)  # `body` holds this block's pieces only
        self._debt = max(0, self._debt + size - sum(map(len, body)) - due)
        if self._debt > MAX_HEAD:
            raise http.client.LineTooLong("a chunk size line, extensions or trailers")

    def _left(self) -> int | None:
        """Bytes of a `Content-Length` body not received yet (for `IncompleteRead`)."""
        length = self.headers.get("content-length", "")
        return int(length) - self.received - sum(map(len, self._body)) if length.isdigit() else None

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
            if reusable and not self._cut:
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
        proxy: str | None = None,
        trust_env: bool = True,
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
        # `proxy` is used for every request; else, with `trust_env`, the environment's choice.
        if proxy is not None:
            self.proxy: Proxy | None = Proxy.parse(proxy, "proxy")
        elif trust_env:
            self.proxy = proxy_from_env(parts.scheme, self.host, self.port)
        else:
            self.proxy = None
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
        # An http origin through a proxy: requests in absolute form, credentials on each; an
        # https one goes through a tunnel (`_connect`) and its requests are the origin's own.
        self._target = ""
        if self.proxy is not None and not self.tls:
            self._target = f"http://{authority}"
            if self.proxy.authorization is not None:
                self._fixed += f"Proxy-Authorization: {self.proxy.authorization}\r\n"
        self._create: Callable[..., socket.socket] = (
            gevent.socket.create_connection if cooperative else socket.create_connection
        )

    def __repr__(self) -> str:
        scheme = "https" if self.tls else "http"
        via = "" if self.proxy is None else f" via {self.proxy.host}:{self.proxy.port}"
        return f"<HTTPPool {scheme}://{self.host}:{self.port}{via}>"

    def exchange(self) -> Exchange:
        return Exchange(self)

    def message(self, method: str, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
        """The request's bytes: its head and body, written at once (one segment when small)."""
        if not _TOKEN.fullmatch(method) or not path.startswith("/") or _bad(path):
            raise ValueError(f"cannot send {method!r} {path!r}")
        head = [f"{method} {self._target}{path} HTTP/1.1\r\n", self._fixed]
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
        proxy = self.proxy
        address = (self.host, self.port) if proxy is None else (proxy.host, proxy.port)
        sock = self._create(address, self.connect_timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls:  # the tunnel and the handshake are bounded by the connect timeout too
                if proxy is not None:
                    open_tunnel(sock, proxy, self.host, self.port)
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
