"""Runtime wiring: options checked at construction, the opt-in GC freeze, close is final."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from seam_kit import kit

from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore
from providers.inprocess import SpawnProvider
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.types import MessageSource


@pytest.mark.parametrize(
    ("bad", "error"), [(0, ValueError), (-1, ValueError), (True, TypeError), (1.5, TypeError)]
)
def test_gc_freeze_every_must_be_a_positive_int(bad: object, error: type[Exception]) -> None:
    # The type wrong is a TypeError, the value wrong a ValueError (docs/runtime.md).
    with pytest.raises(error, match="gc_freeze_every"):
        Runtime(store=MemoryStore(), gc_freeze_every=bad)  # type: ignore[arg-type]


def test_gc_freeze_every_freezes_after_n_starts_and_close_unfreezes() -> None:
    gc.unfreeze()
    with kit(gc_freeze_every=3) as k:
        parent = k.parent()
        runs = [k.start(parent, str(i)) for i in range(2)]
        k.flush_events()
        assert gc.get_freeze_count() == 0
        runs.append(k.start(parent, "third"))
        k.flush_events()
        assert gc.get_freeze_count() > 0
        for run in runs:
            run.result.get(timeout=5)
            run.dispose()
    assert gc.get_freeze_count() == 0


def test_a_closed_runtime_refuses_starts() -> None:
    with kit() as k:
        parent = k.parent()
        k.runtime.close()
        with pytest.raises(SubagentError) as info:
            k.start(parent)
        assert info.value.code == "RUNTIME_CLOSED"


def test_every_public_entry_point_after_close_says_runtime_closed(tmp_path: Path) -> None:
    """Issue 12 item 19: `rt.agent()` after close leaked an agent, and `agent.send()` raised
    Pykka's raw `ActorDeadError`. Every entry point that would reach a dead actor (or make a
    new one) after `Runtime.close()` is listed here and fails `RUNTIME_CLOSED`."""
    with kit(store=SessionStore(tmp_path)) as k:
        k.respond = lambda request: S.hang()
        parent = k.parent()
        run = k.start(parent)
        rt = k.runtime
        rt.close()
        # Futures (the call itself returns; the error comes with the answer) ...
        deferred: dict[str, Callable[[], Any]] = {
            "agent.send": lambda: parent.send("hello"),
            "agent.steer": lambda: parent.steer("hello"),
            "agent.cancel": lambda: parent.cancel("why"),
            "agent.when_idle": lambda: parent.when_idle(),
            "run.steer": lambda: run.steer("hello"),
        }
        # ... and calls that raise at once.
        immediate: dict[str, Callable[[], Any]] = {
            "rt.agent": lambda: rt.agent(),
            "rt.resume_agent": lambda: rt.resume_agent(parent.id),
            "subagents.start": lambda: k.start(parent),
            "subagents.start_continuable": lambda: rt.subagents.start_continuable(
                "spawn", k.request(parent), label="late"
            ),
            "subagents.send_message": lambda: rt.subagents.send_message(
                parent, run.id, "hello", MessageSource.user()
            ),
            "subagents.interrupt": lambda: rt.subagents.interrupt(run.id, by=parent),
            "subagents.subscribe": lambda: rt.subagents.subscribe(lambda event: None),
            "subagents.register": lambda: rt.subagents.register(SpawnProvider()),
            "subagents.providers": lambda: rt.subagents.providers(),
        }
        codes: dict[str, str] = {}
        for name, call in deferred.items():
            future = call()
            with pytest.raises(SubagentError) as info:
                future.get(timeout=5)
            codes[name] = info.value.code
        for name, call in immediate.items():
            with pytest.raises(SubagentError) as info:
                call()
            codes[name] = info.value.code
        assert codes == dict.fromkeys([*deferred, *immediate], "RUNTIME_CLOSED")
        assert rt.ctx.agents == {}  # nothing was made, so nothing leaked
        # What is already over stays quiet and idempotent.
        parent.close()
        run.cancel("late")
        run.dispose()
        assert run.result.get(timeout=5).stop_reason == "aborted"


def test_a_closed_agent_in_an_open_runtime_is_run_disposed() -> None:
    with kit() as k:
        agent = k.parent()
        agent.close()
        with pytest.raises(SubagentError) as info:
            agent.send("hello").get(timeout=5)
        assert info.value.code == "RUN_DISPOSED"
