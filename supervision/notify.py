"""Finishing a round of notices that its teller's death interrupted.

Listeners and done callbacks are called in the greenlet of whoever settles, aborts or cancels,
and that is often a caller's greenlet borrowed for an actor's handler (`ask_now`/`tell_now`).
Should a listener switch out (wait on an event, write to a pipe) and that greenlet be killed
meanwhile (a cancelled tool, a gevent `Timeout`), the kill comes out of the listener and would
skip every listener after it: an aborted signal whose other listeners never hear, a settled
future whose waiters are never woken. Each such loop hands what is left of its iterator to
`call_rest` and then lets the kill go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["call_rest"]

log = logging.getLogger(__name__)

F = TypeVar("F")


def call_rest(rest: Iterator[F], call: Callable[[F], object]) -> None:
    """`call(fn)` for every `fn` left in `rest`, each to the end: a failure (or a second kill)
    is logged and the next one still runs, since the first interruption is already on its
    way out of the caller."""
    for fn in rest:
        try:
            call(fn)
        except BaseException:
            log.exception("a notice after an interrupted round failed; the others still run")
