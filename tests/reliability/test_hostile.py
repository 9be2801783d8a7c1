"""Hostile children: the failures users report from other agent frameworks, tried on purpose.

- a model that delegates recursively is stopped at the depth cap, however wide it fans out;
- a fan-out of 10,000 starts under `max_children_per_parent=16` never runs more than 16 at once;
- a forged call to a filtered tool is refused, under spawn, fork and after a cold resume;
- an ACP child sees none of the parent's credentials, is offered no fs or terminal capability
  and gets an error when it asks the client for a file or a terminal anyway;
- a child that ignores cancellation (an in-process tool, an external agent that ignores
  `session/cancel`, SIGTERM and stdin EOF) is still disposed, with nothing left running.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import gevent
import gevent.event
import pytest
from acp_peers.support import child_processes
from reliability_kit import size
from seam_kit import Kit, assert_log_valid, kit

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import SessionStore
from agent.tools import Tool, ToolContext, ToolError
from providers.acp import AcpConfig, AcpProvider
from providers.acp_process import group_has_live_member
from subagent.errors import SubagentDepthError
from subagent.types import MessageSource, SubagentStartRequest, ToolRestriction, text_block

PEER = str(Path(__file__).with_name("hostile_acp_peer.py"))


# -- recursion -------------------------------------------------------------------------------------


def delegate_tool(k: Kit, provider: str, cap: int, refused: list[int]) -> Tool:
    def delegate(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        parent = ctx.agent
        request = SubagentStartRequest(
            prompt=[text_block("recurse")], parent=parent, signal=ctx.signal, max_depth=cap
        )
        try:
            handle = k.service.start(provider, request)
        except SubagentDepthError:
            refused.append(parent.depth)
            raise ToolError("the delegation depth cap is reached", code="DEPTH") from None
        try:
            return f"child said {handle.result.get().stop_reason}"
        finally:
            handle.dispose()

    return Tool(name="delegate", description="delegate", parameters={"type": "object"}, fn=delegate)


@pytest.mark.parametrize("provider", ["spawn", "fork"])
def test_a_recursive_spawner_is_stopped_at_the_depth_cap(provider: str) -> None:
    cap, fan_out = 4, 2
    with kit() as k:
        refused: list[int] = []
        k.runtime.ctx.tools.register(delegate_tool(k, provider, cap, refused))
        depths: list[int] = []
        k.runtime.ctx.lifecycle.on_published(lambda agent: depths.append(agent.depth))

        def respond(request: ModelRequest) -> S.Step:
            if request.step == 1:  # every agent, at every depth, tries to delegate
                return S.tool_calls([("delegate", {})] * fan_out)
            return S.text("done")

        k.respond = respond
        root = k.parent()
        root.send("go").get()
        outcome = root.when_idle().get()
        assert outcome.reason == "completed"
        children = [d for d in depths if d > 0]
        assert max(children) == cap
        # a full tree: fan_out**1 + ... + fan_out**cap children, and every leaf was refused
        assert len(children) == sum(fan_out**d for d in range(1, cap + 1))
        assert refused == [cap] * fan_out ** (cap + 1)
        assert k.service.runs() == []


# -- admission -------------------------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_fan_out_of_10000_never_runs_more_than_16_at_once() -> None:
    starts = int(os.environ.get("FANOUT_STARTS", 0)) or size(10_000, 10_000)
    with kit(max_children_per_parent=16) as k:
        k.model._record = False
        running = [0]
        peak = [0]

        def on_published(agent: Any) -> None:
            if agent.header.origin != "subagent":
                return
            running[0] += 1
            peak[0] = max(peak[0], running[0])

            def ended(_outcome: Any) -> None:
                running[0] -= 1

            agent.add_turn_listener(ended)  # before the run's own listener

        k.runtime.ctx.lifecycle.on_published(on_published)
        k.respond = lambda request: S.text("ok", latency=0.0005)
        parent = k.parent()
        done = [0]

        def one(i: int) -> None:
            handle = k.start(parent, f"child {i}")
            assert handle.result.get().stop_reason == "completed"
            handle.dispose()
            k.store.delete(handle.id)
            done[0] += 1

        greenlets = []
        for i in range(starts):
            greenlets.append(gevent.spawn(one, i))
            if i % 256 == 0:
                gevent.sleep(0)  # spawning 10,000 at once would itself block the hub
        gevent.joinall(greenlets, raise_error=True)
        assert done[0] == starts
        assert peak[0] == 16, f"peak of concurrently running children: {peak[0]}"
        assert k.service.running_peak == 16
        assert running[0] == 0
        print(f"\nfan-out: {starts} starts, peak {peak[0]} running (cap 16)")


# -- tool filters ----------------------------------------------------------------------------------


def _secret_tool(ran: list[str]) -> Tool:
    def secret(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
        ran.append(ctx.session_id)
        return "LEAKED"

    return Tool(
        name="secret",
        description="must never run for a filtered child",
        parameters={"type": "object"},
        fn=secret,
    )


FORGERIES: list[Any] = [
    [("secret", {})],
    [("secret", {}, "x1"), ("secret", {"again": True}, "x2")],
    [("public", {}), ("secret", {})],
    [("Secret", {})],
    [("secret ", {})],
]


@pytest.mark.parametrize("provider", ["spawn", "fork"])
@pytest.mark.parametrize("restriction", ["deny", "allow"])
def test_a_forged_call_to_a_filtered_tool_is_refused(provider: str, restriction: str) -> None:
    with kit() as k:
        ran: list[str] = []
        k.runtime.ctx.tools.register(_secret_tool(ran))
        k.runtime.ctx.tools.register(
            Tool(name="public", description="", parameters={"type": "object"}, fn=lambda a, c: "ok")
        )
        if restriction == "deny":
            tool_filter = ToolRestriction(deny=("secret",))
        else:
            tool_filter = ToolRestriction(allow=("public",))

        def respond(request: ModelRequest) -> S.Step:
            if request.session_id == root.id:
                return S.text("root")
            assert "secret" not in [t.name for t in request.tools]  # hidden from the prompt too
            if request.step <= len(FORGERIES):
                return S.tool_calls(FORGERIES[request.step - 1])
            return S.text("done")

        k.respond = respond
        root = k.parent()
        root.send("warm up").get()
        root.when_idle().get()
        run = k.start(root, provider=provider, tool_filter=tool_filter)
        assert run.result.get().stop_reason == "completed"
        run.dispose()
        assert ran == []
        events = assert_log_valid(k.store, run.id)
        refused = [
            e for e in events if e["type"] == "tool/result" and e["data"]["name"] != "public"
        ]
        assert len(refused) == 6
        assert all(e["data"]["is_error"] and e["data"]["code"] == "UNKNOWN_TOOL" for e in refused)


def test_a_tool_filter_still_applies_after_a_cold_resume(tmp_path: Path) -> None:
    with kit(store=SessionStore(tmp_path, durability="none")) as k:
        ran: list[str] = []
        k.runtime.ctx.tools.register(_secret_tool(ran))
        turns: dict[str, int] = {}

        def respond(request: ModelRequest) -> S.Step:
            if request.session_id == root.id:
                return S.text("root")
            turns.setdefault(request.session_id, request.turn)
            if request.turn > turns[request.session_id] and request.step == 1:
                return S.tool_call("secret", {})  # forged in the resumed activation
            return S.text(f"turn {request.turn}")

        k.respond = respond
        root = k.parent()
        started = k.service.start_continuable(
            "spawn",
            k.request(root, "first", tool_filter=ToolRestriction(deny=("secret",))),
            label="filtered",
        )
        k.runtime.tasks.wait(started.task_id)
        sent = k.service.send_message(
            root, started.child_id, [text_block("again")], MessageSource.coordinator(root.id)
        )
        assert sent.kind == "started"
        assert sent.task_id is not None
        k.runtime.tasks.wait(sent.task_id)
        assert ran == []
        events = assert_log_valid(k.store, started.child_id)
        results = [e["data"] for e in events if e["type"] == "tool/result"]
        assert [(r["name"], r["code"]) for r in results] == [("secret", "UNKNOWN_TOOL")]


# -- ACP: credentials, capabilities, escape --------------------------------------------------------


def test_an_acp_child_cannot_read_credentials_nor_reach_the_client_fs_or_terminal(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-parent-secret")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-parent-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-parent-secret")
    monkeypatch.setenv("GITHUB_TOKEN", "ghp-parent-secret")
    with kit() as k:
        config = AcpConfig(
            command=sys.executable, args=[PEER, "snoop"], eof_grace=1.0, terminate_grace=1.0
        )
        k.service.register(AcpProvider(config))
        root = k.runtime.agent(cwd=str(tmp_path))
        run = k.start(root, "report", provider="acp")
        result = run.result.get()
        run.dispose()
        assert result.stop_reason == "completed", result.diagnostic
        report = json.loads(result.output[0]["text"])
        assert report["env"] == dict.fromkeys(report["env"])  # every credential unset
        assert report["caps"] == {
            "fs": {"readTextFile": False, "writeTextFile": False},
            "terminal": False,
        }
        assert report["cwd"] == str(tmp_path)
        assert report["fs"]["error"]["code"] == -32601  # the client serves no file
        assert report["terminal"]["error"]["code"] == -32601
        assert "result" not in report["fs"] and "result" not in report["terminal"]
    assert child_processes() == []


# -- children that ignore cancellation -------------------------------------------------------------


def test_an_acp_child_that_ignores_cancel_term_and_eof_is_still_disposed(tmp_path: Path) -> None:
    with kit() as k:
        config = AcpConfig(
            command=sys.executable, args=[PEER, "stubborn"], eof_grace=0.2, terminate_grace=0.2
        )
        k.service.register(AcpProvider(config))
        root = k.runtime.agent(cwd=str(tmp_path))
        run = k.start(root, "never answers", provider="acp")
        pid = run._run.pid
        run.cancel("give up")
        # A hang guard, not a performance bound: the graces are 0.4 s in all, then SIGKILL.
        with gevent.Timeout(20, AssertionError("dispose never returned")):
            run.dispose()
        assert run.result.get().stop_reason == "aborted"
        assert not group_has_live_member(pid)
    assert child_processes() == []


@pytest.mark.parametrize("parallel", [False, True])
def test_an_in_process_tool_that_ignores_cancel_is_abandoned(parallel: bool) -> None:
    with kit() as k:
        never = gevent.event.Event()
        entered: list[str] = []

        def stubborn(arguments: Mapping[str, Any], ctx: ToolContext) -> str:
            entered.append(ctx.call_id)
            never.wait()  # ignores ctx.signal
            return "unreachable"

        k.runtime.ctx.tools.register(
            Tool(
                name="stubborn",
                description="",
                parameters={"type": "object"},
                fn=stubborn,
                concurrency_safe=parallel,
            )
        )
        calls: list[Any] = [("stubborn", {})] * (2 if parallel else 1)
        k.respond = lambda r: S.tool_calls(calls) if r.step == 1 else S.text("done")
        root = k.parent()
        run = k.start(root)
        while len(entered) < len(calls):
            gevent.sleep(0.001)
        with gevent.Timeout(20, AssertionError("dispose never returned")):
            run.dispose()
        assert run.result.get().stop_reason == "aborted"
        events = assert_log_valid(k.store, run.id)
        results = [e["data"] for e in events if e["type"] == "tool/result"]
        assert len(results) == len(calls) and all(r["is_error"] for r in results)
