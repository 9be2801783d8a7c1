"""Run a blocking call in the hub's thread pool, so every other greenlet keeps running.

Two things gevent's `threadpool.apply` does not do for us: the thread's exception comes back as
a value and is re-raised here (gevent would also print it as an unhandled error), and a caller
killed while the thread works still waits for the thread before unwinding, so a lock or a file
descriptor it holds is not released while the thread is using it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypeVar

import gevent

__all__ = ["offload"]

T = TypeVar("T")


def offload(fn: Callable[..., T], *args: object) -> T:
    def call() -> tuple[bool, Any]:
        try:
            return True, fn(*args)
        except BaseException as exc:  # carried back to the caller
            return False, exc

    pending = gevent.get_hub().threadpool.spawn(call)
    try:
        ok, value = pending.get()
    except BaseException:
        while not pending.ready():
            with contextlib.suppress(BaseException):
                pending.wait()
        raise
    if ok:
        result: T = value
        return result
    raise value
