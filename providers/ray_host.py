"""`ChildHost`: the long-lived Ray actor that hosts many in-process children.

A host owns its own `Runtime` (on a `SessionStore` in a directory every host can reach) and runs
children with the in-process spawn machinery. This module does not import Ray: the provider
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
import logging
import os
import secrets
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gevent
from gevent.event import Event as GEvent

from agent import tracing
from agent.context import AgentContext
from agent.models.scripted import DEFAULT, ScriptedModel, Step
from agent.options import AgentOptions
from agent.store import MemoryStore, SessionStore
from providers.inprocess import SpawnProvider
from providers.local_run import LocalRun, clip_diagnostic, stop_reason_of
from subagent.descriptor import SubagentDescriptor, authoritative_descriptor
from subagent.errors import SubagentError
from subagent.types import (
    ERROR,
    MessageSource,
    SubagentContinuation,
    SubagentResult,
    SubagentResumeRequest,
    SubagentStartRequest,
    ToolRestriction,
)
from supervision.group import TaskGroup
from supervision.signal import AbortController

__all__ = [
    "RECOVERY_PROMPT",
    "ChildHost",
    "HostConfig",
    "HubThread",
    "ScriptedSetup",
    "result_from_json",
]

log = logging.getLogger(__name__)

RECOVERY_PROMPT = (
    "Your host process died and your previous turn was interrupted. Continue the task from where "
    "the conversation stands."
)


class HostRuntime(Protocol):
    """What a host needs of the runtime it composes (`subagent.runtime.Runtime` by default)."""

    @property
    def ctx(self) -> AgentContext: ...

    @property
    def store(self) -> SessionStore | MemoryStore: ...

    @property
    def scripted(self) -> ScriptedModel: ...

    def close(self) -> None: ...


HostSetup = Callable[[HostRuntime], None]


class RuntimeFactory(Protocol):
    """Builds the runtime a host composes, on the host's session store.

    Handed down by the face (`subagent.RayConfig` names `subagent.Runtime`): a provider sits
    below the runtime wiring in the layers, so it neither imports nor names it. Must be
    picklable (a module-level class or function is).
    """

    def __call__(self, *, store: SessionStore) -> HostRuntime: ...


@dataclass(frozen=True)
class HostConfig:
    """What every host of a pool is built from (pickled to the Ray worker)."""

    store_dir: str
    # Called as `runtime_factory(store=SessionStore)` on the host's hub thread.
    runtime_factory: RuntimeFactory
    durability: str = "turn"
    # Called on the host's hub thread with the fresh runtime: register tools, models, prompt
    # sections, script the scripted model. Must be picklable (cloudpickle: closures are fine).
    setup: HostSetup | None = None
    relay_progress: bool = True
    # Kept events the provider has not acknowledged yet are bounded only by the provider's
    # polling; this caps one poll's answer.
    max_batch: int = 10_000
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ScriptedSetup:
    """A picklable host setup: every child on the host plays `steps` (the `"*"` script)."""

    steps: tuple[Step, ...]
    repeat: bool = True

    def __call__(self, runtime: HostRuntime) -> None:
        runtime.scripted.script(DEFAULT, list(self.steps), repeat=self.repeat)


def result_to_json(result: SubagentResult) -> dict[str, Any]:
    return {
        "output": [dict(b) for b in result.output],
        "stop_reason": result.stop_reason,
        "structured": result.structured,
        "diagnostic": result.diagnostic,
    }


def result_from_json(data: Mapping[str, Any]) -> SubagentResult:
    return SubagentResult(
        output=list(data.get("output") or []),
        stop_reason=str(data.get("stop_reason") or ERROR),
        structured=data.get("structured"),
        diagnostic=data.get("diagnostic"),
    )


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

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
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
        ok, value = box[0]
        if not ok:
            raise value
        return value

    def _drain(self) -> None:
        # Runs in the hub itself: only schedule, never block.
        jobs = self._jobs
        while jobs:
            fn, _ = jobs.popleft()
            self._tasks.spawn(fn)

    def spawn(self, fn: Callable[..., object], *args: Any) -> gevent.Greenlet:
        """Start `fn(*args)` in a greenlet this hub owns; call it on the hub only."""
        return self._tasks.spawn(fn, *args)

    def stop(self) -> None:
        def stop() -> None:
            assert self._stop is not None
            self._tasks.close(timeout=5)
            self._stop.set()

        self.call_soon(stop)
        self._stopped.wait(10)


@dataclass
class _StandInParent:
    """What the in-process machinery reads from `request.parent`, for a parent elsewhere."""

    id: str
    ctx: Any
    cwd: str
    depth: int
    options: AgentOptions


@dataclass
class _Entry:
    key: str
    ready: GEvent = field(default_factory=GEvent)
    run: LocalRun | None = None
    controller: AbortController = field(default_factory=AbortController)
    watcher: gevent.Greenlet | None = None
    disposed: bool = False
    cancel_cause: str | None = None


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
        self._entries: dict[str, _Entry] = {}
        self._starting: dict[Any, str] = {}
        self._provider = SpawnProvider("ray-child")
        self._runtime: HostRuntime = self._hub.call(self._make_runtime)

    # -- hub-side construction ----------------------------------------------------------------

    def _make_runtime(self) -> HostRuntime:
        os.makedirs(self.config.store_dir, exist_ok=True)
        store = SessionStore(self.config.store_dir, durability=self.config.durability)  # type: ignore[arg-type]
        runtime = self.config.runtime_factory(store=store)
        if self.config.setup is not None:
            self.config.setup(runtime)
        if self.config.relay_progress:
            runtime.ctx.lifecycle.on_published(self._on_published)
        return runtime

    # -- Ray methods (any thread) -------------------------------------------------------------

    def ready(self) -> dict[str, Any]:
        return {"incarnation": self.incarnation, "pid": os.getpid(), "live": self._live()}

    def run_setup(self, setup: HostSetup) -> None:
        """Run another setup on the live runtime (re-script the model, add tools)."""
        self._hub.call(lambda: setup(self._runtime))

    def _live(self) -> int:
        return len(self._entries)

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
            self._hub.call_soon(lambda: self._dispatch(ready))
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

    def _on_published(self, agent: Any) -> None:
        key = self._starting.get(gevent.getcurrent())
        if key is None:
            return
        post = self._post

        def relay(event: dict[str, Any]) -> None:
            post({"k": "progress", "run": key, "event": event})

        agent.add_progress_listener(relay)

    # -- commands (hub thread) ----------------------------------------------------------------

    def _dispatch(self, commands: list[Sequence[Any]]) -> None:
        for command in commands:
            op, key = command[0], command[1]
            try:
                if op in ("start", "resume", "recover"):
                    entry = self._entries.get(key)
                    if entry is None or entry.disposed:
                        entry = self._entries[key] = _Entry(key)
                    self._hub.spawn(self._establish, entry, op, command[2])
                    continue
                entry = self._entries.get(key)
                if entry is None:
                    if op == "steer":
                        self._post(_steer_reply(key, command[2], "RUN_DISPOSED", "no such run"))
                    elif op == "dispose":
                        self._post({"k": "disposed", "run": key})
                    continue
                if op == "steer":
                    self._hub.spawn(self._steer, entry, command[2], command[3], command[4])
                elif op == "cancel":
                    self._hub.spawn(self._cancel, entry, command[2])
                elif op == "dispose":
                    self._hub.spawn(self._dispose, entry)
                else:
                    log.error("unknown host command %r", op)
            except Exception:
                log.exception("host command %r for %s failed", op, key)

    def _parent(self, spec: Mapping[str, Any]) -> _StandInParent:
        parent = spec["parent"]
        return _StandInParent(
            id=parent["id"],
            ctx=self._runtime.ctx,
            cwd=parent["cwd"],
            depth=parent["depth"],
            options=AgentOptions(model=parent["model"]),
        )

    def _establish(self, entry: _Entry, op: str, spec: Mapping[str, Any]) -> None:
        me = gevent.getcurrent()
        self._starting[me] = entry.key
        published: LocalRun | None
        try:
            if op == "start":
                published = self._start(entry, spec)
            elif op == "resume":
                published = self._resume(entry, spec)
            else:
                published = self._recover(entry, spec)
        except SubagentError as exc:
            self._entries.pop(entry.key, None)
            self._post({"k": "failed", "run": entry.key, "code": exc.code, "message": exc.detail})
            return
        except Exception as exc:
            log.exception("starting %s failed", entry.key)
            self._entries.pop(entry.key, None)
            message = clip_diagnostic(f"{type(exc).__name__}: {exc}")
            self._post(
                {"k": "failed", "run": entry.key, "code": "START_FAILED", "message": message}
            )
            return
        finally:
            self._starting.pop(me, None)
            entry.ready.set()
        if published is None:
            return  # settled from the log, nothing live
        run = entry.run
        assert run is not None
        self._post(
            {
                "k": "published",
                "run": entry.key,
                "session_id": run.id,
                "message_id": run.message_id,
                "recovered": op == "recover",
            }
        )
        entry.watcher = self._hub.spawn(self._watch, entry, run)
        if entry.cancel_cause is not None:
            run.cancel(entry.cancel_cause)

    def _start(self, entry: _Entry, spec: Mapping[str, Any]) -> LocalRun:
        continuation = None
        cont = spec.get("continuation")
        if cont is not None:
            continuation = SubagentContinuation(
                session_id=cont["session_id"], descriptor=_descriptor(cont["descriptor"])
            )
        request = SubagentStartRequest(
            prompt=list(spec["prompt"]),
            parent=self._parent(spec),
            signal=entry.controller.signal,
            agent_options=spec.get("agent_options"),
            output_schema=spec.get("output_schema"),
            max_depth=spec.get("max_depth"),
            tool_filter=spec.get("tool_filter"),
            persona=spec.get("persona"),
            continuation=continuation,
            trace=tracing.extract(spec.get("trace"), spec.get("trace_name")),
        )
        run = self._provider.start(request)
        entry.run = run
        return run

    def _resume(self, entry: _Entry, spec: Mapping[str, Any]) -> LocalRun:
        request = SubagentResumeRequest(
            session_id=spec["session_id"],
            prompt=list(spec["prompt"]),
            source=MessageSource.from_json(spec["source"]),
            parent=self._parent(spec),
            signal=entry.controller.signal,
            descriptor=_descriptor(spec["descriptor"]),
            trace=tracing.extract(spec.get("trace"), spec.get("trace_name")),
        )
        run = self._provider.resume(request)
        entry.run = run
        return run

    def _recover(self, entry: _Entry, spec: Mapping[str, Any]) -> LocalRun | None:
        """Re-establish a continuable activation whose host died, from the child's log."""
        store = self._runtime.store
        session_id = spec["session_id"]
        if not store.exists(session_id):
            return self._start(entry, spec["start"]) if "start" in spec else None
        loaded = store.inspect(session_id)
        events = loaded.events
        started_turn = any(e["type"] == "turn/start" for e in events[loaded.header.seed_length :])
        if not started_turn and "start" in spec:
            # Nothing happened yet: start over under the same id (the descriptor comes again).
            store.delete(session_id)
            return self._start(entry, spec["start"])
        if authoritative_descriptor(events, loaded.header.seed_length) is None:
            raise SubagentError("NOT_RESUMABLE", f"child {session_id} has no descriptor")
        settled = _settled_in_log(events, spec.get("message_id"))
        if settled is not None and spec.get("output_schema") is None:
            self._post({"k": "settled", "run": entry.key, "result": result_to_json(settled)})
            self._entries.pop(entry.key, None)
            return None
        if spec.get("output_schema") is not None:
            raise SubagentError(
                "START_FAILED",
                "a structured-output activation cannot be re-established after its host died",
            )
        resume = dict(spec)
        resume["prompt"] = [{"type": "text", "text": RECOVERY_PROMPT}]
        resume["source"] = MessageSource("subagent-report").to_json()
        return self._resume(entry, resume)

    def _watch(self, entry: _Entry, run: LocalRun) -> None:
        try:
            result = run.result.get()
        except BaseException as exc:
            fault = clip_diagnostic(f"{type(exc).__name__}: {exc}")
            self._post({"k": "fault", "run": entry.key, "message": fault})
            return
        self._post({"k": "settled", "run": entry.key, "result": result_to_json(result)})

    def _steer(
        self, entry: _Entry, token: int, content: list[dict[str, Any]], source: dict[str, Any]
    ) -> None:
        entry.ready.wait()
        run = entry.run
        if run is None or entry.disposed:
            self._post(_steer_reply(entry.key, token, "RUN_DISPOSED", "the run is gone"))
            return
        try:
            run.steer(content, MessageSource.from_json(source)).get()
        except SubagentError as exc:
            self._post(_steer_reply(entry.key, token, exc.code, exc.detail))
            return
        except Exception as exc:
            self._post(_steer_reply(entry.key, token, "RUN_TERMINAL", f"{exc}"))
            return
        self._post(_steer_reply(entry.key, token, None, None))

    def _cancel(self, entry: _Entry, cause: str) -> None:
        entry.cancel_cause = cause
        if entry.run is not None:
            entry.run.cancel(cause)
        else:
            entry.controller.abort(cause)

    def _dispose(self, entry: _Entry) -> None:
        if not entry.ready.is_set():
            entry.controller.abort("disposed")
            entry.ready.wait()
        entry.disposed = True
        run = entry.run
        try:
            if run is not None:
                run.dispose()
                if entry.watcher is not None:
                    entry.watcher.join()
        finally:
            if self._entries.get(entry.key) is entry:
                del self._entries[entry.key]
            self._post({"k": "disposed", "run": entry.key})


def _steer_reply(key: str, token: int, code: str | None, message: str | None) -> dict[str, Any]:
    return {"k": "steer", "run": key, "token": token, "code": code, "message": message}


def _descriptor(data: Mapping[str, Any]) -> SubagentDescriptor:
    tool_filter = data.get("tool_filter")
    return SubagentDescriptor(
        provider=data["provider"],
        label=data["label"],
        model=data["model"],
        persona=data.get("persona"),
        tool_filter=None if tool_filter is None else ToolRestriction.from_json(tool_filter),
    )


def _settled_in_log(
    events: Sequence[Mapping[str, Any]], message_id: str | None
) -> SubagentResult | None:
    """The activation's outcome when its turn ended (not interrupted) before the host died."""
    if message_id is None:
        return None
    claimed = False
    output: list[Mapping[str, Any]] = []
    for event in events:
        kind = event["type"]
        data = event["data"]
        if not claimed:
            claimed = kind == "inbox/claimed" and data.get("message_id") == message_id
            continue
        if kind == "assistant/message":
            content = data["message"].get("content") or []
            if content:
                output = list(content)
        elif kind == "turn/end":
            reason = data.get("reason")
            if reason == "interrupted":
                return None
            stop = stop_reason_of(str(reason))
            return SubagentResult(output=output, stop_reason=stop, diagnostic=data.get("message"))
    return None
