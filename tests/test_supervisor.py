"""Supervisor tree and the greenlet child adapter.

Children here are greenlets (`spawn_child`): `supervision/` must not depend on actors. Tests
synchronise on events and exits; the only clocks are a fake one for the restart window and the
short shutdown graces of children built to ignore a stop request.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import gevent
import pytest
from gevent.event import AsyncResult, Event

import supervision.supervisor as supervisor_module
from supervision import (
    AbortError,
    AbortSignal,
    Child,
    ChildKilled,
    ChildSpec,
    Exit,
    GreenletChild,
    RestartIntensityExceeded,
    Supervisor,
    SupervisorClosedError,
    spawn_child,
)

WAIT = 10.0  # a safety bound for waits that must succeed; never a timing assertion


def forever(signal: AbortSignal) -> None:
    signal.wait()


class Workers:
    """Start functions for test children. Each incarnation obeys commands sent to it:
    "crash", "return" (normal exit); a stop request ends it unless it is stubborn."""

    def __init__(self) -> None:
        self.started: dict[str, list[GreenletChild]] = defaultdict(list)
        self._commands: dict[GreenletChild, AsyncResult] = {}
        self._start_event = Event()
        self.fail_starts: set[str] = set()

    def spec(
        self,
        cid: str,
        restart: Any = "permanent",
        shutdown: float = WAIT,
        stubborn: bool = False,
    ) -> ChildSpec:
        return ChildSpec(cid, lambda: self._start(cid, stubborn), restart, shutdown)

    def _start(self, cid: str, stubborn: bool) -> Child:
        if cid in self.fail_starts:
            self.started[cid].append(None)  # type: ignore[arg-type]
            self._start_event.set()
            raise OSError(f"cannot start {cid}")
        command = AsyncResult()
        child = spawn_child(self._body, command, stubborn, name=cid)
        self._commands[child] = command
        self.started[cid].append(child)
        self._start_event.set()
        return child

    @staticmethod
    def _body(signal: AbortSignal, command: AsyncResult, stubborn: bool) -> str:
        if not stubborn:
            signal.add_listener(lambda _reason: command.set("stop"))
        action = command.get()
        if action == "crash":
            raise RuntimeError("boom")
        return str(action)

    def current(self, cid: str) -> GreenletChild:
        return self.started[cid][-1]

    def crash(self, cid: str) -> GreenletChild:
        child = self.current(cid)
        self._commands[child].set("crash")
        return child

    def finish(self, cid: str) -> GreenletChild:
        child = self.current(cid)
        self._commands[child].set("return")
        return child

    def wait_starts(self, cid: str, n: int) -> None:
        while len(self.started[cid]) < n:
            self._start_event.clear()
            if len(self.started[cid]) >= n:
                break
            assert self._start_event.wait(WAIT), f"{cid} never reached {n} starts"


def exits_of(children: list[GreenletChild]) -> list[str | None]:
    return [c.exit.kind if c.exit else None for c in children]


def wait_idle(sup: Supervisor) -> None:
    """Wait until the supervisor's restart worker has handled every pending exit."""
    while sup._worker is not None or sup._pending:
        worker = sup._worker
        if worker is not None:
            worker.join(WAIT)
        else:
            gevent.sleep(0)


@pytest.fixture
def workers() -> Workers:
    return Workers()


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(supervisor_module, "_monotonic", lambda: now[0])
    return now


# -- GreenletChild ------------------------------------------------------------------------------


def test_greenlet_child_satisfies_the_protocol() -> None:
    child = spawn_child(forever)
    assert isinstance(child, Child)
    child.request_stop()
    assert child.join(WAIT)


def test_returned_is_normal_with_value() -> None:
    child = spawn_child(lambda _s, x: x * 2, 21, name="double")
    assert child.name == "double"
    assert child.join(WAIT)
    assert child.exit == Exit("normal")
    assert child.value == 42


def test_raised_is_crashed_with_type_message_traceback() -> None:
    def bad(_signal: AbortSignal) -> None:
        raise ValueError("bad input")

    child = spawn_child(bad)
    assert child.join(WAIT)
    assert child.exit is not None
    assert child.exit.kind == "crashed"
    assert child.exit.exc_type == "ValueError"
    assert child.exit.message == "bad input"
    assert child.exit.traceback is not None and "in bad" in child.exit.traceback


def test_request_stop_is_observed_through_the_signal_and_ends_cancelled() -> None:
    seen: list[Any] = []

    def body(signal: AbortSignal) -> None:
        signal.wait()
        seen.append(signal.reason)

    child = spawn_child(body)
    gevent.sleep(0)  # let it reach wait()
    child.request_stop("enough")
    assert child.join(WAIT)
    assert seen == ["enough"]
    assert child.exit is not None and child.exit.kind == "cancelled"


def test_raise_if_aborted_after_stop_is_cancelled_not_crashed() -> None:
    def body(signal: AbortSignal) -> None:
        signal.wait()
        signal.raise_if_aborted()

    child = spawn_child(body)
    child.request_stop()
    assert child.join(WAIT)
    assert child.exit is not None
    assert child.exit.kind == "cancelled" and child.exit.exc_type == "AbortError"


def test_a_foreign_exception_after_stop_is_still_a_crash() -> None:
    def body(signal: AbortSignal) -> None:
        signal.wait()
        raise KeyError("cleanup failed")

    child = spawn_child(body)
    child.request_stop()
    assert child.join(WAIT)
    assert child.exit is not None and child.exit.kind == "crashed"


def test_kill_is_cancelled_and_except_exception_cannot_swallow_it() -> None:
    swallowed: list[BaseException] = []
    started = Event()

    def body(signal: AbortSignal) -> None:
        started.set()
        try:
            gevent.sleep(WAIT * 10)
        except Exception as exc:  # must not catch ChildKilled
            swallowed.append(exc)

    child = spawn_child(body)
    started.wait()
    child.kill()
    assert child.join(WAIT)
    assert swallowed == []
    assert child.exit == Exit("cancelled", "ChildKilled", "killed")
    assert child.signal.aborted  # code in finally blocks can see why
    assert issubclass(ChildKilled, gevent.GreenletExit)


def test_kill_before_first_run_and_before_start() -> None:
    ran: list[bool] = []
    scheduled = spawn_child(lambda _s: ran.append(True))
    scheduled.kill()  # started but has not run yet
    assert scheduled.join(WAIT)
    assert scheduled.exit is not None and scheduled.exit.kind == "cancelled"
    never = GreenletChild(lambda _s: ran.append(True))
    never.kill()
    assert never.exit is not None and never.exit.kind == "cancelled"
    assert ran == []


def test_exit_listeners_exactly_once_and_late_listener_at_once() -> None:
    notices: list[tuple[str, Exit]] = []
    child = spawn_child(forever)
    child.add_exit_listener(lambda e: notices.append(("early", e)))
    child.request_stop()
    child.kill()  # a second ending request changes nothing
    assert child.join(WAIT)
    child.add_exit_listener(lambda e: notices.append(("late", e)))
    assert [n for n, _ in notices] == ["early", "late"]
    assert notices[0][1] is notices[1][1]


def test_join_times_out_on_a_running_child() -> None:
    child = spawn_child(forever)
    assert child.join(0) is False
    child.request_stop()
    assert child.join(WAIT)


def test_greenlet_child_bad_use() -> None:
    with pytest.raises(TypeError):
        GreenletChild(42)  # type: ignore[arg-type]
    child = spawn_child(forever)
    with pytest.raises(RuntimeError):
        child.start()
    with pytest.raises(TypeError):
        child.add_exit_listener(None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError):
        GreenletChild(forever).join(0)
    child.request_stop()
    assert child.join(WAIT)


# -- strategies ---------------------------------------------------------------------------------


def test_one_for_one_restarts_only_the_failed_child(workers: Workers) -> None:
    sup = Supervisor("s")
    for cid in "abc":
        sup.start_child(workers.spec(cid))
    b_first = workers.current("b")
    workers.crash("b")
    workers.wait_starts("b", 2)
    wait_idle(sup)
    assert [len(workers.started[c]) for c in "abc"] == [1, 2, 1]
    assert exits_of(workers.started["b"]) == ["crashed", None]
    assert sup.children()["b"] is workers.current("b") is not b_first
    assert exits_of([workers.current("a"), workers.current("c")]) == [None, None]
    sup.dispose()


def test_one_for_all_restarts_everyone_and_drops_temporary(workers: Workers) -> None:
    sup = Supervisor("s", strategy="one_for_all")
    sup.start_child(workers.spec("a"))
    sup.start_child(workers.spec("b", restart="transient"))
    sup.start_child(workers.spec("tmp", restart="temporary"))
    workers.crash("a")
    workers.wait_starts("a", 2)
    workers.wait_starts("b", 2)
    wait_idle(sup)
    assert exits_of(workers.started["a"]) == ["crashed", None]
    assert exits_of(workers.started["b"]) == ["cancelled", None]  # stopped, then restarted
    assert exits_of(workers.started["tmp"]) == ["cancelled"]
    assert list(sup.children()) == ["a", "b"]
    sup.dispose()


def test_rest_for_one_restarts_the_failed_and_later_children(workers: Workers) -> None:
    sup = Supervisor("s", strategy="rest_for_one")
    for cid in "abcd":
        sup.start_child(workers.spec(cid))
    workers.crash("b")
    for cid in "bcd":
        workers.wait_starts(cid, 2)
    wait_idle(sup)
    assert [len(workers.started[c]) for c in "abcd"] == [1, 2, 2, 2]
    assert exits_of(workers.started["c"]) == ["cancelled", None]
    assert workers.current("a").exit is None
    assert list(sup.children()) == list("abcd")  # restarts keep start order
    sup.dispose()


# -- restart types ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("restart", "action", "restarted"),
    [
        ("temporary", "crash", False),
        ("temporary", "finish", False),
        ("transient", "crash", True),
        ("transient", "finish", False),
        ("permanent", "crash", True),
        ("permanent", "finish", True),
    ],
)
def test_restart_types(workers: Workers, restart: str, action: str, restarted: bool) -> None:
    sup = Supervisor("s")
    sup.start_child(workers.spec("x", restart=restart))
    sup.start_child(workers.spec("sibling"))
    getattr(workers, action)("x").join(WAIT)
    wait_idle(sup)
    assert len(workers.started["x"]) == (2 if restarted else 1)
    assert ("x" in sup.children()) is restarted
    assert workers.current("sibling").exit is None  # never touched
    sup.dispose()


# -- intensity and escalation ----------------------------------------------------------------------


def test_intensity_exceeded_stops_children_and_reports_crash(
    workers: Workers, fake_clock: list[float]
) -> None:
    notices: list[Exit] = []
    sup = Supervisor("root", max_restarts=2, within_seconds=10, on_exit=notices.append)
    sup.start_child(workers.spec("flaky"))
    sup.start_child(workers.spec("steady"))
    for n in (2, 3):
        workers.crash("flaky")
        workers.wait_starts("flaky", n)
    workers.crash("flaky")  # third failure within the window: give up
    assert sup.join(WAIT)
    assert len(notices) == 1
    assert notices[0].kind == "crashed"
    assert notices[0].exc_type == RestartIntensityExceeded.__qualname__
    assert "flaky" in (notices[0].message or "")
    assert "RuntimeError: boom" in (notices[0].traceback or "")  # the root cause travels up
    assert exits_of(workers.started["steady"]) == ["cancelled"]
    assert sup.quiescent


def test_failures_outside_the_window_do_not_count(
    workers: Workers, fake_clock: list[float]
) -> None:
    sup = Supervisor("s", max_restarts=1, within_seconds=5)
    sup.start_child(workers.spec("x"))
    for n in range(2, 6):
        fake_clock[0] += 6  # each failure lands in a fresh window
        workers.crash("x")
        workers.wait_starts("x", n)
    wait_idle(sup)
    assert not sup.closed
    fake_clock[0] += 1
    workers.crash("x")  # two failures within 5 s
    assert sup.join(WAIT)
    assert sup.exit is not None and sup.exit.kind == "crashed"


def test_zero_intensity_escalates_on_the_first_failure(workers: Workers) -> None:
    sup = Supervisor("s", max_restarts=0)
    sup.start_child(workers.spec("x"))
    workers.crash("x")
    assert sup.join(WAIT)
    assert len(workers.started["x"]) == 1
    assert sup.exit is not None and sup.exit.kind == "crashed"


def test_failed_restart_counts_and_escalates(workers: Workers) -> None:
    sup = Supervisor("s", max_restarts=3)
    sup.start_child(workers.spec("x"))
    workers.fail_starts.add("x")
    workers.crash("x")
    assert sup.join(WAIT)
    assert len(workers.started["x"]) == 4  # the first start and three failed restarts
    assert sup.exit is not None and sup.exit.kind == "crashed"
    assert sup.quiescent


def test_escalation_is_handled_by_the_parent_strategy(workers: Workers) -> None:
    root = Supervisor("root")
    subs: list[Supervisor] = []

    def start_sub() -> Supervisor:
        sub = Supervisor(f"sub{len(subs)}", max_restarts=0)
        sub.start_child(workers.spec("leaf"))
        subs.append(sub)
        return sub

    root.start_child(ChildSpec("sub", start_sub))
    root.start_child(workers.spec("neighbour"))
    workers.crash("leaf")
    workers.wait_starts("leaf", 2)
    wait_idle(root)
    assert len(subs) == 2
    assert subs[0].exit is not None and subs[0].exit.kind == "crashed"
    assert subs[0].quiescent
    assert root.children()["sub"] is subs[1]
    assert workers.current("neighbour").exit is None  # contained
    root.dispose()
    assert subs[1].quiescent


def test_a_crash_never_stops_siblings_or_the_parent(workers: Workers) -> None:
    sup = Supervisor("s")
    sup.start_child(workers.spec("doomed", restart="temporary"))
    sup.start_child(workers.spec("other"))
    workers.crash("doomed").join(WAIT)
    wait_idle(sup)
    assert not sup.closed
    assert list(sup.children()) == ["other"]
    assert workers.current("other").exit is None
    sup.dispose()


# -- dispose and quiescence ------------------------------------------------------------------------


def test_dispose_is_idempotent_and_concurrent_callers_all_wait(workers: Workers) -> None:
    notices: list[Exit] = []
    sup = Supervisor("s", on_exit=notices.append)
    sup.start_child(workers.spec("a"))
    callers = [gevent.spawn(sup.dispose) for _ in range(3)]
    gevent.joinall(callers, raise_error=True)
    assert all(g.dead for g in callers)
    assert sup.quiescent
    sup.dispose()
    sup.request_stop()
    sup.kill()
    assert len(notices) == 1 and notices[0].kind == "cancelled"
    assert workers.current("a").exit is not None


def test_closed_supervisor_refuses_children_and_resources(workers: Workers) -> None:
    sup = Supervisor("s")
    sup.dispose()
    with pytest.raises(SupervisorClosedError):
        sup.start_child(workers.spec("late"))
    assert workers.started["late"] == []  # start function never called
    with pytest.raises(SupervisorClosedError):
        sup.register_resource(lambda: None)
    assert sup.quiescent


def test_child_started_while_closing_is_stopped_before_the_error() -> None:
    sup = Supervisor("s")
    release = Event()
    entered = Event()
    made: list[GreenletChild] = []

    def slow_start() -> Child:
        entered.set()
        release.wait()
        made.append(spawn_child(forever))
        return made[0]

    starter = gevent.spawn(sup.start_child, ChildSpec("slow", slow_start))
    entered.wait()
    sup.dispose()
    release.set()
    with pytest.raises(SupervisorClosedError):
        starter.get()
    assert made[0].exit is not None and made[0].exit.kind == "cancelled"
    assert sup.quiescent


def test_stubborn_child_is_killed_after_its_grace(workers: Workers) -> None:
    sup = Supervisor("s")
    sup.start_child(workers.spec("polite"))
    sup.start_child(workers.spec("stubborn", shutdown=0.01, stubborn=True))
    sup.dispose()
    assert workers.current("stubborn").exit == Exit("cancelled", "ChildKilled", "killed")
    assert workers.current("polite").exit is not None
    assert sup.quiescent


def test_stop_reason_flows_down_the_tree() -> None:
    leaves: list[GreenletChild] = []

    def start_leaf() -> Child:
        leaves.append(spawn_child(forever))
        return leaves[-1]

    def start_sub() -> Supervisor:
        sub = Supervisor("sub")
        sub.start_child(ChildSpec("leaf", start_leaf))
        return sub

    root = Supervisor("root")
    root.start_child(ChildSpec("sub", start_sub))
    root.start_child(ChildSpec("sub2", start_sub))
    reason = AbortError("user pressed stop")
    root.dispose(reason)
    assert [leaf.signal.reason for leaf in leaves] == [reason, reason]

    # Without a reason, one AbortError is made at the top and shared by the whole subtree.
    leaves.clear()
    root = Supervisor("root")
    root.start_child(ChildSpec("sub", start_sub))
    root.start_child(ChildSpec("sub2", start_sub))
    root.dispose()
    first, second = (leaf.signal.reason for leaf in leaves)
    assert isinstance(first, AbortError) and first is second


def test_release_is_child_first_and_resources_close_newest_first(
    caplog: pytest.LogCaptureFixture,
) -> None:
    order: list[str] = []
    leaf = spawn_child(forever)

    def start_sub() -> Supervisor:
        sub = Supervisor("sub")
        sub.start_child(ChildSpec("leaf", lambda: leaf))
        sub.register_resource(lambda: order.append(f"sub-res leaf_dead={leaf.dead}"))
        return sub

    root = Supervisor("root")
    root.start_child(ChildSpec("sub", start_sub))
    root.register_resource(lambda: order.append("root-res-1"))
    unregistered = root.register_resource(lambda: order.append("never"))
    unregistered()

    def broken() -> None:
        raise OSError("close failed")

    root.register_resource(broken, name="broken")
    root.register_resource(lambda: order.append("root-res-3"))
    root.add_exit_listener(lambda _e: order.append("root-exit"))
    with caplog.at_level(logging.ERROR, logger="supervision.supervisor"):
        root.dispose()
    assert order == ["sub-res leaf_dead=True", "root-res-3", "root-res-1", "root-exit"]
    assert any("broken" in r.getMessage() for r in caplog.records)


def test_parent_kills_a_sub_supervisor_whose_leaf_ignores_stop(workers: Workers) -> None:
    subs: list[Supervisor] = []

    def start_sub() -> Supervisor:
        sub = Supervisor("sub")
        sub.start_child(workers.spec("deaf", shutdown=WAIT * 100, stubborn=True))
        subs.append(sub)
        return sub

    root = Supervisor("root")
    root.start_child(ChildSpec("sub", start_sub, shutdown=0.01))
    root.dispose()
    assert workers.current("deaf").exit == Exit("cancelled", "ChildKilled", "killed")
    assert subs[0].quiescent and root.quiescent


def test_kill_a_running_supervisor_kills_children_without_grace(workers: Workers) -> None:
    sup = Supervisor("s")
    sup.start_child(workers.spec("deaf", shutdown=WAIT * 100, stubborn=True))
    sup.kill()
    assert sup.join(WAIT)
    assert workers.current("deaf").exit == Exit("cancelled", "ChildKilled", "killed")
    assert sup.exit is not None and sup.exit.kind == "cancelled"


def test_a_child_may_dispose_its_own_supervisor() -> None:
    sup = Supervisor("s")
    done = Event()

    def body(signal: AbortSignal) -> None:
        sup.dispose()
        done.set()

    sup.start_child(ChildSpec("suicidal", lambda: spawn_child(body), shutdown=0.01))
    assert sup.join(WAIT)
    assert sup.quiescent


def test_stop_child_stops_for_good(workers: Workers) -> None:
    sup = Supervisor("s")
    sup.start_child(workers.spec("x"))
    exit = sup.stop_child("x", "not needed")
    assert exit is not None and exit.kind == "cancelled"
    wait_idle(sup)
    assert len(workers.started["x"]) == 1 and sup.children() == {}
    with pytest.raises(KeyError):
        sup.stop_child("x")
    sup.dispose()


def test_three_level_tree_of_ten_thousand_reaches_quiescence() -> None:
    supervisors: list[Supervisor] = []
    leaves: list[GreenletChild] = []

    def start_leaf() -> Child:
        leaf = spawn_child(forever)
        leaves.append(leaf)
        return leaf

    def start_sub(level: int) -> Supervisor:
        sub = Supervisor(f"level{level}")
        supervisors.append(sub)
        for i in range(10 if level == 1 else 100):
            if level == 1:
                sub.start_child(ChildSpec(f"s{i}", lambda: start_sub(2)))
            else:
                sub.start_child(ChildSpec(f"leaf{i}", start_leaf))
        gevent.sleep(0)
        return sub

    root = Supervisor("root")
    for i in range(10):
        root.start_child(ChildSpec(f"m{i}", lambda: start_sub(1)))
    assert len(leaves) == 10_000 and len(supervisors) == 110
    root.dispose()
    assert root.quiescent
    assert all(s.quiescent for s in supervisors)
    assert all(leaf.dead for leaf in leaves)


# -- monitors -----------------------------------------------------------------------------------


def test_monitor_by_id_gets_exactly_one_notice_across_restarts(workers: Workers) -> None:
    sup = Supervisor("s")
    sup.start_child(workers.spec("x"))
    notices: list[Exit] = []
    sup.monitor("x", notices.append)
    workers.crash("x")
    workers.wait_starts("x", 2)
    workers.crash("x")
    workers.wait_starts("x", 3)
    sup.dispose()
    assert [n.kind for n in notices] == ["crashed"]


def test_monitor_any_child_dead_child_and_cancel(workers: Workers) -> None:
    sup = Supervisor("s")
    watchers: dict[str, list[Exit]] = defaultdict(list)
    child = sup.start_child(workers.spec("x", restart="temporary"))
    sup.monitor(child, watchers["by-object"].append)
    cancel = sup.monitor("x", watchers["cancelled"].append)
    cancel()
    sup.monitor(sup, watchers["supervisor"].append)
    workers.finish("x").join(WAIT)
    sup.monitor(child, watchers["late"].append)
    sup.dispose()
    assert [e.kind for e in watchers["by-object"]] == ["normal"]
    assert [e.kind for e in watchers["late"]] == ["normal"]
    assert watchers["cancelled"] == []
    assert [e.kind for e in watchers["supervisor"]] == ["cancelled"]


def test_monitor_bad_arguments(workers: Workers) -> None:
    sup = Supervisor("s")
    with pytest.raises(KeyError):
        sup.monitor("nobody", lambda _e: None)
    with pytest.raises(TypeError):
        sup.monitor(42, lambda _e: None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        sup.monitor(sup, "no")  # type: ignore[arg-type]
    sup.dispose()


# -- bad input ------------------------------------------------------------------------------------


def _start_nothing() -> Child:
    raise AssertionError("must not be called")


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"restart": "sometimes"}, ValueError),
        ({"shutdown": 0}, ValueError),
        ({"shutdown": -1}, ValueError),
        ({"shutdown": float("inf")}, ValueError),
        ({"shutdown": float("nan")}, ValueError),
        ({"shutdown": "5"}, TypeError),
        ({"id": ""}, ValueError),
        ({"id": 7}, TypeError),
        ({"start": "nope"}, TypeError),
    ],
)
def test_bad_child_spec(kwargs: dict[str, Any], error: type[Exception]) -> None:
    args: dict[str, Any] = {"id": "x", "start": _start_nothing, **kwargs}
    with pytest.raises(error):
        ChildSpec(**args)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"strategy": "all_for_none"}, ValueError),
        ({"max_restarts": -1}, ValueError),
        ({"max_restarts": 1.5}, TypeError),
        ({"within_seconds": -1}, ValueError),
        ({"within_seconds": 0}, ValueError),
        ({"within_seconds": float("inf")}, ValueError),
        ({"name": ""}, ValueError),
        ({"name": 3}, TypeError),
        ({"quiet": "yes"}, TypeError),
    ],
)
def test_bad_supervisor_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        Supervisor(**kwargs)


def test_bad_start_child(workers: Workers) -> None:
    sup = Supervisor("s")
    sup.start_child(workers.spec("x"))
    with pytest.raises(ValueError):
        sup.start_child(workers.spec("x"))
    assert len(workers.started["x"]) == 1  # duplicate refused before starting
    with pytest.raises(TypeError):
        sup.start_child(ChildSpec("y", lambda: "not a child"))  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError):
        sup.start_child("x")  # type: ignore[arg-type]
    with pytest.raises(OSError):
        workers.fail_starts.add("z")
        sup.start_child(workers.spec("z"))
    assert list(sup.children()) == ["x"]
    sup.dispose()
    assert sup.quiescent


# -- for owners that act on the supervisor's decisions (the continuation manager) -----------------


def test_recent_restarts_counts_only_the_window(workers: Workers, fake_clock: list[float]) -> None:
    sup = Supervisor("s", max_restarts=5, within_seconds=10)
    sup.start_child(workers.spec("x"))
    assert sup.recent_restarts == 0
    for n in (2, 3):
        workers.crash("x")
        workers.wait_starts("x", n)
    wait_idle(sup)
    assert sup.recent_restarts == 2
    fake_clock[0] += 11  # both restarts fall out of the window
    assert sup.recent_restarts == 0
    workers.crash("x")
    workers.wait_starts("x", 4)
    wait_idle(sup)
    assert sup.recent_restarts == 1
    sup.dispose()


class ManualChild:
    """A `Child` whose end the test delivers itself, so nothing else runs in between."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.exit: Exit | None = None
        self._listeners: list[Any] = []

    def request_stop(self, reason: object = None) -> None:
        self.end(Exit("cancelled"))

    def kill(self) -> None:
        self.end(Exit("cancelled"))

    def join(self, timeout: float | None = None) -> bool:
        return self.exit is not None

    def add_exit_listener(self, fn: Any) -> None:
        if self.exit is not None:
            fn(self.exit)
        else:
            self._listeners.append(fn)

    def end(self, exit: Exit) -> None:
        if self.exit is None:
            self.exit = exit
            for fn in self._listeners:
                fn(exit)


def test_wait_handled_returns_after_the_decision() -> None:
    started: dict[str, list[ManualChild]] = defaultdict(list)

    def spec(cid: str) -> ChildSpec:
        def start() -> ManualChild:
            started[cid].append(ManualChild(cid))
            return started[cid][-1]

        return ChildSpec(cid, start, restart="transient")

    sup = Supervisor("s")
    sup.start_child(spec("gone"))
    sup.start_child(spec("back"))
    started["back"][-1].end(Exit("crashed", "RuntimeError", "boom"))  # the decision: restart
    started["gone"][-1].end(Exit("normal"))  # the decision: forget it (after the crash)
    assert list(sup.children()) == ["gone", "back"]  # ended, not yet handled
    assert sup.wait_handled(WAIT)
    assert list(sup.children()) == ["back"]
    assert len(started["back"]) == 2
    assert sup.wait_handled(0)  # nothing pending: at once
    sup.dispose()
    assert sup.quiescent


def test_an_end_that_only_needs_forgetting_is_handled_at_once() -> None:
    """No restart worker for a temporary child's end or a transient one's normal end."""
    started: list[ManualChild] = []

    def start() -> ManualChild:
        started.append(ManualChild(f"c{len(started)}"))
        return started[-1]

    sup = Supervisor("s")
    sup.start_child(ChildSpec("once", start, restart="temporary"))
    sup.start_child(ChildSpec("maybe", start, restart="transient"))
    started[0].end(Exit("crashed", "RuntimeError", "boom"))
    started[1].end(Exit("normal"))
    assert sup.children() == {}  # both forgotten in the exit listener itself
    assert sup._worker is None
    sup.dispose()
    assert sup.quiescent


def test_an_idle_supervisor_stops_without_a_greenlet() -> None:
    notices: list[Exit] = []
    sup = Supervisor("idle", on_exit=notices.append)
    sup.request_stop("not needed")
    assert [n.kind for n in notices] == ["cancelled"]  # delivered before request_stop returned
    assert sup.quiescent
    sup.dispose()  # idempotent

    # A listener that disposes and joins the idle supervisor it is told about does not wait on
    # itself, although it runs in the greenlet that stopped it.
    seen: list[bool] = []
    again = Supervisor("idle again")
    again.add_exit_listener(lambda _exit: (again.dispose(), seen.append(again.join(0))))
    again.dispose()
    assert seen == [True]


def test_a_quiet_supervisor_logs_crashes_and_escalation_at_debug_only(
    workers: Workers, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="supervision.supervisor")
    for quiet in (False, True):
        caplog.clear()
        sup = Supervisor("s", max_restarts=1, quiet=quiet)
        cid = f"x-{quiet}"
        sup.start_child(workers.spec(cid))
        workers.crash(cid)
        workers.wait_starts(cid, 2)
        workers.crash(cid)
        assert sup.join(WAIT)
        assert sup.exit is not None and sup.exit.kind == "crashed"  # quiet escalates the same
        levels = {r.levelno for r in caplog.records if r.name == "supervision.supervisor"}
        expected = {logging.DEBUG} if quiet else {logging.WARNING, logging.ERROR}
        assert levels == expected, (quiet, caplog.records)


def test_an_adopted_child_is_temporary_and_stopped_with_its_supervisor() -> None:
    """`adopt` registers a child its caller started: a crash is forgotten (never restarted), a
    live one is stopped when the supervisor is disposed, and bad uses raise before anything is
    registered."""
    crashing, running = ManualChild("crashing"), spawn_child(forever, name="running")
    sup = Supervisor("s")
    assert sup.adopt("a", crashing, shutdown=WAIT) is crashing
    sup.adopt("b", running, shutdown=WAIT)
    assert list(sup.children()) == ["a", "b"]
    with pytest.raises(ValueError, match="already in use"):
        sup.adopt("b", ManualChild("again"), shutdown=WAIT)
    with pytest.raises(TypeError, match="not a Child"):
        sup.adopt("c", object(), shutdown=WAIT)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shutdown grace"):
        sup.adopt("c", ManualChild("c"), shutdown=0)
    for bad in (float("nan"), float("inf"), -1.0):  # floats take the fast check
        with pytest.raises(ValueError, match="shutdown grace"):
            sup.adopt("c", ManualChild("c"), shutdown=bad)
    with pytest.raises(TypeError, match="shutdown grace"):
        sup.adopt("c", ManualChild("c"), shutdown=True)
    assert "c" not in sup.children()
    crashing.end(Exit("crashed", "RuntimeError", "boom"))
    assert list(sup.children()) == ["b"]  # forgotten at once, no restart worker
    assert sup._worker is None
    sup.dispose()
    assert running.exit is not None and running.exit.kind == "cancelled"
    assert sup.quiescent
    with pytest.raises(SupervisorClosedError):
        sup.adopt("late", ManualChild("late"), shutdown=WAIT)
