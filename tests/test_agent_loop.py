"""Agent loop (issue [2 of 8], part 3): steering, cancellation, tools, every turn end.

Every test closes its agents and replays the invariants of every stored log (`Kit.close`).
The helpers at the top are shared with test_agent_resume.py and test_agent_actor.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import gevent
import pykka
import pytest
from gevent.event import Event

from actors.agent_handle import Agent
from actors.agents import create_agent, pending_inbox
from agent.context import AgentContext
from agent.events import TURN_END_REASONS
from agent.events import Event as LogEvent
from agent.log import validate_log
from agent.loop import TurnBlocked, TurnOutcome
from agent.model import MAX_ARGUMENT_DEPTH, ModelRequest
from agent.models import ModelRegistry
from agent.models import scripted as S
from agent.models.scripted import ScriptedModel
from agent.options import AgentOptions
from agent.store import MemoryStore, SessionStore
from agent.tools import Tool, ToolContext, ToolScope
from subagent.errors import SubagentError

OBJECT: Mapping[str, Any] = {"type": "object"}


class Kit:
    """One agent context over a store, with the scripted model registered as `scripted`."""

    def __init__(self, store: MemoryStore | SessionStore | None = None) -> None:
        self.model = ScriptedModel()
        models = ModelRegistry()
        models.register("scripted", self.model)
        self.store = store if store is not None else MemoryStore()
        self.ctx = AgentContext(store=self.store, models=models)
        self.checked: list[str] = []

    def agent(self, **kwargs: Any) -> Agent:
        if "max_steps" in kwargs:
            kwargs["options"] = AgentOptions(max_steps=kwargs.pop("max_steps"))
        return create_agent(self.ctx, **kwargs)

    def tool(
        self,
        name: str,
        fn: Callable[[Mapping[str, Any], ToolContext], Any],
        *,
        safe: bool = False,
        parameters: Mapping[str, Any] = OBJECT,
    ) -> Tool:
        tool = Tool(name, f"the {name} tool", parameters, fn, concurrency_safe=safe)
        self.ctx.tools.register(tool)
        return tool

    def close(self) -> None:
        """Close every live agent, then replay every stored log's invariants."""
        for agent in list(self.ctx.agents.values()):
            agent.close("test over")
        for header in self.store.list():
            validate_log(self.store.load(header.id).events, header)
            self.checked.append(header.id)

    def events(self, agent: Agent) -> list[LogEvent]:
        events = list(agent.log.events)
        validate_log(events, agent.header)
        return events


@contextmanager
def kit(store: MemoryStore | SessionStore | None = None) -> Iterator[Kit]:
    k = Kit(store)
    try:
        yield k
    finally:
        k.close()


def types(events: list[LogEvent]) -> list[str]:
    return [e["type"] for e in events]


def of_type(events: list[LogEvent], kind: str) -> list[LogEvent]:
    return [e for e in events if e["type"] == kind]


def wait_for(predicate: Callable[[], bool], what: str = "condition") -> None:
    """Yield to the hub until `predicate()` holds; a bounded number of scheduler turns."""
    for _ in range(10_000):
        if predicate():
            return
        gevent.sleep(0)
    raise AssertionError(f"never happened: {what}")


def is_done(future: Any) -> bool:
    try:
        future.get(timeout=0)
    except pykka.Timeout:
        return False
    except Exception:
        return True
    return True


class Gate:
    """A tool body (or model responder) that reports it was reached and waits to be opened."""

    def __init__(self) -> None:
        self.reached = Event()
        self.opened = Event()

    def open(self) -> None:
        self.opened.set()

    def wait(self) -> None:
        self.reached.set()
        self.opened.wait()


# ----------------------------------------------------------------------------------------------
# plain turns and every turn end
# ----------------------------------------------------------------------------------------------


def test_a_text_answer_completes_the_turn() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.text("hello")])
        a.send("hi").get()
        outcome = a.when_idle().get()
        assert (outcome.turn, outcome.reason) == (1, "completed")
        assert outcome.output == [{"type": "text", "text": "hello"}]
        events = k.events(a)
        assert types(events) == [
            "inbox/accepted",
            "inbox/claimed",
            "turn/start",
            "user/message",
            "request/header",
            "assistant/message",
            "turn/end",
        ]
        assert events[-1]["data"] == {"turn": 1, "reason": "completed"}


@pytest.mark.parametrize(
    ("step", "reason", "logged"),
    [
        (S.max_tokens("partial"), "max-tokens", "max-tokens"),
        # Logged as `refusal` once the turn/end vocabulary knows it, else as `completed` (the
        # assistant message's finish says `refusal` either way); the outcome says `refusal`.
        (S.refusal("no"), "refusal", "refusal" if "refusal" in TURN_END_REASONS else "completed"),
    ],
)
def test_max_tokens_and_refusal_end_the_turn(step: S.Step, reason: str, logged: str) -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [step])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert outcome.reason == reason
        assert outcome.fault is None
        events = k.events(a)
        assert of_type(events, "turn/end")[-1]["data"]["reason"] == logged
        assert of_type(events, "assistant/message")[-1]["data"]["finish"] == step.kind.replace(
            "_", "-"
        )


def test_max_tokens_ends_the_turn_even_with_tool_calls_pending_in_the_answer() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.max_tokens("cut")])
        a.send("go").get()
        assert a.when_idle().get().reason == "max-tokens"
        assert not of_type(k.events(a), "tool/result")
        logged = of_type(k.events(a), "assistant/message")[0]["data"]["message"]
        assert logged["tool_calls"] == []  # no call opened, none answered


def test_model_error_ends_the_turn_error_with_its_message() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.error("upstream 503")])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert (outcome.reason, outcome.message) == ("error", "upstream 503")
        end = of_type(k.events(a), "turn/end")[-1]["data"]
        assert end == {"turn": 1, "reason": "error", "message": "upstream 503"}


def test_max_steps_ends_the_turn_error_after_exactly_that_many_steps() -> None:
    with kit() as k:
        k.tool("noop", lambda args, ctx: "ok")
        a = k.agent(max_steps=3)
        k.model.script(a.id, [S.tool_call("noop")], repeat=True)
        a.send("go").get()
        outcome = a.when_idle().get()
        assert outcome.reason == "error"
        assert outcome.message == "max_steps (3) reached"
        events = k.events(a)
        assert len(of_type(events, "assistant/message")) == 3  # a reply a step (format 3)
        assert len(k.model.requests_for(a.id)) == 3


def test_turns_are_numbered_and_history_carries_over() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.text("one"), S.text("two")])
        a.send("first").get()
        a.send("second").get()
        assert a.when_idle().get().turn == 2
        second = k.model.requests_for(a.id)[1]
        assert [m["role"] for m in second.messages] == ["user", "assistant", "user"]
        assert (second.turn, second.step) == (2, 1)


# ----------------------------------------------------------------------------------------------
# steering
# ----------------------------------------------------------------------------------------------


def test_steer_is_admitted_at_the_next_step_boundary_and_resolves_at_admission() -> None:
    with kit() as k:
        gate = Gate()
        k.tool("slow", lambda args, ctx: (gate.wait(), "slow done")[1])
        a = k.agent()
        seen_at_request: list[bool] = []
        steer_future: list[Any] = []

        def respond(request: ModelRequest) -> S.Step:
            if request.step == 1:
                return S.tool_call("slow")
            seen_at_request.append(is_done(steer_future[0]))
            return S.text("steered")

        k.model._responder = respond
        a.send("start").get()
        gate.reached.wait()
        steer_future.append(a.steer("go left"))
        wait_for(lambda: bool(a.actor._steers), "the steer reached the actor")
        # The tool still runs: no boundary yet, so the steer is not admitted.
        assert not is_done(steer_future[0])
        gate.open()
        assert steer_future[0].get().startswith("s")  # the admitted message id
        assert a.when_idle().get().reason == "completed"
        assert seen_at_request == [True]  # fulfilled before the request that contains it
        events = k.events(a)
        # Format 3: the steer is logged right after the first step's last result, before the
        # second step's reply (no step/start is written).
        replies = [i for i, e in enumerate(events) if e["type"] == "assistant/message"]
        first_result = next(i for i, e in enumerate(events) if e["type"] == "tool/result")
        after = events[first_result + 1]
        assert replies[0] < first_result < replies[1]
        assert after["type"] == "user/message"
        assert after["data"]["message"]["content"] == [{"type": "text", "text": "go left"}]
        steer_id = after["data"]["message"]["id"]
        accepted = [e for e in of_type(events, "inbox/accepted") if e["data"]["kind"] == "steer"]
        assert [e["data"]["message_id"] for e in accepted] == [steer_id]
        assert accepted[0]["seq"] < first_result
        assert {"message_id": steer_id} in [e["data"] for e in of_type(events, "inbox/claimed")]
        requests = k.model.requests_for(a.id)
        assert requests[1].messages[-1] == {
            "role": "user",
            "content": [{"type": "text", "text": "go left"}],
        }
        assert all(
            m.get("content") != [{"type": "text", "text": "go left"}] for m in requests[0].messages
        )


def test_several_steers_are_admitted_together_in_arrival_order() -> None:
    with kit() as k:
        gate = Gate()
        k.tool("slow", lambda args, ctx: (gate.wait(), "ok")[1])
        a = k.agent()
        k.model.script(a.id, [S.tool_call("slow"), S.text("done")])
        a.send("start").get()
        gate.reached.wait()
        futures = [a.steer("one"), a.steer("two")]
        wait_for(lambda: len(a.actor._steers) == 2)
        gate.open()
        for f in futures:
            f.get()
        a.when_idle().get()
        last = k.model.requests_for(a.id)[1].messages
        assert [m["content"][0]["text"] for m in last[-2:]] == ["one", "two"]


def test_steer_with_no_running_turn_is_rejected_and_not_logged() -> None:
    with kit() as k:
        a = k.agent()
        with pytest.raises(SubagentError) as info:
            a.steer("anyone?").get()
        assert info.value.code == "RUN_TERMINAL"
        assert not of_type(k.events(a), "inbox/accepted")


def test_steer_pending_when_the_turn_ends_is_rejected_and_discarded() -> None:
    with kit() as k:
        gate = Gate()
        a = k.agent()

        def respond(request: ModelRequest) -> S.Step:
            gate.wait()
            return S.text("final answer, no more boundaries")

        k.model._responder = respond
        a.send("go").get()
        gate.reached.wait()
        late = a.steer("too late")
        wait_for(lambda: bool(a.actor._steers))
        gate.open()
        with pytest.raises(SubagentError) as info:
            late.get()
        assert info.value.code == "RUN_TERMINAL"
        assert a.when_idle().get().reason == "completed"
        events = k.events(a)
        (steer,) = [e for e in of_type(events, "inbox/accepted") if e["data"]["kind"] == "steer"]
        steer_id = steer["data"]["message_id"]
        discarded = of_type(events, "inbox/discarded")
        assert [d["data"]["message_id"] for d in discarded] == [steer_id]
        assert discarded[0]["seq"] > of_type(events, "turn/end")[0]["seq"]
        assert len(of_type(events, "turn/start")) == 1  # never became a turn of its own


def test_steer_after_cancel_is_rejected() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.hang()])
        a.send("go").get()
        wait_for(lambda: bool(k.model.requests_for(a.id)))
        cancelled = a.cancel("stop")
        with pytest.raises(SubagentError):
            a.steer("after").get()
        assert cancelled.get().reason == "aborted"


# ----------------------------------------------------------------------------------------------
# cancellation
# ----------------------------------------------------------------------------------------------


def test_cancel_mid_model_call_ends_the_turn_aborted_with_its_cause() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.hang()])
        a.send("go").get()
        wait_for(lambda: bool(k.model.requests_for(a.id)), "the model call started")
        assert a.status == "running"
        outcome = a.cancel("the user said stop").get()
        assert (outcome.reason, outcome.cause) == ("aborted", "the user said stop")
        assert a.status == "idle"
        end = of_type(k.events(a), "turn/end")[-1]["data"]
        assert end == {"turn": 1, "reason": "aborted", "cause": "the user said stop"}


def test_cancel_mid_stream_keeps_the_partial_text_as_output() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.chunks(["par", "tial", "never"], latency=3600)])
        seen = Event()
        a.add_progress_listener(lambda e: seen.set() if e["kind"] == "model/chunk" else None)
        a.send("go").get()
        seen.wait()
        outcome = a.cancel().get()
        assert outcome.reason == "aborted"
        assert outcome.output == [{"type": "text", "text": "par"}]


def test_cancel_mid_tool_call_the_tool_honours_its_signal() -> None:
    with kit() as k:
        entered = Event()

        def obedient(args: Mapping[str, Any], ctx: ToolContext) -> str:
            entered.set()
            ctx.signal.wait()
            ctx.signal.raise_if_aborted()
            return "unreachable"

        k.tool("obedient", obedient)
        k.tool("after", lambda args, ctx: "never runs")
        a = k.agent()
        k.model.script(a.id, [S.tool_calls([("obedient", {}), ("after", {})])])
        a.send("go").get()
        entered.wait()
        outcome = a.cancel("enough").get()
        assert (outcome.reason, outcome.cause) == ("aborted", "enough")
        results = of_type(k.events(a), "tool/result")
        assert [(r["data"]["name"], r["data"]["code"]) for r in results] == [
            ("obedient", "ABORTED"),
            ("after", "ABORTED"),
        ]
        assert results[1]["data"]["content"][0]["text"].startswith("not run")
        assert all(r["data"]["is_error"] for r in results)


def test_cancel_abandons_a_tool_that_ignores_its_signal() -> None:
    with kit() as k:
        entered, never = Event(), Event()
        unwound: list[str] = []

        def stubborn(args: Mapping[str, Any], ctx: ToolContext) -> str:
            entered.set()
            try:
                never.wait()  # not the signal: only abandonment gets it out
            finally:
                unwound.append("unwound")
            return "unreachable"

        k.tool("stubborn", stubborn)
        a = k.agent()
        k.model.script(a.id, [S.tool_call("stubborn")])
        a.send("go").get()
        entered.wait()
        outcome = a.cancel("give up").get()
        assert outcome.reason == "aborted"
        assert unwound == ["unwound"]  # the call was unwound, not left running
        (result,) = of_type(k.events(a), "tool/result")
        assert result["data"]["code"] == "ABORTED"
        assert result["data"]["content"][0]["text"].startswith("abandoned")


def test_cancel_kills_parallel_tools_that_ignore_their_signal() -> None:
    with kit() as k:
        never = Event()
        entered: list[str] = []
        unwound: list[str] = []

        def stubborn(args: Mapping[str, Any], ctx: ToolContext) -> str:
            entered.append(ctx.call_id)
            try:
                never.wait()
            finally:
                unwound.append(ctx.call_id)
            return "unreachable"

        k.tool("stubborn", stubborn, safe=True)
        a = k.agent()
        k.model.script(a.id, [S.tool_calls([("stubborn", {}), ("stubborn", {})])])
        a.send("go").get()
        wait_for(lambda: len(entered) == 2)
        assert a.cancel().get().reason == "aborted"
        assert sorted(unwound) == sorted(entered)
        results = of_type(k.events(a), "tool/result")
        assert [r["data"]["code"] for r in results] == ["ABORTED", "ABORTED"]


def test_cancel_discards_queued_sends_unless_keep_inbox() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.hang()])
        a.send("running").get()
        queued = [a.send("queued 1").get(), a.send("queued 2").get()]
        wait_for(lambda: bool(k.model.requests_for(a.id)))
        assert a.cancel().get().reason == "aborted"
        events = k.events(a)
        discarded = of_type(events, "inbox/discarded")
        assert [d["data"] for d in discarded] == [
            {"message_id": m, "reason": "cancelled"} for m in queued
        ]
        assert pending_inbox(events) == []
        assert len(of_type(events, "turn/start")) == 1


def test_cancel_with_keep_inbox_keeps_queued_sends_for_the_next_send() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.hang(), S.text("r1"), S.text("r2"), S.text("r3")])
        a.send("running").get()
        a.send("kept 1").get()
        a.send("kept 2").get()
        wait_for(lambda: bool(k.model.requests_for(a.id)))
        assert a.cancel(keep_inbox=True).get().reason == "aborted"
        assert a.status == "idle"  # held: nothing starts by itself
        assert len(k.model.requests_for(a.id)) == 1
        events = k.events(a)
        assert not of_type(events, "inbox/discarded")
        assert [m["content"][0]["text"] for m in pending_inbox(events)] == ["kept 1", "kept 2"]
        a.send("new").get()
        assert a.when_idle().get().turn == 4
        prompts = [
            e["data"]["message"]["content"][0]["text"]
            for e in k.events(a)
            if e["type"] == "user/message"
        ]
        assert prompts == ["running", "kept 1", "kept 2", "new"]


def test_cancel_when_idle_resolves_at_once_with_the_last_outcome() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.text("x")])
        assert a.cancel().get() is None
        a.send("go").get()
        first = a.when_idle().get()
        assert a.cancel().get() is first


# ----------------------------------------------------------------------------------------------
# tools
# ----------------------------------------------------------------------------------------------


def test_concurrency_safe_tools_run_in_parallel() -> None:
    with kit() as k:
        ready = {"a": Event(), "b": Event()}

        def meet(args: Mapping[str, Any], ctx: ToolContext) -> str:
            me, other = args["me"], "b" if args["me"] == "a" else "a"
            ready[me].set()
            # Serially this would deadlock: the bound only turns a hang into a failure.
            if not ready[other].wait(timeout=10):
                raise RuntimeError("ran serially")
            return f"{me} met {other}"

        k.tool("meet", meet, safe=True)
        a = k.agent()
        k.model.script(
            a.id, [S.tool_calls([("meet", {"me": "a"}), ("meet", {"me": "b"})]), S.text("ok")]
        )
        a.send("go").get()
        assert a.when_idle().get().reason == "completed"
        results = of_type(k.events(a), "tool/result")
        assert [r["data"]["content"][0]["text"] for r in results] == ["a met b", "b met a"]


def test_unsafe_tools_run_serially() -> None:
    with kit() as k:
        trace: list[str] = []

        def step(args: Mapping[str, Any], ctx: ToolContext) -> str:
            trace.append(f"start {args['n']}")
            gevent.sleep(0)  # a switch point where a parallel sibling would interleave
            trace.append(f"end {args['n']}")
            return "ok"

        k.tool("step", step)
        a = k.agent()
        k.model.script(a.id, [S.tool_calls([("step", {"n": 1}), ("step", {"n": 2})]), S.text("ok")])
        a.send("go").get()
        a.when_idle().get()
        assert trace == ["start 1", "end 1", "start 2", "end 2"]


def test_results_are_committed_in_model_order_and_batches_split_at_unsafe_calls() -> None:
    with kit() as k:
        second_done = Event()
        trace: list[str] = []

        def first(args: Mapping[str, Any], ctx: ToolContext) -> str:
            second_done.wait(timeout=10)
            trace.append("first")
            return "first"

        def second(args: Mapping[str, Any], ctx: ToolContext) -> str:
            trace.append("second")
            second_done.set()
            return "second"

        k.tool("first", first, safe=True)
        k.tool("second", second, safe=True)
        k.tool("barrier", lambda args, ctx: (trace.append("barrier"), "barrier")[1])
        a = k.agent()
        calls = [("first", {}), ("second", {}), ("barrier", {}), ("second", {})]
        k.model.script(a.id, [S.tool_calls(calls), S.text("ok")])
        a.send("go").get()
        a.when_idle().get()
        assert trace == ["second", "first", "barrier", "second"]
        events = k.events(a)
        assert [e["data"]["name"] for e in of_type(events, "tool/result")] == [
            "first",
            "second",
            "barrier",
            "second",
        ]
        # Every call is logged before any runs (by its assistant/message, before dispatch).
        kinds = types(events)
        assert kinds.index("tool/result") > kinds.index("assistant/message")
        assert "tool/call" not in kinds
        history = k.model.requests_for(a.id)[1].messages
        assert [m["name"] for m in history if m["role"] == "tool"] == [
            "first",
            "second",
            "barrier",
            "second",
        ]


def test_tool_errors_become_error_results_and_the_turn_continues() -> None:
    with kit() as k:

        def broken(args: Mapping[str, Any], ctx: ToolContext) -> str:
            raise ValueError("disk on fire")

        k.tool("broken", broken)
        k.tool(
            "typed",
            lambda args, ctx: "ok",
            parameters={
                "type": "object",
                "properties": {"n": {"type": "integer"}},
                "required": ["n"],
            },
        )
        k.tool("nan", lambda args, ctx: [{"type": "text", "text": "x", "score": float("nan")}])
        a = k.agent()
        calls = [("missing", {}), ("typed", {"n": "x"}), ("broken", {}), ("nan", {})]
        k.model.script(a.id, [S.tool_calls(calls), S.text("recovered")])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert outcome.reason == "completed"
        assert outcome.output == [{"type": "text", "text": "recovered"}]
        results = [r["data"] for r in of_type(k.events(a), "tool/result")]
        assert [(r["code"], r["is_error"]) for r in results] == [
            ("UNKNOWN_TOOL", True),
            ("INVALID_ARGS", True),
            ("TOOL_FAILED", True),
            ("TOOL_FAILED", True),
        ]
        assert "disk on fire" in results[2]["content"][0]["text"]
        second = k.model.requests_for(a.id)[1].messages
        assert [m["is_error"] for m in second if m["role"] == "tool"] == [True] * 4


def test_capture_concludes_the_turn_and_refuses_later_calls() -> None:
    with kit() as k:
        after: list[str] = []

        def submit(args: Mapping[str, Any], ctx: ToolContext) -> str:
            ctx.agent.core.capture(dict(args))
            return "captured"

        k.tool("submit", submit)
        k.tool("later", lambda args, ctx: (after.append("ran"), "x")[1])
        a = k.agent()
        k.model.script(a.id, [S.tool_calls([("submit", {"answer": 42}), ("later", {})])])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert (outcome.reason, outcome.structured) == ("completed", {"answer": 42})
        assert after == []
        results = [r["data"] for r in of_type(k.events(a), "tool/result")]
        assert [r.get("code") for r in results] == [None, "TURN_CONCLUDED"]
        with pytest.raises(RuntimeError):
            a.core.capture("outside a turn")


# ----------------------------------------------------------------------------------------------
# crashes are contained; observers cannot change a turn
# ----------------------------------------------------------------------------------------------


class _ExplodingScope(ToolScope):
    """Shows its tools, then fails to resolve them when the loop dispatches."""

    showing = False

    def spec_tuple(self) -> Any:  # what the loop shows the model (specs() copies it)
        self.showing = True
        try:
            return super().spec_tuple()
        finally:
            self.showing = False

    def resolve(self, name: str) -> Any:
        if self.showing:
            return super().resolve(name)
        raise RuntimeError("registry corrupted")


class _BrokenExecuteScope(ToolScope):
    def execute(self, call: Any, ctx: ToolContext) -> Any:
        raise KeyError("execute broke its contract")


@pytest.mark.parametrize(
    ("scope", "needle"),
    [(_ExplodingScope, "registry corrupted"), (_BrokenExecuteScope, "execute broke")],
)
def test_a_crashing_tool_layer_ends_the_turn_error_with_a_balanced_log(
    scope: type[ToolScope], needle: str
) -> None:
    with kit() as k:
        k.tool("a", lambda args, ctx: "x")
        a = k.agent(tools=scope(k.ctx.tools))
        k.model.script(a.id, [S.tool_calls([("a", {}), ("a", {})]), S.text("unreached")])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert outcome.reason == "error"
        assert needle in (outcome.message or "")
        assert outcome.fault is None
        events = k.events(a)
        assert len(of_type(events, "tool/result")) == 2
        assert of_type(events, "turn/end")[-1]["data"]["reason"] == "error"


@pytest.mark.parametrize(
    ("scope", "needle"),
    [(_ExplodingScope, "registry corrupted"), (_BrokenExecuteScope, "execute broke")],
)
def test_a_crashing_tool_layer_on_a_lone_call_ends_the_turn_error(
    scope: type[ToolScope], needle: str
) -> None:
    """A step's only call runs on its own path (`AgentCore._run_lone`): the same containment."""
    with kit() as k:
        k.tool("a", lambda args, ctx: "x")
        a = k.agent(tools=scope(k.ctx.tools))
        k.model.script(a.id, [S.tool_call("a", {}), S.text("unreached")])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert outcome.reason == "error" and needle in (outcome.message or "")
        assert outcome.fault is None
        events = k.events(a)
        (result,) = of_type(events, "tool/result")
        assert result["data"]["is_error"] and result["data"]["code"] == "TOOL_FAILED"
        assert of_type(events, "turn/end")[-1]["data"]["reason"] == "error"
        assert len(k.model.requests_for(a.id)) == 1


def test_a_crashing_model_adapter_is_contained_as_error() -> None:
    with kit() as k:
        a = k.agent()

        def respond(request: ModelRequest) -> S.Step:
            raise ZeroDivisionError("adapter bug")

        k.model._responder = respond
        a.send("go").get()
        outcome = a.when_idle().get()
        assert outcome.reason == "error"
        assert outcome.message == "ZeroDivisionError: adapter bug"
        # The agent is still usable: the next turn runs.
        k.model.script(a.id, [S.text("fine")])
        a.send("again").get()
        assert a.when_idle().get().reason == "completed"


def test_a_raising_progress_listener_never_changes_the_turn() -> None:
    with kit() as k:
        k.tool("noop", lambda args, ctx: "ok")
        a = k.agent()
        seen: list[str] = []

        def bad(event: dict[str, Any]) -> None:
            seen.append(event["kind"])
            raise RuntimeError("observer bug")

        a.add_progress_listener(bad)
        k.model.script(a.id, [S.tool_call("noop"), S.text("done")])
        a.send("go").get()
        assert a.when_idle().get().reason == "completed"
        assert seen[0] == "turn/start" and seen[-1] == "turn/end"
        assert "tool/result" in seen


def test_before_first_request_hook_can_block_the_turn_or_crash_it() -> None:
    with kit() as k:
        a = k.agent()

        def block() -> None:
            raise TurnBlocked("policy says no")

        a.before_first_request(block)
        a.send("go").get()
        outcome = a.when_idle().get()
        assert (outcome.reason, outcome.message) == ("blocked", "policy says no")
        assert k.model.requests_for(a.id) == []

        def crash() -> None:
            raise RuntimeError("hook bug")

        a.before_first_request(crash)
        a.send("again").get()
        assert a.when_idle().get().reason == "error"
        ends = [e["data"]["reason"] for e in of_type(k.events(a), "turn/end")]
        assert ends == ["blocked", "error"]


def test_a_failing_log_is_an_infrastructure_fault_not_a_turn_end() -> None:
    with kit() as k:
        a = k.agent()
        k.model.script(a.id, [S.text("x")])
        faults: list[TurnOutcome] = []
        a.add_turn_listener(faults.append)

        def broken_checkpoint(point: str) -> None:
            raise OSError("disk full")

        a.core.log.checkpoint = broken_checkpoint  # type: ignore[method-assign]
        a.send("go").get()
        outcome = a.when_idle().get()
        assert isinstance(outcome.fault, OSError)
        assert faults == [outcome]
        del a.core.log.checkpoint


# ----------------------------------------------------------------------------------------------
# model-provided JSON is data: no shape of it ends the turn
# ----------------------------------------------------------------------------------------------


def _nested(depth: int) -> dict[str, Any]:
    """Arguments `depth` levels deep: that many objects, each inside the one before."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


RECURSIVE = {
    "$defs": {"node": {"type": "object", "properties": {"a": {"$ref": "#/$defs/node"}}}},
    "$ref": "#/$defs/node",
}
PLAIN_NESTED = {"type": "object", "properties": {"a": {"type": "object"}}}


@pytest.mark.parametrize("depth", [MAX_ARGUMENT_DEPTH, MAX_ARGUMENT_DEPTH + 1, 300, 5_000, 20_000])
@pytest.mark.parametrize(
    "parameters", [OBJECT, PLAIN_NESTED, RECURSIVE], ids=["any", "fast", "ref"]
)
def test_deeply_nested_tool_arguments_are_an_error_result_the_model_can_retry(
    depth: int, parameters: Mapping[str, Any]
) -> None:
    """Issue 12 item 11: arguments nested > 200 levels ended the whole turn `error` with a
    TypeError (the log refused them). They are the model's mistake: it gets an error result it
    can read, and the turn goes on."""
    with kit() as k:
        ran: list[Mapping[str, Any]] = []
        k.tool("deep", lambda args, ctx: (ran.append(args), "ok")[1], parameters=parameters)
        a = k.agent()
        deep = _nested(depth)
        k.model.script(a.id, [S.tool_call("deep", deep), S.tool_call("deep", {}), S.text("done")])
        a.send("go").get()
        outcome = a.when_idle().get()
        assert (outcome.reason, outcome.output) == ("completed", [{"type": "text", "text": "done"}])
        events = k.events(a)
        results = [e["data"] for e in of_type(events, "tool/result")]
        assert [(r["is_error"], r.get("code")) for r in results[1:]] == [(False, None)]
        # A retry must be possible after every depth: the turn went on to the third step.
        assert len(k.model.requests_for(a.id)) == 3
        if depth <= MAX_ARGUMENT_DEPTH:  # within the limit: an ordinary call that ran
            assert not results[0]["is_error"] and len(ran) == 2
            return
        assert results[0]["code"] == "INVALID_ARGS" and ran == [{}]
        text = results[0]["content"][0]["text"]
        assert f"nested deeper than {MAX_ARGUMENT_DEPTH} levels" in text and len(text) < 1_000
        # The model sees its call (arguments replaced by {}) and the error, in order.
        second = k.model.requests_for(a.id)[1].messages
        call = next(m for m in second if m["role"] == "assistant" and m.get("tool_calls"))
        assert call["tool_calls"][0]["arguments"] == {}
        (tool_message,) = [m for m in second if m["role"] == "tool"]
        assert tool_message["is_error"] and "nested deeper" in tool_message["content"][0]["text"]


@pytest.mark.parametrize(
    "arguments",
    [
        {"x": float("nan")},
        {"x": float("inf")},
        {"x": 2**70},
        {"x": ("a", "tuple")},
        {1: "key"},
        ["not", "an", "object"],
    ],
    ids=["nan", "inf", "big-int", "tuple", "int-key", "list"],
)
def test_tool_arguments_that_are_not_json_are_an_error_result_too(arguments: Any) -> None:
    """`json.loads` accepts NaN and huge ints; an adapter may hand over anything. None of it
    may end the turn: the log could not hold it, so the model is told and retries."""
    with kit() as k:
        k.tool("t", lambda args, ctx: "ok")
        a = k.agent()
        # Built by hand: the scripted constructors refuse a non-mapping up front.
        call = S.Step("tool_calls", calls=(("t", arguments, None),))  # type: ignore[arg-type]
        k.model.script(a.id, [call, S.text("done")])
        a.send("go").get()
        assert a.when_idle().get().reason == "completed"
        (result,) = [e["data"] for e in of_type(k.events(a), "tool/result")]
        assert result["is_error"] and result["code"] == "INVALID_ARGS"
        assert "invalid arguments for t" in result["content"][0]["text"]
