"""Pieces of the servers on their own: deferred answers in the JSON-RPC peer, the offline
model's directives, the wiring of providers from a config."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import pytest
from gevent.event import Event
from gevent.fileobject import FileObjectPosix

from agent.model import ModelRequest, ToolSpec
from providers.acp_rpc import NO_REPLY, JsonRpcConnection, MethodNotFound, RpcError, RpcFault
from subagent.errors import SubagentError
from subagent.serve.offline import respond
from subagent.serve.wiring import ServeConfig, build_served
from supervision.signal import AbortSignal

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
