"""Lone surrogates (issue 12 item 3): an append is atomic, and such text is repaired to U+FFFD.

Lone UTF-16 halves come from outside: a JSON `\\ud83d` escape from a model or an ACP agent, or
bytes that are not UTF-8 in argv (Python hands them over `surrogateescape`d). None of them can
be written as UTF-8, so before the fix the first one poisoned the session: the log's replay had
advanced for a frame that was never written, and every later append failed.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from openai_stub import OpenAIStub, sse, text_events
from seam_kit import kit
from test_cli import cli

from agent.events import SessionHeader
from agent.jsoncheck import repair_surrogates
from agent.log import InvariantError, validate_log
from agent.model import ModelRequest, ModelResponse, ToolCall, without_lone_surrogates
from agent.models import ModelRegistry
from agent.models import scripted as S
from agent.models.openai import OpenAIModel
from agent.options import AgentOptions
from agent.store import MemoryStore, SessionStore
from agent.tools import Tool, ToolContext
from providers.acp import AcpConfig, AcpProvider
from subagent.runtime import Runtime

FFFD = "\ufffd"


def texts(events: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for event in events:
        message = event["data"].get("message")
        if isinstance(message, dict):
            out += [b.get("text", "") for b in message.get("content", [])]
        out += [b.get("text", "") for b in event["data"].get("content", []) or []]
    return out


def test_repair_replaces_lone_halves_and_joins_pairs_in_place() -> None:
    block = {"type": "text", "text": "a \udcff b \ud83d\ude00 c \ud83d"}
    value = {"content": [block], "k\udcff": ["\udc80"]}
    assert repair_surrogates(value) is value
    assert block["text"] == f"a {FFFD} b \U0001f600 c {FFFD}"  # the caller's block, repaired
    assert value["k" + FFFD] == [FFFD]


def test_a_failed_append_changes_nothing() -> None:
    store = MemoryStore()
    log = store.create(SessionHeader(id="s1", created_at=1.0, cwd="/"))
    log.append("turn/start", {"turn": 1})
    with pytest.raises(InvariantError):
        log.append("step/end", {"turn": 1, "step": 1})  # no step is open
    log.append("turn/end", {"turn": 1, "reason": "completed"})
    log.close()
    assert [e["seq"] for e in store.load(log.id).events] == [0, 1]


def test_an_append_told_not_to_repair_refuses_a_lone_surrogate_and_changes_nothing() -> None:
    """The loop logs a model reply this way (its encoding is the surrogate probe): the refusal
    leaves the log and the caller's data as they were, so the repaired reply can be logged."""
    store = MemoryStore()
    log = store.create(SessionHeader(id="s1", created_at=1.0, cwd="/"))
    log.append("turn/start", {"turn": 1})
    block = {"type": "text", "text": "torn \ud83d"}
    data = {"turn": 1, "reason": "completed", "message": "torn \ud83d"}
    with pytest.raises(UnicodeEncodeError):
        log.append("turn/end", data, repair=False)
    assert data["message"] == "torn \ud83d" and block["text"] == "torn \ud83d"
    assert len(log.events) == 1
    log.append("turn/end", data)  # repairing (the default) logs it, repaired in place
    assert data["message"] == f"torn {FFFD}"
    log.close()
    assert [e["seq"] for e in store.load(log.id).events] == [0, 1]


def test_a_torn_reply_is_logged_once_repaired_and_acted_on_repaired() -> None:
    """Text, call id, tool name and arguments with lone halves: one assistant/message, all
    repaired, and the tool gets the repaired arguments under the repaired call id."""
    with kit() as k:
        got: list[Any] = []

        def respond(request: ModelRequest) -> S.Step:
            if request.step == 1:
                return S.tool_call("echo", {"k": "v\ud800"}, "c\ud83d", text="say \udcff")
            return S.text("done")

        k.respond = respond

        def echo(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            got.append((dict(arguments), ctx.call_id))
            return "ok"

        k.runtime.ctx.tools.register(Tool("echo", "echoes", {"type": "object"}, echo))
        agent = k.parent()
        agent.send("go").get()
        assert agent.when_idle().get().reason == "completed"
        assert got == [({"k": f"v{FFFD}"}, f"c{FFFD}")]
        events = list(agent.log.events)
        validate_log(events, agent.header)
        replies = [e for e in events if e["type"] == "assistant/message"]
        assert len(replies) == 2
        message = replies[0]["data"]["message"]
        assert message["content"] == [{"type": "text", "text": f"say {FFFD}"}]
        assert message["tool_calls"] == [
            {"id": f"c{FFFD}", "name": "echo", "arguments": {"k": f"v{FFFD}"}}
        ]
        result = next(e for e in events if e["type"] == "tool/result")["data"]
        assert (result["call_id"], result["is_error"]) == (f"c{FFFD}", False)


def test_send_with_a_lone_surrogate_is_repaired_and_the_session_lives_on(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    rt = Runtime(store=store, scripted=S.ScriptedModel(S.echo))
    try:
        agent = rt.agent(options=AgentOptions(model="scripted:echo"))
        agent.send("bad \udcff").get()
        first = agent.when_idle().get()
        agent.send("good").get()
        second = agent.when_idle().get()
        assert (first.reason, second.reason) == ("completed", "completed")
        assert FFFD in first.output[0]["text"]
        session_id = agent.id
    finally:
        rt.close()
    events = store.load(session_id).events
    validate_log(events)
    assert f"bad {FFFD}" in texts(events)
    assert "good" in texts(events)


def test_a_model_reply_with_an_unpaired_surrogate_settles_the_child() -> None:
    with kit() as k:
        k.respond = lambda request: S.text("child says \ud83d")
        parent = k.parent()
        run = k.start(parent, "go")
        result = run.result.get(timeout=30)
        assert result.stop_reason == "completed"
        assert result.output[0]["text"] == f"child says {FFFD}"
        run.dispose()


def test_a_tool_call_argument_with_a_lone_surrogate_is_repaired_before_the_tool_runs() -> None:
    from subagent.tools import install_subagent_tools

    with kit() as k:
        install_subagent_tools(k.runtime)
        seen: list[str] = []

        def respond(request: ModelRequest) -> S.Step:
            if request.session_id == parent.id:
                if request.step == 1:
                    return S.tool_call(
                        "subagent_spawn", {"description": "d", "prompt": "task \ud83d"}
                    )
                return S.text("parent done")
            seen.append(request.messages[-1]["content"][0]["text"])
            return S.text("child done")

        k.respond = respond
        parent = k.parent()
        parent.send("go").get()
        outcome = parent.when_idle().get()
        assert outcome.reason == "completed", outcome
        assert seen == [f"task {FFFD}"]


def test_an_openai_stream_with_an_unpaired_escape_completes() -> None:
    raw = '{"choices": [{"index": 0, "delta": {"content": "half \\ud83d"}, "finish_reason": null}]}'
    events: list[Any] = list(text_events(["a "]))
    events.insert(2, raw)
    with OpenAIStub(default=sse(events)) as stub:
        models = ModelRegistry()
        models.register("openai", OpenAIModel(base_url=stub.base_url, api_key="k"))
        rt = Runtime(store=MemoryStore(), models=models)
        try:
            agent = rt.agent(options=AgentOptions(model="openai:stub"))
            agent.send("hi").get()
            outcome = agent.when_idle().get()
            assert outcome.reason == "completed", outcome
            assert outcome.output[0]["text"] == f"a half {FFFD}"
            agent.send("again").get()
            assert agent.when_idle().get().reason == "completed"
        finally:
            rt.close()


# A stdlib ACP agent whose reply streams an unpaired `\ud83d` escape.
ACP_SURROGATE_PEER = r"""
import json, sys
def send(m): sys.stdout.write(json.dumps(m) + "\n"); sys.stdout.flush()
for line in sys.stdin:
    m = json.loads(line); rid = m.get("id"); method = m.get("method")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": rid, "result": {"protocolVersion": 1}})
    elif method == "session/new":
        send({"jsonrpc": "2.0", "id": rid, "result": {"sessionId": "s1"}})
    elif method == "session/prompt":
        sys.stdout.write('{"jsonrpc": "2.0", "method": "session/update", "params": {"sessionId":'
            ' "s1", "update": {"sessionUpdate": "agent_message_chunk", "content": {"type":'
            ' "text", "text": "half \\ud83d"}}}}\n')
        send({"jsonrpc": "2.0", "id": rid, "result": {"stopReason": "end_turn"}})
    elif rid is not None:
        send({"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": method}})
"""


def test_an_acp_agent_streaming_an_unpaired_surrogate_leaves_the_parent_turn_completed() -> None:
    from subagent.tools import PROVIDER_MANAGED, SubagentToolConfig, install_subagent_tools

    with kit() as k:
        config = AcpConfig(command=sys.executable, args=["-c", ACP_SURROGATE_PEER])
        k.service.register(AcpProvider(config))
        install_subagent_tools(
            k.runtime, tools=[SubagentToolConfig("acp", name="acp", max_depth=PROVIDER_MANAGED)]
        )
        results: list[str] = []

        def respond(request: ModelRequest) -> S.Step:
            last = request.messages[-1]
            if last["role"] == "tool":
                results.append(last["content"][0]["text"])
                return S.text("parent done")
            return S.tool_call("acp", {"description": "d", "prompt": "p"})

        k.respond = respond
        parent = k.parent()
        parent.send("go").get()
        outcome = parent.when_idle().get()
        assert outcome.reason == "completed", outcome
        assert len(results) == 1 and f"half {FFFD}" in results[0]
        validate_log(list(parent.log.events))


def test_cli_run_with_argv_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    peer = str(Path(__file__).parent / "acp_peers" / "minimal_agent.py")
    proc = cli(
        "run", "hello \udcff", "--acp", f"{sys.executable} {peer}", "--no-live", home=tmp_path
    )
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 0, proc.stderr
    assert f"echo: hello {FFFD}" in proc.stdout


@pytest.mark.parametrize(
    "odd", [2**70, ("a", "tuple"), float("nan"), {1: "int key"}], ids=["big", "tuple", "nan", "key"]
)
def test_the_reply_probe_repairs_only_text_and_leaves_other_faults_to_the_log(odd: Any) -> None:
    """The probe is an encoder: a value it cannot judge is passed on (the log refuses it with
    a named path), and a lone surrogate beside ordinary values is still repaired."""
    plain = ModelResponse(content=[{"type": "text", "text": "x", "odd": odd}])
    assert without_lone_surrogates(plain) is plain
    call = ToolCall("c1", "t", {"k": "v\ud800"})
    torn = ModelResponse(content=[{"type": "text", "text": "ok"}], tool_calls=[call])
    fixed = without_lone_surrogates(torn)
    assert fixed.tool_calls[0].arguments == {"k": "v\ufffd"}
    assert call.arguments == {"k": "v\ud800"}  # the model's own object is left alone
