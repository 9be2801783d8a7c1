"""Start an actor and keep its object: the runtime's own handles live in the same thread as
their actors and read plain state (status, counters) without a mailbox round trip."""

from __future__ import annotations

from typing import TypeVar

from pykka import Actor, ActorRef

__all__ = ["start_local"]

A = TypeVar("A", bound=Actor)


def start_local(cls: type[A], *args: object, **kwargs: object) -> tuple[A, ActorRef[A]]:
    ref = cls.start(*args, **kwargs)
    actor = ref._actor_weakref()
    assert actor is not None
    return actor, ref
