"""The agent loop: one turn = steps until the model stops asking for tools.

`AgentCore` knows nothing of actors. Whoever hosts it (the `AgentActor`) calls `run_turn` from a
worker greenlet and feeds steering through `take_steers`, which the core drains at each step
boundary: a steer is logged as a user message before the step's model request (in format 3
right after the previous step's last result; in older formats right after `step/start`), so the
very next model request contains it, and only then is its sender told it was admitted.

Every way a turn can end leaves a balanced log: open tool calls get synthetic results, the open
step is closed, and `turn/end` carries the reason. Only an infrastructure fault (the log itself
failing) escapes `run_turn`. Observers (progress listeners) cannot change how a turn ends: a
listener that raises is logged and ignored.

Tool calls: a lone call (or a call that is not concurrency-safe) runs in the turn's own
greenlet, which costs no spawn; an abort abandons it by throwing `_Abandon` into the turn
greenlet, but only while it is still inside the tool (checked from the hub, where the turn
greenlet cannot be running). A run of two or more concurrency-safe calls runs in parallel, one
greenlet each, and an abort kills what is still running. Results are committed in model order.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gevent
from gevent.event import Event as GEvent

from agent import tracing
from agent.context import LiveAgent
from agent.edits import EDITS
from agent.errors import ToolCrash, TurnBlocked
from agent.history import Conversation
from agent.jsoncheck import is_lossless
from agent.log import SessionLog, plain_reply_size
from agent.model import (
    DEFAULT_MAX_TOOL_CALLS_PER_REPLY,
    ModelAdapter,
    ModelError,
    ModelRequest,
    ModelResponse,
    ToolCall,
    ToolSpec,
    without_lone_surrogates,
)
from agent.options import AgentOptions
from agent.prompt import SystemPrompt
from agent.tools import TOOL_FAILED, ToolContext, ToolResult, ToolScope
from agent.usage import (
    CheckedUsage,
    Price,
    Usage,
    UsageAccount,
    check_usage,
    cost_of_events,
    pico_to_usd,
    usage_of_events,
    usd_to_pico,
)
from supervision.errors import AbortError, Cancelled
from supervision.group import TaskGroup
from supervision.signal import AbortSignal

__all__ = [
    "BUDGET_EXCEEDED",
    "AgentCore",
    "PendingSteer",
    "ToolCrash",
    "TurnBlocked",
    "TurnOutcome",
    "new_message_id",
]

log = logging.getLogger(__name__)

_message_ids = itertools.count(1)

# How long an abort waits for killed parallel tool greenlets before abandoning them.
_KILL_GRACE = 1.0

_NO_STEERS: list[PendingSteer] = []

_EDITS = EDITS
# (edit count, prompt, tool scope, variables, rendered system prompt, tool specs): what a
# request shows, kept while nothing it was made from changed (`AgentCore._show`).
_Shown = tuple[int, SystemPrompt, ToolScope, dict[str, str | None], str, tuple[ToolSpec, ...]]

# The turn/end reason (and the run's stop reason) when a token budget on the chain is used up.
BUDGET_EXCEEDED = "budget-exceeded"


def new_message_id(prefix: str = "m") -> str:
    """A process-unique id. Inbox ids are minted per session instead (see AgentActor)."""
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
    # The inbox message the turn answered (set by the host), so a run can tell its own turn
    # from one of a restored message queued before it.
    message_id: str | None = None
    # What ended the turn's greenlet (a kill, or a tool's `GreenletExit`, `SystemExit` or
    # `KeyboardInterrupt`): the turn was closed as any other, and the host raises this once it
    # has settled what the turn answered.
    exit: BaseException | None = None


ProgressFn = Callable[[dict[str, Any]], None]


class _Abandon(Cancelled):
    """Thrown into the turn greenlet to abandon an inline tool call after an abort."""


class _Conclude:
    """The turn's structured-output capture state (see `AgentCore.capture`)."""

    __slots__ = ("concluded", "value")

    def __init__(self) -> None:
        self.concluded = False
        self.value: object = None


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
        agent: LiveAgent | None = None,
        price: Price | None = None,
    ) -> None:
        cost_limit = None
        if options.cost_budget is not None:
            if price is None:
                raise ValueError(
                    f"model route {options.model!r} has no price in the runtime's price table, "
                    "so a cost budget cannot hold it (give it a price: Runtime(prices=...), "
                    "subagent run --prices FILE)"
                )
            cost_limit = usd_to_pico(options.cost_budget, "cost_budget")
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
        # The conversation, held once: positions of the log's message events.
        self.history = Conversation(log.events)
        self._note = self.history.note_seq
        self.turn = log.turn  # the replay's: no turn/start decoded
        # This session's token spend (from its log) and budget; the subagent layer links it to
        # the parent's account so a subtree's spend counts against every ancestor's budget.
        self.usage = UsageAccount(
            owner=session_id,
            own=usage_of_events(log.events, log.header.seed_length),
            limit=options.token_budget,
            price=price,
            cost_own=cost_of_events(log.events, log.header.seed_length) if price else 0,
            cost_limit=cost_limit,
        )
        self._last_header: tuple[str, tuple[ToolSpec, ...]] | None = None
        # What the last request showed, and when (`_show`).
        self._shown: _Shown | None = None
        # An older session resumed keeps its log's format: format 1 writes tool/call and
        # step/end events, formats 1 and 2 step/start; format 3 derives all three
        # (docs/decisions.md, "A step in three events" and "Log format 3").
        self._format1 = log.format == 1
        self._step_events = log.format <= 2
        self._capture: _Conclude | None = None
        # Tracing (agent.tracing): the agent's latest trace parent, and the running turn's spans.
        self.trace: tracing.TraceParent | None = None
        self._trace: tracing.TurnTrace | None = None

    # -- hooks for tools -------------------------------------------------------------------

    def capture(self, value: object) -> None:
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

        Returns the outcome; raises only for infrastructure faults (the log failing). A model
        refusal ends the turn `refusal`. A turn its greenlet's exit ended (a kill) returns too,
        the exit in `TurnOutcome.exit` for the caller to raise.
        """
        turn = self.turn + 1
        self.log.append("turn/start", {"turn": turn})
        self.turn = turn
        self._progress({"kind": "turn/start", "turn": turn})
        self._trace = tracing.begin_turn(self, message, turn)
        self._log_user_message(message)
        capture = self._capture = _Conclude()
        state = _TurnState(gevent.getcurrent())
        remove = signal.add_listener(state.on_abort)
        try:
            if before_first_request is not None:
                before_first_request()
            outcome = self._steps(turn, signal, take_steers, capture, state)
        except AbortError as exc:
            outcome = TurnOutcome(turn, "aborted", cause=_cause(exc.reason if exc.reason else exc))
        except TurnBlocked as exc:
            outcome = TurnOutcome(turn, "blocked", message=str(exc) or "the turn was blocked")
        except (ModelError, ToolCrash) as exc:
            outcome = TurnOutcome(turn, "error", message=str(exc) or type(exc).__name__)
        except OSError as exc:
            if self._trace is not None:
                self._trace.fault(exc)
            raise
        except Exception as exc:  # a crash in loop or adapter code: contained as `error`
            # A result, not an incident: the host sees it in the outcome (docs/decisions.md).
            log.debug("agent %s: turn %d crashed", self.session_id, turn, exc_info=True)
            outcome = TurnOutcome(turn, "error", message=f"{type(exc).__name__}: {exc}")
        except (gevent.GreenletExit, Cancelled) as exc:
            # The turn's greenlet was killed, or a tool raised the kill's exception (or another
            # cancellation than its signal's): cancelled, never crashed (docs/supervision.md),
            # and still answered, so no run waits for ever.
            cause = _cause(signal.reason) if signal.aborted else "the turn was killed"
            outcome = TurnOutcome(turn, "aborted", cause=cause, exit=exc)
        except BaseException as exc:  # `SystemExit`, `KeyboardInterrupt` from a tool: a crash
            outcome = TurnOutcome(turn, "error", message=_cause(exc), exit=exc)
        finally:
            remove()
            self._capture = None
        if outcome.exit is not None:
            return self._closed_on_exit(turn, state, outcome)
        if signal.aborted and outcome.reason not in ("completed", "aborted"):
            outcome = TurnOutcome(turn, "aborted", cause=_cause(signal.reason))
        self._end_turn(turn, state, outcome)
        outcome.structured = capture.value if capture.concluded else None
        return outcome

    def _end_turn(self, turn: int, state: _TurnState, outcome: TurnOutcome) -> None:
        self._close_turn(turn, state, outcome)
        trace = self._trace
        if trace is not None:
            self._trace = None
            trace.end(outcome)
        outcome.output = state.output()

    def _closed_on_exit(self, turn: int, state: _TurnState, outcome: TurnOutcome) -> TurnOutcome:
        """A turn ended by its greenlet's exit, closed in the log and its spans as best it can
        be: the exit goes on either way (`TurnOutcome.exit`), so a failure here is logged."""
        try:
            self._end_turn(turn, state, outcome)
        except Exception:
            log.exception("agent %s: could not close turn %d after its exit", self.session_id, turn)
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
        log_append = self.log.append
        format1 = self._format1
        step_events = self._step_events
        sink = self._model_progress(state)
        agent = self.agent
        limit = (
            DEFAULT_MAX_TOOL_CALLS_PER_REPLY
            if agent is None
            else agent.ctx.max_tool_calls_per_reply
        )
        step = 0
        while True:
            if signal.aborted:
                raise AbortError(reason=signal.reason)
            if step >= max_steps:
                return TurnOutcome(turn, "error", message=f"max_steps ({max_steps}) reached")
            over = self.usage.exceeded()
            if over is not None:
                return TurnOutcome(turn, BUDGET_EXCEEDED, message=over.describe_exhausted())
            step += 1
            state.step = step
            if step_events:
                log_append("step/start", {"turn": turn, "step": step})
            if self.on_progress is not None:
                self._progress({"kind": "step/start", "turn": turn, "step": step})
            steers = take_steers()
            if steers:
                self._admit(steers)
            request = self._request(turn, step, signal, limit)
            self.log.checkpoint("step")
            state.partial.clear()
            tt = self._trace
            # Lone UTF-16 halves repaired before the reply is logged, acted on or traced: when
            # the `chat` span records the reply's text, before the span sees it; otherwise the
            # log's encoder is the probe (it refuses such text, logging nothing) and only a
            # refused reply is repaired.
            if tt is None:
                response = self.model.complete(request, sink)
                repaired = False
            else:
                response = tt.chat(self.model.complete, request, sink, without_lone_surrogates)
                repaired = tt.captures_content
            finish = response.finish
            calls = response.tool_calls if finish in ("tool_calls", "stop") else ()
            note = None
            if len(calls) > limit or response.more_calls:
                # Past the bound: the first `limit` calls are the reply as logged and run.
                calls, note = _bounded(calls, response.more_calls, limit)
            logged_calls = self._log_assistant(response, calls, repaired)
            if logged_calls is None:
                response = without_lone_surrogates(response)
                calls = response.tool_calls if finish in ("tool_calls", "stop") else ()
                if note is not None:
                    calls = calls[:limit]
                logged_calls = self._log_assistant(response, calls, True)
                assert logged_calls is not None  # a repairing append does not refuse text
            if response.content:
                state.last_output = list(response.content)
            if calls:
                if len(calls) == 1 and not format1 and self.on_progress is None:
                    # `_run_tools` has nothing to add for a lone call nobody watches.
                    self._run_lone(calls[0], signal, capture, state, note)
                else:
                    self._run_tools(calls, logged_calls, signal, capture, state, note)
            if format1:
                log_append("step/end", {"turn": turn, "step": step})
            state.step = 0
            if finish == "max-tokens":
                return TurnOutcome(turn, "max-tokens")
            if finish == "refusal":
                return TurnOutcome(turn, "refusal")
            if capture.concluded or not calls:
                if signal.aborted:
                    return TurnOutcome(turn, "aborted", cause=_cause(signal.reason))
                return TurnOutcome(turn, "completed")

    def _admit(self, steers: list[PendingSteer]) -> None:
        """Log steers at the boundary, then account for them, then tell their senders."""
        for steer in steers:
            self._log_user_message(
                {"id": steer.message_id, "content": steer.content, "source": steer.source}
            )
        for steer in steers:
            self.log.append("inbox/claimed", {"message_id": steer.message_id})
        if self._trace is not None:
            self._trace.steers(steers)
        for steer in steers:
            steer.on_admitted()

    def _request(self, turn: int, step: int, signal: AbortSignal, limit: int) -> ModelRequest:
        shown = self._shown
        variables = self.variables
        if (
            shown is None
            or shown[0] != _EDITS.count
            or shown[1] is not self.prompt
            or shown[2] is not self.tools
            or shown[3] != variables
        ):
            shown = self._show(variables)
        # Positional (session_id, model, system, messages, tools, signal, max_tokens, turn,
        # step, max_tool_calls): ten keywords bound by name on every step cost more than the call.
        return ModelRequest(
            self.session_id,
            self.model_name,
            shown[4],
            self.history.view(),
            shown[5],
            signal,
            self.options.max_tokens,
            turn,
            step,
            limit,
        )

    def _show(self, variables: Mapping[str, str | None]) -> _Shown:
        """What requests show (the rendered prompt, the tool specs), logged as a request
        header when it differs from the last one, and kept until an edit of a prompt section,
        a tool registration, a scope's tools or restrictions (`agent.edits`), or a variable."""
        edits = _EDITS.count  # read first: an edit while rendering leaves the cache stale
        system = self.prompt.render(variables)
        specs = self.tools.spec_tuple()  # shared and immutable: no copy per request
        last = self._last_header
        if last is None or last[0] is not system or (last[1] is not specs and last[1] != specs):
            self.log.append_request_header(system, specs)
            self._last_header = (system, specs)
        shown = self._shown = (edits, self.prompt, self.tools, dict(variables), system, specs)
        return shown

    def _model_progress(self, state: _TurnState) -> Callable[[Mapping[str, Any]], None]:
        partial = state.partial

        def sink(chunk: Mapping[str, Any]) -> None:
            text = chunk.get("text")
            if isinstance(text, str):
                partial.append(text)
            if self.on_progress is not None:
                self._progress({"kind": "model/chunk", **chunk})

        return sink

    def _log_user_message(self, message: Mapping[str, Any]) -> None:
        content = list(message["content"])
        entry = {
            "id": message["id"],
            "role": "user",
            "content": content,
            "source": dict(message["source"]),
        }
        self._note(self.log.append("user/message", {"message": entry})["seq"])

    def _log_assistant(
        self, response: ModelResponse, calls: Sequence[ToolCall], repaired: bool
    ) -> list[dict[str, Any]] | None:
        """Log the reply; returns its `tool_calls` entries as logged (checked by the log).

        Unless the reply was `repaired` already (`without_lone_surrogates`), text with a lone
        surrogate in it is not logged: returns None, and the caller repairs the reply and logs
        that instead (one encoding a step, where a probe first would make two)."""
        content = list(response.content)
        if len(calls) == 1:  # the common case without a comprehension (a frame each)
            c = calls[0]
            tool_calls = [{"id": c.id, "name": c.name, "arguments": dict(c.arguments)}]
        else:
            tool_calls = [
                {"id": c.id, "name": c.name, "arguments": dict(c.arguments)} for c in calls
            ]
        message = {
            # Unique within the session, also across processes: the event's own seq.
            "id": f"a{self.log.next_seq}",
            "role": "assistant",
            "content": content,
            "tool_calls": tool_calls,
        }
        data: dict[str, Any] = {"message": message, "finish": response.finish}
        usage = response.usage
        cost: int | None = None
        # Checked once (an adapter hands over a `Usage`, checked where it was made; any other
        # mapping is checked here), so neither the log's lossless-JSON walk nor the charge looks
        # at it again.
        if type(usage) is Usage:
            counts: Mapping[str, Any] = usage.counts
            checked: CheckedUsage | None = usage.checked
        elif usage:
            # The log encodes it at once and keeps no reference: no copy needed for a dict.
            counts = usage if type(usage) is dict else dict(usage)
            checked = check_usage(usage)
        else:
            counts = usage
            checked = None
        if counts:
            data["usage"] = counts
            price = self.usage.price
            if price is not None:
                # Priced when spent: a later change of the price table never rewrites history.
                cost = price.cost(counts)
                data["cost_usd"] = pico_to_usd(cost)  # a finite float (int / int)
        # The walk covers the message alone: `finish` is a str (the replay checks it), a clean
        # usage is str keys and ints (the strict encoder range-checks them), `cost_usd` finite.
        # Anything else (a usage that is not clean, a message that is not lossless) takes the
        # log's own walk, which names the bad value as before.
        # The plain shape's check also sizes the reply, so the log need not walk it for that.
        size = plain_reply_size(message) if checked is not None or not counts else -1
        try:
            appended = self.log.append(
                "assistant/message",
                data,
                prechecked=size >= 0
                or ((checked is not None or not counts) and is_lossless(message, 1)),
                repair=repaired,
                size=size + 256 if size >= 0 else None,  # usage and cost: a few numbers
            )
        except UnicodeEncodeError:
            return None
        self._note(appended["seq"])
        if counts:
            if checked is None:
                self.usage.charge(counts, cost)
            elif cost is None:
                self.usage.charge_tokens(checked)
            else:
                self.usage.charge_checked(checked, counts, cost)
        if self.on_progress is not None:
            event: dict[str, Any] = {"kind": "assistant/message", "content": content}
            if counts:
                event["usage"] = dict(counts)
            self._progress(event)
        return tool_calls

    # -- tools ---------------------------------------------------------------------------------

    def _run_tools(
        self,
        calls: Sequence[ToolCall],
        logged: Sequence[Mapping[str, Any]],
        signal: AbortSignal,
        capture: _Conclude,
        state: _TurnState,
        note: str | None = None,
    ) -> None:
        """Run the reply's calls and log their results in model order; `note` (the reply had
        more calls than run) is added to the last call's result."""
        # The assistant/message just logged opened these calls (the log's replay holds them
        # open until their results); a format-1 log also records each as a tool/call event.
        if self._format1:
            append = self.log.append
            for entry in logged:
                # The id, name and arguments are the very values the assistant/message append
                # just checked (nothing ran in between that holds them): no second walk.
                append(
                    "tool/call",
                    {
                        "call_id": entry["id"],
                        "name": entry["name"],
                        "arguments": entry["arguments"],
                    },
                    prechecked=True,
                )
        if self.on_progress is not None:
            for call in calls:
                self._progress(
                    {
                        "kind": "tool/call",
                        "name": call.name,
                        "call_id": call.id,
                        "arguments": call.arguments,
                    }
                )
        if len(calls) == 1:
            self._run_lone(calls[0], signal, capture, state, note)
            return
        results: list[ToolResult | None] = [None] * len(calls)
        started = [False] * len(calls)
        crash: list[BaseException] = []
        resolve = self.tools.resolve
        index = 0
        count = len(calls)
        try:
            while index < count:
                if signal.aborted or capture.concluded:
                    break
                end = index + 1
                if count > 1:
                    tool = resolve(calls[index].name)
                    if tool is not None and tool.concurrency_safe:
                        while end < count:
                            nxt = resolve(calls[end].name)
                            if nxt is None or not nxt.concurrency_safe:
                                break
                            end += 1
                if end - index == 1:
                    started[index] = True
                    self._run_inline(calls[index], index, results, crash, signal, state)
                else:
                    self._run_parallel(calls, index, end, results, started, crash, signal, state)
                index = end
        except Exception:
            raise  # a fault of the loop itself: the turn's close answers every call
        except BaseException as exc:  # the turn's greenlet exits: what ran keeps its answer
            for i, call in enumerate(calls):
                if started[i]:
                    self._answer_on_exit(call, results[i] or _exited(exc))
            raise
        last = count - 1
        for i, call in enumerate(calls):
            result = results[i]
            if result is None:
                result = _unanswered(capture.concluded, started[i])
            self._log_tool_result(call.id, call.name, result, note if i == last else None)
        if crash:
            raise _tool_crash(crash[0]) from crash[0]

    def _run_lone(
        self,
        call: ToolCall,
        signal: AbortSignal,
        capture: _Conclude,
        state: _TurnState,
        note: str | None = None,
    ) -> None:
        """`_run_tools` for a step's only call (the common case), without its batch lists."""
        result: ToolResult | None = None
        started = False
        crash: list[BaseException] = []
        if not signal.aborted and not capture.concluded:
            started = True
            state.in_tool = True
            try:
                tt = self._trace
                if tt is None:
                    # `_context(call, signal)`, without its frame.
                    ctx = ToolContext(self.agent, self.session_id, call.id, signal)
                    result = self.tools.execute(call, ctx)
                else:
                    result = tt.tool(self.tools.execute, call, self._context, signal)
            except AbortError:
                pass
            except _Abandon:
                pass
            except Exception as exc:  # execute() must contain tool errors: this is a defect
                crash.append(exc)
                result = _synthetic(TOOL_FAILED, f"{type(exc).__name__}: {exc}")
            except BaseException as exc:  # the turn's greenlet exits: say why the call is cut
                self._answer_on_exit(call, _exited(exc))
                raise
            finally:
                state.in_tool = False
        if result is None:
            result = _unanswered(capture.concluded, started)
        self._log_tool_result(call.id, call.name, result, note)
        if crash:
            raise _tool_crash(crash[0]) from crash[0]

    def _answer_on_exit(self, call: ToolCall, result: ToolResult) -> None:
        """Log a call's answer while the turn's greenlet exits: the exit goes on whatever
        happens here (the turn's close answers the calls this leaves open)."""
        try:
            self._log_tool_result(call.id, call.name, result)
        except Exception:
            log.exception("agent %s: could not answer call %s on exit", self.session_id, call.id)

    def _context(
        self, call: ToolCall, signal: AbortSignal, trace: tracing.TraceParent | None = None
    ) -> ToolContext:
        return ToolContext(
            agent=self.agent,
            session_id=self.session_id,
            call_id=call.id,
            signal=signal,
            trace=trace,
        )

    def _execute(
        self,
        call: ToolCall,
        i: int,
        results: list[ToolResult | None],
        crash: list[BaseException],
        signal: AbortSignal,
    ) -> None:
        try:
            tt = self._trace
            if tt is None:
                results[i] = self.tools.execute(call, self._context(call, signal))
            else:
                results[i] = tt.tool(self.tools.execute, call, self._context, signal)
        except AbortError:
            pass
        except Exception as exc:  # execute() must contain tool errors: this is a defect
            crash.append(exc)
            results[i] = _synthetic(TOOL_FAILED, f"{type(exc).__name__}: {exc}")

    def _run_inline(
        self,
        call: ToolCall,
        i: int,
        results: list[ToolResult | None],
        crash: list[BaseException],
        signal: AbortSignal,
        state: _TurnState,
    ) -> None:
        """Run one call in the turn greenlet; an abort may abandon it (see `_TurnState`)."""
        state.in_tool = True
        try:
            self._execute(call, i, results, crash, signal)
        except _Abandon:
            pass
        finally:
            state.in_tool = False

    def _run_parallel(
        self,
        calls: Sequence[ToolCall],
        start: int,
        end: int,
        results: list[ToolResult | None],
        started: list[bool],
        crash: list[BaseException],
        signal: AbortSignal,
        state: _TurnState,
    ) -> None:
        """Run calls[start:end] concurrently, one greenlet each; an abort kills the rest."""
        done = state.batch_done = GEvent()
        remaining = [end - start]

        exits: list[BaseException] = []

        def run_one(i: int) -> None:
            started[i] = True
            try:
                self._execute(calls[i], i, results, crash, signal)
            except (SystemExit, KeyboardInterrupt) as exc:
                # The process is asked to exit: as from an inline call, the exit ends the
                # turn, raised in the turn's greenlet once the batch is closed (not in this
                # one, whence gevent would hand it to the main greenlet while the turn went on).
                results[i] = _exited(exc)
                exits.append(exc)
                done.set()
            except BaseException as exc:
                if results[i] is None and not signal.aborted:
                    # The call's own greenlet was killed (or its tool raised the kill's
                    # exception): that call goes unanswered, and says why; the turn goes on.
                    results[i] = _exited(exc)
                raise
            finally:
                remaining[0] -= 1
                if remaining[0] == 0:
                    done.set()

        # The batch owns its tool greenlets: none outlives the batch (an abort closes it).
        batch = TaskGroup("tool-batch")
        for i in range(start, end):
            batch.spawn(run_one, i)
        try:
            done.wait()
        finally:
            state.batch_done = None
            if remaining[0]:
                batch.close(timeout=_KILL_GRACE)
                alive = len(batch)
                if alive:
                    log.warning(
                        "agent %s: %d tool greenlet(s) ignored being killed; abandoned",
                        self.session_id,
                        alive,
                    )
        if exits:
            raise exits[0]

    def _log_tool_result(
        self, call_id: str, name: str, result: ToolResult, note: str | None = None
    ) -> None:
        content = list(result.content)
        if note is not None:
            content.append({"type": "text", "text": note})
        data: dict[str, Any] = {
            "call_id": call_id,
            "name": name,
            "content": content,
            "is_error": result.is_error,
        }
        if result.code is not None:
            data["code"] = result.code
        try:
            event = self.log.append("tool/result", data)
        except (TypeError, ValueError) as exc:
            # The tool's content is not lossless JSON (or too big): the model gets the failure.
            result = _synthetic(TOOL_FAILED, f"the tool returned content the log refused: {exc}")
            data = {
                "call_id": call_id,
                "name": name,
                "content": result.content,
                "is_error": True,
                "code": TOOL_FAILED,
            }
            event = self.log.append("tool/result", data)
        self._note(event["seq"])
        if self.on_progress is not None:
            self._progress(
                {
                    "kind": "tool/result",
                    "name": name,
                    "call_id": call_id,
                    "is_error": data["is_error"],
                    "code": data.get("code"),
                    "content": data["content"],
                }
            )

    # -- ending ----------------------------------------------------------------------------------

    def _close_turn(self, turn: int, state: _TurnState, outcome: TurnOutcome) -> None:
        """Balance the log whatever happened, then write `turn/end` and checkpoint."""
        # The log's replay knows every call of this turn still without a result, whichever
        # way the turn got here (even a reply logged just before a fault).
        for call_id, name in self.log.open_calls.items():
            self._log_tool_result(call_id, name, _synthetic("ABORTED", "not run: the turn ended"))
        if state.step:
            if self._format1:
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
        """Tell the listener; an observer's failure never changes the turn."""
        on_progress = self.on_progress
        if on_progress is None:
            return
        try:
            on_progress(event)
        except Exception:
            log.exception("agent %s: progress listener raised (ignored)", self.session_id)


def _bounded(calls: Sequence[ToolCall], more: int, limit: int) -> tuple[Sequence[ToolCall], str]:
    """The calls of a reply that run (its first `limit`), and what the model is told of the
    rest (`more` were counted by the adapter without being decoded)."""
    kept = calls[:limit]
    dropped = len(calls) - len(kept) + more
    total = len(kept) + dropped
    note = (
        f"Note from the runtime: your reply asked for {total:,} tool calls, and at most "
        f"{limit:,} run per reply: the first {len(kept):,} were taken, the other {dropped:,} "
        "were dropped without running and are not in this conversation. Ask for what is still "
        f"needed in later replies, at most {limit:,} calls each."
    )
    return kept, note


def _synthetic(code: str, text: str) -> ToolResult:
    return ToolResult(content=[{"type": "text", "text": text}], is_error=True, code=code)


def _unanswered(concluded: bool, started: bool) -> ToolResult:
    """The result a call gets when its tool gave none: why it never ran, or why it was cut."""
    if concluded and not started:
        return _synthetic("TURN_CONCLUDED", "not run: the turn concluded")
    if started:
        return _synthetic("ABORTED", "abandoned: the turn was aborted while it ran")
    return _synthetic("ABORTED", "not run: the turn was aborted")


def _exited(exc: BaseException) -> ToolResult:
    """The result of a call cut by its greenlet's exit: a kill, or an exit its tool raised."""
    if isinstance(exc, gevent.GreenletExit):
        return _synthetic("ABORTED", "not answered: the tool's greenlet was killed")
    return _synthetic(TOOL_FAILED, f"not answered: the tool raised {_cause(exc)}")


def _tool_crash(failure: BaseException) -> ToolCrash:
    """A defect in the tool layer itself (`execute()` must contain tool errors)."""
    return ToolCrash(f"the tool layer failed: {type(failure).__name__}: {failure}")


class _TurnGreenlet(Protocol):
    """What an abort needs of the greenlet running the turn (`gevent.getcurrent()`)."""

    @property
    def dead(self) -> bool: ...

    def throw(self, typ: type[BaseException]) -> object: ...


class _TurnState:
    __slots__ = (
        "batch_done",
        "greenlet",
        "in_tool",
        "last_output",
        "partial",
        "step",
    )

    def __init__(self, greenlet: _TurnGreenlet) -> None:
        self.greenlet = greenlet
        self.step = 0
        self.in_tool = False
        self.batch_done: GEvent | None = None
        self.partial: list[str] = []
        self.last_output: list[Mapping[str, Any]] | None = None

    def on_abort(self, reason: object) -> None:
        """Signal listener: stop waiting for tools. Runs on the aborting greenlet."""
        batch = self.batch_done
        if batch is not None:
            batch.set()
        if self.in_tool:
            gevent.get_hub().loop.run_callback(self._abandon)

    def _abandon(self) -> None:
        # Runs in the hub: the turn greenlet is switched out, so `in_tool` tells exactly
        # whether it is blocked inside the tool call.
        greenlet = self.greenlet
        if self.in_tool and greenlet is not None and not greenlet.dead:
            greenlet.throw(_Abandon)

    def output(self) -> list[Mapping[str, Any]]:
        """The last non-empty assistant content of the turn; else the text streamed so far."""
        if self.last_output:
            return self.last_output
        if self.partial:
            return [{"type": "text", "text": "".join(self.partial)}]
        return []


def _cause(reason: object) -> str:
    if isinstance(reason, AbortError):
        return str(reason) if reason.reason is None else str(reason.reason)
    if isinstance(reason, BaseException):
        return f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
    return "aborted" if reason is None else str(reason)
