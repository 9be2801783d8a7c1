"""Child runs: identity, results, steering through run.steer and through the run actor's ref,
disposal, crash containment, cancellation reaching children, and lifecycle events."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import gevent
import pytest
from gevent.event import Event
from pykka import ActorDeadError
from seam_kit import Gate, Kit, assert_log_valid, kit, last_user_text, wait_until

from actors.run_actor import CancelRun, DisposeRun, Steer
from agent.model import ModelRequest
from agent.models import scripted as S
from providers.local_run import MAX_DIAGNOSTIC_BYTES
from subagent.errors import SubagentError
from subagent.types import MessageSource, Steerable, SubagentRun, text_block
from supervision.signal import AbortController


def step_gated(gates: dict[int, Gate], final: str = "final") -> Any:
    """A responder that waits at the gate of each step number (if any), then answers."""

    def respond(request: ModelRequest) -> S.Step:
        gate = gates.get(request.step)
        if gate is not None:
            gate.wait(request.signal)
            request.signal.raise_if_aborted()
        if request.step < max(gates, default=0) + 1:
            return S.tool_call("noop", {})
        return S.text(f"{final}: {last_user_text(request)}")

    return respond


def add_noop(k: Kit) -> None:
    from agent.tools import Tool

    k.runtime.ctx.tools.register(
        Tool(name="noop", description="noop", parameters={"type": "object"}, fn=lambda a, c: "ok")
    )


def test_local_run_identity_and_header() -> None:
    with kit() as k:
        parent = k.parent()
        run = k.start(parent, "hello")
        assert isinstance(run, SubagentRun)
        assert isinstance(run, Steerable)
        child = run.local_agent
        assert run.id == child.id
        header = k.store.load(run.id).header
        assert header.parent_session == parent.id
        assert header.origin == "subagent"
        result = run.result.get(timeout=5)
        assert result.stop_reason == "completed"
        assert result.output == [text_block("done: hello")]
        assert result.structured is None
        run.dispose()
        assert_log_valid(k.store, run.id)


def test_result_output_is_last_non_empty_assistant_message() -> None:
    with kit() as k:
        add_noop(k)
        replies = iter([S.tool_call("noop", {}, text="thinking"), S.text("")])
        k.respond = lambda r: next(replies)
        run = k.start(k.parent())
        assert run.result.get(timeout=5).output == [text_block("thinking")]
        run.dispose()


def test_steer_is_admitted_at_the_next_step_boundary() -> None:
    with kit() as k:
        add_noop(k)
        gate = Gate()
        k.respond = step_gated({1: gate})
        run = k.start(k.parent(), "first")
        gate.reached.wait()
        admitted = run.steer([text_block("more")], MessageSource.user())
        wait_until(lambda: bool(run.local_agent.actor._steers))  # queued in the child
        gate.open()
        steer_id = admitted.get(timeout=5)  # resolves with the admitted message's id
        result = run.result.get(timeout=5)
        assert result.output == [text_block("final: more")]
        events = assert_log_valid(k.store, run.id)
        kinds = [e["type"] for e in events]
        # Format 3: the steer follows the first step's last result, before the second reply.
        first_result = kinds.index("tool/result")
        assert kinds[first_result + 1] == "user/message"
        assert kinds[first_result + 1 :].index("assistant/message") > 0
        assert events[first_result + 1]["data"]["message"]["content"] == [text_block("more")]
        assert events[first_result + 1]["data"]["message"]["id"] == steer_id
        run.dispose()


def test_ref_ask_steer_behaves_like_run_steer_and_tell_is_fire_and_forget() -> None:
    with kit() as k:
        add_noop(k)
        gates = {1: Gate(), 2: Gate()}
        k.respond = step_gated(gates)
        run = k.start(k.parent(), "first")
        gates[1].reached.wait()
        asked = run.ref.ask(Steer([text_block("asked")], MessageSource.user()), block=False)
        wait_until(lambda: bool(run.local_agent.actor._steers))
        gates[1].open()
        assert isinstance(asked.get(timeout=5), str)
        gates[2].reached.wait()
        run.ref.tell(Steer([text_block("told")], MessageSource.user()))
        wait_until(lambda: bool(run.local_agent.actor._steers))
        gates[2].open()
        result = run.result.get(timeout=5)
        assert result.output == [text_block("final: told")]
        run.dispose()
        with pytest.raises(ActorDeadError):
            run.ref.ask(Steer([text_block("late")], MessageSource.user()))
        with pytest.raises(ActorDeadError):
            run.ref.tell(DisposeRun())


def test_steer_after_completion_is_rejected() -> None:
    with kit() as k:
        run = k.start(k.parent())
        run.result.get(timeout=5)
        with pytest.raises(SubagentError) as info:
            run.steer("too late").get(timeout=5)
        assert info.value.code == "RUN_TERMINAL"
        run.dispose()
        with pytest.raises(SubagentError) as info:
            run.steer("after dispose").get(timeout=5)
        assert info.value.code == "RUN_DISPOSED"


def test_steer_racing_the_last_step_is_rejected_never_queued() -> None:
    with kit() as k:
        gate = Gate()

        def respond(request: ModelRequest) -> S.Step:
            gate.wait(request.signal)
            return S.text("the end")  # no tool call: this step ends the turn

        k.respond = respond
        run = k.start(k.parent())
        gate.reached.wait()
        steer = run.steer("lost race")
        # Make sure the steer is queued in the child before the last step ends.
        wait_until(lambda: bool(run.local_agent.actor._steers))
        gate.open()
        with pytest.raises(SubagentError) as info:
            steer.get(timeout=5)
        assert info.value.code == "RUN_TERMINAL"
        assert run.result.get(timeout=5).stop_reason == "completed"
        run.dispose()
        events = assert_log_valid(k.store, run.id)
        assert [e["type"] for e in events].count("turn/start") == 1  # no queued turn
        assert any(e["type"] == "inbox/discarded" for e in events)


def test_a_told_steer_that_is_rejected_never_crashes_the_run_actor() -> None:
    with kit() as k:
        run = k.start(k.parent())
        run.result.get(timeout=5)
        run.ref.tell(Steer([text_block("late and told")], MessageSource.user()))
        run.ref.tell(object())  # not a message it knows: an ask would get the TypeError
        with pytest.raises(SubagentError) as info:
            run.ref.ask(Steer([text_block("late and asked")], MessageSource.user()))
        assert info.value.code == "RUN_TERMINAL"
        assert run.ref.is_alive()
        run.dispose()
        k.flush_events()
        assert len(k.events_of("subagent/end")) == 1


def test_dispose_is_idempotent_and_settles_aborted_with_partial_output() -> None:
    with kit() as k:
        k.respond = lambda r: S.hang()
        run = k.start(k.parent())
        run.dispose()
        run.dispose()
        result = run.result.get(timeout=5)
        assert result.stop_reason == "aborted"
        assert run.local_agent.status == "closed"
        assert_log_valid(k.store, run.id)
        k.flush_events()
        assert len(k.events_of("subagent/end")) == 1


def test_dispose_during_steer_rejects_the_steer() -> None:
    with kit() as k:
        add_noop(k)
        gate = Gate()
        k.respond = step_gated({1: gate})
        run = k.start(k.parent())
        gate.reached.wait()
        steer = run.steer("never admitted")
        run.dispose()
        with pytest.raises(SubagentError):
            steer.get(timeout=5)
        assert run.result.get(timeout=5).stop_reason == "aborted"


def test_cancel_through_ref_settles_aborted() -> None:
    with kit() as k:
        k.respond = lambda r: S.hang()
        run = k.start(k.parent())
        run.ref.tell(CancelRun("enough"))
        result = run.result.get(timeout=5)
        assert result.stop_reason == "aborted"
        assert result.diagnostic == "enough"
        run.dispose()


def test_signal_after_publication_cancels_with_partial_output() -> None:
    with kit() as k:
        first_chunk = Event()
        # The first chunk streams at once; the second would come only after a long pause.
        k.respond = lambda r: S.chunks(["partial ", "rest"], latency=60)
        controller = AbortController()
        k.service.subscribe_progress(
            lambda e: first_chunk.set() if e.get("kind") == "model/chunk" else None
        )
        run = k.start(k.parent(), signal=controller.signal)
        first_chunk.wait()
        controller.abort("parent gave up")
        result = run.result.get(timeout=5)
        assert result.stop_reason == "aborted"
        assert result.diagnostic == "parent gave up"
        assert result.output == [text_block("partial ")]
        run.dispose()
        assert_log_valid(k.store, run.id)


def test_crash_in_child_loop_is_contained_with_a_clipped_diagnostic() -> None:
    with kit() as k:
        parent = k.parent()

        def respond(request: ModelRequest) -> S.Step:
            if last_user_text(request) == "crash":
                raise RuntimeError("é" * 5000)
            return S.text("sibling fine")

        k.respond = respond
        crashing = k.start(parent, "crash")
        sibling = k.start(parent, "fine")
        result = crashing.result.get(timeout=5)
        assert result.stop_reason == "error"
        assert result.diagnostic is not None
        assert result.diagnostic.startswith("RuntimeError: é")
        encoded = result.diagnostic.encode("utf-8")
        assert len(encoded) <= MAX_DIAGNOSTIC_BYTES
        encoded.decode("utf-8")  # cut on a character boundary
        assert sibling.result.get(timeout=5).stop_reason == "completed"
        assert parent.status == "idle"
        crashing.dispose()
        sibling.dispose()
        assert_log_valid(k.store, crashing.id)


@pytest.mark.parametrize(
    ("step", "stop_reason"),
    [
        (S.max_tokens("cut"), "max-tokens"),
        (S.refusal("no"), "refusal"),
        (S.error("model down"), "error"),
    ],
)
def test_stop_reason_mapping(step: S.Step, stop_reason: str) -> None:
    with kit() as k:
        k.respond = lambda r: step
        run = k.start(k.parent())
        result = run.result.get(timeout=5)
        assert result.stop_reason == stop_reason
        if stop_reason == "error":
            assert result.diagnostic == "model down"
        run.dispose()


def test_lifecycle_events_pair_once_in_order_with_output() -> None:
    with kit() as k:
        parent = k.parent()
        seen_before_return: list[str] = []

        def on_event(event: Mapping[str, Any]) -> None:
            seen_before_return.append(event["type"])

        k.service.subscribe(on_event, parent_id=parent.id)
        run = k.start(parent, "x")
        assert seen_before_return[:1] == ["subagent/start"]  # emitted before start() returned
        run.result.get(timeout=5)
        run.dispose()
        k.flush_events()
        starts, ends = k.events_of("subagent/start"), k.events_of("subagent/end")
        assert len(starts) == len(ends) == 1
        assert starts[0]["run_id"] == ends[0]["run_id"]
        assert starts[0]["id"] == run.id and starts[0]["local"] is True
        assert starts[0]["provider"] == "spawn"
        assert ends[0]["stop_reason"] == "completed"
        assert ends[0]["last_assistant_message"] == [text_block("done: x")]
        assert k.events.index(starts[0]) < k.events.index(ends[0])


def test_end_without_output_omits_last_assistant_message() -> None:
    with kit() as k:
        k.respond = lambda r: S.hang()
        run = k.start(k.parent())
        run.dispose()
        k.flush_events()
        (end,) = k.events_of("subagent/end")
        assert "last_assistant_message" not in end
        assert end["stop_reason"] == "aborted"


def test_raising_listener_does_not_stop_others_and_run_ids_are_unique() -> None:
    with kit() as k:

        def bad(event: Mapping[str, Any]) -> None:
            raise ValueError("listener bug")

        k.service.subscribe(bad)
        good: list[Mapping[str, Any]] = []
        k.service.subscribe(good.append)
        parent = k.parent()
        runs = [k.start(parent, str(i)) for i in range(5)]
        for run in runs:
            run.result.get(timeout=5)
            run.dispose()
        k.flush_events()
        run_ids = {e["run_id"] for e in good if e["type"] == "subagent/start"}
        assert len(run_ids) == 5
        assert len([e for e in good if e["type"] == "subagent/end"]) == 5


def test_parent_subscription_sees_only_its_children() -> None:
    with kit() as k:
        a, b = k.parent(), k.parent()
        seen: list[str] = []
        k.service.subscribe(lambda e: seen.append(e["id"]), parent_id=a.id)
        run_a = k.start(a)
        run_b = k.start(b)
        for run in (run_a, run_b):
            run.result.get(timeout=5)
            run.dispose()
        k.flush_events()
        assert set(seen) == {run_a.id}


def test_cancelling_the_parent_cancels_its_children() -> None:
    with kit() as k:
        parent = k.parent()
        k.respond = lambda r: S.hang()
        runs = [k.start(parent, str(i)) for i in range(3)]
        parent.cancel("stop all").get(timeout=5)
        for run in runs:
            assert run.result.get(timeout=5).stop_reason == "aborted"
            run.dispose()


def test_closing_the_parent_disposes_children_first() -> None:
    with kit() as k:
        parent = k.parent()
        k.respond = lambda r: S.hang()
        run = k.start(parent)
        grandchild = k.start(run.local_agent)
        order: list[str] = []
        k.service.subscribe(
            lambda e: order.append(e["id"]) if e["type"] == "subagent/end" else None
        )
        parent.close()
        k.flush_events()
        assert order == [grandchild.id, run.id]
        assert run.local_agent.status == "closed"
        assert grandchild.local_agent.status == "closed"


def test_runtime_close_ends_every_run_exactly_once() -> None:
    k = Kit()
    k.respond = lambda r: S.hang()
    parent = k.parent()
    runs = [k.start(parent, str(i)) for i in range(10)]
    k.close()
    assert len(k.events_of("subagent/start")) == 10
    assert len(k.events_of("subagent/end")) == 10
    for run in runs:
        assert run.result.get(timeout=5).stop_reason == "aborted"


def test_provider_unregistered_while_a_run_is_live() -> None:
    with kit() as k:
        add_noop(k)
        gate = Gate()
        k.respond = step_gated({1: gate})
        parent = k.parent()
        run = k.start(parent)
        gate.reached.wait()
        k.unregister_spawn()
        with pytest.raises(SubagentError) as info:
            k.start(parent)
        assert info.value.code == "NO_PROVIDER"
        gate.open()
        assert run.result.get(timeout=5).stop_reason == "completed"
        run.dispose()


def test_abort_in_the_same_tick_as_start() -> None:
    with kit() as k:
        parent = k.parent()
        controller = AbortController()
        k.respond = lambda r: S.hang()
        outcome: list[Any] = []

        def starter() -> None:
            try:
                outcome.append(k.start(parent, signal=controller.signal))
            except SubagentError as exc:
                outcome.append(exc)

        g = gevent.spawn(starter)
        controller.abort("same tick")
        g.join()
        (got,) = outcome
        if isinstance(got, SubagentError):
            assert got.code == "ABORTED"
            assert [h.id for h in k.store.list()] == [parent.id]
        else:
            assert got.result.get(timeout=5).stop_reason == "aborted"
            got.dispose()
        k.flush_events()
        assert len(k.events_of("subagent/start")) == len(k.events_of("subagent/end"))
