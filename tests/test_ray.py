"""The `ray` provider against a local Ray (`ray.init(num_cpus=2)`), one cluster per module.

Children run on two `ChildHost` actors. The hosts' scripted model is driven by the prompt (see
`respond`), and cross-process synchronisation uses files (a gate the host's model waits on) and
the progress events the provider relays; no test asserts on timing.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gevent
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")

from ray_support import ray_provider  # noqa: E402

from agent.model import ModelRequest  # noqa: E402
from agent.models import scripted as S  # noqa: E402
from agent.store import SessionStore  # noqa: E402
from agent.tools import Tool  # noqa: E402
from providers.ray import RayProvider  # noqa: E402
from subagent.errors import SubagentError  # noqa: E402
from subagent.runtime import Runtime  # noqa: E402
from subagent.types import (  # noqa: E402
    MessageSource,
    Resumable,
    Steerable,
    SubagentStartRequest,
    ToolRestriction,
    text_block,
)
from supervision.signal import AbortController  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

# The host's setup and model live in this module; ship them by value to the Ray workers.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _first_user_text(request: ModelRequest) -> str:
    for message in request.messages:
        if message["role"] == "user":
            return "".join(b.get("text", "") for b in message["content"])
    return ""


def _last_user_text(request: ModelRequest) -> str:
    for message in reversed(request.messages):
        if message["role"] == "user":
            return "".join(b.get("text", "") for b in message["content"])
    return ""


def respond(runtime: Runtime, request: ModelRequest) -> S.Step:
    """Runs on the hosts. The child's first prompt says what to do."""
    first = _first_user_text(request)
    if first == "await-steer":
        # Step 1 waits until a steer is pending in the child's mailbox, so the test needs no
        # timing to have it admitted at the step boundary that follows.
        if request.step == 1:
            actor = runtime.ctx.agents[request.session_id].actor
            while not actor._steers:
                if request.signal.wait(0.01):
                    request.signal.raise_if_aborted()
            return S.tool_call("noop", {})
        return S.text(f"final: {_last_user_text(request)}")
    if first.startswith("gate "):
        # Wait (abortably) for the gate file, then one tool step, then answer.
        if request.step == 1:
            path = first.split(" ", 1)[1]
            while not os.path.exists(path):
                if request.signal.wait(0.01):
                    request.signal.raise_if_aborted()
            return S.tool_call("noop", {})
        return S.text(f"final: {_last_user_text(request)}")
    if first == "hang":
        return S.hang()
    if first == "fail":
        return S.error("scripted failure")
    if first == "refuse":
        return S.refusal("no")
    if first == "schema":
        return S.tool_call("structured_output", {"answer": 42})
    if first == "introspect":
        tools = sorted(t.name for t in request.tools)
        return S.text(json.dumps({"system": request.system, "tools": tools}))
    return S.text(f"done: {_last_user_text(request)}")


def host_setup(runtime: Runtime) -> None:
    runtime.scripted._responder = lambda request: respond(runtime, request)
    for name in ("noop", "other"):
        runtime.ctx.tools.register(
            Tool(name=name, description=name, parameters={"type": "object"}, fn=lambda a, c: "ok")
        )


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-sessions")


@pytest.fixture(scope="module")
def provider(shared_dir: Path) -> Iterator[RayProvider]:
    yield from ray_provider(shared_dir, host_setup, pool_size=2)


class Parent:
    """A runtime on the shared store with the ray provider registered, and its events."""

    def __init__(self, provider: RayProvider, shared_dir: Path) -> None:
        self.runtime = Runtime(store=SessionStore(shared_dir))
        self.service = self.runtime.subagents
        self.service.register(provider)
        self.provider = provider
        self.events: list[Mapping[str, Any]] = []
        self.progress: list[Mapping[str, Any]] = []
        self.service.subscribe(self.events.append)
        self.service.subscribe_progress(self.progress.append)
        self.agent = self.runtime.agent()

    def request(self, prompt: str, **kwargs: Any) -> SubagentStartRequest:
        signal = kwargs.pop("signal", None) or AbortController().signal
        return SubagentStartRequest(
            prompt=[text_block(prompt)], parent=self.agent, signal=signal, **kwargs
        )

    def start(self, prompt: str, **kwargs: Any) -> Any:
        return self.service.start("ray", self.request(prompt, **kwargs))

    def progress_of(self, run_id: str, kind: str) -> list[Mapping[str, Any]]:
        return [e for e in self.progress if e.get("run_id") == run_id and e["kind"] == kind]


@pytest.fixture
def parent(provider: RayProvider, shared_dir: Path) -> Iterator[Parent]:
    p = Parent(provider, shared_dir)
    yield p
    p.runtime.close()


def wait_for(predicate: Any, what: str, rounds: int = 3000) -> None:
    """Yield to the hub until `predicate()` holds; bounded by rounds, fails loudly."""
    for _ in range(rounds):
        if predicate():
            return
        gevent.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def test_remote_identity_result_and_lifecycle_in_order(parent: Parent) -> None:
    run = parent.start("hello")
    assert run.id.startswith(parent.agent.id + ".ray-")
    assert run.local_agent is None
    assert isinstance(run, Steerable)
    assert isinstance(parent.provider, Resumable)
    result = run.result.get(timeout=30)
    assert result.stop_reason == "completed"
    assert result.output == [text_block("done: hello")]
    run.dispose()
    kinds = [e["type"] for e in parent.events if e["run_id"] == run.run_id]
    assert kinds == ["subagent/start", "subagent/end"]
    assert parent.events[-1]["local"] is False
    # Progress was relayed into the parent's registry, in the child's order, before the end.
    relayed = [e["kind"] for e in parent.progress if e.get("run_id") == run.id]
    assert relayed[0] == "turn/start" and relayed[-1] == "turn/end"
    assert "assistant/message" in relayed


def test_start_time_capabilities_reach_the_host(parent: Parent) -> None:
    run = parent.start(
        "introspect",
        persona="You are the ray persona.",
        tool_filter=ToolRestriction(deny=("other",)),
    )
    seen = json.loads(run.result.get(timeout=30).output[0]["text"])
    assert "You are the ray persona." in seen["system"]
    assert "noop" in seen["tools"] and "other" not in seen["tools"]
    run.dispose()

    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}}
    run = parent.start("schema", output_schema=schema, max_depth=1)
    result = run.result.get(timeout=30)
    assert result.stop_reason == "completed"
    assert result.structured == {"answer": 42}
    run.dispose()

    with pytest.raises(SubagentError) as info:
        parent.start("hello", tool_filter=ToolRestriction(allow=("no-such-tool",)))
    assert info.value.code in ("INVALID_TOOL_FILTER", "START_FAILED")
    with pytest.raises(SubagentError) as info:
        parent.start("hello", max_depth=0)
    assert info.value.code == "DEPTH_EXCEEDED"


@pytest.mark.parametrize(("prompt", "stop"), [("fail", "error"), ("refuse", "refusal")])
def test_child_failures_are_stop_reasons(parent: Parent, prompt: str, stop: str) -> None:
    run = parent.start(prompt)
    result = run.result.get(timeout=30)
    assert result.stop_reason == stop
    run.dispose()


def test_steer_is_admitted_at_the_next_step_boundary(parent: Parent) -> None:
    run = parent.start("await-steer")
    wait_for(lambda: parent.progress_of(run.id, "step/start"), "the child's first step")
    run.steer([text_block("also this")], MessageSource.user()).get(timeout=30)
    result = run.result.get(timeout=30)
    assert result.output == [text_block("final: also this")]
    with pytest.raises(SubagentError) as info:
        run.steer([text_block("late")], MessageSource.user()).get(timeout=30)
    assert info.value.code == "RUN_TERMINAL"
    run.dispose()


def test_cancel_signal_and_dispose(parent: Parent) -> None:
    run = parent.start("hang")
    run.cancel("enough")
    assert run.result.get(timeout=30).stop_reason == "aborted"
    run.dispose()

    controller = AbortController()
    run = parent.start("hang", signal=controller.signal)
    controller.abort("from the signal")
    assert run.result.get(timeout=30).stop_reason == "aborted"
    run.dispose()

    run = parent.start("hang")
    run.dispose()
    run.dispose()  # idempotent
    assert run.result.get(timeout=1).stop_reason == "aborted"
    with pytest.raises(SubagentError):
        run.steer([text_block("x")]).get(timeout=30)


def test_abort_before_publication_rejects(parent: Parent) -> None:
    controller = AbortController()
    controller.abort("early")
    with pytest.raises(SubagentError) as info:
        parent.start("hello", signal=controller.signal)
    assert info.value.code == "ABORTED"


def test_placement_picks_the_least_loaded_host(parent: Parent) -> None:
    runs = [parent.start("hang") for _ in range(4)]
    live = [h["live"] for h in parent.provider.hosts()]
    assert live == [2, 2]
    for run in runs:
        run.dispose()
    assert [h["live"] for h in parent.provider.hosts()] == [0, 0]


def test_continuable_child_cold_resumes_on_a_host(parent: Parent, shared_dir: Path) -> None:
    started = parent.service.start_continuable("ray", parent.request("first"), label="worker")
    child = started.child_id
    assert parent.runtime.tasks.wait(started.task_id, timeout=30).status == "completed"
    stored = SessionStore(shared_dir).inspect(child)
    assert stored.header.parent_session == parent.agent.id
    assert any(e["type"] == "subagent/descriptor" for e in stored.events)
    sent = parent.service.send_message(
        parent.agent, child, [text_block("second")], MessageSource.coordinator(parent.agent.id)
    )
    assert sent.kind == "started"
    assert sent.task_id is not None
    assert parent.runtime.tasks.wait(sent.task_id, timeout=30).status == "completed"
    ends = lambda: [e for e in parent.events if e["type"] == "subagent/end" and e["id"] == child]  # noqa: E731
    wait_for(lambda: len(ends()) == 2, "the resumed activation's end")
    assert ends()[1]["last_assistant_message"] == [text_block("done: second")]


def test_host_death_recovers_continuable_and_fails_one_shot(parent: Parent, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    provider = parent.provider
    keep = parent.service.start_continuable("ray", parent.request(f"gate {gate}"), label="keep")
    filler = parent.start("hang")
    one_shot = parent.start(f"gate {gate}")
    continuable = parent.service.runs()
    by_id = {h.id: h for h in continuable}
    kept = by_id[keep.child_id]
    assert kept._run.host.index == one_shot._run.host.index == 0
    assert filler._run.host.index == 1
    wait_for(lambda: parent.progress_of(keep.child_id, "step/start"), "the child's first step")

    provider.kill_host(0)
    result = one_shot.result.get(timeout=60)
    assert result.stop_reason == "error"
    assert "host" in (result.diagnostic or "")
    wait_for(lambda: kept._run.recoveries == 1, "the recovery")
    wait_for(
        lambda: len(parent.progress_of(keep.child_id, "turn/start")) == 2, "the recovered turn"
    )
    gate.touch()
    recovered = kept.result.get(timeout=60)
    assert recovered.stop_reason == "completed"
    assert provider.hosts()[0]["restarts"] == 1
    wait_for(lambda: provider.hosts()[0]["healthy"], "the restarted host")
    filler.dispose()
    one_shot.dispose()
    # The pool is whole again: a new child runs.
    again = parent.start("after")
    assert again.result.get(timeout=30).output == [text_block("done: after")]
    again.dispose()


def test_abort_racing_publication_leaves_nothing_behind(parent: Parent) -> None:
    controller = AbortController()
    starting = gevent.spawn(parent.start, "hang", signal=controller.signal)
    wait_for(lambda: sum(h["live"] for h in parent.provider.hosts()) == 1, "the placement")
    controller.abort("racing")
    try:
        run = starting.get(timeout=30)
    except SubagentError as exc:
        assert exc.code == "ABORTED"
    else:  # published first: the signal then cancels the published child
        assert run.result.get(timeout=30).stop_reason == "aborted"
        run.dispose()
    wait_for(lambda: sum(h["live"] for h in parent.provider.hosts()) == 0, "the disposal")


class TraceToFile:
    """A host setup: the host process exports its spans as JSON lines to `path` (shared disk)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __call__(self, runtime: Runtime) -> None:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            SimpleSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        path = self.path

        class ToFile(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                with open(path, "a") as f:
                    for s in spans:
                        parent = s.parent.span_id if s.parent else None
                        row = {"name": s.name, "trace_id": s.context.trace_id}
                        row.update(span_id=s.context.span_id, parent_id=parent)
                        f.write(json.dumps(row) + "\n")
                return SpanExportResult.SUCCESS

        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(ToFile()))


def test_a_ray_childs_spans_join_the_trace_through_the_request(
    parent: Parent, tmp_path: Path
) -> None:
    from opentelemetry import trace
    from tracing_support import installed

    from agent.tracing import TraceParent

    path = tmp_path / "host-spans.jsonl"
    parent.provider.run_setup(TraceToFile(str(path)))
    with installed() as exporter:
        caller = trace.get_tracer("test").start_span("the delegating call")
        where = TraceParent(trace.set_span_in_context(caller), name="ray worker")
        run = parent.start("hello", trace=where)
        try:
            assert run.result.get(timeout=30).stop_reason == "completed"
        finally:
            run.dispose()
        caller.end()
        (activation,) = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke")]
    assert activation.name == "invoke_agent ray worker"
    assert activation.parent is not None
    assert activation.parent.span_id == caller.get_span_context().span_id
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    (host_turn,) = [r for r in rows if r["name"].startswith("invoke_agent")]
    assert host_turn["name"] == "invoke_agent ray worker"
    assert host_turn["trace_id"] == activation.context.trace_id
    assert host_turn["parent_id"] == activation.context.span_id
    chats = [r for r in rows if r["name"].startswith("chat")]
    assert chats and all(r["parent_id"] == host_turn["span_id"] for r in chats)
