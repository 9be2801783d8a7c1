"""Write failures are reported (issue 12 item 7): a log that cannot be written ends the affected
run with a diagnostic naming the cause, the CLI exits non-zero, and nothing hangs.

Real failures only: a tmpfs that fills up (ENOSPC, needs root and `mount`), and a file-size limit
set with setrlimit in the CLI's own process (EFBIG, as `ulimit -f 8` does in a shell).
"""

from __future__ import annotations

import functools
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gevent import subprocess as gsub

# Imported with the module (at collection), not in a fixture: a first import of the runtime
# inside a test's setup runs on the hub for longer than the suite's blocking limit.
from agent.store import SessionStore
from subagent.runtime import Runtime
from supervision.offload import offload

REPO = Path(__file__).resolve().parent.parent


def demo(home: Path, limit_bytes: int | None = None) -> subprocess.CompletedProcess[str]:
    """`subagent --home HOME demo --no-live` in a real subprocess, optionally under a file-size
    limit. The timeout only guards the suite against the old hang; it is not asserted on."""

    def limit() -> None:
        if limit_bytes is not None:
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit_bytes, limit_bytes))

    environ = {k: v for k, v in os.environ.items() if k != "SUBAGENT_HOME"}
    return gsub.run(
        [sys.executable, "-m", "subagent.cli", "--home", str(home), "demo", "--no-live"],
        cwd=REPO,
        env=environ,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=limit,
    )


def _run(argv: list[str]) -> subprocess.CompletedProcess[bytes]:
    """A setup command, spawned and waited for in a worker thread: the standard library's spawn
    can vfork, where gevent's forks the whole (large) pytest process on the hub."""
    return offload(functools.partial(subprocess.run, argv, capture_output=True, check=False))


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 KiB tmpfs: the demo's logs (about 40 KiB in pages) fill it part way through."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "small"
    where.mkdir()
    mounted = _run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(where)])
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        _run(["umount", "-l", str(where)])


def test_a_full_disk_fails_the_demo_naming_enospc(small_tmpfs: Path) -> None:
    proc = demo(small_tmpfs)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[Errno 28] No space left on device" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_file_size_limit_fails_the_demo_instead_of_hanging(tmp_path: Path) -> None:
    proc = demo(tmp_path, limit_bytes=5 * 1024)  # `ulimit -f 5`: the coordinator's log is ~7 KiB
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[Errno 27] File too large" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_demo_whose_logs_fit_exits_zero(tmp_path: Path) -> None:
    proc = demo(tmp_path, limit_bytes=1024 * 1024)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def read_only_store(tmp_path: Path) -> Iterator[Path]:
    """A home with one stored session, bind-mounted read-only (root can write anything else)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a read-only bind mount needs root")
    home = tmp_path / "home"
    with Runtime(store=SessionStore(home / "sessions")) as rt:
        rt.agent().close()
    view = tmp_path / "ro"
    view.mkdir()
    if _run(["mount", "--bind", str(home), str(view)]).returncode != 0:
        pytest.skip("cannot bind-mount here")
    try:
        remount = ["mount", "-o", "remount,bind,ro", str(view)]
        if _run(remount).returncode != 0:
            pytest.skip("cannot remount read-only here")
        yield view
    finally:
        _run(["umount", "-l", str(view)])


def test_gc_that_cannot_delete_exits_one_naming_the_cause(read_only_store: Path) -> None:
    environ = {k: v for k, v in os.environ.items() if k != "SUBAGENT_HOME"}
    argv = [sys.executable, "-m", "subagent.cli", "--home", str(read_only_store), "gc", "--all"]
    proc = gsub.run(argv, cwd=REPO, env=environ, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[Errno 30] Read-only file system" in proc.stdout
    assert "1 session(s) could not be deleted" in proc.stderr
    json_run = gsub.run(
        [*argv, "--json"], cwd=REPO, env=environ, capture_output=True, text=True, timeout=60
    )
    assert json_run.returncode == 1


def test_the_final_tree_under_a_write_failure_shows_no_child_running(tmp_path: Path) -> None:
    """At this limit the coordinator's log fails while the continuable worker-04 still works;
    the demo stops it, and the final tree must show how it ended, not a stale `running`."""
    proc = demo(tmp_path, limit_bytes=4608)  # the coordinator's log fails in its first turn
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "[Errno 27] File too large" in proc.stderr
    tree = [
        line for line in proc.stdout.splitlines() if "worker-" in line or "coordinator " in line
    ]
    assert any("worker-04" in line for line in tree), proc.stdout
    assert not [line for line in tree if " running " in line or " unknown " in line], proc.stdout
    assert "coordinator error" in proc.stdout


def test_the_coordinator_line_names_the_write_failure_not_a_cancel(tmp_path: Path) -> None:
    """Nobody cancelled anything: the coordinator has no summary because its log failed."""
    proc = demo(tmp_path, limit_bytes=4608)  # the coordinator's log fails in its first turn
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("coordinator:")]
    assert len(lines) == 1, proc.stdout
    assert lines[0].startswith("coordinator: (no summary: its log could not be written: "), lines
    assert "[Errno 27] File too large" in lines[0]
