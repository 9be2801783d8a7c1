"""Cancellation as a value: one `AbortSignal` is the single channel before and after a child exists.

An `AbortController` owns the right to abort; the `AbortSignal` it hands out may only be observed.
This split (borrowed from the web platform, as the seed does) lets a parent give a child the power
to notice cancellation without the power to cause it.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import gevent
from gevent.hub import Waiter

from supervision.errors import AbortError
from supervision.notify import call_rest

__all__ = ["AbortController", "AbortError", "AbortSignal"]

log = logging.getLogger(__name__)

Listener = Callable[[Any], None]
_listener_keys = itertools.count()


class AbortSignal:
    """Observes one cancellation. Listeners run once, in registration order, on the aborting
    greenlet; one that raises is logged and the rest still run."""

    __slots__ = ("__weakref__", "_aborted", "_listeners", "_reason", "_waiters")

    def __init__(self) -> None:
        self._aborted = False
        self._reason: object = None
        self._listeners: dict[int, Listener] | None = {}
        # Greenlets blocked in `wait`, each by its own Waiter: released from the hub on abort.
        self._waiters: set[Waiter[None]] | None = None

    def __repr__(self) -> str:
        return f"<AbortSignal aborted={self._aborted} reason={self._reason!r}>"

    if TYPE_CHECKING:

        @property
        def aborted(self) -> bool: ...

        @property
        def reason(self) -> object: ...

    else:
        # Read-only properties whose getter is C (`attrgetter`): read several times a step by
        # every child (the loop, its model, its tools), without a Python frame each.
        aborted = property(attrgetter("_aborted"), doc="Whether the signal has aborted.")
        reason = property(attrgetter("_reason"), doc="Why it aborted (None until it has).")

    def add_listener(self, fn: Listener) -> Callable[[], None]:
        """Call `fn(reason)` once when the signal aborts (at once if it already has).

        Returns a function that removes the listener; calling it twice is harmless.
        """
        if not callable(fn):
            raise TypeError(f"listener must be callable, got {type(fn).__name__}")
        if self._aborted:
            _call_listener(fn, self._reason)
            return _noop
        listeners = self._listeners
        assert listeners is not None
        key = next(_listener_keys)
        listeners[key] = fn

        def remove() -> None:
            if self._listeners is not None:
                self._listeners.pop(key, None)

        return remove

    def raise_if_aborted(self) -> None:
        if self._aborted:
            reason = self._reason
            if isinstance(reason, BaseException):
                raise reason
            raise AbortError(reason=reason)

    def wait(self, timeout: float | None = None) -> bool:
        """Block this greenlet until the signal aborts; returns whether it did."""
        if self._aborted:
            return True
        # A bare Waiter, released by a loop timer or by `_abort` (through a hub callback), and
        # unregistered whichever way the wait ends. gevent's timed `Event.wait` throws a
        # `Timeout` into the waiting greenlet (an exception per wait, ~3x the CPU of a sleep),
        # and even its untimed links cost a notifier per wake-up; a scripted model waits like
        # this on every model call.
        hub = gevent.get_hub()
        waiter: Waiter[None] = Waiter(hub)
        waiters = self._waiters
        if waiters is None:
            waiters = self._waiters = set()
        waiters.add(waiter)
        if timeout is None:
            try:
                waiter.get()
            finally:
                waiters.discard(waiter)
            return self._aborted
        timer = hub.loop.timer(timeout)
        timer.start(waiter.switch, None)
        try:
            waiter.get()
        finally:
            timer.close()
            waiters.discard(waiter)
        return self._aborted

    @classmethod
    def with_trigger(cls) -> tuple[AbortSignal, Callable[[object], None]]:
        """A new signal and the one function that aborts it (what `AbortController` holds)."""
        signal = cls()
        return signal, signal._abort

    def _abort(self, reason: object) -> None:
        if self._aborted:
            return
        self._aborted = True
        self._reason = AbortError() if reason is None else reason
        listeners, self._listeners = self._listeners, None
        waiters, self._waiters = self._waiters, None
        if waiters:
            run_callback = gevent.get_hub().loop.run_callback
            for waiter in waiters:
                run_callback(waiter.switch, None)
        if listeners:
            reason = self._reason
            rest = iter(listeners.values())
            try:
                for fn in rest:
                    _call_listener(fn, reason)
            except BaseException:  # killed while a listener switched out: the others still hear
                call_rest(rest, lambda fn: fn(reason))
                raise

    @staticmethod
    def any_of(*signals: AbortSignal) -> AbortSignal:
        """A signal that aborts with the reason of the first of `signals` to abort."""
        for s in signals:
            if not isinstance(s, AbortSignal):
                raise TypeError(f"any_of takes AbortSignal, got {type(s).__name__}")
        combined = AbortSignal()
        for s in signals:
            if s.aborted:
                combined._abort(s.reason)
                return combined
        removers: list[Callable[[], None]] = []

        def fire(reason: object) -> None:
            for remove in removers:
                remove()
            combined._abort(reason)

        for s in signals:
            removers.append(s.add_listener(fire))
        return combined

    @staticmethod
    def timeout(seconds: float) -> AbortSignal:
        """A signal that aborts with a `TimeoutError` after `seconds`.

        A gevent timer waits, not a parked greenlet; when it fires, a fresh greenlet aborts the
        signal, so listeners run in a greenlet (where they may block) and never in the hub.
        """
        if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
            raise TypeError("seconds must be a number")
        if seconds < 0 or seconds != seconds or seconds == float("inf"):
            raise ValueError("seconds must be finite and >= 0")
        signal = AbortSignal()
        timer = gevent.get_hub().loop.timer(seconds)
        timer.start(gevent.spawn, signal._abort, TimeoutError(f"timed out after {seconds} s"))
        # Keep the watcher alive as long as the signal; stop it once the signal aborts.
        signal.add_listener(lambda _reason: timer.close())
        return signal

    @staticmethod
    def never() -> AbortSignal:
        """A signal nobody can abort: for callers that have no cancellation to offer."""
        return AbortSignal()


class AbortController:
    """The owner's side of a signal."""

    __slots__ = ("_abort", "signal")

    def __init__(self) -> None:
        # Only the controller that made the signal holds its trigger.
        self.signal, self._abort = AbortSignal.with_trigger()

    def abort(self, reason: object = None) -> None:
        """Abort once; later calls are ignored (the first reason wins)."""
        self._abort(reason)


def _call_listener(fn: Listener, reason: object) -> None:
    try:
        fn(reason)
    except Exception:
        log.exception("abort listener %r raised; the other listeners still run", fn)


def _noop() -> None:
    return None
