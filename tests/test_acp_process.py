"""How an ACP agent's process is spawned (`providers.acp_process`): without copying this process
(vfork, so a large host does not block the gevent hub for a fork), with the parent-death signal
still armed in the agent, and a missing program still refused at once. Real processes."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from providers import acp_exec
from providers.acp_process import ProcessGroup

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only"
)

# Prints the parent-death signal armed in the process that runs it (PR_GET_PDEATHSIG), its pid
# and its process group.
_SHOW_PDEATHSIG = (
    "import ctypes, os; s = ctypes.c_int(-1); "
    "ctypes.CDLL(None).prctl(2, ctypes.byref(s), 0, 0, 0); "
    "print(s.value, os.getpid(), os.getpgid(0), flush=True)"
)

_forks: list[int] = []
_counting: list[bool] = []


def _count_fork() -> None:
    if _counting:
        _forks.append(1)


os.register_at_fork(before=_count_fork)  # cannot be unregistered: counts only inside a test


def spawn(*argv: str) -> ProcessGroup:
    return ProcessGroup(argv, cwd=os.getcwd(), env={"PATH": os.environ.get("PATH", "")})


def finish(group: ProcessGroup) -> bytes:
    """The agent's whole stdout, after it exited and its group is gone."""
    out = b""
    while chunk := group.stdout.read1(65536):
        out += chunk
    assert group.wait_leader(30) is not None
    group.terminate(None, 1.0)
    for pipe in (group.stdin, group.stdout, group.stderr):
        pipe.close()
    return out


def test_a_spawn_never_forks_this_process() -> None:
    """A fork copies the whole host on the hub (tens of ms at 400 MB); vfork runs no fork hook."""
    _forks.clear()
    _counting.append(True)
    try:
        group = spawn(sys.executable, "-c", "print('up')")
    finally:
        _counting.clear()
    assert _forks == []
    assert finish(group) == b"up\n"


def test_the_agent_dies_with_this_process() -> None:
    """The agent itself (after the helper's exec) has SIGKILL armed as its parent-death signal,
    keeps the leader's pid and leads its own process group."""
    group = spawn(sys.executable, "-c", _SHOW_PDEATHSIG)
    shown = finish(group).split()
    assert [int(x) for x in shown] == [signal.SIGKILL, group.pid, group.pid]


def test_a_missing_program_is_refused_before_spawning() -> None:
    with pytest.raises(FileNotFoundError):
        spawn("no-such-agent-program-f4")


def run_helper(parent_pid: int, *argv: str) -> tuple[int | None, bytes, bytes]:
    """`acp_exec.py` run by hand (itself spawned as an agent: gevent reaps our children, so a
    standard-library wait would not see its exit code): exit code, stdout, stderr."""
    group = spawn(sys.executable, "-I", "-S", acp_exec.__file__, str(parent_pid), *argv)
    err = b""
    while chunk := group.stderr.read1(65536):
        err += chunk
    out = finish(group)
    return group.returncode, out, err


def test_the_helper_refuses_when_its_parent_is_not_the_spawner() -> None:
    """Its parent died before the signal was armed (the pid is not ours): the agent never runs."""
    assert run_helper(os.getpid() + 1, sys.executable, "-c", "print(1)") == (1, b"", b"")


def test_the_helper_reports_an_exec_failure_as_127() -> None:
    code, out, err = run_helper(os.getpid(), "/nonexistent/agent")
    assert (code, out) == (127, b"")
    assert b"cannot execute '/nonexistent/agent'" in err


@pytest.mark.allow_hub_block("the fallback forks this whole process on the hub, by design")
def test_without_an_interpreter_path_the_fallback_still_arms_the_signal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An embedding host with no `sys.executable`: the signal is set by a `preexec_fn` (a fork)."""
    python = sys.executable
    monkeypatch.setattr(sys, "executable", "")
    _forks.clear()
    _counting.append(True)
    try:
        group = spawn(python, "-c", _SHOW_PDEATHSIG)
    finally:
        _counting.clear()
    assert _forks == [1]  # the fallback really ran
    shown = finish(group).split()
    assert [int(x) for x in shown] == [signal.SIGKILL, group.pid, group.pid]


# A host thread's `subprocess.run` after an agent ran, in a fresh interpreter (this one may
# already have gevent's reaper installed by another test's `gevent.subprocess`).
_HOST_THREAD_WAITS = """
import os, subprocess, sys, threading
import gevent
from providers.acp_process import ProcessGroup
group = ProcessGroup([sys.executable, "-c", "import sys; sys.exit(5)"], cwd=os.getcwd(),
                     env={"PATH": os.environ.get("PATH", "")})
leader = group.wait_leader(30)
codes = []
def host_work():
    for _ in range(5):
        codes.append(subprocess.run(["sh", "-c", "exit 3"], timeout=30).returncode)
thread = threading.Thread(target=host_work)
thread.start()
while thread.is_alive():  # the hub keeps running meanwhile, as in a host
    gevent.sleep(0.005)
group.terminate(None, 1.0)
print(leader, *codes)
"""


def test_a_host_threads_subprocess_keeps_its_exit_code() -> None:
    """The leader is reaped by its pid (a pidfd says when), never by a SIGCHLD handler: gevent's
    reaps every child of the process, and a host thread's `subprocess.run` then read 0."""
    from gevent import subprocess as gsub

    proc = gsub.run(
        [sys.executable, "-c", _HOST_THREAD_WAITS],
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["5", "3", "3", "3", "3", "3"]


def test_the_exit_code_is_seen_when_the_host_made_gevent_reap_every_child() -> None:
    """A host using `gevent.subprocess` has gevent reap every child, the agent too: its exit
    code then comes from a child watcher, whichever of the two sees the exit first."""
    from gevent import subprocess as gsub

    gsub.run(["true"])  # installs gevent's reaper, as a host's use of it would
    for _ in range(10):
        group = spawn(sys.executable, "-c", "import sys; sys.exit(7)")
        assert group.wait_leader(30) == 7
        group.terminate(None, 1.0)
        for pipe in (group.stdin, group.stdout, group.stderr):
            pipe.close()


def test_without_pidfds_the_leader_is_still_reaped_with_its_exit_code(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel without pidfds (Linux < 5.3): gevent's reaper and a child watcher, as before."""

    def no_pidfds(pid: int, flags: int = 0) -> int:
        raise OSError(38, "Function not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfds)
    group = spawn(sys.executable, "-c", "import sys; sys.exit(6)")
    assert group.wait_leader(30) == 6
    group.terminate(None, 1.0)
    for pipe in (group.stdin, group.stdout, group.stderr):
        pipe.close()
