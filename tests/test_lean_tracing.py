"""The lean provider honours the OpenTelemetry API as host code uses it (`subagent.lean_tracing`):
the global tracer a host gets after the runtime configured tracing gives lean spans."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import context, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from subagent.lean_tracing import (
    LeanResource,
    LeanSpan,
    LeanTracerProvider,
    MemorySink,
    Sampling,
)


@pytest.fixture
def sink() -> Iterator[MemorySink]:
    found = MemorySink()
    yield found


def tracer_of(sink: MemorySink, sampling: Sampling | None = None) -> trace.Tracer:
    provider = LeanTracerProvider(LeanResource({"service.name": "t"}), sink, sampling)
    return provider.get_tracer("host", "1.0")


def test_current_spans_nest_and_context_is_restored(sink: MemorySink) -> None:
    tracer = tracer_of(sink)
    before = trace.get_current_span()
    with tracer.start_as_current_span("outer", kind=SpanKind.SERVER) as outer:
        assert trace.get_current_span() is outer
        with tracer.start_as_current_span("inner", attributes={"a": 1}) as inner:
            assert trace.get_current_span() is inner
        token = context.attach(trace.set_span_in_context(outer))
        try:
            child = tracer.start_span("attached")
        finally:
            context.detach(token)
        child.end()
    assert trace.get_current_span() is before
    inner_s, child_s, outer_s = sink.spans
    assert [s.name for s in sink.spans] == ["inner", "attached", "outer"]
    assert inner_s.parent is not None and inner_s.parent.span_id == outer_s.context.span_id
    assert child_s.parent is not None and child_s.parent.span_id == outer_s.context.span_id
    assert outer_s.parent is None and outer_s.kind is SpanKind.SERVER
    assert {s.context.trace_id for s in sink.spans} == {outer_s.context.trace_id}
    assert inner_s.attributes == {"a": 1}
    assert outer_s.scope.name == "host" and outer_s.scope.version == "1.0"


def test_an_exception_in_a_current_span_is_recorded_and_sets_error(sink: MemorySink) -> None:
    tracer = tracer_of(sink)
    with pytest.raises(KeyError), tracer.start_as_current_span("fails"):
        raise KeyError("k")
    with pytest.raises(ValueError), tracer.start_span("direct"):
        raise ValueError("v")
    fails, direct = sink.spans
    for span, kind in ((fails, "KeyError"), (direct, "ValueError")):
        assert span.status.status_code is StatusCode.ERROR
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes is not None
        assert event.attributes["exception.type"] == kind
        assert kind in str(event.attributes["exception.stacktrace"])


def test_span_methods_record_what_is_set_and_nothing_after_end(sink: MemorySink) -> None:
    tracer = tracer_of(sink)
    other = tracer.start_span("other")
    span = tracer.start_span("first", links=[Link(other.get_span_context(), {"why": "x"})])
    assert span.is_recording()
    span.set_attribute("list", ["a", "b"])
    span.set_attribute("bad", {"not": "allowed"})  # type: ignore[arg-type]
    span.set_attributes({"n": 2, "f": 0.5, "flag": True})
    span.add_event("ev", {"k": "v"}, timestamp=123)
    span.add_link(other.get_span_context())
    span.update_name("renamed")
    span.set_status(Status(StatusCode.OK))
    span.set_status(StatusCode.ERROR, "ignored: OK is final")
    span.record_exception(RuntimeError("boom"))
    context_before = span.get_span_context()
    assert context_before.trace_flags.sampled and context_before.is_valid
    span.end()
    assert not span.is_recording()
    span.set_attribute("late", 1)
    span.add_event("late")
    span.update_name("late")
    span.end()  # ended once: not handed to the sink again
    (recorded,) = sink.spans
    assert isinstance(recorded, LeanSpan)
    assert recorded.name == "renamed"
    assert recorded.attributes == {"list": ("a", "b"), "n": 2, "f": 0.5, "flag": True}
    assert [e.name for e in recorded.events] == ["ev", "exception"]
    assert recorded.events[0].timestamp == 123
    assert [link.context.span_id for link in recorded.links] == [
        other.get_span_context().span_id
    ] * 2
    assert recorded.links[0].attributes == {"why": "x"}
    assert recorded.status.status_code is StatusCode.OK
    assert recorded.get_span_context() is context_before


def test_status_as_the_sdk_sets_it(sink: MemorySink) -> None:
    span = tracer_of(sink).start_span("s")
    span.set_status(StatusCode.UNSET)
    span.set_status(StatusCode.ERROR, "first")
    span.set_status(Status(StatusCode.ERROR, "second"))
    span.end()
    assert sink.spans[0].status.status_code is StatusCode.ERROR
    assert sink.spans[0].status.description == "second"


def test_samplers_follow_the_standard_rules(sink: MemorySink) -> None:
    off = tracer_of(sink, Sampling("parentbased_always_off"))
    root = off.start_span("root")
    assert not root.is_recording() and not isinstance(root, LeanSpan)
    assert root.get_span_context().is_valid and not root.get_span_context().trace_flags.sampled
    child = tracer_of(sink).start_span("child", trace.set_span_in_context(root))
    assert not child.is_recording()  # parent-based: the dropped root's children stay dropped
    assert child.get_span_context().trace_id == root.get_span_context().trace_id
    # Not parent-based: the rule applies to every span.
    forced = tracer_of(sink, Sampling("always_on")).start_span("c", trace.set_span_in_context(root))
    assert forced.is_recording()
    ratio = Sampling("traceidratio", 0.25)
    assert ratio.sampled(False, False, (1 << 64) // 4 - 1)
    assert not ratio.sampled(False, False, (1 << 64) // 4)
    assert ratio.sampled(False, False, (7 << 64) | 5)  # only the low 64 bits count
    with pytest.raises(ValueError, match="sampler"):
        Sampling("jaeger_remote")
    with pytest.raises(ValueError, match="ratio"):
        Sampling("traceidratio", 2.0)
    assert sink.spans == []


def test_a_shut_down_provider_makes_no_spans(sink: MemorySink) -> None:
    provider = LeanTracerProvider(LeanResource({}), sink)
    provider.shutdown()
    span = provider.get_tracer("x").start_span("after")
    span.end()
    assert not span.is_recording()
    assert sink.spans == []


def test_the_lean_flavour_of_the_tracing_tests_records_lean_spans() -> None:
    from tracing_support import flavour, installed

    with flavour("lean"), installed() as recorded:
        trace.get_tracer("t").start_span("x").end()
        assert isinstance(trace.get_tracer_provider(), LeanTracerProvider)
        assert [type(s) for s in recorded.get_finished_spans()] == [LeanSpan]


# -- spans from templates under one parent (`LeanTracer.subspans`) ------------------------------


def test_a_span_from_a_template_reads_as_one_made_through_the_api(sink: MemorySink) -> None:
    tracer = tracer_of(sink)
    parent = tracer.start_span("invoke_agent")
    fast = tracer.subspans(parent)  # type: ignore[attr-defined]  # the lean tracer's own
    assert fast is not None
    template = fast.template("chat m", SpanKind.CLIENT, {"op": "chat", "reasons": ["stop"]})
    own = {"tokens": 3}
    span = fast.start(template, own)
    twin = tracer.start_span(
        "chat m",
        trace.set_span_in_context(parent),
        SpanKind.CLIENT,
        {"op": "chat", "reasons": ("stop",), "tokens": 3},
    )
    for made in (span, twin):
        made.end()
    assert (span.name, span.kind, list(span.attributes.items())) == (
        twin.name, twin.kind, list(twin.attributes.items()),
    )  # fmt: skip
    assert span.parent == twin.parent and span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    assert span.context.trace_id == parent.get_span_context().trace_id
    assert span.context.span_id not in (0, twin.context.span_id)
    recorded = fast.record(template, 1234)
    assert recorded is None
    last = sink.spans[-1]
    assert (last.name, last.start_time, last.template) == ("chat m", 1234, template)
    assert last.end_time >= 1234 and not last.is_recording()


def test_a_templated_span_that_renames_or_sets_a_template_key_owns_its_attributes(
    sink: MemorySink,
) -> None:
    tracer = tracer_of(sink)
    fast = tracer.subspans(tracer.start_span("p"))  # type: ignore[attr-defined]
    template = fast.template("execute_tool t", SpanKind.INTERNAL, {"a": "1", "b": "2"})
    span = fast.start(template, {"c": "3"})
    span.set_attribute("d", "4")  # not the template's: the template stays
    assert span.template is template
    span.set_attribute("a", "x")  # the template's key: as the API, in its place
    assert span.template is None
    assert list(span.attributes.items()) == [("a", "x"), ("b", "2"), ("c", "3"), ("d", "4")]
    other = fast.start(template)
    other.update_name("renamed")
    assert (other.name, other.template, dict(other.attributes)) == (
        "renamed", None, {"a": "1", "b": "2"},
    )  # fmt: skip
    assert template.attributes == (("a", "1"), ("b", "2"))  # never changed by a span


def test_subspans_only_under_a_recording_lean_span_whose_children_are_sampled(
    sink: MemorySink,
) -> None:
    tracer = tracer_of(sink)
    parent = tracer.start_span("p")
    assert tracer.subspans(trace.INVALID_SPAN) is None  # type: ignore[attr-defined]
    never = tracer_of(sink, Sampling("always_off"))
    assert never.subspans(parent) is None  # type: ignore[attr-defined]  # its sampler decides
    parent.end()
    assert tracer.subspans(parent) is None  # type: ignore[attr-defined]  # ended


def test_a_templated_span_started_current_has_every_slot_set(sink: MemorySink) -> None:
    """`LeanTracer.start_current` (a child's activation span): every slot is set, and it
    holds what the same span made by `start_span` holds (its
    template's attributes first, then its own, cleaned; its links), current in its context."""
    tracer = tracer_of(sink)
    parent = tracer.start_span("p")
    base = trace.set_span_in_context(parent)
    template = tracer.template(  # type: ignore[attr-defined]  # the lean tracer's own
        "invoke_agent w", SpanKind.CLIENT, {"op": "invoke_agent"}
    )
    link = trace.Link(parent.get_span_context())
    own = {"run": "r1", "tags": ["a", "b"]}
    span, ctx = tracer.start_current(template, own, base, [link])  # type: ignore[attr-defined]
    twin = tracer.start_span(
        "invoke_agent w", base, SpanKind.CLIENT, {"op": "invoke_agent", **own}, [link]
    )
    for slot in LeanSpan.__slots__:
        getattr(span, slot)  # raises if a slot was left unset
    different = {"span_id", "start_time", "attrs", "template"}
    for slot in set(LeanSpan.__slots__) - different:
        assert getattr(span, slot) == getattr(twin, slot), slot
    assert span.template is template and span.attrs == {"run": "r1", "tags": ("a", "b")}
    assert dict(span.attributes) == dict(twin.attributes)
    assert trace.get_current_span(ctx) is span and span.is_recording()
    assert trace.get_current_span(base) is parent


def test_a_current_subspan_is_the_span_start_makes_every_slot_set(sink: MemorySink) -> None:
    """`Subspans.start_current` fills a span's slots itself (not through `__init__`): every slot
    is set, and it reads as `start`'s span does, current in the context it returns; its end
    (`Subspans.end`, the generic path for a sink without one of its own) reaches the sink."""
    tracer = tracer_of(sink)
    parent = tracer.start_span("invoke_agent")
    fast = tracer.subspans(parent)  # type: ignore[attr-defined]  # the lean tracer's own
    template = fast.template("execute_tool t", SpanKind.INTERNAL, {"op": "execute_tool"})
    base = trace.set_span_in_context(parent)
    span, ctx = fast.start_current(template, {"call": "c1", "tags": ["a", "b"]}, base)
    twin = fast.start(template, {"call": "c1", "tags": ("a", "b")})
    for slot in LeanSpan.__slots__:
        getattr(span, slot)  # raises if a slot was left unset
    different = {"span_id", "start_time", "attrs"}
    for slot in set(LeanSpan.__slots__) - different:
        assert getattr(span, slot) == getattr(twin, slot), slot
    assert dict(span.attributes) == dict(twin.attributes)  # the list cleaned to a tuple
    assert trace.get_current_span(ctx) is span and span.is_recording()
    assert span.get_span_context().span_id == span.span_id
    assert trace.get_current_span(base) is parent  # the base context is unchanged
    fast.end(span)
    assert sink.spans == [span] and not span.is_recording()
    fast.end(span)  # ended once
    assert sink.spans == [span]
