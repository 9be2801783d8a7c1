"""`subagent run --model anthropic:MODEL`: a real root agent on the Messages-compatible stub (on
127.0.0.1, in this process) delegating to a forked child; usage in the summary and listings;
`--max-total-tokens`; and (issue 12 item 6) `--timeout` / `--max-retries` against a server that
accepts and never answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic_stub as an
import openai_stub as st
from anthropic_stub import AnthropicStub, Conn, StubRequest
from test_cli import cli

from agent.log import validate_log
from agent.store import SessionStore

# Every stub answer reports 12 input + 5 output tokens.
PER_CALL = 17


def _last_user_text(body: Any) -> str:
    for message in reversed(body["messages"]):
        if message["role"] == "user":
            for block in reversed(message["content"]):
                if block.get("type") == "text":
                    return str(block["text"])
            return ""
    return ""


def _has_tool_result(body: Any) -> bool:
    return any(
        block.get("type") == "tool_result"
        for m in body["messages"]
        if m["role"] == "user"
        for block in m["content"]
    )


def _route(req: StubRequest, conn: Conn) -> None:
    """The root's task, the child's task, or the root's wrap-up."""
    if _last_user_text(req.body) == "count the files" and not _has_tool_result(req.body):
        arguments = '{"description": "count", "prompt": "please count"}'
        an.tool_use_message([("toolu_1", "subagent_fork", [arguments])])(req, conn)
    elif _last_user_text(req.body) == "please count":
        an.text_message(["there are ", "3 files"])(req, conn)
    else:
        an.text_message(["root: done"])(req, conn)


def test_run_against_the_anthropic_messages_api(tmp_path: Path) -> None:
    with AnthropicStub(default=_route) as stub:
        proc = cli(
            "run",
            "count the files",
            "--model",
            "anthropic:claude-stub",
            "--base-url",
            stub.base_url,
            "--no-live",
            home=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        assert "root: done" in proc.stdout
        assert {r.body["model"] for r in stub.requests} == {"claude-stub"}
        assert {r.path for r in stub.requests} == {"/v1/messages"}
        calls = len(stub.requests)
    assert calls == 3
    # The final summary counts the whole tree: root twice, child once.
    total = calls * PER_CALL
    assert f"tokens (whole tree): {total:,} = {12 * calls} input, {5 * calls} output" in proc.stdout
    store = SessionStore(tmp_path / "sessions")
    headers = store.list()
    root = next(h for h in headers if h.origin is None)
    child = next(h for h in headers if h.origin == "subagent")
    events = store.load(child.id).events
    validate_log(events)
    usages = [e["data"]["usage"] for e in events if e["type"] == "assistant/message"]
    # The fork's seed copies none of the root's paid messages into the child's own count.
    assert usages[-1] == {"input_tokens": 12, "output_tokens": 5}
    # Listings carry the usage: `ls ROOT --json` (own), `tree ROOT --json` (+ subtree totals).
    ls = json.loads(cli("ls", root.id, "--json", home=tmp_path).stdout)
    assert [r["usage"] for r in ls] == [{"input_tokens": 12, "output_tokens": 5}]
    tree = json.loads(cli("tree", root.id, "--json", home=tmp_path).stdout)
    assert [r["subtree_usage"] for r in tree] == [
        {"input_tokens": 36, "output_tokens": 15},  # the root's whole tree
        {"input_tokens": 12, "output_tokens": 5},
    ]
    assert tree[0]["id"] == root.id and tree[0]["usage"] == {
        "input_tokens": 24,
        "output_tokens": 10,
    }


def test_max_total_tokens_stops_the_tree(tmp_path: Path) -> None:
    """The root's first answer already spends 17 of 10 tokens: its child is refused for want
    of budget, and the root ends `budget-exceeded` at the next step boundary."""
    with AnthropicStub(default=_route) as stub:
        proc = cli(
            "run",
            "count the files",
            "--model",
            "anthropic:claude-stub",
            "--base-url",
            stub.base_url,
            "--max-total-tokens",
            "10",
            "--no-live",
            home=tmp_path,
        )
        assert len(stub.requests) == 1
    assert proc.returncode == 1
    assert "budget-exceeded" in proc.stderr
    assert "spent 17 of its 10 tokens" in proc.stderr
    assert "tokens (whole tree): 17" in proc.stdout
    headers = SessionStore(tmp_path / "sessions").list()
    assert [h.origin for h in headers] == [None]  # no child was made


def test_bad_budget_and_transport_flags_exit_2(tmp_path: Path) -> None:
    for flag, value in (
        ("--max-total-tokens", "0"),
        ("--timeout", "0"),
        ("--timeout", "nan"),
        ("--max-retries", "-1"),
    ):
        proc = cli("run", "x", "--model", "m", flag, value, home=tmp_path)
        assert proc.returncode == 2, (flag, value, proc.stderr)


def test_timeout_and_max_retries_bound_a_server_that_never_answers(tmp_path: Path) -> None:
    """Issue 12 item 6: the server accepts and never answers; `--timeout 0.2 --max-retries 1`
    makes the call give up after exactly two attempts, and the run exits non-zero."""
    stall = st.Stall(head=False)
    with st.OpenAIStub(default=stall) as stub:
        proc = cli(
            "run",
            "hello",
            "--base-url",
            stub.base_url,
            "--model",
            "stuck",
            "--timeout",
            "0.2",
            "--max-retries",
            "1",
            "--no-live",
            home=tmp_path,
        )
        assert len(stub.requests) == 2
    assert proc.returncode == 1, proc.stderr
    assert "timed out before a response" in proc.stderr
    assert "gave up after 2 attempts" in proc.stderr


def test_max_cost_with_a_price_table_stops_the_tree_and_the_summary_shows_cost(
    tmp_path: Path,
) -> None:
    """At $1 / $5 per million input / output tokens each answer costs $0.000037; a $0.00003
    budget is used up by the root's first answer: no child, the root ends budget-exceeded."""
    prices = tmp_path / "prices.toml"
    prices.write_text('["anthropic:*"]\ninput = 1\noutput = 5\n')
    with AnthropicStub(default=_route) as stub:
        proc = cli(
            "run",
            "count the files",
            "--model",
            "anthropic:claude-stub",
            "--base-url",
            stub.base_url,
            "--prices",
            str(prices),
            "--max-cost",
            "0.00003",
            "--no-live",
            home=tmp_path,
        )
        assert len(stub.requests) == 1
    assert proc.returncode == 1
    assert "budget-exceeded" in proc.stderr
    assert "cost budget exhausted" in proc.stderr and "$0.000037 of its $0.000030" in proc.stderr
    assert "cost (whole tree): $0.000037  (budget $0.000030)" in proc.stdout
    headers = SessionStore(tmp_path / "sessions").list()
    assert [h.origin for h in headers] == [None]
    # `ls` root rows carry the usage and cost of the whole tree.
    [row] = json.loads(cli("ls", "--json", home=tmp_path).stdout)
    assert row["usage"] == row["subtree_usage"] == {"input_tokens": 12, "output_tokens": 5}
    assert row["cost_usd"] == row["subtree_cost_usd"] == 0.000037


def test_prices_show_the_cost_of_a_whole_tree(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"anthropic:claude-stub": {"input": 1, "output": 5}}))
    with AnthropicStub(default=_route) as stub:
        proc = cli(
            "run",
            "count the files",
            "--model",
            "anthropic:claude-stub",
            "--base-url",
            stub.base_url,
            "--prices",
            str(prices),
            "--no-live",
            home=tmp_path,
        )
        calls = len(stub.requests)
    assert proc.returncode == 0, proc.stderr
    assert calls == 3
    assert "cost (whole tree): $0.000111" in proc.stdout  # 3 x $0.000037
    root = next(h for h in SessionStore(tmp_path / "sessions").list() if h.origin is None)
    # `tree`: the root's own row leads, with its whole tree's cost; the text shows subtree spend.
    tree = json.loads(cli("tree", root.id, "--json", home=tmp_path).stdout)
    assert tree[0]["id"] == root.id and tree[0]["subtree_cost_usd"] == 0.000111
    assert tree[0]["cost_usd"] == 0.000074 and tree[1]["cost_usd"] == 0.000037
    text = cli("tree", root.id, home=tmp_path).stdout
    assert text.splitlines()[0] == f"{root.id}  stored  51 tok $0.000111"
    assert "17 tok $0.000037" in text


def test_max_cost_needs_a_price_for_the_route_and_no_acp(tmp_path: Path) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"openai:*": {"input": 1, "output": 5}}))
    for args, code, says in (
        (["--max-cost", "1"], 1, "--max-cost needs a price for 'anthropic:claude-stub'"),
        (["--max-cost", "1", "--prices", str(prices)], 1, "needs a price"),
        (["--prices", str(tmp_path / "missing.json")], 1, "--prices: cannot read"),
        (["--max-cost", "0"], 2, "positive number of USD"),
    ):
        proc = cli(
            "run", "x", "--model", "anthropic:claude-stub", "--no-live", *args, home=tmp_path
        )
        assert proc.returncode == code, (args, proc.stderr)
        assert says in proc.stderr, (args, proc.stderr)
    proc = cli("run", "x", "--acp", "true", "--max-cost", "1", home=tmp_path)
    assert proc.returncode == 2 and "budgets cannot hold an ACP agent" in proc.stderr
    assert not (tmp_path / "sessions").exists() or SessionStore(tmp_path / "sessions").list() == []
