"""The model adapters' `tls_context`: a model behind a private CA (or one that wants a client
certificate) is reached over https on 127.0.0.1, with the stubs serving TLS on this hub."""

from __future__ import annotations

import ssl
from collections.abc import Callable
from pathlib import Path

import gevent.ssl
import pytest
from anthropic_stub import AnthropicStub
from model_support import hi_request
from openai_stub import OpenAIStub

from agent.http_client import tls_context
from agent.model import ModelError
from agent.models.anthropic import AnthropicModel
from agent.models.http import HTTPModel
from agent.models.openai import OpenAIModel

TLS = Path(__file__).resolve().parent / "tls"  # a self-signed certificate for 127.0.0.1

Adapter = Callable[..., HTTPModel]
ADAPTERS: list[tuple[type[OpenAIStub], Adapter]] = [
    (OpenAIStub, OpenAIModel),
    (AnthropicStub, AnthropicModel),
]


def _server_context(*, want_client_cert: bool = False) -> ssl.SSLContext:
    context: ssl.SSLContext = gevent.ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)  # cooperative
    context.load_cert_chain(TLS / "cert.pem", TLS / "key.pem")
    if want_client_cert:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(TLS / "cert.pem")  # the client's cert is the same one
    return context


def _trusting(*, client_cert: bool = False) -> ssl.SSLContext:
    """A client context whose private CA is the test certificate."""
    if client_cert:
        return tls_context(
            cafile=TLS / "cert.pem", certfile=TLS / "cert.pem", keyfile=TLS / "key.pem"
        )
    return tls_context(cafile=TLS / "cert.pem")


def _adapter(models: list[HTTPModel], make: Adapter, base_url: str, **kw: object) -> HTTPModel:
    adapter = make(base_url=base_url, api_key="k", max_retries=0, read_timeout=10, **kw)
    models.append(adapter)
    return adapter


@pytest.mark.parametrize(("stub_type", "make"), ADAPTERS, ids=["openai", "anthropic"])
def test_a_private_ca_is_trusted_only_with_the_tls_context(
    models: list[HTTPModel], stub_type: type[OpenAIStub], make: Adapter
) -> None:
    with stub_type(tls=_server_context()) as stub:
        assert stub.base_url.startswith("https://")
        plain = _adapter(models, make, stub.base_url)
        with pytest.raises(ModelError, match="CERTIFICATE_VERIFY_FAILED"):
            plain.complete(hi_request())
        assert stub.requests == []  # refused in the handshake: nothing was sent

        trusting = _adapter(models, make, stub.base_url, tls_context=_trusting())
        answer = trusting.complete(hi_request())
        assert answer.content and answer.content[0]["type"] == "text"
        assert len(stub.requests) == 1


@pytest.mark.parametrize(("stub_type", "make"), ADAPTERS, ids=["openai", "anthropic"])
def test_a_gateway_that_wants_a_client_certificate(
    models: list[HTTPModel], stub_type: type[OpenAIStub], make: Adapter
) -> None:
    with stub_type(tls=_server_context(want_client_cert=True)) as stub:
        without = _adapter(models, make, stub.base_url, tls_context=_trusting())
        with pytest.raises(ModelError):
            without.complete(hi_request())
        assert stub.requests == []

        with_cert = _adapter(models, make, stub.base_url, tls_context=_trusting(client_cert=True))
        assert with_cert.complete(hi_request()).content
        assert len(stub.requests) == 1


@pytest.mark.parametrize("make", [OpenAIModel, AnthropicModel], ids=["openai", "anthropic"])
def test_tls_context_must_be_a_gevent_context(make: Adapter) -> None:
    """A standard-library context would block the hub in every handshake and read."""
    with pytest.raises(TypeError, match=r"gevent\.ssl\.SSLContext"):
        make(base_url="https://h", tls_context=ssl.create_default_context())
    with pytest.raises(TypeError, match=r"gevent\.ssl\.SSLContext"):
        make(base_url="https://h", tls_context=str(TLS / "cert.pem"))


def test_the_tls_context_helper() -> None:
    """Private CA only (a pinned gateway): no system CA is loaded; a key needs its cert."""
    pinned = tls_context(cafile=TLS / "cert.pem", system_ca=False)
    assert isinstance(pinned, gevent.ssl.SSLContext)
    assert pinned.verify_mode == ssl.CERT_REQUIRED and pinned.check_hostname
    assert [ca["subject"] for ca in pinned.get_ca_certs()] == [((("commonName", "localhost"),),)]
    with pytest.raises(ValueError, match="keyfile needs certfile"):
        tls_context(keyfile=TLS / "key.pem")
