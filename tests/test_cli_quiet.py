"""`subagent run` (and the demo) wait for background children on events, not by spinning
(issue 12, item 4): while a child works, the wait does not wake up at all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import gevent
import pytest
from gevent.event import Event
from seam_kit import wait_until

from agent.model import ModelRequest
from agent.models import scripted as S
from agent.store import SessionStore
from providers.inprocess import SpawnProvider
from subagent.cli.quiet import Quiescence
from subagent.cli_tree import TreeModel
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools


class Scene:
    def __init__(self, store: Path) -> None:
        self.working = Event()  # the child is inside its model call
        self.release = Event()  # the test lets it answer
        self.model = S.ScriptedModel(self._child)
        # Continuable children need a persistent store, as under `subagent run`.
        self.rt = Runtime(store=SessionStore(store), scripted=self.model)
        self.rt.subagents.register(SpawnProvider())
        install_subagent_tools(
            self.rt, tools=[SubagentToolConfig("spawn", name="subagent", background="continuable")]
        )

    def _child(self, request: ModelRequest) -> S.Step:
        self.working.set()
        self.release.wait()
        return S.text("child done")


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    s = Scene(tmp_path / "sessions")
    try:
        yield s
    finally:
        s.release.set()
        s.rt.close()


def _start(scene: Scene, children: int) -> tuple[object, Quiescence]:
    calls = [
        ("subagent", {"description": f"bg{i}", "prompt": "work", "run_in_background": True})
        for i in range(children)
    ]
    scene.model.script(
        "root", [S.tool_calls(calls), S.text("started")] + [S.text("noted")] * children
    )
    root = scene.rt.agent(session_id="root")
    root.send("go").get()
    return root, Quiescence(root, scene.rt.tasks, barrier=scene.rt.subagents.providers)


def _let_the_hub_run(cycles: int = 300) -> None:
    """Give a polling wait every chance to spin: hub cycles, not wall time."""
    for _ in range(cycles):
        gevent.sleep(0)


def test_the_wait_sleeps_while_a_background_child_works(scene: Scene) -> None:
    root, quiet = _start(scene, 1)
    waiter = gevent.spawn(quiet.wait)
    try:
        scene.working.wait(timeout=10)
        wait_until(lambda: root.status == "idle")  # type: ignore[attr-defined]
        _let_the_hub_run()
        assert not waiter.ready()
        assert quiet.wakeups == 0
        scene.release.set()
        outcome = waiter.get(timeout=10)
    finally:
        waiter.kill()
    assert outcome.reason == "completed"
    # One wake-up for the settlement; the notice's turn is waited for, not polled.
    assert quiet.wakeups == 1
    assert all(t.settled for t in scene.rt.tasks.list())
    assert root.status == "idle"  # type: ignore[attr-defined]


def test_wake_ups_are_bounded_by_settlements_not_by_time(scene: Scene) -> None:
    root, quiet = _start(scene, 3)
    waiter = gevent.spawn(quiet.wait)
    try:
        wait_until(lambda: len(scene.rt.tasks.list()) == 3)
        wait_until(lambda: root.status == "idle")  # type: ignore[attr-defined]
        _let_the_hub_run()
        assert quiet.wakeups == 0
        scene.release.set()
        waiter.get(timeout=10)
    finally:
        waiter.kill()
    assert 1 <= quiet.wakeups <= 3
    assert len(scene.rt.tasks.list()) == 3 and all(t.settled for t in scene.rt.tasks.list())


class _FullDisk:
    """A log sink whose writes fail like a full disk (reads and closing still work)."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def write(self, data: bytes | bytearray) -> None:
        raise OSError(28, "No space left on device")

    def sync(self) -> None:
        pass

    def close(self) -> None:
        self.inner.close()  # type: ignore[attr-defined]


def _root_whose_log_fills(tmp_path: Path, child_step: Callable[[], S.Step]) -> Runtime:
    """A runtime whose root ("root") starts one continuable background child, waits until the
    child's model is working (each of the child's steps is `child_step()`), then has its own
    log fail like a full disk at the turn-end checkpoint."""
    child_working = Event()

    def respond(request: ModelRequest) -> S.Step:
        if request.session_id != "root":
            child_working.set()
            return child_step()
        if request.step == 1:
            call = {"description": "bg", "prompt": "work", "run_in_background": True}
            return S.tool_calls([("subagent", call)])
        child_working.wait()
        log = rt.ctx.agents["root"].log
        log._sink = _FullDisk(log._sink)  # the turn-end checkpoint fails
        return S.text("started")

    rt = Runtime(store=SessionStore(tmp_path), scripted=S.ScriptedModel(respond))
    rt.subagents.register(SpawnProvider())
    install_subagent_tools(
        rt, tools=[SubagentToolConfig("spawn", name="subagent", background="continuable")]
    )
    return rt


def test_a_root_whose_log_failed_ends_the_wait_and_stops_its_tasks(tmp_path: Path) -> None:
    """Issue 12 item 7: the root can never hear its background child again, so the wait
    returns its fault at once (it used to wait forever) and the child's task is stopped."""
    release = Event()

    def child_works_until_the_test_ends() -> S.Step:
        release.wait()
        return S.text("child done")

    rt = _root_whose_log_fills(tmp_path, child_works_until_the_test_ends)
    try:
        root = rt.agent(session_id="root")
        root.send("go").get()
        outcome = Quiescence(root, rt.tasks, barrier=rt.subagents.providers).wait()
        assert outcome.fault is not None
        assert "[Errno 28] No space left on device" in str(outcome.fault)
        (task,) = rt.tasks.list()
        assert task.status == "killed"
        assert "No space left on device" in (task.detail or "")
    finally:
        release.set()
        rt.close()


def test_after_a_root_log_failure_the_tree_shows_every_stopped_childs_end(tmp_path: Path) -> None:
    """The wait returns only once the killed child's run has ended and its `subagent/end` is
    delivered: the final tree shows it stopped, never `running` (its end used to arrive after
    the demo had rendered)."""
    rt = _root_whose_log_fills(tmp_path, S.hang)  # the child works until it is cancelled
    try:
        root = rt.agent(session_id="root")
        tree = TreeModel(rt.ctx, root.id, "root")
        tree.attach(rt.subagents, root)
        root.send("go").get()
        service = rt.subagents
        outcome = Quiescence(root, rt.tasks, barrier=service.providers, runs=service.runs).wait()
        assert outcome is not None and outcome.fault is not None
        assert all(run.settled for run in service.runs())
        (child,) = tree.descendants()
        assert child.status == "aborted"
        tree.finish(outcome)
        assert tree.nodes[root.id].status == "error"
        assert child.status == "aborted"
    finally:
        rt.close()
