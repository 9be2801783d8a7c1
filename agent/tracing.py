"""OpenTelemetry spans for agents, model calls and tool calls (the optional `otel` extra).

Without the OpenTelemetry API installed every hook is one constant check (`_trace is None`).
With it installed but no tracer provider set (the API's proxy default), a turn costs one
provider look-up and nothing else. With a provider, the loop emits the GenAI semantic
conventions: `invoke_agent` for an activation, `chat` for each model call, `execute_tool` for
each tool call.

Greenlets: gevent starts every greenlet with an empty `contextvars` context, so OpenTelemetry's
ambient context does not follow work from the greenlet that asked for it to the worker greenlet
that does it. Parentage therefore travels explicitly, as a `TraceParent` value: in the actor's
`Send` message, in a `ToolContext`, in a start or resume request, and (as a W3C `traceparent`)
in the ACP `_meta` and the Ray request. Ambient context is read only in the caller's own
greenlet (`ambient()`), and attached only around a tool call in the greenlet running it, so a
tool's own instrumented calls nest under its `execute_tool` span.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from subagent.types import SubagentResult, TraceParent, make_trace_parent
from supervision.signal import AbortError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Link, Span, Tracer

    from agent.model import ModelRequest, ModelResponse, ProgressSink, ToolCall
    from agent.options import AgentOptions
    from agent.tools import ToolContext, ToolResult
    from supervision.signal import AbortSignal

try:
    from opentelemetry import context as _context
    from opentelemetry import trace as _trace
    from opentelemetry.trace import Link, SpanKind, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
    _OFF_PROVIDERS: tuple[type, ...] = (_trace.ProxyTracerProvider, _trace.NoOpTracerProvider)
except ImportError:  # the `otel` extra is not installed: tracing is off for good
    _trace = None  # type: ignore[assignment]


def _context_seam() -> tuple[Callable[[Context], object], Callable[[Any], None]]:
    """How a tool call makes its span's context current in its greenlet, and restores the one
    before: the API's `attach`/`detach`, or, under the API's default runtime context
    (`ContextVarsRuntimeContext`, unless `OTEL_PYTHON_CONTEXT` names another), its context
    variable's own `set`/`reset`, which are what those two run, through two frames each.

    The OpenTelemetry seam (pinned: opentelemetry-api 1.x; `tests/test_tracing_off.py` checks
    it): the runtime context where the API keeps it (`_RUNTIME_CONTEXT`) and its variable
    (`_current_context`). Read once, at import. One difference, which cannot arise here: the
    API's `detach` logs a token that fails to reset, `reset` raises; a tool call resets in the
    frame and greenlet that set it."""
    runtime = getattr(_context, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if type(runtime) is _ContextVarsRuntimeContext and isinstance(variable, ContextVar):
        return variable.set, variable.reset
    return _context.attach, _context.detach


if _trace is not None:
    from opentelemetry.context.contextvars_context import (
        ContextVarsRuntimeContext as _ContextVarsRuntimeContext,
    )

    _attach, _detach = _context_seam()

__all__ = [
    "Activation",
    "TraceParent",
    "TracedCore",
    "TurnEnd",
    "TurnTrace",
    "ambient",
    "begin_turn",
    "carrier",
    "extract",
    "named",
    "root_span",
    "start_activation",
    "tracer",
]

log = logging.getLogger(__name__)

INSTRUMENTATION = "subagent-runtime"

# The runtime's own attributes, next to the gen_ai.* ones.
PROVIDER = "subagent.provider"
RUN_ID = "subagent.run_id"
PARENT_ID = "subagent.parent_id"
DEPTH = "subagent.depth"
STOP_REASON = "subagent.stop_reason"
CANCEL_CAUSE = "subagent.cancel.cause"
DIAGNOSTIC = "subagent.diagnostic"
RESUMED = "subagent.resumed"
TURN = "subagent.turn"
TURN_REASON = "subagent.turn.reason"
STEER_EVENT = "subagent.steer.admitted"

_cached: list[Any] = [None, None]  # [provider, its tracer or None for an off provider]
# Whether OpenTelemetry's own look-up has run once (it loads `OTEL_PYTHON_TRACER_PROVIDER`).
_looked_up = [False]


def tracer() -> Tracer | None:
    """The runtime's tracer, or None while tracing is off (no API, or no provider set yet).

    "Off" costs one module attribute read: the API's global provider is read where the API
    keeps it (`_TRACER_PROVIDER`, the OpenTelemetry seam below), not through
    `get_tracer_provider()`, which tests `os.environ` on every call while none is set. Never
    cached while off, so a host that sets its provider later (`set_tracer_provider`, at any
    time) is picked up at the next activation, prompt or turn. `OTEL_PYTHON_TRACER_PROVIDER`
    is honoured when it is set at the first check (or whenever anything calls the API's
    `get_tracer_provider()`, which loads it): the environment is not polled per child.
    """
    if _trace is None:
        return None
    # The OpenTelemetry seam (pinned: opentelemetry-api 1.x): the global provider, None until
    # one is set; set once (only tests reset it). `tests/test_tracing_off.py` checks the pin.
    provider = _trace._TRACER_PROVIDER  # noqa: SLF001
    if provider is None:
        if _looked_up[0]:
            return None
        _looked_up[0] = True
        provider = _trace.get_tracer_provider()  # may load it from the environment
        if isinstance(provider, _OFF_PROVIDERS):
            return None
    if provider is _cached[0]:
        found: Tracer | None = _cached[1]
        return found
    found = None if isinstance(provider, _OFF_PROVIDERS) else provider.get_tracer(INSTRUMENTATION)
    _cached[0], _cached[1] = provider, found
    _content_read[1] = -math.inf  # a new provider: `capture_content` reads the environment again
    return found


def ambient(name: str | None = None) -> TraceParent | None:
    """The calling greenlet's current span as a parent, if tracing is on and one is active."""
    if _trace is None or tracer() is None:
        return None
    ctx = _context.get_current()
    if not _trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return make_trace_parent(ctx, False, name)


def named(parent: TraceParent | None, name: str | None) -> TraceParent | None:
    """`parent` for a child called `name` (None stays None: tracing is off)."""
    if parent is None:
        return None
    return make_trace_parent(parent.context, False, name)  # as `TraceParent(context, name=)`


def carrier(parent: TraceParent | None) -> dict[str, str]:
    """The W3C `traceparent` (and `tracestate`) of `parent`, for a request to another process."""
    out: dict[str, str] = {}
    if parent is not None and _trace is not None:
        _PROPAGATOR.inject(out, context=parent.context)
    return out


def extract(data: object, name: str | None = None) -> TraceParent | None:
    """A `TraceParent` from a carrier received from another process; None if absent/invalid."""
    if (
        _trace is None
        or not isinstance(data, Mapping)
        or not isinstance(data.get("traceparent"), str)
    ):
        return None
    ctx = _PROPAGATOR.extract({k: v for k, v in data.items() if isinstance(v, str)})
    if not _trace.get_current_span(ctx).get_span_context().is_valid:
        return None
    return TraceParent(ctx, name=name)


def link_to(data: object) -> Link | None:
    """A span link to the span named by a stored `traceparent` carrier, or None."""
    parent = extract(data)
    if parent is None:
        return None
    return Link(_trace.get_current_span(parent.context).get_span_context())


@contextlib.contextmanager
def root_span(name: str, attributes: Mapping[str, Any] | None = None) -> Iterator[None]:
    """A span made current in the calling greenlet (e.g. around a CLI command); free when off."""
    found = tracer()
    if found is None:
        yield
        return
    with found.start_as_current_span(name, attributes=dict(attributes or {})):
        yield


# -- activations (the run layer) ---------------------------------------------------------------


class Activation:
    """One `invoke_agent` span for a child activation, from start to settlement."""

    __slots__ = ("parent", "span")

    def __init__(self, span: Span, parent: TraceParent) -> None:
        self.span = span
        # What the provider passes on: the child's work hangs under this span.
        self.parent = parent

    # Attributes set after the start: one `set_attribute` each. With the SDK (1.45) that is
    # cheaper than one `set_attributes` for the one to three a span gets here (its mapping path
    # cleans the dict generically: 1.8 against 0.9 us for one attribute, 2.0 against 1.7 for
    # two; docs/performance.md). A span the sampler dropped gets nothing: no value is built.

    def published(self, child_id: str) -> None:
        span = self.span
        if span.is_recording():
            span.set_attribute("gen_ai.agent.id", child_id)
            span.set_attribute("gen_ai.conversation.id", child_id)

    def failed(self, exc: BaseException) -> None:
        """The start failed before publication: nothing ran."""
        span = self.span
        if span.is_recording():
            span.record_exception(exc)
            span.set_status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}")
            span.set_attribute("error.type", getattr(exc, "code", None) or type(exc).__name__)
        span.end()

    def end(self, outcome: SubagentResult | BaseException) -> None:
        """Settled: a `SubagentResult`, or an infrastructure fault (an exception)."""
        span = self.span
        if not span.is_recording():
            span.end()
            return
        if isinstance(outcome, BaseException):
            span.record_exception(outcome)
            span.set_attribute(STOP_REASON, "error")
            span.set_attribute("error.type", type(outcome).__name__)
            span.set_status(StatusCode.ERROR, f"{type(outcome).__name__}: {outcome}")
            span.end()
            return
        stop = str(outcome.stop_reason)
        span.set_attribute(STOP_REASON, stop)
        diagnostic = outcome.diagnostic
        if stop == "aborted":
            if diagnostic:
                span.set_attribute(CANCEL_CAUSE, diagnostic)
        elif stop != "completed":
            span.set_attribute("error.type", stop)
            if diagnostic:
                span.set_attribute(DIAGNOSTIC, diagnostic)
            span.set_status(StatusCode.ERROR, diagnostic or stop)
        span.end()


def start_activation(
    parent: TraceParent | None,
    *,
    provider: str,
    run_id: str,
    parent_id: str,
    depth: int | None,
    child_id: str | None = None,
    link: Link | None = None,
    resumed: bool = False,
    remote: bool = False,
    using: Tracer | None = None,
) -> Activation | None:
    """Open a child activation's `invoke_agent` span under `parent` (None: tracing is off).

    `remote`: the child runs in another process, so the span is a CLIENT (the other side's
    spans, parented by the `traceparent` it receives, are its server side). `using`: the
    runtime's tracer, when the caller has just looked it up (`tracer()`), not looked up again."""
    found = using if using is not None else tracer()
    if found is None:
        return None
    name = parent.name if parent is not None else None
    context = None if parent is None else parent.context
    kind = SpanKind.CLIENT if remote else SpanKind.INTERNAL
    # What varies per child, after what every activation of this name and provider shares.
    own: dict[str, Any] = {RUN_ID: run_id, PARENT_ID: parent_id}
    if depth is not None:
        own[DEPTH] = depth
    if child_id is not None:
        own["gen_ai.agent.id"] = child_id
        own["gen_ai.conversation.id"] = child_id
    if resumed:
        own[RESUMED] = True
    links = None if link is None else [link]
    if hasattr(found, "start_current"):
        maker = cast("_TemplatedTracer", found)
        # The lean tracer: the name, kind and fixed attributes from a template kept per
        # (name, kind, provider), encoded once; the span's context made with it.
        key = (type(found), name, kind, provider)
        template = _ACTIVATIONS.get(key)
        if template is None:
            if len(_ACTIVATIONS) >= _NAMES_KEPT:
                _ACTIVATIONS.clear()
            template = _ACTIVATIONS[key] = maker.template(
                f"invoke_agent {name}" if name else "invoke_agent",
                kind,
                _activation_fixed(provider, name),
            )
        span, ctx = maker.start_current(template, own, context, links)
        return Activation(span, make_trace_parent(ctx, True, name))
    span = found.start_span(
        f"invoke_agent {name}" if name else "invoke_agent",
        context=context,
        kind=kind,
        attributes={**_activation_fixed(provider, name), **own},
        links=links,
    )
    ctx = _trace.set_span_in_context(span, context)
    return Activation(span, make_trace_parent(ctx, True, name))


def _activation_fixed(provider: str, name: str | None) -> dict[str, Any]:
    """An activation span's attributes shared by every activation of `name` under `provider`."""
    fixed: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", PROVIDER: provider}
    if name:
        fixed["gen_ai.agent.name"] = name
    return fixed


class _TemplatedTracer(Protocol):
    """A tracer's own way to start a span from a template of its fixed name, kind and
    attributes, with the context holding it (the lean tracer's `start_current`)."""

    def template(self, name: str, kind: SpanKind, attributes: Mapping[str, Any]) -> object: ...

    def start_current(
        self,
        template: Any,
        attributes: dict[str, Any] | None,
        context: Context | None,
        links: Sequence[Link] | None = None,
    ) -> tuple[Span, Context]: ...


# Activation templates by (tracer type, agent name, kind, provider).
_ACTIVATIONS: dict[tuple[type, str | None, object, str], object] = {}


# -- turns (the loop) --------------------------------------------------------------------------


class TracedCore(Protocol):
    """What a turn's spans read of its agent (`agent.loop.AgentCore`, which imports this
    module): its ids, its model route and its latest trace parent."""

    @property
    def session_id(self) -> str: ...

    @property
    def model_name(self) -> str: ...

    @property
    def options(self) -> AgentOptions: ...

    @property
    def trace(self) -> TraceParent | None: ...


class TurnEnd(Protocol):
    """What a turn's span records of its end (`agent.loop.TurnOutcome`)."""

    @property
    def turn(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def cause(self) -> str | None: ...

    @property
    def message(self) -> str | None: ...


class Subspans(Protocol):
    """A tracer's own cheaper way to make spans under one parent (`subspans(parent)` on the
    lean tracer, subagent/lean_tracing.py): each span starts from a template of what repeats
    (name, kind, leading attributes), made once; `attributes` dicts are taken over, not copied.
    Templates are opaque here."""

    def template(self, name: str, kind: SpanKind, attributes: Mapping[str, str]) -> object: ...

    def start(
        self,
        template: object,
        attributes: dict[str, Any] | None = None,
        start_time: int | None = None,
    ) -> Span: ...

    def record(
        self, template: object, start_time: int, attributes: dict[str, Any] | None = None
    ) -> None:
        """A span that started at `start_time` and ends now (made at its end)."""

    def start_current(
        self, template: object, attributes: dict[str, Any] | None, context: Context
    ) -> tuple[Span, Context]:
        """A started span, and `context` with it as the current span."""

    def end(self, span: Span) -> None:
        """End a span `start_current` made (as `span.end()`, by the tracer's own path)."""


# A `chat` span's name, its model, its fixed attributes and its templates by finish reason.
_Chat = tuple[str, str | None, dict[str, Any], dict[str, object]]
# What a turn holds until its first model call (no model yet: `None` matches no request's).
_NO_CHAT: _Chat = ("", None, {}, {})


class _Templates:
    """The `chat` and `execute_tool` templates of one kind of `Subspans` (or of the API's path,
    `None`), kept across turns: a `chat` span's name, attributes and templates by (provider,
    model), and by tool name."""

    __slots__ = ("chat", "tool")

    def __init__(self) -> None:
        self.chat: dict[tuple[str, str], _Chat] = {}
        self.tool: dict[str, object] = {}


_TEMPLATES: dict[type | None, _Templates] = {None: _Templates()}


def _subspans(found: Tracer, span: Span) -> tuple[Subspans, _Templates] | None:
    """The tracer's cheaper path for spans under `span`, with its templates, if it has one."""
    maker: Callable[[Span], Subspans | None] | None = getattr(found, "subspans", None)
    fast = None if maker is None else maker(span)
    if fast is None:
        return None
    templates = _TEMPLATES.get(type(fast))
    if templates is None:
        templates = _TEMPLATES[type(fast)] = _Templates()
    return fast, templates


class TurnTrace:
    """The spans of one running turn: its `invoke_agent` (own or the activation's) and below.

    With the lean tracer, `chat` and `execute_tool` spans are made through its `Subspans`
    (templates of their fixed attributes, no per-span context look-up or attribute copy);
    with any other tracer through the API (docs/performance.md, h18f)."""

    __slots__ = (
        "_chat",
        "_fast",
        "_here",
        "_own",
        "_provider",
        "_templates",
        "captures_content",
        "context",
        "recording",
        "span",
        "tracer",
    )

    def __init__(self, found: Tracer, span: Span, context: Context, own: bool, provider: str):
        # Whether the reply's text goes on the `chat` spans (`capture_content`): only then is a
        # reply repaired here, before the span sees it (`chat`).
        self.captures_content = capture_content()
        self.tracer = found
        self.span = span
        self.context = context
        self._own = own
        self._provider = provider
        # The `chat` span's name and fixed attributes for the model the turn asks, kept across
        # turns (`_Templates`) and looked up again only if a request names another model.
        self._chat = _NO_CHAT
        # An agent span the sampler dropped: its model and tool spans would be dropped too
        # (parent-based sampling, the default), so they are not made at all; the context still
        # travels, so the children it starts stay out of the sample with it.
        self.recording = span.is_recording()
        self._here: TraceParent | None = None  # the parent a tool call gets, if not recording
        fast = _subspans(found, span) if self.recording else None
        if fast is None:
            self._fast: Subspans | None = None
            self._templates = _TEMPLATES[None]
        else:
            self._fast, self._templates = fast

    def chat(
        self,
        complete: Callable[[ModelRequest, ProgressSink | None], ModelResponse],
        request: ModelRequest,
        sink: ProgressSink | None,
        repair: Callable[[ModelResponse], ModelResponse],
    ) -> ModelResponse:
        """Run one model call inside a `chat` span.

        `repair` (the loop's lone-surrogate repair) runs before the reply is recorded, and its
        result is returned, only when the span records the reply's text (`captures_content`).
        Otherwise the span holds none of it and the reply goes back as the model gave it, for
        the loop's log to probe: one encoding a step, not two."""
        if not self.recording:
            response = complete(request, sink)
            return repair(response) if self.captures_content else response
        # The span is made when the call returns, with the call's start time and every
        # attribute in one dict: nothing nests under a model call, and a span object held
        # across the model's wait would outlive young collections (docs/performance.md).
        start = time.time_ns()
        try:
            response = complete(request, sink)
        except BaseException as exc:
            _fail(self._chat_span(request, None, start), exc)
            raise
        if self.captures_content:
            response = repair(response)  # what the loop logs and acts on is what the span records
        fast = self._fast
        if fast is None:
            self._chat_span(request, response, start).end()
            return response
        # The lean tracer's path: the name, kind and every attribute up to the finish reason
        # come from a template per (model, finish reason); only content and usage are the span's.
        model = request.model
        chat = self._chat
        if model != chat[1]:
            chat = self._chat_for(model)
        finish = response.finish
        template = chat[3].get(finish)
        if template is None:
            template = self._chat_template(fast, chat, finish)
        own: dict[str, Any] | None = None
        if self.captures_content:
            own = {"gen_ai.output.messages": output_messages(response)}
        if response.usage:
            usage = usage_attributes(response.usage)
            if own is None:
                own = usage
            else:
                own.update(usage)
        fast.record(template, start, own)
        return response

    def _chat_for(self, model: str) -> _Chat:
        """The `chat` span's name, fixed attributes and templates for `model` (kept)."""
        by_model = self._templates.chat
        key = (self._provider, model)
        chat = by_model.get(key)
        if chat is None:
            if len(by_model) >= _NAMES_KEPT:
                by_model.clear()
            base = {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self._provider,
                "gen_ai.request.model": model,
            }
            chat = by_model[key] = (f"chat {model}", model, base, {})
        self._chat = chat
        return chat

    @staticmethod
    def _chat_template(fast: Subspans, chat: _Chat, finish: str) -> object:
        name, _, base, templates = chat
        if len(templates) >= _NAMES_KEPT:
            templates.clear()
        attributes = {**base, "gen_ai.response.finish_reasons": _finish_reasons(finish)}
        template = templates[finish] = fast.template(name, SpanKind.CLIENT, attributes)
        return template

    def _chat_span(self, request: ModelRequest, response: ModelResponse | None, start: int) -> Span:
        model = request.model
        name, asked, base, _ = self._chat
        if model != asked:
            name, _, base, _ = self._chat_for(model)
        attributes = base.copy()
        if response is not None:
            attributes["gen_ai.response.finish_reasons"] = _finish_reasons(response.finish)
            if self.captures_content:
                attributes["gen_ai.output.messages"] = output_messages(response)
            if response.usage:
                attributes.update(usage_attributes(response.usage))
        return self.tracer.start_span(
            name,
            context=self.context,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=start,
        )

    def tool(
        self,
        execute: Callable[[ToolCall, ToolContext], ToolResult],
        call: ToolCall,
        make_context: Callable[[ToolCall, AbortSignal, TraceParent], ToolContext],
        signal: AbortSignal,
    ) -> ToolResult:
        """Run one tool call inside an `execute_tool` span, current in this greenlet.

        `make_context(call, signal, parent)` builds the tool's context (no closure per call)."""
        if not self.recording:
            here = self._here
            if here is None:
                here = self._here = make_trace_parent(self.context, False, None)
            token = _attach(self.context)
            try:
                return execute(call, make_context(call, signal, here))
            finally:
                _detach(token)
        # The model gives the name and the id: cut to `MAX_MODEL_TEXT` on the span, so a
        # model's made-up names cannot fill the name and encoding caches (kept by count).
        name = call.name
        if len(name) > MAX_MODEL_TEXT:
            name = _cut(name)
        call_id = call.id
        if len(call_id) > MAX_MODEL_TEXT:
            call_id = _cut(call_id)
        fast = self._fast
        if fast is None:
            span = self.tracer.start_span(
                _tool_span_name(name),
                context=self.context,
                kind=SpanKind.INTERNAL,
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": name,
                    "gen_ai.tool.call.id": call_id,
                },
            )
            ctx = _trace.set_span_in_context(span, self.context)
        else:
            template = self._templates.tool.get(name)
            if template is None:
                template = self._tool_template(fast, name)
            span, ctx = fast.start_current(template, {"gen_ai.tool.call.id": call_id}, self.context)
        token = _attach(ctx)
        try:
            result = execute(call, make_context(call, signal, make_trace_parent(ctx, False, None)))
        except BaseException as exc:  # abandoned (_Abandon, GreenletExit) or a tool-layer bug
            _fail(span, exc)
            raise
        finally:
            _detach(token)
        if result.is_error:
            span.set_attribute("error.type", result.code or "tool_error")
            span.set_status(StatusCode.ERROR, result.code or "tool error")
        if fast is None:
            span.end()
        else:
            fast.end(span)  # the tracer's own path: the exporter encodes it there
        return result

    def _tool_template(self, fast: Subspans, tool: str) -> object:
        templates = self._templates.tool
        if len(templates) >= _NAMES_KEPT:
            templates.clear()
        template = templates[tool] = fast.template(
            _tool_span_name(tool),
            SpanKind.INTERNAL,
            {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool},
        )
        return template

    def steers(self, steers: Sequence[Any]) -> None:
        """Steering messages admitted at a step boundary: one span event each."""
        for steer in steers:
            source = steer.source.get("kind") if isinstance(steer.source, Mapping) else None
            self.span.add_event(
                STEER_EVENT,
                {"subagent.message_id": steer.message_id, "subagent.source": str(source)},
            )

    def end(self, outcome: TurnEnd) -> None:
        """The turn ended: close its own span (an activation span is the run layer's)."""
        span = self.span
        if not self.recording:
            if self._own:
                span.end()
            return
        if not self._own:
            span.add_event("subagent.turn.end", {TURN: outcome.turn, TURN_REASON: outcome.reason})
            return
        span.set_attribute(TURN_REASON, outcome.reason)
        if outcome.reason == "aborted":
            if outcome.cause:
                span.set_attribute(CANCEL_CAUSE, str(outcome.cause))
        elif outcome.reason != "completed":
            span.set_attribute("error.type", outcome.reason)
            span.set_status(StatusCode.ERROR, outcome.message or outcome.reason)
        span.end()

    def fault(self, exc: BaseException) -> None:
        """The turn failed outside the loop (its log failed)."""
        if self._own:
            _fail(self.span, exc)


def begin_turn(core: TracedCore, message: Mapping[str, Any], turn: int) -> TurnTrace | None:
    """The spans for `core`'s turn `turn`, parented as its message says (None: tracing off)."""
    if _trace is None:
        return None
    found = tracer()
    if found is None:
        return None
    parent: TraceParent | None = message.get("trace") or core.trace
    provider = str(core.options.model).split(":", 1)[0]
    if parent is not None and parent.activation:
        span = _trace.get_current_span(parent.context)
        return TurnTrace(found, span, parent.context, False, provider)
    name = parent.name if parent is not None else None
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.id": core.session_id,
        "gen_ai.conversation.id": core.session_id,
        "gen_ai.request.model": core.model_name,
        TURN: turn,
    }
    if name:
        attributes["gen_ai.agent.name"] = name
    context = None if parent is None else parent.context
    # A parent from another process (a Ray host's request): this turn is the server side.
    remote = context is not None and _trace.get_current_span(context).get_span_context().is_remote
    span = found.start_span(
        f"invoke_agent {name}" if name else "invoke_agent",
        context=context,
        kind=SpanKind.SERVER if remote else SpanKind.INTERNAL,
        attributes=attributes,
    )
    ctx = _trace.set_span_in_context(span, context)
    return TurnTrace(found, span, ctx, True, provider)


CAPTURE_CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
CAPTURE_CONTENT_REREAD_S = 1.0  # how old a reading of the variable a turn may use

# [the variable's last reading, when it was read (`time.monotonic`), or -inf: read it again]
_content_read: list[Any] = [False, -math.inf]
_monotonic = time.monotonic


def capture_content() -> bool:
    """Whether model output goes on `chat` spans (opt-in: it may be sensitive).

    The environment is read at most once a second per process, and again as soon as the
    tracer provider changes (`tracer()`): `os.environ.get` for an unset variable raises and
    catches a `KeyError`, ~0.7 us a turn; a clock read is ~0.05 us. A change of the variable
    is seen by the turns that start a second or more after it (docs/tracing.md)."""
    now = _monotonic()
    if now - _content_read[1] < CAPTURE_CONTENT_REREAD_S:
        found: bool = _content_read[0]
        return found
    found = os.environ.get(CAPTURE_CONTENT_ENV, "").strip().lower() == "true"
    _content_read[0], _content_read[1] = found, now
    return found


def output_messages(response: ModelResponse) -> str:
    """The reply as the convention's `gen_ai.output.messages` (a JSON string): text and tool
    call parts, from the repaired response, so it always encodes."""
    parts: list[dict[str, Any]] = []
    for block in response.content:
        if block.get("type") == "text":
            parts.append({"type": "text", "content": block.get("text", "")})
    for call in response.tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": call.arguments}
        )
    message = {"role": "assistant", "parts": parts, "finish_reason": response.finish}
    return json.dumps([message], ensure_ascii=False, default=str)


def usage_attributes(usage: Mapping[str, Any]) -> dict[str, int]:
    """The GenAI convention's usage attributes for one response's `agent.usage` counts.

    The convention's `gen_ai.usage.input_tokens` counts every input token, cached ones
    included, with the cache reads and writes also given on their own; `agent.usage` keeps the
    four kinds disjoint (uncached input, cache reads, cache writes, output), so input is their
    input-side sum.
    """
    get = usage.get
    fresh = get("input_tokens")
    read = get("cache_read_input_tokens")
    made = get("cache_creation_input_tokens")
    output = get("output_tokens")
    # The usual reply: uncached input and output only (one dict, no loop: this runs per step).
    if read is None and made is None and type(fresh) is int and type(output) is int:
        return {"gen_ai.usage.input_tokens": fresh, "gen_ai.usage.output_tokens": output}
    out: dict[str, int] = {}
    total_input = 0
    any_input = False
    if type(fresh) is int:
        any_input = True
        total_input += fresh
    if type(read) is int:
        any_input = True
        total_input += read
        out["gen_ai.usage.cache_read.input_tokens"] = read
    if type(made) is int:
        any_input = True
        total_input += made
        out["gen_ai.usage.cache_creation.input_tokens"] = made
    if any_input:
        out["gen_ai.usage.input_tokens"] = total_input
    if type(output) is int:
        out["gen_ai.usage.output_tokens"] = output
    return out


# Characters of a model-given tool name or call id kept on a span. A real tool name is at most
# 64-128 characters (the model APIs' own limits) and a call id a few dozen; longer ones are made
# up by the model (a tool it does not have), and the name's span templates and encodings are
# kept per name (`_NAMES_KEPT` of them): 800 made-up names of 100 kB held ~400 MB before.
MAX_MODEL_TEXT = 256


def _cut(text: str) -> str:
    """`text` cut to `MAX_MODEL_TEXT` characters, the cut marked with an ellipsis."""
    return text[: MAX_MODEL_TEXT - 1] + "\u2026"


_FINISH_REASONS: dict[str, tuple[str]] = {}
_TOOL_SPAN_NAMES: dict[str, str] = {}
_NAMES_KEPT = 1024  # bound on each cache above (names come from models and tool sets)


def _finish_reasons(finish: str) -> tuple[str]:
    """The one-element `gen_ai.response.finish_reasons` value, one tuple per reason."""
    found = _FINISH_REASONS.get(finish)
    if found is None:
        if len(_FINISH_REASONS) >= _NAMES_KEPT:
            _FINISH_REASONS.clear()
        found = _FINISH_REASONS[finish] = (finish,)
    return found


def _tool_span_name(tool: str) -> str:
    """`execute_tool NAME`, built once per tool name."""
    found = _TOOL_SPAN_NAMES.get(tool)
    if found is None:
        if len(_TOOL_SPAN_NAMES) >= _NAMES_KEPT:
            _TOOL_SPAN_NAMES.clear()
        found = _TOOL_SPAN_NAMES[tool] = f"execute_tool {tool}"
    return found


def _fail(span: Span, exc: BaseException) -> None:
    """End `span` for an exception: an abort is `aborted`, a killed greenlet `abandoned`."""
    if isinstance(exc, AbortError):
        kind, text = "aborted", f"aborted: {exc}"
    elif not isinstance(exc, Exception):  # thrown in to abandon the call (kill, _Abandon)
        kind, text = "abandoned", "abandoned: the turn was aborted while it ran"
    else:
        span.record_exception(exc)
        kind = type(exc).__name__
        text = f"{kind}: {exc}" if str(exc) else kind
    span.set_attribute("error.type", kind)
    span.set_status(StatusCode.ERROR, text)
    span.end()


def with_name(parent: TraceParent | None, name: str | None) -> TraceParent | None:
    """`parent` renamed, keeping its kind."""
    return None if parent is None else replace(parent, name=name)
