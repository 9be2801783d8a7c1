"""Helpers shared by the ACP provider tests: a stand-in parent, peer configs, event channels."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gevent
import gevent.queue
import gevent.socket

from providers.acp import AcpConfig, AcpRun
from providers.acp_process import group_has_live_member, process_stats
from subagent.types import SubagentResult

PEER = str(Path(__file__).parent / "sdk_agent.py")
FAKE = str(Path(__file__).parent / "fake_agent.py")


@dataclass
class Parent:
    """The two attributes the ACP provider reads from its parent agent."""

    cwd: str
    session_id: str = "parent-session"


def peer_config(mode: str, **overrides: Any) -> AcpConfig:
    options: dict[str, Any] = {"eof_grace": 2.0, "terminate_grace": 2.0}
    options.update(overrides)
    return AcpConfig(command=sys.executable, args=[PEER, mode], **options)


def fake_config(mode: str, **overrides: Any) -> AcpConfig:
    """The stdlib fake agent (launcher, silent, refusing... behaviours)."""
    options: dict[str, Any] = {"eof_grace": 1.0, "terminate_grace": 1.0}
    options.update(overrides)
    return AcpConfig(command=sys.executable, args=[FAKE, mode], **options)


def wait_until(condition: Any, timeout: float = 30.0) -> None:
    """Poll a process-state condition cooperatively (the kernel offers no event to wait on)."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not reached within {timeout} s")
        gevent.sleep(delay)
        delay = min(delay * 2, 0.1)


def text_prompt(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def pid_alive(pid: int) -> bool:
    """Whether `pid` is a live (non-zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def group_alive(pgid: int) -> bool:
    return group_has_live_member(pgid)


class Notifier:
    """A unix socket the peer reports events to (`ACP_PEER_NOTIFY`); the test waits on lines."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="acp-", dir="/tmp")  # short: sun_path is ~108 bytes
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = gevent.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(self.path)
        self.sock.listen(64)
        self.lines: Any = gevent.queue.Queue()
        self._greenlets = [gevent.spawn(self._serve)]

    @property
    def env(self) -> dict[str, str]:
        return {"ACP_PEER_NOTIFY": self.path}

    def _serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            self._greenlets.append(gevent.spawn(self._read, conn))

    def _read(self, conn: Any) -> None:
        with conn, conn.makefile("rb") as f:
            for line in f:
                self.lines.put(line.decode().strip())

    def expect(self, prefix: str, timeout: float = 30.0) -> str:
        """The rest of the next line starting with `prefix` (other lines are skipped)."""
        while True:
            line: str = self.lines.get(timeout=timeout)
            if line.startswith(prefix):
                return line[len(prefix) :].strip()

    def expect_all(self, *prefixes: str, timeout: float = 30.0) -> dict[str, str]:
        """The rest of the first line for each prefix, whatever order they arrive in (lines from
        different processes are not ordered)."""
        found: dict[str, str] = {}
        while len(found) < len(prefixes):
            line: str = self.lines.get(timeout=timeout)
            for prefix in prefixes:
                if prefix not in found and line.startswith(prefix):
                    found[prefix] = line[len(prefix) :].strip()
                    break
        return found

    def close(self) -> None:
        gevent.killall(self._greenlets, block=True)
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def child_processes() -> list[int]:
    """Live (non-zombie) processes whose parent is this process."""
    me = os.getpid()
    return [
        pid
        for pid, fields in process_stats()
        if len(fields) > 1 and int(fields[1]) == me and fields[0] not in (b"Z", b"X")
    ]


def finish(run: AcpRun, timeout: float = 30.0) -> SubagentResult:
    """The run's result, then dispose it and prove its whole process group is gone."""
    try:
        result: SubagentResult = run.result.get(timeout=timeout)
    finally:
        run.dispose()
    assert not group_alive(run.pid)
    return result
