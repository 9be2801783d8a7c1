"""Replies that are not ready when the handler returns.

An actor handler must stay short, yet some answers only exist later (a steer is answered when a
step boundary admits it). A handler returns a `Deferred`; `GeventFuture.set()` recognises it and
binds the asker's future to it, so `ref.ask(msg)` resolves when the deferred does while the
mailbox goes on serving other messages.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pykka import Future

__all__ = ["Deferred", "rejected"]

log = logging.getLogger(__name__)


class Deferred:
    __slots__ = ("_bound", "_outcome")

    def __init__(self) -> None:
        self._bound: list[Future[Any]] = []
        # (True, value) or (False, exc_info) once settled.
        self._outcome: tuple[bool, Any] | None = None

    @property
    def settled(self) -> bool:
        return self._outcome is not None

    def resolve(self, value: Any = None) -> None:
        if self._outcome is not None:
            return
        self._outcome = (True, value)
        for future in self._bound:
            future.set(value)
        self._bound.clear()

    def reject(self, exc: BaseException) -> None:
        if self._outcome is not None:
            return
        exc_info = (type(exc), exc, exc.__traceback__)
        self._outcome = (False, exc_info)
        for future in self._bound:
            future.set_exception(exc_info)
        self._bound.clear()

    def bind(self, future: Future[Any]) -> None:
        """Settle `future` with this deferred's outcome, now or when it arrives."""
        outcome = self._outcome
        if outcome is None:
            self._bound.append(future)
        elif outcome[0]:
            future.set(outcome[1])
        else:
            future.set_exception(outcome[1])

    def reject_current(self) -> None:
        """Reject with the exception being handled."""
        exc = sys.exc_info()[1]
        if exc is not None:
            self.reject(exc)


def rejected(exc: BaseException) -> Deferred:
    """A reply that fails the asker with `exc`, and that a teller never sees.

    Handlers return this instead of raising for a message they refuse: in Pykka an exception
    from a told message stops the actor, and one bad `tell` must not take a run down with it.
    """
    log.warning("refused a message: %s", exc)
    deferred = Deferred()
    deferred.reject(exc)
    return deferred
