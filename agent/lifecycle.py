"""Who wants to hear when an agent of a runtime is published, closing or cancelled.

Upper layers (the subagent service, tool installers, a Ray host) observe the agents of a
runtime without the agent layer knowing them. Each registration is a method call that returns
its remover, so no one appends to a list another object owns. Listeners are held in tuples that
a registration replaces: telling them iterates a snapshot at no copying cost, and a listener that
registers or removes one while being told changes the next notice, never the current one. A
listener that raises propagates to the caller, as the caller's own code would; one that switches
out while its teller is killed still lets the others hear (`supervision.notify`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from supervision.notify import call_rest

__all__ = ["AgentLifecycle", "AgentListener", "CancelListener"]

# The agent type lives in an upper layer (`actors.agents.Agent`); listeners receive it.
AgentListener = Callable[[Any], None]
CancelListener = Callable[[Any, object], None]
F = TypeVar("F")


class AgentLifecycle:
    """The lifecycle listeners of one runtime's agents (`ctx.lifecycle`)."""

    __slots__ = ("_cancelled", "_closing", "_published")

    def __init__(self) -> None:
        self._published: tuple[AgentListener, ...] = ()
        self._closing: tuple[AgentListener, ...] = ()
        self._cancelled: tuple[CancelListener, ...] = ()

    # -- registering -----------------------------------------------------------------------------

    def on_published(self, fn: AgentListener) -> Callable[[], None]:
        """Call `fn(agent)` whenever an agent is published, before its first turn; returns the
        remover."""
        _check(fn)
        self._published = (*self._published, fn)
        removed = False

        def remove() -> None:
            nonlocal removed
            if not removed:
                removed = True
                self._published = _without(self._published, fn)

        return remove

    def on_closing(self, fn: AgentListener) -> Callable[[], None]:
        """Call `fn(agent)` before an agent closes (its children go first); returns the remover."""
        _check(fn)
        self._closing = (*self._closing, fn)
        removed = False

        def remove() -> None:
            nonlocal removed
            if not removed:
                removed = True
                self._closing = _without(self._closing, fn)

        return remove

    def on_cancelled(self, fn: CancelListener) -> Callable[[], None]:
        """Call `fn(agent, cause)` when an agent's running turn is cancelled; returns the
        remover."""
        _check(fn)
        self._cancelled = (*self._cancelled, fn)
        removed = False

        def remove() -> None:
            nonlocal removed
            if not removed:
                removed = True
                self._cancelled = _without(self._cancelled, fn)

        return remove

    # -- telling (called by the agent's own code) ------------------------------------------------

    def published(self, agent: object) -> None:
        _tell(self._published, (agent,))

    def closing(self, agent: object) -> None:
        _tell(self._closing, (agent,))

    def cancelled(self, agent: object, cause: object) -> None:
        _tell(self._cancelled, (agent, cause))


def _tell(listeners: tuple[Callable[..., None], ...], args: tuple[object, ...]) -> None:
    """Call each listener; one that raises stops the round (the caller's own error). A kill of
    the teller while one switched out still lets the others hear, then goes on (`call_rest`)."""
    rest = iter(listeners)
    try:
        for fn in rest:
            fn(*args)
    except Exception:
        raise
    except BaseException:
        call_rest(rest, lambda fn: fn(*args))
        raise


def _check(fn: object) -> None:
    if not callable(fn):
        raise TypeError(f"listener must be callable, got {type(fn).__name__}")


def _without(listeners: tuple[F, ...], fn: F) -> tuple[F, ...]:
    """`listeners` less one registration of `fn`."""
    for i, registered in enumerate(listeners):
        if registered is fn:
            return listeners[:i] + listeners[i + 1 :]
    return listeners
