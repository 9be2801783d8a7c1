"""The model-facing subagent tools, driven by a scripted parent model."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from gevent.event import Event
from seam_kit import assert_log_valid, last_user_text, wait_until

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import MemoryStore, SessionStore
from agent.tools import ToolContext, ToolError
from providers.inprocess import ForkProvider, SpawnProvider
from subagent.runtime import Runtime
from subagent.tools import (
    PROVIDER_MANAGED,
    SubagentToolConfig,
    format_task,
    headline,
    install_subagent_tools,
    subagent_tool,
)
from subagent.types import SubagentCapabilities, text_block
from supervision.signal import AbortSignal

ROOT = "root"


class Env:
    """A runtime whose children answer through `child`, and a scripted root agent."""

    def __init__(self, store: Any = None) -> None:
        self.child: Any = lambda request: S.text(f"child: {last_user_text(request)}")
        self.model = S.ScriptedModel(lambda request: self.child(request))
        self.rt = Runtime(store=store or MemoryStore(), scripted=self.model)
        self.rt.subagents.register(SpawnProvider())
        self.rt.subagents.register(ForkProvider())

    def root(self, *steps: S.Step, session_id: str = ROOT) -> Any:
        self.model.script(session_id, list(steps))
        return self.rt.agent(session_id=session_id)

    def turn(self, agent: Any, prompt: str = "go") -> Any:
        agent.send(prompt).get()
        return agent.when_idle().get()


@pytest.fixture
def env() -> Iterator[Env]:
    e = Env()
    try:
        yield e
    finally:
        e.rt.close()


def results(agent: Any, name: str | None = None) -> list[Mapping[str, Any]]:
    return [
        e["data"]
        for e in agent.log.events
        if e["type"] == "tool/result" and (name is None or e["data"]["name"] == name)
    ]


def text_of(result: Mapping[str, Any]) -> str:
    return "".join(b.get("text", "") for b in result["content"])


def tool_names(request: ModelRequest) -> list[str]:
    return [t.name for t in request.tools]


def call(description: str, prompt: str, **extra: Any) -> dict[str, Any]:
    return {"description": description, "prompt": prompt, **extra}


# -- foreground -----------------------------------------------------------------------------


def test_foreground_returns_the_child_output_and_releases_the_child(env: Env) -> None:
    install_subagent_tools(env.rt, tools=["spawn"])
    root = env.root(S.tool_call("subagent", call("greet", "say hi")), S.text("ok"))
    assert env.turn(root).reason == "completed"
    [result] = results(root, "subagent")
    assert not result["is_error"]
    assert text_of(result) == "child: say hi"
    assert list(env.rt.ctx.agents) == [ROOT]  # the child was disposed
    assert_log_valid(env.rt.store, ROOT)


def test_parallel_foreground_delegations_run_side_by_side(env: Env) -> None:
    install_subagent_tools(env.rt, tools=["spawn"])
    both = Event()
    waiting: list[str] = []

    def child(request: ModelRequest) -> S.Step:
        waiting.append(request.session_id)
        if len(waiting) == 2:
            both.set()
        both.wait()  # each child waits for the other: only concurrency lets them finish
        return S.text(last_user_text(request))

    env.child = child
    calls = [("subagent", call("a", "one")), ("subagent", call("b", "two"))]
    root = env.root(S.tool_calls(calls), S.text("ok"))
    env.turn(root)
    assert [text_of(r) for r in results(root, "subagent")] == ["one", "two"]


@pytest.mark.parametrize(
    ("step", "code", "head", "diagnostic", "partial"),
    [
        (S.error("model exploded"), "SUBAGENT_ERROR", headline("error"), "model exploded", None),
        (
            S.max_tokens("half an ans"),
            "SUBAGENT_MAX_TOKENS",
            headline("max-tokens"),
            None,
            "half an ans",
        ),
        (S.refusal("no thanks"), "SUBAGENT_REFUSAL", headline("refusal"), None, "no thanks"),
    ],
)
def test_a_failed_child_is_an_error_result_with_headline_diagnostic_and_partial(
    env: Env, step: S.Step, code: str, head: str, diagnostic: str | None, partial: str | None
) -> None:
    install_subagent_tools(env.rt, tools=["spawn"])
    env.child = lambda request: step
    root = env.root(S.tool_call("subagent", call("x", "try")), S.text("ok"))
    env.turn(root)
    [result] = results(root, "subagent")
    assert result["is_error"] and result["code"] == code
    lines = text_of(result).split("\n")
    assert lines[0] == head
    if diagnostic is not None:
        assert lines[1] == f"Diagnostic: {diagnostic}"
    if partial is not None:
        assert lines[-2:] == ["Partial output:", partial]
    assert list(env.rt.ctx.agents) == [ROOT]


def test_a_crashing_child_is_contained_as_an_error_result(env: Env) -> None:
    install_subagent_tools(env.rt, tools=["spawn"])

    def crash(request: ModelRequest) -> S.Step:
        raise RuntimeError("adapter bug")

    env.child = crash
    root = env.root(S.tool_call("subagent", call("x", "try")), S.text("still here"))
    assert env.turn(root).reason == "completed"
    [result] = results(root, "subagent")
    assert result["is_error"] and "RuntimeError: adapter bug" in text_of(result)


def test_unknown_stop_reasons_are_failures() -> None:
    assert "failure" in headline("exploded-in-a-new-way")


class CountingSpawn(SpawnProvider):
    """Counts how often each run it made is disposed."""

    def __init__(self) -> None:
        super().__init__("counting")
        self.disposals: dict[str, int] = {}

    def start(self, request: Any) -> Any:
        run = super().start(request)
        original = run.dispose
        self.disposals[run.id] = 0

        def dispose() -> None:
            self.disposals[run.id] += 1
            original()

        run.dispose = dispose
        return run


def test_cancelling_the_parent_turn_cancels_the_child_and_disposes_once(env: Env) -> None:
    provider = CountingSpawn()
    env.rt.subagents.register(provider)
    install_subagent_tools(env.rt, tools=[SubagentToolConfig("counting", name="subagent")])
    env.child = lambda request: S.hang()
    root = env.root(S.tool_call("subagent", call("x", "forever")))
    root.send("go").get()
    wait_until(lambda: len(env.rt.ctx.agents) == 2 and provider.disposals != {})
    [child_id] = [a for a in env.rt.ctx.agents if a != ROOT]
    wait_until(lambda: env.rt.ctx.agents[child_id].turn_running)
    root.cancel("user pressed stop").get()
    assert root.when_idle().get().reason == "aborted"
    assert list(provider.disposals.values()) == [1]
    child_log = env.rt.store.load(child_id).events
    ends = [e["data"]["reason"] for e in child_log if e["type"] == "turn/end"]
    assert ends == ["aborted"]


def test_completed_foreground_disposes_exactly_once(env: Env) -> None:
    provider = CountingSpawn()
    env.rt.subagents.register(provider)
    install_subagent_tools(env.rt, tools=[SubagentToolConfig("counting", name="subagent")])
    root = env.root(S.tool_call("subagent", call("x", "y")), S.text("ok"))
    env.turn(root)
    assert list(provider.disposals.values()) == [1]


def test_a_start_failure_is_an_error_result_with_the_seam_code(env: Env) -> None:
    # A variable unknown at install is refused there (docs/tools.md); one registered without
    # a value passes install and fails each start.
    env.rt.ctx.variables["unset_variable"] = None
    install_subagent_tools(
        env.rt,
        tools=[SubagentToolConfig("spawn", name="subagent", persona="{{unset_variable}}")],
    )
    root = env.root(S.tool_call("subagent", call("x", "y")), S.text("ok"))
    env.turn(root)
    [result] = results(root, "subagent")
    assert result["is_error"] and result["code"] == "START_FAILED"


# -- descriptions and install ---------------------------------------------------------------


def test_descriptions_follow_inherits_parent_context(env: Env) -> None:
    spawn = subagent_tool(env.rt.subagents, SubagentToolConfig("spawn"))
    fork = subagent_tool(env.rt.subagents, SubagentToolConfig("fork"))
    assert "does NOT see this conversation" in spawn.description
    assert "copy of this conversation" not in spawn.description
    assert "copy of this conversation" in fork.description
    assert "does NOT see" not in fork.description
    assert (spawn.name, fork.name) == ("subagent_spawn", "subagent_fork")


def test_install_refuses_a_config_the_provider_cannot_honour(env: Env) -> None:
    class Bare(SpawnProvider):
        capabilities = SubagentCapabilities()

    env.rt.subagents.register(Bare("bare"))
    with pytest.raises(Exception, match="provider-managed"):
        install_subagent_tools(env.rt, tools=["bare"])
    uninstall = install_subagent_tools(
        env.rt, tools=[SubagentToolConfig("bare", max_depth=PROVIDER_MANAGED)]
    )
    uninstall()
    assert "subagent" not in env.rt.ctx.tools


def test_install_takes_a_runtime_a_context_or_an_agent_and_refuses_anything_else(
    env: Env,
) -> None:
    agent = env.rt.agent()
    for target in (env.rt, env.rt.ctx, agent):
        install_subagent_tools(target, tools=["spawn"])()
    with pytest.raises(TypeError, match="Runtime, an AgentContext or an Agent"):
        install_subagent_tools(object(), env.rt.subagents)  # type: ignore[arg-type]


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        SubagentToolConfig("spawn", max_depth=-1)
    with pytest.raises(ValueError):
        SubagentToolConfig("spawn", background="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        SubagentToolConfig("")


# -- the depth cap ----------------------------------------------------------------------------


def _nested_env(env: Env, placement: str) -> Any:
    """Root (depth 0) delegates; the child (depth 1, at a cap of 1) tries to delegate too."""
    config = SubagentToolConfig("spawn", name="subagent", max_depth=1)
    child_steps = iter(
        [S.tool_call("subagent", call("grandchild", "deeper")), S.text("child done")]
    )
    env.child = lambda request: next(child_steps)
    root = env.root(S.tool_call("subagent", call("child", "go deep")), S.text("ok"))
    if placement == "runtime":
        install_subagent_tools(env.rt, tools=[config])
    else:
        install_subagent_tools(root, tools=[config])
    return root


@pytest.mark.parametrize("placement", ["runtime", "agent"])
def test_at_the_depth_cap_the_tool_is_hidden_and_a_forged_call_refused(
    env: Env, placement: str
) -> None:
    root = _nested_env(env, placement)
    env.turn(root)
    root_requests = env.model.requests_for(ROOT)
    assert "subagent" in tool_names(root_requests[0])
    [child_id] = [sid for sid in {r.session_id for r in env.model.requests} if sid != ROOT]
    child_requests = env.model.requests_for(child_id)
    assert all("subagent" not in tool_names(r) for r in child_requests)
    assert "send_message" in tool_names(child_requests[0])  # only the delegation tool is hidden
    forged = [
        e["data"]
        for e in env.rt.store.load(child_id).events
        if e["type"] == "tool/result" and e["data"]["name"] == "subagent"
    ]
    assert len(forged) == 1 and forged[0]["is_error"] and forged[0]["code"] == "UNKNOWN_TOOL"
    assert len({r.session_id for r in env.model.requests}) == 2  # no grandchild exists


def test_the_depth_cap_is_also_refused_at_run_time(env: Env) -> None:
    tool = subagent_tool(env.rt.subagents, SubagentToolConfig("spawn", max_depth=2))

    deep = env.rt.agent(delegation_depth=2)
    assert deep.depth == 2
    ctx = ToolContext(agent=deep, session_id=deep.id, call_id="c1", signal=AbortSignal.never())
    with pytest.raises(ToolError) as info:
        tool.fn(call("x", "y"), ctx)
    assert info.value.code == "DEPTH_EXCEEDED"


def test_provider_managed_depth_never_hides(env: Env) -> None:
    config = SubagentToolConfig("spawn", max_depth=PROVIDER_MANAGED)
    assert not config.hidden_for(10_000)
    assert SubagentToolConfig("spawn").hidden_for(3)
    assert not SubagentToolConfig("spawn").hidden_for(2)


# -- background one-shot ----------------------------------------------------------------------


def test_background_one_shot_is_a_task_read_with_task_output(env: Env) -> None:
    install_subagent_tools(env.rt, tools=["spawn"])
    gate = Event()

    def child(request: ModelRequest) -> S.Step:
        gate.wait()
        return S.text("background answer")

    env.child = child
    root = env.root(
        S.tool_call("subagent", call("bg job", "work", run_in_background=True)),
        S.tool_call("task_output", {"task_id": "task-1"}),
        S.text("started"),
        # The settlement notice wakes the root for a second turn.
        S.tool_call("task_output", {"task_id": "task-1"}),
        S.text("read it"),
    )
    assert env.turn(root).reason == "completed"
    started, running = results(root)
    assert "as task task-1" in text_of(started)
    assert text_of(running).startswith("Task task-1 (bg job): running")
    gate.set()
    env.rt.tasks.wait("task-1")
    wait_until(lambda: len(results(root)) == 3 and root.status == "idle")
    notice = [
        e["data"]["message"]
        for e in root.log.events
        if e["type"] == "user/message" and e["data"]["message"]["source"]["kind"] != "user"
    ]
    assert notice and notice[0]["source"]["kind"] == "subagent-settled"
    final = results(root)[2]
    assert not final["is_error"]
    assert text_of(final) == "Task task-1 (bg job): completed\nbackground answer"


def test_task_kill_stops_the_background_child_and_task_output_reports_it(env: Env) -> None:
    install_subagent_tools(env.rt, tools=[SubagentToolConfig("spawn", notify_parent=False)])
    env.child = lambda request: S.hang()
    root = env.root(
        S.tool_call("subagent", call("slow", "work", run_in_background=True)),
        S.tool_call("task_kill", {"task_id": "task-1"}),
        S.tool_call("task_output", {"task_id": "task-1", "wait": True}),
        S.text("done"),
    )
    env.turn(root)
    _, killed, output = results(root)
    assert text_of(killed) == "Task task-1 (slow) was killed."
    assert output["is_error"] and output["code"] == "TASK_KILLED"
    wait_until(lambda: list(env.rt.ctx.agents) == [ROOT])


def test_task_tools_refuse_another_agents_task(env: Env) -> None:
    install_subagent_tools(env.rt, tools=["spawn"])
    other = env.rt.agent(session_id="other")
    env.rt.tasks.adopt("theirs", other.id, kill=lambda reason: None)
    root = env.root(S.tool_call("task_kill", {"task_id": "task-1"}), S.text("ok"))
    env.turn(root)
    [result] = results(root)
    assert result["is_error"] and result["code"] == "UNKNOWN_TASK"
    assert env.rt.tasks.get("task-1").status == "running"


# -- continuable ------------------------------------------------------------------------------


@pytest.fixture
def durable(tmp_path: Path) -> Iterator[Env]:
    e = Env(store=SessionStore(tmp_path / "sessions"))
    try:
        yield e
    finally:
        e.rt.close()


def test_continuable_child_is_interrupted_then_resumed_by_send_message(durable: Env) -> None:
    env = durable
    install_subagent_tools(
        env.rt, tools=[SubagentToolConfig("spawn", name="subagent", background="continuable")]
    )
    first = Event()

    def child(request: ModelRequest) -> S.Step:
        if last_user_text(request) == "long job":
            first.set()
            return S.hang()
        return S.text(f"resumed with: {last_user_text(request)}")

    env.child = child
    ids: list[str] = []

    def root_responder(request: ModelRequest) -> S.Step:
        last = request.messages[-1]
        if last["role"] == "user" and last["content"][0]["text"] == "go":
            return S.tool_call("subagent", call("long", "long job", run_in_background=True))
        if last["role"] == "tool" and last["name"] == "subagent":
            ids.append(text_of(last).split()[3])
            return S.tool_call("list_agents", {})
        if last["role"] == "tool" and last["name"] == "list_agents":
            first.wait()
            return S.tool_call("interrupt_agent", {"agent_id": ids[0]})
        if last["role"] == "tool" and last["name"] == "interrupt_agent":
            return S.tool_call("send_message", {"subagent_id": ids[0], "message": "finish"})
        return S.text("noted")

    root = env.rt.agent(session_id=ROOT)
    previous = env.child
    env.child = lambda request: (
        root_responder(request) if request.session_id == ROOT else previous(request)
    )
    env.turn(root)
    wait_until(lambda: all(t.settled for t in env.rt.tasks.list()) and root.status == "idle")
    by_name = {r["name"]: r for r in results(root)}
    assert "status=running" in text_of(by_name["list_agents"])
    assert "mode=continuable" in text_of(by_name["list_agents"])
    assert text_of(by_name["interrupt_agent"]).startswith(f"Interrupted {ids[0]}")
    sent = text_of(by_name["send_message"])
    assert "resumed with your message" in sent, sent
    child_events = assert_log_valid(env.rt.store, ids[0])
    ends = [e["data"]["reason"] for e in child_events if e["type"] == "turn/end"]
    assert ends == ["aborted", "completed"]
    tasks = env.rt.tasks.list(owner=ROOT)
    assert [t.status for t in tasks] == ["killed", "completed"]
    assert env.rt.subagents.list_children(ROOT)[0]["activity"] == "stored"


@pytest.mark.parametrize("background", ["one-shot", "continuable"])
def test_a_background_tasks_output_is_the_childs_blocks_on_both_paths(
    durable: Env, background: str
) -> None:
    """One settlement path (`subagent.settlement`): a background one-shot and a continuable
    activation settle their tasks alike, output as content blocks, a failure's detail as the
    headline then the diagnostic; `task_output` shows the blocks' text."""
    env = durable
    config = SubagentToolConfig("spawn", name="subagent", background=background)  # type: ignore[arg-type]
    install_subagent_tools(env.rt, tools=[config])

    calls = [
        ("subagent", call("good", "good job", run_in_background=True)),
        ("subagent", call("bad", "bad job", run_in_background=True)),
    ]

    def answer(request: ModelRequest) -> S.Step:
        if request.session_id == ROOT:  # delegates once, then notes each settlement notice
            last = request.messages[-1]
            go = last["role"] == "user" and last_user_text(request) == "go"
            return S.tool_calls(calls) if go else S.text("noted")
        if last_user_text(request) == "bad job":
            return S.error("model exploded")
        return S.text(f"answer: {last_user_text(request)}")

    env.child = answer
    root = env.rt.agent(session_id=ROOT)
    env.turn(root)
    wait_until(lambda: len(env.rt.tasks.list(owner=ROOT)) == 2)
    settled = {t.label: env.rt.tasks.wait(t.id) for t in env.rt.tasks.list(owner=ROOT)}
    good, bad = settled["good"], settled["bad"]
    assert (good.label, good.status) == ("good", "completed")
    assert good.output == [text_block("answer: good job")]
    assert good.detail is None
    assert (bad.label, bad.status) == ("bad", "failed")
    assert isinstance(bad.output, list) and all(isinstance(b, dict) for b in bad.output)
    assert bad.detail is not None and bad.detail.startswith(headline("error"))
    assert "model exploded" in bad.detail
    assert format_task(good) == f"Task {good.id} (good): completed\nanswer: good job"


def test_send_message_to_a_stranger_is_refused(durable: Env) -> None:
    env = durable
    install_subagent_tools(env.rt, tools=["spawn"])
    root = env.root(
        S.tool_call("send_message", {"subagent_id": "nobody", "message": "hi"}), S.text("ok")
    )
    env.turn(root)
    [result] = results(root)
    assert result["is_error"] and result["code"] == "UNKNOWN_CHILD"


def test_continuable_needs_a_persistent_store(env: Env) -> None:
    install_subagent_tools(
        env.rt, tools=[SubagentToolConfig("spawn", name="subagent", background="continuable")]
    )
    root = env.root(S.tool_call("subagent", call("x", "y", run_in_background=True)), S.text("ok"))
    env.turn(root)
    [result] = results(root)
    assert result["is_error"] and result["code"] == "PERSISTENCE_UNAVAILABLE"


def test_list_agents_empty_and_descendants_scope(env: Env) -> None:
    install_subagent_tools(env.rt, tools=["spawn"])
    root = env.root(
        S.tool_call("list_agents", {}),
        S.tool_call("list_agents", {"scope": "descendants"}),
        S.text("ok"),
    )
    env.turn(root)
    assert [text_of(r) for r in results(root)] == ["No subagents.", "No subagents."]


def test_background_one_shot_disposes_its_started_child_when_adopt_fails(env: Env) -> None:
    """The child starts, then the task service refuses it (closing): the child is cancelled
    and disposed before the call returns, and the model gets a typed error."""
    install_subagent_tools(env.rt, tools=[SubagentToolConfig("spawn", notify_parent=False)])
    env.child = lambda request: S.hang()
    events: list[str] = []
    env.rt.subagents.subscribe(lambda event: events.append(event["type"]))
    env.rt.tasks.close()  # adopt() now fails RUNTIME_CLOSED, after the child's start
    root = env.root(
        S.tool_call("subagent", call("bg", "work", run_in_background=True)), S.text("ok")
    )
    env.turn(root)
    [result] = results(root, "subagent")
    assert result["is_error"] and result["code"] == "RUNTIME_CLOSED"
    assert "Could not start the subagent" in text_of(result)
    # Disposed before the tool returned: its end was emitted and no child is left.
    assert events == ["subagent/start", "subagent/end"]
    assert list(env.rt.ctx.agents) == [ROOT]
