"""What the OpenTelemetry SDK's pipeline loses, counted for the CLI's exit line.

The runtime's lean exporter counts its own losses (`BatchExporter.dropped`). When a set-up
needs the SDK's pipeline instead (console, gRPC, deflate, span limits, `SUBAGENT_OTEL_SDK`),
its losses are only log lines, which `subagent demo` and `run` do not show: a wrong endpoint
lost every span without a word, and a full batch queue drops spans silently. So the runtime's
own SDK set-up puts a tally around each batch processor and its exporter: spans handed to the
processor, spans exported, spans in exports that failed. Imported only with the SDK.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["TalliedExporter", "TalliedProcessor", "Tally"]


class Tally:
    """One processor's counts. Read as the lean exporter is (`dropped`, `first_loss`)."""

    __slots__ = ("_failure", "drained", "ended", "exported", "failed")

    def __init__(self) -> None:
        self.ended = 0  # sampled spans handed to the batch processor
        self.exported = 0  # spans in exports that succeeded
        self.failed = 0  # spans in exports that failed or raised
        self.drained = False  # a flush finished since the last span ended
        self._failure: str | None = None

    @property
    def dropped(self) -> int:
        """Spans lost so far: those in failed exports, and, right after a flush that finished
        (nothing is queued then), those never exported at all: the full queue dropped them."""
        unexported = self.ended - self.exported - self.failed
        return self.failed + (unexported if self.drained and unexported > 0 else 0)

    @property
    def first_loss(self) -> str | None:
        if self._failure is not None:
            return self._failure
        return "the batch queue was full" if self.dropped else None

    def lost(self, count: int, reason: str) -> None:
        self.failed += count
        if self._failure is None:
            self._failure = reason


class TalliedExporter(SpanExporter):
    """An exporter that counts what it exported and what failed, then answers as `inner`."""

    def __init__(self, inner: SpanExporter, tally: Tally) -> None:
        self._inner = inner
        self._tally = tally

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self._inner.export(spans)
        except Exception as exc:  # the processor logs it; the count is ours
            self._tally.lost(len(spans), f"the exporter raised {type(exc).__name__}")
            raise
        if result is SpanExportResult.SUCCESS:
            self._tally.exported += len(spans)
        else:
            self._tally.lost(len(spans), f"{type(self._inner).__name__} reported a failure")
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)


class TalliedProcessor(SpanProcessor):
    """A batch processor's front: counts each sampled span it is handed (the batch processor
    keeps only those), then passes every call on."""

    def __init__(self, inner: SpanProcessor, tally: Tally) -> None:
        self._inner = inner
        self._tally = tally

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self._inner.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if context is not None and context.trace_flags.sampled:
            self._tally.ended += 1
            self._tally.drained = False
        self._inner.on_end(span)

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        drained = self._inner.force_flush(timeout_millis)
        self._tally.drained = drained
        return drained
