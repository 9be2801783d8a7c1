"""AgentActor and the `Agent` handle: mailbox vocabulary, status, hooks, close at quiescence."""

from __future__ import annotations

from typing import Any

import pytest
from gevent.event import Event
from test_agent_loop import kit, of_type, wait_for

from actors.agent_handle import Agent
from actors.agent_messages import Send, check_content
from actors.agents import create_agent, pending_inbox
from agent.loop import TurnOutcome
from agent.models import scripted as S
from subagent.errors import SubagentError
from subagent.types import MessageSource


def test_check_content_accepts_text_and_blocks_and_refuses_the_rest() -> None:
    assert check_content("hi") == [{"type": "text", "text": "hi"}]
    blocks = [{"type": "text", "text": "x"}]
    assert check_content(blocks) == blocks
    for bad in (42, [{"text": "no type"}], ["str"], {"type": "text"}):
        with pytest.raises(TypeError):
            check_content(bad)


def test_send_replies_with_the_message_id_and_logs_its_source() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.text("x")])
        message_id = a.send("hi", MessageSource.coordinator("parent")).get()
        a.when_idle().get()
        (accepted,) = of_type(k.events(a), "inbox/accepted")
        assert accepted["data"]["message_id"] == message_id
        assert accepted["data"]["source"] == MessageSource.coordinator("parent").to_json()
        (claimed,) = of_type(k.events(a), "inbox/claimed")
        assert claimed["data"]["message_id"] == message_id


def test_content_that_is_not_lossless_json_fails_at_the_call_site() -> None:
    with kit() as k:
        a = k.agent()
        with pytest.raises(TypeError):
            a.send([{"type": "text", "text": ("a", "tuple")}]).get()
        assert a.status == "idle"
        assert of_type(k.events(a), "inbox/accepted") == []


def test_unknown_messages_are_refused() -> None:
    with kit() as k:
        a = k.agent()
        with pytest.raises(TypeError):
            a.ref.ask("hello")


def test_status_when_idle_and_turn_listeners() -> None:
    with kit() as k:
        a = k.agent()
        outcomes: list[TurnOutcome] = []
        a.add_turn_listener(outcomes.append)
        a.add_turn_listener(lambda o: 1 / 0)  # a raising listener is contained
        assert a.when_idle().get() is None
        assert a.status == "idle" and not a.turn_running
        k.model.script(a.id, [S.hang()])
        a.send("go").get()
        wait_for(lambda: a.turn_running)
        assert a.status == "running"
        waiting = a.when_idle()
        outcome = a.cancel().get()
        assert waiting.get() is outcome
        assert outcomes == [outcome]


def test_progress_listeners_are_tagged_and_removable() -> None:
    with kit() as k:
        a = k.agent()
        seen: list[dict[str, Any]] = []
        remove = a.add_progress_listener(seen.append)
        k.model.script(a.id, [S.text("one"), S.text("two")])
        a.send("go").get()
        a.when_idle().get()
        assert seen and all(e["agent_id"] == a.id for e in seen)
        assert [e["kind"] for e in seen if e["kind"].startswith("turn/")] == [
            "turn/start",
            "turn/end",
        ]
        remove()
        count = len(seen)
        a.send("again").get()
        a.when_idle().get()
        assert len(seen) == count


def test_progress_listeners_are_a_collection_each_remover_removes_its_own() -> None:
    """Issue 12 item 10: removing the first listener used to silently remove the second."""
    with kit() as k:
        a = k.agent()
        first: list[str] = []
        second: list[str] = []
        twice: list[str] = []

        def turn_count(seen: list[str]) -> int:
            return sum(1 for kind in seen if kind == "turn/end")

        remove_first = a.add_progress_listener(lambda e: first.append(e["kind"]))
        remove_second = a.add_progress_listener(lambda e: second.append(e["kind"]))

        def bad(event: dict[str, Any]) -> None:
            raise RuntimeError("observer bug")

        remove_bad = a.add_progress_listener(bad)  # a raising listener never starves the rest

        def on_twice(event: dict[str, Any]) -> None:
            twice.append(event["kind"])

        remove_twice_a = a.add_progress_listener(on_twice)
        a.add_progress_listener(on_twice)  # the same function twice is two entries
        k.model.script(a.id, [S.text("one"), S.text("two"), S.text("three")])
        a.send("go").get()
        a.when_idle().get()
        assert (turn_count(first), turn_count(second), turn_count(twice)) == (1, 1, 2)

        remove_first()
        remove_first()  # removing twice is harmless: it must not take anyone else's entry
        remove_bad()
        remove_twice_a()
        a.send("again").get()
        a.when_idle().get()
        assert (turn_count(first), turn_count(second), turn_count(twice)) == (1, 2, 3)

        remove_second()
        a.send("last").get()
        a.when_idle().get()
        assert (turn_count(first), turn_count(second), turn_count(twice)) == (1, 2, 4)
        with pytest.raises(TypeError):
            a.add_progress_listener("not callable")  # type: ignore[arg-type]


def test_context_hooks_fire_on_publish_cancel_and_close() -> None:
    with kit() as k:
        calls: list[str] = []
        k.ctx.lifecycle.on_published(lambda ag: calls.append("published"))
        k.ctx.lifecycle.on_cancelled(lambda ag, cause: calls.append(f"cancelled:{cause}"))
        k.ctx.lifecycle.on_closing(lambda ag: calls.append("closing"))
        a = create_agent(k.ctx)
        a.cancel("why").get()
        a.close()
        assert calls == ["published", "cancelled:why", "closing"]


def test_close_mid_turn_aborts_it_keeps_queued_work_and_reaches_quiescence() -> None:
    with kit() as k:
        a = k.agent()
        entered, never = Event(), Event()

        def stubborn(args: Any, ctx: Any) -> str:
            entered.set()
            never.wait()
            return "x"

        k.tool("stubborn", stubborn)
        k.model.script(a.id, [S.tool_call("stubborn")])
        a.send("go").get()
        a.send("queued").get()
        entered.wait()
        a.close("shutting down")
        assert a.status == "closed"
        assert not a.ref.is_alive()
        assert a.log.closed
        assert a.id not in k.ctx.agents
        stored = k.store.load(a.id).events
        end = of_type(stored, "turn/end")[-1]["data"]
        assert (end["reason"], end["cause"]) == ("aborted", "shutting down")
        assert [m["content"][0]["text"] for m in pending_inbox(stored)] == ["queued"]
        a.close()  # idempotent
        with pytest.raises(SubagentError) as info:
            a.actor.on_receive(Send([{"type": "text", "text": "late"}], MessageSource.user()))
        assert info.value.code == "RUN_DISPOSED"


def test_close_while_idle_is_quick_and_complete() -> None:
    with kit() as k:
        a: Agent = k.agent()
        a.close()
        assert not a.ref.is_alive() and a.log.closed and a.status == "closed"


def test_a_killed_agent_actor_settles_every_reply_it_owed() -> None:
    from actors import gevent_actor

    with kit() as k:
        a = k.agent()
        entered, never = Event(), Event()

        def stuck(args: Any, ctx: Any) -> str:
            entered.set()
            never.wait()
            return "x"

        k.tool("stuck", stuck)
        k.model.script(a.id, [S.tool_call("stuck")])
        a.send("go").get()
        entered.wait()
        steer = a.steer("pending")
        idle = a.when_idle()
        wait_for(lambda: bool(a.actor._steers), "the steer reached the actor")
        gevent_actor.kill(a.ref)
        with pytest.raises(SubagentError) as info:
            steer.get(timeout=5)
        assert info.value.code == "RUN_DISPOSED"
        idle.get(timeout=5)  # resolved, not left hanging
        assert gevent_actor.join(a.ref, 5)
        a.log.close()
        a._forget()


def test_a_close_whose_caller_is_killed_mid_sync_still_closes_the_agent(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An idle agent's Close runs in the caller's greenlet, and closing the log waits for its
    fsync. A caller killed there (a cancelled tool disposing its child) must not leave the
    agent half-closed: the next close returns at quiescence instead of waiting forever."""
    import gevent

    import agent.store as store_module
    from agent.store import SessionStore

    entered, release = Event(), Event()

    def held_offload(fn: Any, *args: Any) -> Any:
        entered.set()
        release.wait()
        return fn(*args)

    with kit(SessionStore(tmp_path / "sessions")) as k:
        a: Agent = k.agent()
        # Something appended since the last durability point, so closing the log syncs it.
        source = MessageSource.coordinator("parent").to_json()
        data = {"message_id": "m-late", "kind": "send", "content": [], "source": source}
        a.log.append("inbox/accepted", data)
        monkeypatch.setattr(store_module, "offload", held_offload)
        closer = gevent.spawn(a.close)
        entered.wait(timeout=5)
        assert entered.is_set(), "the close never reached the log's sync"
        closer.kill()
        release.set()
        with gevent.Timeout(5, AssertionError("the second close never returned")):
            a.close()
        assert not a.ref.is_alive() and a.status == "closed"
