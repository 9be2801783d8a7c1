"""A one-shot child on a Ray host, as its parent's tools see it: listed `running` while it runs
(from the run table, whatever the shared store holds of it meanwhile), interrupted only by an
ancestor, its result `aborted` with the interrupt as its cause, then listed as ended and "not
running". Its log, in the shared store, is under the run id its parent was told: once its ended
record is forgotten it is still that one child, under that parent, now `stored`. One local Ray
cluster for the module (`ray.init(num_cpus=2)`), as `test_ray.py` does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the ray extra is not installed (pip install '.[ray]')")

from ray_support import ray_provider  # noqa: E402

from agent.model import ModelRequest  # noqa: E402
from agent.models import scripted as S  # noqa: E402
from agent.store import SessionStore  # noqa: E402
from providers.inprocess import SpawnProvider  # noqa: E402
from providers.ray import RayProvider  # noqa: E402
from subagent.errors import SubagentError  # noqa: E402
from subagent.runtime import Runtime  # noqa: E402
from subagent.service import RunHandle  # noqa: E402
from subagent.types import SubagentStartRequest, text_block  # noqa: E402
from supervision.signal import AbortController  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

# The host's model lives in this module; ship it by value to the Ray workers.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

TIMEOUT = 30.0


def respond(request: ModelRequest) -> S.Step:
    """Runs on the hosts: "hang" waits (abortably) for ever, anything else answers at once."""
    first = next(m for m in request.messages if m["role"] == "user")
    if "".join(b.get("text", "") for b in first["content"]) == "hang":
        return S.hang()
    return S.text("done")


def host_setup(runtime: Runtime) -> None:
    runtime.scripted._responder = respond


@pytest.fixture(scope="module")
def shared_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ray-sessions")


@pytest.fixture(scope="module")
def provider(shared_dir: Path) -> Iterator[RayProvider]:
    yield from ray_provider(shared_dir, host_setup, pool_size=1)


@pytest.fixture
def runtime(provider: RayProvider, shared_dir: Path) -> Iterator[Runtime]:
    """A runtime on the hosts' shared store with the ray and spawn providers."""
    rt = Runtime(store=SessionStore(shared_dir))
    rt.subagents.register(provider)
    rt.subagents.register(SpawnProvider())
    yield rt
    rt.close()


def start(runtime: Runtime, parent: Any, prompt: str, provider: str = "ray") -> RunHandle:
    request = SubagentStartRequest(
        prompt=[text_block(prompt)], parent=parent, signal=AbortController().signal
    )
    return runtime.subagents.start(provider, request)


def activities(runtime: Runtime, parent_id: str) -> list[tuple[str, str, str]]:
    return [(r["id"], r["mode"], r["activity"]) for r in runtime.subagents.list_children(parent_id)]


def test_a_running_ray_child_is_listed_running_then_ended(runtime: Runtime) -> None:
    parent = runtime.agent()
    run = start(runtime, parent, "hang")
    try:
        assert run.local_agent is None
        assert activities(runtime, parent.id) == [(run.id, "one-shot", "running")]
        (row,) = runtime.subagents.list_descendants(parent.id)
        assert (row["id"], row["activity"], row["depth"]) == (run.id, "running", 1)
        assert run.session_id == run.id  # the host logs it under the id its parent was told
        assert runtime.subagents.interrupt(run.id, by=parent) is True
        result = run.result.get(timeout=0)
        assert (result.stop_reason, result.diagnostic) == ("aborted", f"interrupted by {parent.id}")
    finally:
        run.dispose()
    runtime.subagents.sync()  # the registry handled its end
    assert runtime.subagents.runs(parent.id) == []
    # Still one row, under the id its parent was told (its log, kept in the shared store under
    # that id, is the same child), now ended.
    assert runtime.store.header(run.id).parent_session == parent.id
    assert activities(runtime, parent.id) == [(run.id, "one-shot", "ended")]
    (row,) = runtime.subagents.list_descendants(parent.id)
    assert (row["id"], row["activity"]) == (run.id, "ended")
    assert runtime.subagents.interrupt(run.id, by=parent) is False


def test_only_an_ancestor_interrupts_a_ray_child_and_the_cause_reaches_its_result(
    runtime: Runtime,
) -> None:
    """The Ray child's parent is a local agent: the ancestor walk starts there. A stranger and
    the parent's sibling are refused (`UNAUTHORIZED`) and the run goes on; the grandparent may,
    and the run ends `aborted` with the interrupt as its diagnostic."""
    service = runtime.subagents
    root = runtime.agent()
    middle = start(runtime, root, "middle", provider="spawn")
    uncle = start(runtime, root, "uncle", provider="spawn")
    parent, sibling = middle.local_agent, uncle.local_agent
    assert parent is not None and sibling is not None
    run = start(runtime, parent, "hang")
    try:
        for who in (runtime.agent(), sibling):
            with pytest.raises(SubagentError) as info:
                service.interrupt(run.id, by=who)
            assert info.value.code == "UNAUTHORIZED"
        assert not run.settled  # refused: nothing was done to it
        assert activities(runtime, parent.id) == [(run.id, "one-shot", "running")]
        assert service.interrupt(run.id, by=root) is True  # its grandparent
        result = run.result.get(timeout=0)  # settled before the interrupt returned
        assert (result.stop_reason, result.diagnostic) == ("aborted", f"interrupted by {root.id}")
        assert service.runs(parent.id) == []  # its end was handled before it returned
        # Over: a second interrupt finds it not running, for the ancestor and the parent.
        assert service.interrupt(run.id, by=root) is False
        assert service.interrupt(run.id, by=parent) is False
        with pytest.raises(SubagentError) as info:
            service.interrupt(run.id, by=sibling)
        assert info.value.code == "UNAUTHORIZED"
    finally:
        run.dispose()
        middle.dispose()
        uncle.dispose()


def run_to_end(runtime: Runtime, parent: Any, prompt: str) -> str:
    """Start a one-shot Ray child of `parent`, wait for its end, dispose it; its id."""
    run = start(runtime, parent, prompt)
    try:
        assert run.result.get(timeout=TIMEOUT).stop_reason == "completed"
    finally:
        run.dispose()
    runtime.subagents.sync()  # the registry handled its end
    child_id: str = run.id
    return child_id


def test_a_forgotten_ray_child_stays_listed_under_its_run_id_and_parent(
    provider: RayProvider, shared_dir: Path
) -> None:
    """`keep_settled=1`: the second end forgets the first one's record. Its log (in the shared
    store) is then the only trace of it: it is listed under the id its parent was told and
    under that parent, `stored` with the spend its log holds, never under another id; in the
    whole subtree too; and an interrupt of it is "not running" for its parent, refused for a
    stranger. (Before, the host wrote its log under an id of its own, and the forgotten child
    came back under that id, as a child nobody was told of.)"""
    rt = Runtime(store=SessionStore(shared_dir), keep_settled=1)
    rt.subagents.register(provider)
    try:
        parent = rt.agent()
        first = run_to_end(rt, parent, "one")
        second = run_to_end(rt, parent, "two")
        rows = rt.subagents.list_children(parent.id)
        assert [(r["id"], r["parent_id"], r["mode"], r["activity"]) for r in rows] == [
            (first, parent.id, "one-shot", "stored"),
            (second, parent.id, "one-shot", "ended"),
        ]
        assert rows[0]["depth"] == 1 and "usage" in rows[0]
        below = [(r["id"], r["parent_id"]) for r in rt.subagents.list_descendants(parent.id)]
        assert below == [(first, parent.id), (second, parent.id)]
        # No stored subagent log of this parent is under any other id.
        logs = {h.id for h in rt.store.list() if h.parent_session == parent.id}
        assert logs == {first, second}
        assert rt.subagents.interrupt(first, by=parent) is False
        with pytest.raises(SubagentError) as info:
            rt.subagents.interrupt(first, by=rt.agent())
        assert info.value.code == "UNAUTHORIZED"
    finally:
        rt.close()
