"""The runtime's HTTP/1.1 client (agent/http_client.py) against a raw server on 127.0.0.1 that
sends exactly the bytes each test gives it."""

from __future__ import annotations

import gc
import http.client
import ssl
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import gevent
import gevent.ssl
import pytest
from gevent.server import StreamServer
from gevent.socket import socket as Socket
from openai_stub import read_request

from agent.errors import ResponseTooLarge
from agent.http_client import BLOCK, MAX_HEAD, HTTPPool, Response
from supervision.offload import offload

Answer = Callable[[Socket, bytes], None]


class RawServer:
    """Reads each request (head and Content-Length body), then calls the next answer."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[bytes] = []
        self.connections = 0
        self._server = StreamServer(("127.0.0.1", 0), self._handle)
        self._server.start()
        self.url = f"http://127.0.0.1:{self._server.server_port}"

    def _handle(self, sock: Socket, _addr: object) -> None:
        self.connections += 1
        buf = b""
        try:
            while self.answers:
                read = read_request(sock, buf)
                if read is None:
                    return
                head, body, buf = read
                self.requests.append(head + b"\r\n\r\n" + body)
                self.answers.pop(0)(sock, head)
        except OSError:
            pass
        finally:
            sock.close()

    def close(self) -> None:
        self._server.stop(timeout=1)


def send(data: bytes, close: bool = False) -> Answer:
    def answer(sock: Socket, _head: bytes) -> None:
        sock.sendall(data)
        if close:
            sock.close()

    return answer


@pytest.fixture
def pools() -> Iterator[list[HTTPPool]]:
    made: list[HTTPPool] = []
    yield made
    for pool in made:
        pool.close()


def _pool(server: RawServer, pools: list[HTTPPool], **kw: object) -> HTTPPool:
    pool = HTTPPool(server.url, read_timeout=10, **kw)  # type: ignore[arg-type]
    pools.append(pool)
    return pool


def _get(pool: HTTPPool, limit: int = 1 << 20) -> tuple[Response, bytes]:
    with pool.exchange() as exchange:
        response = exchange.request("POST", "/p", b"body", {"X-One": "1"})
        return response, response.read(limit)


def test_the_request_is_one_well_formed_message(pools: list[HTTPPool]) -> None:
    server = RawServer(send(b"HTTP/1.1 204 No Content\r\n\r\n"))
    try:
        response, body = _get(_pool(server, pools))
    finally:
        server.close()
    host = server.url.removeprefix("http://")
    assert server.requests == [
        b"POST /p HTTP/1.1\r\nHost: " + host.encode() + b"\r\nAccept-Encoding: identity\r\n"
        b"X-One: 1\r\nContent-Length: 4\r\n\r\nbody"
    ]
    assert (response.status, response.reason, body, response.complete) == (
        204,
        "No Content",
        b"",
        True,
    )


@pytest.mark.parametrize(
    ("name", "value"), [("X-Bad", "a\r\nInjected: 1"), ("Bad Name", "v"), ("X-Nul", "a\0b")]
)
def test_a_header_that_would_break_the_message_is_refused(
    pools: list[HTTPPool], name: str, value: str
) -> None:
    server = RawServer()
    try:
        pool = _pool(server, pools)
        with pytest.raises(ValueError, match="cannot send"), pool.exchange() as exchange:
            exchange.request("POST", "/p", b"", {name: value})
    finally:
        server.close()
    assert server.requests == []


def test_chunks_with_extensions_and_trailers_then_the_connection_is_kept(
    pools: list[HTTPPool],
) -> None:
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Multi: a\r\nx-multi: b\r\n\r\n"
        b"5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nTrailer: t\r\n\r\n"
    )
    server = RawServer(send(chunked), send(chunked))
    try:
        pool = _pool(server, pools)
        for _ in range(2):
            response, body = _get(pool)
            assert body == b"hello world" and response.complete and response.received == 11
            assert response.header("X-MULTI") == "a, b"
    finally:
        server.close()
    assert server.connections == 1


def test_a_content_length_body_an_interim_answer_and_lf_only_lines(pools: list[HTTPPool]) -> None:
    server = RawServer(
        send(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc"),
        send(b"HTTP/1.1 200 OK\nContent-Length: 2\n\nde"),
    )
    try:
        pool = _pool(server, pools)
        assert _get(pool)[1] == b"abc"
        response, body = _get(pool)
        assert (response.status, body) == (200, b"de")
    finally:
        server.close()
    assert server.connections == 1


def test_an_answer_read_to_its_end_is_no_reference_cycle(pools: list[HTTPPool]) -> None:
    """llhttp's parser holds the response (its callbacks): dropped at the answer's end, so a
    model call leaves nothing for the cyclic collector."""
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
    server = RawServer(send(chunked))
    try:
        response, body = _get(_pool(server, pools))
    finally:
        server.close()
    assert body == b"abc" and response.complete
    # The parser keeps its callbacks as bound methods of the response: none may be left.
    callbacks = [r for r in gc.get_referrers(response) if getattr(r, "__self__", None) is response]
    assert callbacks == []


def test_a_head_of_lf_lines_is_not_cut_at_a_crlf_pair_in_its_body(pools: list[HTTPPool]) -> None:
    server = RawServer(send(b"HTTP/1.1 200 OK\nContent-Length: 6\n\nab\r\n\r\n"))
    try:
        response, body = _get(_pool(server, pools))
    finally:
        server.close()
    assert (response.header("content-length"), body) == ("6", b"ab\r\n\r\n")


def test_a_head_dribbled_a_byte_at_a_time_is_read(pools: list[HTTPPool]) -> None:
    head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Long: " + b"v" * 5000 + b"\r\n\r\nok"

    def dribble(sock: Socket, _head: bytes) -> None:
        for at in range(len(head)):
            sock.sendall(head[at : at + 1])
            if at % 256 == 0:
                gevent.idle()  # the client reads what came so far

    server = RawServer(dribble)
    try:
        response, body = _get(_pool(server, pools))
    finally:
        server.close()
    assert body == b"ok" and response.header("x-long") == "v" * 5000


def test_a_body_to_the_connections_end_is_complete_and_the_connection_not_kept(
    pools: list[HTTPPool],
) -> None:
    server = RawServer(
        send(b"HTTP/1.0 200 OK\r\n\r\nuntil the end", close=True), send(b"HTTP/1.1 204 -\r\n\r\n")
    )
    try:
        pool = _pool(server, pools)
        response, body = _get(pool)
        assert body == b"until the end" and response.complete and response.will_close
        assert _get(pool)[0].status == 204
    finally:
        server.close()
    assert server.connections == 2


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort", http.client.IncompleteRead),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab",
            http.client.IncompleteRead,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            http.client.IncompleteRead,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
            http.client.IncompleteRead,
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 2000,
            http.client.LineTooLong,
        ),
    ],
)
def test_a_broken_body_is_an_error_and_its_connection_is_not_kept(
    pools: list[HTTPPool], answer: bytes, error: type[Exception]
) -> None:
    server = RawServer(send(answer, close=True), send(b"HTTP/1.1 204 -\r\n\r\n"))
    try:
        pool = _pool(server, pools)
        with pytest.raises(error):
            _get(pool)
        assert _get(pool)[0].status == 204
    finally:
        server.close()
    assert server.connections == 2


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * (MAX_HEAD + 10), http.client.LineTooLong),
        (b"HTTP/1.1 200 OK\r\n" + b"X: 1\r\n" * 101 + b"\r\n", http.client.HTTPException),
        (b"SSH-2.0-OpenSSH\r\n\r\n", http.client.BadStatusLine),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", http.client.HTTPException),
        (b"HTTP/1.1 200 OK\r\nContent-Le", http.client.IncompleteRead),
        # A head that ends, but past its bound (sent at once: it ends in the read that passes it).
        (
            b"HTTP/1.1 200 OK\r\n" + (b"X: " + b"a" * 1000 + b"\r\n") * 70 + b"\r\n",
            http.client.LineTooLong,
        ),
        # Two framings at once: which one a proxy on the way believed is unknown (smuggling).
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
            http.client.HTTPException,
        ),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", http.client.HTTPException),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            http.client.HTTPException,
        ),
    ],
)
def test_a_head_past_its_bounds_or_malformed_is_refused(
    pools: list[HTTPPool], answer: bytes, error: type[Exception]
) -> None:
    server = RawServer(send(answer, close=True))
    try:
        with pytest.raises(error):
            _get(_pool(server, pools))
    finally:
        server.close()


def test_a_body_read_in_small_pieces_is_whole_and_complete_only_at_its_end(
    pools: list[HTTPPool],
) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
    server = RawServer(send(chunked), send(chunked))
    try:
        pool = _pool(server, pools)
        with pool.exchange() as exchange:
            response = exchange.request("POST", "/", b"", {})
            pieces = [response.read1(2)]
            assert not response.complete  # the rest was decoded but is not handed over yet
            while piece := response.read1(2):
                pieces.append(piece)
            assert pieces == [b"he", b"ll", b"o"] and response.complete
            assert response.received == 5
        assert _get(pool)[1] == b"hello"
    finally:
        server.close()
    assert server.connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\n",  # unasked for
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\x00garbage",
        b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\nUpgrade: x\r\n\r\nnot http",
    ],
)
def test_a_connection_that_carried_more_than_the_answer_is_not_kept(
    pools: list[HTTPPool], answer: bytes
) -> None:
    server = RawServer(send(answer), send(b"HTTP/1.1 204 -\r\n\r\n"))
    try:
        pool = _pool(server, pools)
        response, body = _get(pool)
        assert response.complete and response.will_close
        assert body == (b"" if response.status == 101 else b"ok")
        assert _get(pool)[0].status == 204
    finally:
        server.close()
    assert server.connections == 2


def test_an_answer_to_head_has_no_body(pools: list[HTTPPool]) -> None:
    server = RawServer(send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"))
    try:
        with _pool(server, pools).exchange() as exchange:
            response = exchange.request("HEAD", "/", b"", {})
            assert response.read(100) == b"" and response.complete
            assert response.header("content-length") == "5"
    finally:
        server.close()


def test_trailers_past_the_bound_of_a_head_are_refused(pools: list[HTTPPool]) -> None:
    trailers = (b"T: " + b"t" * 1000 + b"\r\n") * 70
    answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\n" + trailers
    server = RawServer(send(answer + b"\r\n"))
    try:
        with pytest.raises(http.client.LineTooLong, match="trailers"):
            _get(_pool(server, pools))
    finally:
        server.close()


class _Endless:
    """A chunked answer whose body, after `prefix`, never ends: a chunk extension or a trailer
    value without a line end, sent as fast as the client reads, up to `cap` bytes."""

    def __init__(self, prefix: bytes, cap: int = 64 << 20) -> None:
        self.prefix = prefix
        self.cap = cap
        self.sent = 0

    def __call__(self, sock: Socket, _head: bytes) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + self.prefix)
        piece = b"e" * BLOCK
        while self.sent < self.cap:  # an OSError (the client closed) ends it
            sock.sendall(piece)
            self.sent += len(piece)


@pytest.mark.parametrize(
    "prefix", [b"5;ext=", b"1\r\na\r\n5;x=", b"1\r\na\r\n0\r\nTrailer: ", b"0\r\nT: 1\r\nU: "]
)
def test_a_chunked_body_s_framing_without_end_is_refused_while_it_streams(
    pools: list[HTTPPool], prefix: bytes
) -> None:
    """llhttp reads extensions and trailers without a bound of its own (and holds a trailer's
    value): the client refuses them within a few blocks, long before the server is done."""
    endless = _Endless(prefix)
    server = RawServer(endless)
    try:
        with pytest.raises(http.client.LineTooLong, match="chunk size line"):
            _get(_pool(server, pools))
    finally:
        server.close()
    assert endless.sent < endless.cap


def _dribble(line: bytes, piece: int) -> Answer:
    """A chunked body of `line` sent `piece` bytes a chunk, then the end."""

    def answer(sock: Socket, _head: bytes) -> None:
        sock.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        parts = [line[at : at + piece] for at in range(0, len(line), piece)]
        for first in range(0, len(parts), 256):  # a write of 256 chunks, then the others' turn
            sock.sendall(
                b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts[first : first + 256])
            )
            gevent.sleep(0)
        sock.sendall(b"0\r\n\r\n")

    return answer


def test_lines_come_whole_across_any_cut_of_the_body(pools: list[HTTPPool]) -> None:
    text = b"one\r\ntwo\n\nthree is longer\nlast without end"
    server = RawServer(*[_dribble(text, n) for n in (1, 2, 3, 7, 64)])
    try:
        pool = _pool(server, pools)
        for _ in range(5):
            with pool.exchange() as exchange:
                response = exchange.request("POST", "/", b"", {})
                got = list(response.lines(100, 1000))
            assert got == [b"one\r", b"two", b"", b"three is longer", b"last without end"]
    finally:
        server.close()


def test_a_line_dribbled_without_an_end_is_refused_having_read_no_more_than_the_limit(
    pools: list[HTTPPool],
) -> None:
    """A byte a chunk (the worst case for a reader that searches its whole buffer each time):
    every byte is handed over once, and the line is refused as soon as it passes the limit."""
    limit = 20_000
    server = RawServer(_dribble(b"x" * (4 * limit), 1))
    try:
        pool = _pool(server, pools)
        with pool.exchange() as exchange:
            response = exchange.request("POST", "/", b"", {})
            with pytest.raises(ResponseTooLarge) as raised:
                list(response.lines(limit, 10 * limit))
    finally:
        server.close()
    assert raised.value.what == "line" and raised.value.limit == limit
    assert limit < raised.value.received == response.received <= limit + BLOCK


def test_a_body_past_its_bound_is_refused_as_bytes_arrive(pools: list[HTTPPool]) -> None:
    server = RawServer(_dribble(b"x\n" * 50_000, 999))
    try:
        pool = _pool(server, pools)
        with pool.exchange() as exchange:
            response = exchange.request("POST", "/", b"", {})
            with pytest.raises(ResponseTooLarge) as raised:
                list(response.lines(100, 10_000))
    finally:
        server.close()
    assert raised.value.what == "body" and 10_000 < raised.value.received <= 10_000 + BLOCK


def test_pool_close_closes_idle_connections_and_the_pool_still_serves(
    pools: list[HTTPPool],
) -> None:
    ok = b"HTTP/1.1 204 -\r\n\r\n"
    server = RawServer(send(ok), send(ok), send(ok))
    try:
        pool = _pool(server, pools)
        _get(pool)
        with pool.exchange() as exchange:  # in use across the close: not kept after it
            exchange.request("POST", "/", b"", {})
            pool.close()
        _get(pool)
    finally:
        server.close()
    # The kept connection served the first two; the one in use during the close was not kept.
    assert server.connections == 2 and pool.connections_made == 2 and len(server.requests) == 3


def test_a_connection_idle_past_max_idle_is_not_used(pools: list[HTTPPool]) -> None:
    ok = b"HTTP/1.1 204 -\r\n\r\n"
    server = RawServer(send(ok), send(ok), send(ok), send(ok))
    try:
        fresh = _pool(server, pools, max_idle=0)  # no idle time at all: never reused
        _get(fresh)
        _get(fresh)
        assert fresh.connections_made == 2
        kept = _pool(server, pools)  # the default (60 s): reused
        _get(kept)
        _get(kept)
        assert kept.connections_made == 1
    finally:
        server.close()
    assert server.connections == 3


def test_bad_urls_and_bounds_are_refused() -> None:
    for url in ("ftp://x", "http://", "http://[::1", "http://h:99999"):
        with pytest.raises(ValueError, match="not an http"):
            HTTPPool(url)
    with pytest.raises(ValueError, match="max_connections"):
        HTTPPool("http://h", max_connections=0)
    with pytest.raises(TypeError, match="max_connections"):
        HTTPPool("http://h", max_connections=True)
    with pytest.raises(ValueError, match="max_idle"):
        HTTPPool("http://h", max_idle=-1)
    with pytest.raises(TypeError, match="max_idle"):
        HTTPPool("http://h", max_idle="60")  # type: ignore[arg-type]


def test_a_thread_with_plain_sockets_can_cut_its_exchange() -> None:
    """`cooperative=False` (the OTLP exporter's thread): a deadline from another thread cuts a
    read that would otherwise wait for the read timeout."""
    listener = __import__("socket").socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    pool = HTTPPool(f"http://127.0.0.1:{listener.getsockname()[1]}", cooperative=False)
    outcome: list[BaseException] = []

    def post() -> None:
        try:
            with pool.exchange() as exchange:
                timer = threading.Timer(0.2, exchange.cut)
                timer.start()
                exchange.request("POST", "/", b"", {})
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=post)
    thread.start()
    offload(thread.join, 20)
    listener.close()
    pool.close()
    assert len(outcome) == 1 and isinstance(outcome[0], (OSError, http.client.HTTPException))


def test_many_exchanges_wait_for_a_slot_cooperatively(pools: list[HTTPPool]) -> None:
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
    server = RawServer(*[send(ok)] * 8)
    try:
        pool = _pool(server, pools, max_connections=2)
        calls = [gevent.spawn(_get, pool) for _ in range(8)]
        assert [c.get(timeout=10)[1] for c in calls] == [b"ok"] * 8
    finally:
        server.close()
    assert server.connections <= 2


# --- TLS ------------------------------------------------------------------------------------------

TLS = Path(__file__).resolve().parent / "tls"  # a self-signed certificate for 127.0.0.1


def _tls_server() -> StreamServer:
    context = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # gevent's: a cooperative server
    context.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecret"
    raw = RawServer(*[send(ok)] * 3)
    raw.close()
    server = StreamServer(("127.0.0.1", 0), raw._handle, ssl_context=context)
    server.start()
    return server


def test_tls_verifies_the_server_by_default(pools: list[HTTPPool]) -> None:
    """Refused by the default context: the certificate is no system CA's."""
    server = _tls_server()
    try:
        pool = HTTPPool(f"https://127.0.0.1:{server.server_port}", read_timeout=10)
        pools.append(pool)
        with pytest.raises(ssl.SSLCertVerificationError):
            _get(pool)
    finally:
        server.stop(timeout=1)


def test_tls_with_a_context_that_trusts_the_server(pools: list[HTTPPool]) -> None:
    """The server runs on this hub: a client that blocked the hub in its handshake or reads
    (a standard-library TLS socket) would never be answered."""
    server = _tls_server()
    try:
        context = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.load_verify_locations(TLS / "cert.pem")
        pool = HTTPPool(
            f"https://127.0.0.1:{server.server_port}", read_timeout=10, tls_context=context
        )
        pools.append(pool)
        assert _get(pool)[1] == b"secret"
        assert _get(pool)[1] == b"secret"
        assert pool.connections_made == 1  # kept alive over TLS too
    finally:
        server.stop(timeout=1)
    with pytest.raises(TypeError, match=r"gevent\.ssl\.SSLContext"):
        HTTPPool("https://h", tls_context=ssl.create_default_context())
