"""Child labels (display only) are bounded per runtime: a long-lived server that starts
children without end keeps the newest `KEPT_LABELS`, not one per child it ever started."""

from __future__ import annotations

import pytest

from agent.models import scripted as S
from agent.store import MemoryStore
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools
from subagent.tools.delegate import KEPT_LABELS, ChildLabels, child_labels


def test_the_oldest_label_goes_first_and_a_label_set_again_is_the_newest() -> None:
    labels = ChildLabels(bound=3)
    for child in ("a", "b", "c"):
        labels[child] = child.upper()
    labels["a"] = "A again"  # now the newest
    labels["d"] = "D"  # over the bound: "b", the oldest, goes
    assert dict(labels) == {"c": "C", "a": "A again", "d": "D"}
    assert labels.get("b") is None and len(labels) == 3
    with pytest.raises(ValueError):
        ChildLabels(bound=0)


def test_the_tools_record_labels_in_the_bounded_map() -> None:
    rt = Runtime(store=MemoryStore(), gc_policy=False)
    try:
        rt.subagents.register(SpawnProvider())
        install_subagent_tools(rt, tools=[SubagentToolConfig("spawn", name="subagent")])
        agent = rt.agent()
        rt.scripted.script(
            agent.id,
            [S.tool_call("subagent", {"description": "w1", "prompt": "p"}), S.text("done")],
        )
        agent.send("go").get()
        assert agent.when_idle().get().reason == "completed"
        labels = child_labels(rt.ctx)
        assert isinstance(labels, ChildLabels) and list(labels.values()) == ["w1"]
        assert KEPT_LABELS == 10_000
    finally:
        rt.close()
