"""Shared fixtures-by-hand for the seam tests: a runtime on the in-memory store with a responder
model that tests steer from their own code, and small helpers to wait on lifecycle events."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import gevent
from gevent.event import Event

from agent.log import validate_log
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import MemoryStore
from agent.tools import Tool, ToolContext
from providers.inprocess import ForkProvider, SpawnProvider
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortController, AbortSignal

Responder = Callable[[ModelRequest], S.Step | str]


class Kit:
    """A runtime whose model answers through `self.respond`, replaceable per test."""

    def __init__(self, **runtime_options: Any) -> None:
        self.respond: Responder = lambda request: S.text(f"done: {last_user_text(request)}")
        self.model = S.ScriptedModel(lambda request: self.respond(request))
        self.store = runtime_options.pop("store", None) or MemoryStore()
        self.runtime = Runtime(store=self.store, scripted=self.model, **runtime_options)
        self.service = self.runtime.subagents
        self.unregister_spawn = self.service.register(SpawnProvider())
        self.unregister_fork = self.service.register(ForkProvider())
        self.events: list[Mapping[str, Any]] = []
        self.service.subscribe(self.events.append)

    def parent(self) -> Any:
        return self.runtime.agent()

    def request(self, parent: Any, prompt: str = "task", **kwargs: Any) -> SubagentStartRequest:
        signal = kwargs.pop("signal", None) or AbortController().signal
        return SubagentStartRequest(
            prompt=[text_block(prompt)], parent=parent, signal=signal, **kwargs
        )

    def start(self, parent: Any, prompt: str = "task", provider: str = "spawn", **kw: Any) -> Any:
        return self.service.start(provider, self.request(parent, prompt, **kw))

    def events_of(self, kind: str) -> list[Mapping[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def flush_events(self) -> None:
        """Wait until the registry delivered everything told so far (an ask round trip)."""
        self.service.providers()

    def close(self) -> None:
        self.runtime.close()


@contextmanager
def kit(**options: Any) -> Iterator[Kit]:
    k = Kit(**options)
    try:
        yield k
    finally:
        k.close()


def last_user_text(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if message["role"] == "user":
            return "".join(b.get("text", "") for b in message["content"])
    return ""


def assert_log_valid(store: Any, session_id: str) -> list[Mapping[str, Any]]:
    loaded = store.load(session_id)
    validate_log(loaded.events)
    return list(loaded.events)


class Gate:
    """A step the model waits on until the test opens it: synchronisation without sleeps."""

    def __init__(self) -> None:
        self.reached = Event()
        self.opened = Event()

    def wait(self, signal: AbortSignal | None = None) -> None:
        self.reached.set()
        if signal is None:
            self.opened.wait()
            return
        remove = signal.add_listener(lambda _r: self.opened.set())
        try:
            self.opened.wait()
        finally:
            remove()

    def open(self) -> None:
        self.opened.set()


def blocking_tool(name: str, gate: Gate, *, honour_signal: bool = True) -> Tool:
    def fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        gate.wait(ctx.signal if honour_signal else None)
        return "tool done"

    return Tool(name=name, description=name, parameters={"type": "object"}, fn=fn)


def wait_until(predicate: Callable[[], bool], limit: int = 10_000) -> None:
    """Yield to the hub until `predicate()` holds (bounded by iterations, not by time)."""
    for _ in range(limit):
        if predicate():
            return
        gevent.sleep(0.001)
    raise AssertionError("condition never held")
