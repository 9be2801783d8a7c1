"""Actors: Pykka on gevent, and every actor of the runtime (agents, runs, the registry)."""

from actors.gevent_actor import ActorKilled, GeventActor, GeventFuture
from actors.supervised import ActorChild, spawn_actor_child

__all__ = ["ActorChild", "ActorKilled", "GeventActor", "GeventFuture", "spawn_actor_child"]
