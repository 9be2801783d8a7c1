"""A lean implementation of the OpenTelemetry tracing API, for the set-up the runtime makes itself.

When the runtime configures tracing from `OTEL_*` (`telemetry.configure_from_env`) and the
settings are ones this module supports, it installs `LeanTracerProvider` instead of the SDK's:
a span is a small slotted object that records only what is set (no attribute mapping with its
lock and per-value cleaning, no span limits, no span processor chain), ids come from `random`
(reseeded by Python after a fork), and ended spans go to one sink: the OTLP batch exporter
(`subagent.otlp`) or, in tests, `MemorySink`. Measured on the fan-out job the SDK's spans alone
cost 1.9x the untraced job, before any exporter (docs/performance.md, `tracing`).

What it is not: no `add_span_processor` (one sink, fixed at construction), no span limits (no
attribute, event or link is dropped for count or length), no per-span lock (a span is meant to be
used by one thread at a time, as the runtime does), no id generator or sampler plug-ins (the
standard samplers only, `Sampling`). Any other set-up keeps the SDK (docs/tracing.md).
"""

from __future__ import annotations

import contextlib
import logging
import random
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple, Protocol, cast

from opentelemetry import trace
from opentelemetry.context import Context, get_current
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import Attributes, AttributeValue

__all__ = [
    "EndLeaf",
    "LeafSink",
    "LeanResource",
    "LeanSpan",
    "LeanTracer",
    "LeanTracerProvider",
    "MemorySink",
    "RecordLeaf",
    "Sampling",
    "Scope",
    "SpanEvent",
    "SpanSink",
    "SpanTemplate",
    "Subspans",
    "clean_value",
    "draw_span_id",
    "plain_value",
]

log = logging.getLogger(__name__)

_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_NOT_SAMPLED = TraceFlags(TraceFlags.DEFAULT)
_SCALARS = (str, bool, int, float)
_bits = random.getrandbits  # the module's instance: Python reseeds it in a forked child
_time_ns = time.time_ns
_new_span = object.__new__
_new_event = tuple.__new__


def _span_key() -> str:
    """The context key under which the API keeps the current span, found through the API
    (`set_span_in_context`): reading it directly saves `get_current_span`'s ABC check."""
    marker = NonRecordingSpan(SpanContext(1, 1, False))
    found = trace.set_span_in_context(marker, Context())
    return next(key for key, value in found.items() if value is marker)


_SPAN_KEY = _span_key()


class SpanEvent(NamedTuple):
    """A span event as recorded (read by the encoder and, in tests, like the SDK's `Event`)."""

    name: str
    timestamp: int
    attributes: Mapping[str, AttributeValue] | None


class Scope:
    """An instrumentation scope (the tracer's name and version): spans are grouped by it."""

    __slots__ = ("attributes", "name", "schema_url", "version")

    def __init__(
        self,
        name: str,
        version: str | None = None,
        schema_url: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
    ) -> None:
        self.name = name
        self.version = version
        self.schema_url = schema_url
        self.attributes = attributes


class LeanResource:
    """The process's resource: its attributes (`service.name`, ...)."""

    __slots__ = ("attributes",)

    def __init__(self, attributes: Mapping[str, AttributeValue]) -> None:
        self.attributes = dict(attributes)


class SpanSink(Protocol):
    """Where ended spans go: the batch exporter, or `MemorySink` in tests."""

    def on_end(self, span: LeanSpan) -> None: ...

    def force_flush(self, timeout_s: float) -> bool: ...

    def shutdown(self, timeout_s: float) -> None: ...


class LeafSink(Protocol):
    """A sink with its own one-frame paths for the spans under one parent (the batch exporter):
    `leaves(...)` gives `record` (a span made and ended in one step, without a span object: the
    runtime's `chat` spans) and `end` (a templated span's end: its `execute_tool` spans)."""

    def leaves(
        self, scope: Scope, trace_id: int, parent_id: int, trace_state: TraceState | None
    ) -> tuple[RecordLeaf, EndLeaf]: ...


# `Subspans.record` and `Subspans.end` as a `LeafSink` gives them.
RecordLeaf = Callable[["SpanTemplate", int, "dict[str, AttributeValue] | None"], None]
EndLeaf = Callable[["LeanSpan"], None]


class MemorySink:
    """Keeps every ended span, in order (for tests; the SDK's in-memory exporter's role)."""

    def __init__(self) -> None:
        self.spans: list[LeanSpan] = []

    def on_end(self, span: LeanSpan) -> None:
        self.spans.append(span)

    def get_finished_spans(self) -> tuple[LeanSpan, ...]:
        return tuple(self.spans)

    def force_flush(self, timeout_s: float) -> bool:
        return True

    def shutdown(self, timeout_s: float) -> None:
        return


def _clean(value: object) -> AttributeValue | None:
    """An attribute value the API allows (a scalar, or a homogeneous sequence of them, kept as a
    tuple), or None for anything else (the SDK drops those too, with a warning)."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass (an enum) as its characters, as the SDK
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        items = tuple(value)
        kinds = {type(item) for item in items if item is not None}
        if len(kinds) <= 1 and kinds <= set(_SCALARS):
            return cast("AttributeValue", items)  # checked: one scalar type throughout
    log.warning("invalid span attribute value of type %s dropped", type(value).__name__)
    return None


# Tuples already checked to hold one scalar type (a span's `finish_reasons`, a list of names):
# the runtime passes the same few tuple objects again and again.
_CHECKED: dict[tuple[object, ...], bool] = {}


def _plain(value: object) -> bool:
    """Whether `value` is kept as it is: a plain scalar, or a tuple of one scalar type."""
    kind = type(value)
    if kind in _SCALARS:
        return True
    if kind is not tuple:
        return False
    items = cast("tuple[object, ...]", value)  # by the check above
    try:
        found = _CHECKED.get(items)
    except TypeError:  # unhashable items: not a valid value anyway
        return False
    if found is None:
        if len(_CHECKED) >= 1024:
            _CHECKED.clear()
        kinds = {type(item) for item in items}
        found = _CHECKED[items] = len(kinds) == 1 and kinds <= set(_SCALARS)
    return found


# For the exporter's own encoding of attributes it is given unchecked (`LeafSink`).
clean_value = _clean
plain_value = _plain


def _cleaned(attributes: Attributes) -> dict[str, AttributeValue] | None:
    """A copy of `attributes` holding only values the API allows (None when empty)."""
    if not attributes:
        return None
    out = dict(attributes)
    for value in out.values():
        if type(value) not in _SCALARS and not _plain(value):
            break
    else:
        return out
    clean: dict[str, AttributeValue] = {}
    for key, value in out.items():
        kept = _clean(value)
        if kept is not None:
            clean[key] = kept
    return clean or None


def _as_given_or_cleaned(
    attributes: dict[str, AttributeValue] | None,
) -> dict[str, AttributeValue] | None:
    """A template's own attributes, taken over as given when every value is a plain scalar (the
    common case: no copy), else cleaned as the API's `set_attribute` would."""
    if attributes:
        for value in attributes.values():
            if type(value) not in _SCALARS and not _plain(value):
                return _cleaned(attributes)
    return attributes


class SpanTemplate:
    """What spans of one sort share: a name, a kind and leading attributes, checked once.

    The runtime's `chat` and `execute_tool` spans repeat these (`gen_ai.operation.name`, the
    model, the tool's name); a span made from a template (`Subspans`) holds it instead of a copy
    of them, and the exporter encodes them once per template (kept in `wire`). Immutable once
    made: a span that changes its name, or sets a key the template holds, stops using it."""

    __slots__ = ("attributes", "keys", "kind", "name", "wire")

    def __init__(self, name: str, kind: SpanKind, attributes: Attributes = None) -> None:
        cleaned = _cleaned(attributes) or {}
        self.name = name
        self.kind = kind
        self.attributes: tuple[tuple[str, AttributeValue], ...] = tuple(cleaned.items())
        self.keys = frozenset(cleaned)
        self.wire: bytes | None = None  # the encoder's bytes for name, kind and attributes

    def __repr__(self) -> str:
        return f"SpanTemplate({self.name!r}, {self.kind}, {dict(self.attributes)!r})"


def draw_span_id() -> int:
    """A span id, never 0 (invalid): for the one draw in 2**64 that is (callers try
    `getrandbits(64)` first, then this)."""
    span_id = 0
    while not span_id:
        span_id = _bits(64)
    return span_id


class LeanSpan(trace.Span):
    """One recording span: its ids, what was set on it, and its sink (told at `end`).

    The encoder reads the public slots; tests read it as they read the SDK's `ReadableSpan`
    (`name`, `context`, `parent`, `attributes`, `events`, `links`, `status`, `kind`).
    A span made from a `SpanTemplate` keeps the template's attributes there and only its own
    in `attrs`, after them."""

    __slots__ = (
        "attrs",
        "cached_context",
        "end_time",
        "event_list",
        "exit_records",
        "kind",
        "link_list",
        "parent_id",
        "parent_remote",
        "scope",
        "sink",
        "span_id",
        "span_name",
        "start_time",
        "status_code",
        "status_message",
        "template",
        "trace_id",
        "trace_state",
    )

    def __init__(
        self,
        name: str,
        trace_id: int,
        span_id: int,
        parent_id: int,
        parent_remote: bool,
        trace_state: TraceState | None,
        kind: SpanKind,
        start_time: int,
        attrs: dict[str, AttributeValue] | None,
        links: list[Link] | None,
        scope: Scope,
        sink: SpanSink,
        on_exit: bool,
        template: SpanTemplate | None = None,
    ) -> None:
        self.span_name = name
        self.trace_id = trace_id
        self.span_id = span_id
        self.parent_id = parent_id
        self.parent_remote = parent_remote
        self.trace_state = trace_state
        self.kind = kind
        self.start_time = start_time
        self.end_time = 0
        self.attrs = attrs
        self.event_list: list[SpanEvent] | None = None
        self.link_list = links
        self.status_code = 0
        self.status_message: str | None = None
        self.scope = scope
        self.sink = sink
        self.exit_records = on_exit  # `with`: an exception is recorded
        self.cached_context: SpanContext | None = None  # made on first read
        self.template = template

    def _own_attributes(self) -> None:
        """Stop using the template: its attributes become this span's own (first, in order)."""
        template = self.template
        if template is not None:
            self.template = None
            merged = dict(template.attributes)
            if self.attrs:
                merged.update(self.attrs)
            self.attrs = merged or None

    # -- the API -------------------------------------------------------------------------------

    def get_span_context(self) -> SpanContext:
        found = self.cached_context
        if found is None:
            found = self.cached_context = SpanContext(
                self.trace_id, self.span_id, False, _SAMPLED, self.trace_state
            )
        return found

    def is_recording(self) -> bool:
        return self.end_time == 0

    def end(self, end_time: int | None = None) -> None:
        if self.end_time:
            return  # ended once (the SDK warns and ignores too)
        self.end_time = end_time or time.time_ns()
        self.sink.on_end(self)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        if self.end_time:
            return
        if type(value) not in _SCALARS:
            cleaned = _clean(value)
            if cleaned is None:
                return
            value = cleaned
        template = self.template
        if template is not None and key in template.keys:
            self._own_attributes()
        attrs = self.attrs
        if attrs is None:
            self.attrs = {key: value}
        else:
            attrs[key] = value

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        for key, value in attributes.items():
            self.set_attribute(key, value)

    def add_event(
        self, name: str, attributes: Attributes = None, timestamp: int | None = None
    ) -> None:
        if self.end_time:
            return
        # As `SpanEvent(...)`, without the named tuple's Python-level `__new__`.
        event = _new_event(SpanEvent, (name, timestamp or time.time_ns(), _cleaned(attributes)))
        if self.event_list is None:
            self.event_list = [event]
        else:
            self.event_list.append(event)

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        if self.end_time or not context.is_valid:
            return
        link = Link(context, _cleaned(attributes))
        if self.link_list is None:
            self.link_list = [link]
        else:
            self.link_list.append(link)

    def update_name(self, name: str) -> None:
        if not self.end_time:
            self._own_attributes()  # the template's encoding holds the old name
            self.span_name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        # As the SDK: OK is final, UNSET is ignored, a description is kept for ERROR only.
        if self.end_time or self.status_code == 1:
            return
        if isinstance(status, Status):
            code, description = status.status_code, status.description
        else:
            code = status
        if code is StatusCode.UNSET:
            return
        self.status_code = code.value
        self.status_message = description if code is StatusCode.ERROR else None

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        kind = type(exception)
        module = kind.__module__
        name = (
            f"{module}.{kind.__qualname__}"
            if module and module != "builtins"
            else kind.__qualname__
        )
        recorded: dict[str, AttributeValue] = {
            "exception.type": name,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        if attributes:
            recorded.update(attributes)
        self.add_event("exception", recorded, timestamp)

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        """`with tracer.start_span(...)`: an exception is recorded and sets ERROR, as the SDK."""
        if exc is not None and self.exit_records and not self.end_time:
            self.record_exception(exc, escaped=True)
            self.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
        self.end()

    # -- read like the SDK's ReadableSpan ------------------------------------------------------

    @property
    def name(self) -> str:
        return self.span_name

    @property
    def context(self) -> SpanContext:
        return self.get_span_context()

    @property
    def parent(self) -> SpanContext | None:
        if not self.parent_id:
            return None
        return SpanContext(
            self.trace_id, self.parent_id, self.parent_remote, _SAMPLED, self.trace_state
        )

    @property
    def attributes(self) -> Mapping[str, AttributeValue]:
        template = self.template
        if template is None:
            return self.attrs or {}
        merged = dict(template.attributes)
        if self.attrs:
            merged.update(self.attrs)
        return merged

    @property
    def events(self) -> Sequence[SpanEvent]:
        return tuple(self.event_list or ())

    @property
    def links(self) -> Sequence[Link]:
        return tuple(self.link_list or ())

    @property
    def status(self) -> Status:
        return Status(StatusCode(self.status_code), self.status_message)

    def __repr__(self) -> str:
        return f"LeanSpan({self.span_name!r}, {self.span_id:016x})"


class Sampling:
    """The standard samplers (`OTEL_TRACES_SAMPLER`): `always_on`, `always_off`,
    `traceidratio`, and `parentbased_` each (a span with a parent follows the parent's flag)."""

    NAMES = (
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    )

    __slots__ = ("bound", "name", "parent_based", "ratio")

    def __init__(self, name: str = "parentbased_always_on", ratio: float = 1.0) -> None:
        if name not in self.NAMES:
            raise ValueError(f"unsupported sampler {name!r}")
        if not 0.0 <= ratio <= 1.0:
            raise ValueError(f"sampler ratio {ratio!r} is not within [0, 1]")
        self.name = name
        self.parent_based = name.startswith("parentbased_")
        root = name.removeprefix("parentbased_")
        self.ratio = ratio if root == "traceidratio" else (1.0 if root == "always_on" else 0.0)
        # As the SDK's TraceIdRatioBased: the trace id's low 64 bits against ratio * 2^64.
        self.bound = round(self.ratio * (1 << 64))

    def sampled(self, has_parent: bool, parent_sampled: bool, trace_id: int) -> bool:
        if has_parent and self.parent_based:
            return parent_sampled
        return (trace_id & 0xFFFFFFFFFFFFFFFF) < self.bound


def _parentage(base: Context) -> tuple[int, int, bool, TraceState | None, bool]:
    """Trace id, parent span id, whether the parent is remote, its trace state and whether it
    was sampled, for a span started under `base`; a fresh trace id when it has no valid span."""
    parent = base.get(_SPAN_KEY)
    if type(parent) is LeanSpan:
        return parent.trace_id, parent.span_id, False, parent.trace_state, True
    found = trace.get_current_span(base).get_span_context()
    if found.is_valid:
        return (
            found.trace_id,
            found.span_id,
            found.is_remote,
            found.trace_state,
            found.trace_flags.sampled,
        )
    trace_id = 0
    while not trace_id:
        trace_id = _bits(128)
    return trace_id, 0, False, None, False


class LeanTracer(trace.Tracer):
    """Starts `LeanSpan`s for one instrumentation scope."""

    __slots__ = ("_sampling", "_scope", "_sink")

    def __init__(self, scope: Scope, sampling: Sampling, sink: SpanSink) -> None:
        self._scope = scope
        self._sampling = sampling
        self._sink = sink

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> trace.Span:
        trace_id, parent_id, remote, state, parent_sampled = _parentage(
            context if context is not None else get_current()
        )
        span_id = _bits(64) or draw_span_id()
        sampling = self._sampling
        if not (
            (parent_sampled and sampling.parent_based)
            or sampling.sampled(parent_id != 0, parent_sampled, trace_id)
        ):
            return NonRecordingSpan(SpanContext(trace_id, span_id, False, _NOT_SAMPLED, state))
        kept = None
        if links:
            kept = [link for link in links if link.context.is_valid] or None
        return LeanSpan(
            name,
            trace_id,
            span_id,
            parent_id,
            remote,
            state,
            kind,
            start_time or time.time_ns(),
            _cleaned(attributes),
            kept,
            self._scope,
            self._sink,
            record_exception and set_status_on_exception,
        )

    @staticmethod
    def template(name: str, kind: SpanKind, attributes: Attributes = None) -> SpanTemplate:
        """A template for spans named `name` of `kind` whose attributes start with these
        (`start_current`)."""
        return SpanTemplate(name, kind, attributes)

    def start_current(
        self,
        template: SpanTemplate,
        attributes: dict[str, AttributeValue] | None,
        context: Context | None,
        links: Sequence[Link] | None = None,
    ) -> tuple[trace.Span, Context]:
        """`start_span` from `template` under `context` (the current one if None), and that
        context with the span as its current span, in one step: for a span made per child (an
        activation) whose name, kind and leading attributes repeat. `attributes` are taken
        over, not copied."""
        base = context if context is not None else get_current()
        trace_id, parent_id, remote, state, parent_sampled = _parentage(base)
        span_id = _bits(64) or draw_span_id()
        sampling = self._sampling
        span: trace.Span
        if not (
            (parent_sampled and sampling.parent_based)
            or sampling.sampled(parent_id != 0, parent_sampled, trace_id)
        ):
            span = NonRecordingSpan(SpanContext(trace_id, span_id, False, _NOT_SAMPLED, state))
            return span, Context({**base, _SPAN_KEY: span})
        if attributes:
            for value in attributes.values():
                if type(value) not in _SCALARS and not _plain(value):
                    attributes = _cleaned(attributes)
                    break
        kept = None
        if links:
            kept = [link for link in links if link.context.is_valid] or None
        made = LeanSpan(
            template.name,
            trace_id,
            span_id,
            parent_id,
            remote,
            state,
            template.kind,
            _time_ns(),
            attributes or None,
            kept,
            self._scope,
            self._sink,
            True,
            template,
        )
        return made, Context({**base, _SPAN_KEY: made})

    def subspans(self, parent: trace.Span) -> Subspans | None:
        """The cheaper path for spans under `parent` (`Subspans`), or None where it does not
        apply: `parent` is not a recording lean span, or the sampler would drop its children
        (the caller then uses `start_span`)."""
        if type(parent) is not LeanSpan or not parent.is_recording():
            return None
        if not self._sampling.sampled(True, True, parent.trace_id):
            return None
        return Subspans(parent, self._scope, self._sink)

    # The API types this as its own private context-manager class; a generator one is the same
    # to every caller (a `with` block, or a decorator).
    @contextlib.contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[trace.Span]:
        span = self.start_span(
            name,
            context,
            kind,
            attributes,
            links,
            start_time,
            record_exception,
            set_status_on_exception,
        )
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current


class Subspans:
    """Spans under one recording lean span, made without the API's generic steps: the parent,
    its trace, the sampling decision and the sink are settled once (`LeanTracer.subspans`), and
    each span starts from a `SpanTemplate`. For the runtime's `chat` and `execute_tool` spans,
    made by the thousand under each turn's span (agent/tracing.py).

    `record` and `end` are the sink's own one-frame paths when it has them (`LeafSink`: the
    batch exporter encodes and queues the span there), else this class's generic ones."""

    __slots__ = ("_parent_id", "_scope", "_sink", "_state", "_trace_id", "end", "record")

    def __init__(self, parent: LeanSpan, scope: Scope, sink: SpanSink) -> None:
        self._trace_id = parent.trace_id
        self._parent_id = parent.span_id
        self._state = parent.trace_state
        self._scope = scope
        self._sink = sink
        self.record: RecordLeaf
        self.end: EndLeaf
        if getattr(sink, "leaves", None) is not None:
            leaves = cast("LeafSink", sink)
            self.record, self.end = leaves.leaves(
                scope, parent.trace_id, parent.span_id, self._state
            )
        else:
            self.record = self._record
            self.end = LeanSpan.end  # called with the span: `span.end()`

    @staticmethod
    def template(name: str, kind: SpanKind, attributes: Attributes = None) -> SpanTemplate:
        """A template for spans named `name` of `kind` whose attributes start with these."""
        return SpanTemplate(name, kind, attributes)

    def start(
        self,
        template: SpanTemplate,
        attributes: dict[str, AttributeValue] | None = None,
        start_time: int | None = None,
    ) -> LeanSpan:
        """A started span: the template's name, kind and attributes, then `attributes` (taken
        over by the span, not copied)."""
        attributes = _as_given_or_cleaned(attributes)
        return LeanSpan(
            template.name,
            self._trace_id,
            _bits(64) or draw_span_id(),
            self._parent_id,
            False,
            self._state,
            template.kind,
            start_time or time.time_ns(),
            attributes or None,
            None,
            self._scope,
            self._sink,
            True,
            template,
        )

    def start_current(
        self,
        template: SpanTemplate,
        attributes: dict[str, AttributeValue] | None,
        context: Context,
    ) -> tuple[LeanSpan, Context]:
        """`start`, and `context` with the span as its current span (as the API's
        `set_span_in_context`), in one frame: for a span that work runs under (a tool call).

        The span is the one `start` makes, its slots filled here rather than through
        `LeanSpan.__init__` (a call with fourteen arguments was a fifth of a tool span's cost);
        tests/test_lean_tracing.py checks that every slot is set and that it reads as `start`'s."""
        if attributes:
            for value in attributes.values():
                if type(value) not in _SCALARS and not _plain(value):
                    attributes = _cleaned(attributes)
                    break
        span = _new_span(LeanSpan)
        span.span_name = template.name
        span.trace_id = self._trace_id
        span.span_id = _bits(64) or draw_span_id()
        span.parent_id = self._parent_id
        span.parent_remote = False
        span.trace_state = self._state
        span.kind = template.kind
        span.start_time = _time_ns()
        span.end_time = 0
        span.attrs = attributes or None
        span.event_list = None
        span.link_list = None
        span.status_code = 0
        span.status_message = None
        span.scope = self._scope
        span.sink = self._sink
        span.exit_records = True
        span.cached_context = None
        span.template = template
        return span, Context({**context, _SPAN_KEY: span})

    def _record(
        self,
        template: SpanTemplate,
        start_time: int,
        attributes: dict[str, AttributeValue] | None = None,
    ) -> None:
        """A span that started at `start_time` and ends now (a model call, made at its end), for
        a sink that keeps span objects."""
        span = self.start(template, attributes, start_time)
        span.end_time = time.time_ns()
        self._sink.on_end(span)


class LeanTracerProvider(trace.TracerProvider):
    """The provider the runtime installs for a supported `OTEL_*` set-up: lean spans into one
    sink. Not the SDK's: there is no `add_span_processor`; a host wanting processors of its own
    sets its own SDK provider (the runtime then never installs this one)."""

    def __init__(
        self,
        resource: LeanResource,
        sink: SpanSink,
        sampling: Sampling | None = None,
    ) -> None:
        self.resource = resource
        self.sink = sink
        self.sampling = sampling or Sampling()
        self._tracers: dict[tuple[str, str | None, str | None], LeanTracer] = {}
        self._closed = False

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        if self._closed:
            return trace.NoOpTracer()
        key = (instrumenting_module_name, instrumenting_library_version, schema_url)
        found = None if attributes else self._tracers.get(key)
        if found is None:
            scope = Scope(
                instrumenting_module_name, instrumenting_library_version, schema_url,
                _cleaned(attributes),
            )  # fmt: skip
            found = LeanTracer(scope, self.sampling, self.sink)
            if not attributes:
                self._tracers[key] = found
        return found

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every span ended so far; False if that did not finish within the timeout."""
        return self.sink.force_flush(timeout_millis / 1000)

    def shutdown(self, timeout_s: float = 30.0) -> None:
        """Flush and stop the sink (idempotent); later tracers make no spans."""
        if self._closed:
            return
        self._closed = True
        self.sink.shutdown(timeout_s)
