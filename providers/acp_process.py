"""A child process in its own process group, torn down as a whole.

Real ACP adapters (Node wrappers around native CLIs, Python launchers) leave grandchildren behind
when only the leader is signalled, so every signal goes to the group and teardown returns only
once no live member of the group remains. Everything here is cooperative: the leader is reaped by
gevent's child watcher and the group is polled with `gevent.sleep`, never a blocking wait.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gevent
import gevent.subprocess

__all__ = ["ProcessGroup", "group_has_live_member", "kill_all_groups", "live_groups"]

log = logging.getLogger(__name__)

# Every group spawned by this process and not yet reaped: what an exiting CLI kills first.
_LIVE: weakref.WeakSet[ProcessGroup] = weakref.WeakSet()

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    """libc's `prctl` on Linux (loaded in the parent: nothing is imported after `fork`)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl
    except (OSError, AttributeError):
        return None


_prctl = _load_prctl()


def _die_with_parent(parent_pid: int) -> Callable[[], None] | None:
    """A `preexec_fn` that has the kernel SIGKILL the child when its parent dies.

    Linux delivers `PR_SET_PDEATHSIG` when the *thread* that forked the child exits, not the
    process: every spawn here runs on the gevent hub's thread (the main one), which lives as long
    as the process. If the parent already died between fork and prctl, the child exits at once.
    """
    prctl = _prctl
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


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
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # Fields after the command name (which may hold spaces and parentheses).
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


class ProcessGroup:
    """One spawned leader with a fresh process group (pgid == leader pid).

    The leader is SIGKILLed by the kernel if this process dies (Linux `PR_SET_PDEATHSIG`), even
    on SIGKILL; its own descendants are reached by group signals on every other path.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: str,
        env: Mapping[str, str],
    ) -> None:
        self.popen: Any = gevent.subprocess.Popen(
            list(argv),
            stdin=gevent.subprocess.PIPE,
            stdout=gevent.subprocess.PIPE,
            stderr=gevent.subprocess.PIPE,
            cwd=cwd,
            env=dict(env),
            close_fds=True,
            start_new_session=True,
            preexec_fn=_die_with_parent(os.getpid()),
        )
        self.pid: int = self.popen.pid
        self.pgid: int = self.pid
        _LIVE.add(self)

    @property
    def returncode(self) -> int | None:
        code: int | None = self.popen.poll()
        return code

    def wait_leader(self, timeout: float | None) -> int | None:
        """The leader's exit code once it exited (within `timeout`), else None."""
        try:
            code: int = self.popen.wait(timeout=timeout)
        except gevent.subprocess.TimeoutExpired:
            return None
        return code

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def alive(self) -> bool:
        """Whether the leader or any live member of its group remains."""
        if self.popen.poll() is None:
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
            if self.popen.poll() is None:
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
