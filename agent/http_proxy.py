"""Reaching an origin through an HTTP proxy: which proxy, and the tunnel through it.

Hosts behind a company proxy reach hosted models only through it, and set the same variables
for every tool: curl, pip, requests and httpx read `https_proxy`/`HTTPS_PROXY` for https URLs,
`http_proxy`/`HTTP_PROXY` for http ones, `all_proxy`/`ALL_PROXY` for both, and `no_proxy`/
`NO_PROXY` for the hosts that are reached directly. The runtime's HTTP client
(`agent.http_client`) reads them the same way, so a model adapter or the OTLP exporter that
ignored them would either fail to connect or, worse, go around the proxy a policy requires.

- The lower-case name wins over the upper-case one, as in curl and the standard library;
  `HTTP_PROXY` is ignored when `REQUEST_METHOD` is set (a CGI process, whose `HTTP_*` names a
  client's request headers can set: "httpoxy").
- `NO_PROXY`: a comma list of host names (each also matching its subdomains; a leading `.` or
  `*.` is the same), IP addresses, CIDR networks, each optionally with `:port`; `*` alone
  means every host.
- Loopback (`localhost`, `*.localhost`, 127.0.0.0/8, ::1) is always reached directly, as Go's
  HTTP client does: a proxy elsewhere would reach its own loopback, never the caller's.
- Only `http://` proxies (a URL without a scheme is one). A `socks5://` or `https://` proxy is
  refused with a `ValueError` that names the variable: going around the proxy instead would
  break the policy it is there for.
- An https origin is reached through a `CONNECT` tunnel, TLS running end to end inside it; an
  http origin through requests in absolute form. Credentials in the proxy URL
  (`http://user:password@proxy:3128`) become a `Proxy-Authorization: Basic` header.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from agent.errors import ProxyError

__all__ = ["Proxy", "ProxyError", "open_tunnel", "proxy_from_env"]

# The most a proxy's answer to CONNECT may hold (its status line and headers).
MAX_CONNECT_ANSWER = 64 * 1024
# What of a proxy's reason phrase an error quotes (text from another process is data).
_REASON_SHOWN = 200


@dataclass(frozen=True, slots=True)
class Proxy:
    """An `http://` proxy: where it listens and the `Proxy-Authorization` its URL implies."""

    host: str
    port: int
    authorization: str | None = None

    @classmethod
    def parse(cls, url: str, source: str = "proxy") -> Proxy:
        """The proxy of `url`; a `ValueError` naming `source` (the variable or option) when it
        is not an `http://` proxy URL."""
        if not isinstance(url, str):
            raise TypeError(f"{source} must be a URL string, not {type(url).__name__}")
        text = url.strip()
        if "://" not in text:
            text = "http://" + text  # `proxy:3128`, as curl and requests take it
        try:
            parts = urlsplit(text)
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"{source}: not a proxy URL: {url!r} ({exc})") from None
        if parts.scheme.lower() != "http":
            raise ValueError(
                f"{source}: {parts.scheme}:// proxies are not supported, only http:// "
                f"(set no_proxy for the hosts the runtime should reach directly): {_shown(url)}"
            )
        if not parts.hostname:
            raise ValueError(f"{source}: no host in the proxy URL {_shown(url)}")
        authorization = None
        if parts.username is not None:
            pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            token = base64.b64encode(pair.encode("utf-8")).decode("ascii")
            authorization = f"Basic {token}"
        return cls(parts.hostname, port or 80, authorization)

    def __repr__(self) -> str:  # never the credentials
        return f"Proxy({self.host}:{self.port}{', with credentials' if self.authorization else ''})"


def _shown(url: str) -> str:
    """The URL for an error message, its credentials replaced by `***`."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    netloc, slash, path = rest.partition("/")
    if "@" in netloc:
        netloc = "***@" + netloc.rpartition("@")[2]
    return repr(f"{scheme}{sep}{netloc}{slash}{path}"[:_REASON_SHOWN])


def _env_value(env: Mapping[str, str], name: str) -> tuple[str, str] | None:
    """The variable's value and the name it was read under: lower case first."""
    for key in (name.lower(), name.upper()):
        if key == "HTTP_PROXY" and "REQUEST_METHOD" in env:
            continue  # httpoxy: in a CGI process a client's `Proxy:` header sets this name
        value = env.get(key, "").strip()
        if value:
            return value, key
    return None


def _is_loopback(host: str) -> bool:
    name = host.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name.strip("[]")).is_loopback
    except ValueError:
        return False


def _bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether `NO_PROXY`'s list names `host` (and `port`, when an entry has one)."""
    name = host.lower().rstrip(".").strip("[]")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(name)
    except ValueError:
        address = None
    for raw in no_proxy.split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        entry_port = None
        if entry.startswith("["):  # [::1]:8080
            inner, _, rest = entry[1:].partition("]")
            entry, entry_port = inner, rest.removeprefix(":") or None
        elif entry.count(":") == 1:  # host:port (an IPv6 address has more colons)
            entry, entry_port = entry.split(":")
        if entry_port is not None and entry_port != str(port):
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        entry = entry.removeprefix("*").lstrip(".").rstrip(".")
        if entry and (name == entry or name.endswith("." + entry)):
            return True
    return False


def proxy_from_env(
    scheme: str, host: str, port: int, env: Mapping[str, str] | None = None
) -> Proxy | None:
    """The proxy the environment names for `scheme://host:port`, or None (see the module doc)."""
    env = os.environ if env is None else env
    if _is_loopback(host):
        return None
    found = _env_value(env, f"{scheme}_proxy") or _env_value(env, "all_proxy")
    if found is None:
        return None
    no_proxy = _env_value(env, "no_proxy")
    if no_proxy is not None and _bypassed(host, port, no_proxy[0]):
        return None
    url, name = found
    return Proxy.parse(url, source=name)


def open_tunnel(sock: socket.socket, proxy: Proxy, host: str, port: int) -> None:
    """Ask the proxy connected on `sock` for a tunnel to `host:port` (`CONNECT`); return once it
    answered 2xx, with nothing of the origin's read. The socket's timeout bounds each read."""
    authority = f"[{host}]" if ":" in host else host
    lines = [f"CONNECT {authority}:{port} HTTP/1.1", f"Host: {authority}:{port}"]
    if proxy.authorization is not None:
        lines.append(f"Proxy-Authorization: {proxy.authorization}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("ascii"))
    answer = b""
    end = -1
    while end < 0:
        if len(answer) > MAX_CONNECT_ANSWER:
            raise ProxyError(f"the proxy's answer to CONNECT exceeds {MAX_CONNECT_ANSWER} bytes")
        block = sock.recv(65536)
        if not block:
            raise ProxyError("the proxy closed the connection instead of answering CONNECT")
        searched = max(0, len(answer) - 3)  # each byte searched once
        answer += block
        end = answer.find(b"\r\n\r\n", searched)
    if end + 4 != len(answer):  # an origin speaks only after our TLS hello
        raise ProxyError("the proxy sent bytes past its answer to CONNECT")
    status_line = answer[: answer.find(b"\r\n")].decode("latin-1")
    version, _, rest = status_line.partition(" ")
    code_text, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or not (code_text.isascii() and code_text.isdigit()):
        raise ProxyError(f"the proxy's answer to CONNECT is not HTTP: {status_line[:80]!r}")
    code = int(code_text)
    if not 200 <= code < 300:
        shown = "".join(c if c.isprintable() else "?" for c in reason[:_REASON_SHOWN])
        raise ProxyError(
            f"the proxy {proxy.host}:{proxy.port} refused the tunnel to {authority}:{port}: "
            f"{code} {shown}",
            code,
        )
