"""The run of an in-process child (spawn and fork): one activation of an ordinary agent.

The run owns the child's first turn after publication. Its `result` resolves once, from the
turn's outcome; a child-level failure is a stop reason, never an exception. Only an
infrastructure fault (the child's log could not be made durable) fails the future.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pykka import Future

from actors.agent_actor import Agent, Steer
from actors.deferred import Deferred
from actors.gevent_actor import GeventFuture
from agent.loop import TurnOutcome
from agent.usage import pico_to_usd
from subagent.errors import SubagentError
from subagent.types import (
    ABORTED,
    BUDGET_EXCEEDED,
    COMPLETED,
    ERROR,
    MAX_TOKENS,
    REFUSAL,
    MessageSource,
    SubagentResult,
)
from supervision.signal import AbortSignal

__all__ = ["LocalRun", "clip_diagnostic", "stop_reason_of"]

MAX_DIAGNOSTIC_BYTES = 4096

_TURN_END_TO_STOP = {
    "completed": COMPLETED,
    "max-tokens": MAX_TOKENS,
    "aborted": ABORTED,
    "blocked": REFUSAL,
    "refusal": REFUSAL,
    BUDGET_EXCEEDED: BUDGET_EXCEEDED,
}


def stop_reason_of(turn_end_reason: str) -> str:
    """The seam's stop reason for a turn-end reason; anything unknown is an error."""
    return _TURN_END_TO_STOP.get(turn_end_reason, ERROR)


def clip_diagnostic(text: str) -> str:
    """At most 4,096 UTF-8 bytes, cut on a character boundary."""
    raw = text.encode("utf-8")
    if len(raw) <= MAX_DIAGNOSTIC_BYTES:
        return text
    return raw[:MAX_DIAGNOSTIC_BYTES].decode("utf-8", errors="ignore")


class LocalRun:
    """A published in-process child and its first activation."""

    def __init__(
        self,
        agent: Agent,
        signal: AbortSignal,
        *,
        wants_structured: bool = False,
        on_settled: Callable[[SubagentResult], None] | None = None,
    ) -> None:
        self._agent = agent
        self._wants_structured = wants_structured
        self._result: GeventFuture[SubagentResult] = GeventFuture()
        self._settled = False
        self._disposed = False
        self._on_settled = on_settled
        self._cancel_requested = False
        self.message_id: str | None = None
        self._turn_listeners = agent.actor.turn_listeners
        self._turn_listeners.append(self._on_turn_end)
        self._remove_signal_listener = signal.add_listener(self._on_abort)

    @property
    def id(self) -> str:
        return self._agent.id

    @property
    def local_agent(self) -> Agent:
        return self._agent

    @property
    def result(self) -> Future[SubagentResult]:
        return self._result

    @property
    def settled(self) -> bool:
        return self._settled

    def begin(
        self, prompt: Sequence[Mapping[str, Any]], source: MessageSource, trace: Any = None
    ) -> str:
        """Queue the activation's turn (its spans under `trace`); returns the message id."""
        # Chosen here, before the send, so the turn that answers it is recognised even if it
        # ends before the send's reply arrives, or after restored messages queued before it.
        self.message_id = "p" + os.urandom(6).hex()
        message_id: str = self._agent.send(
            list(prompt), source, message_id=self.message_id, trace=trace
        ).get()
        return message_id

    def steer(self, content: Sequence[Mapping[str, Any]], source: MessageSource) -> Future[None]:
        if self._disposed:
            return _failed(SubagentError("RUN_DISPOSED"))
        if self._settled:
            return _failed(SubagentError("RUN_TERMINAL", "the run has settled"))
        future: Future[None] = self._agent.steer(list(content), source)
        return future

    def steer_into(
        self, content: Sequence[Mapping[str, Any]], source: MessageSource, reply: Deferred
    ) -> None:
        """`steer` for the run actor: settle `reply` at admission, with no future in between."""
        if self._disposed:
            reply.reject(SubagentError("RUN_DISPOSED"))
        elif self._settled:
            reply.reject(SubagentError("RUN_TERMINAL", "the run has settled"))
        else:
            self._agent.ref.tell(Steer(list(content), source, reply))

    def cancel(self, cause: Any = None) -> None:
        """Abort the running turn; the result settles `aborted` unless it already completed."""
        self._cancel_requested = True
        if not self._settled:
            self._agent.cancel(cause if cause is not None else "cancelled")

    def dispose(self) -> None:
        """Cancel what remains, close the child, return at quiescence. Idempotent."""
        if self._disposed:
            self._agent.close()
            return
        self._disposed = True
        self._remove_signal_listener()
        if not self._settled:
            self._cancel_requested = True
        self._agent.close("disposed")
        if not self._settled:
            # The agent closed without a turn end (it never started one): settle aborted.
            self._settle(SubagentResult(output=[], stop_reason=ABORTED, diagnostic="disposed"))
        # Removed by equality, with no closure kept: a closure over our own bound method would
        # be a reference cycle that only a full collection frees.
        if self._on_turn_end in self._turn_listeners:
            self._turn_listeners.remove(self._on_turn_end)

    # -- settlement ------------------------------------------------------------------------------

    def _on_abort(self, reason: Any) -> None:
        self.cancel(reason)

    def _on_turn_end(self, outcome: TurnOutcome) -> None:
        if self._settled or outcome.message_id != self.message_id:
            return
        if outcome.fault is not None:
            self._settled = True
            self._remove_signal_listener()
            self._result.set_exception(
                (type(outcome.fault), outcome.fault, outcome.fault.__traceback__)
            )
            return
        self._settle(self._result_of(outcome))

    def _result_of(self, outcome: TurnOutcome) -> SubagentResult:
        stop = stop_reason_of(outcome.reason)
        diagnostic = outcome.message or (outcome.cause if stop == ABORTED else None)
        structured = None
        if self._wants_structured:
            if outcome.structured is not None:
                structured = outcome.structured
            elif stop == COMPLETED:
                stop = ERROR
                diagnostic = "the child finished without a valid structured_output capture"
        if self._cancel_requested and stop != COMPLETED:
            stop = ABORTED
        account = self._agent.usage
        usage = dict(account.subtree)  # the child's and its descendants' tokens
        extra: dict[str, Any] = {"usage": usage} if usage else {}
        if account.cost_spent:
            extra["cost_usd"] = pico_to_usd(account.cost_spent)
        return SubagentResult(
            output=outcome.output,
            stop_reason=stop,
            structured=structured,
            diagnostic=None if diagnostic is None else clip_diagnostic(diagnostic),
            extra=extra,
        )

    def _settle(self, result: SubagentResult) -> None:
        if self._settled:
            return
        self._settled = True
        self._remove_signal_listener()
        if self._on_settled is not None:
            self._on_settled(result)
        self._result.set(result)


def _failed(exc: BaseException) -> Future[None]:
    future: GeventFuture[None] = GeventFuture()
    future.set_exception((type(exc), exc, exc.__traceback__))
    return future
