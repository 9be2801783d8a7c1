"""A start crosses the registry once: admission, the provider's start and publication in one
message when the provider's start runs in place (spawn, fork), with the order rules intact.

A remote provider's start (it may block for long) stays out of the registry's handler: it is
admitted, started by the caller, then published (two crossings). Either way the registry stays
open while a provider's start runs: what reaches it meanwhile is handled, never deadlocked.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import gevent
import gevent.event
import pytest
from seam_kit import kit

from actors import registry_actor
from actors.agent_messages import CancelRun
from actors.registry_actor import RegistryActor
from agent.models import scripted as S
from providers.inprocess import SpawnProvider
from subagent.errors import SubagentError
from subagent.types import SubagentStartRequest


@contextmanager
def crossings(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The registry messages handled while the block runs, by type name."""
    seen: list[str] = []
    real = RegistryActor.on_receive

    def counting(self: RegistryActor, message: Any) -> object:
        seen.append(type(message).__name__)
        return real(self, message)

    monkeypatch.setattr(RegistryActor, "on_receive", counting)
    try:
        yield seen
    finally:
        monkeypatch.setattr(RegistryActor, "on_receive", real)


class RemoteLike(SpawnProvider):
    """An in-process child started as a remote provider's would be (its start may block)."""

    starts_in_place = False

    def __init__(self, name: str = "remote-like", during: Any = None) -> None:
        super().__init__(name)
        self.during = during

    def start(self, request: SubagentStartRequest) -> Any:
        if self.during is not None:
            self.during()
        return super().start(request)


def test_a_spawn_start_crosses_the_registry_once(monkeypatch: pytest.MonkeyPatch) -> None:
    with kit() as k:
        parent = k.parent()
        k.start(parent)  # the parent's supervisor exists from here on
        with crossings(monkeypatch) as seen:
            run = k.start(parent)
            fork = k.start(parent, provider="fork")
        assert seen == ["Start", "Start"]
        # Published in that crossing: its start was emitted before start() returned.
        started = [e["run_id"] for e in k.events_of("subagent/start")]
        assert run.run_id in started and fork.run_id in started
        assert run.result.get(timeout=5).stop_reason == "completed"


def test_a_remote_providers_start_runs_outside_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Admission, the start in the caller's greenlet, then publication: while that start
    waits, another greenlet's registry ask is answered."""
    with kit() as k:
        answered = gevent.event.Event()

        def meanwhile() -> None:
            gevent.spawn(lambda: (k.service.runs(), answered.set()))
            assert answered.wait(timeout=5), "the registry was held by the start"

        k.service.register(RemoteLike(during=meanwhile))
        parent = k.parent()
        with crossings(monkeypatch) as seen:
            run = k.start(parent, provider="remote-like")
        assert seen == ["Start", "Runs", "Published"]
        assert run.run_id in [e["run_id"] for e in k.events_of("subagent/start")]
        assert run.result.get(timeout=5).stop_reason == "completed"


def test_a_start_that_switches_leaves_the_registry_open(monkeypatch: pytest.MonkeyPatch) -> None:
    """An in-place start that switches out (a durable store's fsync, a slow hook): another
    greenlet's ask is handled meanwhile; the registry idle again, the crossing publishes."""
    with kit() as k:
        parent = k.parent()
        answered = gevent.event.Event()

        def slow_hook(agent: Any) -> None:
            if agent.header.origin == "subagent":
                gevent.spawn(lambda: (k.service.runs(), answered.set()))
                assert answered.wait(timeout=5), "the registry was held by the start"

        remove = k.runtime.ctx.lifecycle.on_published(slow_hook)
        try:
            with crossings(monkeypatch) as seen:
                run = k.start(parent)
        finally:
            remove()
        assert seen == ["Start", "Runs"]
        assert run.run_id in [e["run_id"] for e in k.events_of("subagent/start")]
        assert run.result.get(timeout=5).stop_reason == "completed"


def test_a_message_still_queued_when_the_start_returns_goes_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A message that reached the registry during the start and is still queued when the
    start returns is handled first: the publication follows it as a message of its own, still
    before start() returns."""
    with kit() as k:
        parent = k.parent()
        tables: list[list[str]] = []

        def hook(agent: Any) -> None:
            if agent.header.origin == "subagent":
                asker = gevent.spawn(lambda: tables.append([r.id for r in k.service.runs()]))
                gevent.sleep(0)  # the asker queues its message, and waits
                assert not asker.ready()

        remove = k.runtime.ctx.lifecycle.on_published(hook)
        try:
            with crossings(monkeypatch) as seen:
                run = k.start(parent)
        finally:
            remove()
        assert seen == ["Start", "Runs", "Published"]
        assert tables == [[]]  # handled before the publication, in mailbox order
        assert run.run_id in [e["run_id"] for e in k.events_of("subagent/start")]
        assert run.result.get(timeout=5).stop_reason == "completed"


def test_a_hook_asking_the_registry_during_the_start_does_not_deadlock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A published hook that asks the registry (its run table) from inside the crossing is
    answered: the registry is open while the provider's start runs."""
    with kit() as k:
        k.respond = lambda request: S.hang()  # type: ignore[assignment,misc]
        parent = k.parent()
        first = k.start(parent)
        tables: list[list[str]] = []

        def hook(agent: Any) -> None:
            if agent.header.origin == "subagent":
                tables.append([r.run_id for r in k.service.runs(parent.id)])

        remove = k.runtime.ctx.lifecycle.on_published(hook)
        try:
            with crossings(monkeypatch) as seen:
                second = k.start(parent)
        finally:
            remove()
        # Answered from inside the crossing; the child being started is not in the table yet.
        assert tables == [[first.run_id]]
        assert seen == ["Start", "Runs"]
        assert second.run_id in [e["run_id"] for e in k.events_of("subagent/start")]
        second.cancel()
        assert second.result.get(timeout=5).stop_reason == "aborted"


def test_a_child_settled_during_its_start_ends_after_its_start() -> None:
    """No end overtakes its start: a run whose result settled before it was published (here
    cancelled inside the provider's start) reports `subagent/start`, then `subagent/end`."""

    class CancelledAtOnce(SpawnProvider):
        def start(self, request: SubagentStartRequest) -> Any:
            run = super().start(request)
            # In place (the new child's actor is idle): its queued prompt is dropped, and the
            # result settles `aborted` before the provider returns it.
            run.local_agent.actor.tell_now(CancelRun("at once"))
            assert run.result.done
            return run

    with kit() as k:
        k.service.register(CancelledAtOnce("at-once"))
        parent = k.parent()
        run = k.start(parent, provider="at-once")
        assert run.result.get(timeout=5).stop_reason == "aborted"
        run.dispose()
        mine = [e["type"] for e in k.events if e.get("run_id") == run.run_id]
        assert mine == ["subagent/start", "subagent/end"]


def test_a_failed_in_place_start_gives_its_slot_back_and_emits_nothing() -> None:
    """All or nothing inside the crossing: a provider's start that raises leaves no run, no
    event and no held slot."""

    class Failing(SpawnProvider):
        def start(self, request: SubagentStartRequest) -> Any:
            raise SubagentError("START_FAILED", "refused")

    with kit(max_children=1) as k:
        k.service.register(Failing("failing"))
        parent = k.parent()
        with pytest.raises(SubagentError, match="refused"):
            k.start(parent, provider="failing")
        k.flush_events()
        assert k.events_of("subagent/start") == []
        run = k.start(parent)  # the one slot is free again
        assert run.result.get(timeout=5).stop_reason == "completed"
        assert k.service.running_peak == 1


def test_a_start_waiting_for_a_slot_is_started_and_published_by_its_caller(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no slot free the crossing only admits (later); the caller then starts and
    publishes, as a remote provider's start would be."""
    with kit(max_children=1) as k:
        k.respond = lambda request: S.hang()  # type: ignore[assignment,misc]
        parent = k.parent()
        first = k.start(parent)
        with crossings(monkeypatch) as seen:
            waiting = gevent.spawn(k.start, parent)
            gevent.sleep(0)
            assert not waiting.ready()
            first.cancel("make room")
            second = waiting.get(timeout=5)
        assert seen[0] == "Start" and seen[-1] == "Published" and "Ended" in seen
        assert second.run_id in [e["run_id"] for e in k.events_of("subagent/start")]
        second.cancel()
        assert second.result.get(timeout=5).stop_reason == "aborted"


def test_start_messages_are_in_the_registry_vocabulary() -> None:
    assert {"Start", "Launched"} <= set(registry_actor.__all__)


def test_a_childs_turn_worker_carries_no_spawn_tree_record() -> None:
    """The per-child worker greenlet is made without gevent's spawn-tree bookkeeping (a
    weak reference to its spawner and its tree locals: ~4 us a child from the main greenlet)."""
    with kit() as k:
        k.respond = lambda request: S.hang()  # type: ignore[assignment,misc]
        parent = k.parent()
        run = k.start(parent)
        worker = run.local_agent.actor._worker
        assert worker is not None
        assert not hasattr(worker, "spawning_greenlet")
        assert not hasattr(worker, "spawn_tree_locals")
        run.cancel()
        assert run.result.get(timeout=5).stop_reason == "aborted"


def test_actor_urns_are_unique_version_4_uuids() -> None:
    """Numbered under a per-process random prefix: still unique, still uuid4-shaped."""
    import uuid

    from actors import gevent_actor

    urns = [gevent_actor._new_urn() for _ in range(1000)]
    assert len(set(urns)) == len(urns)
    for urn in urns[:3] + urns[-3:]:
        assert urn.startswith("urn:uuid:")
        parsed = uuid.UUID(urn.removeprefix("urn:uuid:"))
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122


def test_the_request_carrying_the_depth_is_a_whole_copy() -> None:
    """The provider gets the caller's request with the registry's depth, every other field
    as given (the copy is made slot by slot); the caller's request is left as it was."""
    from dataclasses import fields, replace

    seen: list[SubagentStartRequest] = []

    class Recording(SpawnProvider):
        def start(self, request: SubagentStartRequest) -> Any:
            seen.append(request)
            return super().start(request)

    with kit() as k:
        k.service.register(Recording("recording"))
        parent = k.parent()
        request = k.request(
            parent,
            "go",
            max_depth=3,
            persona="terse",
            token_budget=10_000,
            tool_filter=None,
        )
        run = k.service.start("recording", request)
        assert run.result.get(timeout=5).stop_reason == "completed"
        (given,) = seen
        assert request.depth is None
        assert given == replace(request, depth=1)
        for f in fields(SubagentStartRequest):
            if f.name != "depth":
                assert getattr(given, f.name) is getattr(request, f.name)


def test_a_resolved_route_is_remembered_but_its_adapter_is_not() -> None:
    """Children resolve their parent's route: the split is remembered, the adapter is looked
    up each time (an unregistered prefix is refused at once, a new one is found)."""
    from agent import models
    from agent.models import ModelRegistry

    registry = ModelRegistry()
    first, second = S.ScriptedModel(lambda r: S.text("1")), S.ScriptedModel(lambda r: S.text("2"))
    undo = registry.register("remembered", first)
    assert registry.resolve("remembered:m") == (first, "m")
    assert models._parsed["remembered:m"] == ("remembered", "m")
    undo()
    with pytest.raises(ValueError, match="unknown model prefix 'remembered'"):
        registry.resolve("remembered:m")
    registry.register("remembered", second)
    assert registry.resolve("remembered:m") == (second, "m")
    with pytest.raises(TypeError, match="must be a str"):
        registry.resolve(["remembered:m"])  # type: ignore[arg-type]


def test_dispose_waits_for_the_end_event_with_a_bare_sync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dispose returns once `subagent/end` was emitted; its wait is a stateless `Sync` (no
    provider list built per dispose)."""
    with kit() as k:
        parent = k.parent()
        run = k.start(parent)
        assert run.result.get(timeout=5).stop_reason == "completed"
        with crossings(monkeypatch) as seen:
            run.dispose()
        assert seen[-1] == "Sync" and "Providers" not in seen
        assert run.run_id in [e["run_id"] for e in k.events_of("subagent/end")]
