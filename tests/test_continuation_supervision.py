"""The continuable restart policy is supervision's (issue 14 item 3): each continuable child has
a `Supervisor` whose activations are `transient` children, within its restart intensity.

Each test fails if the spec's behaviour breaks: a normal or cancelled end is final (a
`permanent` spec would restart it), a crash comes back as a cold resume visible in the
lifecycle events, past the intensity the child ends stored with the documented report, and a
restart that cannot start is reported with its cause. Real actors, a real store on disk; only
the model is scripted.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import gevent
import pytest
from seam_kit import Gate, Kit, assert_log_valid, kit, last_user_text, wait_until
from test_continuation_restart import break_log_of, inbox, parent_whose_children_crash, turn_ends

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import SessionStore
from agent.tools import Tool
from providers.inprocess import SpawnProvider
from subagent.errors import SubagentError
from subagent.types import MessageSource, SubagentResumeRequest

CRASH_NOTE = "Your last activation crashed"


@pytest.fixture
def k(tmp_path: Path) -> Iterator[Kit]:
    with kit(store=SessionStore(tmp_path)) as the_kit:
        yield the_kit


def start(k: Kit, parent: Any, label: str = "helper") -> Any:
    return k.service.start_continuable("spawn", k.request(parent, "first"), label=label)


def forgotten(k: Kit, child_id: str) -> bool:
    """The manager dropped its record: the child's supervisor decided and nothing is pending."""
    return k.service._continuation.activation(child_id) is None


def lifecycle(k: Kit, child_id: str) -> list[tuple[str, str | None]]:
    k.flush_events()
    return [
        (e["type"], e.get("stop_reason"))
        for e in k.events
        if e["type"] in ("subagent/start", "subagent/end") and e["id"] == child_id
    ]


def user_texts(events: list[Mapping[str, Any]]) -> list[str]:
    return [
        "".join(b.get("text", "") for b in e["data"]["message"]["content"])
        for e in events
        if e["type"] == "user/message"
    ]


# -- transient: only a crash comes back ---------------------------------------------------------


def test_a_normal_end_is_final(k: Kit) -> None:
    k.respond = lambda request: S.text(f"done: {last_user_text(request)}")
    parent = k.parent()
    started = start(k, parent)
    assert k.runtime.tasks.wait(started.task_id).status == "completed"
    wait_until(lambda: forgotten(k, started.child_id))
    # Its supervisor, idle and with no restart to remember, is gone too: nothing accumulates.
    wait_until(lambda: not k.service._continuation._supervisor.children())
    assert lifecycle(k, started.child_id) == [
        ("subagent/start", None),
        ("subagent/end", "completed"),
    ]
    assert len(k.runtime.tasks.list(parent.id)) == 1
    assert turn_ends(assert_log_valid(k.store, started.child_id)) == ["completed"]
    assert inbox(parent, "subagent-report") == []


def test_a_child_level_failure_ends_normally_and_is_final(k: Kit) -> None:
    k.respond = lambda request: (
        S.error("bad gateway") if request.session_id != parent.id else S.text("parent")
    )
    parent = k.parent()
    started = start(k, parent)
    assert k.runtime.tasks.wait(started.task_id).status == "failed"
    wait_until(lambda: forgotten(k, started.child_id))
    assert lifecycle(k, started.child_id) == [("subagent/start", None), ("subagent/end", "error")]
    assert len(k.runtime.tasks.list(parent.id)) == 1


def test_a_cancelled_activation_is_final(k: Kit) -> None:
    gate = Gate()

    def respond(request: ModelRequest) -> S.Step:
        if request.session_id != parent.id:
            gate.wait(request.signal)
            request.signal.raise_if_aborted()
        return S.text("done")

    k.respond = respond
    parent = k.parent()
    started = start(k, parent)
    gate.reached.wait()
    assert k.runtime.tasks.kill(started.task_id, "no longer needed")
    wait_until(lambda: forgotten(k, started.child_id))
    assert lifecycle(k, started.child_id) == [("subagent/start", None), ("subagent/end", "aborted")]
    assert [t.status for t in k.runtime.tasks.list(parent.id)] == ["killed"]
    assert inbox(parent, "subagent-report") == []


# -- a crash is restarted, visibly --------------------------------------------------------------


def test_a_restart_is_visible_as_the_documented_lifecycle_events(k: Kit) -> None:
    crashed: list[str] = []

    def respond(request: ModelRequest) -> S.Step:
        if request.session_id != parent.id and not crashed:
            crashed.append(request.session_id)
            break_log_of(k, request.session_id)
        return S.text(f"done: {last_user_text(request)}")

    k.respond = respond
    parent = k.parent()
    started = start(k, parent, label="fragile")
    wait_until(lambda: len(inbox(parent, "subagent-settled")) == 2)
    wait_until(lambda: forgotten(k, started.child_id) or not _running(k, started.child_id))
    # One run per activation: the crash ends `error` with the fault as its failure, then the
    # supervisor's restart is a new `subagent/start` of the same child, by cold resume.
    assert lifecycle(k, started.child_id) == [
        ("subagent/start", None),
        ("subagent/end", "error"),
        ("subagent/start", None),
        ("subagent/end", "completed"),
    ]
    first_end = next(e for e in k.events if e["type"] == "subagent/end")
    assert "No space left" in first_end["failure"]
    tasks = k.runtime.tasks.list(parent.id)
    assert [(t.label, t.status) for t in tasks] == [("fragile", "failed"), ("fragile", "completed")]
    # The restarted activation was told why, as a `subagent-report` message in its own log.
    events = assert_log_valid(k.store, started.child_id)
    texts = user_texts(events)
    assert texts[0] == "first"
    assert texts[1].startswith(CRASH_NOTE) and "No space left" in texts[1]
    sources = [
        e["data"]["message"]["source"]["kind"] for e in events if e["type"] == "user/message"
    ]
    assert sources[1] == "subagent-report"
    summaries = [e["data"]["source"]["summary"] for e in inbox(parent, "subagent-settled")]
    assert "crashed" in summaries[0]
    assert inbox(parent, "subagent-report") == []  # restarted, so nothing to report


def _running(k: Kit, child_id: str) -> bool:
    activation = k.service._continuation.activation(child_id)
    return activation is not None and activation.running


def test_past_the_default_intensity_the_child_ends_stored_with_the_documented_report(
    k: Kit,
) -> None:
    parent = parent_whose_children_crash(k)
    started = start(k, parent, label="doomed")
    wait_until(lambda: len(inbox(parent, "subagent-report")) == 1)
    # The default intensity: 3 restarts within 60 s, so the fourth crash is the last.
    tasks = k.runtime.tasks.list(parent.id)
    assert [t.status for t in tasks] == ["failed"] * 4
    assert (
        lifecycle(k, started.child_id) == [("subagent/start", None), ("subagent/end", "error")] * 4
    )
    [report] = inbox(parent, "subagent-report")
    assert report["data"]["content"] == [
        {
            "type": "text",
            "text": f"Subagent {started.child_id} crashed 4 times within 60 s; "
            "it is not restarted and stays stored.",
        }
    ]
    wait_until(lambda: started.child_id not in k.runtime.ctx.agents)
    [row] = k.service.list_children(parent.id)
    assert (row["id"], row["activity"]) == (started.child_id, "stored")
    assert not _running(k, started.child_id)


class ResumeRefused(SpawnProvider):
    """A spawn provider whose cold resume always fails, as for a child that cannot be resumed."""

    def resume(self, request: SubagentResumeRequest) -> NoReturn:
        self.refused += 1
        raise SubagentError("NOT_RESUMABLE", "this child cannot be resumed here")

    refused = 0


def test_a_restart_that_cannot_start_is_reported_with_its_cause(k: Kit) -> None:
    provider = ResumeRefused("refusing")
    k.service.register(provider)

    def respond(request: ModelRequest) -> S.Step:
        if request.session_id != parent.id:
            break_log_of(k, request.session_id)
        return S.text(f"done: {last_user_text(request)}")

    k.respond = respond
    parent = k.parent()
    started = k.service.start_continuable("refusing", k.request(parent, "first"), label="x")
    wait_until(lambda: len(inbox(parent, "subagent-report")) == 1)
    [report] = inbox(parent, "subagent-report")
    assert report["data"]["content"][0]["text"] == (
        f"Subagent {started.child_id} crashed and could not be restarted "
        "(SubagentError: NOT_RESUMABLE: this child cannot be resumed here); it stays stored."
    )
    # A restart that cannot start counts as another failure: tried within the intensity.
    assert provider.refused == 3
    assert [t.status for t in k.runtime.tasks.list(parent.id)] == ["failed"]  # none restarted
    assert lifecycle(k, started.child_id) == [("subagent/start", None), ("subagent/end", "error")]


def test_a_message_sent_while_a_restart_is_pending_reaches_the_restarted_activation(
    k: Kit,
) -> None:
    k.runtime.ctx.tools.register(
        Tool(name="noop", description="noop", parameters={"type": "object"}, fn=lambda a, c: "ok")
    )
    gate = Gate()
    hold = Gate()

    def respond(request: ModelRequest) -> S.Step:
        said = last_user_text(request)
        if request.session_id == parent.id:
            return S.text("parent")
        if said == "first":
            break_log_of(k, request.session_id)
            return S.text("lost")
        if said.startswith(CRASH_NOTE):  # the restarted turn's first step waits
            gate.wait(request.signal)
            return S.tool_call("noop", {})
        return S.text(f"final: {said}")

    def on_settled(task: Any) -> None:  # inside the crashed activation's settlement
        if task.status == "failed" and not hold.reached.is_set():
            hold.wait()

    k.respond = respond
    k.runtime.tasks.on_settled(on_settled)
    parent = k.parent()
    started = start(k, parent)
    hold.reached.wait()
    sending = gevent.spawn(
        k.service.send_message,
        parent,
        started.child_id,
        "more",
        MessageSource.coordinator(parent.id),
    )
    gevent.sleep(0)  # the sender queues behind the settlement
    hold.open()
    gate.reached.wait()  # the supervisor restarted the child; the sender waited for it
    child = k.runtime.ctx.agents[started.child_id]
    wait_until(lambda: bool(child.actor._steers))
    gate.open()
    result = sending.get()
    assert result.kind == "steered"
    tasks = k.runtime.tasks.list(parent.id)
    assert len(tasks) == 2  # the crashed activation and its restart: no third one
    assert result.task_id == tasks[1].id
    assert k.runtime.tasks.wait(tasks[1].id).status == "completed"
    texts = user_texts(assert_log_valid(k.store, started.child_id))
    assert texts[0] == "first" and texts[1].startswith(CRASH_NOTE) and texts[2] == "more"
