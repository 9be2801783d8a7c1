"""Cost budgets over a price table (issue 17): prices per model route, costs recorded with each
response and summed per subtree, cost budgets that cascade exactly like token budgets (clamped,
checked at every step boundary, cancelling the overspent subtree, surviving a cold resume), and
an unpriced route under a cost budget refused before anything exists. Also: usage an ACP child
reports, counted in its parent's subtree."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from acp_peers.support import peer_config
from budget_kit import fan_out_responder, first_prompt, noop_tool, start_budgeted_child
from seam_kit import assert_log_valid, last_user_text, wait_until

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.options import AgentOptions
from agent.store import MemoryStore, SessionStore
from agent.usage import Price, PriceTable, UsageAccount, child_cost_budget, usd_to_pico
from providers.acp import AcpProvider, acp_usage
from providers.inprocess import SpawnProvider
from subagent.descriptor import SubagentDescriptor, authoritative_descriptor, parse_descriptor
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools
from subagent.types import MessageSource, SubagentStartRequest, text_block
from supervision.signal import AbortController

# Every scripted reply reports 10 input + 5 output tokens; at these prices that is $0.002.
CALL = {"input_tokens": 10, "output_tokens": 5}
PRICES = {"scripted:*": {"input": 100, "output": 200}}
PER_CALL = Decimal("0.002")


def usd(amount: str | Decimal) -> int:
    return usd_to_pico(Decimal(amount))


# -- prices --------------------------------------------------------------------------------------


def test_a_price_costs_each_kind_of_token_exactly() -> None:
    price = Price(input=3, output=15, cache_read=0.3, cache_write=3.75)
    usage = {
        "input_tokens": 1_000,
        "output_tokens": 200,
        "cache_read_input_tokens": 10_000,
        "cache_creation_input_tokens": 400,
    }
    # 1000*3 + 200*15 + 10000*0.3 + 400*3.75 = 10,500 USD per million = $0.0105, exactly.
    assert price.cost(usage) == usd("0.0105")
    with pytest.raises(ValueError):
        Price(input=-1, output=1)
    with pytest.raises(ValueError):
        Price(input=0.0000001, output=1)  # finer than a micro-dollar per million tokens
    with pytest.raises(TypeError):
        Price(input=True, output=1)


def test_a_price_table_prefers_the_exact_route_over_the_prefix_wildcard() -> None:
    table = PriceTable({"anthropic:*": {"input": 3, "output": 15}, "anthropic:small": Price(1, 5)})
    assert table.get("anthropic:small") == Price(1, 5)
    assert table.get("anthropic:big") == Price(3, 15)
    assert table.get("openai:gpt") is None and "openai:gpt" not in table
    for bad in ({"nocolon": {"input": 1, "output": 1}}, {"a:b": {"input": 1}}, {"a:b": 3}):
        with pytest.raises(ValueError):
            PriceTable(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PriceTable({"a:b": {"input": 1, "output": 1, "reasoning": 2}})


def test_a_price_table_loads_from_json_and_toml(tmp_path: Path) -> None:
    as_json = tmp_path / "prices.json"
    as_json.write_text(json.dumps({"openai:gpt-x": {"input": 2.5, "output": 10}}))
    as_toml = tmp_path / "prices.toml"
    as_toml.write_text('["openai:gpt-x"]\ninput = 2.5\noutput = 10\ncache_read = 1.25\n')
    assert PriceTable.load(as_json).get("openai:gpt-x") == Price(2.5, 10)
    assert PriceTable.load(as_toml).get("openai:gpt-x") == Price(2.5, 10, cache_read=1.25)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match="not a valid price table"):
        PriceTable.load(broken)
    with Runtime(store=MemoryStore(), prices=as_toml) as rt:
        assert rt.ctx.prices.get("openai:gpt-x") == Price(2.5, 10, cache_read=1.25)
    with pytest.raises(TypeError):
        Runtime(store=MemoryStore(), prices=42)  # type: ignore[arg-type]


def test_cost_accounts_cascade_and_the_tightest_cost_budget_wins() -> None:
    price = Price(input=100, output=200)
    root = UsageAccount(owner="root", cost_limit=usd("0.010"))
    child = UsageAccount(owner="child", price=price, cost_limit=usd("0.003"))
    child.attach(root)
    fired: list[str] = []
    root.on_exceeded = child.on_exceeded = lambda acc: fired.append(acc.owner)
    assert child_cost_budget(child, usd("1")) == usd("0.003")
    child.charge(CALL)
    assert child.cost_own == root.cost_spent == usd(PER_CALL) and root.cost_own == 0
    assert child.cost_remaining() == usd("0.001")
    child.charge(CALL)
    assert child.exceeded() is child and root.exceeded() is None and fired == ["child"]
    assert child.describe_exhausted() == (
        "cost budget exhausted: the subtree of child spent $0.004000 of its $0.003000"
    )


# -- one agent -----------------------------------------------------------------------------------


@pytest.fixture
def rt() -> Iterator[Runtime]:
    runtime = Runtime(
        store=MemoryStore(), scripted=S.ScriptedModel(S.echo, usage=CALL), prices=PRICES
    )
    runtime.subagents.register(SpawnProvider())
    runtime.ctx.tools.register(noop_tool())
    try:
        yield runtime
    finally:
        runtime.close()


def test_each_response_records_its_cost_and_a_cost_budget_ends_the_turn(rt: Runtime) -> None:
    rt.scripted.script("*", [S.tool_call("noop", {})], repeat=True)
    root = rt.agent(options=AgentOptions(cost_budget=0.005, max_steps=50))
    root.send("loop").get()
    outcome = root.when_idle().get()
    assert outcome.reason == "budget-exceeded"
    assert outcome.message == (
        f"cost budget exhausted: the subtree of {root.id} spent $0.006000 of its $0.005000"
    )
    events = assert_log_valid(rt.ctx.store, root.id)
    costs = [e["data"]["cost_usd"] for e in events if e["type"] == "assistant/message"]
    assert costs == [0.002, 0.002, 0.002]  # the third crossed it; the next boundary stopped
    assert root.usage.cost_spent == usd("0.006")


def test_an_unpriced_route_under_a_cost_budget_is_refused_before_it_exists(rt: Runtime) -> None:
    rt.ctx.models.register("free", S.ScriptedModel(S.echo, usage=CALL))
    with pytest.raises(ValueError, match="'free:x' has no price"):
        rt.agent(options=AgentOptions(model="free:x", cost_budget=1))
    assert rt.ctx.store.list() == []  # nothing half-made
    # No cost budget anywhere: an unpriced route is fine, and records no cost.
    free = rt.agent(options=AgentOptions(model="free:x"))
    free.send("hi").get()
    assert free.when_idle().get().reason == "completed"
    events = rt.ctx.store.load(free.id).events
    assert all("cost_usd" not in e["data"] for e in events if e["type"] == "assistant/message")


def _start(rt: Runtime, parent: Any, **kwargs: Any) -> Any:
    return rt.subagents.start(
        "spawn",
        SubagentStartRequest(
            prompt=[text_block("leaf")], parent=parent, signal=AbortController().signal, **kwargs
        ),
    )


def test_a_child_cost_budget_is_clamped_and_a_spent_parent_starts_no_child(rt: Runtime) -> None:
    root = rt.agent(options=AgentOptions(cost_budget=0.005))
    root.usage.charge(CALL)  # $0.002 of $0.005
    handle = _start(rt, root, cost_budget=1.0)
    try:
        assert handle.local_agent.usage.cost_limit == usd("0.003")
        result = handle.result.get()
        assert result.stop_reason == "completed"
        assert result.extra["cost_usd"] == 0.002
    finally:
        handle.dispose()
    assert root.usage.cost_spent == usd("0.004")  # the child's answer counted against the root
    root.usage.charge(CALL)
    with pytest.raises(SubagentError) as info:
        _start(rt, root)
    assert info.value.code == "BUDGET_EXCEEDED"
    with pytest.raises(ValueError):
        _start(rt, rt.agent(), cost_budget=0)


def test_a_child_with_an_unpriced_route_under_a_cost_budget_is_refused(rt: Runtime) -> None:
    rt.ctx.models.register("free", S.ScriptedModel(S.echo, usage=CALL))
    unpriced = AgentOptions(model="free:x")
    before = {h.id for h in rt.ctx.store.list()}
    # Its own cost budget, or one above it: either way it would spend uncounted.
    for parent, kwargs in (
        (rt.agent(), {"cost_budget": 1.0}),
        (rt.agent(options=AgentOptions(cost_budget=1.0)), {}),
    ):
        before.add(parent.id)
        with pytest.raises(SubagentError) as info:
            _start(rt, parent, agent_options=unpriced, **kwargs)
        assert info.value.code == "NO_PRICE"
        assert "'free:x' has no price" in str(info.value)
    assert {h.id for h in rt.ctx.store.list()} == before  # no child was made
    # Without any cost budget on the chain the same child starts.
    handle = _start(rt, rt.agent(), agent_options=unpriced)
    try:
        assert handle.result.get().stop_reason == "completed"
    finally:
        handle.dispose()


def test_remote_providers_cannot_take_a_cost_budget(rt: Runtime) -> None:
    rt.subagents.register(AcpProvider(peer_config("normal")))
    with pytest.raises(SubagentError) as info:
        rt.subagents.start(
            "acp",
            SubagentStartRequest(
                prompt=[text_block("x")],
                parent=rt.agent(),
                signal=AbortController().signal,
                cost_budget=1.0,
            ),
        )
    assert info.value.code == "UNSUPPORTED_CAPABILITY"


# -- a tree --------------------------------------------------------------------------------------


def test_a_cost_budget_used_up_mid_fan_out_stops_exactly_the_subtree_that_overspent() -> None:
    model = S.ScriptedModel(fan_out_responder, usage=CALL)
    with Runtime(store=MemoryStore(), scripted=model, prices=PRICES) as runtime:
        runtime.subagents.register(SpawnProvider())
        runtime.ctx.tools.register(noop_tool())
        install_subagent_tools(
            runtime,
            tools=[
                SubagentToolConfig("spawn", name="subagent"),
                SubagentToolConfig("spawn", name="capped", cost_budget=0.02),
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
        rows = {r["id"]: r for r in runtime.subagents.list_descendants(root.id)}
        prompts = {i: first_prompt(runtime, i) for i in rows}
        stop = {prompts[e["id"]]: e["stop_reason"] for e in ends}
        greedy = next(i for i, p in prompts.items() if p == "greedy")
        assert stop["modest"] == "completed"
        assert stop["greedy"] == "budget-exceeded"
        workers = [e for e in ends if prompts[e["id"]] == "work"]
        assert len(workers) == 2
        assert {e["stop_reason"] for e in workers} <= {"aborted", "budget-exceeded"}
        [end] = [e for e in assert_log_valid(runtime.ctx.store, greedy) if e["type"] == "turn/end"]
        assert "cost budget exhausted" in end["data"]["message"]
        # Rows carry costs: own per row, subtree totals; at most one call per live agent (3)
        # past the $0.02.
        spent = Decimal(str(rows[greedy]["subtree_cost_usd"]))
        assert Decimal("0.02") <= spent <= Decimal("0.02") + 3 * PER_CALL
        modest = next(r for i, r in rows.items() if prompts[i] == "modest")
        assert modest["cost_usd"] == modest["subtree_cost_usd"] == 0.002


def test_a_cost_budget_survives_cold_resume(tmp_path: Path) -> None:
    """The descriptor (version 3) keeps the cost budget; the resumed child counts what it spent
    before sleeping, so it stops at the same total as if it never slept."""

    def respond(request: ModelRequest) -> S.Step:
        return S.tool_call("noop", {}) if last_user_text(request) == "spend" else S.text("ok")

    def runtime() -> Runtime:
        r = Runtime(
            store=SessionStore(tmp_path),
            scripted=S.ScriptedModel(respond, usage=CALL),
            prices=PRICES,
        )
        r.subagents.register(SpawnProvider())
        r.ctx.tools.register(noop_tool())
        return r

    with runtime() as first:
        parent, child_id = start_budgeted_child(first, "hello", cost_budget=0.005)
        parent_id = parent.id
    loaded = SessionStore(tmp_path).load(child_id)
    descriptor = authoritative_descriptor(loaded.events, loaded.header.seed_length)
    assert isinstance(descriptor, SubagentDescriptor) and descriptor.cost_budget == 0.005
    assert descriptor.to_json()["version"] == 3
    assert parse_descriptor(descriptor.to_json()) == descriptor
    with runtime() as second:
        parent = second.resume_agent(parent_id)
        result = second.subagents.send_message(
            parent, child_id, [text_block("spend")], MessageSource.coordinator(parent_id)
        )
        assert result.kind == "started" and result.task_id is not None
        task_id = result.task_id
        wait_until(lambda: second.tasks.get(task_id).settled)
        child_events = SessionStore(tmp_path).load(child_id).events
        ends = [e["data"] for e in child_events if e["type"] == "turn/end"]
        assert ends[-1]["reason"] == "budget-exceeded"
        assert "spent $0.006000 of its $0.005000" in ends[-1]["message"]
        # It counted the $0.002 it spent before sleeping: two new calls, not three.
        last_start = max(i for i, e in enumerate(child_events) if e["type"] == "turn/start")
        calls = [e for e in child_events[last_start:] if e["type"] == "assistant/message"]
        assert len(calls) == 2


# -- ACP children report usage --------------------------------------------------------------------


def test_acp_usage_maps_to_our_keys_and_keeps_the_total() -> None:
    raw = {
        "inputTokens": 100,
        "outputTokens": 20,
        "thoughtTokens": 5,
        "cachedReadTokens": 30,
        "totalTokens": 155,
    }
    assert acp_usage(raw) == {
        "input_tokens": 100,
        "output_tokens": 25,  # the thought tokens the total counts beyond the mapped kinds
        "cache_read_input_tokens": 30,
    }
    assert acp_usage(None) == {} and acp_usage({"inputTokens": "x"}) == {}


def test_an_acp_child_reported_usage_is_its_result_and_counts_in_the_parent_subtree() -> None:
    progress: list[Mapping[str, Any]] = []
    with Runtime(store=MemoryStore()) as runtime:
        runtime.subagents.register(AcpProvider(peer_config("normal", on_progress=progress.append)))
        ends: list[Mapping[str, Any]] = []
        runtime.subagents.subscribe(
            lambda e: ends.append(e) if e["type"] == "subagent/end" else None
        )
        root = runtime.agent()

        def run(prompt: str) -> Any:
            handle = runtime.subagents.start(
                "acp",
                SubagentStartRequest(
                    prompt=[text_block(prompt)], parent=root, signal=AbortController().signal
                ),
            )
            try:
                return handle.result.get(timeout=30)
            finally:
                handle.dispose()

        result = run("usage")
        assert result.stop_reason == "completed"
        reported = {"input_tokens": 100, "output_tokens": 25, "cache_read_input_tokens": 30}
        assert result.extra["usage"] == reported
        assert result.extra["acp_cost"] == {"amount": 0.25, "currency": "USD"}
        assert [e["update"]["used"] for e in progress if e["kind"] == "usage_update"] == [100]
        runtime.subagents.providers()  # let the registry deliver subagent/end
        assert ends[-1]["usage"] == reported
        assert root.usage.subtree == reported and root.usage.own == {}
        # An agent that reports nothing: nothing is made up.
        quiet = run("hello")
        assert "usage" not in quiet.extra and "acp_cost" not in quiet.extra
        assert root.usage.subtree == reported
