"""A batch span processor that keeps queued spans out of the garbage collector's way.

The SDK's `BatchSpanProcessor` queues each finished `ReadableSpan` (about ten GC-tracked
objects: the span, its attribute mapping, contexts, status...) until its export thread runs.
Under a gevent hub that thread gets the GIL only now and then, so thousands of spans wait,
survive young collections, are promoted, and make full collections both more frequent and
longer: on the fan-out benchmark that was half of tracing's cost (docs/performance.md).

This processor turns a finished span into one `bytes` value at `on_end` (a `marshal`led flat
tuple of numbers and strings: bytes are not tracked by the collector at all, so a queued span
neither counts towards the next young collection nor is ever scanned) and rebuilds a
`ReadableSpan` only in the export thread, just before handing a batch to the exporter. A span
with events, links, a trace state or dropped attributes (rare: steers, exceptions, resumes) is
queued as is. It honours the standard `OTEL_BSP_*` variables, as the SDK's processor does.
"""

from __future__ import annotations

import collections
import logging
import marshal
import os
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

__all__ = ["CompactBatchSpanProcessor"]

log = logging.getLogger(__name__)

# The context key every OpenTelemetry instrumentation checks before making spans (the SDK's
# own batch processor sets it around an export), so an instrumented HTTP client does not trace
# the exporter's requests. The API names it with an underscore; absent, nothing is suppressed.
_SUPPRESS = getattr(otel_context, "_SUPPRESS_INSTRUMENTATION_KEY", None)

_KINDS = tuple(SpanKind)
_CODES = tuple(StatusCode)
_INDEX_KIND = {kind: i for i, kind in enumerate(_KINDS)}
_INDEX_CODE = {code: i for i, code in enumerate(_CODES)}


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    text = env.get(name)
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        log.warning("%s=%r is not an integer; using %d", name, text, default)
        return default
    return value if value > 0 else default


def _call(ref: weakref.WeakMethod[Any]) -> None:
    method = ref()
    if method is not None:
        method()


class _Batch(Sequence[ReadableSpan]):
    """A batch whose spans are rebuilt as the exporter reaches them, so each one can be freed
    before the next is made (an exporter converts and drops them one by one): a batch never
    holds hundreds of live spans at once in the collector's young generation."""

    __slots__ = ("_expand", "_items")

    def __init__(self, items: list[Any], expand: Any) -> None:
        self._items = items
        self._expand = expand

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self._expand(item) for item in self._items[index]]
        return self._expand(self._items[index])

    def __iter__(self) -> Iterator[ReadableSpan]:
        expand = self._expand
        for item in self._items:
            yield expand(item)


class CompactBatchSpanProcessor(SpanProcessor):
    """Batches finished spans to `exporter` from a worker thread, stored compactly meanwhile."""

    def __init__(
        self,
        exporter: SpanExporter,
        *,
        max_queue_size: int | None = None,
        schedule_delay_millis: int | None = None,
        max_export_batch_size: int | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        self._exporter = exporter
        self._max_queue = max_queue_size or _env_int(env, "OTEL_BSP_MAX_QUEUE_SIZE", 2048)
        self._delay = (
            schedule_delay_millis or _env_int(env, "OTEL_BSP_SCHEDULE_DELAY", 5000)
        ) / 1000
        self._batch = min(
            max_export_batch_size or _env_int(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512),
            self._max_queue,
        )
        self._queue: collections.deque[Any] = collections.deque()
        # Resources and scopes are shared by many spans: a compact span names them by index.
        self._origins: list[tuple[Any, Any]] = []
        self._origin_index: dict[tuple[int, int], int] = {}
        self._dropped = 0
        self._wake = threading.Event()
        self._export_lock = threading.Lock()
        self._shutdown = False
        self._worker = self._start_worker()
        if hasattr(os, "register_at_fork"):  # a forked child gets its own worker, queue empty
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: _call(ref))

    def _start_worker(self) -> threading.Thread:
        worker = threading.Thread(target=self._work, name="subagent-span-batch", daemon=True)
        worker.start()
        return worker

    def _after_fork(self) -> None:
        self._queue.clear()
        self._export_lock = threading.Lock()
        self._wake = threading.Event()
        if not self._shutdown:
            self._worker = self._start_worker()

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        context = span.context
        if self._shutdown or context is None or not context.trace_flags.sampled:
            return
        queue = self._queue
        if len(queue) >= self._max_queue:
            self._dropped += 1
            if self._dropped == 1 or self._dropped % 10_000 == 0:
                log.warning("span queue full: %d spans dropped so far", self._dropped)
            return
        queue.append(self._compact(span, context))
        if len(queue) >= self._batch and not self._wake.is_set():
            self._wake.set()

    def _compact(self, span: ReadableSpan, context: SpanContext) -> Any:
        """A flat tuple for the common span, or the span itself when it carries more."""
        if span.events or span.links or context.trace_state or span.dropped_attributes:
            return span
        key = (id(span.resource), id(span.instrumentation_scope))
        origin = self._origin_index.get(key)
        if origin is None:
            origin = len(self._origins)
            self._origins.append((span.resource, span.instrumentation_scope))
            self._origin_index[key] = origin
        parent = span.parent
        status = span.status
        attributes: Any = span.attributes
        return marshal.dumps((
            span.name,
            context.trace_id,
            context.span_id,
            int(context.trace_flags),
            context.is_remote,
            0 if parent is None else parent.trace_id,
            0 if parent is None else parent.span_id,
            parent is not None and parent.is_remote,
            0 if parent is None else int(parent.trace_flags),
            _INDEX_KIND[span.kind],
            _INDEX_CODE[status.status_code],
            status.description,
            span.start_time,
            span.end_time,
            tuple(attributes.items()) if attributes else (),
            origin,
        ))  # fmt: skip

    def _expand(self, item: Any) -> ReadableSpan:
        if isinstance(item, ReadableSpan):
            return item
        (name, trace_id, span_id, flags, remote, p_trace, p_span, p_remote, p_flags,
         kind, code, description, start, end, attributes, origin) = marshal.loads(item)  # fmt: skip
        resource, scope = self._origins[origin]
        return ReadableSpan(
            name=name,
            context=SpanContext(trace_id, span_id, remote, TraceFlags(flags)),
            parent=None
            if not p_span
            else SpanContext(p_trace, p_span, p_remote, TraceFlags(p_flags)),
            resource=resource,
            attributes=dict(attributes),
            kind=_KINDS[kind],
            status=Status(_CODES[code], description),
            start_time=start,
            end_time=end,
            instrumentation_scope=scope,
        )

    def _work(self) -> None:
        while not self._shutdown:
            woken = self._wake.wait(self._delay)
            if self._shutdown:
                break
            self._wake.clear()
            self._export(everything=not woken)
        self._export(everything=True)

    def _export(self, everything: bool, deadline: float | None = None) -> bool:
        """Export full batches (and the rest too when `everything`); False if out of time."""
        with self._export_lock:
            queue = self._queue
            while queue and (everything or len(queue) >= self._batch):
                if deadline is not None and time.monotonic() > deadline:
                    return False
                count = min(self._batch, len(queue))
                batch = _Batch([queue.popleft() for _ in range(count)], self._expand)
                token = None
                if _SUPPRESS is not None:
                    token = otel_context.attach(otel_context.set_value(_SUPPRESS, True))
                try:
                    self._exporter.export(batch)
                except Exception:
                    log.exception("exporting %d spans failed", count)
                finally:
                    if token is not None:
                        otel_context.detach(token)
        return True

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self._shutdown:
            return True
        return self._export(everything=True, deadline=time.monotonic() + timeout_millis / 1000)

    def shutdown(self) -> None:
        if self._shutdown:
            return
        self._shutdown = True
        self._wake.set()
        self._worker.join()
        self._exporter.shutdown()
