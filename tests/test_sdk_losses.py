"""The SDK pipeline's losses are counted (`subagent.sdk_losses`), as the lean exporter counts
its own: its exporter's failures and its full queue are otherwise only log lines (or nothing),
which the CLI does not show."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from subagent.sdk_losses import SdkExit, TalliedExporter, TalliedProcessor, Tally
from supervision.offload import offload


class _Gated(SpanExporter):
    """Exports nothing until `gate` opens; then answers `result` (or raises `raises`)."""

    def __init__(self, result: SpanExportResult, raises: Exception | None = None) -> None:
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.result = result
        self.raises = raises
        self.shutdowns = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.entered.set()
        self.gate.wait(30)
        if self.raises is not None:
            raise self.raises
        return self.result

    def shutdown(self) -> None:
        self.shutdowns += 1


def _pipeline(exporter: SpanExporter, queue: int) -> tuple[TracerProvider, Tally]:
    provider, tally, _ = _closable(exporter, queue, deadline_s=10)
    return provider, tally


def _closable(
    exporter: SpanExporter, queue: int, deadline_s: float
) -> tuple[TracerProvider, Tally, SdkExit]:
    """The runtime's SDK set-up around `exporter` (one span a batch) and its bounded exit."""
    tally = Tally()
    front = TalliedExporter(exporter, tally)
    batch = BatchSpanProcessor(front, max_queue_size=queue, max_export_batch_size=1)
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(TalliedProcessor(batch, tally))
    return provider, tally, SdkExit(provider, [front], [tally], deadline_s)


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


def test_an_exit_cut_by_its_deadline_counts_every_span_not_exported_and_stops_the_exporter() -> (
    None
):
    """The export hangs (a silent collector): `close` gives up at its deadline, counts the span
    in the export and those still queued, and shuts the exporter down (the SDK's OTLP exporter
    then stops retrying). An export that ends later changes nothing the count said."""
    for cooperative in (True, False):  # a CLI command's exit, and interpreter exit
        exporter = _Gated(SpanExportResult.SUCCESS)
        provider, tally, closing = _closable(exporter, queue=64, deadline_s=0.2)
        tracer = provider.get_tracer("t")
        tracer.start_span("in the export").end()
        assert offload(exporter.entered.wait, 10)
        for i in range(4):
            tracer.start_span(f"queued {i}").end()
        if cooperative:
            assert closing.close(cooperative=True) is False
        else:
            assert offload(closing.close, False) is False
        assert exporter.shutdowns == 1
        assert tally.dropped == 5
        assert tally.first_loss == "the exit deadline (0.2 s) passed before they were exported"
        exporter.gate.set()  # the hung export ends after all: too late to count
        assert closing.close() is True  # once only
        assert tally.dropped == 5 and exporter.shutdowns == 1


def test_an_exit_within_its_deadline_counts_what_the_full_queue_dropped() -> None:
    """The flush and the shutdown finish in time: nothing is queued then, so every span not
    exported was dropped by the full queue, and the count is exact."""
    exporter = _Gated(SpanExportResult.SUCCESS)
    provider, tally, closing = _closable(exporter, queue=2, deadline_s=30)
    tracer = provider.get_tracer("t")
    tracer.start_span("first").end()
    assert offload(exporter.entered.wait, 10)
    for i in range(9):
        tracer.start_span(f"s{i}").end()  # two fit the queue; the rest are dropped
    exporter.gate.set()
    assert closing.close() is True
    assert tally.ended == 10 and tally.exported == 3
    assert (tally.dropped, tally.first_loss) == (7, "the batch queue was full")
    assert exporter.shutdowns == 1  # the provider's shutdown reached it, once


def test_a_failure_before_the_cut_is_named_first() -> None:
    tally = Tally()
    tally.ended = 6
    tally.exported = 1
    tally.lost(2, "OTLPSpanExporter reported a failure")
    tally.close("the exit deadline (5 s) passed")
    assert tally.dropped == 5
    assert tally.first_loss == (
        "OTLPSpanExporter reported a failure, and the exit deadline (5 s) passed before the "
        "rest were exported"
    )
    tally.lost(3, "later")
    tally.exported += 2
    tally.close(None)
    assert tally.dropped == 5  # fixed at the first close
    assert tally.first_loss is not None and tally.first_loss.startswith("OTLPSpanExporter")


def test_an_exit_where_no_thread_can_start_shuts_the_sdk_down_in_the_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """At interpreter exit on Python 3.12+ no thread starts: the SDK's own shutdown runs in the
    exiting thread instead (it exports what is queued), and the tally is closed after it."""
    exporter = _Gated(SpanExportResult.SUCCESS)
    exporter.gate.set()
    provider, tally, closing = _closable(exporter, queue=64, deadline_s=10)
    tracer = provider.get_tracer("t")
    for i in range(3):
        tracer.start_span(f"s{i}").end()

    def refused(self: threading.Thread) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    monkeypatch.setattr(threading.Thread, "start", refused)
    assert offload(closing.close, False) is True
    monkeypatch.undo()
    assert (tally.ended, tally.exported, tally.dropped) == (3, 3, 0)
    assert exporter.shutdowns == 1
