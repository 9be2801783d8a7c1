"""A deterministic model for tests, demos and benchmarks.

Replies come from scripts (lists of `Step`s, one cursor per session) or from a responder callable
that computes a `Step` from the request. It is on the hot path of the benchmarks (10,000 children
x 10 steps), so a call is a few dict/list lookups: no copies, no logging, no greenlet unless a
step asks for latency.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from agent.model import (
    FinishReason,
    ModelError,
    ModelRequest,
    ModelResponse,
    ProgressSink,
    ToolCall,
)
from agent.usage import USAGE_KEYS, checked_usage, normalize_usage
from supervision.signal import AbortError, AbortSignal

__all__ = [
    "DEFAULT",
    "Responder",
    "ScriptedModel",
    "Step",
    "StepKind",
    "chunks",
    "echo",
    "error",
    "hang",
    "max_tokens",
    "refusal",
    "text",
    "tool_call",
    "tool_calls",
]

# The script key that every session without its own script plays (each from its own start).
DEFAULT = "*"

StepKind = Literal["text", "tool_calls", "max_tokens", "refusal", "error", "hang", "chunks"]
CallSpec = ToolCall | tuple[str, Mapping[str, Any]] | tuple[str, Mapping[str, Any], str | None]


@dataclass(frozen=True, slots=True)
class Step:
    """One scripted model reply. Build it with the constructors below, not directly."""

    kind: StepKind
    text: str = ""
    # (name, arguments, id or None for an id derived from the request's turn and step)
    calls: tuple[tuple[str, Mapping[str, Any], str | None], ...] = ()
    chunks: tuple[str, ...] = ()
    chunk_latency: float = 0.0
    latency: float = 0.0
    # The token usage this reply reports (None: the model's default, see `ScriptedModel`).
    usage: Mapping[str, int] | None = None


Responder = Callable[[ModelRequest], "Step | str"]


def _check_latency(latency: float) -> float:
    if isinstance(latency, bool) or not isinstance(latency, (int, float)):
        raise TypeError("latency must be a number of seconds")
    if not latency >= 0 or latency == float("inf"):
        raise ValueError("latency must be finite and >= 0")
    return float(latency)


def _check_text(value: object, what: str = "text") -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}")
    return value


def _check_usage(usage: Mapping[str, int] | None) -> Mapping[str, int] | None:
    if usage is None:
        return None
    if not isinstance(usage, Mapping):
        raise TypeError("usage must be a mapping of token counts")
    clean = normalize_usage(usage)
    if len(clean) != len(usage):
        raise ValueError(f"usage takes non-negative int counts of {', '.join(USAGE_KEYS)}")
    # Checked and packed once here: every reply that reports it is logged and charged as is.
    return checked_usage(clean)


def text(value: str, *, latency: float = 0.0, usage: Mapping[str, int] | None = None) -> Step:
    """A final answer (`finish="stop"`)."""
    return Step(
        "text", text=_check_text(value), latency=_check_latency(latency), usage=_check_usage(usage)
    )


def _call_spec(spec: CallSpec) -> tuple[str, Mapping[str, Any], str | None]:
    if isinstance(spec, ToolCall):
        return (spec.name, spec.arguments, spec.id or None)
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        name, arguments = spec[0], spec[1]
        call_id = spec[2] if len(spec) == 3 else None
        if not isinstance(name, str) or not name:
            raise TypeError("a tool call needs a non-empty str name")
        if not isinstance(arguments, Mapping):
            raise TypeError(f"tool call {name!r}: arguments must be a mapping")
        if call_id is not None and not isinstance(call_id, str):
            raise TypeError(f"tool call {name!r}: id must be a str or None")
        return (name, arguments, call_id)
    raise TypeError(f"expected a ToolCall or a (name, arguments[, id]) tuple, got {spec!r}")


def tool_call(
    name: str,
    arguments: Mapping[str, Any] | None = None,
    id: str | None = None,
    *,
    text: str = "",
    latency: float = 0.0,
    usage: Mapping[str, int] | None = None,
) -> Step:
    """Ask for one tool call (`finish="tool_calls"`); `text` is said alongside it."""
    spec = _call_spec((name, {} if arguments is None else arguments, id))
    return Step(
        "tool_calls",
        text=_check_text(text),
        calls=(spec,),
        latency=_check_latency(latency),
        usage=_check_usage(usage),
    )


def tool_calls(
    calls: Iterable[CallSpec],
    *,
    text: str = "",
    latency: float = 0.0,
    usage: Mapping[str, int] | None = None,
) -> Step:
    """Ask for several tool calls in one step."""
    specs = tuple(_call_spec(c) for c in calls)
    if not specs:
        raise ValueError("tool_calls needs at least one call")
    return Step(
        "tool_calls",
        text=_check_text(text),
        calls=specs,
        latency=_check_latency(latency),
        usage=_check_usage(usage),
    )


def max_tokens(partial_text: str = "", *, latency: float = 0.0) -> Step:
    """The model ran out of tokens mid-answer (`finish="max-tokens"`)."""
    return Step("max_tokens", text=_check_text(partial_text), latency=_check_latency(latency))


def refusal(value: str = "I can't help with that.", *, latency: float = 0.0) -> Step:
    """The model declined (`finish="refusal"`)."""
    return Step("refusal", text=_check_text(value), latency=_check_latency(latency))


def error(message: str = "scripted model error", *, latency: float = 0.0) -> Step:
    """The call fails with `ModelError(message)`."""
    return Step("error", text=_check_text(message, "message"), latency=_check_latency(latency))


def hang() -> Step:
    """The call never answers: it waits for `request.signal` and then raises `AbortError`."""
    return Step("hang")


def chunks(parts: Iterable[str], latency: float = 0.0, *, delay: float = 0.0) -> Step:
    """A streamed answer: each part goes to `on_progress`, `latency` seconds apart (abortable).

    `delay` is the wait before the first part (the step-wide `latency` of the other kinds).
    """
    parts = tuple(_check_text(p, "chunk") for p in parts)
    return Step(
        "chunks",
        text="".join(parts),
        chunks=parts,
        chunk_latency=_check_latency(latency),
        latency=_check_latency(delay),
    )


def echo(request: ModelRequest) -> Step:
    """A responder that answers with the text of the last user message."""
    for message in reversed(request.messages):
        if message.get("role") == "user":
            return text(
                "".join(
                    b.get("text", "") for b in message.get("content", ()) if b.get("type") == "text"
                )
            )
    return text("")


def _aborted(signal: AbortSignal) -> AbortError:
    reason = signal.reason
    if isinstance(reason, AbortError):
        return reason
    return AbortError(f"aborted: {reason!r}", reason=reason)


_FINISH: dict[str, FinishReason] = {
    "text": "stop",
    "chunks": "stop",
    "tool_calls": "tool_calls",
    "max_tokens": "max-tokens",
    "refusal": "refusal",
}


class ScriptedModel:
    """Plays scripts per session id, falling back to the `"*"` script, then to `responder`.

    Each session has its own cursor, also over the shared `"*"` script, so one default script
    serves any number of children. A finished script raises `ModelError("script exhausted ...")`
    unless it was registered with `repeat=True`.
    """

    def __init__(
        self,
        responder: Responder | None = None,
        *,
        record: bool = True,
        usage: Mapping[str, int] | None = None,
    ) -> None:
        """`usage`: the token counts every reply reports unless its step says otherwise
        (fixed, so usage and budget tests are exact); None reports no usage."""
        if responder is not None and not callable(responder):
            raise TypeError("responder must be callable")
        self._responder = responder
        self._usage: Mapping[str, int] = _check_usage(usage) or {}
        self._record = record
        self._scripts: dict[str, tuple[tuple[Step, ...], bool]] = {}
        self._cursors: dict[str, int] = {}
        self.requests: list[ModelRequest] = []
        self._by_session: dict[str, list[ModelRequest]] = {}

    def script(self, session_id: str, steps: Sequence[Step], *, repeat: bool = False) -> None:
        """Set the script of `session_id` (or `"*"`); its cursor starts again from the top."""
        if not isinstance(session_id, str) or not session_id:
            raise TypeError("session_id must be a non-empty str (or '*')")
        frozen = tuple(steps)
        for s in frozen:
            if not isinstance(s, Step):
                raise TypeError(f"script steps must be Step, got {type(s).__name__}")
        if repeat and not frozen:
            raise ValueError("a repeating script needs at least one step")
        self._scripts[session_id] = (frozen, repeat)
        if session_id == DEFAULT:
            # Sessions that play the default restart it, those with their own script keep theirs.
            for sid in [s for s in self._cursors if s not in self._scripts]:
                del self._cursors[sid]
        else:
            self._cursors.pop(session_id, None)

    def requests_for(self, session_id: str) -> list[ModelRequest]:
        """The requests one session made, oldest first (a live list: do not mutate)."""
        return self._by_session.get(session_id, [])

    def _next_step(self, request: ModelRequest) -> Step:
        sid = request.session_id
        entry = self._scripts.get(sid)
        if entry is None:
            entry = self._scripts.get(DEFAULT)
        if entry is None:
            if self._responder is None:
                raise ModelError(f"scripted model: no script for session {sid!r} and no responder")
            return _responded(self._responder(request))
        steps, repeat = entry
        i = self._cursors.get(sid, 0)
        if i >= len(steps):
            if not repeat:
                raise ModelError(
                    f"scripted model: script exhausted for session {sid!r} after {len(steps)} steps"
                )
            i = 0
        self._cursors[sid] = i + 1
        return steps[i]

    def complete(
        self, request: ModelRequest, on_progress: ProgressSink | None = None
    ) -> ModelResponse:
        signal = request.signal
        if signal.aborted:
            raise _aborted(signal)
        if self._record:
            self.requests.append(request)
            per = self._by_session.get(request.session_id)
            if per is None:
                self._by_session[request.session_id] = [request]
            else:
                per.append(request)
        responder = self._responder
        if responder is not None and not self._scripts:  # a responder alone: no look-ups
            step = responder(request)
            if type(step) is not Step:
                step = _responded(step)
        else:
            step = self._next_step(request)
        kind = step.kind
        if step.latency and signal.wait(step.latency):
            raise _aborted(signal)
        if kind == "hang":
            signal.wait()
            raise _aborted(signal)
        if kind == "error":
            raise ModelError(step.text)
        if kind == "chunks":
            if on_progress is not None:
                first = True
                for part in step.chunks:
                    if not first and step.chunk_latency and signal.wait(step.chunk_latency):
                        raise _aborted(signal)
                    first = False
                    on_progress({"type": "text", "text": part})
            elif (
                # Nobody listens, but the simulated latency is still the point.
                step.chunk_latency
                and len(step.chunks) > 1
                and signal.wait(step.chunk_latency * (len(step.chunks) - 1))
            ):
                raise _aborted(signal)
        elif on_progress is not None and step.text:
            on_progress({"type": "text", "text": step.text})
        content = ({"type": "text", "text": step.text},) if step.text else ()
        usage = self._usage if step.usage is None else step.usage
        if kind == "tool_calls":
            specs = step.calls
            limit = request.max_tool_calls
            if limit is not None and len(specs) > limit:
                # As an HTTP adapter does: the calls past the loop's bound are counted only.
                prefix = f"call_{request.turn}_{request.step}_"
                calls = tuple(
                    ToolCall(cid if cid is not None else prefix + str(n), name, args)
                    for n, (name, args, cid) in enumerate(specs[:limit])
                )
                return ModelResponse(content, calls, "tool_calls", usage, len(specs) - limit)
            if len(specs) == 1:  # the common case, without a generator
                name, args, cid = specs[0]
                if cid is None:
                    cid = f"call_{request.turn}_{request.step}_0"
                return ModelResponse(content, (ToolCall(cid, name, args),), "tool_calls", usage)
            prefix = f"call_{request.turn}_{request.step}_"
            calls = tuple(
                ToolCall(cid if cid is not None else prefix + str(n), name, args)
                for n, (name, args, cid) in enumerate(specs)
            )
            return ModelResponse(content, calls, "tool_calls", usage)
        return ModelResponse(content, (), _FINISH[kind], usage)


def _responded(step: object) -> Step:
    """A responder's answer as a step: a str is a text reply."""
    if isinstance(step, str):
        return Step("text", text=step)
    if not isinstance(step, Step):
        raise ModelError(f"scripted model: responder returned {type(step).__name__}, expected Step")
    return step
