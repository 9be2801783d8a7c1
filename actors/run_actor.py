"""One actor per remote run (ACP, Ray, or any provider whose run has no actor of its own): the
run's mailbox for steering, cancellation and disposal. A local child needs none: its own
`AgentActor` is its run's actor and understands the same messages.

Users reach a run through `run.ref` and the documented messages `Steer(content, source)`,
`CancelRun(cause)` and `DisposeRun()`. `ref.ask(Steer(...))` resolves exactly like
`run.steer()`: once the child admitted the message. `ref.tell(...)` queues it
fire-and-forget. After disposal the actor is stopped, so a message to it raises Pykka's
`ActorDeadError` at once instead of hanging. The actor does not watch the run's result: the
registry observes that future itself (`add_done_callback`), so no greenlet waits on it.
"""

from __future__ import annotations

import logging

from gevent import Greenlet, GreenletExit
from pykka import Future

from actors.agent_messages import CancelRun, DisposeRun, Steer
from actors.deferred import Deferred, rejected
from actors.gevent_actor import GeventActor, GeventFuture
from subagent.errors import SubagentError
from subagent.types import SubagentRun
from supervision.group import TaskGroup

__all__ = ["CancelRun", "DisposeRun", "RunActor", "Steer"]

log = logging.getLogger(__name__)


class RunActor(GeventActor):
    """Serves one provider run that has no actor of its own."""

    def __init__(self, run: SubagentRun) -> None:
        super().__init__()
        self.run = run
        self._dispose_reply: Deferred[None] | None = None
        # The actor's helpers (steer relays, the disposer); ended when the actor stops.
        self._tasks = TaskGroup(f"run-actor:{run.id}")
        self._disposer: Greenlet | None = None

    def on_stop(self) -> None:
        """Stopped by its supervisor (the parent is going away): dispose the run first, so the
        actor never outlives the child it serves."""
        if self._dispose_reply is None:
            self._dispose_reply = Deferred()
            self._dispose_now()
            self._dispose_reply.resolve(None)
        # The disposer is what stopped us and is waiting for that: it ends on its own.
        self._tasks.close(spare=self._disposer)

    def on_failure(self, *exc_info: object) -> None:
        """The actor crashed or was killed: it is going away, so release the run it served (off
        this greenlet, which is ending) rather than leaving a child behind."""
        if self._dispose_reply is None:
            reply = self._dispose_reply = Deferred()
            self._tasks.spawn(self._dispose_now).link(lambda _g: reply.resolve(None))

    # Pykka's `on_receive(message: Any) -> Any`, narrowed: the reply is opaque to the mailbox
    # (each message's reply type is the handler's; the handle's methods type the futures).
    def on_receive(self, message: object) -> object:
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

    def _steer(self, message: Steer) -> Deferred[str | None]:
        # Rejections are rejected replies, never raises: a told Steer must not crash the actor.
        reply: Deferred[str | None] = message.reply if message.reply is not None else Deferred()
        if self._dispose_reply is not None:
            reply.reject(SubagentError("RUN_DISPOSED"))
            return reply
        steer = getattr(self.run, "steer", None)  # the capability is the method's presence
        if not callable(steer):
            reply.reject(SubagentError("UNSUPPORTED_CAPABILITY", "this run cannot be steered"))
            return reply
        future: Future[str | None] = steer(message.content, message.source)
        if isinstance(future, GeventFuture):
            future.add_done_callback(reply.copy_from)
            return reply

        def relay() -> None:  # a provider's own future type: wait for it off the mailbox
            try:
                reply.resolve(future.get())
            except GreenletExit:  # the actor stopped (its group closed) first
                reply.reject(SubagentError("RUN_DISPOSED"))
            except BaseException as exc:
                reply.reject(exc)

        self._tasks.spawn(relay)
        return reply

    def _dispose(self) -> Deferred[None]:
        if self._dispose_reply is not None:
            return self._dispose_reply
        reply = self._dispose_reply = Deferred()

        def dispose() -> None:
            self._dispose_now()
            # Quiescence includes this actor: reply only once it has stopped.
            self.actor_ref.stop(block=False).get()
            reply.resolve(None)

        self._disposer = self._tasks.spawn(dispose)
        return reply

    def _dispose_now(self) -> None:
        try:
            self.run.dispose()
        except Exception:
            log.exception("dispose of run %s raised", self.run.id)
