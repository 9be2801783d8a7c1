"""Driving a command's work under the live tree, and what Ctrl-C does meanwhile."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from subagent.cli.common import EXIT_INTERRUPTED, EXIT_TERMINATED

if TYPE_CHECKING:
    from gevent import Greenlet
    from rich.console import Console

    from subagent.cli_tree import TreeModel

T = TypeVar("T")

__all__ = ["Interrupts", "drive", "on_sigterm", "reap_external_children", "report_stopped"]


def reap_external_children() -> None:
    """SIGKILL every external agent's process group (ACP children) before the CLI exits at once:
    they run in sessions of their own, so nothing else would stop them."""
    from providers.acp_process import kill_all_groups

    kill_all_groups()


def on_sigterm() -> None:
    """SIGTERM: reap the external agents first, then exit (143)."""
    reap_external_children()
    sys.stderr.write("subagent: terminated\n")
    sys.stderr.flush()
    os._exit(EXIT_TERMINATED)


class Interrupts:
    """First Ctrl-C: run `on_first` (cancel the tree). Second: exit at once."""

    def __init__(self, on_first: Callable[[], list[str]]) -> None:
        self.on_first = on_first
        self.stopped: list[str] | None = None

    def __enter__(self) -> Interrupts:
        from supervision.group import TaskGroup
        from supervision.signal_watch import SignalWatch

        # The cancelling greenlet a first Ctrl-C starts; `__exit__` waits for it to finish.
        self._tasks = TaskGroup("interrupts")

        def handler(*_args: object) -> None:
            if self.stopped is not None:
                reap_external_children()
                sys.stderr.write("subagent: interrupted again; exiting now\n")
                sys.stderr.flush()
                os._exit(EXIT_INTERRUPTED)
            self.stopped = []
            sys.stderr.write("subagent: interrupted; cancelling the tree (Ctrl-C again to exit)\n")
            sys.stderr.flush()

            def cancel() -> None:
                self.stopped = self.on_first()

            self._tasks.spawn(cancel)

        self._watcher = SignalWatch(signal.SIGINT, handler)
        return self

    def __exit__(self, *exc: object) -> None:
        self._watcher.cancel()
        self._tasks.join()
        self._tasks.close()


def drive(
    console: Console,
    tree: TreeModel,
    work: Callable[[], T],
    live: bool,
    on_interrupt: Callable[[], list[str]],
) -> tuple[T, list[str] | None]:
    """Run `work` in a greenlet under the live tree; returns its value and what Ctrl-C stopped."""
    from supervision.group import TaskGroup

    jobs = TaskGroup("cli-work")  # the command's work: never outlives `drive`
    with Interrupts(on_interrupt) as interrupts:
        try:
            job = jobs.spawn(work)
            _watch(console, tree, job, live)
            value: T = job.get()
            return value, interrupts.stopped
        finally:
            jobs.close()


def _watch(console: Console, tree: TreeModel, job: Greenlet, live: bool) -> None:
    """Show the tree while `job` runs."""
    if live and console.is_terminal:
        from rich.live import Live

        # No auto refresh: rich's refresh thread would read the tree off the hub.
        with Live(
            tree.render(times=True), console=console, auto_refresh=False, transient=True
        ) as view:
            while not job.ready():
                view.update(tree.render(times=True), refresh=True)
                job.join(timeout=0.1)
    else:
        # A timed join keeps a timer on the loop: with every greenlet waiting on the
        # operator (Ctrl-C), a plain join would end in LoopExit.
        while not job.ready():
            job.join(timeout=0.5)


def report_stopped(console: Console, stopped: list[str] | None) -> None:
    if stopped is None:
        return
    if stopped:
        console.print(f"interrupted: stopped {len(stopped)} agent(s): {', '.join(stopped)}")
    else:
        console.print("interrupted: nothing was running")
