"""What a supervisor needs from a child: a small protocol, so `supervision/` never imports actors.

An actor adapter (in `actors/`) and a greenlet adapter (here) both satisfy it.
"""

from __future__ import annotations

import traceback as tb
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = ["Child", "Exit", "ExitKind"]

ExitKind = Literal["normal", "cancelled", "crashed"]


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
