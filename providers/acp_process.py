"""A child process in its own process group, torn down as a whole.

Real ACP adapters (Node wrappers around native CLIs, Python launchers) leave grandchildren behind
when only the leader is signalled, so every signal goes to the group and teardown returns only
once no live member of the group remains. Everything here is cooperative: the leader's exit is
seen through a pidfd on the hub, and the group is polled with `gevent.sleep`, never a blocking
wait.

The leader is reaped by its own pid, never by a SIGCHLD handler: gevent's (`install_sigchld`, what
its child watchers need) reaps every child of the process, so a host thread's `subprocess.run`
would find its child gone and read exit status 0.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import gevent
from gevent.event import AsyncResult
from gevent.fileobject import FileObjectPosix

__all__ = [
    "ChildInput",
    "ChildOutput",
    "ProcessGroup",
    "group_has_live_member",
    "kill_all_groups",
    "live_groups",
    "process_stats",
]

log = logging.getLogger(__name__)

# Every group spawned by this process and not yet reaped: what an exiting CLI kills first.
_LIVE: weakref.WeakSet[ProcessGroup] = weakref.WeakSet()

_PR_SET_PDEATHSIG = 1


def _load_libc() -> ctypes.CDLL | None:
    """libc on Linux (loaded in the parent: nothing is imported after `fork`), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_libc = _load_libc()
_prctl: Callable[..., int] | None = getattr(_libc, "prctl", None)


def _gevent_reaps_children() -> bool:
    """Whether SIGCHLD has a C-level handler that is not Python's: gevent's (libev's) reaper,
    installed by a host's `gevent.subprocess` or child watcher. It reaps every child of the
    process, ours too, and hands a status only to a child watcher of that pid."""
    sigaction = getattr(_libc, "sigaction", None)
    if sigaction is None or signal.getsignal(signal.SIGCHLD) not in (signal.SIG_DFL, None):
        return False
    action = ctypes.create_string_buffer(512)  # a `struct sigaction`: the handler comes first
    if sigaction(signal.SIGCHLD, None, action) != 0:
        return False
    handler = ctypes.c_void_p.from_buffer(action).value
    return handler not in (None, 0, 1)  # 0: SIG_DFL, 1: SIG_IGN


# Arms the parent-death signal, then execs the agent (run by path, isolated: never imported).
_EXEC_HELPER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "acp_exec.py")


def _spawn_argv(argv: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """The command line to spawn and its `preexec_fn` (None whenever possible: vfork).

    On Linux the agent is exec'd through `acp_exec.py` by this interpreter, which sets
    `PR_SET_PDEATHSIG` and re-checks its parent before exec'ing it. Without a usable interpreter
    path (an embedding host) the signal is set by a `preexec_fn`, which forks this process.
    Elsewhere there is no parent-death signal to set.
    """
    if _prctl is None:
        return argv, None
    if sys.executable and os.path.isabs(sys.executable) and os.path.isfile(_EXEC_HELPER):
        return [sys.executable, "-I", "-S", _EXEC_HELPER, str(os.getpid()), *argv], None
    return argv, _die_with_parent(_prctl, os.getpid())


def _die_with_parent(prctl: Callable[..., int], parent_pid: int) -> Callable[[], None]:
    """A `preexec_fn` that has the kernel SIGKILL the child when its parent dies (the fallback).

    Linux delivers `PR_SET_PDEATHSIG` when the *thread* that forked the child exits, not the
    process: every spawn here runs on the gevent hub's thread (the main one), which lives as long
    as the process. If the parent already died between fork and prctl, the child exits at once.
    """

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def _resolve(program: str, env: Mapping[str, str]) -> str:
    """`program` as an absolute path, looked up on the child's PATH as the standard library would,
    so a missing agent fails here (`FileNotFoundError`) and not later in the helper."""
    if os.sep in program:
        return os.path.abspath(program)
    found = shutil.which(program, path=os.pathsep.join(os.get_exec_path(dict(env))))
    if found is None:
        raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), program)
    return os.path.abspath(found)


def live_groups() -> list[ProcessGroup]:
    """The process groups spawned here and not yet torn down."""
    return list(_LIVE)


def kill_all_groups() -> int:
    """SIGKILL every live group spawned by this process; returns how many were signalled.

    For an exiting process (a CLI's second Ctrl-C or SIGTERM): synchronous, no greenlet needed.
    """
    count = 0
    for group in list(_LIVE):
        group.signal(signal.SIGKILL)
        count += 1
    return count


_POLL_MIN = 0.002
_POLL_MAX = 0.05


def group_has_live_member(pgid: int) -> bool:
    """Whether any non-zombie process is in group `pgid`.

    Zombies are ignored: an orphaned grandchild may stay a zombie forever when the container's
    init does not reap, yet it holds no resources and can never run again.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # macOS answers EPERM for a group of zombies only
        return False
    if not sys.platform.startswith("linux"):
        return True
    try:
        for _pid, fields in process_stats():
            if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
                return True
    except OSError:  # no /proc to read: the group answered the signal, so say it lives
        return True
    return False


def process_stats() -> Iterator[tuple[int, list[bytes]]]:
    """Each process's pid and its `/proc/PID/stat` fields after the command name (state, ppid,
    pgrp, ...), on Linux; a process that ends meanwhile is skipped. `OSError` if `/proc`
    cannot be listed."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parentheses).
        yield int(entry), stat[stat.rfind(b")") + 2 :].split()


class ChildInput(Protocol):
    """The write end of a child's stdin, cooperative on the hub."""

    def fileno(self) -> int: ...

    def write(self, data: bytes, /) -> object: ...

    def flush(self) -> object: ...

    def close(self) -> object: ...


class ChildOutput(Protocol):
    """The read end of a child's stdout or stderr, cooperative on the hub."""

    def readline(self, size: int | None = -1, /) -> bytes: ...

    def read1(self, size: int = -1, /) -> bytes: ...

    def close(self) -> object: ...


class ProcessGroup:
    """One spawned leader with a fresh process group (pgid == leader pid).

    The leader is SIGKILLed by the kernel if this process dies (Linux `PR_SET_PDEATHSIG`), even
    on SIGKILL; its own descendants are reached by group signals on every other path.

    The spawn never copies this process: the standard library's `Popen` vforks (no `preexec_fn`)
    and execs `acp_exec.py`, which arms the parent-death signal and execs the agent; the pipes
    are gevent file objects and the leader is reaped when its pidfd says it exited.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
    ) -> None:
        env = dict(env)
        program = _resolve(argv[0], env)
        loop: Any = gevent.get_hub().loop
        spawn_argv, preexec = _spawn_argv([program, *argv[1:]])
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        stderr_r, stderr_w = os.pipe()
        try:
            self._popen = subprocess.Popen(
                spawn_argv,
                stdin=stdin_r,
                stdout=stdout_w,
                stderr=stderr_w,
                cwd=cwd,
                env=env,
                close_fds=True,
                start_new_session=True,
                preexec_fn=preexec,
            )
        except BaseException:
            for fd in (stdin_w, stdout_r, stderr_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, stdout_w, stderr_w):
                os.close(fd)
        self.pid: int = self._popen.pid
        self.pgid: int = self.pid
        self.stdin: ChildInput = FileObjectPosix(stdin_w, "wb")
        self.stdout: ChildOutput = FileObjectPosix(stdout_r, "rb")
        self.stderr: ChildOutput = FileObjectPosix(stderr_r, "rb")
        self._exited: AsyncResult = AsyncResult()
        # Started before anything yields to the hub, so the exit cannot be missed: the pidfd
        # turns readable when the leader exits, which is then reaped by its pid. If the host
        # made gevent reap every child (it uses `gevent.subprocess`), that reaper may take the
        # leader first: a child watcher then gets its status (watching costs nothing more once
        # the reaper is in; installing it ourselves would break the host's own waits).
        self._pidfd: int | None = None
        self._exit_io: Any = None
        self._reaped: Any = None
        try:
            self._pidfd = os.pidfd_open(self.pid)
        except (AttributeError, OSError):  # no pidfds here (Linux < 5.3): gevent's reaper
            self._reaped = loop.child(self.pid, ref=True)
        else:
            self._exit_io = loop.io(self._pidfd, 1)  # 1: readable
            self._exit_io.start(self._on_exit)
            if _gevent_reaps_children():
                self._reaped = loop.child(self.pid, ref=False)
        if self._reaped is not None:
            self._reaped.start(self._on_reaped)
        _LIVE.add(self)

    def _on_exit(self) -> None:
        self._exit_io.stop()
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # another reaper took it
            if self._reaped is None:
                self._settle(None)  # its status is lost to us; its exit is not
            return  # the child watcher has, or will have, its status
        if pid == 0:  # not a zombie yet (a pidfd turns readable at exit): wait on
            self._exit_io.start(self._on_exit)
            return
        self._settle(os.waitstatus_to_exitcode(status))

    def _on_reaped(self) -> None:
        self._settle(os.waitstatus_to_exitcode(self._reaped.rstatus))

    def _settle(self, code: int | None) -> None:
        if self._exited.ready():
            return
        if self._exit_io is not None:
            self._exit_io.stop()
        if self._reaped is not None:
            self._reaped.stop()
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        # Reaped: the standard library must never wait for it (-1: its status went elsewhere).
        self._popen.returncode = -1 if code is None else code
        self._exited.set(code)

    @property
    def returncode(self) -> int | None:
        code: int | None = self._exited.value
        return code

    def wait_leader(self, timeout: float | None) -> int | None:
        """The leader's exit code once it exited (within `timeout`), else None (also when its
        status went to another reaper)."""
        code: int | None = self._exited.wait(timeout)
        return code

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def alive(self) -> bool:
        """Whether the leader or any live member of its group remains."""
        if not self._exited.ready():
            return True
        return group_has_live_member(self.pgid)

    def wait_gone(self, timeout: float | None) -> bool:
        """Wait cooperatively until the whole group is gone; returns whether it is."""
        deadline = None if timeout is None else _now() + timeout
        delay = _POLL_MIN
        while self.alive():
            if deadline is not None:
                remaining = deadline - _now()
                if remaining <= 0:
                    return False
                delay = min(delay, remaining)
            if not self._exited.ready():
                self.wait_leader(delay)  # wakes as soon as the leader is reaped
            else:
                gevent.sleep(delay)
            delay = min(delay * 2, _POLL_MAX)
        return True

    def terminate(self, eof_grace: float | None, terminate_grace: float) -> None:
        """Escalate until nothing of the group is left: (caller closed stdin) wait the EOF grace,
        SIGTERM the group, wait the terminate grace, then SIGKILL until it is gone."""
        try:
            if eof_grace is not None and self.wait_gone(eof_grace):
                return
            self.signal(signal.SIGTERM)
            if self.wait_gone(terminate_grace):
                return
            log.debug("process group %d outlived SIGTERM; killing it", self.pgid)
            while True:
                self.signal(signal.SIGKILL)
                if self.wait_gone(1.0):
                    break
            self.wait_leader(None)
        finally:
            if not self.alive():
                _LIVE.discard(self)


def _now() -> float:
    loop: Any = gevent.get_hub().loop
    loop.update_now()
    now: float = loop.now()
    return now
