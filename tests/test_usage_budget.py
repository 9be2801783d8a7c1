"""Token usage and budgets (issue 17): usage per response in the log, sums per session and per
subtree (accounts, RunHandle / SubagentResult.extra, subagent/end, listings), and budgets that
cascade like depth: clamped to what the parent has left, checked at every step boundary, a used-up
budget ending exactly the subtree that overspent, and surviving a cold resume."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from budget_kit import (
    fan_out_responder,
    first_prompt,
    last_is_tool_result,
    noop_tool,
    start_budgeted_child,
)
from gevent.event import Event as GEvent
from rich.console import Console
from seam_kit import assert_log_valid, last_user_text, wait_until

from agent.log import validate_log
from agent.model import ModelRequest
from agent.models import scripted as S
from agent.options import AgentOptions
from agent.store import MemoryStore, SessionStore
from agent.usage import UsageAccount, child_budget, total_tokens, usage_of_events
from providers.inprocess import SpawnProvider
from subagent.cli_tree import TreeModel
from subagent.descriptor import SubagentDescriptor, authoritative_descriptor
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortController

# Every scripted reply reports 10 input + 5 output tokens.
CALL = {"input_tokens": 10, "output_tokens": 5}


def times(n: int) -> dict[str, int]:
    return {"input_tokens": 10 * n, "output_tokens": 5 * n}


# -- the account ---------------------------------------------------------------------------------


def test_an_account_charges_its_chain_and_the_tightest_budget_wins() -> None:
    root = UsageAccount(owner="root", limit=100)
    child = UsageAccount(owner="child", limit=60)
    grandchild = UsageAccount(owner="grandchild")
    child.attach(root)
    grandchild.attach(child)
    fired: list[str] = []
    root.on_exceeded = child.on_exceeded = lambda acc: fired.append(acc.owner)
    grandchild.charge({"input_tokens": 30, "output_tokens": 10, "cache_read_input_tokens": 5})
    assert grandchild.own == {"input_tokens": 30, "output_tokens": 10, "cache_read_input_tokens": 5}
    assert child.own == {} and child.spent == root.spent == 45
    assert grandchild.remaining() == 15  # the child's 60 is tighter than the root's 100
    assert grandchild.exceeded() is None
    child.charge({"output_tokens": 20})
    assert child.spent == 65 and root.spent == 65
    assert grandchild.exceeded() is child and root.exceeded() is None
    assert grandchild.remaining() == 0
    assert fired == ["child"]
    child.charge({"output_tokens": 1})
    assert fired == ["child"]  # once
    assert "spent 66 of its 60 tokens" in child.describe_exhausted()


def test_an_account_refuses_bad_budgets_and_cycles() -> None:
    with pytest.raises(ValueError):
        UsageAccount(limit=-1)
    a, b = UsageAccount(), UsageAccount()
    b.attach(a)
    with pytest.raises(ValueError):
        a.attach(b)


def test_a_child_budget_never_exceeds_what_the_parent_has_left() -> None:
    parent = UsageAccount(limit=100)
    parent.charge({"input_tokens": 70})
    assert child_budget(parent, 500) == 30
    assert child_budget(parent, 20) == 20
    assert child_budget(parent, None) is None
    assert child_budget(UsageAccount(), 500) == 500


def test_usage_of_events_skips_the_fork_seed_and_junk() -> None:
    def msg(usage: Any) -> dict[str, Any]:
        return {"type": "assistant/message", "data": {"usage": usage}}

    events = [msg(CALL), msg(CALL), msg({"input_tokens": "x", "output_tokens": 1}), msg(None)]
    assert usage_of_events(events, seed_length=1) == {"input_tokens": 10, "output_tokens": 6}


# -- a 3-level tree ------------------------------------------------------------------------------


def tree_responder(request: ModelRequest) -> S.Step:
    """root 'go' -> child 'level1' -> grandchild 'level2' -> leaf; each wraps up after."""
    if last_is_tool_result(request):
        return S.text("done")
    said = last_user_text(request)
    if said == "go":
        return S.tool_call("subagent", {"description": "child", "prompt": "level1"})
    if said == "level1":
        return S.tool_call("subagent", {"description": "grandchild", "prompt": "level2"})
    return S.text("leaf")


@pytest.fixture
def rt() -> Iterator[Runtime]:
    model = S.ScriptedModel(tree_responder, usage=CALL)
    runtime = Runtime(store=MemoryStore(), scripted=model)
    runtime.subagents.register(SpawnProvider())
    install_subagent_tools(runtime, tools=[SubagentToolConfig("spawn", name="subagent")])
    try:
        yield runtime
    finally:
        runtime.close()


def test_usage_sums_over_a_three_level_tree(rt: Runtime) -> None:
    ends: list[Mapping[str, Any]] = []
    rt.subagents.subscribe(lambda e: ends.append(e) if e["type"] == "subagent/end" else None)
    progress: list[Mapping[str, Any]] = []
    rt.subagents.subscribe_progress(progress.append)
    root = rt.agent()
    tree = TreeModel(rt.ctx, root.id)
    tree.attach(rt.subagents, root)
    root.send("go").get()
    outcome = root.when_idle().get()
    assert outcome.reason == "completed"
    rt.subagents.providers()  # let the registry deliver what it was told
    # The live tree shows each node's subtree tokens.
    assert tree.subtree_tokens(tree.nodes[root.id]) == total_tokens(times(5))
    [child_node] = tree.children(root.id)
    assert tree.subtree_tokens(child_node) == total_tokens(times(3))
    console = Console(width=200, record=True)
    console.print(tree.render())
    drawn = console.export_text()
    assert "75 tok" in drawn and "45 tok" in drawn and "15 tok" in drawn
    # Each agent made 2 model calls except the grandchild (1): 5 calls in all.
    assert root.usage.own == times(2)
    assert root.usage.subtree == times(5)
    # Per response, in the log: every assistant/message carries its usage.
    for session_id in [root.id, *(r["id"] for r in rt.subagents.list_descendants(root.id))]:
        events = assert_log_valid(rt.ctx.store, session_id)
        usages = [e["data"]["usage"] for e in events if e["type"] == "assistant/message"]
        assert usages and all(u == CALL for u in usages)
    # Listings: own usage per row, subtree totals per row.
    rows = {r["depth"]: r for r in rt.subagents.list_descendants(root.id)}
    assert rows[1]["usage"] == times(2) and rows[1]["subtree_usage"] == times(3)
    assert rows[2]["usage"] == times(1) and rows[2]["subtree_usage"] == times(1)
    [child_row] = rt.subagents.list_children(root.id)
    assert child_row["usage"] == times(2)
    # subagent/end carries the ended child's subtree usage (the live tree reads it).
    by_id = {e["id"]: e for e in ends}
    assert by_id[rows[1]["id"]]["usage"] == times(3)
    assert by_id[rows[2]["id"]]["usage"] == times(1)
    # Progress: each model response's usage is in its assistant/message progress event.
    answered = [e for e in progress if e.get("kind") == "assistant/message"]
    assert [e["usage"] for e in answered] == [CALL] * 3  # the child's 2 and the grandchild's 1


def test_run_handle_and_result_extra_carry_the_subtree_usage(rt: Runtime) -> None:
    root = rt.agent()
    request = SubagentStartRequest(
        prompt=[text_block("level1")], parent=root, signal=AbortController().signal
    )
    handle = rt.subagents.start("spawn", request)
    try:
        result = handle.result.get()
        assert result.stop_reason == "completed"
        assert result.extra["usage"] == times(3)  # the child's 2 calls + the grandchild's 1
        assert handle.usage == times(3)
    finally:
        handle.dispose()
    assert root.usage.subtree == times(3) and root.usage.own == {}


# -- budgets -------------------------------------------------------------------------------------


def test_a_budget_used_up_mid_fan_out_stops_exactly_the_subtree_that_overspent() -> None:
    model = S.ScriptedModel(fan_out_responder, usage=CALL)
    with Runtime(store=MemoryStore(), scripted=model) as runtime:
        runtime.subagents.register(SpawnProvider())
        runtime.ctx.tools.register(noop_tool())
        install_subagent_tools(
            runtime,
            tools=[
                SubagentToolConfig("spawn", name="subagent"),
                SubagentToolConfig("spawn", name="capped", token_budget=100),
            ],
        )
        ends: list[Mapping[str, Any]] = []
        runtime.subagents.subscribe(
            lambda e: ends.append(e) if e["type"] == "subagent/end" else None
        )
        root = runtime.agent(options=AgentOptions(max_steps=200))
        root.send("fan").get()
        outcome = root.when_idle().get()
        runtime.subagents.providers()
        assert outcome.reason == "completed"
        assert "root done" in outcome.output[0]["text"]
        rows = {r["id"]: r for r in runtime.subagents.list_descendants(root.id)}
        labels = {r["id"]: first_prompt(runtime, r["id"]) for r in rows.values()}
        stop = {labels[e["id"]]: e["stop_reason"] for e in ends}
        greedy = next(i for i, p in labels.items() if p == "greedy")
        # The capped child ends budget-exceeded with a diagnostic; its workers are stopped too.
        assert stop["modest"] == "completed"
        assert stop["greedy"] == "budget-exceeded"
        workers = [e for e in ends if labels[e["id"]] == "work"]
        assert len(workers) == 2
        assert {e["stop_reason"] for e in workers} <= {"aborted", "budget-exceeded"}
        greedy_events = assert_log_valid(runtime.ctx.store, greedy)
        [end] = [e for e in greedy_events if e["type"] == "turn/end"]
        assert end["data"]["reason"] == "budget-exceeded"
        assert "token budget exhausted" in end["data"]["message"]
        # The subtree stopped at its first boundary past the budget: 100 + at most one call per
        # live agent (3) of overshoot.
        spent = total_tokens(rows[greedy]["subtree_usage"])
        assert 100 <= spent <= 100 + 3 * 15
        # The root's tool result told the model what happened.
        tool_results = [
            e["data"]
            for e in assert_log_valid(runtime.ctx.store, root.id)
            if e["type"] == "tool/result" and e["data"]["name"] == "capped"
        ]
        assert tool_results[0]["is_error"] is True
        assert tool_results[0]["code"] == "SUBAGENT_BUDGET_EXCEEDED"


def test_a_child_budget_is_clamped_and_a_spent_parent_starts_no_child(rt: Runtime) -> None:
    root = rt.agent(options=AgentOptions(token_budget=40))
    root.usage.charge({"input_tokens": 25})

    def start(budget: int | None) -> Any:
        return rt.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=[text_block("leaf please")],
                parent=root,
                signal=AbortController().signal,
                token_budget=budget,
            ),
        )

    handle = start(1000)
    try:
        assert handle.local_agent.usage.limit == 15  # 40 - 25 left
        assert handle.result.get().stop_reason == "completed"
    finally:
        handle.dispose()
    assert root.usage.spent == 40  # the child's 15 counted against the root
    with pytest.raises(SubagentError) as info:
        start(None)
    assert info.value.code == "BUDGET_EXCEEDED"
    with pytest.raises(TypeError):
        start(0)


def test_a_step_boundary_past_the_budget_ends_the_turn_budget_exceeded(rt: Runtime) -> None:
    """A root with its own budget: one call past it, and the next boundary ends the turn."""
    rt.scripted.script("*", [S.tool_call("noop_missing", {})], repeat=True)
    root = rt.agent(options=AgentOptions(token_budget=31))
    root.send("loop").get()
    outcome = root.when_idle().get()
    assert outcome.reason == "budget-exceeded"
    assert outcome.message == (
        f"token budget exhausted: the subtree of {root.id} spent 45 of its 31 tokens"
    )
    events = rt.ctx.store.load(root.id).events
    validate_log(events)
    assert sum(1 for e in events if e["type"] == "assistant/message") == 3


def test_a_budget_survives_cold_resume(tmp_path: Path) -> None:
    """The descriptor keeps the budget; the resumed child counts what it (and its stored
    descendants) already spent, so it stops at the same total as if it never slept."""

    def respond(request: ModelRequest) -> S.Step:
        return S.tool_call("noop", {}) if last_user_text(request) == "spend" else S.text("ok")

    def runtime() -> Runtime:
        r = Runtime(store=SessionStore(tmp_path), scripted=S.ScriptedModel(respond, usage=CALL))
        r.subagents.register(SpawnProvider())
        r.ctx.tools.register(noop_tool())
        return r

    with runtime() as first:
        parent, child_id = start_budgeted_child(first, "hello", token_budget=40)
        parent_id = parent.id
    loaded = SessionStore(tmp_path).load(child_id)
    descriptor = authoritative_descriptor(loaded.events, loaded.header.seed_length)
    assert isinstance(descriptor, SubagentDescriptor) and descriptor.token_budget == 40
    assert usage_of_events(loaded.events) == times(1)  # 15 of 40 spent before sleeping
    with runtime() as second:
        from actors.agents import resume_agent

        parent = resume_agent(second.ctx, parent_id)
        result = second.subagents.send_message(
            parent, child_id, [text_block("spend")], MessageSource.coordinator(parent_id)
        )
        assert result.kind == "started" and result.task_id is not None
        task_id = result.task_id
        wait_until(lambda: second.tasks.get(task_id).settled)
        child_events = SessionStore(tmp_path).load(child_id).events
        ends = [e["data"] for e in child_events if e["type"] == "turn/end"]
        assert ends[-1]["reason"] == "budget-exceeded"
        assert "spent 45 of its 40 tokens" in ends[-1]["message"]
        # It counted the 15 it spent before sleeping: two new calls, not three.
        last_start = max(i for i, e in enumerate(child_events) if e["type"] == "turn/start")
        calls = [e for e in child_events[last_start:] if e["type"] == "assistant/message"]
        assert len(calls) == 2


def test_a_resumed_budget_counts_what_stored_descendants_spent(tmp_path: Path) -> None:
    """The child's first activation delegated to a grandchild (15 tokens of its 45); after a
    cold resume in a new runtime, the grandchild's spend still counts against the budget."""

    def respond(request: ModelRequest) -> S.Step:
        said = last_user_text(request)
        if said == "delegate" and not last_is_tool_result(request):
            return S.tool_call("subagent", {"description": "gc", "prompt": "leaf"})
        if said == "spend":
            return S.tool_call("noop", {})
        return S.text("ok")

    def runtime() -> Runtime:
        r = Runtime(store=SessionStore(tmp_path), scripted=S.ScriptedModel(respond, usage=CALL))
        r.subagents.register(SpawnProvider())
        r.ctx.tools.register(noop_tool())
        install_subagent_tools(r, tools=[SubagentToolConfig("spawn", name="subagent")])
        return r

    with runtime() as first:
        parent, child_id = start_budgeted_child(first, "delegate", token_budget=60)
        parent_id = parent.id
        [row] = first.subagents.list_children(child_id)
        assert row["usage"] == times(1)  # the grandchild
    with runtime() as second:
        parent = second.resume_agent(parent_id)
        result = second.subagents.send_message(
            parent, child_id, [text_block("spend")], MessageSource.coordinator(parent_id)
        )
        assert result.task_id is not None
        task_id = result.task_id
        wait_until(lambda: second.tasks.get(task_id).settled)
        child_events = SessionStore(tmp_path).load(child_id).events
        last_start = max(i for i, e in enumerate(child_events) if e["type"] == "turn/start")
        resumed = child_events[last_start:]
        [end] = [e["data"] for e in resumed if e["type"] == "turn/end"]
        assert end["reason"] == "budget-exceeded"
        assert "spent 60 of its 60 tokens" in end["message"]
        # 45 spent before (child 30 + grandchild 15): one more call reaches 60.
        assert sum(1 for e in resumed if e["type"] == "assistant/message") == 1


def test_a_used_up_budget_cancels_descendants_stuck_in_a_model_call() -> None:
    """A worker hanging in its model call never reaches a step boundary: the charge that uses
    up its parent's budget cancels it, so the subtree ends instead of hanging."""
    sleeping = GEvent()

    def respond(request: ModelRequest) -> S.Step:
        said = last_user_text(request)
        if said == "lead":
            if last_is_tool_result(request):
                return S.text("lead done")
            return S.tool_calls(
                [
                    ("subagent", {"description": "spender", "prompt": "spend"}),
                    ("subagent", {"description": "sleeper", "prompt": "sleep"}),
                ]
            )
        if said == "sleep":
            sleeping.set()
            return S.hang()
        sleeping.wait()  # the spender spends only once the sleeper is inside its model call
        return S.tool_call("noop", {})

    model = S.ScriptedModel(respond, usage=CALL)
    with Runtime(store=MemoryStore(), scripted=model) as runtime:
        runtime.subagents.register(SpawnProvider())
        runtime.ctx.tools.register(noop_tool())
        install_subagent_tools(runtime, tools=[SubagentToolConfig("spawn", name="subagent")])
        root = runtime.agent()
        handle = runtime.subagents.start(
            "spawn",
            SubagentStartRequest(
                prompt=[text_block("lead")],
                parent=root,
                signal=AbortController().signal,
                token_budget=60,
            ),
        )
        try:
            result = handle.result.get()
        finally:
            handle.dispose()
        assert result.stop_reason == "budget-exceeded"
        assert "token budget exhausted" in (result.diagnostic or "")
        rows = runtime.subagents.list_descendants(handle.id)
        prompts = {first_prompt(runtime, r["id"]): r for r in rows}
        sleeper = runtime.ctx.store.load(prompts["sleep"]["id"]).events
        [end] = [e["data"] for e in sleeper if e["type"] == "turn/end"]
        assert end["reason"] == "aborted"
        assert "token budget exhausted" in end.get("cause", "")
