"""The ACP provider against an agent that misbehaves on purpose (`acp_peers/hostile_agent.py`).

An external agent is someone else's code. Whatever it writes, the parent must keep its hub
running, its memory bounded, its child's record whole and its diagnostics short and clean, and
nothing the agent sends after its run has ended may count as that run's output or progress.
"""

from __future__ import annotations

import json
import logging
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from acp_peers.support import Notifier, Parent, finish, group_alive, text_prompt, wait_until

from agent.store import SessionStore
from providers.acp import (
    MAX_OUTPUT_BYTES,
    AcpConfig,
    AcpProvider,
    AcpRun,
    ResumableAcpProvider,
)
from subagent.runtime import Runtime
from subagent.types import SubagentStartRequest, text_block
from supervision.signal import AbortController, AbortSignal

HOSTILE = str(Path(__file__).parent / "acp_peers" / "hostile_agent.py")
TIMEOUT = 60.0


def hostile(mode: str, *args: str, **overrides: Any) -> AcpConfig:
    options: dict[str, Any] = {"eof_grace": 1.0, "terminate_grace": 1.0}
    options.update(overrides)
    return AcpConfig(command=sys.executable, args=[HOSTILE, mode, *args], **options)


def start(config: AcpConfig, parent: Parent, signal: AbortSignal | None = None) -> AcpRun:
    request = SubagentStartRequest(
        prompt=text_prompt("go"), parent=parent, signal=signal or AbortSignal.never()
    )
    return AcpProvider(config).start(request)


def clean(text: str) -> bool:
    """No control character but newline and tab: nothing a terminal would act on."""
    return not any((ord(c) < 0x20 and c not in "\n\t") or 0x7F <= ord(c) <= 0x9F for c in text)


# -- floods -------------------------------------------------------------------------------------


def test_a_flood_of_tiny_chunks_keeps_the_hub_running_and_costs_its_texts_memory(
    parent: Parent,
) -> None:
    """300,000 two-character chunks written faster than they are read: the pipe never runs dry,
    so the reader never waited (and never yielded) and held the hub for the whole flood (the
    suite's blocking monitor fails this test then); and each chunk was kept as its own string,
    some 60 bytes of memory per two characters of answer."""
    chunks = 300_000
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run = start(hostile("tiny_flood", str(chunks)), parent)
        try:
            result = run.result.get(timeout=TIMEOUT)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            run.dispose()
    finally:
        tracemalloc.stop()
    assert result.stop_reason == "completed", result.diagnostic
    assert result.output == [{"type": "text", "text": "yz" * chunks}]
    text_bytes = 2 * chunks
    # The answer's buffer (one byte a character here), the final text and a few parsed lines:
    # a few times the text, where a list of chunk strings took some 30 times it.
    assert peak - before < 8 * text_bytes, f"{peak - before:,} bytes for {text_bytes:,} of text"


@pytest.mark.allow_hub_block(
    "the test's own checks read the 63 MiB reply back on the hub (the store's scan decodes it"
    " in one msgpack call, then it is encoded and counted); the runtime's appends of it are"
    " sliced (tests/test_log_big_event.py holds them to the hub monitor)"
)
def test_an_answer_too_big_for_a_log_frame_ends_the_run_and_is_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """25 Mi characters of a three-byte script (75 MiB of UTF-8) was within the bound when it
    counted characters, but no log frame holds it: the continuable child's turn went unrecorded
    and the parent never got its settlement notice. The bound is now the frame's, in bytes: the
    run ends `error` there, and the child's log and the parent both take what it kept."""
    caplog.set_level(logging.WARNING)
    with Runtime(store=SessionStore(tmp_path / "sessions")) as rt:
        rt.subagents.register(ResumableAcpProvider(hostile("wide_answer", "25")))
        parent = rt.agent()
        request = SubagentStartRequest(
            prompt=[text_block("go")], parent=parent, signal=AbortSignal.never()
        )
        started = rt.subagents.start_continuable("acp", request, label="verbose")
        task = rt.tasks.wait(started.task_id, timeout=TIMEOUT)
        assert "exceeds 66,060,288 bytes (UTF-8)" in (task.detail or ""), task.detail
        ends = [e["data"] for e in rt.store.scan(started.child_id) if e["type"] == "turn/end"]
        [reply] = [
            e["data"]["message"]["content"][0]["text"]
            for e in rt.store.scan(started.child_id)
            if e["type"] == "assistant/message"
        ]
    assert [end["reason"] for end in ends] == ["error"]
    assert len(reply.encode()) <= MAX_OUTPUT_BYTES
    assert reply.count("\u4e2d") == len(reply)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


# -- values no real turn reports ----------------------------------------------------------------


def test_absurd_usage_and_cost_are_dropped_and_the_childs_record_is_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Token counts of 10**40 (beyond what a session log can carry) made the child's log refuse
    the reply, so its turn never ended in the record, and failed the parent's accounting in a
    callback; an infinite cost amount went into the result as reported. Now such a report is
    dropped like any malformed one and the turn is recorded whole."""
    caplog.set_level(logging.WARNING)
    with Runtime(store=SessionStore(tmp_path / "sessions")) as rt:
        rt.subagents.register(ResumableAcpProvider(hostile("big_usage")))
        parent = rt.agent()
        request = SubagentStartRequest(
            prompt=[text_block("go")], parent=parent, signal=AbortSignal.never()
        )
        started = rt.subagents.start_continuable("acp", request, label="boaster")
        task = rt.tasks.wait(started.task_id, timeout=TIMEOUT)
        assert task.status == "completed", task.detail
        assert task.output == [text_block("spent")]
        events = list(rt.store.scan(started.child_id))
        assert parent.usage.subtree == {}
    [reply] = [e["data"] for e in events if e["type"] == "assistant/message"]
    assert reply["message"]["content"] == [text_block("spent")]
    assert "usage" not in reply
    assert [e["data"]["reason"] for e in events if e["type"] == "turn/end"] == ["completed"]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_a_one_shot_result_carries_no_absurd_usage_or_cost(parent: Parent) -> None:
    result = finish(start(hostile("big_usage"), parent), TIMEOUT)
    assert result.stop_reason == "completed"
    assert result.extra == {}


def test_lone_surrogates_in_the_answer_are_repaired(parent: Parent) -> None:
    """A JSON `\\ud800` escape in a chunk cannot be encoded as UTF-8: the answer carries U+FFFD
    instead, as everywhere in the runtime, so a caller can print or send it."""
    result = finish(start(hostile("surrogates"), parent), TIMEOUT)
    assert result.stop_reason == "completed"
    assert result.output == [{"type": "text", "text": "left \ufffd right"}]
    result.output[0]["text"].encode("utf-8")


def test_a_huge_stop_reason_is_quoted_short_and_escaped(parent: Parent) -> None:
    result = finish(start(hostile("bogus_stop", "100000"), parent), TIMEOUT)
    assert result.stop_reason == "error"
    diagnostic = result.diagnostic or ""
    assert diagnostic.startswith("the agent ended its turn with stop reason '\\x1b[2J")
    assert len(diagnostic) < 500, len(diagnostic)
    assert clean(diagnostic)


def test_a_flood_of_refused_permissions_is_counted_and_named_short_and_clean(
    parent: Parent,
) -> None:
    """Fifty refused tool calls with 10,000-character titles full of escapes: the diagnostic
    named every title whole, raw escapes and all (half a megabyte); now it names the first few,
    cleaned and cut, and counts the rest."""
    events: list[dict[str, Any]] = []
    result = finish(
        start(hostile("permission_flood", "50", on_progress=events.append), parent), TIMEOUT
    )
    assert result.stop_reason == "error"
    diagnostic = result.diagnostic or ""
    assert "refused permission for: [bold red]boom[/]ttt" in diagnostic
    assert diagnostic.endswith(" and 45 more")
    assert len(diagnostic) < 2000, len(diagnostic)
    assert clean(diagnostic)
    assert [e["kind"] for e in events] == ["permission"] * 50


def test_a_json_rpc_error_with_a_huge_message_and_a_code_of_escapes_is_bounded_and_clean(
    parent: Parent,
) -> None:
    result = finish(start(hostile("rpc_error"), parent), TIMEOUT)
    assert result.stop_reason == "error"
    diagnostic = result.diagnostic or ""
    assert diagnostic.startswith("session/prompt failed: [bold red]boom[/]mmm")
    assert "(code '\\x1b[2J" in diagnostic
    assert len(diagnostic) < 5000, len(diagnostic)
    assert clean(diagnostic)


# -- what the agent sends outside its turn ------------------------------------------------------


def test_nothing_the_agent_sends_after_the_run_settled_is_reported(
    parent: Parent, notifier: Notifier
) -> None:
    """Cancelled, the agent goes on (until it is reaped): its tool calls, its text and its
    permission request after the cancel are no progress or output of the run, which has ended;
    the permission is answered `cancelled`."""
    events: list[dict[str, Any]] = []
    controller = AbortController()
    config = hostile("late_updates", env=notifier.env, on_progress=events.append)
    run = start(config, parent, controller.signal)
    notifier.expect("prompt")
    controller.abort("enough")
    assert run.result.get(timeout=TIMEOUT).stop_reason == "aborted"
    # The agent answered the cancel with 100 tool calls, a chunk and a permission request; the
    # answer to that request was written after every earlier line was dispatched.
    answered = json.loads(notifier.expect("answered"))
    assert answered == {"outcome": {"outcome": "cancelled"}}
    assert events == []
    result = finish(run, TIMEOUT)
    # "working" may or may not have been read before the abort; the late chunk never counts.
    assert result.output in ([], [{"type": "text", "text": "working"}])


def test_what_the_agent_streams_after_answering_its_prompt_is_not_output(parent: Parent) -> None:
    """Chunks for another session are ignored, and so are answers to ids never sent and a second
    answer to the prompt; a chunk sent after the answer (ACP has every update come first) was
    counted when the reader got to it before the turn's greenlet ran."""
    result = finish(start(hostile("foreign_session"), parent), TIMEOUT)
    assert result.stop_reason == "completed"
    assert result.output == [{"type": "text", "text": "mine"}]


def test_requests_the_client_never_offered_are_refused_method_not_found(parent: Parent) -> None:
    """`initialize` offers no `fs` and no `terminal`; every such request (a path outside the cwd
    included), an unknown method and an `_` extension are answered -32601."""
    result = finish(start(hostile("requests"), parent), TIMEOUT)
    assert result.stop_reason == "completed"
    offered, answered = result.output[0]["text"].split("; ")
    assert json.loads(offered.removeprefix("offered ")) == {
        "fs": {"readTextFile": False, "writeTextFile": False},
        "terminal": False,
    }
    assert answered.removeprefix("answered ").split() == [
        "fs/read_text_file=-32601",
        "fs/write_text_file=-32601",
        "terminal/create=-32601",
        "no/such_method=-32601",
        "_vendor/extension=-32601",
    ]


# -- an agent that closes its stdout and lives on -----------------------------------------------


def test_an_agent_that_closes_stdout_and_lives_on_is_reaped_when_its_run_ends(
    parent: Parent, notifier: Notifier
) -> None:
    """Nobody can read it any more: the run ends `error` and the agent is reaped at once, not
    left running until a holder of the run disposes it."""
    run = start(hostile("close_stdout", env=notifier.env), parent)
    notifier.expect("closed")
    try:
        result = run.result.get(timeout=TIMEOUT)
        assert result.stop_reason == "error"
        assert (result.diagnostic or "").startswith("the agent closed its stdout")
        assert result.output == [{"type": "text", "text": "bye"}]
        wait_until(lambda: not group_alive(run.pid), timeout=30)
    finally:
        run.dispose()
