"""OTLP/protobuf for lean spans, encoded by hand, and the batch exporter that posts it.

Why by hand: the OpenTelemetry exporter builds a protobuf object per span, attribute and value
and serialises them (~20 us a span here, more than the span itself); the runtime's spans repeat
the same names and attribute values (`gen_ai.operation.name=chat`, a model, a tool name), so
this encoder writes the wire format of `ExportTraceServiceRequest` directly and keeps each
repeated name and key/value field as ready bytes (docs/decisions.md). Tests decode its output
with the `opentelemetry-proto` classes and compare it with the SDK exporter's.

The exporter (`BatchExporter`) posts from a greenlet on the hub that ends the spans, over a
cooperative (gevent) socket: no OS thread, whose GIL hand-offs with the hub cost more CPU than the
export itself on a multi-core machine (docs/performance.md). Spans ended in another OS thread
switch that exporter to a real thread, as the SDK's batch processor, posting over plain sockets.
"""

from __future__ import annotations

import gzip
import http.client
import logging
import math
import random
import struct
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from itertools import repeat, starmap

import gevent
import gevent.event
from gevent import Greenlet
from opentelemetry.trace import Link, SpanKind, TraceState

from agent.http_client import Exchange, HTTPPool
from subagent.lean_tracing import (
    EndLeaf,
    LeanResource,
    LeanSpan,
    RecordLeaf,
    Scope,
    SpanEvent,
    SpanTemplate,
    clean_value,
    draw_span_id,
    plain_value,
)
from supervision.group import TaskGroup
from supervision.offload import offload

__all__ = ["BatchExporter", "HttpPoster", "encode_request"]

log = logging.getLogger(__name__)

_HEAD_STRUCT = struct.Struct(">BBQQBBQBBQ")  # trace id, span id, parent id: bytes fields
_ROOT_STRUCT = struct.Struct(">BBQQBBQ")  # trace id and span id
_pack_head = _HEAD_STRUCT.pack
_pack_root = _ROOT_STRUCT.pack
_HEAD = _HEAD_STRUCT.size
_ROOT = _ROOT_STRUCT.size
_TAIL_STRUCT = struct.Struct("<BQBQBBI")  # start and end (fixed64), flags (fixed32)
_pack_tail = _TAIL_STRUCT.pack
_TAIL = _TAIL_STRUCT.size
_LOW = (1 << 64) - 1
_pack_double = struct.Struct("<d").pack
_pack_fixed64 = struct.Struct("<Q").pack
_pack_id = struct.Struct(">Q").pack
_pack_fixed32 = struct.Struct("<I").pack
_BYTES = [bytes((i,)) for i in range(128)]

# Span flags (field 16, fixed32) as the SDK's exporter writes them: 0x100 "has is-remote", and
# 0x200 "is remote" when the parent came from another process.
# The proto's SpanKind is the API's plus one (0 is "unspecified" on the wire).
# Looked up by the member's id: an Enum member's hash is a Python-level call.
_KIND = {id(kind): b"\x30" + _BYTES[kind.value + 1] for kind in SpanKind}

_get_ident = threading.get_ident
_time_ns = time.time_ns
_bits = random.getrandbits  # the module's instance: Python reseeds it in a forked child
_ONLY_BYTES = {bytes}
_CACHE_LIMIT = 8192  # entries per cache below; emptied when full
_VALUES_KEPT = 256  # distinct values kept per attribute key; past that its values vary (ids)


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _BYTES[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


# A span's tag (`ScopeSpans.spans`) and length for every length a span of the runtime has (its
# spans are 150-400 bytes: a two-byte varint built per span was a tenth of its encoding).
_SPAN_TAG = b"\x12"
_SPAN_TAGGED = 2048
_SPAN_TAGS = [_SPAN_TAG + _varint(n) for n in range(_SPAN_TAGGED)]


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the payload's length, the payload."""
    return tag + _varint(len(payload)) + payload


def _text(value: str) -> bytes:
    # A lone surrogate cannot be UTF-8: it becomes "?" rather than failing the whole batch.
    return value.encode("utf-8", "replace")


def _any_value(value: object) -> bytes | None:
    """An `AnyValue` message, or None for a value OTLP cannot carry."""
    kind = type(value)
    if kind is str:
        return _field(b"\x0a", _text(value))  # type: ignore[arg-type]  # str by the check
    if kind is bool:
        return b"\x10\x01" if value else b"\x10\x00"
    if kind is int:
        number: int = value  # type: ignore[assignment]  # int by the check
        return b"\x18" + _varint(number if number >= 0 else number + (1 << 64))
    if kind is float:
        return b"\x21" + _pack_double(value)
    if kind is tuple or kind is list:
        items = []
        for item in value:  # type: ignore[attr-defined]  # a sequence by the check
            encoded = _any_value(item)
            if encoded is not None:
                items.append(_field(b"\x0a", encoded))
        return _field(b"\x2a", b"".join(items))
    return None


def _key_value(key: str, value: object) -> bytes | None:
    """A `KeyValue` message."""
    encoded = _any_value(value)
    if encoded is None:
        return None
    return _field(b"\x0a", _text(key)) + _field(b"\x12", encoded)


def _all_text(value: object) -> bool:
    """A string, or a tuple of strings: values equal only to values of the same bytes."""
    kind = type(value)
    if kind is str:
        return True
    return kind is tuple and all(type(item) is str for item in value)  # type: ignore[attr-defined]


def _attribute_field(key: str, value: object) -> bytes:
    """One `Span.attributes` field (empty for a value OTLP cannot carry)."""
    encoded = _key_value(key, value)
    return b"" if encoded is None else _field(b"\x4a", encoded)


def _text_attribute(key_field: bytes, value: str) -> bytes:
    """One `Span.attributes` field of a string value, its key's field given (a key whose values
    vary: a call id, a run id): written straight out, in one join when every length is one
    byte."""
    try:
        text = value.encode()
    except UnicodeEncodeError:  # a lone surrogate: "?", as `_text`
        text = value.encode("utf-8", "replace")
    n = len(text)
    size = len(key_field) + n + 4  # the KeyValue: key, then AnyValue's tag and length
    if size < 0x80:
        return b"".join(
            (b"\x4a", _BYTES[size], key_field, b"\x12", _BYTES[n + 2], b"\x0a", _BYTES[n], text)
        )
    return _field(b"\x4a", key_field + _field(b"\x12", _field(b"\x0a", text)))


def _int_attribute(key_field: bytes, value: int) -> bytes:
    """One `Span.attributes` field of an integer value, its key's field given (a key whose
    values vary: token counts): written straight out."""
    body = b"\x18" + _varint(value if value >= 0 else value + (1 << 64))
    n = len(body)
    size = len(key_field) + n + 2  # the KeyValue: key, then AnyValue's tag and length
    if size < 0x80:
        return b"".join((b"\x4a", _BYTES[size], key_field, b"\x12", _BYTES[n], body))
    return _field(b"\x4a", key_field + _field(b"\x12", body))


def _attributes(tag: bytes, attributes: Mapping[str, object] | None) -> bytes:
    """Repeated `KeyValue` fields under `tag` (uncached: resources, scopes, events, links)."""
    if not attributes:
        return b""
    out = []
    for key, value in attributes.items():
        encoded = _key_value(key, value)
        if encoded is not None:
            out.append(_field(tag, encoded))
    return b"".join(out)


class LeafHead:
    """What every span under one parent shares on the wire: the trace id's field and the span
    id's tag (`before`), the parent id's field (`after`), the trace state's field, the fixed
    part of the length; and the scope to queue the spans with (None: the exporter's primary)."""

    __slots__ = ("after", "before", "scope", "size", "state")

    def __init__(
        self, scope: Scope | None, trace_id: int, parent_id: int, state: TraceState | None
    ) -> None:
        self.scope = scope
        self.before = b"\x0a\x10" + trace_id.to_bytes(16, "big") + b"\x12\x08"
        self.after = b"\x22\x08" + parent_id.to_bytes(8, "big")
        self.state = _field(b"\x1a", _trace_state(state)) if state else b""
        self.size = len(self.before) + 8 + len(self.after) + len(self.state) + _TAIL


class Encoder:
    """Encodes batches of lean spans as `ExportTraceServiceRequest` bytes for one resource.

    Keeps, as ready bytes, each span name's field and each string attribute's whole field
    (`Span.attributes`, tag included): the runtime's names and most of its attribute values
    repeat. Used by one thread (the exporter's)."""

    def __init__(self, resource: LeanResource) -> None:
        self._resource = _field(b"\x0a", _attributes(b"\x0a", resource.attributes))
        self._names: dict[str, bytes] = {}
        self.cached: dict[str, dict[object, bytes]] = {}
        self.varying: dict[str, bytes] = {}  # keys whose values vary: their key field
        self._shapes: dict[object, bytes] = {}  # (name, kind, attributes) -> their fields
        self._shapeless: set[str] = set()  # span names whose attributes vary
        self._scopes: dict[int, tuple[Scope, bytes]] = {}
        self._event_names: dict[str, bytes] = {}

    def encode(self, spans: Iterable[LeanSpan]) -> bytes:
        """One request holding `spans`, grouped by instrumentation scope."""
        return self.request([(span.scope, self.span(span)) for span in spans])

    def request(self, encoded: Iterable[tuple[Scope, bytes]]) -> bytes:
        """One request from spans encoded by `span`, grouped by instrumentation scope."""
        by_scope: dict[int, list[bytes]] = {}
        scopes: dict[int, Scope] = {}
        for scope, span in encoded:
            key = id(scope)
            found = by_scope.get(key)
            if found is None:
                found = by_scope[key] = []
                scopes[key] = scope
            found.append(span)
        return self._joined([(scopes[key], spans) for key, spans in by_scope.items()])

    def scoped(self, scope: Scope, spans: list[bytes]) -> bytes:
        """One request from spans of one scope, encoded by `span` (the usual batch)."""
        return self._joined([(scope, spans)])

    def _joined(self, groups: list[tuple[Scope, list[bytes]]]) -> bytes:
        """The request's bytes in one copy: every length is known before anything is joined
        (nesting by concatenation copied a batch's ~80 kB five times, a tenth of tracing's
        cache misses in the fan-out job; docs/performance.md)."""
        parts = [b"\x0a", b"", self._resource]
        size = len(self._resource)
        for scope, spans in groups:
            head = self._scope(scope)
            length = len(head) + sum(map(len, spans))
            tag = b"\x12" + _varint(length)
            parts += (tag, head)
            parts += spans
            size += len(tag) + length
        parts[1] = _varint(size)
        return b"".join(parts)

    def _scope(self, scope: Scope) -> bytes:
        """The `ScopeSpans.scope` (and `schema_url`) fields of `scope`."""
        found = self._scopes.get(id(scope))
        if found is not None and found[0] is scope:
            return found[1]
        body = _field(b"\x0a", _text(scope.name))
        if scope.version:
            body += _field(b"\x12", _text(scope.version))
        body += _attributes(b"\x1a", scope.attributes)
        encoded = _field(b"\x0a", body)
        if scope.schema_url:
            encoded += _field(b"\x1a", _text(scope.schema_url))
        if len(self._scopes) >= _CACHE_LIMIT:
            self._scopes.clear()
        self._scopes[id(scope)] = (scope, encoded)  # the scope is held: its id stays its own
        return encoded

    def _name(self, name: str) -> bytes:
        found = self._names.get(name)
        if found is None:
            if len(self._names) >= _CACHE_LIMIT:
                self._names.clear()
            found = self._names[name] = _field(b"\x2a", _text(name))
        return found

    def _attribute(self, key: str, value: object) -> bytes:
        """The whole `Span.attributes` field for one attribute, kept for the next span with the
        same value, unless the key's values vary (an id, a run): then encoded each time."""
        kind = type(value)
        per_key = self.cached.get(key)
        if per_key is None:
            key_field = self.varying.get(key)
            if key_field is not None:
                if kind is str:
                    return _text_attribute(key_field, value)  # type: ignore[arg-type]  # a str
                if kind is int:
                    return _int_attribute(key_field, value)  # type: ignore[arg-type]  # an int
                return _attribute_field(key, value)
            if len(self.cached) >= _CACHE_LIMIT:
                self.cached.clear()
            per_key = self.cached[key] = {}
        # Keyed by type too where values compare equal across types (True == 1 == 1.0).
        cache_key: object = value if kind is str else (kind, value)
        try:
            found = per_key.get(cache_key)
        except TypeError:  # an unhashable value (a list): not cached
            return _attribute_field(key, value)
        if found is None:
            found = _attribute_field(key, value)
            if kind is float or (kind is tuple and not _all_text(value)):
                return found  # (1,) == (True,) == (1.0,): only text tuples are kept
            if len(per_key) >= _VALUES_KEPT:  # a key whose values vary: stop keeping them
                del self.cached[key]
                if len(self.varying) >= _CACHE_LIMIT:
                    self.varying.clear()
                self.varying[key] = _field(b"\x0a", _text(key))
            else:
                per_key[cache_key] = found
        return found

    def _middle(self, span: LeanSpan, shape: object) -> bytes:
        """The name, kind and attribute fields of `span`, kept under `shape` when every value is
        a string (or a tuple of strings) that the caches keep."""
        name = span.span_name
        found = self._names.get(name)
        parts = [found if found is not None else self._name(name), _KIND[id(span.kind)]]
        attrs = span.attrs
        stable = shape is not None  # whether to keep the whole: only asked with a shape
        if attrs:
            attribute = self._attribute
            for key, value in attrs.items():
                parts.append(attribute(key, value))
                if stable and (key in self.varying or not _all_text(value)):
                    stable = False
        middle = b"".join(parts)
        if shape is not None:
            if not stable:
                if len(self._shapeless) >= _CACHE_LIMIT:
                    self._shapeless.clear()
                self._shapeless.add(name)  # this name's spans vary: no whole-shape lookups
            else:
                if len(self._shapes) >= _CACHE_LIMIT:
                    self._shapes.clear()
                self._shapes[shape] = middle
        return middle

    def template(self, template: SpanTemplate) -> bytes:
        """The name, kind and attribute fields of `template` (kept on it: they never change)."""
        parts = [self._name(template.name), _KIND[id(template.kind)]]
        for key, value in template.attributes:
            parts.append(self._attribute(key, value))
        encoded = template.wire = b"".join(parts)
        return encoded

    def _event(self, event: SpanEvent) -> bytes:
        """An `Event` message. Its name and attributes repeat (`subagent.turn.end` with the
        turn and reason, a steer's source): they go through the span attributes' caches, whose
        `KeyValue` is the same, only the field's tag differs."""
        name = self._event_names.get(event.name)
        parts = [b"\x09", _pack_fixed64(event.timestamp), name or self._event_name(event.name)]
        attributes = event.attributes
        if attributes:
            cached = self.cached
            for key, value in attributes.items():
                kind = type(value)
                found = None
                if kind is str or kind is int:  # a repeated one from the cache, without a frame
                    per_key = cached.get(key)
                    if per_key is not None:
                        found = per_key.get(value if kind is str else (kind, value))
                if found is None:
                    found = self._attribute(key, value)
                if found:
                    parts.append(b"\x1a" + found[1:])  # Event.attributes (3), not Span's (9)
        return b"".join(parts)

    def _event_name(self, name: str) -> bytes:
        found = self._event_names.get(name)
        if found is None:
            if len(self._event_names) >= _CACHE_LIMIT:
                self._event_names.clear()
            found = self._event_names[name] = _field(b"\x12", _text(name))
        return found

    def own_fields(self, attrs: Mapping[str, object]) -> bytes:
        """A templated span's own attribute fields: a repeated string or integer from the
        cache, one of a key whose values vary (a call id) written straight out, anything else
        cleaned as the API would (`own_attribute`). For a span's encoding and the exporter's
        leaf paths alike."""
        parts = []
        varying = self.varying
        cached = self.cached
        for key, value in attrs.items():
            kind = type(value)
            if kind is str or kind is int:
                # What `_attribute` would return, without its frame: a repeated string or
                # integer from the cache, a string or integer of a varying key written out.
                per_key = cached.get(key)
                if per_key is not None:
                    found = per_key.get(value if kind is str else (kind, value))
                    if found is not None:
                        parts.append(found)
                        continue
                else:
                    key_field = varying.get(key)
                    if key_field is not None:
                        if kind is str:
                            parts.append(_text_attribute(key_field, value))  # type: ignore[arg-type]
                        else:
                            parts.append(_int_attribute(key_field, value))  # type: ignore[arg-type]
                        continue
            parts.append(self.own_attribute(key, value))
        return b"".join(parts)

    def own_attribute(self, key: str, value: object) -> bytes:
        """One attribute of a span's own (after its template's), for the fused paths (`leaves`)
        where the cache held nothing ready: the value cleaned as the API's `set_attribute`
        would (a value it refuses is dropped), a string or an integer of a key whose values vary
        written straight out."""
        kind = type(value)
        if kind is not str and kind is not int:
            if not plain_value(value):
                value = clean_value(value)
                if value is None:
                    return b""
            return self._attribute(key, value)
        key_field = self.varying.get(key)
        if key_field is None:
            return self._attribute(key, value)
        if kind is str:
            return _text_attribute(key_field, value)  # type: ignore[arg-type]  # a str
        return _int_attribute(key_field, value)  # type: ignore[arg-type]  # an int

    def span(self, span: LeanSpan) -> bytes:
        """One span as its `ScopeSpans.spans` field (tag and length included).

        Safe to call from more than one thread: the caches are single dict operations, and the
        last-id caches are read once as a tuple."""
        trace_id = span.trace_id
        parent = span.parent_id
        # Ids as one packed run of fields: trace_id (1), span_id (2), parent_span_id (4).
        if parent:
            head = _pack_head(
                0x0A, 16, trace_id >> 64, trace_id & _LOW, 0x12, 8, span.span_id, 0x22, 8, parent
            )
        else:
            head = _pack_root(0x0A, 16, trace_id >> 64, trace_id & _LOW, 0x12, 8, span.span_id)
        # Name, kind and attributes: a template's encoded once, then the span's own; else as a
        # whole from the cache when this name's spans repeat them (string values only, so equal
        # keys mean equal bytes); else field by field.
        template = span.template
        attrs = span.attrs
        if template is not None:
            middle = template.wire
            if middle is None:
                middle = self.template(template)
            if attrs:
                middle += self.own_fields(attrs)
        else:
            name = span.span_name
            middle = None
            shape: object = None
            if name not in self._shapeless:
                shape = (name, id(span.kind), tuple(attrs.items()) if attrs else ())
                try:
                    middle = self._shapes.get(shape)
                except TypeError:  # not hashable: encoded field by field
                    shape = None
            if middle is None:
                middle = self._middle(span, shape)
        # start (7) and end (8) times, then the flags (16), as the SDK's exporter sets them.
        tail = _pack_tail(
            0x39,
            span.start_time,
            0x41,
            span.end_time,
            0x85,
            1,
            0x300 if span.parent_remote else 0x100,
        )
        if not (span.trace_state or span.event_list or span.link_list or span.status_code):
            n = (_HEAD if parent else _ROOT) + len(middle) + _TAIL
            return b"".join(
                (_SPAN_TAGS[n] if n < _SPAN_TAGGED else _SPAN_TAG + _varint(n), head, middle, tail)
            )
        parts = [head, middle]
        if span.trace_state:
            parts.append(_field(b"\x1a", _trace_state(span.trace_state)))
        if span.event_list:
            for event in span.event_list:
                encoded = self._event(event)
                size = len(encoded)
                parts.append(b"\x5a" + (_BYTES[size] if size < 0x80 else _varint(size)) + encoded)
        if span.link_list:
            for link in span.link_list:
                parts.append(_field(b"\x6a", _link(link)))
        code = span.status_code
        if code:
            message = span.status_message
            body = _field(b"\x12", _text(message)) if message else b""
            parts.append(_field(b"\x7a", body + b"\x18" + _BYTES[code]))
        parts.append(tail)
        body = b"".join(parts)
        n = len(body)
        return (_SPAN_TAGS[n] if n < _SPAN_TAGGED else _SPAN_TAG + _varint(n)) + body


def _trace_state(state: TraceState) -> bytes:
    return _text(state.to_header())


def _link(link: Link) -> bytes:
    context = link.context
    body = (
        b"\x0a\x10"
        + context.trace_id.to_bytes(16, "big")
        + b"\x12\x08"
        + context.span_id.to_bytes(8, "big")
    )
    if context.trace_state:
        body += _field(b"\x1a", _trace_state(context.trace_state))
    body += _attributes(b"\x22", link.attributes)
    return body + b"\x35" + _pack_fixed32(0x300 if context.is_remote else 0x100)


def encode_request(resource: LeanResource, spans: Sequence[LeanSpan]) -> bytes:
    """One `ExportTraceServiceRequest` for `spans` (a fresh encoder: for tests and one-offs)."""
    return Encoder(resource).encode(spans)


# -- the exporter --------------------------------------------------------------------------------


def _in_greenlet() -> bool:
    """True in a spawned greenlet (its hub can run others while it waits on a socket); False
    in a thread's main greenlet (an export thread, or the caller at interpreter exit)."""
    return gevent.getcurrent().parent is not None


# How much of a collector's answer is read (an OTLP answer is an empty or short message).
MAX_ANSWER = 64 * 1024


class _Deadline:
    """The whole-exchange bound of a post over a plain socket (an export thread, or the caller
    at interpreter exit), as `gevent.Timeout` is in a greenlet: a socket timeout bounds each
    read alone, so a server that drips its answer held the thread, or the process's exit,
    forever. At the deadline a timer thread cuts the exchange (shuts its socket down); the
    blocked read then ends, and the exchange fails as a `TimeoutError`."""

    __slots__ = ("_exchange", "_fired", "_timeout", "_timer")

    def __init__(self, exchange: Exchange, timeout_s: float) -> None:
        self._exchange = exchange
        self._timeout = timeout_s
        self._fired = False
        self._timer: threading.Timer | None = None

    def __enter__(self) -> None:
        timer = threading.Timer(self._timeout, self._cut)
        timer.daemon = True
        try:
            timer.start()
        except RuntimeError:  # no new thread at interpreter shutdown: each read's timeout only
            return
        self._timer = timer

    def _cut(self) -> None:
        self._fired = True
        self._exchange.cut()

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._fired and exc is not None:  # whatever the cut socket made the read raise
            raise TimeoutError(f"timed out after {self._timeout} s") from exc


class HttpPoster:
    """POSTs encoded requests to an OTLP/HTTP endpoint over a kept-alive connection
    (`agent.http_client`, the runtime's one HTTP client), called by one drainer at a time. In a
    greenlet the connection is a gevent socket's (cooperative, the wait bounded by the timeout);
    in a thread's main greenlet a plain socket's. Returns None when the collector took the
    batch, else why not."""

    def __init__(
        self,
        endpoint: str,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
        compression: str | None = None,
    ) -> None:
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"OTLP endpoint is not an http(s) URL: {endpoint!r}")
        if compression not in (None, "gzip"):
            raise ValueError(f"OTLP compression {compression!r}: only gzip or none")
        self.endpoint = endpoint
        self._path = parts.path or "/"
        if parts.query:
            self._path += "?" + parts.query
        self._timeout = timeout_s
        self._gzip = compression == "gzip"
        self._headers = {"Content-Type": "application/x-protobuf", **(headers or {})}
        if self._gzip:
            self._headers["Content-Encoding"] = "gzip"
        # One connection for each kind of caller: a greenlet's (gevent socket), a thread's.
        self._pools = {
            cooperative: HTTPPool(
                endpoint,
                max_connections=1,
                connect_timeout=timeout_s,
                read_timeout=timeout_s,
                cooperative=cooperative,
            )
            for cooperative in (True, False)
        }

    def __call__(self, body: bytes) -> str | None:
        if self._gzip:
            body = gzip.compress(body, compresslevel=6)
        cooperative = _in_greenlet()
        try:
            with self._pools[cooperative].exchange() as exchange:
                # In a greenlet the whole exchange is bounded, not each socket call alone: a
                # server that drips its answer a byte a second would hold the drainer forever.
                limit = (
                    gevent.Timeout(
                        self._timeout, TimeoutError(f"timed out after {self._timeout} s")
                    )
                    if cooperative
                    else _Deadline(exchange, self._timeout)
                )
                with limit:
                    response = exchange.request("POST", self._path, body, self._headers)
                    # A collector answers with a few bytes; a wrong endpoint may send pages (or
                    # stream forever): at most MAX_ANSWER are read, then the connection goes.
                    response.read(MAX_ANSWER)
                    if not response.complete:
                        response.read1(1)
        except (OSError, http.client.HTTPException) as exc:
            return f"{type(exc).__name__}: {exc}"
        if 200 <= response.status < 300:
            return None
        return f"HTTP {response.status} {response.reason}"

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()


class BatchExporter:
    """The lean provider's sink: each span is encoded as it ends, waits in a bounded queue as
    bytes, and a drainer groups the bytes into requests and posts them (`post` returns None, or
    why it failed).

    The drainer is a greenlet owned by the exporter (a `TaskGroup`), on the hub of the thread
    that made the exporter, woken by `on_end` when a batch is full (or after `delay_s`); its
    post yields to the hub while it waits on the collector (`HttpPoster` uses a gevent socket
    in a greenlet), so a stalled collector costs the hub nothing but the timeout's wait in that
    greenlet. A real thread drains instead once a span ends in another OS thread (a gevent
    event cannot be set from there): from then on this exporter is the thread's, as before.
    No thread on the hub's path was measured cheaper: the thread's GIL hand-offs with the hub
    cost ~0.3 s of CPU per 40,000 spans on two cores (docs/performance.md).

    Encoding at the end, in the thread that ends the span, was measured cheaper than encoding
    in the drainer (docs/performance.md): the span's fields are still in the CPU's cache, the
    span object is freed at once (no queued object graphs for the collector to scan), and the
    drainer only joins bytes and posts them. The hub then only appends to a deque (and wakes
    the drainer once a batch is full).

    A full queue or a failed post drops spans: they are counted (`dropped`) and the first loss
    is logged once, as a warning naming the cause; nothing retries, waits or blocks the hub
    for it. `force_flush` and `shutdown` wait cooperatively on the hub, and for at most their
    timeout; from a thread with no running hub (`cooperative=False`, interpreter exit) the
    caller posts what is queued itself."""

    def __init__(
        self,
        resource: LeanResource,
        post: Callable[[bytes], str | None],
        *,
        max_queue: int = 2048,
        max_batch: int = 512,
        delay_s: float = 5.0,
        close: Callable[[], None] | None = None,
    ) -> None:
        if max_queue <= 0 or max_batch <= 0 or delay_s < 0:
            raise ValueError("queue and batch sizes must be positive, the delay not negative")
        if max_batch > max_queue:
            raise ValueError(f"max_batch ({max_batch}) must not exceed max_queue ({max_queue})")
        self._encoder = Encoder(resource)
        self._post = post
        self._close_post = close
        self._max_queue = max_queue
        self._batch = max_batch
        self._delay = delay_s
        # Encoded spans: bare bytes for the primary scope (the runtime's, the first one a span
        # came from), (scope, bytes) for any other; a tuple per span was ~1 % of its cost.
        self._queue: deque[bytes | tuple[Scope, bytes]] = deque()
        self._primary: Scope | None = None
        self._woken = False
        self._closed = False
        self._asked = 0  # flush requests made
        self._served = 0  # flush requests whose spans have been exported (or dropped)
        self._full = 0  # dropped at the queue (the hub's count)
        self._failed = 0  # dropped by a failed post (the drainer's count)
        self._posting = 0  # spans in the post in flight
        self._given_up = False  # an exit's deadline passed: what is left was counted lost
        self.first_loss: str | None = None  # why the first span was lost (said once)
        self.exported = 0
        self._draining = threading.Lock()  # one drainer at a time: the greenlet, thread or caller
        # The hub's drainer: a greenlet, started by the first span ended on this thread's hub.
        self._hub_thread = threading.get_ident()
        self._group = TaskGroup("otlp-export")
        self._green: Greenlet | None = None
        self._green_wake = gevent.event.Event()
        self._green_done = gevent.event.Event()  # replaced each time the greenlet serves
        # The thread's drainer, started only once a span ends (or a flush comes) off the hub.
        self._starting = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._done = threading.Condition()

    @property
    def dropped(self) -> int:
        """Spans lost so far: the queue was full, or their post failed."""
        return self._full + self._failed

    def on_end(self, span: LeanSpan) -> None:
        queue = self._queue
        if self._closed or len(queue) >= self._max_queue:
            self._refuse()
            return
        try:
            encoded = self._encoder.span(span)
        except Exception:  # a bug of ours: lose the span, keep tracing
            log.exception("encoding a span failed")
            self._full += 1
            return
        scope = span.scope
        primary = self._primary
        if scope is not primary and primary is None:
            primary = self._primary = scope
        queue.append(encoded if scope is primary else (scope, encoded))
        # Past this one check, a span ending on the hub costs nothing more (`_woken`).
        if self._thread is None and _get_ident() == self._hub_thread:
            if self._green is None or (len(queue) >= self._batch and not self._woken):
                self._wake_green()
        else:
            self._wake_thread()

    def _refuse(self) -> None:
        """A span ending now cannot be queued: count it and report it lost."""
        self._full += 1
        self._lost("the exporter is shut down" if self._closed else "the batch queue is full")

    def _wake_green(self) -> None:
        """On the hub: start the drainer greenlet if it is not yet, wake it once a batch is
        full."""
        if self._green is None:
            self._green = self._group.spawn(self._run_green)
        if len(self._queue) >= self._batch and not self._woken:
            self._woken = True
            self._green_wake.set()

    def _wake_thread(self) -> None:
        """Off the hub's thread (or after that): the thread drains; woken once a batch is full."""
        wake = self._wake if self._thread is not None else self._threaded()
        if len(self._queue) >= self._batch and not self._woken:
            self._woken = True
            wake.set()

    def leaves(
        self, scope: Scope, trace_id: int, parent_id: int, trace_state: TraceState | None
    ) -> tuple[RecordLeaf, EndLeaf]:
        """The one-frame paths for spans under one parent (`LeafSink`): a span made and ended in
        one step (`record`) and a templated span's end (`end`), each bound to what the parent's
        spans share on the wire (`LeafHead`)."""
        if self._primary is None:
            self._primary = scope
        head = LeafHead(None if scope is self._primary else scope, trace_id, parent_id, trace_state)
        return partial(self._record_leaf, head), partial(self._end_leaf, head)

    def _record_leaf(
        self,
        head: LeafHead,
        template: SpanTemplate,
        start_time: int,
        attributes: Mapping[str, object] | None = None,
    ) -> None:
        """A span that started at `start_time` and ends now, under this parent, from
        `template` and then `attributes` (cleaned as the API would), with a fresh span id."""
        self._queue_leaf(
            head, template, _bits(64) or draw_span_id(), start_time, _time_ns(), attributes
        )

    def _end_leaf(self, head: LeafHead, span: LeanSpan) -> None:
        """End `span`, made under this parent from a template (`Subspans.start_current`): as
        `span.end()`; encoded here from the parent's shared fields when it kept its template
        and has no events, links or status (a tool call's usual span), else by `on_end`."""
        if span.end_time:
            return  # ended once
        end_time = span.end_time = _time_ns()
        template = span.template
        if template is None or span.event_list or span.link_list or span.status_code:
            self.on_end(span)
            return
        self._queue_leaf(head, template, span.span_id, span.start_time, end_time, span.attrs)

    def _queue_leaf(
        self,
        head: LeafHead,
        template: SpanTemplate,
        span_id: int,
        start_time: int,
        end_time: int,
        attributes: Mapping[str, object] | None,
    ) -> None:
        """Encode a leaf span from its parent's shared fields and queue it (both leaf paths):
        `Encoder.leaf`'s bytes, with the caches read inline."""
        queue = self._queue
        if self._closed or len(queue) >= self._max_queue:
            self._refuse()
            return
        try:
            middle = template.wire or self._encoder.template(template)
            if attributes:
                middle += self._encoder.own_fields(attributes)
            n = head.size + len(middle)
            encoded = b"".join(
                (
                    _SPAN_TAGS[n] if n < _SPAN_TAGGED else _SPAN_TAG + _varint(n),
                    head.before,
                    _pack_id(span_id),
                    head.after,
                    middle,
                    head.state,
                    _pack_tail(0x39, start_time, 0x41, end_time, 0x85, 1, 0x100),
                )
            )
        except Exception:  # a bug of ours: lose the span, keep tracing
            log.exception("encoding a span failed")
            self._full += 1
            return
        scope = head.scope
        queue.append(encoded if scope is None else (scope, encoded))
        if self._thread is None and _get_ident() == self._hub_thread:
            if self._green is None or (len(queue) >= self._batch and not self._woken):
                self._wake_green()
        else:
            self._wake_thread()

    def force_flush(self, timeout_s: float = 30.0) -> bool:
        """Export every span ended before this call; False if not done within `timeout_s`."""
        if self._closed:
            return not self._queue
        with self._done:
            self._asked += 1
            target = self._asked
        if self._thread is None and threading.get_ident() == self._hub_thread:
            if self._green is None:
                self._green = self._group.spawn(self._run_green)
            self._green_wake.set()
            with gevent.Timeout(timeout_s, False):
                while self._served < target and self._thread is None:
                    self._green_done.wait()
                if self._served >= target:
                    return True
            if self._thread is None:
                return False
        self._threaded().set()
        if threading.get_ident() == self._hub_thread:
            return offload(self._wait_served, target, timeout_s)
        return self._wait_served(target, timeout_s)

    def shutdown(self, timeout_s: float = 30.0, cooperative: bool = True) -> None:
        """Export what is queued, stop the drainer (within `timeout_s`), close the connection.
        `cooperative=False` waits in the calling thread (at interpreter exit, no hub running):
        it posts what is queued itself."""
        if self._closed:
            return
        self._closed = True
        on_hub = cooperative and threading.get_ident() == self._hub_thread
        thread = self._thread
        if thread is not None:
            self._wake.set()
            if on_hub:
                offload(thread.join, timeout_s)
            else:
                thread.join(timeout_s)
            finished = not thread.is_alive()
        elif on_hub:
            if self._green is None:
                self._green = self._group.spawn(self._run_green)
            self._green_wake.set()
            finished = self._group.join(timeout_s)
        else:  # no hub to run the greenlet: the caller drains (a plain socket, outside one)
            if self._green is not None:
                self._green.kill(block=False)  # ends when (if) a hub runs again
            until = time.monotonic() + timeout_s
            if threading.get_ident() == self._hub_thread:
                # Only the greenlet can hold it, mid-post, and it cannot run while we wait.
                finished = self._draining.acquire(blocking=False)
            else:
                finished = self._draining.acquire(timeout=timeout_s)
            if finished:
                try:
                    # No batch starts after the timeout (one in flight ends at the post's own).
                    self._drain(until)
                finally:
                    self._draining.release()
                finished = not self._queue
        if on_hub:
            self._group.close(timeout_s)
        if not finished:
            log.warning("span export did not finish within %.1f s at shutdown", timeout_s)
            return
        if self._close_post is not None:
            self._close_post()

    def _threaded(self) -> threading.Event:
        """The thread's wake event, the thread started first if it is not yet."""
        with self._starting:
            if self._thread is None:
                thread = threading.Thread(
                    target=self._run_thread, name="subagent-otlp-export", daemon=True
                )
                thread.start()
                self._thread = thread
        return self._wake

    def _wait_served(self, target: int, timeout_s: float) -> bool:
        with self._done:
            return self._done.wait_for(lambda: self._served >= target, timeout_s)

    def _serve(self, asked: int) -> None:
        with self._done:
            self._served = max(self._served, asked)
            self._done.notify_all()

    def _run_green(self) -> None:
        wake = self._green_wake
        while self._thread is None:
            wake.wait(self._delay)
            wake.clear()
            self._woken = False
            asked = self._asked
            closing = self._closed
            if not self._draining.acquire(blocking=False):
                return  # the thread (or a closing caller) drains: this exporter is theirs
            try:
                self._drain()
            finally:
                self._draining.release()
            self._serve(asked)
            done, self._green_done = self._green_done, gevent.event.Event()
            done.set()
            if closing:
                return
        self._green_done.set()  # a flush waiting on the hub now waits for the thread

    def _run_thread(self) -> None:
        while True:
            self._wake.wait(self._delay)
            self._wake.clear()
            self._woken = False
            asked = self._asked
            closing = self._closed
            with self._draining:
                self._drain()
            self._serve(asked)
            if closing:
                return

    def _drain(self, until: float = math.inf) -> None:
        queue = self._queue
        while queue and time.monotonic() < until:
            # Popped one at a time (a span may be appended from another thread meanwhile), in
            # a C loop: a comprehension was a Python step per span.
            items = list(starmap(queue.popleft, repeat((), min(len(queue), self._batch))))
            primary = self._primary
            try:
                if primary is not None and set(map(type, items)) == _ONLY_BYTES:
                    body = self._encoder.scoped(primary, items)  # type: ignore[arg-type]
                else:
                    body = self._encoder.request(
                        [(primary, item) if type(item) is bytes else item for item in items]  # type: ignore[misc]
                    )
            except Exception:  # a bug of ours: lose the batch, keep the drainer
                log.exception("encoding %d spans failed", len(items))
                self._failed += len(items)
                continue
            self._posting = len(items)
            try:
                reason = self._post(body)
            except Exception as exc:  # a bug of ours or the HTTP client's: lose the batch only
                log.debug("posting %d spans failed", len(items), exc_info=True)
                reason = type(exc).__name__
            finally:
                self._posting = 0
            if self._given_up:  # counted lost at the deadline (`give_up`), whatever came of it
                return
            if reason is None:
                self.exported += len(items)
            else:
                self._failed += len(items)
                self._lost(f"the export to the collector failed ({reason})")

    def give_up(self, reason: str) -> int:
        """An exit's deadline passed: stop, and count every span not exported as lost with
        `reason` (those queued, and those of a post still in flight: the collector may yet
        take them, which nothing here can know). Returns how many. Later calls do nothing."""
        if self._given_up:
            return 0
        self._given_up = self._closed = True
        lost = len(self._queue) + self._posting
        self._queue.clear()
        if lost:
            self._failed += lost
            self._lost(reason)
        return lost

    def _lost(self, reason: str) -> None:
        if self.first_loss is None:
            self.first_loss = reason
            log.warning("dropping spans: %s; later losses are counted, not logged again", reason)
