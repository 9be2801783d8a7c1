"""A plain greenlet as a supervised `Child`.

The function receives an `AbortSignal` as its first argument. `request_stop` aborts that signal and
nothing more: the function decides when to return, which is what makes cancellation cooperative.
`kill` is the fallback once the grace has passed: it raises `ChildKilled` inside the greenlet.

`ChildKilled` (supervision/errors.py) is a `Cancelled` and a `GreenletExit`, never an
`Exception`, for two reasons: a child's
`except Exception:` cannot swallow it by accident, and gevent treats it as an ordinary way for a
greenlet to end rather than an error to print. Any `GreenletExit` ending the function (ours or a
foreign `gevent.kill`) therefore counts as *cancelled*, never as a crash.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from typing import Any

from gevent import Greenlet, GreenletExit
from gevent.event import Event

from supervision.child import Exit, ExitNotices
from supervision.errors import AbortError, Cancelled, ChildKilled
from supervision.signal import AbortController, AbortSignal

__all__ = ["ChildKilled", "GreenletChild", "spawn_child"]

log = logging.getLogger(__name__)

ExitListener = Callable[[Exit], None]
_names = itertools.count(1)


class GreenletChild:
    """Runs `fn(signal, *args, **kwargs)` in its own greenlet once `start()` is called.

    Exit kinds: the function returned -> *normal*; it was killed, or it ended in any way but a
    foreign exception after `request_stop` -> *cancelled*; it raised -> *crashed*. Exit listeners
    run in the hub right after the greenlet has died, so they must not block.
    """

    __slots__ = (
        "_args",
        "_controller",
        "_ended",
        "_exit",
        "_fn",
        "_greenlet",
        "_kwargs",
        "_notices",
        "_stop_requested",
        "name",
        "value",
    )

    def __init__(
        self,
        fn: Callable[..., Any],
        /,
        *args: object,
        name: str | None = None,
        **kwargs: object,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        self.name: str = name or f"{getattr(fn, '__name__', 'child')}-{next(_names)}"
        self.value: Any = None
        self._fn = fn
        self._args = args
        self._kwargs = kwargs
        self._controller = AbortController()
        self._stop_requested = False
        self._exit: Exit | None = None
        self._notices = ExitNotices()
        self._greenlet: Greenlet | None = None
        self._ended: Event | None = None

    def __repr__(self) -> str:
        state = "new" if self._greenlet is None else (self._exit.kind if self._exit else "running")
        return f"<GreenletChild {self.name!r} {state}>"

    @property
    def signal(self) -> AbortSignal:
        """The signal the function receives; aborted by `request_stop` and by `kill`."""
        return self._controller.signal

    @property
    def exit(self) -> Exit | None:
        """Why the child ended, or None while it has not."""
        return self._exit

    @property
    def dead(self) -> bool:
        """True once the greenlet is gone and the exit listeners have run."""
        return self._exit is not None

    def start(self) -> GreenletChild:
        """Schedule the greenlet (it first runs at the hub's next turn); returns self."""
        if self._greenlet is not None:
            raise RuntimeError(f"{self.name} was already started")
        g = Greenlet(self._run)
        g.rawlink(self._on_dead)
        self._greenlet = g
        g.start()
        return self

    def request_stop(self, reason: object = None) -> None:
        if self._exit is not None:
            return
        self._stop_requested = True
        self._controller.abort(reason)

    def kill(self) -> None:
        """Raise `ChildKilled` in the greenlet; returns at once (join to wait for the end)."""
        if self._exit is not None:
            return
        self._stop_requested = True
        self._controller.abort(AbortError("killed"))
        if self._greenlet is None:
            # Never started: it never will be, and it ends now.
            self._finish(Exit("cancelled", "ChildKilled", "killed before start"))
            return
        self._greenlet.kill(ChildKilled, block=False)

    def join(self, timeout: float | None = None) -> bool:
        if self._exit is not None:
            return True
        if self._greenlet is None:
            raise RuntimeError(f"{self.name} was never started")
        if self._ended is None:
            # Made only for joiners; set after the exit listeners ran, which a plain
            # `Greenlet.join` does not promise (a greenlet killed before it ran is dead at once).
            self._ended = Event()
        return bool(self._ended.wait(timeout))

    def add_exit_listener(self, fn: ExitListener) -> None:
        self._notices.add(fn)

    # -- inside the greenlet ------------------------------------------------------------------

    def _run(self) -> Exit:
        signal = self._controller.signal
        try:
            self.value = self._fn(signal, *self._args, **self._kwargs)
        except GreenletExit as exc:
            return Exit("cancelled", type(exc).__qualname__, str(exc) or "killed")
        except (Cancelled, Exception) as exc:
            # A cancellation, or the stop's own reason, after a stop is how a stop ends.
            if self._stop_requested and (exc is signal.reason or isinstance(exc, Cancelled)):
                return Exit("cancelled", type(exc).__qualname__, str(exc))
            return Exit.crashed(exc)
        if self._stop_requested:
            return Exit("cancelled", message=_describe(signal.reason))
        return Exit("normal")

    # -- in the hub, once the greenlet is dead ------------------------------------------------

    def _on_dead(self, g: Greenlet) -> None:
        value = g.value
        if isinstance(value, Exit):
            exit = value
        elif isinstance(value, GreenletExit):  # killed before it first ran
            exit = Exit("cancelled", type(value).__qualname__, str(value) or "killed")
        elif g.exception is not None:  # SystemExit, KeyboardInterrupt: gevent re-raises them too
            exit = Exit.crashed(g.exception)
        else:
            exit = Exit("crashed", message="greenlet ended without an exit")
        self._finish(exit)

    def _finish(self, exit: Exit) -> None:
        if self._exit is not None:
            return
        self._exit = exit
        self._notices.deliver(exit)
        if self._ended is not None:
            self._ended.set()


def spawn_child(
    fn: Callable[..., Any], /, *args: object, name: str | None = None, **kwargs: object
) -> GreenletChild:
    """Start `fn(signal, *args, **kwargs)` as a `GreenletChild`: the usual `ChildSpec.start`."""
    return GreenletChild(fn, *args, name=name, **kwargs).start()


def _describe(reason: object) -> str:
    return str(reason) if isinstance(reason, BaseException) else repr(reason)
