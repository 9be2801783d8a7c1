"""The run of an in-process child (spawn, fork, resume): one activation of an ordinary agent.

There is no actor in front of the child: the child's own `AgentActor` is the run's actor
(`run.ref`), so a steer, a cancel or a dispose is one mailbox hop. The actor settles `result`
(one `Deferred`, the future users hold) when the turn that answers the activation's prompt
ends, when that prompt is discarded before any turn claimed it, or when the agent closes
first. A child-level failure is a stop reason, never an exception; only an infrastructure
fault (the child's log could not be made durable) fails the future.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from pykka import ActorRef, Future

from actors.gevent_actor import Deferred
from agent.json_types import JsonObject, JsonValue
from agent.options import AgentOptions
from agent.usage import pico_to_usd
from subagent.errors import SubagentError
from subagent.types import (
    ABORTED,
    BUDGET_EXCEEDED,
    COMPLETED,
    ERROR,
    MAX_TOKENS,
    REFUSAL,
    AgentView,
    MessageSource,
    SubagentResult,
    TraceParent,
)
from supervision.signal import AbortSignal

if TYPE_CHECKING:
    from pykka import Future

    from agent.loop import TurnOutcome


class _Actor(Protocol):
    def activate(
        self,
        run: LocalRun,
        content: list[JsonObject],
        source: MessageSource,
        trace: TraceParent | None,
    ) -> str: ...


class _Usage(Protocol):
    @property
    def subtree(self) -> Mapping[str, int]: ...

    @property
    def cost_spent(self) -> int: ...


class RunAgent(AgentView, Protocol):
    """What a local run needs of its agent (`actors.agent_handle.Agent`): named here as a
    Protocol so this module does not import the agent actor, which holds the run."""

    @property
    def options(self) -> AgentOptions: ...

    @property
    def ref(self) -> ActorRef[Any]: ...  # Pykka's: an actor ref is typed by nothing useful

    @property
    def actor(self) -> _Actor: ...

    @property
    def usage(self) -> _Usage: ...

    def steer(
        self, content: Sequence[JsonObject], source: MessageSource | None = None
    ) -> Future[str | None]: ...

    def cancel(
        self, cause: object = None, keep_inbox: bool = False
    ) -> Future[TurnOutcome | None]: ...

    def close(self, cause: object = None) -> None: ...


__all__ = ["LocalRun", "RunAgent", "clip_diagnostic", "stop_reason_of"]

# Prompt ids: random bits without a syscall per activation (seeded by the OS, reseeded in a
# forked child).
_ids = random.Random(os.urandom(32))
os.register_at_fork(after_in_child=lambda: _ids.seed(os.urandom(32)))

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
    if len(text) <= MAX_DIAGNOSTIC_BYTES // 4:  # at most 4 UTF-8 bytes a character
        return text
    raw = text.encode("utf-8")
    if len(raw) <= MAX_DIAGNOSTIC_BYTES:
        return text
    return raw[:MAX_DIAGNOSTIC_BYTES].decode("utf-8", errors="ignore")


class LocalRun:
    """A published in-process child and its activation (the prompt `begin` queues)."""

    def __init__(
        self, agent: RunAgent, signal: AbortSignal, *, wants_structured: bool = False
    ) -> None:
        self._agent = agent
        self._wants_structured = wants_structured
        self.result: Deferred[SubagentResult] = Deferred()
        self.cancel_requested = False
        self._disposed = False
        self.message_id: str | None = None
        self._remove_signal_listener: Callable[[], None] | None = signal.add_listener(
            self._on_abort
        )

    @property
    def id(self) -> str:
        return self._agent.id

    @property
    def local_agent(self) -> RunAgent:
        return self._agent

    @property
    def ref(self) -> ActorRef[Any]:
        """The run's actor: the child's own `AgentActor`."""
        return self._agent.ref

    @property
    def settled(self) -> bool:
        return self.result.settled

    def begin(
        self,
        prompt: Sequence[JsonObject],
        source: MessageSource,
        trace: TraceParent | None = None,
    ) -> str:
        """Queue the activation's prompt (logged `inbox/accepted`; its spans under `trace`);
        returns its message id. A child just created or resumed in this greenlet takes it
        without a mailbox round trip (see `AgentActor.activate`)."""
        # Chosen here, before the send, so the turn that answers it is recognised even after
        # restored messages queued before it.
        self.message_id = f"p{_ids.getrandbits(48):012x}"
        return self._agent.actor.activate(self, list(prompt), source, trace)

    def steer(self, content: Sequence[JsonObject], source: MessageSource) -> Future[str | None]:
        """The seam's confirmed steer; it resolves with the admitted message's id (the seam
        promises only that it resolves: a str is more than None)."""
        if self._disposed:
            return _failed(SubagentError("RUN_DISPOSED"))
        if self.result.settled:
            return _failed(SubagentError("RUN_TERMINAL", "the run has settled"))
        return self._agent.steer(list(content), source)  # one hop

    def cancel(self, cause: object = None) -> None:
        """Abort the running turn; the result settles `aborted` unless it already completed."""
        self.cancel_requested = True
        if not self.result.settled:
            self._agent.cancel(cause if cause is not None else "cancelled")

    def dispose(self) -> None:
        """Cancel what remains, close the child, return at quiescence. Idempotent."""
        if not self._disposed:
            self._disposed = True
            if not self.result.settled:
                self.cancel_requested = True
        # The actor settles an unsettled result `aborted` when it closes.
        self._agent.close("disposed")

    # -- settlement, by the child's actor ---------------------------------------------------

    def _on_abort(self, reason: object) -> None:
        self.cancel(reason)

    def finish(self, outcome: TurnOutcome) -> None:
        """The turn that answered the activation ended (or its prompt was dropped)."""
        if self.result.settled:
            return
        self._forget_signal()
        if outcome.fault is not None:
            self.result.reject(outcome.fault)
            return
        self.result.resolve(self._result_of(outcome))

    def abandon(self, why: str) -> None:
        """The agent closed before any turn answered the activation: settle `aborted`."""
        if self.result.settled:
            return
        self._forget_signal()
        self.result.resolve(SubagentResult(output=[], stop_reason=ABORTED, diagnostic=why))

    def _forget_signal(self) -> None:
        remove, self._remove_signal_listener = self._remove_signal_listener, None
        if remove is not None:
            remove()

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
        if self.cancel_requested and stop != COMPLETED:
            stop = ABORTED
        account = self._agent.usage
        usage = account.subtree  # the child's and its descendants' tokens (a snapshot)
        extra: dict[str, JsonValue] = {"usage": usage} if usage else {}
        if account.cost_spent:
            extra["cost_usd"] = pico_to_usd(account.cost_spent)
        return SubagentResult(
            output=outcome.output,
            stop_reason=stop,
            structured=structured,
            diagnostic=None if diagnostic is None else clip_diagnostic(diagnostic),
            extra=extra,
        )


def _failed(exc: BaseException) -> Future[str | None]:
    future: Deferred[str | None] = Deferred()
    future.reject(exc)
    return future
