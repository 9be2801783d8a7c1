"""AbortController / AbortSignal: the single cancellation channel."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import gevent
import pytest
from gevent.event import Event

from supervision import AbortController, AbortError, AbortSignal


def test_default_reason_is_abort_error_and_first_reason_wins() -> None:
    c = AbortController()
    assert not c.signal.aborted and c.signal.reason is None
    c.abort()
    assert c.signal.aborted
    first = c.signal.reason
    assert isinstance(first, AbortError)
    c.abort("later")
    assert c.signal.reason is first


def test_listeners_run_once_in_registration_order() -> None:
    c = AbortController()
    calls: list[tuple[str, Any]] = []

    def make(name: str) -> Callable[[Any], None]:
        return lambda reason: calls.append((name, reason))

    for name in "abc":
        c.signal.add_listener(make(name))
    c.abort("why")
    c.abort("again")
    assert calls == [("a", "why"), ("b", "why"), ("c", "why")]


def test_listener_added_after_abort_runs_at_once_and_remove_is_noop() -> None:
    c = AbortController()
    c.abort("done")
    seen: list[Any] = []
    remove = c.signal.add_listener(seen.append)
    assert seen == ["done"]
    remove()
    remove()


def test_raising_listener_is_logged_and_the_rest_still_run(
    caplog: pytest.LogCaptureFixture,
) -> None:
    c = AbortController()
    seen: list[str] = []

    def bad(_reason: Any) -> None:
        raise RuntimeError("listener bug")

    c.signal.add_listener(lambda _r: seen.append("first"))
    c.signal.add_listener(bad)
    c.signal.add_listener(lambda _r: seen.append("last"))
    with caplog.at_level(logging.ERROR, logger="supervision.signal"):
        c.abort()
    assert seen == ["first", "last"]
    assert any("listener bug" in (r.exc_text or "") for r in caplog.records)


def test_removed_listener_is_not_called_and_remove_twice_is_harmless() -> None:
    c = AbortController()
    seen: list[str] = []
    remove = c.signal.add_listener(lambda _r: seen.append("removed"))
    c.signal.add_listener(lambda _r: seen.append("kept"))
    remove()
    remove()
    c.abort()
    assert seen == ["kept"]


def test_raise_if_aborted_raises_exception_reason_itself() -> None:
    c = AbortController()
    c.signal.raise_if_aborted()  # not aborted: nothing
    reason = KeyError("gone")
    c.abort(reason)
    with pytest.raises(KeyError) as info:
        c.signal.raise_if_aborted()
    assert info.value is reason


def test_raise_if_aborted_wraps_non_exception_reason_in_abort_error() -> None:
    c = AbortController()
    c.abort({"why": "user"})
    with pytest.raises(AbortError) as info:
        c.signal.raise_if_aborted()
    assert info.value.reason == {"why": "user"}


def test_raise_if_aborted_with_default_reason() -> None:
    c = AbortController()
    c.abort()
    with pytest.raises(AbortError):
        c.signal.raise_if_aborted()


def test_wait_returns_when_aborted_from_another_greenlet() -> None:
    c = AbortController()
    waiting = Event()

    def waiter() -> bool:
        waiting.set()
        return c.signal.wait()

    g = gevent.spawn(waiter)
    waiting.wait()
    c.abort()
    assert g.get() is True
    assert c.signal.wait() is True  # already aborted: at once


def test_wait_times_out_without_abort() -> None:
    assert AbortSignal.never().wait(0) is False
    assert AbortController().signal.wait(0.001) is False


def test_a_timed_wait_ends_on_abort_long_before_its_timeout() -> None:
    c = AbortController()
    waiting = Event()

    def waiter() -> bool:
        waiting.set()
        return c.signal.wait(3600)

    g = gevent.spawn(waiter)
    waiting.wait()
    c.abort()
    assert g.get(timeout=10) is True


def test_timed_waits_in_many_greenlets_each_time_out_and_a_killed_one_is_released() -> None:
    signal = AbortController().signal
    waiting = Event()

    def parked() -> bool:
        waiting.set()
        return signal.wait(3600)

    stuck = gevent.spawn(parked)
    waiting.wait()
    stuck.kill(block=True)  # GreenletExit in the middle of a timed wait
    assert stuck.dead and isinstance(stuck.value, gevent.GreenletExit)
    timed = [gevent.spawn(signal.wait, 0.001 * i) for i in range(20)]
    assert [g.get(timeout=10) for g in timed] == [False] * 20
    assert not signal.aborted


def test_one_abort_releases_every_waiter_timed_or_not_and_none_is_kept() -> None:
    c = AbortController()
    signal = c.signal
    done = [gevent.spawn(signal.wait, 0.001) for _ in range(3)]
    assert [g.get(timeout=10) for g in done] == [False] * 3
    assert not signal._waiters  # a finished wait leaves nothing registered
    parked = [gevent.spawn(signal.wait, 3600 if i % 2 else None) for i in range(10)]
    gevent.idle()  # every waiter is parked
    assert len(signal._waiters or ()) == 10
    c.abort("stop")
    assert [g.get(timeout=10) for g in parked] == [True] * 10
    assert signal._waiters is None


def test_any_of_takes_first_reason_and_detaches() -> None:
    a, b = AbortController(), AbortController()
    combined = AbortSignal.any_of(a.signal, b.signal)
    assert not combined.aborted
    b.abort("b first")
    assert combined.aborted and combined.reason == "b first"
    a.abort("a later")
    assert combined.reason == "b first"
    # The combined listener was removed from `a`: only a new listener sees a's abort.
    assert a.signal._listeners is None


def test_any_of_with_already_aborted_input() -> None:
    a, b = AbortController(), AbortController()
    a.abort("early")
    combined = AbortSignal.any_of(b.signal, a.signal)
    assert combined.aborted and combined.reason == "early"
    assert b.signal._listeners == {}  # nothing registered on the live one


def test_any_of_of_nothing_never_aborts() -> None:
    assert not AbortSignal.any_of().aborted


def test_timeout_aborts_with_timeout_error_and_listeners_may_block() -> None:
    signal = AbortSignal.timeout(0.001)
    blocked_ok = Event()

    def blocking_listener(_reason: Any) -> None:
        gevent.sleep(0)  # would fail in the hub
        blocked_ok.set()

    signal.add_listener(blocking_listener)
    assert signal.wait()
    assert isinstance(signal.reason, TimeoutError)
    assert blocked_ok.wait(5)


def test_timeout_zero_is_allowed() -> None:
    signal = AbortSignal.timeout(0)
    assert signal.wait()


def test_bad_arguments() -> None:
    c = AbortController()
    with pytest.raises(TypeError):
        c.signal.add_listener("not callable")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AbortSignal.any_of(c.signal, "nope")  # type: ignore[arg-type]
    for bad_type in ("1", None, True):
        with pytest.raises(TypeError):
            AbortSignal.timeout(bad_type)  # type: ignore[arg-type]
    for bad_value in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            AbortSignal.timeout(bad_value)


def test_a_signal_is_only_observed_its_state_cannot_be_set() -> None:
    """`aborted` and `reason` are read-only (C getters, no Python frame per read)."""
    controller = AbortController()
    signal = controller.signal
    for name, value in (("aborted", True), ("reason", "forged")):
        with pytest.raises(AttributeError):
            setattr(signal, name, value)
    assert (signal.aborted, signal.reason) == (False, None)
    controller.abort("why")
    assert (signal.aborted, signal.reason) == (True, "why")
