"""The HTTP client through a proxy (agent/http_proxy.py, docs/models.md): which proxy the
environment names, a `CONNECT` tunnel carrying TLS end to end, absolute-form requests to an
http origin, and what a refusing or broken proxy gets. A real proxy on 127.0.0.1 that maps the
origins' names to local servers, as a company proxy resolves names the caller cannot."""

from __future__ import annotations

import base64
import ssl
from collections.abc import Callable

import gevent.pool
import gevent.ssl
import pytest
from gevent.server import StreamServer
from gevent.socket import create_connection
from gevent.socket import socket as Socket
from model_support import hi_request
from openai_stub import OpenAIStub
from test_http_client import TLS, _get, _tls_server, pools

from agent.http_client import HTTPPool
from agent.http_proxy import MAX_CONNECT_ANSWER, Proxy, ProxyError, proxy_from_env
from agent.model import ModelError
from agent.models.openai import OpenAIModel

__all__ = ["pools"]  # the fixture this module shares with test_http_client

Refusal = Callable[[Socket], None]


class ForwardProxy:
    """An HTTP proxy: `CONNECT host:port` opens a tunnel, an absolute-form request is relayed
    in origin form; `routes` maps an origin's `host:port` to a local address. `refuse`, when
    set, answers a CONNECT instead of tunnelling."""

    def __init__(self, routes: dict[str, tuple[str, int]], refuse: Refusal | None = None):
        self.routes = routes
        self.refuse = refuse
        self.heads: list[str] = []  # the first request head of each connection
        self._relays = gevent.pool.Group()
        self._server = StreamServer(("127.0.0.1", 0), self._handle)
        self._server.start()
        self.url = f"http://127.0.0.1:{self._server.server_port}"

    def _handle(self, client: Socket, _addr: object) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            data = client.recv(65536)
            if not data:
                client.close()
                return
            buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        text = head.decode("latin-1")
        self.heads.append(text)
        method, target, version = text.split("\r\n")[0].split(" ")
        if method == "CONNECT":
            if self.refuse is not None:
                self.refuse(client)
                client.close()
                return
            upstream = create_connection(self.routes[target])
            client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            authority, _, path = target.removeprefix("http://").partition("/")
            upstream = create_connection(self.routes[authority])
            headers = text.partition("\r\n")[2]
            upstream.sendall(f"{method} /{path} {version}\r\n{headers}\r\n\r\n".encode() + rest)
        self._relays.spawn(self._pipe, upstream, client)
        self._pipe(client, upstream)

    @staticmethod
    def _pipe(source: Socket, target: Socket) -> None:
        try:
            while data := source.recv(65536):
                target.sendall(data)
        except OSError:
            pass
        finally:
            source.close()
            target.close()

    def close(self) -> None:
        self._server.stop(timeout=1)
        self._relays.kill()


def _trusting() -> ssl.SSLContext:
    context: ssl.SSLContext = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(TLS / "cert.pem")
    return context


# --- the tunnel ---------------------------------------------------------------------------------


def test_an_https_origin_is_reached_through_a_connect_tunnel(pools: list[HTTPPool]) -> None:
    """TLS runs end to end inside the tunnel: the origin's certificate (for `localhost`) is
    verified, the proxy sees only `CONNECT`, and the tunnel is kept alive like any connection."""
    origin = _tls_server()
    port = origin.server_port
    proxy = ForwardProxy({f"localhost:{port}": ("127.0.0.1", port)})
    try:
        pool = HTTPPool(
            f"https://localhost:{port}",
            proxy=proxy.url.replace("http://", "http://me:p%40ss@"),
            tls_context=_trusting(),
            read_timeout=10,
        )
        pools.append(pool)
        assert _get(pool)[1] == b"secret"
        assert _get(pool)[1] == b"secret"
    finally:
        origin.stop(timeout=1)
        proxy.close()
    assert pool.connections_made == 1
    (head,) = proxy.heads
    lines = head.split("\r\n")
    assert lines[0] == f"CONNECT localhost:{port} HTTP/1.1"
    token = base64.b64encode(b"me:p@ss").decode()
    assert f"Proxy-Authorization: Basic {token}" in lines


def test_an_http_origin_gets_absolute_form_requests_with_the_credentials(
    pools: list[HTTPPool], monkeypatch: pytest.MonkeyPatch
) -> None:
    """From the environment: `http_proxy` (its credentials on each request), for a name only
    the proxy resolves. The OpenAI adapter goes through it without being told."""
    with OpenAIStub() as stub:
        local = stub.base_url.removeprefix("http://").partition("/")[0]
        host, port = local.split(":")
        proxy = ForwardProxy({f"model.test:{port}": (host, int(port))})
        try:
            monkeypatch.setenv("http_proxy", proxy.url.replace("http://", "http://u:pw@"))
            model = OpenAIModel(base_url=f"http://model.test:{port}/v1", api_key="k", max_retries=0)
            try:
                answer = model.complete(hi_request())
            finally:
                model.close()
        finally:
            proxy.close()
    assert list(answer.content) == [{"type": "text", "text": "Hello"}]
    (head,) = proxy.heads
    lines = head.split("\r\n")
    assert lines[0] == f"POST http://model.test:{port}/v1/chat/completions HTTP/1.1"
    assert f"Host: model.test:{port}" in lines
    assert f"Proxy-Authorization: Basic {base64.b64encode(b'u:pw').decode()}" in lines
    assert stub.requests[0].path == "/v1/chat/completions"  # the proxy relayed it in origin form


def _answer(data: bytes) -> Refusal:
    return lambda client: client.sendall(data)


@pytest.mark.parametrize(
    ("refusal", "expected", "status"),
    [
        (
            _answer(b"HTTP/1.1 407 Proxy Authentication Required\x1b[31m\r\n\r\n"),
            r"refused the tunnel to localhost:\d+: 407 Proxy Authentication Required\?\[31m$",
            407,
        ),
        (_answer(b"HTTP/1.1 502 Bad Gateway\r\n\r\n"), r": 502 Bad Gateway$", 502),
        (_answer(b""), "closed the connection instead of answering CONNECT", None),
        (_answer(b"SSH-2.0-OpenSSH\r\n\r\n"), "is not HTTP: 'SSH-2.0-OpenSSH'", None),
        (_answer(b"HTTP/1.1 200 OK\r\n\r\nearly"), "bytes past its answer to CONNECT", None),
        (
            _answer(b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * (MAX_CONNECT_ANSWER // 6)),
            f"exceeds {MAX_CONNECT_ANSWER} bytes",
            None,
        ),
    ],
    ids=["407", "502", "closed", "not-http", "early-bytes", "endless-head"],
)
def test_a_proxy_that_will_not_tunnel_is_a_proxy_error(
    pools: list[HTTPPool], refusal: Refusal, expected: str, status: int | None
) -> None:
    proxy = ForwardProxy({}, refuse=refusal)
    try:
        pool = HTTPPool("https://localhost:1", proxy=proxy.url, read_timeout=10)
        pools.append(pool)
        with pytest.raises(ProxyError, match=expected) as caught:
            _get(pool)
    finally:
        proxy.close()
    assert caught.value.status == status


def test_a_model_call_refused_by_the_proxy_is_not_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 4xx from the proxy (credentials, a policy) is the configuration's: one attempt, and
    the model error says why; a 5xx is retried like any connection failure."""
    proxy = ForwardProxy({}, refuse=_answer(b"HTTP/1.1 403 Forbidden by policy\r\n\r\n"))
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    model = OpenAIModel(base_url="https://api.example.test/v1", api_key="k", backoff_base=0.001)
    try:
        with pytest.raises(ModelError, match=r"refused the tunnel.*403 Forbidden by policy"):
            model.complete(hi_request())
    finally:
        model.close()
        proxy.close()
    assert len(proxy.heads) == 1  # not retried


# --- which proxy --------------------------------------------------------------------------------


def test_the_environments_proxy_by_scheme_with_the_lower_case_name_first() -> None:
    env = {
        "https_proxy": "http://lower:1",
        "HTTPS_PROXY": "http://upper:2",
        "HTTP_PROXY": "plain:3",
        "ALL_PROXY": "http://all:4",
    }
    assert proxy_from_env("https", "api.example.com", 443, env) == Proxy("lower", 1)
    assert proxy_from_env("http", "api.example.com", 80, env) == Proxy("plain", 3)
    del env["HTTP_PROXY"]
    assert proxy_from_env("http", "api.example.com", 80, env) == Proxy("all", 4)
    assert proxy_from_env("http", "api.example.com", 80, {}) is None


def test_http_proxy_is_ignored_in_a_cgi_process() -> None:
    """httpoxy: in a CGI process a client's `Proxy:` header arrives as `HTTP_PROXY`."""
    env = {"HTTP_PROXY": "http://attacker:8080", "REQUEST_METHOD": "GET"}
    assert proxy_from_env("http", "api.example.com", 80, env) is None
    env["http_proxy"] = "http://configured:3128"  # the lower-case name no header can set
    assert proxy_from_env("http", "api.example.com", 80, env) == Proxy("configured", 3128)


@pytest.mark.parametrize(
    ("host", "port", "no_proxy"),
    [
        ("api.example.com", 443, "example.com"),
        ("api.example.com", 443, ".example.com"),
        ("api.example.com", 443, "*.example.com"),
        ("EXAMPLE.com", 443, "other.org, example.com"),
        ("api.example.com", 443, "example.com:443"),
        ("10.1.2.3", 443, "10.0.0.0/8"),
        ("fd00::7", 443, "fd00::/8"),
        ("fd00::7", 8443, "[fd00::7]:8443"),
        ("anything.at.all", 443, "*"),
        # Loopback is always direct, NO_PROXY or not.
        ("localhost", 443, ""),
        ("model.localhost", 443, ""),
        ("127.0.0.9", 443, ""),
        ("::1", 443, ""),
    ],
)
def test_hosts_reached_directly(host: str, port: int, no_proxy: str) -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": no_proxy}
    assert proxy_from_env("https", host, port, env) is None


@pytest.mark.parametrize(
    ("host", "port", "no_proxy"),
    [
        ("notexample.com", 443, "example.com"),
        ("api.example.com", 8443, "example.com:443"),
        ("11.0.0.1", 443, "10.0.0.0/8"),
        ("api.example.com", 443, "*.other.org"),
    ],
)
def test_hosts_no_proxy_does_not_name_go_through_the_proxy(
    host: str, port: int, no_proxy: str
) -> None:
    env = {"HTTPS_PROXY": "http://proxy:3128", "no_proxy": no_proxy}
    assert proxy_from_env("https", host, port, env) == Proxy("proxy", 3128)


def test_a_proxy_the_client_cannot_use_is_refused_loudly_by_name() -> None:
    """Going around a configured proxy would break the policy it is there for."""
    env = {"ALL_PROXY": "socks5://user:secret@proxy:1080"}
    with pytest.raises(ValueError, match="ALL_PROXY: socks5:// proxies are not supported") as e:
        proxy_from_env("https", "api.example.com", 443, env)
    assert "secret" not in str(e.value)
    with pytest.raises(ValueError, match="proxy: no host"):
        Proxy.parse("http://:3128")
    with pytest.raises(TypeError):
        Proxy.parse(3128)  # type: ignore[arg-type]
    assert "secret" not in repr(Proxy.parse("http://u:secret@p:1"))


def test_a_pool_told_not_to_trust_the_environment_goes_direct(
    monkeypatch: pytest.MonkeyPatch, pools: list[HTTPPool]
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    through = HTTPPool("https://api.example.com")
    direct = HTTPPool("https://api.example.com", trust_env=False)
    pools += [through, direct]
    assert through.proxy == Proxy("proxy", 3128)
    assert repr(through) == "<HTTPPool https://api.example.com:443 via proxy:3128>"
    assert direct.proxy is None


def test_the_adapters_take_a_proxy_or_ignore_the_environments(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`proxy=` for every call, `trust_env=False` for none; a proxy the client cannot use is
    refused when the adapter is made, naming the variable."""
    from agent.models.anthropic import AnthropicModel

    monkeypatch.setenv("ALL_PROXY", "socks5://proxy:1080")
    with pytest.raises(ValueError, match="ALL_PROXY: socks5://"):
        OpenAIModel(base_url="https://api.example.com/v1", api_key="k")
    for cls in (OpenAIModel, AnthropicModel):
        direct = cls(base_url="https://api.example.com", api_key="k", trust_env=False)
        named = cls(base_url="https://api.example.com", api_key="k", proxy="http://gw:8080")
        try:
            assert direct.proxy is None
            assert named.proxy == Proxy("gw", 8080)
        finally:
            direct.close()
            named.close()


def test_a_query_in_the_base_url_is_kept_on_every_request() -> None:
    """Azure OpenAI's `?api-version=`: dropping it was a 404 from a URL the user never wrote."""
    with OpenAIStub() as stub:
        model = OpenAIModel(
            base_url=f"{stub.base_url}/deployments/d?api-version=2024-10-21",
            headers={"api-key": "k"},
            max_retries=0,
        )
        try:
            model.complete(hi_request())
        finally:
            model.close()
    assert stub.requests[0].path == "/v1/deployments/d/chat/completions?api-version=2024-10-21"
    assert stub.requests[0].headers["api-key"] == "k"
    with pytest.raises(ValueError, match="fragment"):
        OpenAIModel(base_url="https://api.example.com/v1#x")
