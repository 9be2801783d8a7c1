"""OTLP over gRPC (`OTEL_EXPORTER_OTLP_PROTOCOL=grpc`, the SDK's pipeline with its gRPC
exporter): a CLI's spans reach a real gRPC collector on 127.0.0.1, and against one that is down
or never answers the CLI exits within the same deadline as over HTTP, saying what it lost.

gRPC's core runs threads of its own beside the hub; the runtime never monkey-patches, so the
SDK's export thread is a real thread and the exporter's shutdown at exit must not outlive the
deadline (docs/tracing.md)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import pytest

pytest.importorskip(
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter", reason="the gRPC exporter"
)

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from test_sdk_exit import (
    BOUND_S,
    _closed_port,
    _demo_exit,
    _env,
    _lost,
    _Silent,
    demo_spans,
    silent,
)

from supervision.offload import offload

__all__ = ["demo_spans", "silent"]  # the fixtures this module shares with test_sdk_exit


class _Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """A gRPC trace collector that counts the spans it took."""

    def __init__(self) -> None:
        self.spans = 0
        self._lock = threading.Lock()

    def Export(  # the service's method name
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        taken = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self._lock:
            self.spans += taken
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
def grpc_collector() -> Iterator[tuple[_Collector, str]]:
    collector = _Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(collector, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield collector, f"http://127.0.0.1:{port}"
    finally:
        offload(server.stop(grace=None).wait, 10)


def _grpc_env(endpoint: str) -> dict[str, str]:
    return _env(endpoint, "sdk", OTEL_EXPORTER_OTLP_PROTOCOL="grpc")


def test_every_span_of_the_demo_reaches_a_grpc_collector(
    tmp_path: Path, grpc_collector: tuple[_Collector, str], demo_spans: int
) -> None:
    collector, endpoint = grpc_collector
    env = {**_grpc_env(endpoint), "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "512"}
    elapsed, stderr = _demo_exit(tmp_path, env)
    assert "spans were not exported" not in stderr, stderr[-2000:]
    assert collector.spans == demo_spans  # the same spans as over HTTP
    assert elapsed < BOUND_S


def test_against_a_refusing_grpc_endpoint_the_demo_exits_within_the_deadline(
    tmp_path: Path, demo_spans: int
) -> None:
    elapsed, stderr = _demo_exit(tmp_path, _grpc_env(f"http://127.0.0.1:{_closed_port()}"))
    assert elapsed < BOUND_S, (elapsed, stderr[-2000:])
    count, why = _lost(stderr)
    assert count == demo_spans
    assert "the exit deadline" in why


def test_against_a_silent_grpc_collector_the_demo_exits_within_the_deadline(
    tmp_path: Path, silent: _Silent, demo_spans: int
) -> None:
    elapsed, stderr = _demo_exit(tmp_path, _grpc_env(silent.endpoint))
    assert elapsed < BOUND_S, (elapsed, stderr[-2000:])
    count, why = _lost(stderr)
    assert count == demo_spans
    assert "the exit deadline" in why
