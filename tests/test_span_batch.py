"""The runtime's batch span processor: queued spans are stored compactly and come out whole."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, StatusCode

from subagent.span_batch import CompactBatchSpanProcessor

Shape = tuple[Any, ...]


def shape(span: ReadableSpan) -> Shape:
    """Everything an exporter reads of a span."""
    parent = span.parent
    return (
        span.name,
        span.context,
        None if parent is None else (parent.trace_id, parent.span_id, parent.is_remote),
        span.kind,
        span.status.status_code,
        span.status.description,
        span.start_time,
        span.end_time,
        dict(span.attributes or {}),
        [(e.name, dict(e.attributes or {})) for e in span.events],
        [link.context.span_id for link in span.links],
        span.resource.attributes,
        span.instrumentation_scope,
    )


def make_spans(provider: TracerProvider) -> None:
    tracer = provider.get_tracer("test-scope", "1.2")
    with tracer.start_as_current_span("root", kind=SpanKind.SERVER) as root:
        child = tracer.start_span(
            "chat m",
            kind=SpanKind.CLIENT,
            attributes={"gen_ai.request.model": "m", "n": 3, "ok": True, "f": 0.5},
        )
        child.set_attribute("gen_ai.response.finish_reasons", ("stop", "length"))
        child.set_status(StatusCode.ERROR, "it failed")
        child.end()
        with_event = tracer.start_span("steered")
        with_event.add_event("subagent.steer.admitted", {"subagent.message_id": "m1"})
        with_event.end()
        linked = tracer.start_span("resumed", links=[Link(root.get_span_context())])
        linked.end()
    remote = trace.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1))
    tracer.start_span("served", context=trace.set_span_in_context(trace.NonRecordingSpan(remote)))\
        .end()  # fmt: skip


def test_spans_come_out_as_the_sdk_processor_would_give_them() -> None:
    resource = Resource.create({"service.name": "compact-test"})
    reference = InMemorySpanExporter()
    compact = InMemorySpanExporter()
    expected_provider = TracerProvider(resource=resource)
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    expected_provider.add_span_processor(SimpleSpanProcessor(reference))
    processor = CompactBatchSpanProcessor(compact, schedule_delay_millis=60_000)
    expected_provider.add_span_processor(processor)
    make_spans(expected_provider)
    assert compact.get_finished_spans() == ()  # still queued: no full batch, no delay passed
    assert processor.force_flush()
    got = sorted(map(shape, compact.get_finished_spans()), key=lambda s: s[6])
    want = sorted(map(shape, reference.get_finished_spans()), key=lambda s: s[6])
    assert len(got) == 5
    assert got == want
    expected_provider.shutdown()


class Recording(SpanExporter):
    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.shut = False
        self.exported = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.batches.append([s.name for s in spans])
        self.exported.set()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.shut = True


def test_a_full_batch_wakes_the_worker_and_shutdown_exports_the_rest() -> None:
    exporter = Recording()
    processor = CompactBatchSpanProcessor(
        exporter, max_export_batch_size=3, schedule_delay_millis=60_000
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(4):
        tracer.start_span(f"s{i}").end()
    assert exporter.exported.wait(10)  # the third span filled a batch
    assert exporter.batches[0] == ["s0", "s1", "s2"]
    provider.shutdown()
    assert [name for batch in exporter.batches for name in batch] == ["s0", "s1", "s2", "s3"]
    assert exporter.shut
    tracer.start_span("late").end()  # after shutdown: ignored
    assert sum(map(len, exporter.batches)) == 4


class Blocking(Recording):
    """Holds its first export until released, so the queue fills meanwhile."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        names = [s.name for s in spans]
        self.exported.set()
        self.release.wait(30)
        self.batches.append(names)
        return SpanExportResult.SUCCESS


def test_a_full_queue_drops_new_spans_and_says_so(caplog: Any) -> None:
    exporter = Blocking()
    processor = CompactBatchSpanProcessor(
        exporter, max_queue_size=2, max_export_batch_size=100, schedule_delay_millis=60_000
    )
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    tracer.start_span("s0").end()
    tracer.start_span("s1").end()  # a full batch (capped at the queue's size): the worker takes it
    assert exporter.exported.wait(10)
    for name in ("s2", "s3", "s4"):
        tracer.start_span(name).end()
    assert "1 spans dropped" in caplog.text
    exporter.release.set()
    provider.shutdown()
    assert exporter.batches == [["s0", "s1"], ["s2", "s3"]]


def test_unsampled_spans_are_not_queued() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter = Recording()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(CompactBatchSpanProcessor(exporter))
    provider.get_tracer("t").start_span("dropped").end()
    provider.shutdown()
    assert exporter.batches == []
