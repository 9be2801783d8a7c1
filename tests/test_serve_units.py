"""Pieces of the servers on their own: deferred answers in the JSON-RPC peer, the offline
model's directives, the wiring of providers from a config."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import gevent
import pytest
from gevent.event import Event
from gevent.fileobject import FileObjectPosix

from agent.model import ModelRequest, ToolSpec
from providers.acp_rpc import NO_REPLY, JsonRpcConnection, MethodNotFound, RpcError, RpcFault
from subagent.errors import SubagentError
from subagent.serve.offline import respond
from subagent.serve.progress import ChildFeed
from subagent.serve.wiring import ServeConfig, build_served
from supervision.signal import AbortSignal

if TYPE_CHECKING:
    from subagent.service import SubagentService

# -- the JSON-RPC peer: a handler that answers later -----------------------------------------


class Pair:
    """A client connection and a server connection, wired back to back over two pipes."""

    def __init__(self) -> None:
        a_r, b_w = os.pipe()
        b_r, a_w = os.pipe()
        self.release = Event()
        self.ids: list[Any] = []
        self.spawned: list[gevent.Greenlet] = []
        self.client = JsonRpcConnection(
            FileObjectPosix(a_w, "wb"),
            FileObjectPosix(a_r, "rb"),
            on_request=self._refuse,
            on_notification=lambda m, p: None,
            max_line_bytes=1 << 20,
            name="client",
        )
        self.server = JsonRpcConnection(
            FileObjectPosix(b_w, "wb"),
            FileObjectPosix(b_r, "rb"),
            on_request=self._serve,
            on_notification=lambda m, p: None,
            max_line_bytes=1 << 20,
            name="server",
        )

    @staticmethod
    def _refuse(method: str, params: Any) -> Any:
        raise MethodNotFound(method)

    def _later(self, fn: Any) -> gevent.Greenlet:
        greenlet = gevent.spawn(fn)
        self.spawned.append(greenlet)
        return greenlet

    def _serve(self, method: str, params: Any) -> Any:
        self.ids.append(self.server.request_id)
        if method == "fast":
            return {"fast": True}
        if method == "fault":
            raise RpcFault(-32602, "bad params", {"field": "x"})
        if method == "slow":
            return self._later(lambda: self.release.wait() and {"slow": True})
        if method == "slow_fault":

            def fail() -> None:
                raise RpcFault(-32001, "failed later")

            return self._later(fail)
        if method == "returned_fault":
            return self._later(lambda: RpcFault(-32002, "returned, not raised"))
        if method == "silent":
            return self._later(lambda: NO_REPLY)
        raise MethodNotFound(method)

    def close(self) -> None:
        gevent.killall(self.spawned)
        self.client.shutdown()
        self.server.shutdown()


@pytest.fixture
def pair() -> Iterator[Pair]:
    p = Pair()
    try:
        yield p
    finally:
        p.close()


def test_a_deferred_answer_does_not_hold_up_later_requests(pair: Pair) -> None:
    slow = gevent.spawn(pair.client.request, "slow", {})
    assert pair.client.request("fast", {}) == {"fast": True}  # answered while slow waits
    assert not slow.ready()
    pair.release.set()
    assert slow.get(timeout=10) == {"slow": True}
    assert pair.ids == [0, 1]  # the handler saw each request's own id


def test_faults_answer_with_their_code_now_or_later(pair: Pair) -> None:
    with pytest.raises(RpcError) as now:
        pair.client.request("fault", {})
    assert (now.value.code, now.value.message, now.value.data) == (
        -32602,
        "bad params",
        {"field": "x"},
    )
    with pytest.raises(RpcError) as later:
        pair.client.request("slow_fault", {})
    assert later.value.code == -32001
    with pytest.raises(RpcError) as unknown:
        pair.client.request("nope", {})
    assert unknown.value.code == -32601
    # A handler greenlet may return its fault (a client's error: no crash for the hub to print).
    with pytest.raises(RpcError) as returned:
        pair.client.request("returned_fault", {})
    assert (returned.value.code, returned.value.message) == (-32002, "returned, not raised")


def test_no_reply_sends_nothing(pair: Pair) -> None:
    silent = gevent.spawn(pair.client.request, "silent", {})
    while not pair.spawned:
        gevent.sleep(0)
    pair.spawned[0].join()
    # Two round trips after the handler ended: its link callback has long run by now.
    pair.client.request("fast", {})
    pair.client.request("fast", {})
    assert not silent.ready()
    silent.kill()


# -- progress: each call hears only its own children ---------------------------------------------


class FakeEvents:
    """The two subscriptions `ChildFeed` takes from the service, fed by hand."""

    def __init__(self) -> None:
        self.lifecycle: list[Callable[[Mapping[str, Any]], None]] = []
        self.progress: list[Callable[[Mapping[str, Any]], None]] = []

    def subscribe(self, fn: Callable[[Mapping[str, Any]], None]) -> Callable[[], None]:
        self.lifecycle.append(fn)
        return lambda: self.lifecycle.remove(fn)

    def subscribe_progress(self, fn: Callable[[Mapping[str, Any]], None]) -> Callable[[], None]:
        self.progress.append(fn)
        return lambda: self.progress.remove(fn)

    def start(self, child: str, parent: str) -> None:
        for fn in self.lifecycle:
            fn({"type": "subagent/start", "id": child, "parent_id": parent, "provider": "p"})

    def step(self, agent: str, step: int) -> None:
        for fn in self.progress:
            fn({"agent_id": agent, "kind": "step/start", "step": step})


def test_a_call_feed_gets_its_claimed_subtree_including_what_came_before_the_claim() -> None:
    events = FakeEvents()
    feed = ChildFeed(cast("SubagentService", events), {}, "root")
    everything: list[Mapping[str, Any]] = []
    feed.add(everything.append)  # the ACP server's whole-root view
    mine: list[Mapping[str, Any]] = []
    theirs: list[Mapping[str, Any]] = []
    a, b = feed.add_call(mine.append), feed.add_call(theirs.append)
    events.start("root.a", "root")  # the child works while it is being published...
    events.step("root.a", 1)
    events.start("root.a.g", "root.a")  # ...and even delegates
    assert mine == []
    a.claim("root.a")  # ...then its call names it: what waited arrives, in order
    assert [e.get("id") or e.get("agent_id") for e in mine] == ["root.a", "root.a", "root.a.g"]
    b.claim("root.b")
    events.start("root.b", "root")
    events.step("root.a.g", 1)
    assert [e.get("id") or e.get("agent_id") for e in theirs] == ["root.b"]
    assert mine[-1] == {"agent_id": "root.a.g", "kind": "step/start", "step": 1}
    a.close()
    a.close()  # idempotent
    events.step("root.a", 2)  # its call is over: its child's later steps reach no call
    assert len(mine) == 4 and len(theirs) == 1
    assert len(everything) == 6  # the whole-root sink saw all of it
    b.close()
    events.start("root.c", "root")  # no call open: nothing waits for a claim
    c_events: list[Mapping[str, Any]] = []
    feed.add_call(c_events.append).claim("root.c")
    assert c_events == []
    feed.close()
    assert events.lifecycle == [] and events.progress == []


# -- the offline model ---------------------------------------------------------------------


def request(
    prompt: str, after: list[dict[str, Any]] = (), tools: tuple[str, ...] = ("subagent",)
) -> ModelRequest:  # type: ignore[assignment]
    return ModelRequest(
        session_id="s1",
        model="offline",
        system="",
        messages=[{"role": "user", "content": [{"type": "text", "text": prompt}]}, *after],
        tools=[ToolSpec(n, "", {"type": "object"}) for n in tools],
        signal=AbortSignal.never(),
    )


def test_offline_model_echoes_a_plain_prompt() -> None:
    step = respond(request("hello"))
    assert (step.kind, step.text) == ("text", "(offline scripted model) received: hello")


def test_offline_directives_run_one_per_step_then_report() -> None:
    prompt = '/background do it\n/call task_output {"task_id": "{task}", "wait": true}'
    first = respond(request(prompt))
    assert first.kind == "tool_calls"
    assert first.calls[0][:2] == (
        "subagent",
        {"description": "do it", "prompt": "do it", "run_in_background": True},
    )
    after = [
        {"role": "assistant", "content": [], "tool_calls": []},
        {
            "role": "tool",
            "name": "subagent",
            "content": [
                {"type": "text", "text": "Started continuable subagent s9 (task task-4). It ..."}
            ],
            "is_error": False,
        },
    ]
    second = respond(request(prompt, after))
    assert second.calls[0][:2] == ("task_output", {"task_id": "task-4", "wait": True})
    done = [
        *after,
        {"role": "assistant", "content": [], "tool_calls": []},
        {
            "role": "tool",
            "name": "task_output",
            "content": [{"type": "text", "text": "Task task-4: killed"}],
            "is_error": True,
        },
    ]
    third = respond(request(prompt, done))
    assert third.text == "(offline scripted model) task_output failed: Task task-4: killed"


def test_offline_directives_that_cannot_run_say_why() -> None:
    assert respond(request("/delegate x", tools=())).text.endswith(
        "cannot delegate: no subagent tool at this depth"
    )
    assert "bad /call arguments" in respond(request("/call list_agents {nope")).text
    assert respond(request("/fail it broke")).kind == "error"
    assert respond(request("/hang")).kind == "hang"
    assert "unknown directive '/dance'" in respond(request("/dance")).text


# -- wiring ----------------------------------------------------------------------------------


def test_ray_from_the_config_is_a_delegation_tool_and_is_closed(tmp_path: Path) -> None:
    config = ServeConfig(store_dir=str(tmp_path / "sessions"), ray={"pool_size": 1})
    served = build_served(config, fork=True, child_options=True)
    try:
        names = [t.tool_name() for t in served.tools]
        assert names == ["subagent", "subagent_fork", "subagent_ray"]
        ray = served.runtime.subagents.get("ray")
        assert ray.config.store_dir == str(tmp_path / "sessions")  # the server's store
        assert served.model == "scripted:offline"
    finally:
        served.close()
    # Closed with the server (it never connected: Ray starts lazily).
    with pytest.raises(SubagentError) as closed:
        ray.connect()
    assert closed.value.code == "RUNTIME_CLOSED"


@pytest.mark.parametrize(("cap", "waits"), [(1, True), (2, False)])
def test_the_servers_cap_the_children_one_agent_runs_at_once(
    tmp_path: Path, cap: int, waits: bool
) -> None:
    """`max_children_per_parent` (`--max-children-per-parent`, the config's key) reaches the
    served runtime: at the cap, a second child of one agent waits for a slot, created only
    when the first ends; under it, both run at once."""
    from subagent.types import SubagentStartRequest, text_block
    from supervision.signal import AbortController

    config = ServeConfig(store_dir=str(tmp_path / "sessions"), max_children_per_parent=cap)
    served = build_served(config, fork=False, child_options=True)
    service = served.runtime.subagents
    try:
        parent = served.runtime.agent()

        def start(controller: AbortController) -> Any:
            request = SubagentStartRequest(
                prompt=[text_block("/hang")], parent=parent, signal=controller.signal
            )
            return service.start("spawn", request)

        first_signal, second_signal = AbortController(), AbortController()
        first = start(first_signal)
        second = gevent.spawn(start, second_signal)
        # Bounded: under the cap the second start returns at once (its store's writes go
        # through the hub's thread pool, so there is no idle point to synchronise on).
        second.join(timeout=1.0)
        assert second.ready() is not waits
        if waits:
            assert [r.id for r in service.runs()] == [first.id]
            first_signal.abort("make room")
            first.result.get(timeout=10)
        run = second.get(timeout=10)
        assert run.id != first.id
        second_signal.abort("done")
        first_signal.abort("done")
        assert run.result.get(timeout=10).stop_reason == "aborted"
        first.dispose()
        run.dispose()
    finally:
        served.close()
