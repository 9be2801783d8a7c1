"""Tracing for the face: activation spans around starts and resumes, and set-up from `OTEL_*`.

The spans themselves are `agent.tracing`'s; this module decides where a child activation's
`invoke_agent` span opens (the service, before the provider's `start`, so the provider can pass
its context on to the child, in-process or across a process boundary) and how a process gets
a tracer provider when its host has not set one (`configure_from_env`).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from agent import tracing
from subagent.types import SubagentResumeRequest, SubagentStartRequest
from supervision.offload import offload

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from agent.store import MemoryStore, SessionStore

__all__ = ["begin_resume", "begin_start", "configure_from_env", "first_activation", "flush"]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "subagent"

# The batch span processor's queue when `OTEL_BSP_MAX_QUEUE_SIZE` is not set. The SDK's 2,048
# suits a server where requests end one by one; a fan-out's children step together, so each
# round of model replies ends 2 spans per stepping child at once, and the export thread (a real
# thread sharing the GIL with the hub) drains them only between the hub's slices. At 2,048 the
# OTLP exporter lost half the spans of a 2,000-child fan-out (docs/performance.md, `tracing`).
# 16,384 holds a round of 8,000 stepping children (a queued span is ~2.8 KB: ~45 MB at most).
DEFAULT_MAX_QUEUE_SIZE = 16_384

# The provider this module installed (never a host's): flushed by `flush()`.
_installed: list[Any] = []


def begin_start(
    request: SubagentStartRequest,
    provider: str,
    run_id: str,
    parent_id: str,
    runner: object = None,
    depth: int | None = None,
) -> tuple[SubagentStartRequest, tracing.Activation | None]:
    """Open the child's activation span; the provider gets a request carrying its context (and
    `depth`, the child's depth as the registry computed it, when given).

    `runner` is the provider object: one that runs its child in another process (a true
    `remote_process` attribute: ACP, Ray) gets a CLIENT span, as a call to a remote service.
    """
    if tracing.tracer() is None:
        return request, None
    parent = request.trace or tracing.ambient()
    continuation = request.continuation
    activation = tracing.start_activation(
        parent,
        provider=provider,
        run_id=run_id,
        parent_id=parent_id,
        depth=depth if depth is not None else _child_depth(request.parent),
        child_id=None if continuation is None else continuation.session_id,
        remote=_remote(runner),
    )
    if activation is None:
        return request, None
    if depth is not None:
        return replace(request, trace=activation.parent, depth=depth), activation
    return replace(request, trace=activation.parent), activation


def begin_resume(
    request: SubagentResumeRequest,
    provider: str,
    run_id: str,
    parent_id: str,
    store: SessionStore | MemoryStore,
    runner: object = None,
) -> tuple[SubagentResumeRequest, tracing.Activation | None]:
    """A resumed activation's span: under the caller's span, linked to the child's first."""
    if tracing.tracer() is None:
        return request, None
    parent = tracing.with_name(
        request.trace or tracing.ambient(), getattr(request.descriptor, "label", None)
    )
    if parent is None:
        label = getattr(request.descriptor, "label", None)
        parent = None if label is None else _unparented(label)
    activation = tracing.start_activation(
        parent,
        provider=provider,
        run_id=run_id,
        parent_id=parent_id,
        depth=_child_depth(request.parent),
        child_id=request.session_id,
        link=tracing.link_to(first_activation(store, request.session_id)),
        resumed=True,
        remote=_remote(runner),
    )
    if activation is None:
        return request, None
    return replace(request, trace=activation.parent), activation


def first_activation(store: SessionStore | MemoryStore, child_id: str) -> Mapping[str, Any] | None:
    """The traceparent carrier recorded with a continuable child's descriptor, if any."""
    try:
        header = store.header(child_id)
        for event in store.scan(child_id, start=header.seed_length):
            if event.get("type") == "subagent/descriptor":
                data = event.get("data")
                return data if isinstance(data, Mapping) else None
    except Exception:  # a link is a nicety: an unreadable log only loses it
        log.debug("no first activation for %s", child_id, exc_info=True)
    return None


def _remote(runner: object) -> bool:
    return getattr(runner, "remote_process", False) is True


def _unparented(name: str) -> tracing.TraceParent | None:
    """A parent-less `TraceParent` carrying only a name (a root span of its own)."""
    from opentelemetry.context import Context

    return tracing.TraceParent(Context(), name=name)


def _child_depth(parent: object) -> int | None:
    """The child's depth from its parent's, where the parent tells one (a request's `parent`
    is untyped at the seam)."""
    depth = getattr(parent, "depth", None)
    return depth + 1 if isinstance(depth, int) else None


# -- set-up from the environment ---------------------------------------------------------------


def configure_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Install an SDK tracer provider from the standard `OTEL_*` variables, if asked to.

    Only when `OTEL_TRACES_EXPORTER` (`console`, `otlp`, or a comma list) or an OTLP endpoint
    is set, `OTEL_SDK_DISABLED` is not true, and no tracer provider is set yet: a host's own
    provider is never replaced. Returns whether this call installed one. Raises `ValueError`
    for an exporter it does not know, and `RuntimeError` when the `otel` extra is missing.
    """
    env = os.environ if environ is None else environ
    names_text = env.get("OTEL_TRACES_EXPORTER", "").strip()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if not names_text and not endpoint:
        return False
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    names = [n.strip().lower() for n in (names_text or "otlp").split(",") if n.strip()]
    names = [n for n in names if n != "none"]
    if not names:
        return False
    for name in names:
        if name not in ("console", "otlp"):
            raise ValueError(f"OTEL_TRACES_EXPORTER: unsupported exporter {name!r}")
    try:
        _import_off_hub(
            "opentelemetry.trace",
            "opentelemetry.sdk.resources",
            "opentelemetry.sdk.trace",
            "opentelemetry.sdk.trace.export",
        )
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    except ImportError as exc:
        raise RuntimeError(
            "OTEL_TRACES_EXPORTER is set but tracing needs the `otel` extra: "
            "pip install 'subagent-runtime[otel]'"
        ) from exc
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the host (or an earlier call) set one: never replaced
    queue = _queue_size(env)
    attributes = {} if env.get("OTEL_SERVICE_NAME") else {"service.name": DEFAULT_SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in names:
        exporter: Any = ConsoleSpanExporter() if name == "console" else _otlp_exporter(env)
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=queue))
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:  # lost a race with the host: theirs stays
        provider.shutdown()
        return False
    _installed.append(provider)
    return True


def _import_off_hub(*modules: str) -> None:
    """Import `modules` in a worker thread (`offload`), so the `from` imports after it find them
    loaded. A first import of the SDK or an OTLP exporter (protobuf and its generated modules)
    runs for tenths of a second; `Runtime()` calls `configure_from_env`, possibly inside a
    greenlet, and the hub must not stall that long. An `ImportError` comes back as raised."""
    offload(_import_all, modules)


def _import_all(modules: tuple[str, ...]) -> None:
    for name in modules:
        importlib.import_module(name)


def _queue_size(env: Mapping[str, str]) -> int:
    """`OTEL_BSP_MAX_QUEUE_SIZE` if set (a positive integer), else `DEFAULT_MAX_QUEUE_SIZE`."""
    text = env.get("OTEL_BSP_MAX_QUEUE_SIZE", "").strip()
    if not text:
        return DEFAULT_MAX_QUEUE_SIZE
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size <= 0:
        raise ValueError(f"OTEL_BSP_MAX_QUEUE_SIZE: not a positive integer: {text!r}")
    return size


def _otlp_exporter(env: Mapping[str, str]) -> SpanExporter:
    protocol = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    )
    if protocol == "grpc":
        try:
            _import_off_hub("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise RuntimeError(
                "OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc; the `otel` extra "
                "ships http/protobuf (the default protocol)"
            ) from exc
        grpc: SpanExporter = OTLPSpanExporter()  # an optional package, untyped when absent
        return grpc
    if protocol != "http/protobuf":
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: unsupported protocol {protocol!r}")
    try:
        _import_off_hub("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )
    except ImportError as exc:
        raise RuntimeError(
            "the otlp exporter needs the `otel` extra: pip install 'subagent-runtime[otel]'"
        ) from exc
    return HttpExporter()


def flush(timeout_s: float = 30.0) -> None:
    """Export what the provider this module installed still holds (e.g. before a CLI exits)."""
    for provider in _installed:
        try:
            provider.force_flush(int(timeout_s * 1000))
        except Exception:
            log.exception("flushing spans failed")
