"""Tracing: the child tree comes out as one OpenTelemetry trace (SDK in-memory exporter).

Every test installs its own SDK tracer provider for its duration (`tracing_support.installed`)
and leaves the process with none, so the rest of the suite runs with tracing off.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import gevent
import pytest
from acp_peers.support import Parent as AcpParent
from acp_peers.support import peer_config
from gevent import subprocess as gsub
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from tracing_support import ancestors, installed, no_provider, parent_of

from agent import tracing
from agent.model import ModelRequest, ModelResponse, ProgressSink
from agent.models import ModelRegistry
from agent.models import scripted as S
from agent.options import AgentOptions
from agent.store import MemoryStore, SessionStore
from agent.tools import Tool, ToolContext
from providers.acp import AcpConfig, AcpProvider, ResumableAcpProvider
from providers.inprocess import SpawnProvider
from subagent import telemetry
from subagent.demo import Demo
from subagent.lean_tracing import LeanTracerProvider
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortController, AbortSignal

REPO = Path(__file__).resolve().parent.parent
TRACED_PEER = str(Path(__file__).parent / "acp_peers" / "traced_agent.py")


def named(spans: Sequence[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == prefix or s.name.startswith(prefix + " ")]


def attr(span: ReadableSpan, key: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(key)


# -- the demo's tree ----------------------------------------------------------------------------


def run_demo(tmp_path: Path, children: int = 8, seed: int = 0) -> tuple[Demo, list[ReadableSpan]]:
    with installed() as exporter:
        demo = Demo(str(tmp_path / "sessions"), children=children, seed=seed)
        try:
            demo.run()
        finally:
            demo.close()
        return demo, list(exporter.get_finished_spans())


def _probe_then_delegate(rt: Runtime, seen: list[Any]) -> Any:
    """One turn of a fresh agent: a `probe` tool that records the trace context it is given
    (into `seen`), then a `subagent` call; returns the agent once its turn completed."""
    rt.ctx.tools.register(
        Tool("probe", "probe", {"type": "object"}, lambda a, c: seen.append(c.trace) or "")
    )
    agent = rt.agent()
    call = ("subagent", {"description": "w", "prompt": "p"})
    rt.scripted.script(agent.id, [S.tool_calls([("probe", {}), call]), S.text("done")])
    agent.send("go").get()
    assert agent.when_idle().get().reason == "completed"
    return agent


def test_the_demo_tree_is_one_trace_with_the_right_parentage(tmp_path: Path) -> None:
    demo, spans = run_demo(tmp_path)
    assert len({s.context.trace_id for s in spans}) == 1
    (root,) = [s for s in spans if s.parent is None]
    assert root.name == "subagent demo"

    # The coordinator: one invoke_agent per turn, all under the demo's span.
    coordinator = [s for s in named(spans, "invoke_agent") if attr(s, "subagent.depth") is None]
    assert [attr(s, "subagent.turn") for s in coordinator] == [1, 2, 3]
    assert all(parent_of(s, spans) is root for s in coordinator)
    assert {s.name for s in coordinator} == {"invoke_agent coordinator"}
    assert {attr(s, "gen_ai.agent.id") for s in coordinator} == {demo.root.id}
    first_turn = next(s for s in coordinator if attr(s, "subagent.turn") == 1)

    # Every child activation hangs under the execute_tool span of the call that started it.
    activations = [s for s in named(spans, "invoke_agent") if attr(s, "subagent.depth")]
    by_label: dict[str, list[ReadableSpan]] = {}
    for span in activations:
        by_label.setdefault(str(attr(span, "gen_ai.agent.name")), []).append(span)
    plans = {p.label: p for p in demo.plans}
    assert set(plans) <= set(by_label)
    for label, plan in plans.items():
        first = by_label[label][0]
        tool = parent_of(first, spans)
        assert tool is not None and tool.name == f"execute_tool {plan.tool_name}"
        assert parent_of(tool, spans) is first_turn
        assert attr(first, "subagent.depth") == 1
        assert attr(first, "subagent.provider") == plan.provider
        assert attr(first, "subagent.parent_id") == demo.root.id
        assert str(attr(first, "subagent.run_id")).startswith("r")
        assert first.name == f"invoke_agent {label}"

    # The grandchild: depth 2, under the lead's own execute_tool span.
    lead = next(p for p in demo.plans if p.role == "lead")
    assert lead.grandchild is not None
    (grandchild,) = by_label[lead.grandchild.label]
    assert attr(grandchild, "subagent.depth") == 2
    assert grandchild.kind is trace.SpanKind.INTERNAL  # in-process: no remote call
    assert [s.name for s in ancestors(grandchild, spans)[:2]] == [
        "execute_tool subagent",
        f"invoke_agent {lead.label}",
    ]

    roles = {p.role: by_label[p.label] for p in demo.plans}
    # The steer: admitted at a step boundary, an event on the child's activation span.
    steered = roles["steer"][0]
    assert [e.name for e in steered.events if e.name == tracing.STEER_EVENT] == [
        tracing.STEER_EVENT
    ]
    assert attr(steered, "subagent.stop_reason") == "completed"
    # The crash: contained as the child's error; the failing chat span records the exception.
    crashed = roles["crash"][0]
    assert attr(crashed, "subagent.stop_reason") == "error"
    assert crashed.status.status_code == trace.StatusCode.ERROR
    failed_chat = [
        s for s in named(spans, "chat") if parent_of(s, spans) is crashed and not s.status.is_ok
    ]
    assert [attr(s, "error.type") for s in failed_chat] == ["RuntimeError"]
    # The cancel: aborted, with the operator's cause.
    cancelled = roles["cancel"][0]
    assert attr(cancelled, "subagent.stop_reason") == "aborted"
    assert attr(cancelled, "subagent.cancel.cause") == "cancelled by the operator"
    waits = [
        s for s in named(spans, "execute_tool await_guidance") if parent_of(s, spans) is cancelled
    ]
    assert [attr(s, "error.type") for s in waits] in (["abandoned"], ["aborted"])
    # The continuable child: interrupted, then resumed by send_message; the resumed activation
    # hangs under that call and links to the first.
    first, resumed = roles["continuable"]
    assert attr(first, "subagent.stop_reason") == "aborted"
    assert attr(resumed, "subagent.resumed") is True
    assert attr(resumed, "gen_ai.agent.id") == attr(first, "gen_ai.agent.id")
    tool = parent_of(resumed, spans)
    assert tool is not None and tool.name == "execute_tool send_message"
    assert [link.context.span_id for link in resumed.links] == [first.context.span_id]
    assert attr(resumed, "subagent.stop_reason") == "completed"

    # Model and tool spans: the GenAI conventions, each under an agent span.
    for span in named(spans, "chat"):
        owner = parent_of(span, spans)
        assert owner is not None and owner.name.startswith("invoke_agent")
        assert attr(span, "gen_ai.operation.name") == "chat"
        assert attr(span, "gen_ai.request.model") == "default"
        assert attr(span, "gen_ai.provider.name") == "scripted"
        if span.status.is_ok:
            assert attr(span, "gen_ai.response.finish_reasons") in (("stop",), ("tool_calls",))
    for span in named(spans, "execute_tool"):
        owner = parent_of(span, spans)
        assert owner is not None and owner.name.startswith("invoke_agent")
        assert attr(span, "gen_ai.tool.name") == span.name.split(" ", 1)[1]
        assert attr(span, "gen_ai.tool.call.id")
    for span in named(spans, "invoke_agent"):
        assert attr(span, "gen_ai.operation.name") == "invoke_agent"


def test_tracing_off_without_a_provider_passes_no_context() -> None:
    seen: list[Any] = []
    requests: list[Any] = []

    class Recording(SpawnProvider):
        def start(self, request: SubagentStartRequest) -> Any:
            requests.append(request.trace)
            return super().start(request)

    with no_provider():
        assert tracing.tracer() is None
        assert tracing.ambient() is None
        rt = Runtime(store=MemoryStore())
        try:
            rt.subagents.register(Recording())
            install_subagent_tools(rt, tools=[SubagentToolConfig("spawn", name="subagent")])
            agent = _probe_then_delegate(rt, seen)
            assert agent.core.trace is None
        finally:
            rt.close()
    assert seen == [None]
    assert requests == [None]


# -- loop spans: usage, tool context, ambient parents --------------------------------------------


class UsageModel:
    """A model adapter that reports token usage, as the OpenAI adapter does."""

    def complete(self, request: ModelRequest, on_progress: ProgressSink | None = None) -> Any:
        if request.step == 1:
            call = S.tool_call("inner", {})
            assert call.calls
            name, args, _ = call.calls[0]
            from agent.model import ToolCall

            return ModelResponse(
                content=[], tool_calls=(ToolCall("c1", name, args),), finish="tool_calls",
                usage={"input_tokens": 11, "output_tokens": 3},
            )  # fmt: skip
        return ModelResponse(
            content=[text_block("ok")], usage={"input_tokens": 20, "output_tokens": 5}
        )


def test_chat_spans_carry_usage_and_tools_see_their_span_as_current() -> None:
    models = ModelRegistry()
    models.register("usage", UsageModel())
    inner: list[Any] = []

    def tool_fn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        # A tool's own instrumented work nests under its execute_tool span.
        with trace.get_tracer("tool").start_as_current_span("inside the tool") as span:
            inner.append((span, ctx.trace))
        return "done"

    with installed() as exporter:
        rt = Runtime(store=MemoryStore(), models=models)
        try:
            rt.ctx.tools.register(Tool("inner", "inner", {"type": "object"}, tool_fn))
            agent = rt.agent(options=AgentOptions(model="usage:m-1"))
            with trace.get_tracer("host").start_as_current_span("host request") as host:
                agent.send("go").get()
            assert agent.when_idle().get().reason == "completed"
        finally:
            rt.close()
        spans = list(exporter.get_finished_spans())
    (turn,) = named(spans, "invoke_agent")
    # The host's current span at send time is the turn's parent (captured in the caller's
    # greenlet, carried with the message to the agent's worker greenlet).
    assert turn.parent is not None and turn.parent.span_id == host.get_span_context().span_id
    chats = named(spans, "chat")
    assert [s.name for s in chats] == ["chat m-1", "chat m-1"]
    assert [attr(s, "gen_ai.usage.input_tokens") for s in chats] == [11, 20]
    assert [attr(s, "gen_ai.usage.output_tokens") for s in chats] == [3, 5]
    assert [attr(s, "gen_ai.response.finish_reasons") for s in chats] == [
        ("tool_calls",),
        ("stop",),
    ]
    assert [attr(s, "gen_ai.provider.name") for s in chats] == ["usage", "usage"]
    (tool,) = named(spans, "execute_tool")
    assert attr(tool, "gen_ai.tool.call.id") == "c1"
    (inside,) = [s for s in spans if s.name == "inside the tool"]
    assert inside.parent is not None and inside.parent.span_id == tool.context.span_id
    (_, trace_parent), = inner  # fmt: skip
    span_in_ctx = trace.get_current_span(trace_parent.context)
    assert span_in_ctx.get_span_context().span_id == tool.context.span_id


def test_a_made_up_tool_name_and_call_id_are_cut_on_the_span() -> None:
    """A model may call a tool it does not have, under any name and id; the span keeps
    `MAX_MODEL_TEXT` characters of each, so made-up names cannot fill the caches kept per
    name (800 names of 100 kB held ~400 MB of span templates and encodings)."""
    long_name, long_id = "n" * 10_000, "i" * 5_000
    with installed() as exporter:
        rt = Runtime(store=MemoryStore())
        try:
            agent = rt.agent()
            rt.scripted.script(agent.id, [S.tool_call(long_name, {}, id=long_id), S.text("done")])
            agent.send("go").get()
            assert agent.when_idle().get().reason == "completed"
        finally:
            rt.close()
        spans = list(exporter.get_finished_spans())
    (tool,) = named(spans, "execute_tool")
    cut = "n" * (tracing.MAX_MODEL_TEXT - 1) + "\u2026"
    assert tool.name == f"execute_tool {cut}"
    assert attr(tool, "gen_ai.tool.name") == cut
    assert attr(tool, "gen_ai.tool.call.id") == "i" * (tracing.MAX_MODEL_TEXT - 1) + "\u2026"


class CachedModel:
    """A model that replies once with prompt-cache usage and a lone UTF-16 half in its text."""

    def complete(self, request: ModelRequest, on_progress: ProgressSink | None = None) -> Any:
        return ModelResponse(
            content=[text_block("bad \ud83d half")],
            usage={
                "input_tokens": 7,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20,
                "output_tokens": 4,
            },
        )


def run_cached_model() -> list[ReadableSpan]:
    models = ModelRegistry()
    models.register("cached", CachedModel())
    with installed() as exporter:
        rt = Runtime(store=MemoryStore(), models=models)
        try:
            agent = rt.agent(options=AgentOptions(model="cached:m-2"))
            agent.send("go").get()
            assert agent.when_idle().get().reason == "completed"
        finally:
            rt.close()
        return list(exporter.get_finished_spans())


def test_chat_input_tokens_include_cached_input_as_the_genai_convention_counts_them() -> None:
    (chat,) = named(run_cached_model(), "chat")
    assert attr(chat, "gen_ai.usage.input_tokens") == 7 + 100 + 20
    assert attr(chat, "gen_ai.usage.cache_read.input_tokens") == 100
    assert attr(chat, "gen_ai.usage.cache_creation.input_tokens") == 20
    assert attr(chat, "gen_ai.usage.output_tokens") == 4


def test_usage_attributes_leave_out_what_the_model_did_not_report() -> None:
    assert tracing.usage_attributes({}) == {}
    assert tracing.usage_attributes({"output_tokens": 2}) == {"gen_ai.usage.output_tokens": 2}
    assert tracing.usage_attributes({"cache_read_input_tokens": 5}) == {
        "gen_ai.usage.input_tokens": 5,
        "gen_ai.usage.cache_read.input_tokens": 5,
    }


def test_usage_attributes_are_the_same_keys_in_the_same_order_for_every_report() -> None:
    """The usual reply (input and output only) takes a short path: every combination of
    reported counts (and of values that are not counts) gives the convention's attributes in
    one order: cache reads, cache writes, total input, output (the encoded span follows it)."""
    import itertools

    keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")
    for values in itertools.product((None, 0, 3, True, "4"), repeat=4):
        usage = {
            k: v for k, v in zip((*keys, "output_tokens"), values, strict=True) if v is not None
        }
        counts = {k: v for k, v in usage.items() if type(v) is int}
        expected: dict[str, int] = {}
        if "cache_read_input_tokens" in counts:
            expected["gen_ai.usage.cache_read.input_tokens"] = counts["cache_read_input_tokens"]
        if "cache_creation_input_tokens" in counts:
            expected["gen_ai.usage.cache_creation.input_tokens"] = counts[
                "cache_creation_input_tokens"
            ]
        if any(k in counts for k in keys):
            expected["gen_ai.usage.input_tokens"] = sum(counts.get(k, 0) for k in keys)
        if "output_tokens" in counts:
            expected["gen_ai.usage.output_tokens"] = counts["output_tokens"]
        found = tracing.usage_attributes(usage)
        assert list(found.items()) == list(expected.items()), usage


def test_captured_output_is_the_repaired_reply(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(tracing.CAPTURE_CONTENT_ENV, "true")
    (chat,) = named(run_cached_model(), "chat")
    text = attr(chat, "gen_ai.output.messages")
    text.encode()  # encodes: no lone surrogate reached the span
    [message] = json.loads(text)
    assert message["role"] == "assistant"
    assert message["parts"] == [{"type": "text", "content": "bad \ufffd half"}]
    assert message["finish_reason"] == "stop"


def test_a_torn_reply_is_logged_repaired_once_when_the_span_records_no_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With content capture off the `chat` span holds none of the reply's text, so the reply
    is not repaired before it: the log's encoding probes it, as without tracing. Text, call id
    and arguments with lone halves still reach the log, the tool and the tool's span repaired."""
    monkeypatch.delenv(tracing.CAPTURE_CONTENT_ENV, raising=False)
    fffd = "\ufffd"
    got: list[Any] = []

    def respond(request: ModelRequest) -> S.Step:
        if request.step == 1:
            return S.tool_call("echo", {"k": "v\ud800"}, "c\ud83d", text="say \udcff")
        return S.text("done")

    def echo(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        got.append((dict(arguments), ctx.call_id))
        return "ok"

    with installed() as exporter:
        rt = Runtime(store=MemoryStore(), scripted=S.ScriptedModel(respond))
        try:
            rt.ctx.tools.register(Tool("echo", "echoes", {"type": "object"}, echo))
            agent = rt.agent()
            agent.send("go").get()
            assert agent.when_idle().get().reason == "completed"
            replies = [e for e in agent.log.events if e["type"] == "assistant/message"]
        finally:
            rt.close()
        spans = list(exporter.get_finished_spans())
    assert got == [({"k": f"v{fffd}"}, f"c{fffd}")]
    assert len(replies) == 2
    message = replies[0]["data"]["message"]
    assert message["content"] == [{"type": "text", "text": f"say {fffd}"}]
    assert message["tool_calls"] == [
        {"id": f"c{fffd}", "name": "echo", "arguments": {"k": f"v{fffd}"}}
    ]
    assert [attr(s, "gen_ai.response.finish_reasons") for s in named(spans, "chat")] == [
        ("tool_calls",),
        ("stop",),
    ]
    (tool,) = named(spans, "execute_tool")
    assert attr(tool, "gen_ai.tool.call.id") == f"c{fffd}"
    assert all(attr(s, "gen_ai.output.messages") is None for s in spans)


def test_output_is_not_captured_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(tracing.CAPTURE_CONTENT_ENV, raising=False)
    (chat,) = named(run_cached_model(), "chat")
    assert attr(chat, "gen_ai.output.messages") is None


def test_the_capture_variable_is_read_once_a_second_and_for_a_new_provider(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`capture_content()` does not read the environment per turn: a change of the variable is
    seen once the last reading is a second old (a clock the test moves), or at once when a new
    tracer provider is installed (docs/tracing.md)."""
    clock = [1000.0]
    monkeypatch.setattr(tracing, "_monotonic", lambda: clock[0])
    monkeypatch.setenv(tracing.CAPTURE_CONTENT_ENV, "true")
    with installed():
        assert tracing.tracer() is not None  # a new provider: the next reading is fresh
        assert tracing.capture_content() is True
        monkeypatch.delenv(tracing.CAPTURE_CONTENT_ENV)
        clock[0] += tracing.CAPTURE_CONTENT_REREAD_S / 2
        assert tracing.capture_content() is True  # the reading is under a second old
        clock[0] += tracing.CAPTURE_CONTENT_REREAD_S / 2
        assert tracing.capture_content() is False  # a second old: read again
        monkeypatch.setenv(tracing.CAPTURE_CONTENT_ENV, "TRUE ")
        assert tracing.capture_content() is False
    with installed():
        assert tracing.tracer() is not None
        assert tracing.capture_content() is True  # the provider changed: read again at once


def test_a_later_turn_with_no_parent_keeps_the_agents_previous_one() -> None:
    with installed() as exporter:
        rt = Runtime(store=MemoryStore())
        try:
            agent = rt.agent()
            with trace.get_tracer("host").start_as_current_span("session") as host:
                agent.send("one").get()
            agent.when_idle().get()
            # From a greenlet with no current span (as a settlement notice is sent).
            gevent.spawn(lambda: agent.send("two").get()).get()
            agent.when_idle().get()
        finally:
            rt.close()
        spans = list(exporter.get_finished_spans())
    turns = named(spans, "invoke_agent")
    assert [attr(s, "subagent.turn") for s in turns] == [1, 2]
    assert {s.parent.span_id for s in turns if s.parent} == {host.get_span_context().span_id}


def test_aborted_parallel_children_end_every_span(tmp_path: Path) -> None:
    """A cancelled parent turn kills its running delegations; no span is left open."""
    with installed() as exporter:
        rt = Runtime(store=MemoryStore())
        try:
            rt.subagents.register(SpawnProvider())
            install_subagent_tools(rt, tools=[SubagentToolConfig("spawn", name="subagent")])
            root = rt.agent()
            calls = [("subagent", {"description": f"w{i}", "prompt": f"p{i}"}) for i in range(3)]
            rt.scripted.script(root.id, [S.tool_calls(calls), S.text("never")])
            rt.scripted.script("*", [S.hang()])
            root.send("fan out").get()
            for _ in range(1000):
                if len(rt.subagents.runs()) == 3:
                    break
                gevent.sleep(0.005)
            assert root.cancel("stop").get().reason == "aborted"
        finally:
            rt.close()
        provider = trace.get_tracer_provider()
        assert isinstance(provider, (TracerProvider, LeanTracerProvider))
        spans = list(exporter.get_finished_spans())
    children = [s for s in named(spans, "invoke_agent") if attr(s, "subagent.depth") == 1]
    assert len(children) == 3
    assert {attr(s, "subagent.stop_reason") for s in children} == {"aborted"}
    tools = named(spans, "execute_tool subagent")
    assert len(tools) == 3
    # Every started span ended: each child's chat and each tool call were exported.
    assert len(named(spans, "chat")) == 1 + 3


# -- across processes ----------------------------------------------------------------------------


def test_an_acp_childs_spans_join_the_trace_through_meta(tmp_path: Path) -> None:
    config = AcpConfig(command=sys.executable, args=[TRACED_PEER], eof_grace=2.0)
    with installed() as exporter:
        rt = Runtime(store=MemoryStore())
        try:
            rt.subagents.register(AcpProvider(config))
            parent = rt.agent()
            request = SubagentStartRequest(
                prompt=[text_block("hi")],
                parent=parent,
                signal=AbortController().signal,
                trace=tracing.TraceParent(
                    trace.set_span_in_context(trace.get_tracer("t").start_span("call")),
                    name="acp worker",
                ),
            )
            handle = rt.subagents.start("acp", request)
            try:
                result = handle.result.get(timeout=30)
            finally:
                handle.dispose()
        finally:
            rt.close()
        spans = list(exporter.get_finished_spans())
    (activation,) = named(spans, "invoke_agent")
    assert activation.name == "invoke_agent acp worker"
    assert activation.kind is trace.SpanKind.CLIENT  # the child runs in another process
    assert attr(activation, "subagent.provider") == "acp"
    assert attr(activation, "subagent.stop_reason") == "completed"
    reply = json.loads(result.output[0]["text"])
    traceparent = reply["meta"]["traceparent"]
    assert traceparent.startswith(
        f"00-{activation.context.trace_id:032x}-{activation.context.span_id:016x}-"
    )
    remote = {s["name"]: s for s in reply["spans"]}
    assert remote["invoke_agent peer"]["trace_id"] == activation.context.trace_id
    assert remote["invoke_agent peer"]["parent_id"] == activation.context.span_id
    assert remote["chat peer-model"]["parent_id"] == remote["invoke_agent peer"]["span_id"]


def test_a_resumed_acp_childs_activation_links_to_its_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "agent-state"
    state.mkdir()
    monkeypatch.setenv("ACP_PEER_STATE", str(state))  # the SDK peer keeps its sessions there
    with installed() as exporter:
        rt = Runtime(store=SessionStore(tmp_path / "sessions"))
        try:
            rt.subagents.register(
                ResumableAcpProvider(peer_config("normal", pass_env=["ACP_PEER_STATE"]))
            )
            parent = rt.agent()
            request = SubagentStartRequest(
                prompt=[text_block("first")], parent=parent, signal=AbortSignal.never()
            )
            started = rt.subagents.start_continuable("acp", request, label="remote helper")
            assert rt.tasks.wait(started.task_id, timeout=60).status == "completed"
            sent = rt.subagents.send_message(
                parent, started.child_id, "recall", MessageSource.coordinator(parent.id)
            )
            assert sent.kind == "started"
            assert rt.tasks.wait(sent.task_id or "", timeout=60).status == "completed"
        finally:
            rt.close()
        spans = list(exporter.get_finished_spans())
    activations = [s for s in named(spans, "invoke_agent") if attr(s, "subagent.provider")]
    first, resumed = sorted(activations, key=lambda s: s.start_time or 0)
    assert attr(first, "subagent.provider") == attr(resumed, "subagent.provider") == "acp"
    assert attr(resumed, "subagent.resumed") is True
    assert attr(resumed, "gen_ai.agent.id") == started.child_id
    assert [link.context.span_id for link in resumed.links] == [first.context.span_id]
    assert resumed.links[0].context.trace_id == first.context.trace_id
    assert first.kind is resumed.kind is trace.SpanKind.CLIENT


def test_a_turn_parented_from_another_process_is_a_server_span() -> None:
    with installed() as exporter:
        rt = Runtime(store=MemoryStore())
        try:
            caller = trace.get_tracer("t").start_span("remote caller")
            wire = tracing.carrier(tracing.TraceParent(trace.set_span_in_context(caller)))
            agent = rt.agent()
            agent.send("go", trace=tracing.extract(wire, "hosted")).get()
            assert agent.when_idle().get().reason == "completed"
            local = tracing.TraceParent(trace.set_span_in_context(caller), name="local")
            agent.send("again", trace=local).get()
            assert agent.when_idle().get().reason == "completed"
            caller.end()
        finally:
            rt.close()
        spans = list(exporter.get_finished_spans())
    hosted, local_turn = named(spans, "invoke_agent")
    assert hosted.name == "invoke_agent hosted"
    assert hosted.kind is trace.SpanKind.SERVER
    assert hosted.parent is not None and hosted.parent.is_remote
    assert hosted.parent.span_id == caller.get_span_context().span_id
    assert local_turn.kind is trace.SpanKind.INTERNAL


def test_without_tracing_the_acp_child_gets_no_meta(tmp_path: Path) -> None:
    config = AcpConfig(command=sys.executable, args=[TRACED_PEER], eof_grace=2.0)
    with no_provider():
        provider = AcpProvider(config)
        parent = AcpParent(cwd=str(tmp_path))
        run = provider.start(
            SubagentStartRequest(
                prompt=[text_block("hi")], parent=parent, signal=AbortController().signal
            )
        )
        try:
            result = run.result.get(timeout=30)
        finally:
            run.dispose()
    assert json.loads(result.output[0]["text"])["meta"] == {}


def _demo(home: Path, otel: Mapping[str, str]) -> gsub.CompletedProcess[str]:
    """`subagent demo --no-live` in a fresh interpreter, with `otel` as its only `OTEL_*`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return gsub.run(
        [sys.executable, "-m", "subagent.cli", "--home", str(home), "demo", "--no-live"],
        cwd=REPO,
        env={**env, **otel},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_otel_traces_exporter_console_prints_the_demo_spans(tmp_path: Path) -> None:
    env = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "demo-under-test"}
    proc = _demo(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    decoder = json.JSONDecoder()
    text = proc.stdout
    spans = []
    index = text.find("{\n")
    while index != -1:
        span, end = decoder.raw_decode(text, index)
        spans.append(span)
        index = text.find("{\n", end)
    names = {s["name"] for s in spans}
    assert {"subagent demo", "invoke_agent coordinator", "execute_tool subagent"} <= names
    assert len({s["context"]["trace_id"] for s in spans}) == 1
    assert {s["resource"]["attributes"]["service.name"] for s in spans} == {"demo-under-test"}


# -- set-up from the environment -----------------------------------------------------------------


def test_configure_from_env_installs_only_when_asked_and_never_over_a_host() -> None:
    with no_provider():
        assert telemetry.configure_from_env({}) is False
        assert telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "none"}) is False
        disabled = {"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"}
        assert telemetry.configure_from_env(disabled) is False
        assert tracing.tracer() is None
        with pytest.raises(ValueError, match="zipkin"):
            telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "zipkin"})
        with pytest.raises(ValueError, match="protocol"):
            telemetry.configure_from_env(
                {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}
            )
        # `otlp` gets the runtime's lean provider (it needs only the OpenTelemetry API).
        assert telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "otlp"}) is True
        ours = trace.get_tracer_provider()
        assert isinstance(ours, LeanTracerProvider)
        assert ours.resource.attributes["service.name"] == telemetry.DEFAULT_SERVICE_NAME
        ours.shutdown()
    with no_provider():
        assert telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "console"}) is True
        sdk = trace.get_tracer_provider()
        assert isinstance(sdk, TracerProvider)
        assert sdk.resource.attributes["service.name"] == telemetry.DEFAULT_SERVICE_NAME
        sdk.shutdown()
    host = TracerProvider()
    with installed(host):
        assert telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "console"}) is False
        assert trace.get_tracer_provider() is host
        assert tracing.tracer() is not None


def test_a_sampled_out_trace_records_nothing_but_still_travels() -> None:
    """Parent-based sampling: a dropped agent span makes no model or tool spans, and the
    children it starts inherit the decision (their context is the dropped trace's)."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    seen: list[Any] = []
    with installed(TracerProvider(sampler=ALWAYS_OFF)) as exporter:
        rt = Runtime(store=MemoryStore())
        try:
            rt.subagents.register(SpawnProvider())
            install_subagent_tools(rt, tools=[SubagentToolConfig("spawn", name="subagent")])
            _probe_then_delegate(rt, seen)
        finally:
            rt.close()
        assert exporter.get_finished_spans() == ()
    (where,) = seen
    context = trace.get_current_span(where.context).get_span_context()
    assert context.is_valid and not context.trace_flags.sampled


def test_otlp_endpoint_sends_the_demo_trace_to_a_collector(tmp_path: Path) -> None:
    """The `otlp` exporter, configured by OTEL_EXPORTER_OTLP_ENDPOINT alone, posts the demo's
    trace to a collector (here a real HTTP server on 127.0.0.1 that decodes OTLP/protobuf)."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra")
    from otlp_collector import collector

    with collector() as local:
        base = local.endpoint.removesuffix("/v1/traces")
        proc = _demo(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": base})
    assert proc.returncode == 0, proc.stderr
    assert "spans were not exported" not in proc.stderr
    assert local.paths and set(local.paths) == {"/v1/traces"}
    assert local.services() == {"subagent"}
    assert local.scopes() == {tracing.INSTRUMENTATION}
    spans = local.spans()
    names = {s.name for s in spans}
    assert {"subagent demo", "invoke_agent coordinator", "execute_tool send_message"} <= names
    assert len({s.trace_id for s in spans}) == 1


def test_the_cli_says_at_exit_how_many_spans_it_could_not_export(tmp_path: Path) -> None:
    """The exporter's warning is library logging, which `demo` and `run` do not show (it would
    tear the live view): a wrong endpoint used to lose every span without a word."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    proc = _demo(tmp_path, {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert proc.returncode == 0, proc.stderr
    (said,) = [line for line in proc.stderr.splitlines() if "spans were not exported" in line]
    assert said.startswith("subagent: tracing: ") and "ConnectionRefusedError" in said
    assert int(said.split()[2]) > 0


def test_the_cli_says_so_too_when_the_sdk_pipeline_lost_them(tmp_path: Path) -> None:
    """A set-up the lean exporter does not take (here `SUBAGENT_OTEL_SDK`) gets the SDK's
    pipeline, whose failures are log lines only: they are counted and said as well."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "500",  # the SDK's exporter retries until then
        "SUBAGENT_OTEL_SDK": "true",
    }
    proc = _demo(tmp_path, otel)
    assert proc.returncode == 0, proc.stderr
    (said,) = [line for line in proc.stderr.splitlines() if "spans were not exported" in line]
    assert said.startswith("subagent: tracing: ") and "OTLPSpanExporter" in said
    assert int(said.split()[2]) > 0


NO_OTEL_SCRIPT = """
import sys
sys.modules["opentelemetry"] = None  # as without the otel extra: every import of it fails
from agent import tracing
from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore
from providers.inprocess import SpawnProvider
from subagent import telemetry
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools

assert tracing.tracer() is None and tracing.ambient() is None
assert tracing.carrier(None) == {} and tracing.extract({"traceparent": "00-x"}) is None
rt = Runtime(store=MemoryStore())
rt.subagents.register(SpawnProvider())
install_subagent_tools(rt, tools=[SubagentToolConfig("spawn", name="subagent")])
agent = rt.agent()
rt.scripted.script(agent.id, [S.tool_call("subagent", {"description": "w", "prompt": "p"}),
                              S.text("done")])
agent.send("go").get()
assert agent.when_idle().get().reason == "completed"
rt.close()
try:
    telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "console"})
except RuntimeError as exc:
    assert "otel" in str(exc)
    print("ok")
"""


def test_without_the_otel_packages_everything_runs_untraced() -> None:
    proc = gsub.run(
        [sys.executable, "-c", NO_OTEL_SCRIPT],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


SLOW_COLLECTOR_SCRIPT = """
import http.server, os, sys, threading
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb
received = [0]
release = threading.Event()

class Collector(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = pb.ExportTraceServiceRequest.FromString(body)
        received[0] += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        release.wait(30)  # a busy collector: what ends meanwhile waits in the batch queue
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Collector)
threading.Thread(target=server.serve_forever, daemon=True).start()
endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
from agent import tracing
from subagent import telemetry
env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
       **dict(a.split("=", 1) for a in sys.argv[2:])}
assert telemetry.configure_from_env(env)
found = tracing.tracer()
for _ in range(int(sys.argv[1])):  # a round of replies: 2 spans per stepping child
    found.start_span("chat").end()
release.set()
telemetry.flush()
print(received[0])
"""


def _spans_through_a_slow_collector(spans: int, *env: str) -> int:
    proc = gsub.run(
        [sys.executable, "-c", SLOW_COLLECTOR_SCRIPT, str(spans), *env],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout.strip())


def test_the_batch_queue_holds_a_fan_out_round_while_the_collector_is_busy() -> None:
    """6,000 spans end while the collector holds the first export: the SDK's default queue
    (2,048) would drop most of them; the runtime's set-up keeps every one, and a host's own
    OTEL_BSP_MAX_QUEUE_SIZE still rules."""
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the otel extra")
    assert _spans_through_a_slow_collector(6_000) == 6_000
    assert _spans_through_a_slow_collector(6_000, "SUBAGENT_OTEL_SDK=true") == 6_000
    # At most one batch (512, the SDK's) left the queue before it filled: the rest is dropped.
    assert _spans_through_a_slow_collector(6_000, "OTEL_BSP_MAX_QUEUE_SIZE=1000") <= 1_512
    sdk = _spans_through_a_slow_collector(
        6_000, "OTEL_BSP_MAX_QUEUE_SIZE=1000", "SUBAGENT_OTEL_SDK=true"
    )
    assert sdk <= 1_512
    with no_provider(), pytest.raises(ValueError, match="OTEL_BSP_MAX_QUEUE_SIZE"):
        telemetry.configure_from_env(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_BSP_MAX_QUEUE_SIZE": "x"}
        )


def test_configure_from_env_imports_the_sdk_off_the_hub() -> None:
    """The SDK and exporter imports run in a worker thread: another greenlet runs meanwhile
    (a first import of protobuf's modules takes tenths of a second)."""
    ticks = [0]

    def tick() -> None:
        while True:
            ticks[0] += 1
            gevent.sleep(0)

    host = TracerProvider()
    with installed(host):
        ticker = gevent.spawn(tick)
        gevent.sleep(0)
        start = ticks[0]
        try:
            assert telemetry.configure_from_env({"OTEL_TRACES_EXPORTER": "console"}) is False
            assert ticks[0] > start  # read before kill(), which yields
        finally:
            ticker.kill()
