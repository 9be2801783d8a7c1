"""`Agent`: the handle users hold for one live agent (it starts and asks its `AgentActor`)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import TYPE_CHECKING, TypeVar

from pykka import Future

from actors import gevent_actor
from actors.agent_actor import AgentActor
from actors.agent_messages import Block, Cancel, Close, Send, Steer, WhenIdle, check_content
from actors.gevent_actor import Asks, GeventFuture
from agent import tracing
from agent.context import AgentContext
from agent.events import SessionHeader
from agent.json_types import JsonValue
from agent.log import SessionLog
from agent.loop import AgentCore, TurnOutcome
from agent.options import AgentOptions
from agent.prompt import SystemPrompt
from agent.tools import ToolScope
from agent.usage import UsageAccount
from subagent.errors import SubagentError
from subagent.types import MessageSource

__all__ = ["Agent", "check_source"]

log = logging.getLogger(__name__)

T = TypeVar("T")


def check_source(source: object) -> MessageSource:
    """A message's `source` argument: a `MessageSource`, or None for the user. Anything else
    (`"user"`, a dict) is refused at the call: the actor would fail on it with an
    `AttributeError` far from the mistake, and a falsy one would pass as the user."""
    if source is None:
        return MessageSource.user()
    if not isinstance(source, MessageSource):
        raise TypeError(
            "source must be a MessageSource or None (e.g. MessageSource.user()), "
            f"got {type(source).__name__}"
        )
    return source


class Agent:
    """The handle users hold for one live agent. Methods return Pykka futures."""

    # Keyed by a token per registration, so each remover removes exactly its own entry. Made
    # on the first registration: most agents (every child of a fan-out) never get one.
    _progress_listeners: dict[object, Callable[[dict[str, JsonValue]], None]] | None = None

    def __init__(
        self,
        *,
        ctx: AgentContext,
        core: AgentCore,
        header: SessionHeader,
        tools: ToolScope,
        prompt: SystemPrompt,
        options: AgentOptions,
    ) -> None:
        self.ctx = ctx
        self.core = core
        self.header = header
        self.tools = tools
        self.prompt = prompt
        self.options = options
        self.created = time.time()
        # Delegation depth, computed once: the greater of the durable header and the runtime
        # option (both immutable).
        runtime_depth = options.subagent_depth
        durable: int = header.delegation_depth
        self.depth: int = durable if runtime_depth is None else max(durable, runtime_depth)
        self._closed = False
        core.agent = self
        # Same process, same thread: the handle reads the actor's state directly for status.
        actor = self._actor = AgentActor.start_object(core, on_closed=self._forget)
        self.ref = actor.actor_ref

    def __repr__(self) -> str:
        return f"<Agent {self.id} depth={self.depth}>"

    if TYPE_CHECKING:

        @property
        def id(self) -> str: ...

        @property
        def log(self) -> SessionLog: ...

        @property
        def usage(self) -> UsageAccount:
            """This session's token spend, its subtree's, and its budget (see `agent.usage`)."""

    else:
        # Read-only properties with a C getter (`attrgetter`): read several times per child
        # start and end, without a Python frame each.
        id = property(attrgetter("core.session_id"), doc="The agent's session id.")
        log = property(attrgetter("core.log"), doc="The agent's live session log.")
        usage = property(
            attrgetter("core.usage"),
            doc="This session's token spend, its subtree's, and its budget (see `agent.usage`).",
        )

    session_id = id

    @property
    def cwd(self) -> str:
        cwd: str = self.header.cwd
        return cwd

    @property
    def status(self) -> str:
        if self._closed:
            return "closed"
        return "running" if self._actor.busy else "idle"

    @property
    def turn_running(self) -> bool:
        return self._actor.turn_running

    @property
    def actor(self) -> AgentActor:
        return self._actor

    def send(
        self,
        content: str | Sequence[Block],
        source: MessageSource | None = None,
        *,
        message_id: str | None = None,
        trace: tracing.TraceParent | None = None,
    ) -> Future[str]:
        """Queue a turn; the future gives the accepted message id (`message_id` if given: it
        must be unique in this session). The turn's spans hang under `trace`, else under the
        caller's current span, else under the agent's previous parent."""
        trace = trace or tracing.ambient()
        return self._ask(Send(check_content(content), check_source(source), message_id, trace))

    def steer(
        self, content: str | Sequence[Block], source: MessageSource | None = None
    ) -> Future[str | None]:
        """Add to the running turn; the future gives the admitted message's id (a str, from
        this agent: None only comes from a remote run's steer) once a step boundary took it."""
        return self._ask(Steer(check_content(content), check_source(source)))

    def cancel(self, cause: object = None, keep_inbox: bool = False) -> Future[TurnOutcome | None]:
        """Abort the running turn (and the children it started); replies when idle."""
        self.ctx.owner.check()
        try:
            self.ctx.lifecycle.cancelled(self, cause)
        except Exception:
            raise
        except BaseException:
            # Killed while a listener switched out: the cancel still reaches the actor.
            self._ask(Cancel(cause, keep_inbox))
            raise
        return self._ask(Cancel(cause, keep_inbox))

    def when_idle(self) -> Future[TurnOutcome | None]:
        return self._ask(WhenIdle())

    def _ask(self, message: Asks[T]) -> Future[T]:
        """Ask the actor; once it has stopped, the future fails with a `SubagentError` that says
        why (`RUNTIME_CLOSED` after `Runtime.close()`, else `RUN_DISPOSED`), never Pykka's raw
        `ActorDeadError`. From another thread than the runtime's: `WRONG_THREAD`, raised."""
        self.ctx.owner.check()
        if self._closed or not self.ref.is_alive():
            future: GeventFuture[T] = GeventFuture()
            error = self._closed_error()
            future.set_exception((type(error), error, None))
            return future
        reply: Future[T] = self.ref.ask(message, block=False)  # typed by the message
        return reply

    def _closed_error(self) -> SubagentError:
        if self.ctx.closed:
            return SubagentError("RUNTIME_CLOSED", f"the runtime of agent {self.id} is closed")
        return SubagentError("RUN_DISPOSED", f"agent {self.id} is closed")

    def add_turn_listener(self, fn: Callable[[TurnOutcome], None]) -> Callable[[], None]:
        """Call `fn(outcome)` when each turn of this agent ends; returns the remover. One that
        raises is logged and the others still run."""
        if not callable(fn):
            raise TypeError("turn listener must be callable")
        return self._actor.add_turn_listener(fn)

    def add_steer_listener(self, fn: Callable[[str], None]) -> Callable[[], None]:
        """Call `fn(message_id)` when a steer is queued for the running turn (it is admitted at
        the next step boundary); returns the remover. The listener must not block."""
        if not callable(fn):
            raise TypeError("steer listener must be callable")
        return self._actor.add_steer_listener(fn)

    def before_first_request(self, fn: Callable[[], None]) -> None:
        """Run `fn` once, inside this agent's next turn, before its first model request (a
        provider records what a child was started with there). Raising `TurnBlocked` refuses
        the turn."""
        if not callable(fn):
            raise TypeError("before_first_request needs a callable")
        self._actor.before_first_request(fn)

    def add_progress_listener(
        self, fn: Callable[[dict[str, JsonValue]], None]
    ) -> Callable[[], None]:
        """Receive this agent's progress events (turn, step, tool, text), tagged with its id.

        Listeners are a collection: each call adds one entry (the same function twice is two
        entries), and the returned remover takes out exactly that entry, once; calling it again
        does nothing. A listener that raises is logged and the others still run."""
        if not callable(fn):
            raise TypeError("progress listener must be callable")
        key = object()
        listeners = self._progress_listeners
        if listeners is None:
            listeners = self._progress_listeners = {}
        listeners[key] = fn
        self.core.on_progress = self._tell_progress

        def remove() -> None:
            removed = listeners.pop(key, None) is not None
            if removed and not listeners and self.core.on_progress == self._tell_progress:
                self.core.on_progress = None  # no listener: the loop skips building events

        return remove

    def _tell_progress(self, event: dict[str, JsonValue]) -> None:
        agent_id = self.id
        for fn in list((self._progress_listeners or {}).values()):
            try:
                fn({**event, "agent_id": agent_id})  # each its own copy: no cross-talk
            except Exception:
                log.exception("agent %s: progress listener raised (ignored)", self.id)

    def close(self, cause: object = None) -> None:
        """Cancel what runs, close the log and stop the actor; returns at quiescence."""
        if self._closed and not self.ref.is_alive():
            return
        self.ctx.owner.check()
        try:
            self.ctx.lifecycle.closing(self)  # the service disposes this agent's children here
        except Exception:
            raise
        except BaseException:
            # Killed while its children were being disposed (a cancelled tool disposing its
            # child): the close is still started, without waiting, so no agent is left open.
            with contextlib.suppress(Exception):
                self._actor.ask_now(Close(cause), block=False)
            raise
        try:
            # In place when the actor is idle (a settled child): no mailbox round trip.
            self._actor.ask_now(Close(cause), block=False).get()
        except Exception as exc:
            from pykka import ActorDeadError

            if not isinstance(exc, ActorDeadError):
                raise
        # The reply comes before the actor's loop has ended; quiescence means it has.
        gevent_actor.join(self.ref)
        self._forget()

    def _forget(self) -> None:
        self._closed = True
        self.ctx.agents.pop(self.id, None)
