"""Starting a server process: claim stdio, build the runtime, serve, tear down on EOF/SIGTERM."""

from __future__ import annotations

import logging
import signal
from typing import Literal

import gevent

from subagent.serve.stdio import claim_stdio
from subagent.serve.wiring import ServeConfig, build_served

__all__ = ["serve"]

log = logging.getLogger(__name__)


def serve(kind: Literal["mcp", "acp"], config: ServeConfig) -> int:
    """Serve one client on stdin/stdout until it hangs up (or SIGTERM/SIGINT); returns 0."""
    pipes = claim_stdio()
    server: object
    if kind == "mcp":
        from subagent.serve.mcp_server import McpServer

        served = build_served(config, fork=False, child_options=True)
        server = mcp = McpServer(served, pipes)
        stop, run = mcp.stop, mcp.serve
    else:
        from subagent.serve.acp_agent import AcpAgentServer

        served = build_served(config, fork=True, child_options=False)
        server = acp = AcpAgentServer(served, pipes)
        stop, run = acp.stop, acp.serve
    watchers = [gevent.signal_handler(s, stop) for s in (signal.SIGTERM, signal.SIGINT)]
    log.info("subagent %s: serving on stdio with %r", kind, server)
    try:
        run()
    finally:
        for watcher in watchers:
            watcher.cancel()
    return 0
