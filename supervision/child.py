"""What a supervisor needs from a child: a small protocol, so `supervision/` never imports actors.

An actor adapter (in `actors/`) and a greenlet adapter (here) both satisfy it.
"""

from __future__ import annotations

import logging
import traceback as tb
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = ["Child", "Exit", "ExitKind", "ExitNotices", "notify"]

ExitKind = Literal["normal", "cancelled", "crashed"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Exit:
    """A death notice: why a child ended. Delivered exactly once to each watcher."""

    kind: ExitKind
    exc_type: str | None = None
    message: str | None = None
    traceback: str | None = None

    @classmethod
    def crashed(cls, exc: BaseException) -> Exit:
        return cls(
            kind="crashed",
            exc_type=type(exc).__qualname__,
            message=str(exc),
            traceback="".join(tb.format_exception(exc)),
        )

    @property
    def abnormal(self) -> bool:
        """Whether a `transient` child should be restarted after this exit."""
        return self.kind == "crashed"


@runtime_checkable
class Child(Protocol):
    """A running thing a supervisor owns."""

    @property
    def name(self) -> str: ...

    def request_stop(self, reason: object = None) -> None:
        """Ask the child to stop cooperatively; returns at once."""

    def kill(self) -> None:
        """Stop it now; used when the shutdown grace has passed. Returns at once."""

    def join(self, timeout: float | None = None) -> bool:
        """Wait (cooperatively) until the child has ended; returns whether it did."""
        ...

    def add_exit_listener(self, fn: Callable[[Exit], None]) -> None:
        """Call `fn(exit)` exactly once when the child ends (at once if it already has)."""


class ExitNotices:
    """Exactly-once death notices for one child.

    A listener added before the exit is called when it comes; one added after is called at
    once. Each runs in order; one that raises is logged and the others still run.
    """

    __slots__ = ("_listeners", "exit")

    def __init__(self) -> None:
        self._listeners: list[Callable[[Exit], None]] = []
        self.exit: Exit | None = None

    def add(self, fn: Callable[[Exit], None]) -> None:
        if not callable(fn):
            raise TypeError(f"listener must be callable, got {type(fn).__name__}")
        if self.exit is not None:
            notify(fn, self.exit)
        else:
            self._listeners.append(fn)

    def deliver(self, exit: Exit) -> bool:
        """Record the exit and tell every listener; False (and nothing done) the second time."""
        if self.exit is not None:
            return False
        self.exit = exit
        listeners, self._listeners = self._listeners, []
        for fn in listeners:
            notify(fn, exit)
        return True


def notify(fn: Callable[[Exit], None], exit: Exit) -> None:
    """Call one exit listener; one that raises is logged, never propagated."""
    try:
        fn(exit)
    except Exception:
        log.exception("exit listener %r raised; the other listeners still run", fn)
