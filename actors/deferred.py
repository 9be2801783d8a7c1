"""Replies that are not ready when the handler returns.

An actor handler must stay short, yet some answers only exist later (a steer is answered when a
step boundary admits it). A handler returns a `Deferred`; `GeventFuture.set()` recognises it and
binds the asker's future to it, so `ref.ask(msg)` resolves when the deferred does while the
mailbox goes on serving other messages. `Deferred` is the runtime's one settle-once primitive
(defined beside `GeventFuture`, which it extends).
"""

from __future__ import annotations

import logging

from actors.gevent_actor import Deferred

__all__ = ["Deferred", "rejected"]

log = logging.getLogger(__name__)


def rejected(exc: BaseException) -> Deferred[object]:
    """A reply that fails the asker with `exc`, and that a teller never sees.

    Handlers return this instead of raising for a message they refuse: in Pykka an exception
    from a told message stops the actor, and one bad `tell` must not take a run down with it.
    """
    log.warning("refused a message: %s", exc)
    deferred: Deferred[object] = Deferred()
    deferred.reject(exc)
    return deferred
