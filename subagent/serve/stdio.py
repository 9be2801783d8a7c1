"""The server's stdio: fd 0 and fd 1 belong to the protocol, and only to it.

A stray `print`, a library's warning or a child process inheriting our stdout would corrupt the
JSON-RPC stream, so `claim_stdio` moves the protocol's stdout to a private descriptor and points
fd 1 (and `sys.stdout`) at stderr. Both ends are gevent file objects: reads and writes are
cooperative, so one slow client never blocks the hub.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from gevent.event import Event
from gevent.fileobject import FileObjectPosix

from providers.acp_rpc import JsonRpcConnection, LinePipe, RpcFault, WritePipe

__all__ = [
    "SHUTTING_DOWN",
    "ProtocolPipes",
    "check_meta",
    "claim_stdio",
    "serve_until_closed",
    "stop_serving",
]

# The JSON-RPC error every request read after the teardown began gets (a server-defined code of
# JSON-RPC 2.0's -32000..-32099 range; docs/decisions.md).
SHUTTING_DOWN: Final = -32000
SHUTTING_DOWN_MESSAGE: Final = "server is shutting down"
INVALID_PARAMS: Final = -32602


@dataclass(frozen=True, slots=True)
class ProtocolPipes:
    """Where the client's messages come from (`reader`) and where ours go (`writer`)."""

    reader: LinePipe
    writer: WritePipe


def claim_stdio() -> ProtocolPipes:
    """Take fd 0 and fd 1 for the protocol; fd 1 then refers to stderr for everything else."""
    protocol_out = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    protocol_in = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a child process we start never reads the client's messages
    os.close(devnull)
    reader = FileObjectPosix(protocol_in, "rb", bufsize=65536)
    writer = FileObjectPosix(protocol_out, "wb", bufsize=65536)
    return ProtocolPipes(reader, writer)


def stop_serving(conn: JsonRpcConnection, stop: Event) -> None:
    """Begin the teardown: from this moment every request is refused (`SHUTTING_DOWN`), so
    nothing starts that the teardown could miss; `serve_until_closed` then runs it. Called
    from the signal handler, so no request read after the signal is served."""
    conn.refuse_requests(RpcFault(SHUTTING_DOWN, SHUTTING_DOWN_MESSAGE))
    stop.set()


def serve_until_closed(conn: JsonRpcConnection, stop: Event, shutdown: Callable[[], None]) -> None:
    """Block (cooperatively) until the client hangs up or `stop` is set; then `shutdown()`."""
    conn.closed.rawlink(lambda _event: stop.set())
    try:
        # Timed: with every greenlet parked, a plain wait could end in LoopExit.
        while not stop.wait(timeout=1.0):
            pass
    finally:
        stop_serving(conn, stop)
        shutdown()


def check_meta(params: object) -> None:
    """ACP and MCP both make a request's `params._meta` an object: anything else is `-32602`.
    `null` counts as absent (the ACP SDK's models hold it as `None`)."""
    if isinstance(params, Mapping):
        meta = params.get("_meta")
        if meta is not None and not isinstance(meta, Mapping):
            raise RpcFault(INVALID_PARAMS, f"params._meta must be an object, not {_kind(meta)}")


def _kind(value: object) -> str:
    """A JSON value's kind, in JSON's words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"
