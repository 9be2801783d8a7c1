"""The runtime a Ray host composes, and the children it runs on it (the host's hub thread).

`HostedRuntime` builds the runtime with the face's factory (`HostConfig.runtime_factory`: the
face hands it down, `subagent.RayConfig` names `subagent.Runtime`; a provider neither imports
nor names it) on the host's session store, then executes the host's commands on it: start,
resume and recover children with the in-process spawn machinery, steer, cancel and dispose
them. Every outcome leaves as an event through the `post` callable the host gave it; the host
actor (`providers.ray_host.ChildHost`) owns the threads, the command order and the event
stream. Everything here runs on the hub thread.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gevent
from gevent.event import Event as GEvent

from actors.agent_handle import Agent
from agent import tracing
from agent.context import AgentContext
from agent.log import event_positions, events_of_types
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
    "HostConfig",
    "HostRuntime",
    "HostSetup",
    "HostedRuntime",
    "RuntimeFactory",
    "ScriptedSetup",
    "result_from_json",
    "result_to_json",
]

log = logging.getLogger(__name__)

RECOVERY_PROMPT = (
    "Your host process died and your previous turn was interrupted. Continue the task from where "
    "the conversation stands."
)

# One event of the host's ordered stream (the provider long-polls it).
Post = Callable[[dict[str, Any]], None]


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


@dataclass
class _StandInParent:
    """What the in-process machinery reads from `request.parent`, for a parent elsewhere."""

    id: str
    ctx: AgentContext
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


class HostedRuntime:
    """The runtime a host composes and the children running on it. Built on the hub thread;
    every method runs there (the host enqueues them)."""

    def __init__(self, config: HostConfig, post: Post) -> None:
        self.config = config
        self._post = post
        self._entries: dict[str, _Entry] = {}
        self._starting: dict[Any, str] = {}
        self._provider = SpawnProvider("ray-child")
        # Every greenlet serving a command (establish, steer, cancel, dispose, watch); `close`
        # kills and joins what the runtime's own close left running.
        self._tasks = TaskGroup("ray host runtime")
        self._runtime: HostRuntime = self._make_runtime()

    def _make_runtime(self) -> HostRuntime:
        os.makedirs(self.config.store_dir, exist_ok=True)
        store = SessionStore(self.config.store_dir, durability=self.config.durability)  # type: ignore[arg-type]
        runtime = self.config.runtime_factory(store=store)
        if self.config.setup is not None:
            self.config.setup(runtime)
        if self.config.relay_progress:
            runtime.ctx.lifecycle.on_published(self._on_published)
        return runtime

    @property
    def live(self) -> int:
        """How many runs the host holds (read from any thread: a snapshot)."""
        return len(self._entries)

    def run_setup(self, setup: HostSetup) -> None:
        """Run another setup on the live runtime (re-script the model, add tools)."""
        setup(self._runtime)

    def close(self) -> None:
        """Close every child and the runtime, then the greenlets that served them."""
        self._runtime.close()
        self._tasks.close(timeout=5)

    # -- events -------------------------------------------------------------------------------

    def _on_published(self, agent: Agent) -> None:
        key = self._starting.get(gevent.getcurrent())
        if key is None:
            return
        post = self._post

        def relay(event: dict[str, Any]) -> None:
            post({"k": "progress", "run": key, "event": event})

        agent.add_progress_listener(relay)

    # -- commands (hub thread) ----------------------------------------------------------------

    def dispatch(self, commands: list[Sequence[Any]]) -> None:
        for command in commands:
            op, key = command[0], command[1]
            try:
                if op in ("start", "resume", "recover"):
                    entry = self._entries.get(key)
                    if entry is None or entry.disposed:
                        entry = self._entries[key] = _Entry(key)
                    self._tasks.spawn(self._establish, entry, op, command[2])
                    continue
                entry = self._entries.get(key)
                if entry is None:
                    if op == "steer":
                        self._post(_steer_reply(key, command[2], "RUN_DISPOSED", "no such run"))
                    elif op == "dispose":
                        self._post({"k": "disposed", "run": key})
                    continue
                if op == "steer":
                    self._tasks.spawn(self._steer, entry, command[2], command[3], command[4])
                elif op == "cancel":
                    self._tasks.spawn(self._cancel, entry, command[2])
                elif op == "dispose":
                    self._tasks.spawn(self._dispose, entry)
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
        entry.watcher = self._tasks.spawn(self._watch, entry, run)
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
            depth=spec.get("depth"),
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
        started_turn = bool(event_positions(events, _TURN_START, loaded.header.seed_length))
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


_TURN_START = frozenset({"turn/start"})
# What tells an activation's outcome from its log: its claim, the replies after it, its turn/end.
_SETTLING = frozenset({"inbox/claimed", "assistant/message", "turn/end"})


def _settled_in_log(
    events: Sequence[Mapping[str, Any]], message_id: str | None
) -> SubagentResult | None:
    """The activation's outcome when its turn ended (not interrupted) before the host died."""
    if message_id is None:
        return None
    claimed = False
    output: list[Mapping[str, Any]] = []
    for event in events_of_types(events, _SETTLING):
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
