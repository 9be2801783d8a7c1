"""One actor per child run: the run's mailbox for steering, cancellation and disposal.

Users reach a run through `run.ref` and the documented messages `Steer(content, source)`,
`CancelRun(cause)` and `DisposeRun()`. `ref.ask(Steer(...))` resolves exactly like
`run.steer()`: once the child's running turn admitted the message at a step boundary.
`ref.tell(...)` queues it fire-and-forget. After disposal the actor is stopped, so a message to
it raises Pykka's `ActorDeadError` at once instead of hanging.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gevent

from actors.agent_actor import Steer
from actors.deferred import Deferred, rejected
from actors.gevent_actor import GeventActor
from subagent.errors import SubagentError
from subagent.types import SubagentResult, SubagentRun

__all__ = ["CancelRun", "DisposeRun", "RunActor", "Steer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CancelRun:
    """Abort the run's activation (its result settles `aborted` unless it completed)."""

    cause: Any = None


@dataclass(frozen=True, slots=True)
class DisposeRun:
    """Cancel what remains, reach quiescence, stop this actor. Replies at quiescence."""


class RunActor(GeventActor):
    """Serves one provider run. `on_settled(result_or_exception)` is called exactly once."""

    def __init__(
        self,
        run: SubagentRun,
        on_settled: Callable[[SubagentResult | BaseException], None],
    ) -> None:
        super().__init__()
        self.run = run
        self._on_settled = on_settled
        self._settled = False
        self._dispose_reply: Deferred | None = None
        self._watcher: gevent.Greenlet | None = None

    def on_start(self) -> None:
        self._watcher = gevent.spawn(self._watch)

    def on_stop(self) -> None:
        """Stopped by its supervisor (the parent is going away): dispose the run first, so the
        actor never outlives the child it serves."""
        if self._dispose_reply is None:
            self._dispose_reply = Deferred()
            self._dispose_now()
            self._dispose_reply.resolve(None)

    def on_failure(self, *exc_info: Any) -> None:
        """The actor crashed or was killed: it is going away, so release the run it served (off
        this greenlet, which is ending) rather than leaving a child behind."""
        if self._dispose_reply is None:
            self._dispose_reply = Deferred()
            gevent.spawn(self._dispose_now).link(lambda _g: self._dispose_reply.resolve(None))

    def _watch(self) -> None:
        """Wait for the provider's result off the mailbox, then report it exactly once."""
        outcome: SubagentResult | BaseException
        try:
            outcome = self.run.result.get()
        except gevent.GreenletExit:
            raise
        except BaseException as exc:
            outcome = exc
        self._settle(outcome)

    def _settle(self, outcome: SubagentResult | BaseException) -> None:
        if self._settled:
            return
        self._settled = True
        try:
            self._on_settled(outcome)
        except Exception:
            log.exception("run settlement hook raised")

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Steer):
            return self._steer(message)
        if isinstance(message, CancelRun):
            cancel = getattr(self.run, "cancel", None)
            if cancel is not None:
                cancel(message.cause)
            else:
                self._dispose()
            return None
        if isinstance(message, DisposeRun):
            return self._dispose()
        return rejected(TypeError(f"RunActor does not understand {type(message).__name__}"))

    def _steer(self, message: Steer) -> Deferred:
        # Rejections are rejected replies, never raises: a told Steer must not crash the actor.
        reply = message.reply if message.reply is not None else Deferred()
        if self._dispose_reply is not None:
            reply.reject(SubagentError("RUN_DISPOSED"))
            return reply
        steer_into = getattr(self.run, "steer_into", None)
        if steer_into is not None:  # our local runs: hand the reply straight to the child
            steer_into(message.content, message.source, reply)
            return reply
        steer = getattr(self.run, "steer", None)
        if not callable(steer):
            reply.reject(SubagentError("UNSUPPORTED_CAPABILITY", "this run cannot be steered"))
            return reply
        future = steer(message.content, message.source)

        def relay() -> None:
            try:
                reply.resolve(future.get())
            except BaseException as exc:
                reply.reject(exc)

        gevent.spawn(relay)
        return reply

    def _dispose(self) -> Deferred:
        if self._dispose_reply is not None:
            return self._dispose_reply
        reply = self._dispose_reply = Deferred()

        def dispose() -> None:
            self._dispose_now()
            # Quiescence includes this actor: reply only once it has stopped.
            self.actor_ref.stop(block=False).get()
            reply.resolve(None)

        gevent.spawn(dispose)
        return reply

    def _dispose_now(self) -> None:
        try:
            self.run.dispose()
        except Exception as exc:
            log.exception("dispose of run %s raised", self.run.id)
            self._settle(exc)
        # The provider settled the result during dispose; wait for the watcher to report it.
        watcher = self._watcher
        if watcher is not None and watcher is not gevent.getcurrent():
            watcher.join()
