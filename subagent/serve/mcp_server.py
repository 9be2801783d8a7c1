"""`subagent mcp`: the model-facing subagent tools as an MCP server over stdio.

One process serves one MCP connection, and the connection owns one root agent: every tool call
runs on that agent's behalf (its children, its tasks, its depth), so `task_output` reads the
tasks an earlier `subagent` call started and `send_message` reaches the children it made. The
root agent stands in for the client and runs no real model: it only acknowledges the
settlement notices its continuable children send it.

Protocol (MCP 2025-06-18; 2025-03-26 and 2024-11-05 are accepted when a client asks for them):
`initialize`, `ping`, `tools/list`, `tools/call` (each call in its own greenlet, so calls run
side by side), `notifications/cancelled` (aborts that call's signal, which is its foreground
children's signal; no answer is sent), and `notifications/progress` while the call runs when the
client sent a `progressToken`, about that call's own children only (calls overlap on the one
root agent; the subagent tools name each child they start to the call). Any tool failure (a
crashing child, a bad argument, a depth or capability refusal) is a result with `isError: true`
whose text starts with the seam's code in brackets (also in `_meta`), never a JSON-RPC error; an
unknown tool name or malformed params is a JSON-RPC `-32602`, as the spec asks. Any request
under the id of a call still running is `-32600`, a call reusing a running call's progress token
`-32602`: answers, cancels and progress are matched by them. The server sends no requests of its
own (docs/decisions.md).
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import gevent
from gevent.event import Event
from gevent.pool import Group

from agent.events import check_utf8_path
from agent.model import ToolCall
from agent.options import AgentOptions
from agent.tools import ToolContext, ToolResult
from providers.acp_rpc import NO_REPLY, JsonRpcConnection, MethodNotFound, RpcFault, usable_id
from providers.acp_text import describe_data
from subagent.serve.offline import CLIENT_PROXY_MODEL
from subagent.serve.progress import ChildFeed, describe
from subagent.serve.stdio import ProtocolPipes, check_meta, serve_until_closed, stop_serving
from subagent.serve.wiring import Served
from subagent.tools import child_labels, install_subagent_tools
from supervision.signal import AbortController, AbortError

if TYPE_CHECKING:
    from actors.agent_handle import Agent

__all__ = ["CODE_META", "LATEST_VERSION", "SUPPORTED_VERSIONS", "McpServer"]

log = logging.getLogger(__name__)

LATEST_VERSION: Final = "2025-06-18"
SUPPORTED_VERSIONS: Final = ("2025-06-18", "2025-03-26", "2024-11-05")
CODE_META: Final = "subagent-runtime/code"

INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
MAX_LINE_BYTES = 16 * 1024 * 1024
CALL_GRACE = 10.0  # seconds a cancelled call gets to settle at shutdown before it is killed

INSTRUCTIONS = (
    "Delegate self-contained tasks to subagents with the `subagent` tool (foreground, or "
    "run_in_background for a task id / child id). Read background results with task_output, "
    "stop them with task_kill, follow up with send_message, see them with list_agents and stop "
    "a running one with interrupt_agent. Cancelling a call cancels its foreground subagents."
)


def tool_result_json(result: ToolResult) -> dict[str, Any]:
    """A `ToolResult` as an MCP `CallToolResult`; an error leads with `[CODE]`."""
    content = [dict(block) for block in result.content]
    out: dict[str, Any] = {"content": content, "isError": result.is_error}
    if result.is_error:
        code = result.code or "TOOL_FAILED"
        if content and content[0].get("type") == "text":
            content[0]["text"] = f"[{code}] {content[0].get('text', '')}"
        else:
            content.insert(0, {"type": "text", "text": f"[{code}]"})
        out["_meta"] = {CODE_META: code}
    return out


class McpServer:
    """One MCP connection over `pipes`, served until the client closes it or `stop()`."""

    def __init__(self, served: Served, pipes: ProtocolPipes, *, cwd: str | None = None) -> None:
        # Refused now, not at `initialize`: the root agent's session log records its directory.
        self._cwd = check_utf8_path(cwd or os.getcwd(), "the working directory")
        self._served = served
        self._runtime = served.runtime
        self._root: Agent | None = None  # the client's stand-in, made by `initialize`
        self._feed: ChildFeed | None = None
        self._version: str | None = None
        self._calls: dict[object, AbortController] = {}  # by JSON-RPC request id
        self._tokens: set[str | int] = set()  # the progress tokens of the running calls
        self._group = Group()
        self._stop = Event()
        self._ticks = itertools.count(1)
        self._uninstall = install_subagent_tools(self._runtime, tools=served.tools)
        self.conn = JsonRpcConnection(
            pipes.writer,
            pipes.reader,
            on_request=self._on_request,
            on_notification=self._on_notification,
            max_line_bytes=MAX_LINE_BYTES,
            name="mcp",
            answer_bad_lines=True,
            require_version=True,
        )

    # -- life ------------------------------------------------------------------------------

    def serve(self) -> None:
        """Block (cooperatively) until the client hangs up or `stop()`; then tear down."""
        serve_until_closed(self.conn, self._stop, self.shutdown)

    def stop(self) -> None:
        """Begin the teardown (a signal): requests are refused from now on."""
        stop_serving(self.conn, self._stop)

    def shutdown(self) -> None:
        """Cancel every call (and so its foreground children), then close the runtime."""
        for controller in list(self._calls.values()):
            controller.abort("the MCP server is shutting down")
        self._group.join(timeout=CALL_GRACE)
        self._group.kill(block=True)
        if self._feed is not None:
            self._feed.close()
        self._uninstall()
        self._served.close()
        self.conn.shutdown("the MCP server stopped")

    # -- requests --------------------------------------------------------------------------

    def _on_request(self, method: str, params: object) -> dict[str, Any] | gevent.Greenlet:
        if self.conn.request_id in self._calls:
            # Whatever the method: its answer, its cancel and the running call's could not be
            # told apart. (The connection answers only ids it can echo: all hashable.)
            raise RpcFault(INVALID_REQUEST, "a call with this request id is still running")
        check_meta(params)
        if method == "initialize":
            return self._initialize(params)
        if method == "ping":
            return {}
        root = self._root
        if root is None:
            raise RpcFault(INVALID_REQUEST, "the server is not initialized")
        if method == "tools/list":
            return {"tools": self._tools(root)}
        if method == "tools/call":
            return self._call(root, params)
        raise MethodNotFound(method)

    def _initialize(self, params: object) -> dict[str, Any]:
        if self._root is not None:
            raise RpcFault(INVALID_REQUEST, "initialize was already called on this connection")
        asked = params.get("protocolVersion") if isinstance(params, Mapping) else None
        self._version = asked if asked in SUPPORTED_VERSIONS else LATEST_VERSION
        root = self._root = self._runtime.agent(
            options=AgentOptions(model=CLIENT_PROXY_MODEL), cwd=self._cwd
        )
        self._feed = ChildFeed(self._runtime.subagents, self._runtime.ctx.agents, root.id)
        log.info("mcp: root agent %s (protocol %s)", root.id, self._version)
        return {
            "protocolVersion": self._version,
            "capabilities": {"tools": {"listChanged": False}},
            "serverInfo": {
                "name": "subagent-runtime",
                "title": "Subagent runtime",
                "version": _version(),
            },
            "instructions": INSTRUCTIONS,
        }

    def _tools(self, root: Agent) -> list[dict[str, Any]]:
        return [
            {"name": s.name, "description": s.description, "inputSchema": dict(s.parameters)}
            for s in root.tools.specs()
        ]

    def _call(self, root: Agent, params: object) -> gevent.Greenlet:
        if not isinstance(params, Mapping) or not isinstance(params.get("name"), str):
            raise RpcFault(INVALID_PARAMS, "tools/call needs params with a string name")
        name = params["name"]
        if name not in root.tools.names() and root.tools.registry.get(name) is None:
            raise RpcFault(INVALID_PARAMS, f"unknown tool: {name}")
        arguments = params.get("arguments")
        arguments = {} if arguments is None else arguments
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, Mapping) else None
        if not isinstance(token, (str, int)) or isinstance(token, bool):
            token = None  # MCP's tokens are strings or integers: no progress for another kind
        elif token in self._tokens:
            # MCP: unique across the active requests; two calls' progress could not be told apart.
            raise RpcFault(INVALID_PARAMS, "the progressToken is in use by a running call")
        rid = self.conn.request_id
        if isinstance(rid, bool) or not isinstance(rid, (str, int, float)):
            raise RpcFault(INVALID_REQUEST, "a tools/call request id must be a string or a number")
        call = ToolCall(f"mcp-{rid}", name, arguments)
        controller = AbortController()
        # Registered last, and only with its greenlet: `_forget` removes it (linked below).
        self._calls[rid] = controller
        if token is not None:
            self._tokens.add(token)
        try:
            greenlet: gevent.Greenlet = self._group.spawn(
                self._run_call, root, call, controller, token
            )
        except BaseException:
            self._forget(rid, token)
            raise
        # Linked before the connection links its answer, so both run in one pass of the
        # greenlet's links: the id and the token are free exactly when the answer is queued
        # (never while the client could not yet have it), and never before.
        greenlet.rawlink(lambda _done: self._forget(rid, token))
        return greenlet

    def _forget(self, rid: object, token: str | int | None) -> None:
        self._calls.pop(rid, None)
        if token is not None:
            self._tokens.discard(token)

    def _run_call(
        self, root: Agent, call: ToolCall, controller: AbortController, token: str | int | None
    ) -> object:
        """The call's `CallToolResult`, or `NO_REPLY` when the client cancelled it."""
        feed = None
        if token is not None and self._feed:
            # Only this call's children: calls overlap on one root agent, each with its token.
            feed = self._feed.add_call(lambda event: self._progress(token, event))
        ctx = ToolContext(
            agent=root,
            session_id=root.id,
            call_id=call.id,
            signal=controller.signal,
            on_child=feed.claim if feed is not None else None,
        )
        try:
            result = root.tools.execute(call, ctx)
        except AbortError:
            return NO_REPLY
        finally:
            if feed is not None:
                feed.close()
        if controller.signal.aborted:
            return NO_REPLY  # the client cancelled: it expects no answer
        return tool_result_json(result)

    def _progress(self, token: str | int, event: Mapping[str, Any]) -> None:
        text = describe(event, child_labels(self._runtime.ctx))
        if text is None:
            return
        self.conn.notify(
            "notifications/progress",
            {"progressToken": token, "progress": next(self._ticks), "message": text},
        )

    # -- notifications ---------------------------------------------------------------------

    def _on_notification(self, method: str, params: object) -> None:
        if method == "notifications/cancelled" and isinstance(params, Mapping):
            rid = params.get("requestId")
            if not usable_id(rid):  # an object or array id names no call (and is unhashable)
                log.warning("mcp: a cancel names no usable request id: %s", describe_data(rid))
                return
            controller = self._calls.get(rid)
            if controller is not None:
                reason = params.get("reason")
                why = f": {reason}" if isinstance(reason, str) and reason else ""
                controller.abort(f"cancelled by the MCP client{why}")
        # notifications/initialized and anything else: nothing to do


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("subagent-runtime")
    except PackageNotFoundError:
        return "0.0.0"
