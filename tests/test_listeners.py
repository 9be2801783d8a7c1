"""Explicit observers: every listener is registered by a method that returns its remover, and
nobody appends to another object's list (`ctx.lifecycle`, `Agent.add_turn_listener`,
`Agent.add_steer_listener`, `Agent.before_first_request`)."""

from __future__ import annotations

from typing import Any

import pytest
from gevent.event import Event
from test_agent_loop import Gate, is_done, kit

from actors.agents import create_agent
from agent.lifecycle import AgentLifecycle
from agent.loop import TurnOutcome
from agent.models import scripted as S


def test_lifecycle_removers_take_out_exactly_their_own_registration() -> None:
    life = AgentLifecycle()
    calls: list[str] = []

    def seen(agent: object) -> None:
        calls.append(f"seen:{agent}")

    first = life.on_published(seen)
    life.on_published(seen)  # the same function twice is two entries
    life.on_closing(lambda agent: calls.append(f"closing:{agent}"))
    life.on_cancelled(lambda agent, cause: calls.append(f"cancelled:{agent}:{cause}"))
    life.published("a")
    first()
    first()  # a second call does nothing
    life.published("b")
    life.closing("c")
    life.cancelled("d", "why")
    assert calls == ["seen:a", "seen:a", "seen:b", "closing:c", "cancelled:d:why"]
    with pytest.raises(TypeError):
        life.on_published("not callable")  # type: ignore[arg-type]


def test_a_listener_added_while_telling_hears_the_next_notice_not_the_current_one() -> None:
    life = AgentLifecycle()
    calls: list[str] = []

    def late(agent: object) -> None:
        calls.append(f"late:{agent}")

    def adder(agent: object) -> None:
        calls.append(f"adder:{agent}")
        life.on_published(late)

    remove = life.on_published(adder)
    life.published(1)
    remove()
    life.published(2)
    assert calls == ["adder:1", "late:2"]


def test_a_removed_lifecycle_listener_is_not_told_about_agents() -> None:
    with kit() as k:
        published: list[str] = []
        remove = k.ctx.lifecycle.on_published(lambda agent: published.append(agent.id))
        a = create_agent(k.ctx)
        remove()
        create_agent(k.ctx)
        assert published == [a.id]


def test_turn_listener_hears_each_turn_until_removed() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.text("one"), S.text("two")])
        outcomes: list[TurnOutcome] = []
        remove = a.add_turn_listener(outcomes.append)
        a.send("first").get()
        a.when_idle().get()
        remove()
        a.send("second").get()
        a.when_idle().get()
        assert [o.turn for o in outcomes] == [1]
        with pytest.raises(TypeError):
            a.add_turn_listener(None)  # type: ignore[arg-type]


def test_steer_listener_fires_when_the_steer_is_queued_before_it_is_admitted() -> None:
    with kit() as k:
        gate = Gate()
        k.tool("slow", lambda args, ctx: (gate.wait(), "slow done")[1])
        a = k.agent()
        k.model.script(a.id, [S.tool_call("slow"), S.text("done")])
        queued: list[str] = []
        heard = Event()

        def on_steer(message_id: str) -> None:
            queued.append(message_id)
            heard.set()

        remove = a.add_steer_listener(on_steer)
        a.send("start").get()
        gate.reached.wait()
        admitted = a.steer("go left")
        heard.wait()
        assert not is_done(admitted)  # queued, not yet admitted: the tool still runs
        gate.open()
        assert admitted.get() == queued[0]  # the queued steer is the one admitted
        a.when_idle().get()
        remove()
        assert queued == [queued[0]]


def test_before_first_request_runs_once_in_the_next_turn() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.text("one"), S.text("two")])
        ran: list[Any] = []
        a.before_first_request(lambda: ran.append(a.turn_running))
        a.send("first").get()
        a.when_idle().get()
        a.send("second").get()
        a.when_idle().get()
        assert ran == [True]
        with pytest.raises(TypeError):
            a.before_first_request(42)  # type: ignore[arg-type]
