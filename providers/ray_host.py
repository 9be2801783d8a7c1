"""`ChildHost`: the long-lived Ray actor that hosts many in-process children.

A host composes its own runtime (on a `SessionStore` in a directory every host can reach) and
runs children on it: that half is `providers.ray_runtime.HostedRuntime`, built by the factory
the face hands down. This module is the actor half: threads, command order, incarnations and
the event stream. It does not import Ray: the provider
(`providers.ray`) wraps `ChildHost` with `ray.remote(...)`, so the host logic is plain Python.

Threads. Ray calls actor methods on its own threads; our runtime lives on a gevent hub. The host
runs one dedicated hub thread (`HubThread`) and every method only *enqueues* work for it: the
queue is a deque plus a libev/libuv async watcher, whose `send()` is the one thread-safe way to
wake a gevent loop from another thread. No method waits for a child: outcomes come back as
events in one ordered stream per host, which the provider long-polls (`poll`).

Ordering. Control commands arrive in numbered batches (`submit(incarnation, seq, commands)`);
Ray does not promise execution order on a threaded actor, so the host re-orders batches by
`seq` before they reach the hub. On the hub, commands for one run are chained (a run's steer,
cancel or dispose waits for its start), so one run sees its commands in submission order.

Incarnations. Each construction draws a fresh `incarnation` token. After Ray restarts a dead
host, the provider sees a new token and knows that every run of the old one is gone; batches
addressed to an old incarnation are dropped.
"""

from __future__ import annotations

import collections
import os
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import gevent
from gevent.event import Event as GEvent

from providers.ray_runtime import HostConfig, HostedRuntime, HostSetup
from supervision.group import TaskGroup

T = TypeVar("T")

__all__ = ["ChildHost", "HubThread"]


class HubThread:
    """A native thread running a gevent hub, fed from other threads."""

    def __init__(self, name: str = "subagent-hub") -> None:
        self._jobs: collections.deque[tuple[Callable[[], Any], Any]] = collections.deque()
        self._started = threading.Event()
        self._stopped = threading.Event()
        self._async: Any = None
        self._stop: GEvent | None = None
        # Every greenlet on this hub: the jobs and what they spawn; `stop` kills and joins them.
        self._tasks = TaskGroup(name)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._started.wait()

    def _main(self) -> None:
        hub = gevent.get_hub()
        self._async = hub.loop.async_()
        self._async.start(self._drain)
        self._stop = GEvent()
        self._started.set()
        try:
            self._stop.wait()
        finally:
            self._async.stop()
            self._async.close()
            self._stopped.set()

    def call_soon(self, fn: Callable[[], Any]) -> None:
        """Run `fn` in a new greenlet on the hub (from any thread)."""
        self._jobs.append((fn, None))
        self._async.send()

    def call(self, fn: Callable[[], T], timeout: float | None = None) -> T:
        """Run `fn` on the hub and wait (this thread) for its value. Never call on the hub."""
        done = threading.Event()
        box: list[Any] = []

        def job() -> None:
            try:
                box.append((True, fn()))
            except BaseException as exc:
                box.append((False, exc))
            finally:
                done.set()

        self.call_soon(job)
        if not done.wait(timeout):
            raise TimeoutError("the hub did not answer in time")
        ok, outcome = box[0]
        if not ok:
            raise outcome
        value: T = outcome
        return value

    def _drain(self) -> None:
        # Runs in the hub itself: only schedule, never block.
        jobs = self._jobs
        while jobs:
            fn, _ = jobs.popleft()
            self._tasks.spawn(fn)

    def stop(self) -> None:
        def stop() -> None:
            assert self._stop is not None
            self._tasks.close(timeout=5)
            self._stop.set()

        self.call_soon(stop)
        self._stopped.wait(10)


class ChildHost:
    """Ray actor body (wrapped with `ray.remote` by the provider). Methods are thread-safe."""

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.incarnation = secrets.token_hex(8)
        self._lock = threading.Condition()
        self._events: list[dict[str, Any]] = []
        self._base = 0  # stream index of self._events[0]
        self._next_seq = 0
        self._pending_batches: dict[int, list[Sequence[Any]]] = {}
        self._hub = HubThread()
        # The runtime and its children: built on, and driven from, the hub thread.
        self._runtime: HostedRuntime = self._hub.call(lambda: HostedRuntime(config, self._post))

    # -- Ray methods (any thread) -------------------------------------------------------------

    def ready(self) -> dict[str, Any]:
        live = self._runtime.live
        return {"incarnation": self.incarnation, "pid": os.getpid(), "live": live}

    def run_setup(self, setup: HostSetup) -> None:
        """Run another setup on the live runtime (re-script the model, add tools)."""
        runtime = self._runtime
        self._hub.call(lambda: runtime.run_setup(setup))

    def submit(self, incarnation: str, seq: int, commands: list[Sequence[Any]]) -> bool:
        """Queue one numbered batch of commands; batches run in `seq` order. False if stale."""
        if incarnation != self.incarnation:
            return False
        with self._lock:
            self._pending_batches[seq] = commands
            ready: list[Sequence[Any]] = []
            while self._next_seq in self._pending_batches:
                ready.extend(self._pending_batches.pop(self._next_seq))
                self._next_seq += 1
        if ready:
            runtime = self._runtime
            self._hub.call_soon(lambda: runtime.dispatch(ready))
        return True

    def poll(self, incarnation: str, cursor: int, timeout: float) -> dict[str, Any]:
        """Events from `cursor` on (acknowledging everything before it); waits up to `timeout`."""
        if incarnation != self.incarnation:
            return {"incarnation": self.incarnation, "events": [], "cursor": 0}
        with self._lock:
            if cursor > self._base:
                drop = min(cursor - self._base, len(self._events))
                del self._events[:drop]
                self._base += drop
            if not self._events:
                self._lock.wait(timeout)
            events = self._events[: self.config.max_batch]
            return {
                "incarnation": self.incarnation,
                "events": list(events),
                "cursor": self._base + len(events),
            }

    def close(self) -> None:
        """Close every child and the runtime, then stop the hub thread."""
        try:
            self._hub.call(self._runtime.close, timeout=60)
        finally:
            self._hub.stop()

    # -- events (hub thread) ------------------------------------------------------------------

    def _post(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._events.append(event)
            self._lock.notify_all()
