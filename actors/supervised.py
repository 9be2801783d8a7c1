"""A GeventActor as a `supervision.child.Child`, so a Supervisor can own it.

Exit kinds:
- *crashed*: the actor died of an exception (on_start, a told handler, on_stop, on_failure) or
  was killed (`kill()`, or a foreign `gevent.kill` of its greenlet);
- *cancelled*: it stopped after `request_stop()`;
- *normal*: it stopped itself (or someone else stopped it through its ref).

The exit is computed once, when the actor loop has ended (pending asks already failed), and
each listener gets it exactly once, in the hub, so listeners must not block.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

from pykka import ActorRef

from actors import gevent_actor
from actors.gevent_actor import ActorKilled, GeventActor
from supervision.child import Exit, ExitNotices

__all__ = ["ActorChild", "spawn_actor_child"]

log = logging.getLogger(__name__)

_names = itertools.count(1)


class ActorChild(ExitNotices):
    """Wraps a started GeventActor's ref; satisfies `supervision.child.Child`.

    It is its own exit-notice list (`ExitNotices`: `exit`, and `add` as `add_exit_listener`):
    one object per supervised actor, not two (one is made per child agent's run)."""

    __slots__ = ("_actor", "_stop_message", "_stop_requested", "name", "ref")

    def __init__(
        self, ref: ActorRef[Any], name: str | None = None, *, stop_message: object = None
    ) -> None:
        """`stop_message`, when given, is told instead of Pykka's stop to ask the actor to
        stop (e.g. a run's `DisposeRun`, so the child closes cleanly before it stops)."""
        try:
            actor = gevent_actor.actor_of(ref)  # TypeError for any other kind of actor
        except TypeError:
            actor = None
        if actor is None:
            msg = f"{ref} is not a live GeventActor"
            raise TypeError(msg)
        self._listeners = []
        self.exit = None
        self.ref = ref
        self.name: str = name or f"{ref.actor_class.__name__}-{next(_names)}"
        # A strong reference: the exit must be readable after the actor object would be freed.
        self._actor = actor
        self._stop_requested = False
        self._stop_message = stop_message
        actor.add_exit_callback(self)  # `__call__`: no bound method kept per child

    def __repr__(self) -> str:
        exit = self.exit
        state = exit.kind if exit else "running"
        return f"<ActorChild {self.name!r} {state}>"

    def request_stop(self, reason: object = None) -> None:
        """Send Pykka's stop message: queued messages are handled first, then on_stop runs."""
        if self.exit is not None or self._stop_requested:
            return
        self._stop_requested = True
        log.debug("stop requested for %s: %s", self.name, reason)
        if self.ref.is_alive():
            if self._stop_message is not None:
                self.ref.tell(self._stop_message)
            else:
                self.ref.stop(block=False)

    def kill(self) -> None:
        gevent_actor.kill(self._actor, reason=f"killed as child {self.name}")

    def join(self, timeout: float | None = None) -> bool:
        return gevent_actor.join(self._actor, timeout)

    add_exit_listener = ExitNotices.add

    def __call__(self, actor: GeventActor) -> None:
        """The actor's exit callback (see `__init__`)."""
        self._on_actor_exit(actor)

    def _on_actor_exit(self, actor: GeventActor) -> None:
        crash = actor.crash
        if self._stop_requested and (crash is None or isinstance(crash, ActorKilled)):
            # A stop was asked for; a kill after the grace only finished it. Same rule as the
            # greenlet child: not a crash, so a transient child is not restarted for it.
            exit = Exit("cancelled")
        elif crash is not None:
            exit = Exit.crashed(crash)
        elif self._stop_requested:
            exit = Exit("cancelled")
        else:
            exit = Exit("normal")
        self._actor = actor
        self.deliver(exit)


def spawn_actor_child(
    actor_class: type[GeventActor], *args: object, name: str | None = None, **kwargs: object
) -> ActorChild:
    """Start `actor_class(*args, **kwargs)` and wrap it; usable as a ChildSpec start function."""
    return ActorChild(actor_class.start(*args, **kwargs), name=name)
