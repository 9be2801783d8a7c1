"""The usage path of every model response (issue 17, "usage on within 5 % of off"): a usage is
checked and packed once (`check_usage`), the log appends a clean one without walking it and the
account charges it without checking it again (one int addition per account on the chain),
while what is logged, summed and refused stays as it was: a usage that is not clean takes the
old path (logged as given, walked, charged normalized), and a count too big for the log is
still refused by name."""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from actors.agents import resume_agent
from agent.events import SessionHeader
from agent.log import validate_log
from agent.model import ModelRequest, ModelResponse, ProgressSink
from agent.models import ModelRegistry
from agent.options import AgentOptions
from agent.store import MemoryStore, SessionStore
from agent.usage import (
    Usage,
    UsageAccount,
    check_usage,
    checked_usage,
    pack_usage,
    unpack_usage,
    usage_of_events,
)
from subagent.runtime import Runtime
from subagent.types import text_block

# -- the check and the account ---------------------------------------------------------------


def test_check_usage_accepts_only_an_exact_dict_of_known_counts_the_log_can_carry() -> None:
    total, packed, kinds = check_usage({"input_tokens": 7, "output_tokens": 3}) or (0, 0, 0)
    assert total == 10
    assert unpack_usage(packed, kinds) == {"input_tokens": 7, "output_tokens": 3}
    assert check_usage({"cache_read_input_tokens": 0}) is not None
    assert check_usage({}) == (0, 0, 0)
    unclean_usages: list[Mapping[Any, Any]] = [
        {"input_tokens": -1},
        {"input_tokens": 1.0},
        {"input_tokens": True},
        {"input_tokens": 2**64},  # beyond what the log can carry: its walk names it
        {"input_tokens": 1, "reasoning_tokens": 2},
        {1: 2},
    ]
    for unclean in unclean_usages:
        assert check_usage(unclean) is None, unclean

    class Counts(dict[str, int]):
        pass

    assert check_usage(Counts(input_tokens=1)) is None  # the strict encoder refuses subclasses


def test_packed_sums_keep_every_kind_apart_and_the_kinds_reported() -> None:
    big = 2**64 - 1
    usage = {"input_tokens": big, "output_tokens": 0, "cache_read_input_tokens": 5}
    total, packed, kinds = pack_usage(usage)
    assert total == big + 5
    summed = packed * 3  # three such responses: no lane carries into the next
    assert unpack_usage(summed, kinds) == {
        "input_tokens": 3 * big,
        "output_tokens": 0,  # reported as 0: still a kind of this usage
        "cache_read_input_tokens": 15,
    }
    with pytest.raises(ValueError):
        pack_usage({"input_tokens": 2**128})
    # The total rides in a lane of its own: it may not carry into the first kind's either.
    with pytest.raises(ValueError, match="total"):
        pack_usage({"input_tokens": 2**127, "output_tokens": 2**127})
    total, packed, _ = pack_usage({"input_tokens": 2**127, "output_tokens": 2**127 - 1})
    assert total == 2**128 - 1
    assert unpack_usage(packed, 0) == {"input_tokens": 2**127, "output_tokens": 2**127 - 1}


def test_a_charge_counts_only_what_normalize_keeps() -> None:
    parent = UsageAccount(owner="parent")
    child = UsageAccount(owner="child")
    child.attach(parent)
    # A negative count is not spend (normalize_usage drops it); the charge used to add it.
    child.charge({"input_tokens": -5, "output_tokens": 3})
    child.charge({"input_tokens": 4, "reasoning_tokens": 9, "output_tokens": 1.5})
    assert child.own == {"output_tokens": 3, "input_tokens": 4}
    assert child.spent == parent.spent == 7
    assert parent.own == {} and parent.subtree == {"output_tokens": 3, "input_tokens": 4}


def test_subtree_is_own_plus_descendants_and_a_snapshot() -> None:
    root = UsageAccount(owner="root", own={"input_tokens": 1})
    child = UsageAccount(owner="child")
    grandchild = UsageAccount(owner="grandchild")
    child.attach(root)
    grandchild.attach(child)
    grandchild.charge({"input_tokens": 10, "output_tokens": 2})
    child.charge({"output_tokens": 5})
    root.add_subtree({"cache_read_input_tokens": 4})  # a stored descendant, at cold resume
    assert grandchild.subtree == grandchild.own == {"input_tokens": 10, "output_tokens": 2}
    assert child.subtree == {"input_tokens": 10, "output_tokens": 7}
    assert root.subtree == {"input_tokens": 11, "output_tokens": 7, "cache_read_input_tokens": 4}
    assert (grandchild.spent, child.spent, root.spent) == (12, 17, 22)
    snapshot = root.subtree
    snapshot["input_tokens"] = 0
    assert root.subtree["input_tokens"] == 11


def test_a_charge_tells_each_account_over_its_budget_once_nearest_first() -> None:
    root = UsageAccount(owner="root", limit=10)
    child = UsageAccount(owner="child", limit=5)
    child.attach(root)
    told: list[tuple[str, int]] = []
    root.on_exceeded = child.on_exceeded = lambda acc: told.append((acc.owner, root.spent))
    child.charge({"input_tokens": 6})
    # The child is told before the root counts the spend, as in `add_to_subtree`.
    assert told == [("child", 0)]
    child.charge({"input_tokens": 6})
    assert told == [("child", 0), ("root", 12)]
    assert child.exceeded() is child and root.exceeded() is root


UNCLEAN: list[Any] = [
    {"input_tokens": -1},
    {"input_tokens": 2**64},
    {"input_tokens": 1.0},
    {"input_tokens": True},
    {"input_tokens": "3"},
    {"reasoning_tokens": 1},
    {1: 1},
]


@pytest.mark.parametrize("usage", UNCLEAN, ids=repr)
def test_a_checked_usage_refuses_what_the_check_refuses(usage: Any) -> None:
    """The fast path (`Usage`, made by adapters) refuses exactly what `check_usage` refuses,
    and `checked_usage` then hands the mapping over unchanged, for the loop's slow path."""
    assert check_usage(usage) is None
    with pytest.raises(ValueError, match="a usage takes int counts"):
        Usage(usage)
    assert checked_usage(usage) is usage


def test_a_checked_usage_is_a_read_only_mapping_of_its_counts() -> None:
    counts = {"input_tokens": 7, "output_tokens": 0}
    usage = Usage(counts)
    counts["input_tokens"] = 99  # its own copy: the caller's dict can change
    assert usage == {"input_tokens": 7, "output_tokens": 0} and dict(usage) == usage.counts
    assert usage.checked == check_usage({"input_tokens": 7, "output_tokens": 0})
    assert len(usage) == 2 and usage.get("cache_read_input_tokens") is None
    with pytest.raises(AttributeError):
        usage.counts = {}  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(usage)) == usage
    assert checked_usage(usage) is usage
    assert not Usage({})
    # An adapter's own dict, made for the response, is taken over: no copy.
    fresh = {"input_tokens": 1}
    adopted = checked_usage(fresh)
    assert type(adopted) is Usage and adopted.counts is fresh and adopted.checked[0] == 1


def test_a_checked_usage_charges_as_its_counts_do_zero_counts_included() -> None:
    """A kind reported with a count of 0 is still listed, up the chain, whichever path charged
    it; a kind never reported is not."""
    accounts = []
    for usage in (
        {"input_tokens": 5, "cache_read_input_tokens": 0},
        Usage({"input_tokens": 5, "cache_read_input_tokens": 0}),
    ):
        parent = UsageAccount(owner="parent")
        child = UsageAccount(owner="child")
        child.attach(parent)
        child.charge(usage)
        child.charge({"output_tokens": 2})
        accounts.append((child.own, parent.subtree, parent.own, child.spent, parent.spent))
    expected = {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 0}
    assert accounts[0] == accounts[1] == (expected, expected, {}, 7, 7)
    assert list(accounts[0][0]) == ["input_tokens", "output_tokens", "cache_read_input_tokens"]


# -- through the loop and the log --------------------------------------------------------------


class FixedUsage:
    """A model adapter whose one reply reports the usage it was given, whatever it is."""

    def __init__(self, usage: Mapping[str, Any]) -> None:
        self.usage = usage

    def complete(
        self, request: ModelRequest, on_progress: ProgressSink | None = None
    ) -> ModelResponse:
        return ModelResponse(content=[text_block("ok")], usage=self.usage)


@pytest.fixture
def models() -> ModelRegistry:
    return ModelRegistry()


@pytest.fixture
def rt(models: ModelRegistry) -> Iterator[Runtime]:
    runtime = Runtime(store=MemoryStore(), models=models)
    try:
        yield runtime
    finally:
        runtime.close()


def run_one_turn(rt: Runtime, models: ModelRegistry, usage: Mapping[str, Any]) -> Any:
    models.register("fixed", FixedUsage(usage))
    agent = rt.agent(options=AgentOptions(model="fixed:m"))
    agent.send("go").get()
    return agent, agent.when_idle().get()


def assistant_events(rt: Runtime, session_id: str) -> list[Mapping[str, Any]]:
    events = rt.ctx.store.load(session_id).events
    validate_log(events)
    return [e for e in events if e["type"] == "assistant/message"]


@pytest.mark.parametrize("wrap", [dict, Usage], ids=["dict", "Usage"])
def test_a_clean_usage_is_logged_in_the_same_shape_and_charged(
    rt: Runtime, models: ModelRegistry, wrap: Any
) -> None:
    usage = {"input_tokens": 12, "output_tokens": 3, "cache_read_input_tokens": 4}
    agent, outcome = run_one_turn(rt, models, wrap(usage))
    assert outcome.reason == "completed"
    [event] = assistant_events(rt, agent.id)
    assert set(event["data"]) == {"message", "finish", "usage"}
    assert event["data"]["usage"] == usage
    assert agent.usage.own == usage and agent.usage.spent == 19


@pytest.mark.parametrize("hand_over", [dict, checked_usage], ids=["dict", "checked_usage"])
def test_a_usage_that_is_not_clean_is_logged_as_given_and_charged_normalized(
    rt: Runtime, models: ModelRegistry, hand_over: Any
) -> None:
    usage = {"input_tokens": 10, "output_tokens": 2, "reasoning_tokens": 7}
    agent, outcome = run_one_turn(rt, models, hand_over(usage))
    assert outcome.reason == "completed"
    [event] = assistant_events(rt, agent.id)
    assert event["data"]["usage"] == usage  # the adapter's words, as before
    assert agent.usage.own == {"input_tokens": 10, "output_tokens": 2}
    assert usage_of_events(rt.ctx.store.load(agent.id).events) == agent.usage.own


@pytest.mark.parametrize(
    ("usage", "why"),
    [
        # Clean (known keys, exact ints), so the log does not walk it: the strict encoder's
        # range check still refuses it, naming the value as the walk would.
        ({"input_tokens": 2**70}, "assistant/message.data.usage.input_tokens"),
        # Not clean: the log's own walk refuses it.
        ({"input_tokens": 1, "reasoning": math.nan}, "not a finite float"),
    ],
)
@pytest.mark.parametrize("hand_over", [dict, checked_usage], ids=["dict", "checked_usage"])
def test_a_usage_the_log_cannot_carry_is_refused_and_not_charged(
    rt: Runtime, models: ModelRegistry, usage: Mapping[str, Any], why: str, hand_over: Any
) -> None:
    # An adapter hands its usage over through `checked_usage`: what the fast path cannot take
    # reaches the loop as the adapter made it and is refused with the same error as before.
    agent, outcome = run_one_turn(rt, models, hand_over(usage))
    assert outcome.reason == "error"
    assert why in (outcome.message or "")
    assert assistant_events(rt, agent.id) == []
    assert agent.usage.own == {} and agent.usage.spent == 0


def test_a_log_written_before_the_change_resumes_with_its_usage(tmp_path: Path) -> None:
    """The shape of `assistant/message` did not change: a log as the previous code wrote it
    (usage beside message and finish) replays at a cold resume, and its spend is counted."""
    message = {"id": "a3", "role": "assistant", "content": [text_block("hi")], "tool_calls": []}
    old: list[dict[str, Any]] = [
        {"type": "turn/start", "seq": 0, "time": 1.0, "data": {"turn": 1}},
        {"type": "step/start", "seq": 1, "time": 1.0, "data": {"turn": 1, "step": 1}},
        {
            "type": "user/message",
            "seq": 2,
            "time": 1.0,
            "data": {"message": {"role": "user", "content": [text_block("go")]}},
        },
        {
            "type": "assistant/message",
            "seq": 3,
            "time": 1.0,
            "data": {
                "message": message,
                "finish": "stop",
                "usage": {"input_tokens": 5, "output_tokens": 1},
            },
        },
        {"type": "step/end", "seq": 4, "time": 1.0, "data": {"turn": 1, "step": 1}},
        {"type": "turn/end", "seq": 5, "time": 1.0, "data": {"turn": 1, "reason": "completed"}},
    ]
    with SessionStore(tmp_path).create(SessionHeader(id="old-session")) as log:
        for event in old:
            log.append(event["type"], event["data"])
    stored = SessionStore(tmp_path).load("old-session").events
    assert [{**e, "time": 1.0} for e in stored] == old  # the old shape, as stored
    models = ModelRegistry()
    models.register("fixed", FixedUsage({"input_tokens": 2, "output_tokens": 2}))
    with Runtime(store=SessionStore(tmp_path), models=models) as runtime:
        agent = resume_agent(runtime.ctx, "old-session", options=AgentOptions(model="fixed:m"))
        assert agent.usage.own == {"input_tokens": 5, "output_tokens": 1}
        agent.send("again").get()
        outcome = agent.when_idle().get()
        assert outcome is not None and outcome.reason == "completed"
        assert agent.usage.subtree == {"input_tokens": 7, "output_tokens": 3}
        assert agent.usage.spent == 10
    events = SessionStore(tmp_path).load("old-session").events
    assert usage_of_events(events) == {"input_tokens": 7, "output_tokens": 3}
