"""Start an actor and keep its object: the runtime's own handles live in the same thread as
their actors and read plain state (status, counters) without a mailbox round trip."""

from __future__ import annotations

from typing import TypeVar

from pykka import ActorRef

from actors.gevent_actor import GeventActor

__all__ = ["start_local"]

A = TypeVar("A", bound=GeventActor)


def start_local(cls: type[A], *args: object, **kwargs: object) -> tuple[A, ActorRef[A]]:
    """Start a `GeventActor` subclass; its object and its ref."""
    actor = cls.start_object(*args, **kwargs)
    return actor, actor.actor_ref
