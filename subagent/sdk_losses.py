"""What the OpenTelemetry SDK's pipeline loses, counted for the CLI's exit line.

The runtime's lean exporter counts its own losses (`BatchExporter.dropped`). When a set-up
needs the SDK's pipeline instead (console, gRPC, deflate, span limits, `SUBAGENT_OTEL_SDK`),
its losses are only log lines, which `subagent demo` and `run` do not show: a wrong endpoint
lost every span without a word, and a full batch queue drops spans silently. So the runtime's
own SDK set-up puts a tally around each batch processor and its exporter: spans handed to the
processor, spans exported, spans in exports that failed. Imported only with the SDK.

It also bounds the pipeline's exit (`SdkExit`): the SDK's flush ignores its timeout and its
OTLP exporter retries each batch until its own timeout, so against a collector that is down
a process waited tens of seconds at exit for spans nobody would receive.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

import gevent
import gevent.event
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = ["SdkExit", "TalliedExporter", "TalliedProcessor", "Tally", "run_bounded"]

log = logging.getLogger(__name__)


class Tally:
    """One processor's counts. Read as the lean exporter is (`dropped`, `first_loss`)."""

    __slots__ = ("_closed", "_failure", "_said", "drained", "ended", "exported", "failed")

    def __init__(self) -> None:
        self.ended = 0  # sampled spans handed to the batch processor
        self.exported = 0  # spans in exports that succeeded
        self.failed = 0  # spans in exports that failed or raised
        self.drained = False  # a flush finished since the last span ended
        self._failure: str | None = None
        self._closed: int | None = None  # the final count, once the pipeline is closed
        self._said: str | None = None  # the final cause, once closed

    @property
    def dropped(self) -> int:
        """Spans lost so far: those in failed exports, and, right after a flush that finished
        (nothing is queued then), those never exported at all: the full queue dropped them.
        Once the pipeline is closed (`close`), every span handed over and not exported."""
        if self._closed is not None:
            return self._closed
        unexported = self.ended - self.exported - self.failed
        return self.failed + (unexported if self.drained and unexported > 0 else 0)

    @property
    def first_loss(self) -> str | None:
        if self._closed is not None:
            return self._said
        if self._failure is not None:
            return self._failure
        return "the batch queue was full" if self.dropped else None

    def close(self, cut: str | None = None) -> None:
        """The pipeline is closed: a span handed over and not exported by now never will be
        (still queued, dropped by a full queue, or in an export `cut` short: e.g. "the exit
        deadline (5 s) passed"). The count and its cause are fixed here: an export that ends
        later changes nothing the exit line says. Only the first close counts."""
        if self._closed is not None:
            return
        lost = max(self.ended - self.exported, self.failed)
        said = self._failure
        if cut is not None and lost > self.failed:
            if said is None:
                said = f"{cut} before they were exported"
            else:
                said = f"{said}, and {cut} before the rest were exported"
        elif said is None and lost:
            said = "the batch queue was full"
        self._said = said
        self._closed = lost

    def lost(self, count: int, reason: str) -> None:
        self.failed += count
        if self._failure is None:
            self._failure = reason


class TalliedExporter(SpanExporter):
    """An exporter that counts what it exported and what failed, then answers as `inner`."""

    def __init__(self, inner: SpanExporter, tally: Tally) -> None:
        self._inner = inner
        self._tally = tally
        self._shut = False
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shut:  # the rest of a flush cut by the exit deadline: lost, without a word
            self._tally.lost(len(spans), "the exporter was shut down")
            return SpanExportResult.FAILURE
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
        """Shut the inner exporter down once (the exit's cut and the processor's shutdown may
        both ask; the SDK's exporter warns at a second call). The SDK's OTLP exporter then
        abandons its retry back-off and refuses further batches."""
        with self._lock:
            if self._shut:
                return
            self._shut = True
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


def run_bounded(work: Callable[[], object], timeout_s: float, cooperative: bool = True) -> bool:
    """Run `work` (an SDK call that may block for as long as its collector likes) in a daemon
    thread of its own, and wait for it at most `timeout_s`: True if it finished. `cooperative`
    waits on the gevent hub (other greenlets run meanwhile); False in the calling thread (at
    interpreter exit, no hub running). Past the timeout the thread is left behind, a daemon.
    `RuntimeError` when no thread can start (at interpreter exit on Python 3.12+)."""
    done = threading.Event()
    woken = gevent.event.Event() if cooperative else None
    loop = gevent.get_hub().loop if cooperative else None

    def run() -> None:
        try:
            work()
        except Exception:  # the SDK's own failure: its losses are counted where they happen
            log.exception("flushing spans failed")
        finally:
            done.set()
            if loop is not None and woken is not None:
                loop.run_callback_threadsafe(woken.set)

    threading.Thread(target=run, name="subagent-otel-flush", daemon=True).start()
    if woken is not None:
        woken.wait(timeout_s)
    else:
        done.wait(timeout_s)
    return done.is_set()


class SdkExit:
    """Flush and shut down the SDK provider the runtime installed, all within one deadline.

    The SDK gives no bound a dead collector respects: `BatchSpanProcessor.force_flush` ignores
    its `timeout_millis` and exports every queued batch in the calling thread (SDK 1.45; its
    `export_timeout_millis` is stored, unused), and the OTLP exporter retries each batch with
    back-off until its own timeout (10 s by default), or, against a collector that never
    answers, waits that long in one request. So the flush and the shutdown run in a thread of
    their own (a daemon) while the caller waits for at most `deadline_s`. Past the deadline the
    tallies are closed first (what was not exported by then is counted lost, `Tally.close`),
    then each exporter is shut down through the SDK's public `shutdown()`, which ends its
    retry back-off at once and makes the batches still queued fail without a request. A request
    already waiting on a silent collector cannot be cut through any public call: its thread is
    left behind, a daemon, and ends with the process (or at the exporter's timeout)."""

    def __init__(
        self,
        provider: TracerProvider,
        exporters: Sequence[TalliedExporter],
        tallies: Sequence[Tally],
        deadline_s: float,
    ) -> None:
        self._provider = provider
        self._exporters = tuple(exporters)
        self._tallies = tuple(tallies)
        self.deadline_s = deadline_s
        self._started = False
        self._lock = threading.Lock()

    def close(self, cooperative: bool = True) -> bool:
        """Flush, then shut down; True if both finished within the deadline. `cooperative`
        waits on the gevent hub (a CLI command's exit: other greenlets run meanwhile); False
        waits in the calling thread (at interpreter exit, no hub running). Only the first call
        does anything; later ones return True at once."""
        with self._lock:
            if self._started:
                return True
            self._started = True
        provider = self._provider

        def work() -> None:
            provider.force_flush(int(self.deadline_s * 1000))
            provider.shutdown()

        try:
            finished = run_bounded(work, self.deadline_s, cooperative)
        except RuntimeError:
            # No new thread at interpreter exit (Python 3.12+): the SDK's own shutdown, in the
            # calling thread, within the SDK's own bounds (docs/tracing.md).
            provider.shutdown()
            self._close_tallies(None)
            return True
        if finished:
            self._close_tallies(None)
            return True
        self._cut(f"the exit deadline ({self.deadline_s:g} s) passed")
        return False

    def give_up(self, cut: str) -> None:
        """End the exit now (Ctrl-C cut its wait): what is not exported yet is lost by `cut`,
        e.g. "the exit was interrupted". A later `close` does nothing."""
        with self._lock:
            self._started = True
        self._cut(cut)

    def _cut(self, cut: str) -> None:
        """Count what is not exported yet as lost, then stop the exporters' retries."""
        self._close_tallies(cut)
        for exporter in self._exporters:
            try:
                exporter.shutdown()
            except Exception:  # the count is said already; a failing shutdown changes nothing
                log.debug("shutting an exporter down at the exit deadline failed", exc_info=True)

    def _close_tallies(self, why: str | None) -> None:
        for tally in self._tallies:
            tally.close(why)
