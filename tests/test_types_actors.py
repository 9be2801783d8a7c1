"""The actors layer's replies and events carry their types: each message names its reply
(`Asks[R]`), lifecycle events are TypedDicts, and what runs agrees with what is declared."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path
from typing import Any, NotRequired, get_origin, get_type_hints

from gevent.event import Event
from seam_kit import kit

from actors.agent_messages import Close, WhenIdle
from actors.gevent_actor import reply_of
from actors.registry_actor import (
    Known,
    LifecycleEvent,
    ProviderEvent,
    RunEndEvent,
    Runs,
    RunStartEvent,
)
from agent.loop import TurnOutcome
from agent.models import scripted as S
from agent.tools import Tool
from providers.inprocess import SpawnProvider
from subagent.service import RunHandle
from supervision.offload import offload

ROOT = Path(__file__).resolve().parent.parent


def _holds(event: LifecycleEvent, kind: Any) -> None:
    """`event` has every required key of its TypedDict and no key it does not declare. (Read
    from the hints: under postponed annotations `__required_keys__` misses `NotRequired`.)"""
    hints = get_type_hints(kind, include_extras=True)
    required = {key for key, hint in hints.items() if get_origin(hint) is not NotRequired}
    keys = set(event)
    assert required <= keys, (event, required - keys)
    assert keys <= set(hints), event


def test_lifecycle_events_hold_exactly_their_declared_keys() -> None:
    with kit() as k:
        seen: list[LifecycleEvent] = []
        k.service.subscribe(seen.append)
        unregister = k.service.register(SpawnProvider(name="other"))
        unregister()
        parent = k.parent()
        run = k.start(parent, "hi")
        assert run.result.get(timeout=10).stop_reason == "completed"
        run.dispose()
        kinds = {
            "subagent/provider-added": ProviderEvent,
            "subagent/provider-removed": ProviderEvent,
        }
        kinds |= {"subagent/start": RunStartEvent, "subagent/end": RunEndEvent}
        assert [e["type"] for e in seen] == list(kinds)
        for event in seen:
            _holds(event, kinds[event["type"]])
        end = seen[-1]
        assert end["type"] == "subagent/end"
        assert end["last_assistant_message"] == [{"type": "text", "text": "done: hi"}]


def test_replies_are_what_their_messages_declare() -> None:
    """The values behind the declared reply types (the checker trusts these declarations)."""
    with kit() as k:
        parent = k.parent()
        inside, release = Event(), Event()

        def wait(_args: Any, _ctx: Any) -> str:
            inside.set()
            release.wait()
            return "ok"

        k.runtime.ctx.tools.register(
            Tool(name="wait", description="wait", parameters={"type": "object"}, fn=wait)
        )
        k.respond = lambda r: S.tool_call("wait", {}) if r.step == 1 else S.text("done")
        sent = parent.send("hi").get(timeout=10)  # Send: the message id
        assert isinstance(sent, str)
        inside.wait(10)
        steer = parent.steer("and this")
        release.set()
        admitted = steer.get(timeout=10)  # Steer, local: the admitted message's id
        assert isinstance(admitted, str) and admitted != sent
        outcome = parent.when_idle().get(timeout=10)  # WhenIdle: the last turn's outcome
        assert isinstance(outcome, TurnOutcome) and outcome.reason == "completed"
        assert parent.cancel().get(timeout=10) is outcome  # Cancel, idle: the same outcome
        actor = parent.actor
        assert actor.ask_now(WhenIdle()) is outcome
        assert reply_of(k.service._ref, Runs()) == []  # the registry's run table
        run = k.start(parent, "child")
        assert reply_of(k.service._ref, Runs(parent.id)) == [run]
        assert all(isinstance(r, RunHandle) for r in k.service.runs())
        assert reply_of(k.service._ref, Known("spawn")) is k.service.get("spawn")
        run.dispose()
        assert actor.ask_now(Close()) is None  # Close: nothing, at quiescence


SNIPPET = """
from actors.agent_handle import Agent
from actors.agent_messages import Close, Steer, WhenIdle
from actors.gevent_actor import reply_of
from actors.registry_actor import Listener, Runs
from subagent.service import SubagentService
from subagent.types import MessageSource


def check(agent: Agent, service: SubagentService, listener: Listener) -> None:
    reveal_type(agent.send("x"))
    reveal_type(agent.steer("x"))
    reveal_type(agent.cancel())
    reveal_type(agent.actor.ask_now(Close()))
    reveal_type(agent.actor.ask_now(WhenIdle(), block=False))
    reveal_type(reply_of(agent.ref, Runs()))
    reveal_type(listener)
    reveal_type(Steer([], MessageSource.user()).reply)
    wrong: int = agent.send("x").get()
"""

EXPECTED = [  # without "builtins." (mypy versions differ in writing it)
    'Revealed type is "pykka._future.Future[str]"',
    'Revealed type is "pykka._future.Future[str | None]"',
    'Revealed type is "pykka._future.Future[agent.loop.TurnOutcome | None]"',
    'Revealed type is "None"',
    'Revealed type is "actors.gevent_actor.GeventFuture[agent.loop.TurnOutcome | None]"',
    'Revealed type is "list[actors.registry_actor.PublishedRun]"',
    'Revealed type is "def (TypedDict(actors.registry_actor.ProviderEvent, ',
    'Revealed type is "actors.gevent_actor.Deferred[str | None] | None"',
    'Incompatible types in assignment (expression has type "str", variable has type "int")',
]


def test_the_checker_sees_each_reply_type(tmp_path: Path) -> None:
    """mypy --strict on a caller: every reply is typed (no `Any` leaks from Pykka's `ask`),
    and a wrong use is an error."""
    source = tmp_path / "caller.py"
    source.write_text(SNIPPET)
    cmd = [sys.executable, "-m", "mypy", "--strict", "--no-error-summary", "--cache-dir"]
    cmd += [str(tmp_path / "cache"), "--config-file", str(ROOT / "setup.cfg"), str(source)]
    run = functools.partial(
        subprocess.run, cmd, capture_output=True, text=True, cwd=ROOT, timeout=50, check=False
    )
    done: subprocess.CompletedProcess[str] = offload(run)
    lines = [
        line.split(": ", 2)[-1].replace("builtins.", "")
        for line in done.stdout.splitlines()
        if "caller.py" in line
    ]
    assert len(lines) == len(EXPECTED), done.stdout + done.stderr
    for line, expected in zip(lines, EXPECTED, strict=True):
        assert line.startswith(expected), (line, expected)
