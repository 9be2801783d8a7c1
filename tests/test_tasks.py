"""ctx.tasks: every status path, first settlement wins, wait, listings, listeners, quiescence."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import gevent
import pytest
from gevent.event import Event

from subagent.errors import SubagentError
from subagent.tasks import (
    COMPLETED,
    FAILED,
    KILLED,
    RUNNING,
    Task,
    TaskService,
    UnknownTaskError,
)
from supervision.signal import AbortSignal


@pytest.fixture
def tasks() -> Iterator[TaskService]:
    service = TaskService(kill_grace=0.05)
    yield service
    service.close()
    assert _live(service) == []


def _live(service: TaskService) -> list[Any]:
    return [g for g in service._greenlets if not g.dead]


def _blocker(gate: Event, result: Any = "done") -> Callable[[AbortSignal], Any]:
    def fn(signal: AbortSignal) -> Any:
        gate.wait()
        return result

    return fn


# -- status paths --------------------------------------------------------------------------------


def test_return_completes_with_output(tasks: TaskService) -> None:
    seen: list[AbortSignal] = []

    def fn(signal: AbortSignal) -> Any:
        seen.append(signal)
        return [{"type": "text", "text": "hi"}]

    started = tasks.start("greet", "agent-1", fn)
    assert started.status == RUNNING and not started.settled
    assert started.ended_at is None
    done = tasks.wait(started.id)
    assert done.status == COMPLETED and done.settled
    assert done.output == [{"type": "text", "text": "hi"}]
    assert done.detail is None
    assert done.ended_at is not None and done.ended_at >= done.created_at
    assert isinstance(seen[0], AbortSignal) and not seen[0].aborted


def test_exception_fails_with_type_and_message(tasks: TaskService) -> None:
    def fn(signal: AbortSignal) -> Any:
        raise RuntimeError("boom")

    t = tasks.wait(tasks.start("explode", "agent-1", fn).id)
    assert t.status == FAILED
    assert t.detail == "RuntimeError: boom"
    assert t.output is None


def test_kill_aborts_the_signal_and_the_body_result_is_ignored(tasks: TaskService) -> None:
    aborted = Event()
    reasons: list[Any] = []

    def fn(signal: AbortSignal) -> Any:
        signal.wait()
        reasons.append(signal.reason)
        aborted.set()
        return "finished anyway"

    t = tasks.start("cooperative", "agent-1", fn)
    gevent.sleep(0)  # let it park on the signal
    assert tasks.kill(t.id, "user asked") is True
    aborted.wait()
    assert reasons == ["user asked"]
    got = tasks.wait(t.id)
    assert got.status == KILLED and got.detail == "user asked" and got.output is None
    assert tasks.kill(t.id, "again") is False


def test_kill_forces_a_task_that_ignores_its_signal(tasks: TaskService) -> None:
    never = Event()
    exited = Event()

    def stubborn(signal: AbortSignal) -> Any:
        try:
            never.wait()
        finally:
            exited.set()

    t = tasks.start("stubborn", "agent-1", stubborn)
    gevent.sleep(0)
    assert tasks.kill(t.id, "stop")
    exited.wait()  # the grace passed and the greenlet was killed
    assert tasks.get(t.id).status == KILLED
    gevent.joinall(list(tasks._greenlets))
    assert _live(tasks) == []


def test_kill_before_the_body_ran_means_it_never_runs(tasks: TaskService) -> None:
    ran: list[bool] = []
    t = tasks.start("late", "agent-1", lambda signal: ran.append(True))
    assert tasks.kill(t.id, "changed my mind")
    gevent.joinall(list(tasks._greenlets))
    assert ran == []
    assert tasks.get(t.id).status == KILLED


def test_start_with_custom_kill_calls_it_with_the_reason(tasks: TaskService) -> None:
    gate = Event()
    calls: list[str] = []

    def custom_kill(reason: str) -> None:
        calls.append(reason)
        gate.set()  # stops the backing work "its own way"

    t = tasks.start("child run", "agent-1", _blocker(gate), kill=custom_kill)
    gevent.sleep(0)
    assert tasks.kill(t.id, "enough")
    assert calls == ["enough"]
    assert tasks.wait(t.id).status == KILLED
    assert tasks.wait(t.id).output is None


def test_foreign_greenlet_kill_settles_as_killed(tasks: TaskService) -> None:
    t = tasks.start("victim", "agent-1", _blocker(Event()))
    gevent.sleep(0)
    (greenlet,) = list(tasks._greenlets)
    greenlet.kill()
    got = tasks.get(t.id)
    assert got.status == KILLED and got.detail


# -- adopted tasks -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "output", "detail"),
    [
        (COMPLETED, [{"type": "text", "text": "ok"}], None),
        (FAILED, None, "error: the model failed"),
        (KILLED, None, "parent released it"),
    ],
)
def test_adopted_task_is_settled_from_outside(
    tasks: TaskService, status: str, output: Any, detail: str | None
) -> None:
    kills: list[str] = []
    t = tasks.adopt("continuable", "agent-1", kill=kills.append)
    assert t.status == RUNNING
    assert tasks.settle(t.id, status, output, detail) is True
    got = tasks.get(t.id)
    assert (got.status, got.output, got.detail) == (status, output, detail)
    assert kills == []  # settling from outside is not a kill
    assert tasks.settle(t.id, COMPLETED, "late") is False
    assert tasks.kill(t.id, "late") is False
    assert kills == []
    assert tasks.get(t.id) == got


def test_killing_an_adopted_task_calls_its_kill_and_wins(tasks: TaskService) -> None:
    calls: list[str] = []
    t = tasks.adopt("continuable", "agent-1", kill=calls.append)
    assert tasks.kill(t.id, "stop it")
    assert calls == ["stop it"]
    assert tasks.get(t.id).status == KILLED
    # The run's own end arrives later and is ignored.
    assert tasks.settle(t.id, COMPLETED, "result") is False
    assert tasks.get(t.id).output is None


def test_a_kill_callable_that_settles_reentrantly_does_not_change_the_outcome(
    tasks: TaskService,
) -> None:
    holder: dict[str, str] = {}
    results: list[bool] = []

    def kill(reason: str) -> None:  # e.g. dispose() resolving the run, whose end settles
        results.append(tasks.settle(holder["id"], FAILED, None, "aborted"))

    holder["id"] = tasks.adopt("continuable", "agent-1", kill=kill).id
    assert tasks.kill(holder["id"], "stop")
    assert results == [False]
    assert tasks.get(holder["id"]).status == KILLED


def test_a_raising_kill_callable_is_logged_and_the_task_stays_killed(
    tasks: TaskService, caplog: pytest.LogCaptureFixture
) -> None:
    def kill(reason: str) -> None:
        raise OSError("pipe gone")

    t = tasks.adopt("continuable", "agent-1", kill=kill)
    with caplog.at_level(logging.ERROR, logger="subagent.tasks"):
        assert tasks.kill(t.id, "stop")
    assert tasks.get(t.id).status == KILLED
    assert "pipe gone" in caplog.text


def test_settling_a_started_task_from_outside_stops_its_body(tasks: TaskService) -> None:
    stopped = Event()

    def fn(signal: AbortSignal) -> Any:
        signal.wait()
        stopped.set()
        return "ignored"

    t = tasks.start("work", "agent-1", fn)
    gevent.sleep(0)
    assert tasks.settle(t.id, COMPLETED, "from outside")
    stopped.wait()
    assert tasks.get(t.id).output == "from outside"


# -- first settlement wins -----------------------------------------------------------------------


def test_completion_then_kill_in_the_same_tick_completion_wins(tasks: TaskService) -> None:
    t = tasks.adopt("race", "agent-1", kill=lambda reason: None)
    # No switch between the two calls: the same tick.
    first = tasks.settle(t.id, COMPLETED, "out")
    second = tasks.kill(t.id, "late kill")
    assert (first, second) == (True, False)
    assert tasks.get(t.id).status == COMPLETED


def test_kill_then_completion_in_the_same_tick_kill_wins(tasks: TaskService) -> None:
    gate = Event()
    t = tasks.start("race", "agent-1", _blocker(gate, "out"))
    gevent.sleep(0)
    gate.set()  # the body is now ready to return ...
    assert tasks.kill(t.id, "kill first")  # ... but the kill settles before it runs again
    got = tasks.wait(t.id)
    gevent.joinall(list(tasks._greenlets))
    assert got.status == KILLED and got.output is None
    assert tasks.get(t.id) == got


@pytest.mark.parametrize("kill_first", [True, False])
def test_racing_greenlets_settle_exactly_once(tasks: TaskService, kill_first: bool) -> None:
    settled: list[Task] = []
    tasks.on_settled(settled.append)
    t = tasks.adopt("race", "agent-1", kill=lambda reason: None)
    killer = gevent.Greenlet(tasks.kill, t.id, "kill")
    completer = gevent.Greenlet(tasks.settle, t.id, COMPLETED, "out")
    order = [killer, completer] if kill_first else [completer, killer]
    for g in order:
        g.start()  # both scheduled in the same tick
    gevent.joinall(order, raise_error=True)
    assert sorted([killer.value, completer.value]) == [False, True]
    expected = KILLED if kill_first else COMPLETED
    assert tasks.get(t.id).status == expected
    assert [s.status for s in settled] == [expected]


def test_body_completion_then_kill_completion_wins(tasks: TaskService) -> None:
    t = tasks.start("quick", "agent-1", lambda signal: 42)
    assert tasks.wait(t.id).status == COMPLETED
    assert tasks.kill(t.id, "too late") is False
    assert tasks.get(t.id).output == 42


# -- reading -------------------------------------------------------------------------------------


def test_get_unknown_id_raises_unknown_task_error(tasks: TaskService) -> None:
    with pytest.raises(UnknownTaskError) as info:
        tasks.get("task-999")
    assert isinstance(info.value, KeyError)
    assert "task-999" in str(info.value)
    for op in (
        lambda: tasks.kill("nope", "r"),
        lambda: tasks.wait("nope"),
        lambda: tasks.settle("nope", COMPLETED),
    ):
        with pytest.raises(UnknownTaskError):
            op()


def test_list_in_creation_order_and_by_owner(tasks: TaskService) -> None:
    a1 = tasks.adopt("a1", "alice", kill=lambda r: None)
    b1 = tasks.adopt("b1", "bob", kill=lambda r: None)
    a2 = tasks.start("a2", "alice", lambda signal: None)
    assert [t.id for t in tasks.list()] == [a1.id, b1.id, a2.id]
    assert [t.id for t in tasks.list(owner="alice")] == [a1.id, a2.id]
    assert [t.id for t in tasks.list("bob")] == [b1.id]
    assert tasks.list("carol") == []
    assert len({a1.id, b1.id, a2.id}) == 3


def test_task_is_a_snapshot_with_a_json_listing(tasks: TaskService) -> None:
    t = tasks.adopt("snap", "alice", kill=lambda r: None)
    tasks.settle(t.id, COMPLETED, {"n": 1})
    assert t.status == RUNNING  # the earlier snapshot does not change
    with pytest.raises(AttributeError):
        t.status = KILLED  # type: ignore[misc]
    data = tasks.get(t.id).to_json()
    assert data == {
        "id": t.id,
        "label": "snap",
        "owner": "alice",
        "status": COMPLETED,
        "output": {"n": 1},
        "detail": None,
        "created_at": t.created_at,
        "ended_at": data["ended_at"],
        "subject": None,
    }
    assert isinstance(data["ended_at"], float)


def test_an_adopted_task_names_the_agent_doing_the_work(tasks: TaskService) -> None:
    t = tasks.adopt("child run", "alice", kill=lambda r: None, subject="child-1")
    assert (t.subject, tasks.get(t.id).to_json()["subject"]) == ("child-1", "child-1")
    with pytest.raises(TypeError):
        tasks.adopt("x", "alice", kill=lambda r: None, subject=7)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        tasks.adopt("x", "alice", kill=lambda r: None, subject="")


def test_clock_is_injectable() -> None:
    ticks = iter([10.0, 20.0])
    service = TaskService(clock=lambda: next(ticks))
    t = service.adopt("x", "a", kill=lambda r: None)
    service.settle(t.id, COMPLETED)
    got = service.get(t.id)
    assert (got.created_at, got.ended_at) == (10.0, 20.0)
    service.close()


# -- wait ----------------------------------------------------------------------------------------


def test_wait_blocks_only_the_caller_until_settled(tasks: TaskService) -> None:
    gate = Event()
    t = tasks.start("slow", "agent-1", _blocker(gate, "late"))
    waiter = gevent.spawn(tasks.wait, t.id)
    gevent.sleep(0)
    assert not waiter.ready()
    gate.set()
    assert waiter.get().status == COMPLETED
    assert waiter.get().output == "late"


def test_wait_on_an_adopted_task_returns_once_settled(tasks: TaskService) -> None:
    t = tasks.adopt("adopted", "agent-1", kill=lambda r: None)
    waiter = gevent.spawn(tasks.wait, t.id)
    gevent.sleep(0)
    tasks.settle(t.id, FAILED, None, "error: x")
    assert waiter.get().status == FAILED


def test_wait_timeout_raises_timeout_error(tasks: TaskService) -> None:
    t = tasks.adopt("never", "agent-1", kill=lambda r: None)
    with pytest.raises(TimeoutError):
        tasks.wait(t.id, timeout=0)
    assert tasks.get(t.id).status == RUNNING


def test_wait_on_a_settled_task_returns_at_once(tasks: TaskService) -> None:
    t = tasks.adopt("done", "agent-1", kill=lambda r: None)
    tasks.kill(t.id, "x")
    assert tasks.wait(t.id, timeout=0).status == KILLED


# -- listeners -----------------------------------------------------------------------------------


def test_listeners_hear_every_settlement_once_and_a_raising_one_is_isolated(
    tasks: TaskService, caplog: pytest.LogCaptureFixture
) -> None:
    heard: list[tuple[str, str]] = []

    def bad(task: Task) -> None:
        raise ValueError("listener bug")

    tasks.on_settled(bad)
    remove = tasks.on_settled(lambda task: heard.append((task.label, task.status)))
    with caplog.at_level(logging.ERROR, logger="subagent.tasks"):
        tasks.wait(tasks.start("a", "o", lambda signal: 1).id)
        b = tasks.adopt("b", "o", kill=lambda r: None)
        tasks.kill(b.id, "k")
        tasks.wait(tasks.start("c", "o", lambda signal: 1 / 0).id)
        tasks.kill(b.id, "again")
    assert heard == [("a", COMPLETED), ("b", KILLED), ("c", FAILED)]
    assert sum("listener" in r.getMessage() for r in caplog.records) == 3
    remove()
    remove()  # idempotent
    d = tasks.adopt("d", "o", kill=lambda r: None)
    tasks.settle(d.id, COMPLETED)
    assert len(heard) == 3


def test_listener_sees_the_settled_snapshot(tasks: TaskService) -> None:
    seen: list[Task] = []
    tasks.on_settled(seen.append)
    t = tasks.start("x", "o", lambda signal: "out")
    tasks.wait(t.id)
    assert seen == [tasks.get(t.id)]


# -- close ---------------------------------------------------------------------------------------


def test_close_kills_everything_and_returns_at_quiescence() -> None:
    service = TaskService(kill_grace=0.05)
    kills: list[str] = []
    cooperative = service.start("coop", "o", lambda signal: signal.wait())
    stubborn = service.start("stubborn", "o", _blocker(Event()))
    adopted = service.adopt("adopted", "o", kill=kills.append)
    done = service.start("done", "o", lambda signal: "x")
    service.wait(done.id)
    gevent.sleep(0)
    service.close()
    assert _live(service) == []
    assert [service.get(t.id).status for t in (cooperative, stubborn, adopted)] == [KILLED] * 3
    assert service.get(done.id).status == COMPLETED
    assert kills == ["task service closed"]
    assert service.closed
    service.close()  # idempotent
    with pytest.raises(SubagentError) as info:
        service.start("late", "o", lambda signal: None)
    assert info.value.code == "RUNTIME_CLOSED"
    with pytest.raises(SubagentError):
        service.adopt("late", "o", kill=lambda r: None)


def test_close_waits_for_settled_tasks_whose_greenlet_still_runs() -> None:
    service = TaskService(kill_grace=0.05)
    finished = Event()

    def fn(signal: AbortSignal) -> Any:
        try:
            Event().wait()
        finally:
            finished.set()

    t = service.start("x", "o", fn)
    gevent.sleep(0)
    service.settle(t.id, COMPLETED, "settled elsewhere")
    service.close()
    assert finished.is_set()
    assert _live(service) == []


def test_close_from_inside_a_task_does_not_wait_for_itself() -> None:
    service = TaskService(kill_grace=0.05)
    t = service.start("self-closer", "o", lambda signal: service.close())
    other = service.start("other", "o", _blocker(Event()))
    gevent.joinall([g for g in list(service._greenlets)])
    assert service.get(other.id).status == KILLED
    assert service.get(t.id).status == KILLED  # close killed every running task, itself too
    assert _live(service) == []


# -- bad arguments -------------------------------------------------------------------------------


def test_bad_arguments(tasks: TaskService) -> None:
    def fn(signal: AbortSignal) -> None:
        return None

    def nokill(reason: str) -> None:
        return None

    Cases = list[tuple[Callable[[], object], type[Exception]]]
    cases: Cases = [
        (lambda: tasks.start(1, "o", fn), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.start("", "o", fn), ValueError),
        (lambda: tasks.start("  ", "o", fn), ValueError),
        (lambda: tasks.start("l", None, fn), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.start("l", "", fn), ValueError),
        (lambda: tasks.start("l", "o", "fn"), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.start("l", "o", fn, kill=3), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.adopt("l", "o", kill=None), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.adopt("l", "o", kill="k"), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.get(1), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.list(owner=1), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.on_settled(None), TypeError),  # type: ignore[arg-type]
        (lambda: TaskService(kill_grace=-1), ValueError),
        (lambda: TaskService(kill_grace="1"), TypeError),  # type: ignore[arg-type]
        (lambda: TaskService(clock=1), TypeError),  # type: ignore[arg-type]
    ]
    for op, error in cases:
        with pytest.raises(error):
            op()
    t = tasks.adopt("l", "o", kill=nokill)
    cases = [
        (lambda: tasks.kill(t.id, None), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.settle(t.id, RUNNING), ValueError),
        (lambda: tasks.settle(t.id, "done"), ValueError),
        (lambda: tasks.settle(t.id, COMPLETED, None, 5), TypeError),  # type: ignore[arg-type]
        (lambda: tasks.wait(t.id, timeout=-1), ValueError),
        (lambda: tasks.wait(t.id, timeout="1"), TypeError),  # type: ignore[arg-type]
    ]
    for op, error in cases:
        with pytest.raises(error):
            op()
    assert tasks.get(t.id).status == RUNNING  # rejected calls changed nothing
    assert len(tasks.list()) == 1  # and created nothing


def test_only_the_newest_settled_tasks_are_kept_and_their_kill_callables_dropped() -> None:
    service = TaskService(keep_settled=2)
    try:
        kills: list[str] = []
        ids = []
        for i in range(4):
            task = service.adopt(f"t{i}", "owner", kill=kills.append)
            ids.append(task.id)
            assert service.settle(task.id, "completed", output=i)
        assert [t.id for t in service.list()] == ids[2:]
        with pytest.raises(UnknownTaskError):
            service.get(ids[0])
        assert service.get(ids[3]).output == 3
        running = service.adopt("live", "owner", kill=kills.append)
        assert service.kill(running.id, "stop")
        assert kills == ["stop"]
        assert not service.kill(running.id, "again")  # settled: nothing to call any more
        assert kills == ["stop"]
    finally:
        service.close()


def test_keep_settled_must_be_a_non_negative_int() -> None:
    with pytest.raises(TypeError):
        TaskService(keep_settled=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        TaskService(keep_settled=-1)
