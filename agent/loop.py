"""The agent loop: one turn = steps until the model stops asking for tools.

`AgentCore` knows nothing of actors. Whoever hosts it (the `AgentActor`) calls `run_turn` from a
worker greenlet and feeds steering through `take_steers`, which the core drains at each step
boundary: a steer is logged as a user message right after `step/start`, so the very next model
request contains it, and only then is its sender told it was admitted.

Every way a turn can end leaves a balanced log: open tool calls get synthetic results, the open
step is closed, and `turn/end` carries the reason. Only an infrastructure fault (the log itself
failing) escapes `run_turn`.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import gevent
from gevent.event import Event as GEvent

from agent.history import history_from_events, last_turn_number
from agent.log import SessionLog
from agent.model import ModelAdapter, ModelError, ModelRequest, ModelResponse, ToolCall
from agent.options import AgentOptions
from agent.prompt import SystemPrompt
from agent.tools import ToolContext, ToolResult, ToolScope
from supervision.signal import AbortError, AbortSignal

__all__ = ["AgentCore", "PendingSteer", "TurnOutcome", "new_message_id"]

log = logging.getLogger(__name__)

_message_ids = itertools.count(1)


def new_message_id(prefix: str = "m") -> str:
    return f"{prefix}{next(_message_ids)}"


@dataclass(slots=True)
class PendingSteer:
    """A steering message waiting for the next step boundary."""

    message_id: str
    content: Sequence[Mapping[str, Any]]
    source: Mapping[str, Any]
    on_admitted: Callable[[], None]


@dataclass(slots=True)
class TurnOutcome:
    """How one turn ended. `reason` is the `turn/end` reason."""

    turn: int
    reason: str
    output: list[Mapping[str, Any]] = field(default_factory=list)
    message: str | None = None
    cause: str | None = None
    structured: Any = None
    # An infrastructure fault (the log failed): the turn's state may not be durable.
    fault: BaseException | None = None


ProgressFn = Callable[[dict[str, Any]], None]


class _Conclude:
    """The turn's structured-output capture state (see `AgentCore.capture`)."""

    __slots__ = ("value", "concluded")

    def __init__(self) -> None:
        self.concluded = False
        self.value: Any = None


class AgentCore:
    """The state and the loop of one agent session."""

    def __init__(
        self,
        *,
        session_id: str,
        log: SessionLog,
        options: AgentOptions,
        model: ModelAdapter,
        model_name: str,
        tools: ToolScope,
        prompt: SystemPrompt,
        variables: Mapping[str, str | None] | None = None,
        agent: Any = None,
    ) -> None:
        self.session_id = session_id
        self.log = log
        self.options = options
        self.model = model
        self.model_name = model_name
        self.tools = tools
        self.prompt = prompt
        self.variables: Mapping[str, str | None] = variables or {}
        self.agent = agent
        self.on_progress: ProgressFn | None = None
        self.history: list[dict[str, Any]] = history_from_events(log.events)
        self.turn = last_turn_number(log.events)
        self._last_header: tuple[str, list[Any]] | None = None
        self._capture: _Conclude | None = None
        self._pending_log: list[tuple[str, dict[str, Any]]] = []

    # -- hooks for tools -------------------------------------------------------------------

    def capture(self, value: Any) -> None:
        """Stage a structured result and conclude the turn after the current step.

        Called by the runtime's `structured_output` tool; later tool calls in the turn are
        refused.
        """
        if self._capture is None:
            raise RuntimeError("capture() outside a running turn")
        self._capture.concluded = True
        self._capture.value = value

    def add_event(self, kind: str, data: dict[str, Any]) -> None:
        """Append a log-only event inside the running turn (e.g. `subagent/descriptor`)."""
        self.log.append(kind, data)

    # -- the loop ----------------------------------------------------------------------------

    def run_turn(
        self,
        message: Mapping[str, Any],
        signal: AbortSignal,
        take_steers: Callable[[], list[PendingSteer]],
        before_first_request: Callable[[], None] | None = None,
    ) -> TurnOutcome:
        """Run one turn for `message` (`{id, content, source}`) until it ends.

        Returns the outcome; raises only for infrastructure faults (the log failing).
        """
        self.turn += 1
        turn = self.turn
        self.log.append("turn/start", {"turn": turn})
        self._progress({"kind": "turn/start", "turn": turn})
        self._log_user_message(message)
        if before_first_request is not None:
            before_first_request()
        capture = self._capture = _Conclude()
        state = _TurnState()
        try:
            outcome = self._steps(turn, signal, take_steers, capture, state)
        except AbortError as exc:
            outcome = TurnOutcome(turn, "aborted", cause=_cause(exc.reason if exc.reason else exc))
        except (ModelError, ToolCrash) as exc:
            outcome = TurnOutcome(turn, "error", message=str(exc))
        except OSError:
            raise
        except Exception as exc:  # a crash in loop or adapter code: contained as `error`
            log.exception("agent %s: turn %d crashed", self.session_id, turn)
            outcome = TurnOutcome(turn, "error", message=f"{type(exc).__name__}: {exc}")
        finally:
            self._capture = None
        if signal.aborted and outcome.reason not in ("completed", "aborted"):
            outcome = TurnOutcome(turn, "aborted", cause=_cause(signal.reason))
        self._close_turn(turn, state, outcome)
        outcome.output = state.output()
        outcome.structured = capture.value if capture.concluded else None
        return outcome

    def _steps(
        self,
        turn: int,
        signal: AbortSignal,
        take_steers: Callable[[], list[PendingSteer]],
        capture: _Conclude,
        state: _TurnState,
    ) -> TurnOutcome:
        max_steps = self.options.max_steps
        step = 0
        while True:
            signal.raise_if_aborted()
            if step >= max_steps:
                return TurnOutcome(turn, "error", message=f"max_steps ({max_steps}) reached")
            step += 1
            state.step = step
            self.log.append("step/start", {"turn": turn, "step": step})
            self._progress({"kind": "step/start", "turn": turn, "step": step})
            for steer in take_steers():
                self._log_user_message(
                    {"id": steer.message_id, "content": steer.content, "source": steer.source}
                )
                steer.on_admitted()
            request = self._request(turn, step, signal)
            self.log.checkpoint("step")
            state.partial = []
            response = self.model.complete(request, self._model_progress(state))
            finish = response.finish
            calls = response.tool_calls if finish in ("tool_calls", "stop") else ()
            self._log_assistant(response, calls)
            if response.content:
                state.last_output = list(response.content)
            if calls:
                self._run_tools(turn, calls, signal, capture, state)
            self.log.append("step/end", {"turn": turn, "step": step})
            state.step = 0
            if finish == "max-tokens":
                return TurnOutcome(turn, "max-tokens")
            if finish == "refusal":
                return TurnOutcome(turn, "refusal")
            if capture.concluded or not calls:
                if signal.aborted:
                    return TurnOutcome(turn, "aborted", cause=_cause(signal.reason))
                return TurnOutcome(turn, "completed")

    def _request(self, turn: int, step: int, signal: AbortSignal) -> ModelRequest:
        system = self.prompt.render(self.variables)
        specs = self.tools.specs()
        last = self._last_header
        if last is None or last[0] is not system or last[1] != specs:
            self._last_header = (system, specs)
            self.log.append(
                "request/header",
                {
                    "system": system,
                    "tools": [
                        {"name": s.name, "description": s.description, "parameters": s.parameters}
                        for s in specs
                    ],
                },
            )
        return ModelRequest(
            session_id=self.session_id,
            model=self.model_name,
            system=system,
            messages=tuple(self.history),
            tools=tuple(specs),
            signal=signal,
            max_tokens=self.options.max_tokens,
            turn=turn,
            step=step,
        )

    def _model_progress(self, state: _TurnState) -> Callable[[Mapping[str, Any]], None]:
        on_progress = self.on_progress
        partial = state.partial

        def sink(chunk: Mapping[str, Any]) -> None:
            text = chunk.get("text")
            if isinstance(text, str):
                partial.append(text)
            if on_progress is not None:
                on_progress({"kind": "model/chunk", **chunk})

        return sink

    def _log_user_message(self, message: Mapping[str, Any]) -> None:
        entry = {
            "id": message["id"],
            "role": "user",
            "content": list(message["content"]),
            "source": dict(message["source"]),
        }
        self.log.append("user/message", {"message": entry})
        self.history.append({"role": "user", "content": entry["content"]})

    def _log_assistant(self, response: ModelResponse, calls: Sequence[ToolCall]) -> None:
        content = list(response.content)
        tool_calls = [{"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in calls]
        data: dict[str, Any] = {
            "message": {
                "id": new_message_id("a"),
                "role": "assistant",
                "content": content,
                "tool_calls": tool_calls,
            },
            "finish": response.finish,
        }
        if response.usage:
            data["usage"] = dict(response.usage)
        self.log.append("assistant/message", data)
        entry: dict[str, Any] = {"role": "assistant", "content": content}
        if tool_calls:
            entry["tool_calls"] = tool_calls
        self.history.append(entry)
        if self.on_progress is not None:
            self.on_progress({"kind": "assistant/message", "content": content})

    # -- tools ---------------------------------------------------------------------------------

    def _run_tools(
        self,
        turn: int,
        calls: Sequence[ToolCall],
        signal: AbortSignal,
        capture: _Conclude,
        state: _TurnState,
    ) -> None:
        for call in calls:
            self.log.append(
                "tool/call", {"call_id": call.id, "name": call.name, "arguments": dict(call.arguments)}
            )
            state.open_calls[call.id] = call.name
            if self.on_progress is not None:
                self.on_progress({"kind": "tool/call", "name": call.name, "call_id": call.id})
        results: list[ToolResult | None] = [None] * len(calls)
        index = 0
        while index < len(calls):
            if signal.aborted or capture.concluded:
                break
            tool = self.tools.resolve(calls[index].name)
            if tool is not None and tool.concurrency_safe:
                end = index + 1
                while end < len(calls):
                    nxt = self.tools.resolve(calls[end].name)
                    if nxt is None or not nxt.concurrency_safe:
                        break
                    end += 1
            else:
                end = index + 1
            self._run_batch(calls, index, end, results, signal)
            index = end
        for i, call in enumerate(calls):
            result = results[i]
            if result is None:
                reason = "the turn concluded" if capture.concluded else "the turn was aborted"
                result = ToolResult(
                    content=[{"type": "text", "text": f"not run: {reason}"}],
                    is_error=True,
                    code="ABORTED" if not capture.concluded else "TURN_CONCLUDED",
                )
            self._log_tool_result(call.id, call.name, result)
            state.open_calls.pop(call.id, None)

    def _run_batch(
        self,
        calls: Sequence[ToolCall],
        start: int,
        end: int,
        results: list[ToolResult | None],
        signal: AbortSignal,
    ) -> None:
        """Run calls[start:end] concurrently, each in its own greenlet, so an abort can
        abandon a tool that ignores its signal without touching the turn's own greenlet."""
        done = GEvent()
        remaining = [end - start]

        def run_one(i: int) -> None:
            call = calls[i]
            ctx = ToolContext(
                agent=self.agent, session_id=self.session_id, call_id=call.id, signal=signal
            )
            try:
                results[i] = self.tools.execute(call, ctx)
            except AbortError:
                results[i] = None
            except Exception as exc:  # execute() contains tool errors; this is a defect
                results[i] = ToolResult(
                    content=[{"type": "text", "text": f"{type(exc).__name__}: {exc}"}],
                    is_error=True,
                    code="TOOL_FAILED",
                )
            finally:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        greenlets = [gevent.spawn(run_one, i) for i in range(start, end)]
        remove = signal.add_listener(lambda _reason: done.set())
        try:
            done.wait()
        finally:
            remove()
        if remaining[0]:
            gevent.killall(greenlets, block=True)

    def _log_tool_result(self, call_id: str, name: str, result: ToolResult) -> None:
        data: dict[str, Any] = {
            "call_id": call_id,
            "name": name,
            "content": list(result.content),
            "is_error": result.is_error,
        }
        if result.code is not None:
            data["code"] = result.code
        self.log.append("tool/result", data)
        self.history.append(
            {
                "role": "tool",
                "tool_call_id": call_id,
                "name": name,
                "content": data["content"],
                "is_error": result.is_error,
            }
        )
        if self.on_progress is not None:
            self.on_progress({"kind": "tool/result", "name": name, "is_error": result.is_error})

    # -- ending ----------------------------------------------------------------------------------

    def _close_turn(self, turn: int, state: _TurnState, outcome: TurnOutcome) -> None:
        """Balance the log whatever happened, then write `turn/end` and checkpoint."""
        for call_id, name in list(state.open_calls.items()):
            self._log_tool_result(
                call_id,
                name,
                ToolResult(
                    content=[{"type": "text", "text": "not run: the turn ended"}],
                    is_error=True,
                    code="ABORTED",
                ),
            )
        state.open_calls.clear()
        if state.step:
            self.log.append("step/end", {"turn": turn, "step": state.step})
            state.step = 0
        data: dict[str, Any] = {"turn": turn, "reason": outcome.reason}
        if outcome.cause is not None:
            data["cause"] = outcome.cause
        if outcome.message is not None:
            data["message"] = outcome.message
        self.log.append("turn/end", data)
        self.log.checkpoint("turn")
        self._progress({"kind": "turn/end", "turn": turn, "reason": outcome.reason})

    def _progress(self, event: dict[str, Any]) -> None:
        if self.on_progress is not None:
            self.on_progress(event)


class ToolCrash(Exception):
    """Reserved: a tool layer defect that must end the turn `error`."""


class _TurnState:
    __slots__ = ("last_output", "open_calls", "partial", "step")

    def __init__(self) -> None:
        self.step = 0
        self.open_calls: dict[str, str] = {}
        self.partial: list[str] = []
        self.last_output: list[Mapping[str, Any]] | None = None

    def output(self) -> list[Mapping[str, Any]]:
        """The last non-empty assistant content of the turn; else the text streamed so far."""
        if self.last_output:
            return self.last_output
        if self.partial:
            return [{"type": "text", "text": "".join(self.partial)}]
        return []


def _cause(reason: Any) -> str:
    if isinstance(reason, AbortError):
        return str(reason) if reason.reason is None else str(reason.reason)
    if isinstance(reason, BaseException):
        return f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
    return "aborted" if reason is None else str(reason)
