"""An OpenAI-compatible Chat Completions stub on 127.0.0.1, for the adapter tests.

A raw `gevent.server.StreamServer` (not pywsgi) so a behaviour controls every byte: it can send
malformed SSE, drop the connection mid-stream or hold a response until other requests arrive.
Each request takes the next queued behaviour, else the default one.
"""

from __future__ import annotations

import json
import ssl
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gevent.event import Event
from gevent.server import StreamServer
from gevent.socket import socket as Socket


@dataclass
class StubRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class Conn:
    """The response side of one request."""

    def __init__(self, sock: Socket) -> None:
        self.sock = sock
        self.keep_alive = True

    def head(self, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        lines = [f"HTTP/1.1 {status} X"]
        for k, v in (headers or {}).items():
            lines.append(f"{k}: {v}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())

    def chunk(self, data: bytes) -> None:
        if data:
            self.sock.sendall(b"%x\r\n%s\r\n" % (len(data), data))

    def end(self) -> None:
        self.sock.sendall(b"0\r\n\r\n")

    def event(self, data: str | Mapping[str, Any]) -> None:
        payload = data if isinstance(data, str) else json.dumps(data)
        self.chunk(f"data: {payload}\n\n".encode())

    def drop(self) -> None:
        """Close the connection without finishing the response."""
        self.keep_alive = False


Behaviour = Callable[[StubRequest, Conn], None]
SSE_HEAD = {"Content-Type": "text/event-stream", "Transfer-Encoding": "chunked"}


def _chunk(delta: Mapping[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": dict(delta), "finish_reason": finish}],
    }


def sse(events: Iterable[str | Mapping[str, Any]], *, done: bool = True) -> Behaviour:
    """A 200 event stream of exactly these `data:` payloads (strings are sent raw)."""
    items = list(events)

    def run(_req: StubRequest, conn: Conn) -> None:
        conn.head(200, SSE_HEAD)
        for e in items:
            conn.event(e)
        if done:
            conn.event("[DONE]")
        conn.end()

    return run


def text_events(
    parts: Iterable[str],
    finish: str | None = "stop",
    usage: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [_chunk({"role": "assistant", "content": ""})]
    events += [_chunk({"content": p}) for p in parts]
    events.append(_chunk({}, finish))
    if usage is not None:
        events.append({"id": "chatcmpl-stub", "choices": [], "usage": dict(usage)})
    return events


def stream_text(
    parts: Iterable[str] = ("Hel", "lo"),
    finish: str | None = "stop",
    usage: Mapping[str, int] | None = None,
) -> Behaviour:
    return sse(text_events(parts, finish, usage))


def tool_call_events(
    calls: Iterable[tuple[str, str, Iterable[str]]],
    content: str = "",
    finish: str | None = "tool_calls",
) -> list[dict[str, Any]]:
    """(id, name, argument fragments) per call; fragments of different calls interleave."""
    events: list[dict[str, Any]] = [_chunk({"role": "assistant", "content": content or None})]
    calls = list(calls)
    frags = [list(f) for _, _, f in calls]
    for i, (cid, name, _) in enumerate(calls):
        fn = {"name": name, "arguments": ""}
        events.append(
            _chunk({"tool_calls": [{"index": i, "id": cid, "type": "function", "function": fn}]})
        )
    for round_ in range(max((len(f) for f in frags), default=0)):
        for i, f in enumerate(frags):
            if round_ < len(f):
                tc = {"index": i, "function": {"arguments": f[round_]}}
                events.append(_chunk({"tool_calls": [tc]}))
    events.append(_chunk({}, finish))
    return events


def status(code: int, body: Any = None, headers: Mapping[str, str] | None = None) -> Behaviour:
    """A plain (non-streaming) response, e.g. 429 with Retry-After or a 500."""

    def run(_req: StubRequest, conn: Conn) -> None:
        if body is None:
            payload = b""
        elif isinstance(body, bytes):
            payload = body
        else:
            payload = json.dumps(body).encode()
        h = {"Content-Type": "application/json", "Content-Length": str(len(payload))}
        h.update(headers or {})
        conn.head(code, h)
        conn.sock.sendall(payload)

    return run


def drop_after(events: Iterable[str | Mapping[str, Any]]) -> Behaviour:
    """Start a stream, send `events`, then close the connection mid-response."""
    items = list(events)

    def run(_req: StubRequest, conn: Conn) -> None:
        conn.head(200, SSE_HEAD)
        for e in items:
            conn.event(e)
        conn.drop()

    return run


def drop_before_response() -> Behaviour:
    """Read the request, then close the connection without a byte of response."""

    def run(_req: StubRequest, conn: Conn) -> None:
        conn.drop()

    return run


class Gate:
    """Holds each request until `n` have arrived (or `timeout` passed: then it answers 400, so
    a missing concurrency shows as a failed request, not a hang)."""

    def __init__(self, n: int, then: Behaviour, timeout: float = 20.0) -> None:
        self.n = n
        self.arrived = 0
        self.opened = Event()
        self._then = then
        self._timeout = timeout

    def __call__(self, req: StubRequest, conn: Conn) -> None:
        self.arrived += 1
        if self.arrived >= self.n:
            self.opened.set()
        if not self.opened.wait(self._timeout):
            status(400, {"error": {"message": f"gate: only {self.arrived}/{self.n} arrived"}})(
                req, conn
            )
            return
        self._then(req, conn)


class Stall:
    """Sends the stream head (and `events`), then holds the response open until the client goes
    away; `client_gone` proves an abandoned request really closed its connection."""

    def __init__(self, events: Iterable[str | Mapping[str, Any]] = (), head: bool = True) -> None:
        self.events = list(events)
        self.head = head
        self.holding = Event()
        self.client_gone = Event()

    def __call__(self, _req: StubRequest, conn: Conn) -> None:
        if self.head:
            conn.head(200, SSE_HEAD)
            for e in self.events:
                conn.event(e)
        self.holding.set()
        try:
            while conn.sock.recv(4096):
                pass
        except OSError:
            pass
        self.client_gone.set()
        conn.drop()


def read_request(sock: Socket, buf: bytes) -> tuple[bytes, bytes, bytes] | None:
    """The next request on `sock` after the bytes `buf` already read: its head (without the
    blank line), its body (by `Content-Length`) and what came after it; None when the client
    closed the connection first."""
    while b"\r\n\r\n" not in buf:
        data = sock.recv(65536)
        if not data:
            return None
        buf += data
    head, buf = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(buf) < length:
        data = sock.recv(65536)
        if not data:
            return None
        buf += data
    return head, buf[:length], buf[length:]


@dataclass
class OpenAIStub:
    default: Behaviour = field(default_factory=stream_text)
    requests: list[StubRequest] = field(default_factory=list)
    queue: deque[Behaviour] = field(default_factory=deque)
    connections: int = 0
    # Serve https with this (server) context: a `gevent.ssl` one, so the stub stays cooperative.
    tls: ssl.SSLContext | None = None

    def __post_init__(self) -> None:
        if self.tls is None:
            self._server = StreamServer(("127.0.0.1", 0), self._handle)
        else:
            self._server = StreamServer(("127.0.0.1", 0), self._handle, ssl_context=self.tls)
        self._server.max_accept = 1000
        self._arrivals: list[tuple[int, Event]] = []

    def start(self) -> OpenAIStub:
        self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop(timeout=1)

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self._server.server_port}/v1"

    @property
    def scheme(self) -> str:
        return "http" if self.tls is None else "https"

    def enqueue(self, *behaviours: Behaviour) -> None:
        self.queue.extend(behaviours)

    def wait_for_requests(self, n: int, timeout: float = 10.0) -> bool:
        if len(self.requests) >= n:
            return True
        ev = Event()
        self._arrivals.append((n, ev))
        return bool(ev.wait(timeout))

    def _handle(self, sock: Socket, _addr: Any) -> None:
        self.connections += 1
        buf = b""
        try:
            while True:
                read = read_request(sock, buf)
                if read is None:
                    return
                head, raw, buf = read
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    k, _, v = line.partition(":")
                    headers[k.strip().lower()] = v.strip()
                body = json.loads(raw) if raw else None
                req = StubRequest(method, path, headers, body)
                self.requests.append(req)
                for n, ev in self._arrivals:
                    if len(self.requests) >= n:
                        ev.set()
                behaviour = self.queue.popleft() if self.queue else self.default
                conn = Conn(sock)
                behaviour(req, conn)
                if not conn.keep_alive:
                    return
        except OSError:
            return
        finally:
            sock.close()
