"""Test helpers for tracing: install an SDK provider with an in-memory exporter, then remove it.

OpenTelemetry lets a process set its global tracer provider once; tests need a fresh one each,
so `installed()` resets the API's globals around the test (the same reset OpenTelemetry's own
test utilities do), leaving the process as it found it: no provider, tracing off.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from subagent.lean_tracing import LeanResource, LeanTracerProvider, MemorySink

# Which provider `installed()` makes when none is given: "sdk", or "lean" (the runtime's own
# provider for a supported `OTEL_*` set-up), so the same tests run against both.
FLAVOUR = ["sdk"]


def _reset() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


@contextmanager
def installed(provider: Any = None) -> Iterator[Any]:
    """A global provider recording to memory for the block (an SDK one, or the lean one under
    `flavour("lean")`); none again afterwards. Yields what has `get_finished_spans()`."""
    if provider is None and FLAVOUR[0] == "lean":
        sink = MemorySink()
        lean = LeanTracerProvider(LeanResource({"service.name": "test"}), sink)
        _reset()
        trace.set_tracer_provider(lean)
        try:
            yield sink
        finally:
            lean.shutdown()
            _reset()
        return
    exporter = InMemorySpanExporter()
    if provider is None:
        provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _reset()
    trace.set_tracer_provider(provider)
    try:
        yield exporter
    finally:
        provider.shutdown()
        _reset()


@contextmanager
def flavour(name: str) -> Iterator[None]:
    """`installed()` makes `name`'s provider ("sdk" or "lean") for the block."""
    before = FLAVOUR[0]
    FLAVOUR[0] = name
    try:
        yield
    finally:
        FLAVOUR[0] = before


@contextmanager
def no_provider() -> Iterator[None]:
    """The API's default state (no provider set) for the block, whatever came before."""
    _reset()
    try:
        yield
    finally:
        _reset()


def by_id(spans: Sequence[ReadableSpan]) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def parent_of(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    return by_id(spans).get(span.parent.span_id)


def ancestors(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> list[ReadableSpan]:
    out = []
    found = parent_of(span, spans)
    while found is not None:
        out.append(found)
        found = parent_of(found, spans)
    return out
