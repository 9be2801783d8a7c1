"""A Pykka runtime on gevent: each actor is one greenlet, its inbox a gevent queue.

Built on Pykka's extension hooks (`_create_actor_inbox`, `_create_future`,
`_start_actor_loop`) plus an own actor loop, because Pykka's loop has two hazards under
gevent: a `GreenletExit` in a handler makes it stop *every* actor in the process, and a kill
while idle skips the teardown, leaving a registered zombie whose asks hang.

Here a kill means: this actor stops, unregisters, fails its pending asks with
`ActorDeadError`; no other actor is touched. We also keep an O(1) index of our live actors,
because Pykka's `ActorRegistry` is a list (each unregister scans it) and its `stop_all()` is
O(N^2) for a mass stop.

All of this runs on the gevent hub of one thread; refs must be used from that thread.
Nothing here monkey-patches.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, Literal, Self, TypeGuard, TypeVar, overload

import gevent
import gevent.event
import gevent.queue
from gevent.hub import RawGreenlet
from pykka import Actor, ActorDeadError, ActorRef, ActorRegistry, Future, Timeout, messages
from pykka._envelope import Envelope

from subagent.errors import SubagentError
from supervision.errors import Cancelled
from supervision.notify import call_rest

if TYPE_CHECKING:
    from types import TracebackType

    from pykka._actor import ActorInbox
    from pykka._future import GetHookFunc
    from pykka._types import OptExcInfo

__all__ = [
    "ActorKilled",
    "Asks",
    "Deferred",
    "GeventActor",
    "GeventFuture",
    "freeze_gc",
    "join",
    "kill",
    "live_actors",
    "live_count",
    "outcome_of",
    "reply_of",
    "spawn_untracked",
    "stop_all",
]

logger = logging.getLogger(__name__)
_pykka_logger = logging.getLogger("pykka")

# The pykka seam: the private parts of Pykka this runtime relies on (pinned: pykka 4.5), read
# here once so nothing else reaches into Pykka. The registry's list and lock let an actor
# register and unregister in O(1); the stop message is what `ActorRef.stop` queues; a ref's
# weakref is the only way from a ref to its actor object. Pykka never rebinds the first two.
_REGISTRY_REFS: list[ActorRef[Any]] = ActorRegistry._actor_refs  # noqa: SLF001
_REGISTRY_LOCK = ActorRegistry._actor_refs_lock  # noqa: SLF001
_ActorStop: type[messages._ActorStop] = messages._ActorStop  # noqa: SLF001
# Pykka's own messages, which its `_handle_receive` interprets (stop, proxy calls); any other
# message goes straight to `on_receive` (`GeventActor._handle_receive`).
_PYKKA_MESSAGES = frozenset(
    {_ActorStop, messages.ProxyCall, messages.ProxyGetAttr, messages.ProxySetAttr}
)

T = TypeVar("T")
_ident = threading.get_ident
R_co = TypeVar("R_co", covariant=True)


class Asks(Generic[R_co]):
    """Base of a message that says what its reply is: `class Send(Asks[str])` replies a str.

    Typing only: no state, no `__init__` (a slotted message subclasses it at no cost per
    instance). The typed ask sites read it: `GeventActor.ask_now(message)` returns `R_co` (or
    a `GeventFuture[R_co]` with `block=False`), `reply_of(ref, message)` asks through Pykka's
    mailbox, so a caller's reply type is checked against the message, not asserted by hand.
    A handler may answer later with a `Deferred[R_co]` (see `GeventFuture.set`).
    """

    __slots__ = ()


class ActorKilled(Cancelled):
    """Thrown into an actor's greenlet by `kill()`; the loop understands it as "stop alone".

    The actors layer's only error, so it lives here rather than in an errors module. A
    `Cancelled` (a `BaseException`: supervision/errors.py has the whole tree), so a handler's
    `except Exception:` cannot swallow a kill; a plain `AbortError` raised by a handler is not
    one, and fails only that message.
    """


class _FutureResult:
    __slots__ = ("exc_info", "value")

    def __init__(self, value: object = None, exc_info: OptExcInfo | None = None) -> None:
        # Type-erased: the `T` of the future that holds it (only `set` / `resolve` store it).
        self.value: Any = value
        self.exc_info = exc_info


class GeventFuture(Future[T]):
    """A Pykka future that waits cooperatively; its event is made only if someone waits.

    `add_done_callback` lets an owner react to the outcome in the settling greenlet (no
    watcher greenlet parked on `get()`)."""

    __slots__ = (
        "_callbacks",
        "_event",
        "_get_hook",
        "_get_hook_result",
        "_thread",
        "settlement",
    )

    def __init__(self) -> None:
        Future.__init__(self)  # not `super()`: its look-up costs what recording the thread does
        self.settlement: _FutureResult | None = None
        self._event: gevent.event.Event | None = None
        self._callbacks: list[Callable[[GeventFuture[T]], None]] | None = None
        # The thread whose hub settles it: only that thread may wait for it (`get`).
        self._thread = _ident()

    def get(self, *, timeout: float | None = None) -> T:
        """The value (or the exception) once settled, waiting cooperatively until then.

        A settled future may be read from any thread. Waiting is for the thread that made it
        (whose hub settles it): from another, the wait would hang, or make gevent refuse the
        hub's own waiters later, so it fails at once with `SubagentError("WRONG_THREAD")`."""
        if self._get_hook is not None:  # Pykka's get hook (`map`, `filter`, ...)
            return super().get(timeout=timeout)
        result = self.settlement
        if result is None:
            if _ident() != self._thread:
                raise _wrong_thread()
            if self._event is None:
                self._event = gevent.event.Event()
            if not self._event.wait(timeout):
                msg = f"{timeout} seconds"
                raise Timeout(msg)
            result = self.settlement
            assert result is not None
        if result.exc_info is not None:
            exc_type, exc_value, exc_traceback = result.exc_info
            assert exc_type is not None
            if exc_value is None:
                exc_value = exc_type()
            if exc_value.__traceback__ is not exc_traceback:
                raise exc_value.with_traceback(exc_traceback)
            raise exc_value
        value: T = result.value
        return value

    @property
    def done(self) -> bool:
        return self.settlement is not None

    def add_done_callback(self, fn: Callable[[GeventFuture[T]], None]) -> None:
        """Call `fn(self)` once the future is settled (at once if it is), in the greenlet that
        settles it. `fn` must not block; one that raises is logged."""
        if self.settlement is not None:
            _call_done(fn, self)
            return
        if self._callbacks is None:
            self._callbacks = [fn]
        else:
            self._callbacks.append(fn)

    def set(self, value: object | None = None) -> None:
        if isinstance(value, Deferred):
            # A handler answered "later": this future settles when the deferred does.
            value.bind(self)
            return
        self._resolve(_FutureResult(value=value))

    def set_exception(self, exc_info: OptExcInfo | None = None) -> None:
        assert exc_info is None or len(exc_info) == 3
        self._resolve(_FutureResult(exc_info=exc_info if exc_info is not None else sys.exc_info()))

    def set_get_hook(self, func: GetHookFunc[T]) -> None:
        if self.settlement is not None:
            raise gevent.queue.Full
        super().set_get_hook(func)
        if self._event is not None:
            self._event.set()

    def _resolve(self, result: _FutureResult) -> None:
        # Same contract as ThreadingFuture: a second set is an error (queue.Full).
        if self.settlement is not None or self._get_hook is not None:
            raise gevent.queue.Full
        self.settlement = result
        callbacks, self._callbacks = self._callbacks, None
        try:
            if callbacks is not None:
                rest = iter(callbacks)
                try:
                    for fn in rest:
                        _call_done(fn, self)
                except BaseException:  # killed while a callback switched out: finish the round
                    call_rest(rest, lambda fn: fn(self))
                    raise
        finally:
            if self._event is not None:  # waiters wake whatever happened to the settler
                self._event.set()


def _wrong_thread() -> SubagentError:
    here = threading.current_thread().name
    return SubagentError(
        "WRONG_THREAD",
        f"a future of the runtime's hub was waited on from thread {here!r}: wait for it on "
        "the thread that runs the runtime (or read it once it is settled)",
    )


def _call_done(fn: Callable[[GeventFuture[T]], None], future: GeventFuture[T]) -> None:
    try:
        fn(future)
    except Exception:
        logger.exception("done callback %r raised", fn)


class Deferred(GeventFuture[T]):
    """The one settle-once primitive: every run's result, task outcome and late actor reply.

    The producer calls `resolve(value)` or `reject(exc)`; only the first call counts (it returns
    True), later ones are ignored. Consumers hold it as a Pykka future (`get(timeout=...)`). A
    handler that returns one binds the asker's future to it (see `GeventFuture.set`)."""

    __slots__ = ()

    @property
    def settled(self) -> bool:
        return self.settlement is not None

    def resolve(self, value: T) -> bool:
        if self.settlement is not None:
            return False
        self._resolve(_FutureResult(value=value))
        return True

    def reject(self, exc: BaseException) -> bool:
        if self.settlement is not None:
            return False
        self._resolve(_FutureResult(exc_info=(type(exc), exc, exc.__traceback__)))
        return True

    def reject_current(self) -> None:
        """Reject with the exception being handled."""
        exc = sys.exc_info()[1]
        if exc is not None:
            self.reject(exc)

    def bind(self, future: Future[T]) -> None:
        """Settle `future` with this deferred's outcome, now or when it arrives."""
        self.add_done_callback(lambda me: _copy_outcome(me, future))

    def copy_from(self, source: GeventFuture[T]) -> None:
        """Settle with `source`'s outcome (a settled future); a done callback."""
        result = source.settlement
        assert result is not None
        if result.exc_info is None:
            self.resolve(result.value)
        else:
            exc = result.exc_info[1]
            self.reject(exc if exc is not None else RuntimeError("failed"))

    def outcome(self) -> T | BaseException:
        """The settled value, or the exception it failed with (call only once settled)."""
        return outcome_of(self)


def outcome_of(future: GeventFuture[T]) -> T | BaseException:
    """A settled future's value, or the exception it failed with."""
    result = future.settlement
    assert result is not None
    if result.exc_info is None:
        value: T = result.value
        return value
    exc = result.exc_info[1]
    if exc is None:
        exc_type = result.exc_info[0]
        assert exc_type is not None
        exc = exc_type()
    return exc


def _copy_outcome(source: GeventFuture[T], target: Future[T]) -> None:
    result = source.settlement
    assert result is not None
    if result.exc_info is None:
        target.set(result.value)
    else:
        target.set_exception(result.exc_info)


# An actor's urn only has to be unique: uuid4() reads os.urandom per call (a syscall, ~4 us),
# and even 128 seeded random bits formatted per actor cost ~0.7 us. Each process takes one
# random version-4 prefix (80 bits; a forked child takes a new one) and numbers its actors in
# the last 48 bits: the same URN shape for ~0.2 us.
_urn_random = random.Random(os.urandom(32))
_UUID4_CLEAR = ~((0xF000 << 64) | (0xC000 << 48))
_UUID4_SET = (0x4000 << 64) | (0x8000 << 48)
_urn_prefix = [""]
_urn_numbers = itertools.count()


def _new_urn_prefix() -> None:
    h = "%032x" % ((_urn_random.getrandbits(128) & _UUID4_CLEAR) | _UUID4_SET)
    _urn_prefix[0] = f"urn:uuid:{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-"


def _reseed_urns() -> None:
    _urn_random.seed(os.urandom(32))
    _new_urn_prefix()


_new_urn_prefix()
os.register_at_fork(after_in_child=_reseed_urns)


def _new_urn() -> str:
    return f"{_urn_prefix[0]}{next(_urn_numbers) & 0xFFFFFFFFFFFF:012x}"


def spawn_untracked(fn: Callable[[], object]) -> RawGreenlet:
    """`gevent.spawn_raw(fn)` without gevent's spawn-tree record: with its default config
    (`GEVENT_TRACK_GREENLET_TREE`) each raw greenlet reads the config, takes a weak reference
    to its spawner and looks up the spawner's tree locals, which raises and catches an
    `AttributeError` per spawn from the main greenlet (~4 us, against ~1 us for the greenlet
    itself). For the greenlets made per child (its turn worker, an actor's loop): gevent's
    tree dumps then show them without their spawner. The returned greenlet runs `fn` at the
    hub's next turn, as `spawn_raw`'s does; kill it with `gevent.kill`."""
    hub = gevent.get_hub()
    glet = RawGreenlet(fn, hub)
    hub.loop.run_callback(glet.switch)
    return glet


# Our live actors by urn, in start order: O(1) membership, and (reversed) the order a mass
# stop uses so that Pykka's list-based registry finds each actor at its end.
_live: dict[str, GeventActor] = {}


class _WakingInbox(gevent.queue.SimpleQueue):  # type: ignore[misc]
    """A lazy actor's inbox: the first message put into it starts the actor's loop."""

    __slots__ = ("sleeper",)  # set by the actor right after making it (no Python __init__)

    sleeper: GeventActor | None

    def put(self, item: object, block: bool = True, timeout: float | None = None) -> None:
        sleeper = self.sleeper
        if sleeper is not None:
            self.sleeper = None
            sleeper.wake_loop()
        super().put(item, block, timeout)


class GeventActor(Actor):
    """A Pykka actor whose loop is a greenlet on the gevent hub.

    Handlers must stay short and cooperative; a blocking call stalls every actor.
    `kill()` (module function) stops one actor at once, whatever it is doing.

    `lazy_loop = True` (for a class without `on_start`): the loop's greenlet is made only when
    a message first has to wait in the inbox. Until then every `ask_now`/`tell_now` is handled
    in place, so an actor nobody has had to queue for costs no greenlet at all.
    """

    lazy_loop: bool = False

    # Start values, shared until first assigned (one actor per child: not stored per start).
    _greenlet: Any = None
    _crash: BaseException | None = None
    _killed: ActorKilled | BaseException | None = None
    _exited: gevent.event.Event | None = None  # made only if someone joins
    _ended: bool = False
    _exit_callbacks: list[Callable[[GeventActor], None]] | None = None
    _unregistered: bool = False
    _in_teardown: bool = False
    _in_handler: bool = False
    # A lazy actor that never needed its loop, stopping itself from a handler run in place:
    # it ends right after that handler (`_end_in_place`), without a loop made only to stop.
    _stop_in_place: bool = False

    def __init__(self, *_args: object, **_kwargs: object) -> None:
        # Not Actor.__init__: it makes a threading.Event for `actor_stopped`, which would block
        # the hub if anyone waited on it. A gevent Event has the same interface.
        self.actor_urn = _new_urn()
        if self.lazy_loop and type(self).on_start is Actor.on_start:
            inbox = _WakingInbox()
            inbox.sleeper = None
            self.actor_inbox = inbox
        else:
            self.actor_inbox = self._create_actor_inbox()
        self.actor_stopped = gevent.event.Event()
        self._actor_ref = ActorRef(self)

    @classmethod
    def start(cls, *args: object, **kwargs: object) -> ActorRef[Self]:
        """Pykka's `Actor.start`, minus two log lines formatted even when debug is off."""
        return cls.start_object(*args, **kwargs).actor_ref

    @classmethod
    def start_object(cls, *args: object, **kwargs: object) -> Self:
        """`start`, returning the actor object itself (its `actor_ref` is the ref): for the
        runtime's own handles, which live in the actor's thread and read its plain state."""
        obj = cls(*args, **kwargs)
        assert getattr(obj, "_actor_ref", None) is not None, (
            "Actor.__init__() have not been called. "
            "Did you forget to call super() in your override?"
        )
        ref = obj.actor_ref
        with _REGISTRY_LOCK:
            _REGISTRY_REFS.append(ref)
        if _pykka_logger.isEnabledFor(logging.DEBUG):
            _pykka_logger.debug(f"Registered {ref}")
            _pykka_logger.debug(f"Starting {obj}")
        obj._start_actor_loop()
        return obj

    # -- Pykka's extension hooks -------------------------------------------------------------

    @staticmethod
    def _create_actor_inbox() -> ActorInbox:
        inbox: ActorInbox = gevent.queue.SimpleQueue()
        return inbox

    @staticmethod
    def _create_future() -> Future[Any]:
        return GeventFuture()

    def _start_actor_loop(self) -> None:
        _live[self.actor_urn] = self
        inbox = self.actor_inbox
        if type(inbox) is _WakingInbox:
            inbox.sleeper = self  # the first queued message spawns the loop
            return
        self._greenlet = spawn_untracked(self._actor_loop)

    def stop(self) -> None:
        """Pykka's `stop()` (the actor stops after the current message). A lazy actor that
        never had a loop, stopping itself from a handler run in place (`ask_now`/`tell_now`),
        ends right after that handler instead: no loop greenlet is made only to stop it."""
        if self._in_handler and self._greenlet is None and type(self.actor_inbox) is _WakingInbox:
            self._stop_in_place = True
            return
        super().stop()

    def _after_in_place(self) -> None:
        """After an in-place handler that asked to stop: end now if nothing queued meanwhile
        (the usual case), else stop through the mailbox as `stop()` would have."""
        self._stop_in_place = False
        if self._greenlet is None and self.actor_inbox.empty() and not self.actor_stopped.is_set():
            self._end_in_place()
        else:
            super().stop()

    def _end_in_place(self) -> None:
        """What the loop does for a stop message and then at its end, in the caller's greenlet
        (a lazy actor with no loop): `on_stop`, unregister, then the exit callbacks."""
        try:
            self._stop()
        except ActorKilled as exc:
            self._record_crash(exc)
        finally:
            inbox = self.actor_inbox
            if type(inbox) is _WakingInbox:
                inbox.sleeper = None  # a late message must not start a loop for a dead actor
            self._end()

    def wake_loop(self) -> None:
        """A lazy actor's loop, started by the first message that must wait (or a kill)."""
        if self._greenlet is None:
            self._greenlet = spawn_untracked(self._actor_loop)

    # -- the loop ----------------------------------------------------------------------------

    def _actor_loop(self) -> None:
        """Run the actor; whatever ends it, unregister, fail pending asks, report the exit."""
        try:
            if self._killed is None:  # a kill before the first switch skips on_start
                self._actor_loop_setup()
                self._actor_loop_running()
            else:
                self._die_killed(self._killed)
        except (ActorKilled, gevent.GreenletExit) as exc:
            self._die_killed(exc)
        finally:
            self._end()

    def _end(self) -> None:
        """The end of every actor, by its loop or in place: unregister, mark stopped, fail what
        is still queued (a message that came while an in-place stop switched out would wait
        forever otherwise), then tell the exit callbacks."""
        self._in_teardown = True
        self._unregister_once()
        self.actor_stopped.set()
        self._actor_loop_teardown()
        _live.pop(self.actor_urn, None)
        self._ended = True
        if self._exited is not None:
            self._exited.set()
        callbacks, self._exit_callbacks = self._exit_callbacks, None
        for callback in callbacks or ():
            try:
                callback(self)
            except Exception:
                logger.exception("exit callback of %s failed", self)

    def _actor_loop_setup(self) -> None:
        try:
            self.on_start()
        except ActorKilled:
            raise
        except Exception:
            self._handle_failure(*sys.exc_info())

    def _actor_loop_running(self) -> None:
        while not self.actor_stopped.is_set():
            if self._killed is not None:
                raise self._killed
            envelope = self.actor_inbox.get()
            while self._in_handler:  # a direct `ask_now` handler switched out: let it finish
                gevent.sleep(0)
            try:
                self._in_handler = True
                try:
                    response = self._handle_receive(envelope.message)
                finally:
                    self._in_handler = False
                if envelope.reply_to is not None:
                    envelope.reply_to.set(response)
            except (ActorKilled, gevent.GreenletExit):
                if envelope.reply_to is not None:
                    envelope.reply_to.set_exception(_dead_exc_info(self, "was killed"))
                raise
            except Exception:
                if envelope.reply_to is not None:
                    _pykka_logger.info(
                        f"Exception returned from {self} to caller:", exc_info=sys.exc_info()
                    )
                    envelope.reply_to.set_exception()
                else:
                    self._handle_failure(*sys.exc_info())
                    try:
                        self.on_failure(*sys.exc_info())
                    except Exception:
                        self._handle_failure(*sys.exc_info())
            except BaseException:
                # KeyboardInterrupt, SystemExit and the like keep Pykka's meaning: the process
                # is going down, so every actor stops. (GreenletExit is handled above.)
                exc_value = sys.exc_info()[1]
                self._record_crash(exc_value)
                _pykka_logger.debug(f"{exc_value!r} in {self}. Stopping all actors.")
                self._stop()
                ActorRegistry.stop_all()

    def _actor_loop_teardown(self) -> None:
        while not self.actor_inbox.empty():
            envelope = self.actor_inbox.get()
            if envelope.reply_to is None:
                # A told message may carry its own reply (e.g. `Steer(..., reply)`): fail it too.
                carried = getattr(envelope.message, "reply", None)
                if isinstance(carried, Deferred):
                    carried.reject(ActorDeadError(f"{self.actor_ref} stopped before handling it"))
                continue
            if isinstance(envelope.message, _ActorStop):
                envelope.reply_to.set(None)
            else:
                envelope.reply_to.set_exception(
                    _dead_exc_info(self, "stopped before handling the message")
                )

    def _die_killed(self, exc: BaseException) -> None:
        self._record_crash(exc)
        self._unregister_once()
        self.actor_stopped.set()
        logger.debug("killed %s", self)
        try:
            self.on_failure(type(exc), exc, exc.__traceback__)
        except Exception:
            logger.exception("on_failure of killed %s failed", self)

    # -- Pykka internals, made idempotent ------------------------------------------------------

    def _handle_receive(self, message: Any) -> Any:
        """Pykka's dispatch, minus its four `isinstance` tests for a message of our own (every
        message but a stop or a proxy call): straight to `on_receive`."""
        if type(message) in _PYKKA_MESSAGES:
            return super()._handle_receive(message)
        return self.on_receive(message)

    def _stop(self) -> None:
        self._unregister_once()
        self.actor_stopped.set()
        _pykka_logger.debug(f"Stopped {self}")
        try:
            self.on_stop()
        except ActorKilled:
            raise
        except Exception:
            self._handle_failure(*sys.exc_info())

    def _handle_failure(
        self,
        exception_type: type[BaseException] | None,
        exception_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._record_crash(exception_value)
        _pykka_logger.error(
            f"Unhandled exception in {self}:",
            exc_info=(exception_type, exception_value, traceback),  # type: ignore[arg-type]
        )
        self._unregister_once()
        self.actor_stopped.set()

    def _unregister_once(self) -> None:
        """Pykka's unregister, but O(1) when we are at either end of its registry list.

        `ActorRegistry.unregister` scans the list from the front (twice), so stopping N actors
        newest-first (as `ActorRegistry.stop_all()` and supervisors do) costs O(N^2), and a
        second unregister scans it all for nothing. Mass stops hit one end of the list, so we
        look there first. Uses Pykka's private list and lock (pinned: pykka 4.5).
        """
        if self._unregistered:
            return
        self._unregistered = True
        ref = self._actor_ref
        with _REGISTRY_LOCK:
            refs = _REGISTRY_REFS
            if refs and refs[-1] is ref:
                refs.pop()
            elif refs and refs[0] is ref:
                del refs[0]
            else:
                try:
                    refs.remove(ref)
                except ValueError:
                    return
        if _pykka_logger.isEnabledFor(logging.DEBUG):
            _pykka_logger.debug(f"Unregistered {ref}")

    @property
    def crash(self) -> BaseException | None:
        """What ended the actor abnormally (a handler's exception, a kill), or None."""
        return self._crash

    def _record_crash(self, exc: BaseException | None) -> None:
        if self._crash is None and exc is not None:
            self._crash = exc

    # -- the run-to-completion shortcut -------------------------------------------------------

    @overload
    def ask_now(self, message: Asks[T], *, block: Literal[True] = True) -> T: ...

    @overload
    def ask_now(self, message: Asks[T], *, block: Literal[False]) -> GeventFuture[T]: ...

    @overload
    def ask_now(self, message: object, *, block: Literal[True] = True) -> object: ...

    @overload
    def ask_now(self, message: object, *, block: Literal[False]) -> GeventFuture[Any]: ...

    def ask_now(self, message: object, *, block: bool = True) -> object:
        """`ref.ask(message, block=...)`, minus the mailbox when that changes nothing: if this
        actor is idle (its loop is parked on an empty inbox, no handler is running), the handler
        runs right here, in the caller's greenlet, exactly as the loop would run it next.
        Otherwise the message is queued behind the others, as any ask. With `block=False` the
        answer comes as a future (a handler's `Deferred` itself). Same thread only; handlers
        reached this way must not depend on the current greenlet. Should one switch out, the
        loop holds its next message until it is done, so the order stays the mailbox's."""
        if not self._idle():
            return self._actor_ref.ask(message, block=block)
        self._in_handler = True
        try:
            response = self._handle_receive(message)
        except Exception as exc:
            if block:
                raise
            failed: Deferred[Any] = Deferred()
            failed.reject(exc)
            return failed
        finally:
            self._in_handler = False
            if self._stop_in_place:
                self._after_in_place()
        if block:
            return response.get() if isinstance(response, Deferred) else response
        if isinstance(response, Deferred):
            return response
        done: Deferred[Any] = Deferred()
        done.resolve(response)
        return done

    def ask_in_place(self, message: object) -> object:
        """`ask_now(message, block=False)` without wrapping an answer that is ready: when this
        actor is idle, the handler's answer itself (a value, or the handler's own `Deferred`;
        its exception raised here); otherwise the queued ask's future. For a caller whose
        handler never answers a future as a value, so that "is it a future" tells the two
        apart (a child's start: no settled future made, unwrapped and dropped per start)."""
        if not self._idle():
            return self._actor_ref.ask(message, block=False)
        self._in_handler = True
        try:
            return self._handle_receive(message)
        finally:
            self._in_handler = False
            if self._stop_in_place:
                self._after_in_place()

    def tell_now(self, message: object) -> None:
        """`ref.tell(message)`, run in place when this actor is idle (as `ask_now` does). For
        handlers that never raise (a rejection travels in the message's own reply); one that
        does anyway crashes the actor, as it would in the loop."""
        if not self._idle():
            self._actor_ref.tell(message)
            return
        self._in_handler = True
        try:
            self._handle_receive(message)
        except Exception as exc:
            logger.exception("told %r failed in place; %s stops", type(message).__name__, self)
            self._record_crash(exc)
            self.request_kill(ActorKilled(f"{self}: a told handler raised"))
        finally:
            self._in_handler = False
            if self._stop_in_place:
                self._after_in_place()

    def handling_in_place(self) -> bool:
        """Whether the handler running now runs in its caller's greenlet (`ask_now`/`tell_now`
        on an idle actor), not in this actor's loop."""
        return self._in_handler and gevent.getcurrent() is not self._greenlet

    def run_open(self, fn: Callable[[], T]) -> tuple[T, bool]:
        """From a handler running in place: call `fn()` with this actor *open*, as between two
        messages, so that what reaches it meanwhile (another greenlet's message while `fn`
        switches out, or `fn`'s own nested asks) is handled in mailbox order instead of waiting
        for a handler that waits for it. Returns `fn`'s result and whether the handler may go
        on in place: True when the actor is idle again (it holds its mailbox once more), False
        when a message is queued or being handled (the handler must then leave what remains
        to a message of its own, queued behind those)."""
        if not self.handling_in_place():
            raise RuntimeError("run_open is for a handler running in its caller's greenlet")
        self._in_handler = False
        result = fn()  # raising, the actor stays open: ask_now's own exit expects no handler
        if self._idle():
            self._in_handler = True
            return result, True
        return result, False

    def _idle(self) -> bool:
        """Parked on an empty inbox with no handler running (or lazy and never needed yet)."""
        if self._in_handler or self.actor_stopped.is_set() or not self.actor_inbox.empty():
            return False
        glet = self._greenlet
        if glet is None:  # a lazy actor nobody had to queue for: nothing to keep in order
            return type(self.actor_inbox) is _WakingInbox
        return bool(glet)  # started and parked (not: about to run on_start, or dead)

    # -- used by kill(), join(), the supervision adapter -------------------------------------

    def request_kill(self, exc: ActorKilled) -> None:
        """Raise `exc` in the actor's loop (what `kill(ref)` does); returns at once."""
        if self._killed is not None or self._ended:
            return
        self._killed = exc
        glet = self._greenlet
        if glet is None:
            inbox = self.actor_inbox
            if type(inbox) is _WakingInbox:  # lazy, never started: start it to die
                inbox.sleeper = None
                self.wake_loop()
            return  # the loop sees the flag before on_start
        if not glet and not glet.dead:
            return  # not started yet: the loop sees the flag before on_start
        gevent.get_hub().loop.run_callback(self._deliver_kill, exc)

    def _deliver_kill(self, exc: ActorKilled) -> None:
        glet = self._greenlet
        if glet is None or glet.dead or self._in_teardown or glet is gevent.getcurrent():
            return  # the loop checks the flag itself on its next turn
        glet.throw(exc)

    def wait_ended(self, timeout: float | None) -> bool:
        """Wait (cooperatively) until the actor's loop has ended; whether it did in time."""
        if self._ended:
            return True
        if self._exited is None:
            self._exited = gevent.event.Event()
        return bool(self._exited.wait(timeout))

    def add_exit_callback(self, fn: Callable[[GeventActor], None]) -> None:
        """Call `fn(actor)` once when the loop has ended (at once if it has)."""
        if self._ended:
            fn(self)
            return
        if self._exit_callbacks is None:
            self._exit_callbacks = []
        self._exit_callbacks.append(fn)


def reply_of(ref: ActorRef[Any], message: Asks[T], timeout: float | None = None) -> T:
    """`ref.ask(message)` through the mailbox, its reply typed by the message (`Asks`).
    Pykka's `ask` answers `Any`; this is the one place that says which type it is."""
    reply: T = ref.ask(message, block=True, timeout=timeout)
    return reply


def _dead_exc_info(actor: GeventActor, why: str) -> OptExcInfo:
    return (ActorDeadError, ActorDeadError(f"{actor.actor_ref} {why}"), None)


# Classes known to be GeventActor subclasses. Pykka's `Actor` is an ABC, so `isinstance(x,
# GeventActor)` goes through `ABCMeta.__instancecheck__` (about half a microsecond; a child's
# start and end asked it seven times). GeventActor takes no virtual subclasses (`register`), so
# a class once found a subclass stays one: the set answers the same as `isinstance`.
_actor_classes: set[type] = set()


def is_gevent_actor(obj: object) -> TypeGuard[GeventActor]:
    """`isinstance(obj, GeventActor)`, cheaper for a class already seen."""
    cls = type(obj)
    if cls in _actor_classes:
        return True
    if issubclass(cls, GeventActor):
        _actor_classes.add(cls)
        return True
    return False


def actor_of(ref: ActorRef[Any] | GeventActor) -> GeventActor | None:
    """The live actor object behind `ref` (None once it is gone); TypeError for a non-gevent
    actor. Pykka has no public accessor: this is the one place that reads the ref's weakref."""
    if not isinstance(ref, ActorRef):  # a plain class: no ABC check
        if is_gevent_actor(ref):
            return ref
        msg = f"{type(ref).__name__} is neither an actor ref nor a GeventActor"
        raise TypeError(msg)
    actor = ref._actor_weakref()  # noqa: SLF001  (the pykka seam: no public accessor)
    if actor is None:
        return None
    if not is_gevent_actor(actor):
        msg = f"{ref} is not a GeventActor"
        raise TypeError(msg)
    return actor


def kill(ref: ActorRef[Any] | GeventActor, reason: str = "killed") -> None:
    """Stop one actor now, whatever it is doing; returns at once.

    Its current ask and all queued asks fail with `ActorDeadError`; `on_failure` runs with
    `ActorKilled` (a second kill interrupts it). Never use `gevent.kill` on an actor greenlet:
    it works too, but this one also works before the actor's greenlet first ran.
    """
    actor = actor_of(ref)
    if actor is not None:
        actor.request_kill(ActorKilled(f"{actor}: {reason}"))


def join(ref: ActorRef[Any] | GeventActor, timeout: float | None = None) -> bool:
    """Wait until the actor's loop has ended (teardown done); returns whether it has."""
    actor = actor_of(ref)
    if actor is None:
        return True
    return actor.wait_ended(timeout)


def live_actors() -> list[ActorRef[Any]]:
    """Refs of our actors whose loop has not ended, in start order."""
    return [actor.actor_ref for actor in _live.values()]


def live_count() -> int:
    """How many of our actors are live; O(1)."""
    return len(_live)


def stop_all(timeout: float | None = None, *, refs: Iterable[ActorRef[Any]] | None = None) -> int:
    """Stop our live actors (or `refs`) and wait for them; returns how many were asked.

    Stop messages go out newest first (Pykka's LIFO order), so each actor finds itself at the
    end of Pykka's registry list when it unregisters: O(1) each, where `ActorRegistry.stop_all`
    scans the list (O(N^2) in all) and even removing from its front moves the whole list.
    Queued messages are processed first, as with `ActorRef.stop()`. Raises `pykka.Timeout`
    if `timeout` passes first.
    """
    if refs is None:
        actors = list(reversed(_live.values()))
    else:
        actors = [a for a in (actor_of(r) for r in refs) if a is not None]
    stop = _ActorStop
    for actor in actors:
        if not actor.actor_stopped.is_set():
            actor.actor_inbox.put(Envelope(stop()))
    deadline = None if timeout is None else time.monotonic() + timeout
    for actor in actors:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not actor.wait_ended(remaining):
            msg = f"{timeout} seconds (stopping {actor})"
            raise Timeout(msg)
    return len(actors)


def freeze_gc() -> None:
    """Move everything alive now out of the cyclic GC's reach (`gc.freeze()`).

    With ~10,000 live actors a full collection pauses the hub for tens of ms; call this after a
    burst of starts. Frozen objects are still freed by reference counting, only cycles among
    them are never collected; `gc.unfreeze()` undoes it.
    """
    gc.freeze()
