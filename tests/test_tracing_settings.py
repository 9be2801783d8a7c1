"""How `configure_from_env` reads the standard `OTEL_*` settings, the same on the lean path and
the SDK path: the service name's precedence and the OTLP timeout's unit."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http import trace_exporter
from opentelemetry.sdk.trace import TracerProvider
from tracing_support import no_provider

from subagent import telemetry
from subagent.lean_tracing import LeanTracerProvider

LEAN = {"OTEL_TRACES_EXPORTER": "otlp"}
SDK_CONSOLE = {"OTEL_TRACES_EXPORTER": "console"}
SDK_OTLP = {"OTEL_TRACES_EXPORTER": "otlp", "SUBAGENT_OTEL_SDK": "true"}


def _resource(env: dict[str, str] | None) -> dict[str, Any]:
    """The resource attributes of the provider `configure_from_env(env)` installs."""
    with no_provider():
        assert telemetry.configure_from_env(env) is True
        provider = trace.get_tracer_provider()
        assert isinstance(provider, LeanTracerProvider | TracerProvider)
        attributes = dict(provider.resource.attributes)
        provider.shutdown()
    return attributes


@pytest.mark.parametrize("kind", [LEAN, SDK_CONSOLE, SDK_OTLP], ids=["lean", "sdk", "sdk-otlp"])
def test_the_service_name_follows_the_specifications_precedence_on_both_paths(
    kind: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`OTEL_SERVICE_NAME`, then `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, then `subagent`;
    from the mapping given and from `os.environ` alike (the SDK path once let the default hide
    a name given only in the attributes)."""
    attrs = {"OTEL_RESOURCE_ATTRIBUTES": "service.name=from%20attrs,team=blue"}
    named = {**attrs, "OTEL_SERVICE_NAME": "from-name"}
    only_attrs = _resource({**kind, **attrs})
    assert only_attrs["service.name"] == "from attrs"
    assert only_attrs["team"] == "blue"
    assert _resource({**kind, **named})["service.name"] == "from-name"
    assert _resource(dict(kind))["service.name"] == telemetry.DEFAULT_SERVICE_NAME
    for key, value in {**kind, **attrs}.items():
        monkeypatch.setenv(key, value)
    assert _resource(None)["service.name"] == "from attrs"


class _Recording(trace_exporter.OTLPSpanExporter):
    made: list[dict[str, Any]] = []

    def __init__(self, **kwargs: Any) -> None:
        _Recording.made.append(kwargs)
        super().__init__(**kwargs)


def test_the_otlp_timeout_is_milliseconds_on_both_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    """The specification's unit: `OTEL_EXPORTER_OTLP_TIMEOUT=2500` is 2.5 s for the lean poster
    and for the SDK's exporter (which would read the variable itself as seconds)."""
    cases = [
        ({}, 10.0),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "2500"}, 2.5),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "2500", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "400"}, 0.4),
    ]
    monkeypatch.setattr(trace_exporter, "OTLPSpanExporter", _Recording)
    for extra, seconds in cases:
        settings = telemetry.lean_settings({**LEAN, **extra}, ["otlp"])
        assert settings is not None
        assert settings.timeout_s == seconds
        _Recording.made.clear()
        _resource({**SDK_OTLP, **extra})
        assert [made["timeout"] for made in _Recording.made] == [seconds]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-5", "soon"])
@pytest.mark.parametrize("kind", [LEAN, SDK_OTLP], ids=["lean", "sdk"])
def test_a_timeout_that_is_not_a_positive_finite_number_is_refused(
    value: str, kind: dict[str, str]
) -> None:
    with no_provider(), pytest.raises(ValueError, match="TIMEOUT"):
        telemetry.configure_from_env({**kind, "OTEL_EXPORTER_OTLP_TIMEOUT": value})
