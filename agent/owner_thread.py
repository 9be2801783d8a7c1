"""The thread a runtime belongs to, checked where a call could start work on another.

A runtime runs as greenlets on the gevent hub of the thread that made it. Called from another
thread, a start made its child's actors on that thread's hub, where nothing the runtime owns
can reach them: the call seemed to work, and the runtime's `close()` then waited for them for
ever. The entry points that make or end work, and the handles' own methods (an agent's
`send`, a run's `steer`), check the caller's thread first and fail loud. In the agent layer so
that the handles of every layer above reach it through their context (`AgentContext.owner`).
"""

from __future__ import annotations

import threading

from subagent.errors import SubagentError

__all__ = ["OwnerThread"]

_ident = threading.get_ident


class OwnerThread:
    """The thread that made an object; `check()` refuses a call from any other."""

    __slots__ = ("ident", "name")

    def __init__(self) -> None:
        self.ident = _ident()
        self.name = threading.current_thread().name

    def check(self) -> None:
        if _ident() != self.ident:
            raise SubagentError(
                "WRONG_THREAD",
                f"the runtime belongs to thread {self.name!r}; call it from that thread "
                f"(not {threading.current_thread().name!r})",
            )
