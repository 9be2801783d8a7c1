"""The lean OTLP encoder and batch exporter (`subagent.otlp`), checked against the real thing:
what it writes is decoded with the `opentelemetry-proto` classes, and what it posts arrives at
a collector on 127.0.0.1."""

from __future__ import annotations

import logging
import socket
import threading
import tracemalloc
from collections.abc import Callable, Iterator

import gevent.event
import pytest
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PbStatus
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState
from otlp_collector import Collector, collector

from subagent.lean_tracing import LeanResource, LeanSpan, LeanTracerProvider, MemorySink
from subagent.otlp import MAX_ANSWER, BatchExporter, HttpPoster, encode_request
from supervision.group import TaskGroup
from supervision.offload import offload

RESOURCE = LeanResource({"service.name": "svc", "deployment": "test", "replicas": 3})


def _value(any_value: object) -> object:
    kind = any_value.WhichOneof("value")  # type: ignore[attr-defined]
    found = getattr(any_value, kind)
    if kind == "array_value":
        return tuple(_value(v) for v in found.values)
    return found


def _attrs(kvs: object) -> dict[str, object]:
    return {kv.key: _value(kv.value) for kv in kvs}  # type: ignore[attr-defined]


def _record_tree() -> tuple[list[LeanSpan], SpanContext]:
    sink = MemorySink()
    provider = LeanTracerProvider(RESOURCE, sink)
    tracer = provider.get_tracer("subagent-runtime")
    other = provider.get_tracer("host", "2.1")
    remote = SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1")]),
    )  # fmt: skip
    root = tracer.start_span(
        "invoke_agent w\u00e9",
        context=trace.set_span_in_context(trace.NonRecordingSpan(remote)),
        kind=SpanKind.SERVER,
        attributes={
            "s": "text",
            "b": True,
            "i": -5,
            "big": 2**62,
            "f": 1.5,
            "ss": ["a", "b"],
            "is": (1, 2),
            "bs": [False, True],
            "fs": [0.5],
            "bad": "lone \ud800 half",
        },
    )
    root.add_event("subagent.steer.admitted", {"subagent.message_id": "m1"}, timestamp=42)
    root.set_status(StatusCode.ERROR, "it broke")
    ctx = trace.set_span_in_context(root)
    child = other.start_span(
        "chat m", ctx, SpanKind.CLIENT,
        links=[Link(remote, {"why": "first"})], start_time=1000,
    )  # fmt: skip
    child.end(end_time=2000)
    ok = tracer.start_span("execute_tool t", ctx)
    ok.set_status(StatusCode.OK)
    ok.end()
    root.end()
    provider.shutdown()
    return sink.spans, remote


def test_the_encoding_decodes_to_every_field_recorded() -> None:
    spans, remote = _record_tree()
    chat, tool, root = spans
    body = encode_request(RESOURCE, spans)
    request = ExportTraceServiceRequest.FromString(body)
    (resource_spans,) = request.resource_spans
    assert _attrs(resource_spans.resource.attributes) == {
        "service.name": "svc", "deployment": "test", "replicas": 3,
    }  # fmt: skip
    scopes = {s.scope.name: s for s in resource_spans.scope_spans}
    assert set(scopes) == {"subagent-runtime", "host"}
    assert scopes["host"].scope.version == "2.1"
    assert [s.name for s in scopes["subagent-runtime"].spans] == [
        "execute_tool t",
        "invoke_agent w\u00e9",
    ]
    (pb_chat,) = scopes["host"].spans
    pb_tool, pb_root = scopes["subagent-runtime"].spans

    assert pb_root.trace_id == (0xABC).to_bytes(16, "big")
    assert pb_root.span_id == root.span_id.to_bytes(8, "big")
    assert pb_root.parent_span_id == (0xDEF).to_bytes(8, "big")
    assert pb_root.trace_state == "vendor=v1"
    assert pb_root.kind == PbSpan.SPAN_KIND_SERVER
    assert pb_root.start_time_unix_nano == root.start_time
    assert pb_root.end_time_unix_nano == root.end_time
    assert _attrs(pb_root.attributes) == {
        "s": "text", "b": True, "i": -5, "big": 2**62, "f": 1.5, "ss": ("a", "b"),
        "is": (1, 2), "bs": (False, True), "fs": (0.5,), "bad": "lone ? half",
    }  # fmt: skip
    (event,) = pb_root.events
    assert (event.name, event.time_unix_nano) == ("subagent.steer.admitted", 42)
    assert _attrs(event.attributes) == {"subagent.message_id": "m1"}
    assert pb_root.status.code == PbStatus.STATUS_CODE_ERROR
    assert pb_root.status.message == "it broke"
    assert pb_root.flags == 0x300  # the parent is remote, as the SDK's exporter says

    assert pb_chat.parent_span_id == pb_root.span_id
    assert pb_chat.kind == PbSpan.SPAN_KIND_CLIENT
    assert (pb_chat.start_time_unix_nano, pb_chat.end_time_unix_nano) == (1000, 2000)
    (link,) = pb_chat.links
    assert link.trace_id == (0xABC).to_bytes(16, "big")
    assert link.span_id == (0xDEF).to_bytes(8, "big")
    assert link.trace_state == "vendor=v1"
    assert _attrs(link.attributes) == {"why": "first"}
    assert link.flags == 0x300
    assert pb_chat.flags == 0x100
    assert pb_chat.status.code == PbStatus.STATUS_CODE_UNSET

    assert pb_tool.kind == PbSpan.SPAN_KIND_INTERNAL
    assert pb_tool.status.code == PbStatus.STATUS_CODE_OK
    assert not pb_tool.attributes and not pb_tool.events and not pb_tool.links
    # A root span has no parent field at all.
    assert remote.span_id and chat.parent is not None and tool.parent is not None


def test_repeated_values_encode_the_same_from_the_cache() -> None:
    spans, _ = _record_tree()
    from subagent.otlp import Encoder

    encoder = Encoder(RESOURCE)
    first = encoder.encode(spans)
    assert encoder.encode(spans) == first == encode_request(RESOURCE, spans)


# -- the batch exporter --------------------------------------------------------------------------


@pytest.fixture
def local() -> Iterator[Collector]:
    with collector() as found:
        yield found


def _exporter(endpoint: str, **kwargs: object) -> tuple[BatchExporter, trace.Tracer]:
    poster = HttpPoster(endpoint, headers={"x-team": "a b"}, timeout_s=5)
    exporter = BatchExporter(RESOURCE, poster, close=poster.close, **kwargs)  # type: ignore[arg-type]
    return exporter, LeanTracerProvider(RESOURCE, exporter).get_tracer("t")


def test_flush_posts_every_span_in_batches_no_larger_than_asked(local: Collector) -> None:
    exporter, tracer = _exporter(local.endpoint, max_batch=100, delay_s=60)
    for i in range(250):
        tracer.start_span(f"s{i}").end()
    assert exporter.force_flush(10)
    assert sorted(s.name for s in local.spans()) == sorted(f"s{i}" for i in range(250))
    assert max(local.batch_sizes()) <= 100
    assert local.paths[0] == "/v1/traces"
    assert local.headers[0]["x-team"] == "a b"
    assert local.headers[0]["Content-Type"] == "application/x-protobuf"
    assert exporter.exported == 250 and exporter.dropped == 0
    exporter.shutdown(5)


def test_a_full_batch_goes_out_without_a_flush(local: Collector) -> None:
    exporter, tracer = _exporter(local.endpoint, max_batch=10, delay_s=60)
    for i in range(10):
        tracer.start_span(f"s{i}").end()
    assert offload(local.arrived.wait, 10)  # the thread woke for a full batch, not a timer
    exporter.shutdown(5)
    assert len(local.spans()) == 10


def test_shutdown_exports_what_is_queued_and_later_spans_are_dropped(local: Collector) -> None:
    exporter, tracer = _exporter(local.endpoint, delay_s=60)
    for i in range(5):
        tracer.start_span(f"s{i}").end()
    exporter.shutdown(10)
    assert len(local.spans()) == 5
    tracer.start_span("late").end()
    assert exporter.dropped == 1
    exporter.shutdown(10)  # twice is fine


def test_a_full_queue_drops_and_counts_and_says_so_once(
    local: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    local.hold.clear()  # the collector holds the first batch: the queue fills behind it
    exporter, tracer = _exporter(local.endpoint, max_queue=20, max_batch=10, delay_s=60)
    for i in range(10):
        tracer.start_span(f"first{i}").end()
    assert offload(local.arrived.wait, 10)  # the first batch is out, held at the collector
    with caplog.at_level(logging.WARNING, logger="subagent.otlp"):
        for i in range(50):
            tracer.start_span(f"then{i}").end()
    assert exporter.dropped == 30  # 20 fit the queue
    warnings = [r for r in caplog.records if "dropping spans" in r.getMessage()]
    assert len(warnings) == 1 and "queue is full" in warnings[0].getMessage()
    local.hold.set()
    assert exporter.force_flush(10)
    assert len(local.spans()) == 30
    exporter.shutdown(5)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_a_collector_that_is_down_loses_spans_counted_never_hangs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    endpoint = f"http://127.0.0.1:{_closed_port()}/v1/traces"
    exporter, tracer = _exporter(endpoint, max_batch=5, delay_s=60)
    with caplog.at_level(logging.WARNING, logger="subagent.otlp"):
        for i in range(12):
            tracer.start_span(f"s{i}").end()
        assert exporter.force_flush(10)  # done: the spans are lost, not pending
        tracer.start_span("more").end()
        assert exporter.force_flush(10)
        exporter.shutdown(10)
    assert exporter.dropped == 13 and exporter.exported == 0
    warnings = [r.getMessage() for r in caplog.records if "dropping spans" in r.getMessage()]
    assert len(warnings) == 1 and "ConnectionRefusedError" in warnings[0]


def test_a_post_that_raises_loses_its_batch_and_the_drainer_lives_on(
    local: Collector, caplog: pytest.LogCaptureFixture
) -> None:
    """An exception the poster does not turn into a reason (a bug, or the HTTP client refusing
    something) used to end the drainer greenlet: every later span waited in the queue and each
    flush (the CLI's at exit) waited out its whole timeout. Now the batch is lost, counted and
    said once, and the next batch is posted."""
    poster = HttpPoster(local.endpoint, timeout_s=5)
    calls: list[int] = []

    def post(body: bytes) -> str | None:
        calls.append(len(body))
        if len(calls) == 1:
            raise RuntimeError("a post that breaks")
        return poster(body)

    exporter = BatchExporter(RESOURCE, post, close=poster.close, max_batch=5, delay_s=60)
    tracer = LeanTracerProvider(RESOURCE, exporter).get_tracer("t")
    with caplog.at_level(logging.WARNING, logger="subagent.otlp"):
        for i in range(5):
            tracer.start_span(f"lost{i}").end()
        assert exporter.force_flush(10)
        for i in range(3):
            tracer.start_span(f"kept{i}").end()
        done = gevent.event.Event()
        flushed = gevent.spawn(lambda: (exporter.force_flush(10), done.set()))
        assert done.wait(10), "the drainer died: the flush waits out its timeout"
        flushed.join()
        exporter.shutdown(5)
    assert exporter.dropped == 5 and exporter.exported == 3
    assert sorted(s.name for s in local.spans()) == ["kept0", "kept1", "kept2"]
    warnings = [r.getMessage() for r in caplog.records if "dropping spans" in r.getMessage()]
    assert len(warnings) == 1 and "RuntimeError" in warnings[0]


def test_an_error_answer_counts_the_batch_as_dropped(local: Collector) -> None:
    local.status = 503
    exporter, tracer = _exporter(local.endpoint, delay_s=60)
    tracer.start_span("s").end()
    assert exporter.force_flush(10)
    assert exporter.dropped == 1 and local.spans() == []
    exporter.shutdown(5)


def test_gzip_compression_arrives_decoded(local: Collector) -> None:
    poster = HttpPoster(local.endpoint, compression="gzip")
    exporter = BatchExporter(RESOURCE, poster, close=poster.close, delay_s=60)
    LeanTracerProvider(RESOURCE, exporter).get_tracer("t").start_span("zipped").end()
    exporter.shutdown(10)
    assert [s.name for s in local.spans()] == ["zipped"]
    assert local.headers[0]["Content-Encoding"] == "gzip"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        BatchExporter(RESOURCE, lambda body: None, max_queue=10, max_batch=20)
    with pytest.raises(ValueError, match="http"):
        HttpPoster("ftp://x/v1/traces")
    with pytest.raises(ValueError, match="compression"):
        HttpPoster("http://x/v1/traces", compression="zstd")


def test_cached_encodings_never_mix_values_that_compare_equal() -> None:
    """True == 1 == 1.0 and "1" != 1: whatever the caches keep, each span decodes to its own
    values, and a key whose values vary (an id) still encodes every one."""
    sink = MemorySink()
    tracer = LeanTracerProvider(RESOURCE, sink).get_tracer("t")
    values: list[object] = [True, 1, 1.0, "1", ("a",), (True,), (1,), False, 0]
    for value in values * 2:
        tracer.start_span("same", attributes={"v": value}).end()  # type: ignore[dict-item]
    for i in range(600):
        tracer.start_span("tool", attributes={"op": "x", "id": f"call-{i}"}).end()
    from subagent.otlp import Encoder

    encoder = Encoder(RESOURCE)
    encoded = [encoder.span(span) for span in sink.spans]  # one encoder: its caches fill
    request = ExportTraceServiceRequest.FromString(
        encoder.request(
            [(span.scope, body) for span, body in zip(sink.spans, encoded, strict=True)]
        )
    )
    decoded = [s for r in request.resource_spans for sc in r.scope_spans for s in sc.spans]
    got = [_attrs(s.attributes)["v"] for s in decoded[: len(values) * 2]]

    def typed(value: object) -> object:
        if isinstance(value, tuple):
            return tuple(typed(item) for item in value)
        return (type(value), value)

    assert [typed(v) for v in got] == [typed(v) for v in values * 2]
    assert [_attrs(s.attributes) for s in decoded[len(values) * 2 :]] == [
        {"op": "x", "id": f"call-{i}"} for i in range(600)
    ]


def test_a_collector_that_does_not_answer_bounds_flush_and_shutdown(local: Collector) -> None:
    """A collector that holds the request: flush and shutdown give up at their timeouts (the
    post itself at the exporter's), and the spans still go once it answers."""
    local.hold.clear()
    exporter, tracer = _exporter(local.endpoint, delay_s=60)
    tracer.start_span("held").end()
    assert exporter.force_flush(0.2) is False  # not done in time: said, not waited for
    assert offload(local.arrived.wait, 10)
    local.hold.set()
    assert exporter.force_flush(10) is True
    assert [s.name for s in local.spans()] == ["held"]
    exporter.shutdown(5)


class _RawServer:
    """An HTTP server on 127.0.0.1 (a thread, raw sockets) that reads each request and answers
    with `answer(connection)`: for collectors that misbehave in ways `http.server` cannot."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.connections = 0
        self._answer = answer
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(8)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}/v1/traces"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                while True:
                    head = b""
                    while b"\r\n\r\n" not in head:
                        more = conn.recv(65536)
                        if not more:
                            return
                        head += more
                    header, _, body = head.partition(b"\r\n\r\n")
                    length = int(header.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    while len(body) < length:
                        body += conn.recv(65536)
                    self._answer(conn)
            except OSError:
                return  # the client closed the connection: what a bounded read does

    def close(self) -> None:
        self._stop.set()
        self._listener.close()


def test_a_long_answer_is_not_read_whole_and_its_connection_is_not_kept() -> None:
    """An endpoint that answers with a page (a wrong URL) or more: at most `MAX_ANSWER` bytes
    are read, then the connection is dropped (its unread rest would corrupt the next answer)."""
    page = 20 * 1024 * 1024

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % page)
        chunk = b"x" * 65536
        for _ in range(page // len(chunk)):
            conn.sendall(chunk)

    server = _RawServer(answer)
    try:
        poster = HttpPoster(server.endpoint, timeout_s=10)
        tracemalloc.start()
        try:
            assert poster(b"batch") is None
            assert poster(b"batch") is None
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        poster.close()
    finally:
        server.close()
    assert peak < 2 * MAX_ANSWER + 1024 * 1024, peak  # not the 20 MB page
    assert server.connections == 2  # the first connection was not reused mid-answer


def _dripping() -> tuple[_RawServer, threading.Event]:
    """A server that streams its answer a chunk at a time until the event is set: every socket
    read returns within any timeout, so only a bound on the whole exchange ends a post."""
    stop = threading.Event()

    def answer(conn: socket.socket) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not stop.wait(0.05):
            conn.sendall(b"1\r\nx\r\n")

    return _RawServer(answer), stop


def test_an_answer_that_never_ends_is_cut_at_the_timeout() -> None:
    server, stop = _dripping()
    try:
        poster = HttpPoster(server.endpoint, timeout_s=0.5)
        done = TaskGroup("post")
        posted = done.spawn(poster, b"batch")
        posted.join(timeout=30)
        assert posted.ready(), "the post never ended"
        assert posted.value is not None and "TimeoutError" in posted.value
        done.close()
        poster.close()
    finally:
        stop.set()
        server.close()


def test_an_answer_that_never_ends_is_cut_at_the_timeout_off_the_hub_too() -> None:
    """The same server, the post made from a thread with no hub (an export thread, or the
    caller at interpreter exit, over a plain socket): it used to hold that thread, and the
    process's exit, forever."""
    server, stop = _dripping()
    try:
        poster = HttpPoster(server.endpoint, timeout_s=0.5)
        outcome: list[str | None] = []
        thread = threading.Thread(target=lambda: outcome.append(poster(b"batch")), daemon=True)
        thread.start()
        offload(thread.join, 30)
        assert outcome, "the post never ended"
        assert outcome[0] is not None and "TimeoutError" in outcome[0]
        poster.close()
    finally:
        stop.set()
        server.close()


def _export_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "subagent-otlp-export"]


def test_the_hub_side_export_makes_no_thread_and_a_silent_collector_never_blocks_the_hub(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Spans ended on the hub are posted by a greenlet over a gevent socket: no OS thread, and
    a collector that takes the connection but never answers costs the hub nothing (the suite's
    hub monitor fails a block > 0.1 s) until the post's own timeout drops the batch."""
    before = _export_threads()
    with socket.socket() as silent:  # listens, never accepts: connects, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}/v1/traces"
        poster = HttpPoster(endpoint, timeout_s=1.0)
        exporter = BatchExporter(RESOURCE, poster, close=poster.close, max_batch=5, delay_s=60)
        tracer = LeanTracerProvider(RESOURCE, exporter).get_tracer("t")
        ticks = TaskGroup("ticker")
        ran = gevent.event.Event()
        with caplog.at_level(logging.WARNING, logger="subagent.otlp"):
            for i in range(5):  # a full batch: the greenlet wakes and posts
                tracer.start_span(f"s{i}").end()
            ticks.spawn(ran.set)
            assert exporter.force_flush(10)  # done: the batch timed out and was dropped
        assert ran.is_set()  # other greenlets ran while the post waited
        assert exporter.dropped == 5 and exporter.exported == 0
        warnings = [r.getMessage() for r in caplog.records if "dropping spans" in r.getMessage()]
        assert len(warnings) == 1 and "timed out" in warnings[0]
        assert _export_threads() == before == []
        exporter.shutdown(5)
        ticks.close(5)


def test_spans_ended_in_another_thread_are_exported_by_a_thread(local: Collector) -> None:
    """A gevent event cannot be set from another OS thread: that exporter's drainer becomes a
    real thread, and every span still arrives (the hub's too)."""
    exporter, tracer = _exporter(local.endpoint, max_batch=5, delay_s=60)
    tracer.start_span("hub").end()

    def elsewhere() -> None:
        for i in range(7):
            tracer.start_span(f"thread{i}").end()

    worker = threading.Thread(target=elsewhere)
    worker.start()
    offload(worker.join, 10)
    assert len(_export_threads()) == 1
    tracer.start_span("hub again").end()
    assert exporter.force_flush(10)
    names = sorted(s.name for s in local.spans())
    assert names == sorted(["hub", "hub again", *(f"thread{i}" for i in range(7))])
    exporter.shutdown(5)
    assert _export_threads() == []


def test_shutdown_without_a_hub_posts_in_the_caller(local: Collector) -> None:
    """`cooperative=False` (interpreter exit): the caller posts what is queued itself."""
    exporter, tracer = _exporter(local.endpoint, delay_s=60)
    for i in range(3):
        tracer.start_span(f"s{i}").end()
    exporter.shutdown(5, cooperative=False)
    assert sorted(s.name for s in local.spans()) == ["s0", "s1", "s2"]
    assert exporter.exported == 3 and _export_threads() == []


def test_templated_spans_encode_byte_for_byte_as_spans_made_through_the_api() -> None:
    """Spans from a template (`LeanTracer.subspans`: the runtime's chat and tool spans) encode
    as the same spans made with every attribute through `start_span`: the template's fields
    once, the span's own after them, including the direct path for a key whose values vary
    (call ids, past the 256 values the cache keeps per key), non-ASCII, long and lone-surrogate
    values, statuses, and a span that set a template key."""
    from subagent.otlp import Encoder

    sink = MemorySink()
    tracer = LeanTracerProvider(RESOURCE, sink).get_tracer("subagent-runtime")
    parent = tracer.start_span("invoke_agent w")
    context = trace.set_span_in_context(parent)
    fast = tracer.subspans(parent)  # type: ignore[attr-defined]  # the lean tracer's own
    base = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t\u00e9"}
    template = fast.template("execute_tool t\u00e9", SpanKind.INTERNAL, base)
    ids = [f"call_{i}" for i in range(300)] + ["\u00e9" * 100, "x" * 200, "lone \ud800 half"]
    encoder = Encoder(RESOURCE)
    encoded = []
    for i, call_id in enumerate(ids):
        own: dict[str, object] = {"gen_ai.tool.call.id": call_id}
        if i % 7 == 0:
            own["n"] = i
        span = fast.start(template, own)
        if i % 5 == 0:
            span.set_status(StatusCode.ERROR, "TOOL_FAILED")
        if i % 11 == 0:
            span.set_attribute("gen_ai.tool.name", "renamed")
        span.end()
        twin = _through_the_api(tracer, span, context)
        twin.set_status(span.status)
        twin.end(span.end_time)
        encoded.append(encoder.span(span))
        assert encoded[-1] == Encoder(RESOURCE).span(twin), call_id
    request = ExportTraceServiceRequest.FromString(encoder.request(
        [(tracer._scope, e) for e in encoded]  # type: ignore[attr-defined]
    ))  # fmt: skip
    decoded = request.resource_spans[0].scope_spans[0].spans
    assert [_attrs(s.attributes)["gen_ai.tool.call.id"] for s in decoded][-3:] == [
        "\u00e9" * 100, "x" * 200, "lone ? half",
    ]  # fmt: skip
    assert _attrs(decoded[0].attributes) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "renamed",
        "gen_ai.tool.call.id": "call_0", "n": 0,
    }  # fmt: skip
    assert decoded[0].name == "execute_tool t\u00e9"


def test_a_templated_spans_own_integers_and_strings_encode_as_through_the_api() -> None:
    """A templated span's own attributes (an activation's run id, parent id, depth, ids)
    through the encoder's inline cache look-ups: repeated and varying strings and integers
    (past the 256 values kept per key), and values that compare equal across types (True, 1,
    1.0), encode byte for byte as the same span made through `start_span`, and decode as set."""
    from subagent.otlp import Encoder

    sink = MemorySink()
    tracer = LeanTracerProvider(RESOURCE, sink).get_tracer("subagent-runtime")
    parent = tracer.start_span("root")
    context = trace.set_span_in_context(parent)
    template = tracer.template(  # type: ignore[attr-defined]  # the lean tracer's own
        "invoke_agent w", SpanKind.INTERNAL, {"gen_ai.operation.name": "invoke_agent"}
    )
    encoder = Encoder(RESOURCE)
    values: list[object] = [1, True, 1.0, "1"]
    for i in range(300):
        own: dict[str, object] = {
            "subagent.run_id": f"run-{i}",  # varies: written out past 256 values
            "subagent.parent_id": "parent",  # repeats: from the cache
            "subagent.depth": i % 3,  # repeats
            "n": i,  # an integer that varies
            "same": values[i % 4],  # equal across types: never mixed up
        }
        span, _ = tracer.start_current(template, own, context)  # type: ignore[attr-defined]
        span.add_event("subagent.turn.end", {"subagent.turn": 1, "subagent.turn.reason": "x"})
        span.end()
        twin = _through_the_api(tracer, span, context)
        twin.event_list = span.event_list
        twin.end(span.end_time)
        mine = encoder.span(span)
        assert mine == Encoder(RESOURCE).span(twin), i
        decoded = PbSpan.FromString(mine[2:] if mine[1] < 0x80 else mine[3:])
        found = _attrs(decoded.attributes)
        assert found["n"] == i and found["subagent.run_id"] == f"run-{i}"
        assert type(found["same"]) is type(values[i % 4]) and found["same"] == values[i % 4]


def test_event_attributes_from_the_caches_decode_as_recorded() -> None:
    """Event attributes share the span attributes' caches (only the field's tag differs): a
    repeated event, and one whose values vary past what the cache keeps per key (a steer's
    message id), decode to what was recorded, next to span attributes of the same keys."""
    from subagent.otlp import Encoder

    sink = MemorySink()
    tracer = LeanTracerProvider(RESOURCE, sink).get_tracer("subagent-runtime")
    encoder = Encoder(RESOURCE)
    for i in range(300):
        span = tracer.start_span("invoke_agent", attributes={"subagent.message_id": f"m{i}"})
        span.add_event("subagent.steer.admitted", {"subagent.message_id": f"m{i}", "n": i})
        span.add_event("subagent.turn.end", {"subagent.turn": 1, "ok": True, "x": 0.5})
        span.end()
        encoded = encoder.span(span)
        request = ExportTraceServiceRequest.FromString(encoder.request([(span.scope, encoded)]))  # type: ignore[attr-defined]
        (pb,) = request.resource_spans[0].scope_spans[0].spans
        assert _attrs(pb.attributes) == {"subagent.message_id": f"m{i}"}
        steer, end = pb.events
        assert (steer.name, _attrs(steer.attributes)) == (
            "subagent.steer.admitted", {"subagent.message_id": f"m{i}", "n": i},
        )  # fmt: skip
        assert (end.name, _attrs(end.attributes)) == (
            "subagent.turn.end", {"subagent.turn": 1, "ok": True, "x": 0.5},
        )  # fmt: skip
        assert encoded == Encoder(RESOURCE).span(span)


def _recorded_own(i: int) -> dict[str, object] | None:
    """A recorded span's own attributes: none, then an integer and a string that vary."""
    return {"gen_ai.usage.output_tokens": i, "gen_ai.response.id": f"r{i}"} if i else None


def test_recorded_spans_reach_the_exporter_without_a_span_object_and_encode_as_spans() -> None:
    """`Subspans.record` (the runtime's chat spans) into the batch exporter: encoded straight
    from the template and the parent's shared fields (`BatchExporter.leaf`), byte for byte what
    the span itself encodes to, trace state included, and every one is posted."""
    from subagent.otlp import Encoder

    posted: list[bytes] = []

    def post(body: bytes) -> None:
        posted.append(body)

    N = 300
    exporter = BatchExporter(RESOURCE, post, max_queue=1000, max_batch=1000, delay_s=60)
    group = TaskGroup("test-leaves")

    def run() -> None:
        tracer = LeanTracerProvider(RESOURCE, exporter).get_tracer("subagent-runtime")
        parent = _under_a_remote_parent(tracer)
        fast = tracer.subspans(parent)  # type: ignore[attr-defined]  # the lean tracer's own
        template = fast.template(
            "chat m", SpanKind.CLIENT,
            {"gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": ("stop",)},
        )  # fmt: skip
        for i in range(N):  # past the 256 values kept per key: then written straight out
            fast.record(template, 1000 + i, _recorded_own(i))
        assert exporter.force_flush(5)

    group.spawn(run).get()
    group.close(5)
    (body,) = posted
    spans = ExportTraceServiceRequest.FromString(body).resource_spans[0].scope_spans[0].spans
    assert len(spans) == N and exporter.exported == N
    encoder = Encoder(RESOURCE)
    for i, pb in enumerate(spans):
        assert pb.name == "chat m" and pb.kind == PbSpan.SPAN_KIND_CLIENT
        assert pb.trace_id == (0xABC).to_bytes(16, "big") and pb.trace_state == "vendor=v1"
        assert pb.start_time_unix_nano == 1000 + i and pb.end_time_unix_nano >= 1000 + i
        assert pb.flags == 0x100
        own = _recorded_own(i) or {}
        assert _attrs(pb.attributes) == {
            "gen_ai.operation.name": "chat", "gen_ai.response.finish_reasons": ("stop",), **own,
        }  # fmt: skip
        twin = LeanSpan(
            pb.name, 0xABC, int.from_bytes(pb.span_id, "big"),
            int.from_bytes(pb.parent_span_id, "big"), False, TraceState([("vendor", "v1")]),
            SpanKind.CLIENT, pb.start_time_unix_nano, dict(_attrs(pb.attributes)), None,
            None, MemorySink(), True,  # type: ignore[arg-type]
        )  # fmt: skip
        twin.end(pb.end_time_unix_nano)
        assert encoder.span(twin) in body


def test_a_tool_spans_end_is_encoded_by_the_exporters_own_path_byte_for_byte() -> None:
    """`Subspans.end` into the batch exporter (the runtime's tool spans): a span that kept its
    template and has no status, event or link is encoded and queued by the exporter's own path
    (`on_end` is not called for it), byte for byte what `Encoder.span` writes for it: call ids
    past what the cache keeps per key, non-ASCII and lone-surrogate ids, integers of a key whose
    values vary, values the API cleans; a span with a status, an event or its own name goes
    through `on_end`. Spans of another scope keep theirs, and after shutdown both paths drop
    and count."""
    from subagent.otlp import Encoder

    posted: list[bytes] = []
    exporter = BatchExporter(RESOURCE, posted.append, max_queue=2000, max_batch=2000, delay_s=60)  # type: ignore[arg-type]
    generic: list[LeanSpan] = []
    on_end = exporter.on_end

    def counted(span: LeanSpan) -> None:
        generic.append(span)
        on_end(span)

    exporter.on_end = counted  # type: ignore[method-assign]
    group = TaskGroup("test-tool-leaves")
    ended: list[LeanSpan] = []

    def run() -> None:
        provider = LeanTracerProvider(RESOURCE, exporter)
        tracer = provider.get_tracer("subagent-runtime")
        parent = _under_a_remote_parent(tracer)
        context = trace.set_span_in_context(parent)
        fast = tracer.subspans(parent)  # type: ignore[attr-defined]  # the lean tracer's own
        template = fast.template(
            "execute_tool t\u00e9", SpanKind.INTERNAL,
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t\u00e9"},
        )  # fmt: skip
        ids = [f"call_{i}" for i in range(300)] + ["\u00e9" * 100, "x" * 200, "lone \ud800 half"]
        for i, call_id in enumerate(ids):
            own: dict[str, object] = {"gen_ai.tool.call.id": call_id, "n": i * 1000 - 150_000}
            if i % 13 == 0:
                own.update(listed=["a", "b"], flag=True, ratio=0.5)
            span, _ = fast.start_current(template, own, context)
            if i % 5 == 0:
                span.set_status(StatusCode.ERROR, "TOOL_FAILED")
            elif i % 7 == 0:
                span.add_event("e", {"k": i})
            elif i % 11 == 0:
                span.update_name("renamed")
            fast.end(span)
            ended.append(span)
        other = provider.get_tracer("host", "2.1").start_span("host span")
        other.end()
        ended.append(other)  # type: ignore[arg-type]  # a lean span
        assert exporter.force_flush(5)
        exporter.shutdown(5)
        late, _ = fast.start_current(template, {"gen_ai.tool.call.id": "late"}, context)
        fast.end(late)
        fast.record(template, 1, None)
        assert exporter.dropped == 2

    group.spawn(run).get()
    group.close(5)
    assert exporter.exported == len(ended) == 304
    statusless = [s for i, s in enumerate(ended[:-1]) if i % 5 and i % 7 and i % 11]
    assert generic == [s for s in ended if s not in statusless]  # only those went through on_end
    (body,) = posted
    request = ExportTraceServiceRequest.FromString(body)
    ours, host = request.resource_spans[0].scope_spans
    assert (ours.scope.name, host.scope.name) == ("subagent-runtime", "host")
    assert len(ours.spans) == 303 and len(host.spans) == 1
    encoder = Encoder(RESOURCE)
    for span in ended:
        assert encoder.span(span) in body, span.name
    decoded = {pb.span_id: pb for pb in ours.spans}
    first = decoded[ended[1].span_id.to_bytes(8, "big")]
    assert _attrs(first.attributes) == {
        "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t\u00e9",
        "gen_ai.tool.call.id": "call_1", "n": -149_000,
    }  # fmt: skip
    for i in (298, 299, 301, 302):  # past the values kept per key: written straight out
        late = _attrs(decoded[ended[i].span_id.to_bytes(8, "big")].attributes)
        assert late["n"] == i * 1000 - 150_000
    cleaned = decoded[ended[13].span_id.to_bytes(8, "big")]
    assert _attrs(cleaned.attributes)["listed"] == ("a", "b")
    assert first.trace_state == "vendor=v1" and first.flags == 0x100


def test_recorded_spans_with_values_the_api_cleans_encode_as_spans_made_through_it() -> None:
    """`Subspans.record` into the exporter with own attributes it must clean (a list, a str
    subclass, a value the API refuses, booleans and floats): the bytes are those of the same
    span made through `start_span`, which cleans them."""
    from subagent.otlp import Encoder

    class Finish(str):
        """A str subclass that prints otherwise (as a `(str, Enum)` member does)."""

        def __str__(self) -> str:
            return "Finish.STOP"

    posted: list[bytes] = []
    exporter = BatchExporter(RESOURCE, posted.append, max_queue=100, max_batch=100, delay_s=60)  # type: ignore[arg-type]
    tracer = LeanTracerProvider(RESOURCE, exporter).get_tracer("subagent-runtime")
    own = {"l": ["a", "b"], "e": Finish("stop"), "bad": object(), "b": True, "f": 1.5, "i": -3}

    def run() -> None:
        parent = tracer.start_span("invoke_agent")
        fast = tracer.subspans(parent)  # type: ignore[attr-defined]  # the lean tracer's own
        template = fast.template("chat m", SpanKind.CLIENT, {"gen_ai.operation.name": "chat"})
        fast.record(template, 1000, dict(own))
        assert exporter.force_flush(5)

    group = TaskGroup("test-cleaned-leaves")
    group.spawn(run).get()
    group.close(5)
    (pb,) = ExportTraceServiceRequest.FromString(posted[0]).resource_spans[0].scope_spans[0].spans
    assert _attrs(pb.attributes) == {
        "gen_ai.operation.name": "chat", "l": ("a", "b"), "e": "stop", "b": True, "f": 1.5,
        "i": -3,
    }  # fmt: skip
    twin = tracer.start_span(
        "chat m", trace.set_span_in_context(trace.NonRecordingSpan(SpanContext(
            int.from_bytes(pb.trace_id, "big"), int.from_bytes(pb.parent_span_id, "big"), False,
            TraceFlags(1),
        ))),
        SpanKind.CLIENT, {"gen_ai.operation.name": "chat", **own}, start_time=1000,
    )  # fmt: skip
    assert isinstance(twin, LeanSpan)
    twin.span_id = int.from_bytes(pb.span_id, "big")
    twin.end_time = pb.end_time_unix_nano
    assert Encoder(RESOURCE).span(twin) in posted[0]


def _through_the_api(tracer: trace.Tracer, span: LeanSpan, context: Context) -> LeanSpan:
    """`span` made again through `start_span` (its name, kind, attributes, start and id), for
    its encoding to be compared byte for byte; not ended yet."""
    twin = tracer.start_span(
        span.name, context, span.kind, dict(span.attributes), start_time=span.start_time
    )
    assert isinstance(twin, LeanSpan)
    twin.span_id = span.span_id
    return twin


def _under_a_remote_parent(tracer: trace.Tracer) -> trace.Span:
    """An `invoke_agent` span whose parent came from another process, with a trace state: the
    leaf paths' shared head then holds every optional field."""
    remote = SpanContext(
        0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1")]),
    )  # fmt: skip
    return tracer.start_span(
        "invoke_agent", trace.set_span_in_context(trace.NonRecordingSpan(remote))
    )
