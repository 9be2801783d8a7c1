"""One actor per live agent: its mailbox takes prompts, steering, cancellation and close.

The turn itself runs in a worker greenlet owned by the actor, so the mailbox keeps answering
while a model call is in flight. Handlers only touch in-memory state and return at once; answers
that only exist later (a steer's admission, idleness) are `Deferred` replies.

Message vocabulary (`actors.agent_messages`; send with `agent.ref.ask(...)` or use the
methods of the `Agent` handle, `actors.agent_handle`): `Send(content, source)`,
`Steer(content, source)`, `Cancel(cause, keep_inbox)`, `WhenIdle()`, `Close()`.

Inbox accounting: every send and steer is logged `inbox/accepted` when the mailbox takes it; a
send is `inbox/claimed` when its turn starts, a steer when a step boundary admits it; either is
`inbox/discarded` (with a reason) when dropped: a cancel without `keep_inbox`, or a steer still
pending when its turn ends. Message ids are minted from the session log's seq, so they stay
unique in the session across processes (a resumed agent keeps appending to the same log).

Held work: `Cancel(keep_inbox=True)` aborts the running turn and keeps the queued sends, but the
agent does not start them by itself: like a resumed agent with pending work, it waits for the
next `Send`, which runs the kept messages first, in order. `Close` leaves queued sends pending
in the log (accepted, never claimed), so a later resume restores them.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import gevent
from gevent.hub import RawGreenlet

from actors.agent_messages import (
    Block,
    Cancel,
    CancelRun,
    Close,
    DisposeRun,
    QueuedSend,
    Send,
    Steer,
    WhenIdle,
    check_content,
)
from actors.deferred import Deferred, rejected
from actors.gevent_actor import GeventActor, spawn_untracked
from agent import tracing
from agent.inbox import InboxLimits
from agent.loop import AgentCore, PendingSteer, TurnOutcome
from subagent.errors import SubagentError
from subagent.types import MessageSource
from supervision.group import TaskGroup
from supervision.notify import call_rest
from supervision.signal import AbortController

if TYPE_CHECKING:
    from actors.local_run import LocalRun

__all__ = ["AgentActor"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., None])

_NO_STEERS: list[PendingSteer] = []
_DEFAULT_LIMITS = InboxLimits()
# Sources of the notices the runtime itself sends a parent (a child settled, a restart gave
# up): one per activation of a child the agent started, so bounded by those starts. Refusing
# one would lose the news, not stop a flood.
_RUNTIME_NOTICES = frozenset({"subagent-settled", "subagent-report"})


def _admitted(reply: Deferred[str | None], message_id: str) -> None:
    reply.resolve(message_id)


class AgentActor(GeventActor):
    """Hosts one `AgentCore`.

    A lazy actor (no `on_start`): its creator accepts the first prompt in place and steers are
    told in place while it is idle, so its loop greenlet is made only when a message has to
    wait (a cancel, a dispose, a steer that finds a handler running)."""

    lazy_loop = True

    # Start values shared by every instance until first assigned (a child is started per
    # `start()`: what most children never change is not built per child). The waiter and
    # listener collections are an empty tuple until something is added (`_added`).
    # A raw greenlet: no spawn-tree bookkeeping (frames, links) per child.
    _worker: RawGreenlet | None = None  # the turn worker, owned here (killed in `on_stop`)
    _turn_abort: AbortController | None = None
    _idle_waiters: list[Deferred[TurnOutcome | None]] | tuple[()] = ()
    _last_outcome: TurnOutcome | None = None
    _closing = False
    _close_waiters: list[Deferred[None]] | tuple[()] = ()
    # Queued work waits for the next Send (after a keep-inbox cancel, or a resume).
    _held = False
    _turn_listeners: list[Callable[[TurnOutcome], None]] | tuple[()] = ()
    _steer_listeners: list[Callable[[str], None]] | tuple[()] = ()
    turn_running = False
    _before_first_request: Callable[[], None] | None = None
    # The run whose activation prompt this agent answers (a child's run), if any.
    run: LocalRun | None = None
    _close_cause: object = None
    _dispose_reply: Deferred[None] | None = None
    # The disposer runs in a group the actor owns, made only when a dispose starts.
    _tasks: TaskGroup | None = None
    _disposer: gevent.Greenlet | None = None

    def __init__(self, core: AgentCore, on_closed: Callable[[], None] | None = None) -> None:
        super().__init__()
        self.core = core
        self._queue: collections.deque[QueuedSend] = collections.deque()
        self._steers: list[PendingSteer] = []
        # The reply each steer not yet admitted owes its sender (a local one: its message id).
        self._steer_replies: dict[str, Deferred[str | None]] = {}
        self._on_closed = on_closed

    def activate(
        self,
        run: LocalRun,
        content: Sequence[Block],
        source: MessageSource,
        trace: tracing.TraceParent | None = None,
    ) -> str:
        """Queue `run`'s prompt; returns its message id. Called by whoever just created or
        resumed this agent, in the same greenlet: while the actor is idle (a new agent always
        is), the prompt is accepted right here, with no mailbox round trip (`ask_now`);
        otherwise it goes through the mailbox like any `Send`."""
        trace = trace or tracing.ambient()
        message = Send(check_content(content), source, run.message_id, trace, run)
        return self.ask_now(message)

    def restore_queue(self, messages: Sequence[QueuedSend]) -> None:
        """Before the actor serves anyone: requeue accepted work found in a stored log. It does
        not wake the agent; the next `Send` does."""
        self._queue.extend(messages)
        self._held = bool(self._queue)

    # -- mailbox -------------------------------------------------------------------------------

    # Pykka's `on_receive(message: Any) -> Any`, narrowed: the reply is opaque to the mailbox
    # (each message's reply type is the handler's; the handle's methods type the futures).
    def on_receive(self, message: object) -> object:
        if isinstance(message, Steer):
            return self._steer(message)
        if isinstance(message, Send):
            return self._send(message)
        if isinstance(message, Cancel):
            return self._cancel(message)
        if isinstance(message, WhenIdle):
            return self._when_idle()
        if isinstance(message, Close):
            return self._close(message)
        if isinstance(message, CancelRun):
            self._cancel_run(message)
            return None
        if isinstance(message, DisposeRun):
            return self._dispose_run()
        return rejected(TypeError(f"AgentActor does not understand {type(message).__name__}"))

    def _limits(self) -> InboxLimits:
        """The runtime's inbox bounds (read when a message queues, not held per agent)."""
        agent = self.core.agent
        return _DEFAULT_LIMITS if agent is None else agent.ctx.inbox

    def _send(self, message: Send) -> str:
        if self._closing:
            raise SubagentError("RUN_DISPOSED", "the agent is closed")
        if (
            message.run is None  # a run's own prompt: one per start, bounded by the starts
            and message.source.kind not in _RUNTIME_NOTICES
            and len(self._queue) >= self._limits().sends
        ):
            raise SubagentError(
                "INBOX_FULL",
                f"agent {self.core.session_id} already has {len(self._queue)} messages waiting "
                "for a turn",
            )
        log_ = self.core.log
        message_id = message.message_id or f"m{log_.next_seq}"
        source = message.source.to_json()
        content = list(message.content)
        log_.append(
            "inbox/accepted",
            {"message_id": message_id, "kind": "send", "content": content, "source": source},
        )
        entry: QueuedSend = {"id": message_id, "content": content, "source": source}
        if message.trace is not None:
            entry["trace"] = self.core.trace = message.trace
        self._queue.append(entry)
        if message.run is not None:
            self.run = message.run
        self._held = False
        if self._worker is None:
            self._worker = spawn_untracked(self._work_guarded)
        return message_id

    def _steer(self, message: Steer) -> Deferred[str | None]:
        # A rejection is a rejected reply, never a raise: a told Steer must not crash the actor.
        reply: Deferred[str | None] = message.reply if message.reply is not None else Deferred()
        if self._closing:
            reply.reject(SubagentError("RUN_DISPOSED", "the agent is closed"))
            return reply
        abort = self._turn_abort
        running = self.turn_running and abort is not None and not abort.signal.aborted
        # A turn about to start (its prompt queued, the worker scheduled: a child just started)
        # admits the steer at its first step boundary, as a running turn would at its next.
        starting = not self.turn_running and self._worker is not None and bool(self._queue)
        if not (running or (starting and not self._held)):
            reply.reject(SubagentError("RUN_TERMINAL", "no running turn to steer"))
            return reply
        if len(self._steers) >= self._limits().steers:
            # Refused before anything is logged or queued: the steers already accepted keep
            # their order, and room comes back when the next step boundary admits them.
            reply.reject(
                SubagentError(
                    "INBOX_FULL",
                    f"agent {self.core.session_id} already has {len(self._steers)} steers "
                    "waiting for its next step; send more once it has taken them",
                )
            )
            return reply
        log_ = self.core.log
        message_id = f"s{log_.next_seq}"
        source = message.source.to_json()
        content = list(message.content)
        log_.append(
            "inbox/accepted",
            {"message_id": message_id, "kind": "steer", "content": content, "source": source},
        )
        self._steers.append(
            PendingSteer(
                message_id=message_id,
                content=content,
                source=source,
                on_admitted=partial(_admitted, reply, message_id),
            )
        )
        self._steer_replies[message_id] = reply
        if self._steer_listeners:  # last: the steer is queued whatever a listener does
            rest = iter(list(self._steer_listeners))
            try:
                for listener in rest:
                    listener(message_id)
            except Exception:
                raise
            except BaseException:  # the caller killed while one switched out
                call_rest(rest, lambda fn: fn(message_id))
                raise
        return reply

    @property
    def busy(self) -> bool:
        """A turn runs or is about to (its worker is scheduled)."""
        return self.turn_running or self._worker is not None

    # -- observers (registered by the handle; each returns its remover) ----------------------------

    def add_turn_listener(self, fn: Callable[[TurnOutcome], None]) -> Callable[[], None]:
        listeners = self._turn_listeners
        if isinstance(listeners, tuple):
            listeners = self._turn_listeners = []
        return _register(listeners, fn)

    def add_steer_listener(self, fn: Callable[[str], None]) -> Callable[[], None]:
        listeners = self._steer_listeners
        if isinstance(listeners, tuple):
            listeners = self._steer_listeners = []
        return _register(listeners, fn)

    def before_first_request(self, fn: Callable[[], None]) -> None:
        """Run `fn` once, in the next turn, before its first model request."""
        self._before_first_request = fn

    def _cancel(self, message: Cancel) -> Deferred[TurnOutcome | None]:
        if message.keep_inbox:
            self._held = bool(self._queue)
            if self._turn_abort is not None:
                self._turn_abort.abort(message.cause if message.cause is not None else "cancelled")
        else:
            self._abort_turn(message.cause)
        return self._when_idle()

    def _abort_turn(self, cause: object) -> None:
        """Drop the queued sends and abort the running turn (a cancel without keep_inbox).

        Run in place, this is the canceller's greenlet, and the queue's runs settle there (their
        callbacks may switch): the turn is aborted even if that greenlet is killed meanwhile."""
        try:
            self._discard_queue("cancelled", cause)
        finally:
            if self._turn_abort is not None:
                self._turn_abort.abort(cause if cause is not None else "cancelled")

    def _cancel_run(self, message: CancelRun) -> None:
        run = self.run
        if run is not None and not run.settled:
            run.cancel_requested = True
        agent = self.core.agent
        try:
            if agent is not None:  # the runs this agent started go too
                agent.ctx.lifecycle.cancelled(agent, message.cause)
        finally:
            # A listener may switch out (in place, in the canceller's greenlet) and that
            # greenlet be killed: the turn is still aborted, as Close's end is a finally.
            self._abort_turn(message.cause)

    def _dispose_run(self) -> Deferred[None]:
        """Close through the run (or the agent) off the mailbox: closing waits for this actor."""
        if self._dispose_reply is not None:
            return self._dispose_reply
        reply = self._dispose_reply = Deferred()
        run, agent = self.run, self.core.agent
        if run is None and agent is None:  # already released
            reply.resolve(None)
            return reply

        def dispose() -> None:
            try:
                if run is not None:
                    run.dispose()
                elif agent is not None:
                    agent.close("disposed")
            finally:
                reply.resolve(None)

        tasks = self._tasks = TaskGroup("agent-actor-disposal")
        self._disposer = tasks.spawn(dispose)
        return reply

    def _when_idle(self) -> Deferred[TurnOutcome | None]:
        reply: Deferred[TurnOutcome | None] = Deferred()
        if self._worker is None:
            reply.resolve(self._last_outcome)
        else:
            self._idle_waiters = [*self._idle_waiters, reply]
        return reply

    def _close(self, message: Close) -> Deferred[None]:
        reply: Deferred[None] = Deferred()
        if self._closing and self._worker is None and not self._close_waiters:
            reply.resolve(None)
            return reply
        self._close_waiters = [*self._close_waiters, reply]
        if self._closing:
            return reply
        self._closing = True
        self._close_cause = message.cause
        if self._turn_abort is not None:
            self._turn_abort.abort(message.cause if message.cause is not None else "closed")
        if self._worker is None:
            self._finish_close()
        return reply

    # -- worker --------------------------------------------------------------------------------

    def _take_steers(self) -> list[PendingSteer]:
        if not self._steers:
            return _NO_STEERS
        steers, self._steers = self._steers, []
        for steer in steers:
            self._steer_replies.pop(steer.message_id, None)
        return steers

    def _work_guarded(self) -> None:
        """The worker's body: a raw greenlet must let nothing but its exit escape."""
        try:
            self._work()
        except Exception:
            log.exception("agent %s: the turn worker failed", self.core.session_id)

    def _work(self) -> None:
        core = self.core
        killed = False
        try:
            while self._queue and not self._closing and not self._held:
                if not self.actor_inbox.empty() and not self.actor_stopped.is_set():
                    # Messages told before this turn starts (a cancel right after the start)
                    # are handled first: the loop greenlet, woken by them, goes ahead.
                    gevent.sleep(0)
                    continue
                message = self._queue.popleft()
                controller = self._turn_abort = AbortController()
                self.turn_running = True
                hook, self._before_first_request = self._before_first_request, None
                try:
                    core.log.append("inbox/claimed", {"message_id": message["id"]})
                    outcome = core.run_turn(message, controller.signal, self._take_steers, hook)
                except Exception as exc:  # the log failed: an infrastructure fault
                    log.exception("agent %s: turn failed outside the loop", core.session_id)
                    outcome = TurnOutcome(
                        core.turn, "error", message=f"{type(exc).__name__}: {exc}", fault=exc
                    )
                finally:
                    self.turn_running = False
                    self._turn_abort = None
                    self._reject_steers("the turn ended before a step boundary admitted it")
                outcome.message_id = message["id"]
                self._last_outcome = outcome
                run = self.run
                if run is not None and run.message_id == message["id"]:
                    run.finish(outcome)
                self._tell_turn_listeners(outcome)
                if outcome.exit is not None:  # answered: now the kill (or a tool's exit) goes on
                    killed = outcome.reason == "aborted"
                    raise outcome.exit
        finally:
            self._worker = None
            stopping = self._closing or self._held or self.actor_stopped.is_set()
            if killed and self._queue and not stopping:
                # A kill ended the turn it hit, not the child: its next message still runs (so
                # it is still busy: no idle waiter is answered, no steer refused).
                self._worker = spawn_untracked(self._work_guarded)
            else:
                self._went_idle()

    def _went_idle(self) -> None:
        if self._steers:  # accepted for a turn that never started (its prompt was dropped)
            self._reject_steers("no turn ran to admit it")
        waiters, self._idle_waiters = self._idle_waiters, ()
        for waiter in waiters:
            waiter.resolve(self._last_outcome)
        if self._closing:
            self._finish_close()

    def _tell_turn_listeners(self, outcome: TurnOutcome) -> None:
        for listener in list(self._turn_listeners):
            try:
                listener(outcome)
            except Exception:
                log.exception("turn listener raised")

    def _reject_steers(self, why: str) -> None:
        steers, self._steers = self._steers, []
        for steer in steers:
            reply = self._steer_replies.pop(steer.message_id, None)
            try:
                self.core.log.append(
                    "inbox/discarded", {"message_id": steer.message_id, "reason": why}
                )
            except Exception:
                log.exception("could not log a discarded steer")
            if reply is not None:
                reply.reject(SubagentError("RUN_TERMINAL", why))

    def _discard_queue(self, reason: str, cause: object = None) -> None:
        """Drop queued sends. A run whose prompt is dropped before any turn claimed it settles
        `aborted` here: no turn will ever answer it."""
        run = self.run
        while self._queue:
            message = self._queue.popleft()
            self.core.log.append("inbox/discarded", {"message_id": message["id"], "reason": reason})
            if run is not None and run.message_id == message["id"]:
                why = reason if cause is None else str(cause)
                try:
                    run.finish(TurnOutcome(self.core.turn, "aborted", cause=why))
                except Exception:
                    raise
                except BaseException:  # killed in a result callback: the rest still go
                    self._discard_queue(reason, cause)
                    raise

    def _finish_close(self) -> None:
        # Closing the log waits for its fsync. Run in place, this is the closer's greenlet, and
        # a closer killed there (a cancelled tool disposing its child) must still leave the
        # agent closed, its waiters answered and the actor stopped: so the rest is a finally.
        try:
            self.core.log.close()
        except Exception:
            log.exception("closing the log of %s failed", self.core.session_id)
        finally:
            self._closed_after_log()

    def _closed_after_log(self) -> None:
        run = self.run
        if run is not None:  # closed before a turn answered its prompt
            cause = self._close_cause
            run.abandon("closed" if cause is None else str(cause))
        waiters, self._close_waiters = self._close_waiters, ()
        for waiter in waiters:
            waiter.resolve(None)
        if self._on_closed is not None:
            self._on_closed()
        self._release()
        self.stop()

    def _release(self) -> None:
        """Drop the back-references a closed agent no longer needs, so that it and its log are
        freed by reference counting as soon as its handle goes, instead of waiting for a full
        cyclic collection (which, with thousands of live children, is a long hub pause)."""
        self._on_closed = None
        self.run = None
        self._turn_listeners = ()
        self._steer_listeners = ()
        self._before_first_request = None
        self.core.agent = None
        self.core.on_progress = None

    def on_stop(self) -> None:
        # Stopped without Close (e.g. a mass stop): still end the turn and release the log.
        if self._turn_abort is not None:
            self._turn_abort.abort("stopped")
        worker = self._worker
        if worker is not None and worker is not gevent.getcurrent():
            gevent.kill(worker)
        if self._tasks is not None:
            # The disposer is what stopped us and is waiting for that: it ends on its own.
            self._tasks.close(spare=self._disposer)

    def on_failure(self, *exc_info: object) -> None:
        """The actor crashed or was killed: end the turn as a stop would, and settle every reply
        it still owes, so no asker waits for ever on a dead actor."""
        self.on_stop()
        dead = SubagentError("RUN_DISPOSED", "the agent's actor died")
        if self.run is not None:
            self.run.abandon("the agent's actor died")
        replies, self._steer_replies = self._steer_replies, {}
        self._steers = []
        for reply in replies.values():
            reply.reject(dead)
        idle, closing = self._idle_waiters, self._close_waiters
        self._idle_waiters, self._close_waiters = (), ()
        for waiter in idle:
            waiter.resolve(self._last_outcome)
        for closer in closing:  # a close replies nothing, whoever ends it
            closer.resolve(None)


def _register(listeners: list[F], fn: F) -> Callable[[], None]:
    """Add one entry to `listeners`; the remover takes out exactly that entry, once."""
    listeners.append(fn)
    removed = False

    def remove() -> None:
        nonlocal removed
        if not removed:
            removed = True
            for i, registered in enumerate(listeners):
                if registered is fn:
                    del listeners[i]
                    return

    return remove
