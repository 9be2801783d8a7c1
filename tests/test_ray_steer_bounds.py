"""The Ray parent's table of in-flight steers holds only what the host has not answered: each
entry leaves on its outcome (answered, refused, cancelled, host death, disposal), and a caller
that stopped waiting leaves its steer in flight until the host answers it.

One local cluster for the module (two hosts), as `test_ray.py`; the hosts' scripted model is
driven by the prompt, and the tests synchronise on relayed progress and a gate file."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gevent
import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")

from pykka import Timeout  # noqa: E402
from ray_support import ray_provider  # noqa: E402

from agent.model import ModelRequest  # noqa: E402
from agent.models import scripted as S  # noqa: E402
from agent.store import SessionStore  # noqa: E402
from agent.tools import Tool  # noqa: E402
from providers.ray import RayProvider, RayRun  # noqa: E402
from subagent.errors import SubagentError  # noqa: E402
from subagent.runtime import Runtime  # noqa: E402
from subagent.service import RunHandle, SteerableRunHandle  # noqa: E402
from subagent.types import SubagentStartRequest, text_block  # noqa: E402
from supervision.signal import AbortController  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _user_texts(request: ModelRequest) -> list[str]:
    return [
        "".join(b.get("text", "") for b in m["content"])
        for m in request.messages
        if m["role"] == "user"
    ]


def respond(request: ModelRequest) -> S.Step:
    """Runs on the hosts. `hang`: the model call never returns (a steer stays pending);
    `gate PATH`: step 1 waits for the file, then answers with the last user message."""
    first = _user_texts(request)[0]
    if first.startswith("gate "):
        if request.step == 1:
            path = first.split(" ", 1)[1]
            while not Path(path).exists():
                if request.signal.wait(0.01):
                    request.signal.raise_if_aborted()
            return S.tool_call("noop", {})
        return S.text(f"final: {_user_texts(request)[-1]}")
    return S.hang()


def host_setup(runtime: Runtime) -> None:
    runtime.scripted._responder = respond
    runtime.ctx.tools.register(
        Tool(name="noop", description="noop", parameters={"type": "object"}, fn=lambda a, c: "ok")
    )


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-steer-sessions")


@pytest.fixture(scope="module")
def provider(shared_dir: Path) -> Iterator[RayProvider]:
    yield from ray_provider(shared_dir, host_setup, pool_size=2)


class Parent:
    def __init__(self, provider: RayProvider, shared_dir: Path) -> None:
        self.runtime = Runtime(store=SessionStore(shared_dir))
        self.service = self.runtime.subagents
        self.service.register(provider)
        self.provider = provider
        self.progress: list[dict[str, Any]] = []
        self.service.subscribe_progress(lambda event: self.progress.append(dict(event)))
        self.agent = self.runtime.agent()

    def start(self, prompt: str) -> SteerableRunHandle:
        request = SubagentStartRequest(
            prompt=[text_block(prompt)], parent=self.agent, signal=AbortController().signal
        )
        run = self.service.start("ray", request)
        assert isinstance(run, SteerableRunHandle)
        wait_for(
            lambda: any(
                e.get("run_id") == run.id and e["kind"] == "step/start" for e in self.progress
            ),
            "the child's first step",
        )
        return run


@pytest.fixture
def parent(provider: RayProvider, shared_dir: Path) -> Iterator[Parent]:
    p = Parent(provider, shared_dir)
    yield p
    p.runtime.close()


def wait_for(predicate: Any, what: str, rounds: int = 3000) -> None:
    for _ in range(rounds):
        if predicate():
            return
        gevent.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


def reaches(run: RunHandle, n: int) -> None:
    """The run's actor relays a steer from its mailbox: wait until `n` are sent."""
    wait_for(lambda: in_flight(run) == n, f"{n} steers in flight")


def in_flight(run: RunHandle) -> int:
    ray_run = run._run
    assert isinstance(ray_run, RayRun)
    return ray_run.steers_in_flight


def steer(run: SteerableRunHandle, text: str) -> Any:
    return run.steer([text_block(text)])


def failure(future: Any) -> str:
    with pytest.raises(SubagentError) as info:
        future.get(timeout=60)
    return info.value.code


def test_answered_and_refused_steers_leave(parent: Parent, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    run = parent.start(f"gate {gate}")
    first, second = steer(run, "one"), steer(run, "two")
    reaches(run, 2)
    gate.touch()  # the next step boundary admits both
    first.get(timeout=60)
    second.get(timeout=60)
    assert in_flight(run) == 0
    assert run.result.get(timeout=60).output == [text_block("final: two")]
    late = steer(run, "late")  # settled: refused by the face, never sent
    assert failure(late) == "RUN_TERMINAL"
    assert in_flight(run) == 0
    run.dispose()


def test_a_cancel_answers_the_pending_steers(parent: Parent) -> None:
    run = parent.start("hang")
    pending = [steer(run, f"s{i}") for i in range(3)]
    reaches(run, 3)
    run.cancel("enough")
    assert run.result.get(timeout=60).stop_reason == "aborted"
    assert [failure(f) for f in pending] == ["RUN_TERMINAL"] * 3
    assert in_flight(run) == 0
    run.dispose()


def test_a_timed_out_wait_stays_in_flight_until_disposal(parent: Parent) -> None:
    """The host may still admit a steer whose caller stopped waiting: its entry stays, and
    goes when the run is disposed (whatever order the host's replies come in)."""
    run = parent.start("hang")
    pending = steer(run, "are you there")
    reaches(run, 1)
    with pytest.raises(Timeout):
        pending.get(timeout=0.2)  # a hanging child never admits it
    assert in_flight(run) == 1
    run.dispose()
    assert failure(pending) in ("RUN_DISPOSED", "RUN_TERMINAL")
    assert in_flight(run) == 0


def test_host_death_fails_the_pending_steers(parent: Parent) -> None:
    run = parent.start("hang")
    pending = [steer(run, "a"), steer(run, "b")]
    reaches(run, 2)
    ray_run = run._run
    assert isinstance(ray_run, RayRun) and ray_run.host is not None
    index = ray_run.host.index
    parent.provider.kill_host(index)
    assert [failure(f) for f in pending] == ["RUN_TERMINAL", "RUN_TERMINAL"]
    assert in_flight(run) == 0
    assert run.result.get(timeout=60).stop_reason == "error"
    run.dispose()
    wait_for(lambda: parent.provider.hosts()[index]["healthy"], "the restarted host")
