"""An ACP agent that traces its own work under the `traceparent` its client sent in `_meta`.

It stands for any OpenTelemetry-instrumented ACP agent in another process. It takes the W3C
trace context from `session/new`'s `_meta`, opens an `invoke_agent` span with a `chat` span
inside for each prompt, exports them to memory, and answers the prompt with those spans as
JSON (so the test sees, in its own process, what the child's process recorded). Standard
library plus opentelemetry-sdk; exits on stdin EOF.
"""

import json
import sys

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def send(message: dict) -> None:  # type: ignore[type-arg]
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("traced-acp-peer")
    received_meta: dict = {}  # type: ignore[type-arg]
    for line in sys.stdin:
        msg = json.loads(line)
        method, rid, params = msg.get("method"), msg.get("id"), msg.get("params") or {}
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1}})
        elif method == "session/new":
            received_meta = params.get("_meta") or {}
            send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "s1"}})
        elif method == "session/prompt":
            parent = TraceContextTextMapPropagator().extract(received_meta)
            with tracer.start_as_current_span("invoke_agent peer", context=parent):
                tracer.start_span("chat peer-model").end()  # under the current span
            spans = [
                {
                    "name": s.name,
                    "trace_id": s.context.trace_id,
                    "span_id": s.context.span_id,
                    "parent_id": s.parent.span_id if s.parent else None,
                }
                for s in exporter.get_finished_spans()
            ]
            text = json.dumps({"meta": received_meta, "spans": spans})
            content = {"type": "text", "text": text}
            update = {"sessionUpdate": "agent_message_chunk", "content": content}
            send({"jsonrpc": "2.0", "method": "session/update",
                  "params": {"sessionId": "s1", "update": update}})  # fmt: skip
            send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
        elif rid is not None:
            send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})


if __name__ == "__main__":
    main()
