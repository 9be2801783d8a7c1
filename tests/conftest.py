"""Suite-wide hygiene: a test fails if it blocked the gevent hub, or left a GeventActor alive.

Hub blocking: gevent's monitor thread checks every `max_blocking_time` seconds whether the
running greenlet switched since the last check; if not (and it is not the hub idling), it
emits `EventLoopBlocked`. We collect those events and fail the test phase (setup, call,
teardown) during which they arrived. Each phase starts with a switch through the hub, so time
spent in pytest itself between tests is never blamed on a test. A block shorter than the
threshold may go unnoticed; one of twice the threshold never does.

Opt out per test with `@pytest.mark.allow_hub_block(reason)`; every use should say why.
Hypothesis property tests are opted out as a whole (see `_is_property`).
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gevent

# Must be set before the hub starts: the monitor thread is created with it.
gevent.config.monitor_thread = True
gevent.config.max_blocking_time = 0.1
# Our failure message carries the report; gevent's own printout would also cover the time
# pytest spends between tests, which is noise.
gevent.config.print_blocking_reports = False

import gevent.events  # noqa: E402
from hypothesis import settings  # noqa: E402

# Hypothesis's per-example deadline is a wall-clock timing assertion: on a loaded 2-core machine
# it fails correct code. The per-test timeout (setup.cfg) still bounds every property test.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")
import pytest  # noqa: E402
from gevent._hub_local import get_hub_if_exists  # noqa: E402

if TYPE_CHECKING:
    from acp_peers.support import Notifier, Parent

# Pykka's own suite, unpacked by tests/conformance/run_pykka_suite.py; it runs on its own.
collect_ignore = ["conformance/_pykka_tests"]

MAX_BLOCKING_TIME = 0.1

_blocked: list[str] = []
_blocked_lock = threading.Lock()


def _on_gevent_event(event: object) -> None:
    """Runs in the monitor thread: only record, never raise."""
    if isinstance(event, gevent.events.EventLoopBlocked):
        lines = [line for line in event.info if line.strip()][:40]
        with _blocked_lock:
            _blocked.append("\n".join(lines))


gevent.events.subscribers.append(_on_gevent_event)

_existing_hub = get_hub_if_exists()
if _existing_hub is not None:  # a plugin started the hub before us: monitor it anyway
    _existing_hub.start_periodic_monitoring_thread()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "allow_hub_block(reason): the hub-blocking detector does not fail this test",
    )
    # Memory monitoring needs psutil; we only use the blocking monitor.
    config.addinivalue_line("filterwarnings", "ignore:Unable to monitor memory usage")


def pytest_collection_finish(session: pytest.Session) -> None:
    """Collecting imported every module the suite uses: hundreds of thousands of objects that
    live as long as the process. Left in the collector's oldest generation, every full pass
    rescans them all (a few tenths of a second on a loaded machine, holding the GIL wherever
    the allocation that triggered it happened: a "hub blocked" failure in whichever test was
    running). They are the test process's own baggage, not the code under test's: move them to
    the permanent generation once, as a long-lived host process would."""
    gc.collect()
    gc.freeze()


def pytest_runtest_logfinish(nodeid: str, location: tuple[str, int | None, str]) -> None:
    """A test of the runtime's own GC policy (or a runtime releasing it) unfreezes everything;
    freeze again between tests, outside any test's blocking window. Without a collection first
    (that would be the very pause this avoids): garbage alive now waits for the next unfreeze."""
    if gc.get_freeze_count() == 0:
        gc.freeze()


def _is_property(item: pytest.Item) -> bool:
    """Hypothesis tests are exempt: between examples its engine (generation, shrinking, its
    database) runs on the hub greenlet for as long as it likes. That is the test framework, not
    code under test; the properties they check are about values, not cooperation."""
    return bool(getattr(getattr(item, "obj", None), "is_hypothesis_test", False))


def _switch_through_hub() -> None:
    # Resets the monitor's "no switch since last check" state (only if a hub exists).
    if get_hub_if_exists() is not None:
        gevent.sleep(0)


_mark_key = pytest.StashKey[int]()


def _start_window(item: pytest.Item) -> None:
    _switch_through_hub()
    with _blocked_lock:
        item.stash[_mark_key] = len(_blocked)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    _start_window(item)
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    _start_window(item)
    return (yield)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, None, None]:
    _start_window(item)
    try:
        return (yield)
    finally:
        if item.get_closest_marker("allow_hub_block") is not None or _is_property(item):
            # The monitor thread reports a block up to one period after it happened; let the
            # exempt item's own late reports arrive inside its window, not the next test's.
            gevent.sleep(2 * MAX_BLOCKING_TIME)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    start = item.stash.get(_mark_key, None)
    if start is None:
        return report
    with _blocked_lock:
        new = _blocked[start:]
        item.stash[_mark_key] = len(_blocked)
    if not new or item.get_closest_marker("allow_hub_block") is not None or _is_property(item):
        return report
    message = (
        f"the gevent hub was blocked for more than {MAX_BLOCKING_TIME} s during {call.when} "
        f"({len(new)} report(s)); first report:\n{new[0]}"
    )
    if report.failed:
        report.sections.append(("gevent hub blocked", message))
    else:
        report.outcome = "failed"
        report.longrepr = message
    return report


@pytest.fixture(autouse=True)
def _no_leaked_gevent_actors() -> Iterator[None]:
    """After each test, none of the GeventActors it started may still be alive."""
    module: Any = sys.modules.get("actors.gevent_actor")
    before: set[str] = set()
    if module is not None and module.live_count():
        before = {ref.actor_urn for ref in module.live_actors()}
    yield
    module = sys.modules.get("actors.gevent_actor")
    if module is None or not module.live_count():
        return
    leaked = [ref for ref in module.live_actors() if ref.actor_urn not in before]
    if not leaked:
        return
    names = ", ".join(str(ref) for ref in leaked[:10])
    more = f" and {len(leaked) - 10} more" if len(leaked) > 10 else ""
    for ref in leaked:  # do not let one test's leak fail the next ones
        module.kill(ref)
    for ref in leaked:
        module.join(ref, timeout=5)
    pytest.fail(f"{len(leaked)} GeventActor(s) left alive: {names}{more}", pytrace=False)


@pytest.fixture
def models() -> Iterator[list[Any]]:
    """The HTTP model adapters a test made (it appends them), closed after it: their kept-alive
    connections go with them."""
    made: list[Any] = []
    yield made
    for model in made:
        model.close()


@pytest.fixture
def notifier() -> Iterator[Notifier]:
    """What the ACP peer agents tell the test (`acp_peers.support.Notifier`: a socket they write
    their pids and steps to)."""
    from acp_peers.support import Notifier  # here: the hub monitor's test copies this file alone

    n = Notifier()
    yield n
    n.close()


@pytest.fixture
def parent(tmp_path: Path) -> Parent:
    """A parent for an `acp` provider's start, working in the test's directory."""
    from acp_peers.support import Parent

    return Parent(cwd=str(tmp_path))
