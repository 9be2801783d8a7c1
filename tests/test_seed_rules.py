"""Rules of the seed (`subagent-seam.md`) that no other test held on its own.

Each test names its section of the seed. docs/seam.md, "The seed's rules and their tests", maps
every rule to the tests that fail when it breaks; these fill the gaps that map found.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gevent
from gevent.event import Event
from seam_kit import kit, last_user_text

from actors.gevent_actor import GeventFuture
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import SessionStore
from agent.tools import Tool, ToolContext
from providers.inprocess import SpawnProvider
from subagent.descriptor import SubagentDescriptor, authoritative_descriptor
from subagent.errors import SubagentDepthError, SubagentError
from subagent.service import RunHandle
from subagent.types import (
    COMPLETED,
    MessageSource,
    Resumable,
    Steerable,
    SubagentCapabilities,
    SubagentResult,
    SubagentResumeRequest,
    SubagentStartRequest,
    text_block,
)
from supervision.signal import AbortController


class _Settled:
    """A remote-style run with neither `steer` nor anything to resume: settled at once."""

    def __init__(self, run_id: str) -> None:
        self.id = run_id
        self.local_agent = None
        self.result: GeventFuture[SubagentResult] = GeventFuture()
        self.result.set(SubagentResult(output=[text_block("ok")], stop_reason=COMPLETED))

    def dispose(self) -> None:
        pass


class _PlainProvider:
    """A provider with only the required members: no `resume`."""

    name = "plain"
    capabilities = SubagentCapabilities()
    inherits_parent_context = False

    def start(self, request: SubagentStartRequest) -> _Settled:
        return _Settled(f"{request.parent.id}.plain")


def test_runtime_capabilities_are_discovered_by_the_presence_of_their_methods() -> None:
    """Seed, "Two kinds of capability": live steering is `SubagentRun.steer`, cold resume is
    `SubagentProvider.resume`; a run or provider without the method does not have it, and the
    service's handle of such a run does not grow one."""
    assert isinstance(SpawnProvider(), Resumable)
    assert not isinstance(_PlainProvider(), Resumable)
    with kit() as k:
        k.service.register(_PlainProvider())
        parent = k.parent()
        local: RunHandle = k.start(parent)
        remote: RunHandle = k.start(parent, provider="plain")
        assert isinstance(local, Steerable)
        assert not isinstance(remote, Steerable)
        assert not hasattr(remote, "steer")
        assert remote.result.get().stop_reason == COMPLETED
        for run in (local, remote):
            run.result.get()
            run.dispose()


def test_a_steer_keeps_its_source_in_the_log_and_reaches_the_model_as_a_user_message() -> None:
    """Seed, `SubagentRun.steer`: "`source` is retained on the admitted steering message without
    changing its user role in model history"."""
    requests: list[ModelRequest] = []
    waiting, release = Event(), Event()

    def respond(request: ModelRequest) -> S.Step | str:
        requests.append(request)
        if len(requests) == 1:
            return S.tool_call("wait", {})
        return S.text("done")

    with kit() as k:
        k.respond = respond

        def wait(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            waiting.set()
            release.wait()
            return "waited"

        k.runtime.ctx.tools.register(Tool("wait", "Wait.", {"type": "object"}, wait))
        parent = k.parent()
        run = k.start(parent)
        waiting.wait()
        steered = run.steer(
            [text_block("also check the docs")], MessageSource.coordinator(parent.id)
        )
        release.set()
        steered.get()
        assert run.result.get().stop_reason == COMPLETED
        # The model saw the steer as a plain user message: role user, its text, no source.
        last = requests[-1].messages[-1]
        assert last["role"] == "user"
        assert [b["text"] for b in last["content"]] == ["also check the docs"]
        assert "source" not in json.dumps(list(requests[-1].messages))
        # The log kept who sent it.
        messages = [
            e["data"]["message"] for e in k.store.load(run.id).events if e["type"] == "user/message"
        ]
        assert [m["role"] for m in messages] == ["user", "user"]
        assert messages[-1]["source"] == {"kind": "coordinator", "sender_session_id": parent.id}
        run.dispose()


def test_the_descriptor_is_log_only_never_in_the_models_history(tmp_path: Path) -> None:
    """Seed, continuable children: "The `subagent/descriptor` event is log-only: ... never in
    model history"."""
    seen: dict[str, list[str]] = {}

    def respond(request: ModelRequest) -> S.Step | str:
        shown = json.dumps({"system": request.system, "messages": list(request.messages)})
        seen.setdefault(request.session_id, []).append(shown)
        return S.text(f"done: {last_user_text(request)}")

    with kit(store=SessionStore(tmp_path / "sessions")) as k:
        k.respond = respond
        parent = k.parent()
        started = k.service.start_continuable("spawn", k.request(parent, "first"), label="tester")
        k.runtime.tasks.wait(started.task_id)
        sent = k.service.send_message(parent, started.child_id, "second", MessageSource.user())
        assert sent.kind == "started" and sent.task_id is not None
        k.runtime.tasks.wait(sent.task_id)
        events = k.store.load(started.child_id).events
        assert [e["type"] for e in events].count("subagent/descriptor") == 1
        child = seen[started.child_id]
        assert len(child) == 2  # the first activation, and the cold resume
        for request in child:
            assert "descriptor" not in request
            assert "tester" not in request  # the label lives in the descriptor alone


def test_a_derived_depth_past_the_safe_integer_domain_is_refused() -> None:
    """Seed, "In-process backends": "every start rejects a derived depth outside the
    safe-integer domain"."""
    with kit() as k:
        parent = k.runtime.agent(delegation_depth=2**53 - 1)
        try:
            k.start(parent)
        except SubagentDepthError as exc:
            assert exc.code == "DEPTH_EXCEEDED"
            assert exc.attempted_depth == 2**53
        else:
            raise AssertionError("a child at depth 2**53 was started")
        assert list(k.runtime.ctx.agents) == [parent.id]
        assert k.events == []


def test_an_abort_after_publication_cancels_the_child_not_the_start() -> None:
    """Seed, `SubagentStartRequest.signal`: one channel before and after readiness; after
    publication the same signal cancels the published child (its run settles `aborted`)."""
    with kit() as k:
        k.respond = lambda request: S.hang()
        controller = AbortController()
        run = k.start(k.parent(), signal=controller.signal)
        assert run.local_agent is not None and run.local_agent.id == run.id
        gevent.sleep(0)
        controller.abort("the parent gave up")
        result = run.result.get()
        assert result.stop_reason == "aborted"
        assert "the parent gave up" in (result.diagnostic or "")
        run.dispose()


def test_a_resume_whose_signal_aborted_first_is_refused_and_leaves_the_log_as_it_was(
    tmp_path: Path,
) -> None:
    """Seed, `SubagentProvider.resume`: "if reconstruction fails or `request.signal` aborts
    before fulfillment, the provider rolls its creation transaction back to quiescence before
    rejecting"; no lifecycle pair is emitted for it."""
    with kit(store=SessionStore(tmp_path / "sessions")) as k:
        parent = k.parent()
        started = k.service.start_continuable("spawn", k.request(parent, "first"), label="raw")
        k.runtime.tasks.wait(started.task_id)
        events = k.store.load(started.child_id).events
        descriptor = authoritative_descriptor(events, 0)
        assert isinstance(descriptor, SubagentDescriptor)
        before = len(events)
        k.flush_events()
        lifecycle = len(k.events)
        controller = AbortController()
        controller.abort("the parent gave up")
        request = SubagentResumeRequest(
            session_id=started.child_id,
            prompt=[text_block("again")],
            source=MessageSource.user(),
            parent=parent,
            signal=controller.signal,
            descriptor=descriptor,
        )
        try:
            k.service.resume(request)
        except SubagentError as exc:
            assert exc.code == "ABORTED"
        else:
            raise AssertionError("an aborted resume was published")
        assert started.child_id not in k.runtime.ctx.agents
        assert len(k.store.load(started.child_id).events) == before
        k.flush_events()
        assert len(k.events) == lifecycle
        # Quiescent and whole: the next message resumes it as usual.
        sent = k.service.send_message(parent, started.child_id, "again", MessageSource.user())
        assert sent.kind == "started" and sent.task_id is not None
        assert k.runtime.tasks.wait(sent.task_id).status == "completed"


def test_a_child_gets_a_new_flat_scope_not_its_parents_registrations() -> None:
    """Seed, "In-process backends": "Each child gets a new flat scope rather than inheriting
    parent registrations": the parent's own scoped tool and restriction do not reach a spawn
    or a fork child, which sees the deployment's tools."""
    offered: dict[str, list[str]] = {}

    def respond(request: ModelRequest) -> S.Step | str:
        offered[request.session_id] = [tool.name for tool in request.tools]
        return S.text("done")

    def noop(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        return "ok"

    with kit() as k:
        k.respond = respond
        k.runtime.ctx.tools.register(Tool("shared", "Global.", {"type": "object"}, noop))
        k.runtime.ctx.tools.register(Tool("hidden", "Global.", {"type": "object"}, noop))
        parent = k.parent()
        parent.tools.add(Tool("private", "The parent's own.", {"type": "object"}, noop))
        parent.tools.restrict(deny=["hidden"])
        parent.send("hi").get()
        parent.when_idle().get()
        assert sorted(offered[parent.id]) == ["private", "shared"]
        for provider in ("spawn", "fork"):
            run = k.start(parent, provider=provider)
            assert run.result.get().stop_reason == COMPLETED
            assert sorted(offered[run.id]) == ["hidden", "shared"]
            run.dispose()
