"""Tracing for the face: activation spans around starts and resumes, and set-up from `OTEL_*`.

The spans themselves are `agent.tracing`'s; this module decides where a child activation's
`invoke_agent` span opens (the service, before the provider's `start`, so the provider can pass
its context on to the child, in-process or across a process boundary) and how a process gets
a tracer provider when its host has not set one (`configure_from_env`).
"""

from __future__ import annotations

import atexit
import dataclasses
import importlib
import importlib.metadata
import keyword
import logging
import math
import os
import re
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from agent import tracing
from subagent.types import SubagentResumeRequest, SubagentStartRequest
from supervision.offload import offload

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.sdk.trace.sampling import Sampler

    from agent.store import MemoryStore, SessionStore
    from subagent.lean_tracing import LeanTracerProvider
    from subagent.otlp import BatchExporter

__all__ = [
    "begin_resume",
    "begin_start",
    "configure_from_env",
    "exit_timeout_s",
    "first_activation",
    "flush",
    "flush_at_exit",
    "lost_spans",
]

log = logging.getLogger(__name__)

DEFAULT_SERVICE_NAME = "subagent"

# The batch span processor's queue when `OTEL_BSP_MAX_QUEUE_SIZE` is not set. The SDK's 2,048
# suits a server where requests end one by one; a fan-out's children step together, so each
# round of model replies ends 2 spans per stepping child at once, and the export thread (a real
# thread sharing the GIL with the hub) drains them only between the hub's slices. At 2,048 the
# OTLP exporter lost half the spans of a 2,000-child fan-out (docs/performance.md, `tracing`).
# 16,384 holds a round of 8,000 stepping children (a queued span is ~2.8 KB: ~45 MB at most).
DEFAULT_MAX_QUEUE_SIZE = 16_384

# The most a pipeline's exit (flush and shutdown together) waits, when the exporter's own
# timeout is longer: a command whose work is done, or that was interrupted, should not wait
# longer for spans a collector may never take (docs/decisions.md).
EXIT_TIMEOUT_CAP_S = 5.0


class _Losses(Protocol):
    """What an installed pipeline says of the spans it lost (`BatchExporter`, or the SDK
    pipeline's `sdk_losses.Tally`)."""

    @property
    def dropped(self) -> int: ...

    @property
    def first_loss(self) -> str | None: ...


class _Exit(Protocol):
    """An installed pipeline's exit (`sdk_losses.SdkExit`, or the lean one's `_LeanExit`)."""

    def close(self, cooperative: bool) -> bool:
        """Flush and shut down within the exit deadline; True when every span went."""
        ...

    def give_up(self, cut: str) -> None:
        """End now: every span not exported yet is lost by `cut` ("the exit was interrupted")."""
        ...


class _Installed(NamedTuple):
    provider: LeanTracerProvider | SdkTracerProvider
    losses: tuple[_Losses, ...]
    closing: _Exit


# The provider this module installed (never a host's), with what counts its losses: flushed by
# `flush()`, its losses told by `lost_spans()`.
_installed: list[_Installed] = []


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
    found = tracing.tracer()
    if found is None:
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
        using=found,
    )
    if activation is None:
        return request, None
    return _with_trace(request, activation.parent, depth), activation


class _Copier:
    """Copies of one frozen, slotted dataclass's values with a new `trace` (and `depth`).

    `dataclasses.replace` on a start request (13 fields) was ~6 us of a traced child's ~21 us
    set-up; a loop over the slots' descriptors ~1.6 us (h18g); `copy`, a function written for
    the class's fields (as `dataclasses` writes `__init__`: one descriptor call per field, no
    loop), ~0.8 us (docs/performance.md, h18i)."""

    __slots__ = ("copy", "fields")

    def __init__(self, kind: type) -> None:
        names = tuple(f.name for f in dataclasses.fields(kind))  # identifiers (`_copier`)
        slots = kind.__dict__
        self.fields = names
        scope: dict[str, Any] = {"new": object.__new__, "kind": kind}
        lines = ["def copy(request, trace, depth):", "    made = new(kind)"]
        for i, name in enumerate(names):
            scope[f"set_{i}"] = slots[name].__set__
            if name == "trace":
                value = "trace"
            elif name == "depth":
                value = "request.depth if depth is None else depth"
            else:
                value = f"request.{name}"
            lines.append(f"    set_{i}(made, {value})")
        lines.append("    return made")
        exec("\n".join(lines), scope)  # our own text, from checked field names
        self.copy: Callable[[Any, tracing.TraceParent, int | None], Any] = scope["copy"]


_COPIERS: dict[type, _Copier | None] = {}


def _copier(kind: type) -> _Copier | None:
    """The copier for `kind`, or None where a plain copy would differ from `replace`: a class
    that is not a frozen slotted dataclass with every field in `__init__` and no
    `__post_init__` (whose checks `replace` would run)."""
    if kind in _COPIERS:
        return _COPIERS[kind]
    found: _Copier | None = None
    params = getattr(kind, "__dataclass_params__", None)
    fields = dataclasses.fields(kind) if dataclasses.is_dataclass(kind) else ()
    names = {f.name for f in fields}
    if (
        params is not None
        and params.frozen
        and "__slots__" in kind.__dict__
        and not hasattr(kind, "__post_init__")
        and all(f.init for f in fields)
        and {"trace", "depth"} <= names
        and set(kind.__dict__["__slots__"]) == names
        and all(name.isidentifier() and not keyword.iskeyword(name) for name in names)
    ):
        found = _Copier(kind)
    if len(_COPIERS) >= 64:
        _COPIERS.clear()
    _COPIERS[kind] = found
    return found


def _with_trace(
    request: SubagentStartRequest, trace: tracing.TraceParent, depth: int | None
) -> SubagentStartRequest:
    """`replace(request, trace=trace)`, with `depth=depth` too when given, made cheaply."""
    copier = _copier(type(request))
    if copier is None:
        if depth is not None:
            return replace(request, trace=trace, depth=depth)
        return replace(request, trace=trace)
    made: SubagentStartRequest = copier.copy(request, trace, depth)
    return made


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
    """Install a tracer provider from the standard `OTEL_*` variables, if asked to.

    Only when `OTEL_TRACES_EXPORTER` (`console`, `otlp`, or a comma list) or an OTLP endpoint
    is set, `OTEL_SDK_DISABLED` is not true, and no tracer provider is set yet: a host's own
    provider is never replaced. Returns whether this call installed one. Raises `ValueError`
    for an exporter or setting it does not know, and `RuntimeError` when the `otel` extra is
    missing.

    OTLP over http/protobuf with settings the lean pipeline supports (`lean_settings`) gets the
    runtime's lean provider (`subagent.lean_tracing`, `subagent.otlp`): the SDK's spans and its
    exporter's encoding cost more than the job they trace (docs/decisions.md). Anything else,
    or `SUBAGENT_OTEL_SDK=true`, gets the OpenTelemetry SDK's provider and exporters.
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
        _import_off_hub("opentelemetry.trace")
        from opentelemetry import trace
    except ImportError as exc:
        raise RuntimeError(
            "OTEL_TRACES_EXPORTER is set but tracing needs the `otel` extra: "
            "pip install 'subagent-runtime[otel]'"
        ) from exc
    # Refused whichever pipeline would read them (the SDK's would warn unseen and go on).
    sampler_setting(env)
    if "otlp" in names:
        _compression(env)
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return False  # the host (or an earlier call) set one: never replaced
    lean = lean_settings(env, names)
    provider: LeanTracerProvider | SdkTracerProvider
    losses: tuple[_Losses, ...]
    closing: _Exit
    if lean is not None:
        provider, losses, closing = _lean_provider(lean)
    else:
        provider, losses, closing = _sdk_provider(env, names)
    trace.set_tracer_provider(provider)
    if trace.get_tracer_provider() is not provider:  # lost a race with the host: theirs stays
        provider.shutdown()
        return False
    _installed.append(_Installed(provider, losses, closing))
    # In place of the SDK's own exit hook (`shutdown_on_exit`), which waits unbounded on a dead
    # collector, and of the lean exporter's drain of its whole queue; a CLI command has closed
    # it already (`flush_at_exit`), which leaves this nothing to do.
    atexit.register(closing.close, False)
    return True


# Settings only the SDK honours: any of them set keeps the SDK's pipeline (span limits, TLS
# files, id generators, resource detectors, a credential provider).
_SDK_ONLY_PREFIXES = (
    "OTEL_SPAN_",
    "OTEL_ATTRIBUTE_",
    "OTEL_EVENT_",
    "OTEL_LINK_",
    "OTEL_PYTHON_",
    "OTEL_EXPERIMENTAL_",
    "OTEL_EXPORTER_OTLP_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_CLIENT_",
    "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
    "OTEL_EXPORTER_OTLP_TRACES_CLIENT_",
)


class LeanSettings:
    """What the lean pipeline is set up with, read from `OTEL_*` (`lean_settings`)."""

    __slots__ = (
        "compression",
        "delay_s",
        "endpoint",
        "exit_timeout_s",
        "headers",
        "max_batch",
        "max_queue",
        "ratio",
        "resource",
        "sampler",
        "timeout_s",
    )

    def __init__(self, env: Mapping[str, str]) -> None:
        self.endpoint = otlp_endpoint(env)
        self.headers = otlp_headers(env)
        self.timeout_s = otlp_timeout_s(env)
        compression = _compression(env)
        self.compression = None if compression == "none" else compression
        self.sampler, self.ratio = sampler_setting(env)
        self.max_queue = _queue_size(env)
        self.max_batch = int(_number(env, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", None, 512))
        self.delay_s = _number(env, "OTEL_BSP_SCHEDULE_DELAY", None, 5000) / 1000
        # `OTEL_BSP_EXPORT_TIMEOUT` is not read: an exit waits `exit_timeout_s` (the SDK's
        # batch processor stores that setting and never uses it either).
        self.exit_timeout_s = exit_timeout_s(env)
        self.resource = resource_attributes(env)


def lean_settings(env: Mapping[str, str], names: list[str]) -> LeanSettings | None:
    """The lean pipeline's settings, or None when the set-up needs the SDK: another exporter
    than `otlp`, another protocol than http/protobuf, deflate compression, an SDK-only
    setting, or `SUBAGENT_OTEL_SDK=true`.
    A bad value of a setting it supports raises `ValueError`."""
    if env.get("SUBAGENT_OTEL_SDK", "").strip().lower() == "true" or names != ["otlp"]:
        return None
    if _protocol(env) != "http/protobuf" or _compression(env) not in ("none", "gzip"):
        return None
    if any(key.startswith(_SDK_ONLY_PREFIXES) for key in env if env.get(key)):
        return None
    return LeanSettings(env)


def _lean_provider(
    settings: LeanSettings,
) -> tuple[LeanTracerProvider, tuple[_Losses, ...], _Exit]:
    """The lean provider, its batch exporter (which counts its own losses), and its exit
    within `exit_timeout_s` (`_lean_exit`)."""
    from subagent.lean_tracing import LeanResource, LeanTracerProvider, Sampling
    from subagent.otlp import BatchExporter, HttpPoster

    sampling = Sampling(settings.sampler, settings.ratio)
    resource = LeanResource(settings.resource)
    poster = HttpPoster(
        settings.endpoint, settings.headers, settings.timeout_s, settings.compression
    )
    exporter = BatchExporter(
        resource,
        poster,
        max_queue=settings.max_queue,
        max_batch=settings.max_batch,
        delay_s=settings.delay_s,
        close=poster.close,
    )
    provider = LeanTracerProvider(resource, exporter, sampling)
    return provider, (exporter,), _LeanExit(exporter, settings.exit_timeout_s)


class _LeanExit:
    """The lean pipeline's exit, within `deadline_s` as the SDK's (`exit_timeout_s`): export
    what is queued, then count what is left lost. `cooperative`: waiting on the hub (a CLI
    command's `flush_at_exit`); else in the calling thread (interpreter exit, no hub running:
    at most one post in flight past the deadline, bounded by the exporter's timeout)."""

    def __init__(self, exporter: BatchExporter, deadline_s: float) -> None:
        self._exporter = exporter
        self._deadline_s = deadline_s

    def close(self, cooperative: bool) -> bool:
        exporter, deadline_s = self._exporter, self._deadline_s
        if cooperative:
            exported = exporter.force_flush(deadline_s)
        else:
            exporter.shutdown(deadline_s, cooperative=False)
            exported = True
        cut = f"the exit deadline ({deadline_s:g} s) passed"
        return exporter.give_up(f"{cut} before they were exported") == 0 and exported

    def give_up(self, cut: str) -> None:
        self._exporter.give_up(f"{cut} before they were exported")


def _sdk_provider(
    env: Mapping[str, str], names: list[str]
) -> tuple[SdkTracerProvider, tuple[_Losses, ...], _Exit]:
    """The SDK's provider, one batch processor per exporter, each behind a tally of its losses
    (`subagent.sdk_losses`), the tallies, and its exit within `exit_timeout_s` (`SdkExit`)."""
    try:
        _import_off_hub(
            "opentelemetry.sdk.resources",
            "opentelemetry.sdk.trace",
            "opentelemetry.sdk.trace.export",
            "opentelemetry.sdk.trace.sampling",
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

        from subagent.sdk_losses import SdkExit, TalliedExporter, TalliedProcessor, Tally
    except ImportError as exc:
        raise RuntimeError(
            "OTEL_TRACES_EXPORTER is set but tracing needs the `otel` extra: "
            "pip install 'subagent-runtime[otel]'"
        ) from exc
    queue = _queue_size(env)
    deadline_s = exit_timeout_s(env)
    exporters: list[SpanExporter] = [
        ConsoleSpanExporter() if name == "console" else _otlp_exporter(env) for name in names
    ]
    # The resource as the lean path makes it, from the mapping given: `Resource.create` would
    # read only `os.environ`, and its explicit attributes override what it reads there, so a
    # default `service.name` passed to it hid one given in `OTEL_RESOURCE_ATTRIBUTES`.
    attributes = {
        key: value
        for key, value in resource_attributes(env).items()
        if not key.startswith("telemetry.sdk.")
    }
    # The sampler from the mapping given, as the lean path reads it (the SDK's provider would
    # read `os.environ`, and turn a name it does not know into "sample everything").
    # No exit hook of the SDK's own (`shutdown_on_exit`): its shutdown waits on the exporter's
    # retries; `SdkExit` bounds it, and `configure_from_env` registers that instead.
    provider = TracerProvider(
        resource=Resource.create(attributes), sampler=_sdk_sampler(env), shutdown_on_exit=False
    )
    tallies = []
    tallied = []
    for exporter in exporters:
        tally = Tally()
        front = TalliedExporter(exporter, tally)
        batch = BatchSpanProcessor(front, max_queue_size=queue)
        provider.add_span_processor(TalliedProcessor(batch, tally))
        tallies.append(tally)
        tallied.append(front)
    return provider, tuple(tallies), SdkExit(provider, tallied, tallies, deadline_s)


def _sdk_sampler(env: Mapping[str, str]) -> Sampler:
    """The SDK's sampler for `OTEL_TRACES_SAMPLER` (checked by `sampler_setting`)."""
    from opentelemetry.sdk.trace import sampling

    name, ratio = sampler_setting(env)
    root: Sampler
    if name.endswith("traceidratio"):
        root = sampling.TraceIdRatioBased(ratio)
    elif name.endswith("always_off"):
        root = sampling.ALWAYS_OFF
    else:
        root = sampling.ALWAYS_ON
    return sampling.ParentBased(root) if name.startswith("parentbased_") else root


def otlp_endpoint(env: Mapping[str, str]) -> str:
    """The traces URL: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` as given, else
    `OTEL_EXPORTER_OTLP_ENDPOINT` with `/v1/traces` appended, else the local default."""
    traces = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if traces:
        return traces
    base = env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip() or "http://localhost:4318"
    return base.rstrip("/") + "/v1/traces"


# What an HTTP header may be (RFC 9110): a name is a token; a value has no control character
# but tab. `http.client` refuses the rest only when the first batch is posted.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9a-z]+")
_HEADER_VALUE_REFUSED = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def otlp_headers(env: Mapping[str, str]) -> dict[str, str]:
    """`OTEL_EXPORTER_OTLP_(TRACES_)HEADERS`: `key=value` pairs, comma-separated, URL-encoded.

    A pair that is not one, or that decodes to what HTTP cannot carry (a CR/LF, another control
    character, a character beyond Latin-1, a name that is not a token), is a `ValueError` here,
    naming the variable and the pair's place but never echoing a value (headers carry tokens)."""
    variable = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
    text = env.get(variable)
    if not text:
        variable = "OTEL_EXPORTER_OTLP_HEADERS"
        text = env.get(variable, "")
    out: dict[str, str] = {}
    for place, item in enumerate(text.split(","), 1):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = urllib.parse.unquote(key.strip()).lower()
        if not sep or not key:
            raise ValueError(f"{variable}: pair {place} is not key=value")
        value = urllib.parse.unquote(value.strip())
        if not _HEADER_NAME.fullmatch(key):
            raise ValueError(f"{variable}: pair {place}: {key!r} is not an HTTP header name")
        if _HEADER_VALUE_REFUSED.search(value) or not _latin1(value):
            raise ValueError(
                f"{variable}: pair {place} ({key}): the value has a control character or a "
                "character beyond Latin-1, which an HTTP header cannot carry"
            )
        out[key] = value
    return out


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def exit_timeout_s(env: Mapping[str, str]) -> float:
    """How long the SDK pipeline's exit (its flush and its shutdown together) may take: the
    exporter's timeout (`OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT`), at most `EXIT_TIMEOUT_CAP_S`.
    What is not exported by then is counted lost (docs/tracing.md)."""
    return min(otlp_timeout_s(env), EXIT_TIMEOUT_CAP_S)


def otlp_timeout_s(env: Mapping[str, str]) -> float:
    """`OTEL_EXPORTER_OTLP_(TRACES_)TIMEOUT` in seconds. The specification gives it in
    milliseconds (default 10,000); the Python SDK's exporters read it in seconds, so both paths
    read it here and hand the exporter seconds (docs/decisions.md)."""
    return (
        _number(env, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)
        / 1000
    )


def resource_attributes(env: Mapping[str, str]) -> dict[str, str]:
    """The resource: `OTEL_RESOURCE_ATTRIBUTES` (`key=value`, comma-separated, URL-encoded),
    `service.name` from `OTEL_SERVICE_NAME`, else from those, else `subagent`."""
    out: dict[str, str] = {
        "telemetry.sdk.language": "python",
        "telemetry.sdk.name": "subagent-runtime",
        "telemetry.sdk.version": _version(),
    }
    for item in env.get("OTEL_RESOURCE_ATTRIBUTES", "").split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"OTEL_RESOURCE_ATTRIBUTES: not key=value: {item.strip()!r}")
        out[urllib.parse.unquote(key.strip())] = urllib.parse.unquote(value.strip())
    service = env.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        out["service.name"] = service
    out.setdefault("service.name", DEFAULT_SERVICE_NAME)
    return out


def _version() -> str:
    try:
        return importlib.metadata.version("subagent-runtime")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _protocol(env: Mapping[str, str]) -> str:
    return (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()


COMPRESSIONS = ("none", "gzip", "deflate")  # what an OTLP/HTTP exporter here can send


def _compression(env: Mapping[str, str]) -> str:
    """`OTEL_EXPORTER_OTLP_TRACES_COMPRESSION`, else `OTEL_EXPORTER_OTLP_COMPRESSION`, else
    none. Another value is refused: the SDK's exporter would log a warning no CLI command
    shows and send uncompressed."""
    name = "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION"
    text = env.get(name)
    if not text:
        name = "OTEL_EXPORTER_OTLP_COMPRESSION"
        text = env.get(name)
    value = (text or "none").strip().lower()
    if value not in COMPRESSIONS:
        raise ValueError(f"{name}: unsupported compression {value!r} (gzip, deflate or none)")
    return value


def sampler_setting(env: Mapping[str, str]) -> tuple[str, float]:
    """The sampler's name and ratio from `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`:
    one of the specification's built-in samplers, which the lean pipeline and the SDK's
    `TracerProvider` both implement (`Sampling.NAMES`; needs the `otel` extra).

    An unknown name, or a ratio that is not a number within [0, 1] for a ratio sampler, is
    refused: the SDK logs a warning no CLI command shows and samples every trace instead, so a
    typo in `parentbased_traceidratio` would trace everything. The argument of a sampler that
    takes none is ignored, and a ratio sampler without one samples everything, as the
    specification says."""
    from subagent.lean_tracing import Sampling

    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    if name not in Sampling.NAMES:
        known = ", ".join(Sampling.NAMES)
        raise ValueError(f"OTEL_TRACES_SAMPLER: unsupported sampler {name[:80]!r} (one of {known})")
    text = env.get("OTEL_TRACES_SAMPLER_ARG", "").strip()
    if "traceidratio" not in name or not text:
        return name, 1.0
    try:
        ratio = float(text)
    except ValueError:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG: not a number: {text[:80]!r}") from None
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"OTEL_TRACES_SAMPLER_ARG: the ratio {ratio!r} is not within [0, 1]")
    return name, ratio


def _number(env: Mapping[str, str], name: str, fallback: str | None, default: float) -> float:
    """A positive, finite number from `name` (or `fallback`), else `default`; a bad one is
    refused (`nan` and `inf` too: a socket timeout or a batch size cannot be either)."""
    text = (env.get(name) or (env.get(fallback) if fallback else None) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name}: not a positive number: {text!r}")
    return value


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
    protocol = protocol.strip()
    if protocol == "grpc":
        try:
            _import_off_hub("opentelemetry.exporter.otlp.proto.grpc.trace_exporter")
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found, unused-ignore]
                OTLPSpanExporter,
            )
        except ImportError as exc:
            raise RuntimeError(
                "OTLP over gRPC needs opentelemetry-exporter-otlp-proto-grpc; the `otel` extra "
                "ships http/protobuf (the default protocol)"
            ) from exc
        # An optional package, untyped when absent. Endpoint and headers it reads from
        # `os.environ`; the timeout is given, in seconds, converted from the spec's milliseconds.
        grpc: SpanExporter = OTLPSpanExporter(timeout=otlp_timeout_s(env))
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
    # From the mapping given (the SDK's exporter would read only `os.environ` for these, and
    # its timeout in seconds); TLS files and the rest it still reads from `os.environ`.
    from opentelemetry.exporter.otlp.proto.http import Compression

    return HttpExporter(
        endpoint=otlp_endpoint(env),
        headers=otlp_headers(env),
        timeout=otlp_timeout_s(env),
        compression=Compression(_compression(env)),
    )


def flush(timeout_s: float = 30.0) -> bool:
    """Export what the provider this module installed still holds, waiting at most `timeout_s`
    (cooperatively on the hub: other greenlets run meanwhile); True if it all went. The SDK's
    batch processor ignores its timeout and exports in the calling thread, retrying against a
    dead collector, so on that path the flush runs in a thread of its own (`run_bounded`) and
    is left to finish there. (A process about to exit calls `flush_at_exit`.)"""
    flushed = True
    for installed in _installed:
        provider = installed.provider
        millis = int(timeout_s * 1000)
        try:
            if isinstance(provider, _lean_provider_class()):
                flushed = provider.force_flush(millis) and flushed
            else:
                from subagent.sdk_losses import run_bounded

                flushed = run_bounded(partial(provider.force_flush, millis), timeout_s) and flushed
        except Exception:
            log.exception("flushing spans failed")
            flushed = False
    return flushed


def _lean_provider_class() -> type[LeanTracerProvider]:
    from subagent.lean_tracing import LeanTracerProvider

    return LeanTracerProvider


def flush_at_exit() -> None:
    """What a process about to exit does with the provider this module installed (a CLI
    command, before it says what was lost): either pipeline is flushed and shut down within its
    exit deadline (`exit_timeout_s`), the spans not exported by then counted lost. Waits on the
    hub: other greenlets run meanwhile. A `KeyboardInterrupt` (Ctrl-C) ends the wait as the
    deadline would, the spans left counted lost ("the exit was interrupted"), and goes on."""
    try:
        for installed in _installed:
            log.debug("tracing: flushing spans at exit")
            try:
                installed.closing.close(True)
            except Exception:
                log.exception("flushing spans failed")
    except KeyboardInterrupt:
        for installed in _installed:
            installed.closing.give_up("the exit was interrupted")
        raise


def lost_spans() -> tuple[int, str | None]:
    """How many spans the pipeline this module installed could not export so far, and why the
    first was lost (the lean exporter logs it once as a warning, the SDK's exporter in its own
    words, neither of which a CLI command that draws a live view shows). For a CLI to say so at
    exit, after `flush()`."""
    losses = [loss for installed in _installed for loss in installed.losses]
    lost = sum(loss.dropped for loss in losses)
    why = next((loss.first_loss for loss in losses if loss.first_loss is not None), None)
    return lost, why
