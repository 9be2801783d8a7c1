"""The tracing tests of `test_tracing`, run against the lean provider (`subagent.lean_tracing`)
the runtime installs for a supported `OTEL_*` set-up: the same tree, parentage, attributes,
events, links and status through the OpenTelemetry API, with lean spans behind it."""

from __future__ import annotations

import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gevent import subprocess as gsub
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from otlp_collector import Collector, collector
from test_tracing import (  # noqa: F401  (collected here again, under the lean provider)
    test_a_later_turn_with_no_parent_keeps_the_agents_previous_one,
    test_a_resumed_acp_childs_activation_links_to_its_first,
    test_a_turn_parented_from_another_process_is_a_server_span,
    test_aborted_parallel_children_end_every_span,
    test_an_acp_childs_spans_join_the_trace_through_meta,
    test_captured_output_is_the_repaired_reply,
    test_chat_input_tokens_include_cached_input_as_the_genai_convention_counts_them,
    test_chat_spans_carry_usage_and_tools_see_their_span_as_current,
    test_output_is_not_captured_unless_asked,
    test_the_demo_tree_is_one_trace_with_the_right_parentage,
)
from tracing_support import flavour, installed, no_provider

from agent import tracing
from subagent import telemetry
from subagent.lean_tracing import LeanTracerProvider
from supervision.offload import offload

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _lean() -> Iterator[None]:
    with flavour("lean"):
        yield


# -- set-up from the environment: which provider, read from which mapping ------------------------


def _provider_for(env: dict[str, str]) -> object:
    with no_provider():
        assert telemetry.configure_from_env(env) is True
        found = trace.get_tracer_provider()
        found.shutdown()  # type: ignore[attr-defined]  # ours: lean or SDK
        return found


def test_configure_from_env_picks_the_lean_provider_only_for_what_it_supports() -> None:
    otlp = {"OTEL_TRACES_EXPORTER": "otlp"}
    assert isinstance(_provider_for(otlp), LeanTracerProvider)
    assert isinstance(
        _provider_for({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:1"}), LeanTracerProvider
    )
    lean_too = [
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
        {"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"},
        {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "100"},
    ]
    for extra in lean_too:
        assert isinstance(_provider_for({**otlp, **extra}), LeanTracerProvider), extra
    sdk = [
        {"OTEL_TRACES_EXPORTER": "console"},
        {"OTEL_TRACES_EXPORTER": "otlp,console"},
        {**otlp, "SUBAGENT_OTEL_SDK": "true"},
        {**otlp, "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate"},
        {**otlp, "OTEL_TRACES_SAMPLER": "parentbased_jaeger_remote"},
        {**otlp, "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "10"},
        {**otlp, "OTEL_EXPORTER_OTLP_CERTIFICATE": "/etc/ca.pem"},
    ]
    for env in sdk:
        assert isinstance(_provider_for(env), TracerProvider), env


def test_bad_lean_settings_are_refused() -> None:
    otlp = {"OTEL_TRACES_EXPORTER": "otlp"}
    bad = [
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "x"}, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE"),
        ({"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "900", "OTEL_BSP_MAX_QUEUE_SIZE": "100"}, "max_batch"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "half"}, "SAMPLER_ARG"),
        ({"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "3"}, "ratio"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "novalue"}, "HEADERS"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "a=1,=2"}, "RESOURCE"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "-1"}, "TIMEOUT"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "http"),
    ]
    for extra, match in bad:
        with no_provider(), pytest.raises(ValueError, match=match):
            telemetry.configure_from_env({**otlp, **extra})
        with no_provider():
            assert tracing.tracer() is None  # nothing half-installed


def test_the_lean_set_up_reads_the_mapping_it_is_given() -> None:
    """Endpoint, headers, service name, resource attributes and sampler come from the mapping
    passed in, not from `os.environ`."""
    with collector() as local, no_provider():
        base = local.endpoint.removesuffix("/v1/traces")
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": base + "/",
            "OTEL_EXPORTER_OTLP_HEADERS": "Authorization=Bearer%20t0k,x-tenant=blue",
            "OTEL_SERVICE_NAME": "svc-under-test",
            "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment=ci,service.name=ignored",
            "OTEL_TRACES_SAMPLER": "always_on",
        }
        assert telemetry.configure_from_env(env) is True
        provider = trace.get_tracer_provider()
        assert isinstance(provider, LeanTracerProvider)
        trace.get_tracer("host").start_span("hello").end()
        telemetry.flush(10)
        provider.shutdown()
        (request,) = local.requests
    assert local.paths == ["/v1/traces"]
    assert local.headers[0]["authorization"] == "Bearer t0k"
    assert local.headers[0]["x-tenant"] == "blue"
    (resource_spans,) = request.resource_spans
    resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
    assert resource["service.name"] == "svc-under-test"
    assert resource["deployment.environment"] == "ci"
    assert [s.name for s in local.spans()] == ["hello"]


def test_the_sdk_set_up_takes_the_endpoint_from_the_mapping_too() -> None:
    """`_otlp_exporter` used to leave the endpoint to the SDK, which reads `os.environ`."""
    with collector() as local, no_provider():
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "SUBAGENT_OTEL_SDK": "true",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": local.endpoint,
            "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=green",
        }
        assert "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" not in os.environ
        assert telemetry.configure_from_env(env) is True
        provider = trace.get_tracer_provider()
        assert isinstance(provider, TracerProvider)
        trace.get_tracer("host").start_span("via the sdk").end()
        offload(provider.force_flush, 10_000)
        offload(provider.shutdown)
    assert [s.name for s in local.spans()] == ["via the sdk"]
    assert local.headers[0]["x-tenant"] == "green"


def test_a_host_sdk_provider_is_used_as_is_even_when_otlp_is_asked() -> None:
    host = TracerProvider()
    with flavour("sdk"), installed(host) as exporter:
        assert telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "otlp"}) is False
        assert trace.get_tracer_provider() is host
        found = tracing.tracer()
        assert found is not None
        found.start_span("host's").end()
        assert [s.name for s in exporter.get_finished_spans()] == ["host's"]


# -- the demo's trace on the wire, lean against the SDK -----------------------------------------

# Values that differ from run to run (ids, timings in text, stack traces' addresses).
_UNSTABLE = ("gen_ai.agent.id", "gen_ai.conversation.id", "subagent.run_id",
             "subagent.parent_id", "gen_ai.tool.call.id", "subagent.message_id",
             "exception.stacktrace")  # fmt: skip


def _demo_on_the_wire(tmp_path: Path, *env: str) -> Collector:
    with collector() as local:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
        environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = local.endpoint.removesuffix("/v1/traces")
        environ.update(item.split("=", 1) for item in env)
        proc = gsub.run(
            [sys.executable, "-m", "subagent.cli", "--home", str(tmp_path), "demo", "--no-live"],
            cwd=REPO, env=environ, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        return local


_ID = re.compile(r"\b[a-z]?[0-9a-f]{12,}\b")


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    found = getattr(any_value, kind)
    return tuple(_value(v) for v in found.values) if kind == "array_value" else found


def _stable(kvs: Any) -> tuple[tuple[str, Any], ...]:
    out = {}
    for kv in kvs:
        value = _value(kv.value)
        if kv.key in _UNSTABLE:
            value = "*"
        elif isinstance(value, str):
            value = _ID.sub("*", value)  # an agent id inside a text ("interrupted by s37bb…")
        if kv.key == "error.type" and value == "abandoned":
            value = "aborted"  # the cancel lands in the wait or kills it: either, by timing
        out[kv.key] = value
    return tuple(sorted(out.items()))


def _shape(found: Collector) -> tuple[Counter[Any], set[str], set[str]]:
    """Every span as a comparable value: name, kind, status, its ancestors' names, attributes
    and events (unstable values masked), the names its links point at."""
    spans = {span.span_id: span for span in found.spans()}
    assert len({s.trace_id for s in spans.values()}) == 1

    def path(span: Any) -> tuple[str, ...]:
        names = []
        while span.parent_span_id:
            span = spans[span.parent_span_id]
            names.append(span.name)
        return tuple(names)

    shapes: Counter[Any] = Counter()
    for span in spans.values():
        message = span.status.message.replace("abandoned", "aborted").split(":", 1)[0]
        shapes[(
            span.name, span.kind, span.status.code, message, path(span), span.flags,
            _stable(span.attributes),
            tuple((e.name, _stable(e.attributes)) for e in span.events),
            tuple(spans[link.span_id].name for link in span.links),
        )] += 1  # fmt: skip
    return shapes, found.services(), found.scopes()


def test_the_lean_exporter_posts_the_demo_trace_the_sdk_path_posts(tmp_path: Path) -> None:
    """The demo's tree through a collector on 127.0.0.1, decoded with the proto classes: the
    lean pipeline (what `OTEL_EXPORTER_OTLP_ENDPOINT` alone sets up) posts the same spans,
    parentage, attributes, events, links and status as the SDK's."""
    lean, lean_services, lean_scopes = _shape(_demo_on_the_wire(tmp_path / "lean"))
    sdk, sdk_services, sdk_scopes = _shape(
        _demo_on_the_wire(tmp_path / "sdk", "SUBAGENT_OTEL_SDK=true")
    )
    assert lean_services == sdk_services == {"subagent"}
    assert lean_scopes == sdk_scopes == {tracing.INSTRUMENTATION}
    assert sum(lean.values()) == sum(sdk.values()) > 50
    assert lean == sdk, (lean - sdk, sdk - lean)


# -- the turn's spans through the lean tracer's own path (`Subspans`) ---------------------------


def test_a_turns_chat_and_tool_spans_come_from_templates_and_encode_as_through_the_api(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the lean provider a turn's `chat` and `execute_tool` spans are made from templates
    of their fixed attributes (agent/tracing.py through `LeanTracer.subspans`), the span's own
    attributes (usage, the captured reply, the call id, an error) after them: each reads, and
    encodes byte for byte, as the same span made with every attribute through `start_span`."""
    from test_tracing import UsageModel

    from agent.models import ModelRegistry
    from agent.options import AgentOptions
    from agent.store import MemoryStore
    from agent.tools import Tool, ToolContext
    from subagent.lean_tracing import LeanResource, LeanSpan, MemorySink
    from subagent.otlp import Encoder
    from subagent.runtime import Runtime

    monkeypatch.setenv(tracing.CAPTURE_CONTENT_ENV, "true")
    models = ModelRegistry()
    models.register("usage", UsageModel())

    def failing(arguments: object, ctx: ToolContext) -> str:
        raise RuntimeError("no")

    with installed() as sink:
        rt = Runtime(store=MemoryStore(), models=models)
        try:
            rt.ctx.tools.register(Tool("inner", "inner", {"type": "object"}, failing))
            agent = rt.agent(options=AgentOptions(model="usage:m-1"))
            agent.send("go").get()
            assert agent.when_idle().get().reason == "completed"
        finally:
            rt.close()
        spans = sink.get_finished_spans()
    made = [s for s in spans if s.name.startswith(("chat ", "execute_tool "))]
    assert [s.name for s in made] == ["chat m-1", "execute_tool inner", "chat m-1"]
    assert all(s.template is not None for s in made)
    chat, tool, _ = made
    assert list(chat.attributes) == [
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.response.finish_reasons",
        "gen_ai.output.messages",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
    ]
    assert dict(tool.attributes) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "inner",
        "gen_ai.tool.call.id": "c1",
        "error.type": "TOOL_FAILED",
    }
    resource = LeanResource({"service.name": "test"})
    for span in made:
        twin = LeanSpan(
            span.name, span.trace_id, span.span_id, span.parent_id, span.parent_remote,
            span.trace_state, span.kind, span.start_time, dict(span.attributes), None,
            span.scope, MemorySink(), True,
        )  # fmt: skip
        twin.status_code, twin.status_message = span.status_code, span.status_message
        twin.end(span.end_time)
        assert Encoder(resource).span(span) == Encoder(resource).span(twin), span.name
