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
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags
from otlp_collector import Collector, collector
from test_tracing import (  # noqa: F401  (collected here again, under the lean provider)
    test_a_later_turn_with_no_parent_keeps_the_agents_previous_one,
    test_a_made_up_tool_name_and_call_id_are_cut_on_the_span,
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
        {**otlp, "OTEL_TRACES_SAMPLER": "always_off", "SUBAGENT_OTEL_SDK": "true"},
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
        # What HTTP cannot carry is refused when read, not when the first batch is posted.
        ({"OTEL_EXPORTER_OTLP_HEADERS": "a=s3cret%0D%0AX-Evil:%201"}, "pair 1 \\(a\\)"),
        ({"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "ok=1,b=s3cret%00"}, "TRACES_HEADERS: pair 2"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "c=s3cret\u20ac"}, "Latin-1"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "bad%0Aname=s3cret"}, "not an HTTP header name"),
        ({"OTEL_EXPORTER_OTLP_HEADERS": "x y=s3cret"}, "not an HTTP header name"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "a=1,=2"}, "RESOURCE"),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "-1"}, "TIMEOUT"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "localhost:4318"}, "http"),
        # What the SDK's pipeline would only warn about (unseen) and ignore is refused too.
        ({"OTEL_TRACES_SAMPLER": "parentbased_traceidration"}, "unsupported sampler"),
        ({"OTEL_TRACES_SAMPLER": "parentbased_jaeger_remote"}, "unsupported sampler"),
        ({"OTEL_EXPORTER_OTLP_COMPRESSION": "br"}, "OTEL_EXPORTER_OTLP_COMPRESSION"),
        ({"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "zstd"}, "TRACES_COMPRESSION"),
        (
            {
                "SUBAGENT_OTEL_SDK": "true",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "1.5",
            },
            "ratio",
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "console",
                "OTEL_TRACES_SAMPLER": "traceidratio",
                "OTEL_TRACES_SAMPLER_ARG": "most",
            },
            "SAMPLER_ARG",
        ),
    ]
    for extra, match in bad:
        with no_provider(), pytest.raises(ValueError, match=match) as refused:
            telemetry.configure_from_env({**otlp, **extra})
        assert "s3cret" not in str(refused.value)  # a header value is never echoed
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


def test_the_sdk_set_up_takes_sampler_and_compression_from_the_mapping() -> None:
    """The SDK's provider and exporter read the sampler and the compression from `os.environ`
    only: a mapping's `always_off` traced everything, its `deflate` was not applied."""
    with collector() as local, no_provider():
        env = {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": local.endpoint,
            "OTEL_EXPORTER_OTLP_COMPRESSION": "deflate",  # the SDK's alone: no lean provider
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0",
        }
        assert not {"OTEL_TRACES_SAMPLER", "OTEL_EXPORTER_OTLP_COMPRESSION"} & set(os.environ)
        assert telemetry.configure_from_env(env) is True
        provider = trace.get_tracer_provider()
        assert isinstance(provider, TracerProvider)
        tracer = trace.get_tracer("host")
        assert not tracer.start_span("sampled out").is_recording()
        with trace.use_span(NonRecordingSpan(SpanContext(7, 9, True, TraceFlags(1))), False):
            tracer.start_span("under a sampled parent").end()  # parent-based: kept
        offload(provider.force_flush, 10_000)
        offload(provider.shutdown)
    assert [s.name for s in local.spans()] == ["under a sampled parent"]
    assert {k.lower(): v for k, v in local.headers[0].items()}["content-encoding"] == "deflate"


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


# -- a child's set-up: its request, its activation span, its trace parent (h18g) ----------------


def test_a_made_trace_parent_is_the_dataclass_value_frozen_as_ever() -> None:
    """`make_trace_parent` (the tool call's and the activation's cheap constructor) makes the
    same value as `TraceParent(...)`: equal, same repr, still frozen."""
    import dataclasses

    from opentelemetry.context import Context

    from subagent.types import TraceParent, make_trace_parent

    ctx = Context({"k": 1})
    for activation, name in ((False, None), (True, "worker")):
        made = make_trace_parent(ctx, activation, name)
        plain = TraceParent(ctx, activation=activation, name=name)
        assert type(made) is TraceParent
        assert made == plain and repr(made) == repr(plain)
        assert dataclasses.replace(made, name="x") == TraceParent(ctx, activation, "x")
        with pytest.raises(dataclasses.FrozenInstanceError):
            made.name = "other"  # type: ignore[misc]


def test_a_named_parent_and_an_ambient_one_are_the_dataclass_values() -> None:
    """`tracing.named` (a delegating tool's child, once per child) and `tracing.ambient` make
    their parents with `make_trace_parent`: the same value as `TraceParent(context, name=)`,
    never an activation's."""
    from subagent.types import TraceParent

    with installed():
        with trace.get_tracer("host").start_as_current_span("session"):
            found = tracing.ambient("boss")
            assert found is not None and not found.activation
            assert found == TraceParent(found.context, name="boss") and type(found) is TraceParent
        activation = TraceParent(found.context, activation=True, name="old")
        for parent in (found, activation):
            made = tracing.named(parent, "worker")
            assert made == TraceParent(parent.context, name="worker")
            assert type(made) is TraceParent and not made.activation
        assert tracing.named(None, "worker") is None


def test_the_traced_start_request_keeps_every_field_of_the_callers() -> None:
    """`begin_start` hands the provider a copy of the request with the activation's trace and
    the depth (made without `dataclasses.replace`): every other field is the caller's, the
    caller's request is unchanged, and a subclass with its own checks still gets them run."""
    import dataclasses

    from subagent.types import (
        SubagentContinuation,
        SubagentStartRequest,
        ToolRestriction,
        text_block,
    )
    from supervision.signal import AbortController

    class Parent:
        id = "p-1"
        depth = 2

    class Descriptor:
        provider = "spawn"
        label = "worker"

    request = SubagentStartRequest(
        prompt=[text_block("task")], parent=Parent(), signal=AbortController().signal,
        agent_options=object(), output_schema={"type": "object"}, max_depth=4,
        tool_filter=ToolRestriction(allow=("a",)), persona="terse",
        continuation=SubagentContinuation("c-1", Descriptor()),  # type: ignore[arg-type]
        token_budget=10, cost_budget=0.5, trace=None, depth=None,
    )  # fmt: skip
    names = [f.name for f in dataclasses.fields(SubagentStartRequest)]
    with installed() as sink:
        for depth in (3, None):
            traced, activation = telemetry.begin_start(request, "spawn", "r-1", "p-1", None, depth)
            assert activation is not None and traced is not request
            expected = dataclasses.replace(
                request, trace=activation.parent, depth=depth if depth is not None else None
            )
            for name in names:
                assert getattr(traced, name) is getattr(expected, name), name
            assert traced == expected
            assert request.trace is None and request.depth is None  # the caller's: unchanged
            activation.end(RuntimeError("x"))

        checked: list[object] = []

        @dataclasses.dataclass(frozen=True, slots=True)
        class Checked(SubagentStartRequest):
            def __post_init__(self) -> None:
                checked.append(self.depth)

        sub = Checked(prompt=[text_block("t")], parent=Parent(), signal=request.signal)
        traced, activation = telemetry.begin_start(sub, "spawn", "r-2", "p-1", None, 5)
        assert type(traced) is Checked and traced.depth == 5 and checked == [None, 5]
        assert activation is not None
        activation.end(RuntimeError("x"))
        assert len(sink.get_finished_spans()) == 3


def test_an_activation_span_from_its_template_reads_and_encodes_as_through_the_api() -> None:
    """With the lean tracer a child's `invoke_agent` span starts from a template of what every
    activation of that name and provider shares (agent/tracing.py `start_activation`), its
    context made with it: it reads, parents and encodes byte for byte as the same span made
    with every attribute through `start_span`, whether named, remote, resumed or linked."""
    from opentelemetry.trace import Link, SpanKind

    from subagent.lean_tracing import LeanResource, LeanSpan, MemorySink
    from subagent.otlp import Encoder

    with installed() as sink:
        root = trace.get_tracer("t").start_span("root")
        parent = tracing.TraceParent(trace.set_span_in_context(root), name="worker")
        first = tracing.start_activation(
            parent, provider="spawn", run_id="r-0", parent_id="p", depth=1
        )
        assert first is not None
        cases = [
            (parent, {"depth": 1}),
            (parent, {"depth": None, "child_id": "c-1", "resumed": True, "remote": True}),
            (tracing.TraceParent(parent.context), {"depth": 2}),
            (None, {"depth": None, "link": Link(first.span.get_span_context())}),
        ]
        made = []
        for i, (where, extra) in enumerate(cases):
            activation = tracing.start_activation(
                where,
                provider="spawn",
                run_id=f"r-{i}",
                parent_id="p",
                **extra,  # type: ignore[arg-type]
            )
            assert activation is not None
            span = activation.span
            assert isinstance(span, LeanSpan) and span.template is not None
            # The context handed on holds the span as current, over the parent's.
            assert trace.get_current_span(activation.parent.context) is span
            assert activation.parent.activation and activation.parent.name == (
                where.name if where is not None else None
            )
            activation.published(f"child-{i}")
            activation.end(RuntimeError("boom"))
            made.append(span)
        first.end(RuntimeError("x"))
        root.end()
    named, remote, anonymous, linked = made
    assert named.name == "invoke_agent worker" and anonymous.name == "invoke_agent"
    assert remote.kind is SpanKind.CLIENT and named.kind is SpanKind.INTERNAL
    assert named.parent is not None and named.parent.span_id == root.get_span_context().span_id
    assert linked.parent is None and [link.context for link in linked.links] == [
        first.span.get_span_context()
    ]
    assert dict(remote.attributes) == {
        "gen_ai.operation.name": "invoke_agent", "subagent.provider": "spawn",
        "gen_ai.agent.name": "worker", "subagent.run_id": "r-1", "subagent.parent_id": "p",
        "gen_ai.agent.id": "child-1", "gen_ai.conversation.id": "child-1",
        "subagent.resumed": True, "subagent.stop_reason": "error", "error.type": "RuntimeError",
    }  # fmt: skip
    resource = LeanResource({"service.name": "test"})
    for span in made:
        twin = LeanSpan(
            span.name, span.trace_id, span.span_id, span.parent_id, span.parent_remote,
            span.trace_state, span.kind, span.start_time, dict(span.attributes),
            list(span.links) or None, span.scope, MemorySink(), True,
        )  # fmt: skip
        twin.event_list = list(span.events)
        twin.status_code, twin.status_message = span.status_code, span.status_message
        twin.end(span.end_time)
        assert Encoder(resource).span(span) == Encoder(resource).span(twin), span.name
    assert len(sink.get_finished_spans()) == 6
