"""An OS signal watched on the gevent hub for a while, and the process's own handling after.

gevent's `signal_handler` runs a callback on the hub when the signal arrives; cancelling it
stops libev's watcher, and libev then resets the signal to the system default, not to what it
was before. For SIGINT that default kills the process outright: after a command had watched
Ctrl-C once, the next one left no `KeyboardInterrupt`, no clean-up and no last word (the exit's
wait for spans, the external agents' reaping). `SignalWatch.cancel` puts back the Python
handler the watch found.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import gevent

__all__ = ["SignalWatch"]


class SignalWatch:
    """`handler(*args)` on the hub on each `signum` until `cancel`."""

    def __init__(self, signum: int, handler: Callable[..., Any], *args: object) -> None:
        self.signum = signum
        self._before = signal.getsignal(signum)
        self._watcher = gevent.signal_handler(signum, handler, *args)

    def cancel(self) -> None:
        """Stop watching, and give the signal back the handling it had (idempotent)."""
        self._watcher.cancel()
        before, self._before = self._before, None
        if before is not None:
            signal.signal(self.signum, before)
