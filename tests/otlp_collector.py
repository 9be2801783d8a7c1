"""A minimal OTLP/HTTP trace collector for tests: a real HTTP server on 127.0.0.1 (in a thread)
that decodes each request with the `opentelemetry-proto` classes and keeps it."""

from __future__ import annotations

import gzip
import http.server
import threading
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from supervision.offload import offload


class Collector:
    """What arrived: decoded requests, their headers; `hold` keeps each POST waiting until set,
    `status` is the answer's status code."""

    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self.paths: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.arrived = threading.Event()  # set at each request's arrival
        self.status = 200
        self.endpoint = ""

    def spans(self) -> list[Any]:
        return [
            span
            for request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
            for span in scope.spans
        ]

    def services(self) -> set[str]:
        """Every `service.name` the requests' resources carried."""
        return {
            kv.value.string_value
            for request in self.requests
            for resource in request.resource_spans
            for kv in resource.resource.attributes
            if kv.key == "service.name"
        }

    def scopes(self) -> set[str]:
        return {
            scope.scope.name
            for request in self.requests
            for resource in request.resource_spans
            for scope in resource.scope_spans
        }

    def batch_sizes(self) -> list[int]:
        return [
            sum(len(scope.spans) for r in request.resource_spans for scope in r.scope_spans)
            for request in self.requests
        ]


@contextmanager
def collector() -> Iterator[Collector]:
    found = Collector()
    reply = ExportTraceServiceResponse().SerializeToString()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            elif self.headers.get("Content-Encoding") == "deflate":
                body = zlib.decompress(body)
            found.arrived.set()
            found.hold.wait(30)
            if found.status == 200:
                found.requests.append(ExportTraceServiceRequest.FromString(body))
                found.headers.append(dict(self.headers.items()))
                found.paths.append(self.path)
            self.send_response(found.status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    found.endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        found.hold.set()
        offload(server.shutdown)  # waits out serve_forever's poll: off the hub
        server.server_close()
        offload(thread.join)
