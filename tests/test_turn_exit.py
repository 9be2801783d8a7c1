"""A turn ended by its greenlet's exit is still answered: a kill of the turn's greenlet, or a tool
that raises `GreenletExit`, `SystemExit` or `KeyboardInterrupt`, closes the turn in the log and
settles what it answered, so no parent waits for ever on a child whose turn is gone
(docs/supervision.md, "Any `GreenletExit` ... ends a child as cancelled")."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gevent
import pytest
from gevent.event import Event
from greenlet import greenlet
from test_agent_loop import Kit, kit, of_type

from agent.models import scripted as S
from agent.tools import ToolContext
from subagent import (
    AbortController,
    MemoryStore,
    Runtime,
    SpawnProvider,
    SubagentStartRequest,
    Tool,
    text_block,
)
from subagent import scripted as RS
from supervision.errors import Cancelled


def _once_then_text(request: Any) -> Any:
    if any(m["role"] == "tool" for m in request.messages):
        return RS.text("done")
    return RS.tool_call("exit", {})


@pytest.mark.parametrize(
    ("raised", "stop", "diagnostic"),
    [
        (gevent.GreenletExit(), "aborted", "the turn was killed"),
        (Cancelled("stray"), "aborted", "the turn was killed"),
        (SystemExit(3), "error", "SystemExit: 3"),
        (KeyboardInterrupt(), "error", "KeyboardInterrupt"),
    ],
)
def test_a_child_whose_tool_raises_an_exit_still_settles(
    raised: BaseException, stop: str, diagnostic: str
) -> None:
    def exit_tool(arguments: Any, ctx: Any) -> str:
        raise raised

    with Runtime(store=MemoryStore(), scripted=RS.ScriptedModel(_once_then_text)) as rt:
        rt.ctx.tools.register(Tool("exit", "Exits.", {"type": "object"}, exit_tool))
        rt.subagents.register(SpawnProvider())
        parent = rt.agent()
        run = rt.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=[text_block("go")], parent=parent, signal=AbortController().signal
            ),
        )
        if isinstance(raised, (gevent.GreenletExit, Cancelled)):
            result = run.result.get(timeout=10)
        else:
            # gevent hands a greenlet's SystemExit and KeyboardInterrupt to the main greenlet,
            # as asyncio lets them out of its loop: the host sees the exit, and the run is
            # answered all the same.
            with pytest.raises(type(raised)):
                run.result.get(timeout=10)
            result = run.result.get(timeout=10)
        assert (result.stop_reason, result.diagnostic) == (stop, diagnostic)
        loaded = rt.store.inspect(run.session_id)
        assert not loaded.needs_repair  # the turn was closed: `turn/end`, every call answered
        (end,) = [e for e in loaded.events if e["type"] == "turn/end"]
        assert end["data"]["reason"] == stop
        # The call ran and was cut: its answer says by what, not that it never ran.
        (answer,) = [e["data"] for e in loaded.events if e["type"] == "tool/result"]
        assert answer["content"][0]["text"].startswith("not answered: the tool")
        run.dispose()


class _Holding:
    """A `hold` tool registered on `k`: it notes the greenlet of the turn that calls it (the
    tool runs in it) and waits there until that greenlet is killed."""

    def __init__(self, k: Kit) -> None:
        self.inside = Event()
        self._turns: list[greenlet] = []
        k.tool("hold", self._hold)

    @property
    def turn(self) -> greenlet:
        return self._turns[0]

    def _hold(self, args: Mapping[str, Any], ctx: ToolContext) -> str:
        self._turns.append(gevent.getcurrent())
        self.inside.set()
        gevent.sleep(60)  # the kill comes first
        return "late"


def test_a_killed_turn_ends_aborted_and_the_next_message_still_runs() -> None:
    """A stray `gevent.kill` of the greenlet running a turn ends that turn, not the child."""
    with kit() as k:
        holding = _Holding(k)
        a = k.agent()
        k.model.script(a.id, [S.tool_call("hold", {}), S.text("second answer")])
        a.send("first").get()
        holding.inside.wait(timeout=10)
        a.send("second").get()  # queued behind the running turn
        gevent.kill(holding.turn)
        outcome = a.when_idle().get()
        assert outcome.reason == "completed"
        assert outcome.output == [{"type": "text", "text": "second answer"}]
        ends = [e["data"] for e in of_type(k.events(a), "turn/end")]
        assert ends == [
            {"turn": 1, "reason": "aborted", "cause": "the turn was killed"},
            {"turn": 2, "reason": "completed"},
        ]
        (result,) = [e["data"] for e in of_type(k.events(a), "tool/result")]
        assert result["is_error"]


def test_a_killed_turn_with_nothing_queued_leaves_the_child_idle_and_usable() -> None:
    with kit() as k:
        holding = _Holding(k)
        a = k.agent()
        k.model.script(a.id, [S.tool_call("hold", {}), S.text("again")])
        a.send("first").get()
        holding.inside.wait(timeout=10)
        waiting = a.when_idle()
        gevent.kill(holding.turn)
        assert waiting.get().reason == "aborted"
        assert a.status == "idle" and not a.turn_running
        a.send("next").get()
        assert a.when_idle().get().output == [{"type": "text", "text": "again"}]


@pytest.mark.parametrize(
    ("raised", "code", "text"),
    [
        (gevent.GreenletExit(), "ABORTED", "not answered: the tool's greenlet was killed"),
        (Cancelled("stray"), "TOOL_FAILED", "not answered: the tool raised Cancelled: stray"),
    ],
)
def test_a_kill_in_a_concurrent_batch_leaves_only_that_call_unanswered_and_says_why(
    raised: BaseException, code: str, text: str
) -> None:
    with kit() as k:

        def exits(args: Mapping[str, Any], ctx: ToolContext) -> str:
            raise raised

        k.tool("exits", exits, safe=True)
        k.tool("fine", lambda args, ctx: "fine", safe=True)
        a = k.agent()
        k.model.script(a.id, [S.tool_calls([("exits", {}), ("fine", {})]), S.text("went on")])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert outcome.reason == "completed"
        results = [e["data"] for e in of_type(k.events(a), "tool/result")]
        assert [(r.get("code"), r["content"][0]["text"]) for r in results] == [
            (code, text),
            (None, "fine"),
        ]


@pytest.mark.parametrize("raised", [SystemExit(5), KeyboardInterrupt()])
def test_an_exit_raised_in_a_concurrent_batch_ends_the_turn_as_an_inline_one_does(
    raised: BaseException,
) -> None:
    """The process is asked to exit: the turn ends `error` (no next model request), the batch's
    other calls are cut and answered, and the exit reaches the host once the turn is closed."""
    with kit() as k:
        entered = Event()

        def waits(args: Mapping[str, Any], ctx: ToolContext) -> str:
            entered.set()
            gevent.sleep(60)  # cut when the batch closes
            return "late"

        def exits(args: Mapping[str, Any], ctx: ToolContext) -> str:
            entered.wait(timeout=10)
            raise raised

        k.tool("waits", waits, safe=True)
        k.tool("exits", exits, safe=True)
        a = k.agent()
        k.model.script(a.id, [S.tool_calls([("waits", {}), ("exits", {})]), S.text("went on")])
        a.send("go").get()
        seen: list[BaseException] = []
        try:
            outcome = a.when_idle().get()
        except (SystemExit, KeyboardInterrupt) as exc:  # gevent hands it to the main greenlet
            seen.append(exc)
            outcome = a.when_idle().get()
        assert seen == [raised]
        assert (outcome.reason, outcome.message) == ("error", _cause_of(raised))
        events = k.events(a)
        assert [e["data"]["reason"] for e in of_type(events, "turn/end")] == ["error"]
        assert not of_type(events, "assistant/message")[1:]  # no second model request
        results = [e["data"] for e in of_type(events, "tool/result")]
        assert [(r["code"], r["content"][0]["text"]) for r in results] == [
            ("ABORTED", "not answered: the tool's greenlet was killed"),
            ("TOOL_FAILED", f"not answered: the tool raised {_cause_of(raised)}"),
        ]


def _cause_of(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
