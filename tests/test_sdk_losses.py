"""The SDK pipeline's losses are counted (`subagent.sdk_losses`), as the lean exporter counts
its own: its exporter's failures and its full queue are otherwise only log lines (or nothing),
which the CLI does not show."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from subagent.sdk_losses import TalliedExporter, TalliedProcessor, Tally
from supervision.offload import offload


class _Gated(SpanExporter):
    """Exports nothing until `gate` opens; then answers `result` (or raises `raises`)."""

    def __init__(self, result: SpanExportResult, raises: Exception | None = None) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.result = result
        self.raises = raises

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.gate.wait(30)
        if self.raises is not None:
            raise self.raises
        return self.result


def _pipeline(exporter: SpanExporter, queue: int) -> tuple[TracerProvider, Tally]:
    tally = Tally()
    batch = BatchSpanProcessor(
        TalliedExporter(exporter, tally), max_queue_size=queue, max_export_batch_size=1
    )
    provider = TracerProvider()
    provider.add_span_processor(TalliedProcessor(batch, tally))
    return provider, tally


def test_a_full_queue_is_counted_once_a_flush_finished() -> None:
    exporter = _Gated(SpanExportResult.SUCCESS)
    provider, tally = _pipeline(exporter, queue=2)
    tracer = provider.get_tracer("t")
    tracer.start_span("first").end()
    assert offload(exporter.entered.wait, 10)  # the worker holds one span in its export
    for i in range(9):
        tracer.start_span(f"s{i}").end()  # two fit the queue; the rest are dropped
    assert tally.dropped == 0  # not known before a flush has emptied the queue
    exporter.gate.set()
    assert offload(provider.force_flush, 10_000)
    assert tally.ended == 10
    assert 0 < tally.dropped == tally.ended - tally.exported
    assert tally.first_loss == "the batch queue was full"
    offload(provider.shutdown)


def test_failed_and_raising_exports_are_counted_with_the_first_cause() -> None:
    for exporter, cause in (
        (_Gated(SpanExportResult.FAILURE), "_Gated reported a failure"),
        (_Gated(SpanExportResult.SUCCESS, OSError("down")), "the exporter raised OSError"),
    ):
        exporter.gate.set()
        provider, tally = _pipeline(exporter, queue=64)
        tracer = provider.get_tracer("t")
        for i in range(5):
            tracer.start_span(f"s{i}").end()
        offload(provider.force_flush, 10_000)
        assert (tally.ended, tally.exported, tally.failed, tally.dropped) == (5, 0, 5, 5)
        assert tally.first_loss == cause
        offload(provider.shutdown)


def test_unsampled_spans_are_not_counted_as_handed_over() -> None:
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    exporter = _Gated(SpanExportResult.SUCCESS)
    exporter.gate.set()
    tally = Tally()
    provider = TracerProvider(sampler=ALWAYS_OFF)
    provider.add_span_processor(
        TalliedProcessor(BatchSpanProcessor(TalliedExporter(exporter, tally)), tally)
    )
    provider.get_tracer("t").start_span("dropped by the sampler").end()
    assert offload(provider.force_flush, 10_000)
    assert (tally.ended, tally.dropped, tally.first_loss) == (0, 0, None)
    offload(provider.shutdown)
