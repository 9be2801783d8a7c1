"""The suite's hub-blocking detector (tests/conftest.py) must fail a test that blocks the hub.

Runs a throwaway pytest session in a subprocess: the monitor thread is configured before its
hub starts, which the already-running hub of this process cannot give us.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import gevent.subprocess
import pytest

CONFTEST = Path(__file__).with_name("conftest.py")

SAMPLE = """
import time

import gevent
import pytest


def test_blocks_the_hub():
    gevent.sleep(0)  # the hub (and its monitor thread) exists
    time.sleep(0.3)  # a blocking call on the hub's thread


def test_cooperative_wait_is_fine():
    gevent.sleep(0.3)  # the hub runs while we wait


@pytest.mark.allow_hub_block("the detector's opt-out")
def test_opted_out():
    gevent.sleep(0)
    time.sleep(0.3)


@pytest.fixture
def blocking_fixture():
    yield
    time.sleep(0.3)


def test_blocks_in_teardown(blocking_fixture):
    gevent.sleep(0)


def test_leaks_an_actor():
    from actors.gevent_actor import GeventActor

    GeventActor.start()
"""


def _outcomes(stdout: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for match in re.finditer(r"^test_sample\.py::(\w+) (PASSED|FAILED|ERROR)", stdout, re.M):
        name, outcome = match.groups()
        found[name] = "ERROR" if "ERROR" in (outcome, found.get(name)) else outcome
    return found


@pytest.fixture(scope="module")
def session_output(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = tmp_path_factory.mktemp("hubmon")
    (root / "conftest.py").write_text(CONFTEST.read_text())
    (root / "test_sample.py").write_text(SAMPLE)
    (root / "pytest.ini").write_text("[pytest]\n")
    proc = gevent.subprocess.run(  # cooperative: the hub monitor watches us too
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "test_sample.py"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc.stdout + proc.stderr


def test_a_blocking_test_fails(session_output: str) -> None:
    assert _outcomes(session_output)["test_blocks_the_hub"] == "FAILED", session_output
    assert "gevent hub was blocked" in session_output


def test_a_cooperative_test_passes(session_output: str) -> None:
    assert _outcomes(session_output)["test_cooperative_wait_is_fine"] == "PASSED", session_output


def test_the_opt_out_marker_works(session_output: str) -> None:
    assert _outcomes(session_output)["test_opted_out"] == "PASSED", session_output


def test_a_block_in_teardown_is_an_error(session_output: str) -> None:
    assert _outcomes(session_output)["test_blocks_in_teardown"] == "ERROR", session_output


def test_a_leaked_actor_is_reported_by_name(session_output: str) -> None:
    assert _outcomes(session_output)["test_leaks_an_actor"] == "ERROR", session_output
    assert "1 GeventActor(s) left alive: GeventActor (urn:uuid:" in session_output
