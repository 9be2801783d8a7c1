"""Starting a server process: claim stdio, build the runtime, serve, tear down on EOF/SIGTERM."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable
from typing import Literal

from agent.events import check_utf8_path
from agent.models import ModelRegistry
from subagent.serve.stdio import claim_stdio
from subagent.serve.wiring import ServeConfig, build_served
from supervision.signal_watch import SignalWatch

__all__ = ["serve"]

log = logging.getLogger(__name__)


class _Signals:
    """First SIGTERM/SIGINT: a graceful stop (cancel, close every child, flush the logs). A
    second one: SIGKILL the external agents' process groups and exit at once."""

    def __init__(self, stop: Callable[[], None]) -> None:
        self._stop = stop
        self.received: int | None = None
        self._watchers = [
            SignalWatch(s, self._on_signal, s) for s in (signal.SIGTERM, signal.SIGINT)
        ]

    def _on_signal(self, signum: int) -> None:
        if self.received is not None:
            from providers.acp_process import kill_all_groups

            kill_all_groups()
            os._exit(128 + signum)
        self.received = signum
        self._stop()

    def cancel(self) -> None:
        for watcher in self._watchers:
            watcher.cancel()


def serve(
    kind: Literal["mcp", "acp"],
    config: ServeConfig,
    *,
    models: ModelRegistry | None = None,
    route: str | None = None,
) -> int:
    """Serve one client on stdin/stdout until it hangs up (0) or a signal stops it (128 + its
    number, after the same graceful teardown); 1 when the client stopped reading our messages
    and the connection was given up (the same teardown, docs/serve.md)."""
    pipes = claim_stdio()
    server: object
    if kind == "mcp":
        from subagent.serve.mcp_server import McpServer

        # The connection's root agent works here: a name its log cannot record is refused at
        # start, before anything is built (docs/decisions.md).
        check_utf8_path(os.getcwd(), "the working directory")

        served = build_served(config, fork=False, child_options=True, models=models, route=route)
        server = mcp = McpServer(served, pipes)
        stop, run, conn = mcp.stop, mcp.serve, mcp.conn
    else:
        from subagent.serve.acp_agent import AcpAgentServer

        served = build_served(config, fork=True, child_options=False, models=models, route=route)
        server = acp = AcpAgentServer(served, pipes)
        stop, run, conn = acp.stop, acp.serve, acp.conn
    signals = _Signals(stop)
    log.info("subagent %s: serving on stdio with %r", kind, server)
    try:
        run()
    finally:
        signals.cancel()
    if signals.received is not None:
        return 128 + signals.received
    return 1 if conn.gave_up else 0
