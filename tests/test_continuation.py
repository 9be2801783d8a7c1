"""Continuable children (issue 4 of 8): start_continuable, send_message (steered or started),
cold resume (after unregistering the provider, in a new Runtime), descriptors, authorization,
settlement notices, interrupt, tasks, and every error code of the continuation operations."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import gevent
import pytest
from seam_kit import Gate, Kit, assert_log_valid, kit, last_user_text, wait_until

from actors.agents import create_agent
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.options import AgentOptions
from agent.store import SessionStore
from agent.tools import Tool
from providers.inprocess import SpawnProvider
from subagent.descriptor import SubagentDescriptor, authoritative_descriptor
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.types import (
    MessageSource,
    SubagentCapabilities,
    SubagentResumeRequest,
    SubagentRun,
    SubagentStartRequest,
    ToolRestriction,
    text_block,
)
from supervision.signal import AbortController

Events = list[Mapping[str, Any]]


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Kit]:
    with kit(store=SessionStore(tmp_path)) as the_kit:
        yield the_kit


def coord(parent: Any) -> MessageSource:
    return MessageSource.coordinator(parent.id)


def add_noop(k: Kit) -> None:
    k.runtime.ctx.tools.register(
        Tool(name="noop", description="noop", parameters={"type": "object"}, fn=lambda a, c: "ok")
    )


def kinds(events: Events) -> list[str]:
    return [e["type"] for e in events]


def user_texts(events: Events) -> list[str]:
    out = []
    for e in events:
        if e["type"] == "user/message":
            out.append("".join(b.get("text", "") for b in e["data"]["message"]["content"]))
    return out


def stored(k: Kit, session_id: str) -> Events:
    return list(k.store.inspect(session_id).events)


def gated_on(prompts: dict[str, Gate]) -> Callable[[ModelRequest], S.Step]:
    """Answers `done: <last user text>`, first waiting at the gate named by that text."""

    def respond(request: ModelRequest) -> S.Step:
        said = last_user_text(request)
        gate = prompts.get(said)
        if gate is not None:
            gate.wait(request.signal)
            request.signal.raise_if_aborted()
        return S.text(f"done: {said}")

    return respond


def start(k: Kit, parent: Any, prompt: str = "first", **kw: Any) -> Any:
    label = kw.pop("label", "helper")
    child_id = kw.pop("child_id", None)
    provider = kw.pop("provider", "spawn")
    return k.service.start_continuable(
        provider, k.request(parent, prompt, **kw), label=label, child_id=child_id
    )


def settled_notices(parent: Any) -> Events:
    return [
        e
        for e in parent.log.events
        if e["type"] == "inbox/accepted" and e["data"]["source"]["kind"] == "subagent-settled"
    ]


def code_of(info: pytest.ExceptionInfo[SubagentError]) -> str:
    return info.value.code


# -- starting ------------------------------------------------------------------------------


def test_start_resolves_on_acceptance_not_on_turn_end(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"first": gate})
    parent = k.parent()
    started = start(k, parent)
    # Returned while the first turn is still in its model call.
    assert k.runtime.tasks.get(started.task_id).status == "running"
    child = k.runtime.ctx.agents[started.child_id]
    assert child.header.parent_session == parent.id
    assert child.header.origin == "subagent"
    events = child.log.events
    accepted = [e for e in events if e["type"] == "inbox/accepted"]
    assert [e["data"]["message_id"] for e in accepted] == [started.message_id]
    gate.open()
    task = k.runtime.tasks.wait(started.task_id)
    assert task.status == "completed"
    assert task.output == [text_block("done: first")]
    assert task.owner == parent.id
    assert task.label == "helper"


def test_caller_child_id_is_published_verbatim(k: Kit) -> None:
    parent = k.parent()
    started = start(k, parent, child_id="schosen01")
    assert started.child_id == "schosen01"
    k.runtime.tasks.wait(started.task_id)
    assert k.store.inspect("schosen01").header.parent_session == parent.id


def test_descriptor_is_logged_in_the_first_turn_before_the_first_request(k: Kit) -> None:
    add_noop(k)
    parent = k.parent()
    started = start(
        k,
        parent,
        persona="You are terse.",
        tool_filter=ToolRestriction(deny=("noop",)),
        output_schema={"type": "object", "properties": {"x": {"type": "string"}}},
        label="researcher",
    )
    k.runtime.tasks.wait(started.task_id)
    events = assert_log_valid(k.store, started.child_id)
    order = kinds(events)
    assert order.count("subagent/descriptor") == 1
    at = order.index("subagent/descriptor")
    assert order.index("turn/start") < at < order.index("request/header")
    assert order.index("assistant/message") > at
    descriptor = events[at]["data"]["descriptor"]
    assert descriptor == {
        "version": 1,
        "provider": "spawn",
        "label": "researcher",
        "model": "scripted:default",
        "persona": "You are terse.",
        "tool_filter": {"deny": ["noop"]},
    }  # never depth, never the output schema, never the whole options object
    # Resume: the composition comes back from the descriptor; no second descriptor is logged.
    result = k.service.send_message(parent, started.child_id, "again", coord(parent))
    k.runtime.tasks.wait(result.task_id or "")
    events = assert_log_valid(k.store, started.child_id)
    assert kinds(events).count("subagent/descriptor") == 1
    requests = k.model.requests_for(started.child_id)
    assert len(requests) >= 2
    for request in requests:  # log-only: never part of the model's history
        assert "descriptor" not in repr(request.messages)
        assert "You are terse." in request.system
        assert "noop" not in [t.name for t in request.tools]


def test_unsupported_capability_for_a_provider_without_resume(k: Kit) -> None:
    class NoResume:
        name = "plain"
        capabilities = SubagentCapabilities.all()
        inherits_parent_context = False

        def start(self, request: SubagentStartRequest) -> Any:
            raise AssertionError("never reached")

    k.service.register(NoResume())
    parent = k.parent()
    before = {h.id for h in k.store.list()}
    with pytest.raises(SubagentError) as info:
        start(k, parent, provider="plain")
    assert code_of(info) == "UNSUPPORTED_CAPABILITY"
    assert {h.id for h in k.store.list()} == before


def test_persistence_unavailable_on_a_memory_store() -> None:
    with kit() as k:
        parent = k.parent()
        with pytest.raises(SubagentError) as info:
            start(k, parent)
        assert code_of(info) == "PERSISTENCE_UNAVAILABLE"
        with pytest.raises(SubagentError) as info:
            k.service.send_message(parent, "sabc", "hi", coord(parent))
        assert code_of(info) == "PERSISTENCE_UNAVAILABLE"
        assert [h for h in k.store.list() if h.origin == "subagent"] == []


def test_continuation_unavailable_without_tasks(k: Kit) -> None:
    parent = k.parent()
    tasks, k.runtime.ctx.tasks = k.runtime.ctx.tasks, None
    try:
        with pytest.raises(SubagentError) as info:
            start(k, parent)
        assert code_of(info) == "CONTINUATION_UNAVAILABLE"
        with pytest.raises(SubagentError) as info:
            k.service.send_message(parent, "sabc", "hi", coord(parent))
        assert code_of(info) == "CONTINUATION_UNAVAILABLE"
    finally:
        k.runtime.ctx.tasks = tasks
    assert [h for h in k.store.list() if h.origin == "subagent"] == []


def test_bad_labels_are_refused_before_anything_starts(k: Kit) -> None:
    parent = k.parent()
    with pytest.raises(ValueError):
        start(k, parent, label="   ")
    with pytest.raises(TypeError):
        start(k, parent, label=7)
    assert [h for h in k.store.list() if h.origin == "subagent"] == []


def test_no_untracked_activation_once_the_task_service_closed(k: Kit) -> None:
    parent = k.parent()
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    k.runtime.tasks.close()
    with pytest.raises(SubagentError) as info:
        start(k, parent)
    assert code_of(info) == "RUNTIME_CLOSED"
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, first.child_id, "more", coord(parent))
    assert code_of(info) == "RUNTIME_CLOSED"
    assert [h.id for h in k.store.list() if h.origin == "subagent"] == [first.child_id]
    assert user_texts(stored(k, first.child_id)) == ["first"]


def test_duplicate_child_live_and_stored(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"first": gate})
    parent = k.parent()
    started = start(k, parent, child_id="sdup01")
    with pytest.raises(SubagentError) as info:  # live
        start(k, parent, "again", child_id="sdup01")
    assert code_of(info) == "DUPLICATE_CHILD"
    gate.open()
    k.runtime.tasks.wait(started.task_id)
    assert "sdup01" not in k.runtime.ctx.agents
    before = stored(k, "sdup01")
    with pytest.raises(SubagentError) as info:  # stored
        start(k, parent, "again", child_id="sdup01")
    assert code_of(info) == "DUPLICATE_CHILD"
    assert stored(k, "sdup01") == before
    assert len(k.runtime.tasks.list(parent.id)) == 1


def test_concurrent_starts_with_one_child_id_yield_one_child(k: Kit) -> None:
    parent = k.parent()
    jobs = [gevent.spawn(start, k, parent, f"p{i}", child_id="srace01") for i in range(3)]
    gevent.joinall(jobs)
    ok = [j.value for j in jobs if j.successful()]
    failed = [j.exception for j in jobs if not j.successful()]
    assert len(ok) == 1
    assert all(isinstance(e, SubagentError) and e.code == "DUPLICATE_CHILD" for e in failed)
    k.runtime.tasks.wait(ok[0].task_id)


# -- messages: steered, started, races -------------------------------------------------------


def test_steered_when_the_live_activation_admits_the_message(k: Kit) -> None:
    add_noop(k)
    gate = Gate()

    def respond(request: ModelRequest) -> S.Step:
        if request.step == 1:
            gate.wait(request.signal)
            return S.tool_call("noop", {})
        return S.text(f"final: {last_user_text(request)}")

    k.respond = respond
    parent = k.parent()
    started = start(k, parent)
    gate.reached.wait()
    sending = gevent.spawn(k.service.send_message, parent, started.child_id, "more", coord(parent))
    child = k.runtime.ctx.agents[started.child_id]
    wait_until(lambda: bool(child.actor._steers))
    gate.open()
    result = sending.get()
    assert result.kind == "steered"
    assert result.task_id == started.task_id
    task = k.runtime.tasks.wait(started.task_id)
    assert task.output == [text_block("final: more")]
    events = assert_log_valid(k.store, started.child_id)
    assert kinds(events).count("turn/start") == 1
    message = next(e for e in events if e["type"] == "user/message" and "more" in repr(e))
    assert message["data"]["message"]["source"] == coord(parent).to_json()
    assert len(k.runtime.tasks.list(parent.id)) == 1


def test_started_when_the_child_is_stored(k: Kit) -> None:
    parent = k.parent()
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    result = k.service.send_message(parent, first.child_id, "second", MessageSource.user())
    assert result.kind == "started"
    assert result.task_id not in (None, first.task_id)
    assert result.message_id
    task = k.runtime.tasks.wait(result.task_id or "")
    assert task.status == "completed"
    assert task.output == [text_block("done: second")]
    events = assert_log_valid(k.store, first.child_id)
    assert user_texts(events) == ["first", "second"]
    turn2 = [e for e in events if e["type"] == "user/message"][1]
    assert turn2["data"]["message"]["id"] == result.message_id
    assert turn2["data"]["message"]["source"] == {"kind": "user"}
    # The resumed turn saw the whole conversation.
    assert "done: first" in repr(k.model.requests_for(first.child_id)[-1].messages)


def test_message_racing_the_last_step_waits_for_settlement_and_cold_resumes(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"first": gate})
    parent = k.parent()
    started = start(k, parent)
    gate.reached.wait()
    sending = gevent.spawn(
        k.service.send_message, parent, started.child_id, "racing", coord(parent)
    )
    child = k.runtime.ctx.agents[started.child_id]
    wait_until(lambda: bool(child.actor._steers))  # the live turn took it as a steer...
    gate.open()  # ...but its last step ends the turn before any step boundary admits it
    result = sending.get()
    assert result.kind == "started"
    task = k.runtime.tasks.wait(result.task_id or "")
    assert task.output == [text_block("done: racing")]
    events = assert_log_valid(k.store, started.child_id)
    assert user_texts(events) == ["first", "racing"]  # never lost
    assert kinds(events).count("inbox/discarded") == 1  # the refused steer, accounted for
    assert k.runtime.tasks.get(started.task_id).status == "completed"


def test_message_arriving_while_the_child_settles_waits_then_cold_resumes(k: Kit) -> None:
    parent = k.parent()
    hold = Gate()
    held: list[str] = []

    def on_settled(task: Any) -> None:  # runs inside the settlement, under the child's lock
        if not held:
            held.append(task.id)
            hold.wait()

    k.runtime.tasks.on_settled(on_settled)
    started = start(k, parent)
    hold.reached.wait()  # the first activation is mid-settlement
    sending = gevent.spawn(k.service.send_message, parent, started.child_id, "late", coord(parent))
    gevent.sleep(0)
    assert not sending.ready()  # waits for the settlement...
    hold.open()
    result = sending.get()
    assert result.kind == "started"  # ...then resumes cold
    assert k.runtime.tasks.wait(result.task_id or "").output == [text_block("done: late")]
    assert user_texts(assert_log_valid(k.store, started.child_id)) == ["first", "late"]


def test_message_holding_the_lock_over_an_ended_run_waits_for_its_settlement(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"first": gate})
    parent = k.parent()
    started = start(k, parent)
    gate.reached.wait()
    record = k.service._continuation._children[started.child_id]
    handle = record.handle
    record.lock.acquire()  # white box: order the sender before the settlement
    try:
        sending = gevent.spawn(
            k.service.send_message, parent, started.child_id, "after the end", coord(parent)
        )
        gevent.sleep(0)  # the sender queues on the lock first
        gate.open()
        wait_until(lambda: handle.settled)  # the run ended; its settlement queues second
    finally:
        record.lock.release()
    result = sending.get()
    assert result.kind == "started"
    assert k.runtime.tasks.wait(result.task_id or "").output == [text_block("done: after the end")]
    assert user_texts(assert_log_valid(k.store, started.child_id)) == ["first", "after the end"]


def test_concurrent_messages_to_a_stored_child_are_all_delivered(k: Kit) -> None:
    parent = k.parent()
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    jobs = [
        gevent.spawn(k.service.send_message, parent, first.child_id, f"m{i}", coord(parent))
        for i in range(4)
    ]
    results = [j.get() for j in jobs]
    for result in results:
        if result.task_id is not None:
            k.runtime.tasks.wait(result.task_id)
    wait_until(lambda: first.child_id not in k.runtime.ctx.agents)
    texts = user_texts(assert_log_valid(k.store, first.child_id))
    assert sorted(texts[1:]) == ["m0", "m1", "m2", "m3"]


def test_aborting_the_signal_after_acceptance_does_not_cancel_the_turn(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"second": gate})
    parent = k.parent()
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    controller = AbortController()
    result = k.service.send_message(
        parent, first.child_id, "second", coord(parent), controller.signal
    )
    assert result.kind == "started"
    gate.reached.wait()
    controller.abort("caller gave up")
    gate.open()
    task = k.runtime.tasks.wait(result.task_id or "")
    assert task.status == "completed"
    assert task.output == [text_block("done: second")]


def test_start_signal_aborted_after_acceptance_does_not_cancel_the_turn(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"first": gate})
    parent = k.parent()
    controller = AbortController()
    started = start(k, parent, signal=controller.signal)
    gate.reached.wait()
    controller.abort("tool call returned")
    gate.open()
    assert k.runtime.tasks.wait(started.task_id).status == "completed"


def test_an_already_aborted_signal_is_refused_and_nothing_is_logged(k: Kit) -> None:
    parent = k.parent()
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    before = stored(k, first.child_id)
    controller = AbortController()
    controller.abort("never mind")
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, first.child_id, "x", coord(parent), controller.signal)
    assert code_of(info) == "ABORTED"
    assert stored(k, first.child_id) == before


class _Unsteerable:
    """A run without the steering capability (like a remote run that cannot steer)."""

    def __init__(self, run: Any) -> None:
        self._run = run
        self.message_id = run.message_id

    id = property(lambda self: self._run.id)
    local_agent = property(lambda self: self._run.local_agent)
    result = property(lambda self: self._run.result)

    def cancel(self, cause: Any = None) -> None:
        self._run.cancel(cause)

    def dispose(self) -> None:
        self._run.dispose()


class UnsteerableProvider(SpawnProvider):
    def start(self, request: SubagentStartRequest) -> Any:
        return _Unsteerable(super().start(request))

    def resume(self, request: SubagentResumeRequest) -> Any:
        return _Unsteerable(super().resume(request))


def test_a_live_activation_that_cannot_steer_hands_the_message_to_the_next(k: Kit) -> None:
    k.service.register(UnsteerableProvider("nosteer"))
    gate = Gate()
    k.respond = gated_on({"first": gate})
    parent = k.parent()
    started = start(k, parent, provider="nosteer")
    gate.reached.wait()
    sending = gevent.spawn(
        k.service.send_message, parent, started.child_id, "queued up", coord(parent)
    )
    gevent.sleep(0)
    assert not sending.ready()  # waits for the running activation...
    gate.open()
    result = sending.get()
    assert result.kind == "started"  # ...then starts the next one with the message
    assert k.runtime.tasks.wait(result.task_id or "").output == [text_block("done: queued up")]
    assert user_texts(assert_log_valid(k.store, started.child_id)) == ["first", "queued up"]


# -- authorization and lookup errors --------------------------------------------------------


def test_unknown_child(k: Kit) -> None:
    parent = k.parent()
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, "snosuchchild", "hi", coord(parent))
    assert code_of(info) == "UNKNOWN_CHILD"
    with pytest.raises(SubagentError) as info:
        k.service.interrupt("snosuchchild", by=parent)
    assert code_of(info) == "UNKNOWN_CHILD"


def test_an_invalid_child_id_is_a_bad_argument_never_a_path(k: Kit) -> None:
    parent = k.parent()
    for bad in ("../escape", "", "a/b"):
        with pytest.raises(ValueError):
            k.service.send_message(parent, bad, "hi", coord(parent))
        with pytest.raises(ValueError):
            k.service.interrupt(bad, by=parent)
        with pytest.raises(ValueError):
            start(k, parent, child_id=bad)


def test_unauthorized_stranger_and_sibling_and_nothing_is_logged(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"sibling": gate})
    parent = k.parent()
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    sibling_start = start(k, parent, "sibling")
    sibling = k.runtime.ctx.agents[sibling_start.child_id]  # live, same parent
    stranger = k.parent()
    before = stored(k, first.child_id)
    for sender in (stranger, sibling):
        with pytest.raises(SubagentError) as info:
            k.service.send_message(sender, first.child_id, "hijack", coord(sender))
        assert code_of(info) == "UNAUTHORIZED"
    # A source grants no authority: naming the parent as the sender does not help.
    with pytest.raises(SubagentError) as info:
        k.service.send_message(stranger, first.child_id, "hijack", coord(parent))
    assert code_of(info) == "UNAUTHORIZED"
    assert stored(k, first.child_id) == before
    assert first.child_id not in k.runtime.ctx.agents
    gate.open()
    k.runtime.tasks.wait(sibling_start.task_id)


def test_unauthorized_stale_parent_object(k: Kit) -> None:
    parent = k.parent()
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    wait_until(lambda: parent.status == "idle")
    parent.close("rebuilt")
    rebuilt = k.runtime.resume_agent(parent.id)
    before = stored(k, first.child_id)
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, first.child_id, "from the past", coord(parent))
    assert code_of(info) == "UNAUTHORIZED"
    assert stored(k, first.child_id) == before
    result = k.service.send_message(rebuilt, first.child_id, "now", coord(rebuilt))
    assert result.kind == "started"
    assert k.runtime.tasks.wait(result.task_id or "").output == [text_block("done: now")]


def write_child(k: Kit, parent: Any, descriptor: Any, *, depth: int = 1) -> str:
    """A stored subagent session of `parent` whose first turn logged `descriptor` (raw)."""
    agent = create_agent(
        k.runtime.ctx,
        options=AgentOptions(model="scripted:default"),
        parent_session=parent.id,
        origin="subagent",
        delegation_depth=depth,
    )
    if descriptor is not None:
        agent.before_first_request(
            lambda: agent.core.add_event("subagent/descriptor", {"descriptor": descriptor})
        )
    agent.send("hello").get()
    agent.when_idle().get()
    agent.close()
    return str(agent.id)


@pytest.mark.parametrize(
    "descriptor",
    [
        None,  # no descriptor at all (e.g. a one-shot child)
        {"version": 99, "provider": "spawn", "label": "x", "model": "scripted:default"},
        {"version": 1, "provider": "spawn", "model": "scripted:default"},  # no label
        "not an object",
    ],
    ids=["missing", "unknown-version", "malformed", "not-an-object"],
)
def test_not_resumable_without_a_usable_descriptor(k: Kit, descriptor: Any) -> None:
    parent = k.parent()
    child_id = write_child(k, parent, descriptor)
    before = stored(k, child_id)
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, child_id, "continue", coord(parent))
    assert code_of(info) == "NOT_RESUMABLE"
    assert stored(k, child_id) == before
    assert child_id not in k.runtime.ctx.agents
    if isinstance(descriptor, dict) and descriptor.get("version") == 1:
        assert "label" in str(info.value)  # names the field


def test_not_resumable_for_a_one_shot_child(k: Kit) -> None:
    parent = k.parent()
    run = k.start(parent)
    run.result.get(timeout=5)
    run.dispose()
    with pytest.raises(SubagentError) as info:
        k.service.send_message(parent, run.id, "continue", coord(parent))
    assert code_of(info) == "NOT_RESUMABLE"


# -- cold resume ------------------------------------------------------------------------------


def test_cold_resume_after_the_provider_was_unregistered(k: Kit) -> None:
    unregister = k.service.register(SpawnProvider("ephemeral"))
    parent = k.parent()
    first = start(k, parent, provider="ephemeral")
    k.runtime.tasks.wait(first.task_id)
    unregister()
    with pytest.raises(SubagentError):  # removal blocks new starts...
        start(k, parent, provider="ephemeral")
    result = k.service.send_message(parent, first.child_id, "still there?", coord(parent))
    assert result.kind == "started"  # ...but not the resume of an accepted child
    task = k.runtime.tasks.wait(result.task_id or "")
    assert task.output == [text_block("done: still there?")]
    k.flush_events()
    starts = k.events_of("subagent/start")
    ends = k.events_of("subagent/end")
    assert [e["provider"] for e in starts] == ["ephemeral", "ephemeral"]
    assert [e["provider"] for e in ends] == ["ephemeral", "ephemeral"]


def test_each_activation_emits_its_own_start_end_pair(k: Kit) -> None:
    parent = k.parent()
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    for text in ("two", "three"):
        result = k.service.send_message(parent, first.child_id, text, coord(parent))
        k.runtime.tasks.wait(result.task_id or "")
    k.flush_events()
    lifecycle = [e for e in k.events if e["type"] in ("subagent/start", "subagent/end")]
    assert [e["type"] for e in lifecycle] == ["subagent/start", "subagent/end"] * 3
    run_ids = [e["run_id"] for e in lifecycle]
    assert run_ids[0::2] == run_ids[1::2]
    assert len(set(run_ids)) == 3
    for event in lifecycle:
        assert event["id"] == first.child_id
        assert event["local"] is True
        assert event["provider"] == "spawn"
        assert event["parent_id"] == parent.id


def test_cold_resume_in_a_new_runtime_over_the_same_store(tmp_path: Path) -> None:
    with kit(store=SessionStore(tmp_path)) as k:
        parent = k.parent()
        first = start(k, parent, persona="You are terse.")
        k.runtime.tasks.wait(first.task_id)
        parent_id, child_id = parent.id, first.child_id
    model = S.ScriptedModel(lambda request: S.text(f"again: {last_user_text(request)}"))
    with Runtime(store=SessionStore(tmp_path), scripted=model) as rt:
        rt.subagents.register(SpawnProvider())
        rebuilt = rt.resume_agent(parent_id)
        rows = rt.subagents.list_children(parent_id)
        assert [(r["id"], r["activity"], r["label"]) for r in rows] == [
            (child_id, "stored", "helper")
        ]
        result = rt.subagents.send_message(rebuilt, child_id, "hello again", coord(rebuilt))
        assert result.kind == "started"
        task = rt.tasks.wait(result.task_id or "")
        assert task.output == [text_block("again: hello again")]
        events = assert_log_valid(rt.store, child_id)
        turn_ends = [e["data"] for e in events if e["type"] == "turn/end"]
        assert turn_ends == [  # the finished first turn still reads as finished
            {"turn": 1, "reason": "completed"},
            {"turn": 2, "reason": "completed"},
        ]
        assert [e["seq"] for e in events] == list(range(len(events)))
        request = model.requests_for(child_id)[-1]
        assert "You are terse." in request.system
        assert "done: first" in repr(request.messages)  # rebuilt from its own log
        # The notice reached the rebuilt parent, not the old runtime's object.
        assert len(settled_notices(rebuilt)) == 2


def test_the_first_descriptor_after_the_fork_prefix_is_authoritative(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"second": gate})
    parent = k.parent()
    a = start(k, parent, label="outer")
    k.runtime.tasks.wait(a.task_id)
    again = k.service.send_message(parent, a.child_id, "second", coord(parent))
    gate.reached.wait()  # a's second turn runs; its first (with its descriptor) is complete
    a_agent = k.runtime.ctx.agents[a.child_id]
    forked = k.service.start_continuable("fork", k.request(a_agent, "forked work"), label="inner")
    k.runtime.tasks.wait(forked.task_id)
    header = k.store.inspect(forked.child_id).header
    events = assert_log_valid(k.store, forked.child_id)
    descriptors = [e for e in events if e["type"] == "subagent/descriptor"]
    assert len(descriptors) == 2  # a's, inherited in the seed, then its own
    assert descriptors[0]["seq"] < header.seed_length <= descriptors[1]["seq"]
    [row] = k.service.list_children(a.child_id)
    assert (row["id"], row["label"]) == (forked.child_id, "inner")
    gate.open()
    k.runtime.tasks.wait(again.task_id or "")
    wait_until(lambda: a.child_id not in k.runtime.ctx.agents)
    # Its parent must be live to resume it: rebuild a, then address the forked child.
    rebuilt_a = k.runtime.resume_agent(a.child_id)
    result = k.service.send_message(rebuilt_a, forked.child_id, "more", coord(rebuilt_a))
    assert result.kind == "started"
    assert k.runtime.tasks.get(result.task_id or "").label == "inner"
    k.runtime.tasks.wait(result.task_id or "")
    k.flush_events()
    forked_starts = [e for e in k.events_of("subagent/start") if e["id"] == forked.child_id]
    assert [e["provider"] for e in forked_starts] == ["fork", "fork"]
    rebuilt_a.close()


def test_raw_resume_dispatches_a_resolved_request(k: Kit) -> None:
    parent = k.parent()
    first = start(k, parent, label="raw")
    k.runtime.tasks.wait(first.task_id)
    events = stored(k, first.child_id)
    found = authoritative_descriptor(events, 0)
    assert isinstance(found, SubagentDescriptor)
    source = MessageSource("subagent-report")
    request = SubagentResumeRequest(
        session_id=first.child_id,
        prompt=[text_block("raw turn")],
        source=source,
        parent=parent,
        signal=AbortController().signal,
        descriptor=found,
    )
    run = k.service.resume(request)
    assert run.id == first.child_id
    result = run.result.get(timeout=5)
    assert result.output == [text_block("done: raw turn")]
    run.dispose()
    events = assert_log_valid(k.store, first.child_id)
    last = [e for e in events if e["type"] == "user/message"][-1]
    assert last["data"]["message"]["source"] == source.to_json()
    assert len(k.runtime.tasks.list(parent.id)) == 1  # the raw operation owns no task


class _StartOnly:
    """A provider that can start children but not resume them (no `resume` method)."""

    name = "start-only"
    inherits_parent_context = False

    def __init__(self, inner: SpawnProvider) -> None:
        self._inner = inner
        self.capabilities = inner.capabilities

    def start(self, request: SubagentStartRequest) -> SubagentRun:
        return self._inner.start(request)


def test_raw_resume_with_a_provider_that_cannot_resume_is_refused_before_admission(
    tmp_path: Path,
) -> None:
    # The service narrows the provider to `Resumable` before it asks for a slot (the registry
    # refuses it too): a clean code, and no admission slot held by the refused resume.
    with kit(store=SessionStore(tmp_path), max_children=1) as k:
        k.service.register(_StartOnly(SpawnProvider()))
        parent = k.parent()
        request = SubagentResumeRequest(
            session_id="s0123456789abcdef",
            prompt=[text_block("go")],
            source=MessageSource("subagent-report"),
            parent=parent,
            signal=AbortController().signal,
            descriptor=SubagentDescriptor(
                provider="start-only", label="x", model="scripted:default"
            ),
        )
        with pytest.raises(SubagentError) as caught:
            k.service.resume(request)
        assert caught.value.code == "UNSUPPORTED_CAPABILITY"
        # The one slot is still free: a start is admitted and completes.
        run = k.service.start("start-only", k.request(parent, "after"))
        assert run.result.get(timeout=5).output == [text_block("done: after")]
        run.dispose()


def test_depth_comes_from_the_stored_header(k: Kit) -> None:
    parent = k.parent()
    descriptor = {"version": 1, "provider": "spawn", "label": "deep", "model": "scripted:default"}
    child_id = write_child(k, parent, descriptor, depth=4)
    gate = Gate()
    k.respond = gated_on({"go": gate})
    result = k.service.send_message(parent, child_id, "go", coord(parent))
    assert result.kind == "started"
    child = k.runtime.ctx.agents[child_id]
    assert parent.depth == 0
    assert child.depth == 4  # never lowered to parent.depth + 1
    gate.open()
    k.runtime.tasks.wait(result.task_id or "")
    assert k.store.inspect(child_id).header.delegation_depth == 4


# -- settlement notices ---------------------------------------------------------------------


def test_one_settlement_notice_per_activation_delivered_before_release(k: Kit) -> None:
    parent = k.parent()
    seen_at_release: list[int] = []

    def on_closing(agent: Any) -> None:
        if agent.header.parent_session == parent.id:
            seen_at_release.append(len(settled_notices(parent)))

    k.runtime.ctx.lifecycle.on_closing(on_closing)
    first = start(k, parent)
    k.runtime.tasks.wait(first.task_id)
    second = k.service.send_message(parent, first.child_id, "second", coord(parent))
    k.runtime.tasks.wait(second.task_id or "")
    notices = settled_notices(parent)
    assert len(notices) == 2
    assert seen_at_release == [1, 2]  # each notice was in before the child was released
    for notice, closing in zip(notices, ["done: first", "done: second"], strict=True):
        data = notice["data"]
        summary = data["source"]["summary"]
        assert "\n" not in summary and first.child_id in summary and "completed" in summary
        assert data["content"][0] == text_block(summary)
        assert data["content"][1:] == [text_block(closing)]


def test_notice_summary_is_one_line_for_a_failed_activation(k: Kit) -> None:
    k.respond = lambda request: S.error("upstream said no\nand then\nsome more")
    parent = k.parent()
    first = start(k, parent)
    task = k.runtime.tasks.wait(first.task_id)
    assert task.status == "failed"
    [notice] = settled_notices(parent)
    summary = notice["data"]["source"]["summary"]
    assert "\n" not in summary
    assert "error" in summary
    assert first.child_id in summary


# -- interrupt -------------------------------------------------------------------------------


def test_interrupt_cancels_the_turn_and_keeps_queued_messages(k: Kit) -> None:
    gates = {"first": Gate(), "next": Gate()}
    k.respond = gated_on(gates)
    parent = k.parent()
    started = start(k, parent)
    gates["first"].reached.wait()
    child = k.runtime.ctx.agents[started.child_id]
    queued_id = child.send("queued").get()
    assert k.service.interrupt(started.child_id, by=parent) is True
    task = k.runtime.tasks.wait(started.task_id)
    assert task.status == "killed"
    events = assert_log_valid(k.store, started.child_id)
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == ["aborted"]
    claimed_or_dropped = {
        e["data"]["message_id"] for e in events if e["type"] in ("inbox/claimed", "inbox/discarded")
    }
    assert queued_id not in claimed_or_dropped  # kept
    # The next activation runs the kept message first, then the new one; its result is its own.
    result = k.service.send_message(parent, started.child_id, "next", coord(parent))
    assert result.kind == "started"
    gates["next"].reached.wait()
    assert k.runtime.tasks.get(result.task_id or "").status == "running"
    gates["next"].open()
    task = k.runtime.tasks.wait(result.task_id or "")
    assert task.status == "completed"
    assert task.output == [text_block("done: next")]
    wait_until(lambda: started.child_id not in k.runtime.ctx.agents)
    events = assert_log_valid(k.store, started.child_id)
    assert user_texts(events) == ["first", "queued", "next"]
    turn_ends = [e["data"]["reason"] for e in events if e["type"] == "turn/end"]
    assert turn_ends == ["aborted", "completed", "completed"]


def test_only_an_ancestor_may_interrupt(k: Kit) -> None:
    gates = {"first": Gate(), "grand": Gate()}
    k.respond = gated_on(gates)
    parent = k.parent()
    started = start(k, parent)
    child = k.runtime.ctx.agents[started.child_id]
    grand = k.service.start_continuable("spawn", k.request(child, "grand"), label="grandchild")
    stranger = k.parent()
    for who, target in ((stranger, started.child_id), (stranger, grand.child_id)):
        with pytest.raises(SubagentError) as info:
            k.service.interrupt(target, by=who)
        assert code_of(info) == "UNAUTHORIZED"
    grandchild = k.runtime.ctx.agents[grand.child_id]
    with pytest.raises(SubagentError) as info:  # a descendant is not an ancestor
        k.service.interrupt(started.child_id, by=grandchild)
    assert code_of(info) == "UNAUTHORIZED"
    gates["grand"].reached.wait()
    assert k.service.interrupt(grand.child_id, by=parent) is True  # grandparent: allowed
    assert k.runtime.tasks.wait(grand.task_id).status == "killed"
    assert k.runtime.tasks.get(started.task_id).status == "running"
    gates["first"].open()
    assert k.runtime.tasks.wait(started.task_id).status == "completed"


def test_interrupting_a_settled_child_is_a_no_op(k: Kit) -> None:
    parent = k.parent()
    started = start(k, parent)
    k.runtime.tasks.wait(started.task_id)
    before = stored(k, started.child_id)
    assert k.service.interrupt(started.child_id, by=parent) is False
    assert stored(k, started.child_id) == before
    assert started.child_id not in k.runtime.ctx.agents


# -- tasks ----------------------------------------------------------------------------------


def test_each_activation_is_one_task_with_the_right_status(k: Kit) -> None:
    gate = Gate()
    k.respond = gated_on({"killed": gate, "boom": Gate()})
    tasks = k.runtime.tasks
    parent = k.parent()
    first = start(k, parent, label="worker")
    assert tasks.wait(first.task_id).status == "completed"
    k.respond = lambda request: (
        S.error("bad gateway") if last_user_text(request) == "fail" else k_default(request)
    )
    failed = k.service.send_message(parent, first.child_id, "fail", coord(parent))
    failed_task = tasks.wait(failed.task_id or "")
    assert failed_task.status == "failed"
    assert "bad gateway" in (failed_task.detail or "")
    k.respond = gated_on({"killed": gate})
    killed = k.service.send_message(parent, first.child_id, "killed", coord(parent))
    gate.reached.wait()
    assert tasks.kill(killed.task_id or "", "enough") is True
    assert tasks.wait(killed.task_id or "").status == "killed"
    wait_until(lambda: first.child_id not in k.runtime.ctx.agents)
    events = assert_log_valid(k.store, first.child_id)
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"][-1] == "aborted"
    owned = tasks.list(parent.id)
    assert [t.id for t in owned] == [first.task_id, failed.task_id, killed.task_id]
    assert [t.label for t in owned] == ["worker"] * 3
    assert [t.status for t in owned] == ["completed", "failed", "killed"]
    assert tasks.list(k.parent().id) == []


def k_default(request: ModelRequest) -> S.Step:
    return S.text(f"done: {last_user_text(request)}")


class ClosesTasksOnStart(SpawnProvider):
    """Starts the child, then the runtime's task service closes (as when the runtime shuts
    down while a start is under way): the task cannot be registered after the start."""

    def __init__(self, name: str, close: Callable[[], None]) -> None:
        super().__init__(name)
        self._close = close

    def start(self, request: SubagentStartRequest) -> Any:
        run = super().start(request)
        self._close()
        return run


def test_an_activation_whose_task_cannot_be_registered_is_cancelled_and_disposed(k: Kit) -> None:
    k.service.register(ClosesTasksOnStart("closing", k.runtime.tasks.close))
    gate = Gate()
    k.respond = gated_on({"first": gate})  # would work until the test ends
    parent = k.parent()
    with pytest.raises(SubagentError) as info:
        start(k, parent, provider="closing")
    assert code_of(info) == "RUNTIME_CLOSED"
    # Cancelled and disposed before the call returned: its end was emitted, nothing is left.
    k.flush_events()
    assert kinds(k.events_of("subagent/start")) == ["subagent/start"]
    [end] = k.events_of("subagent/end")
    assert end["stop_reason"] == "aborted"
    assert k.service.runs() == []
    assert list(k.runtime.ctx.agents) == [parent.id]
