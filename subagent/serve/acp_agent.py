"""`subagent acp`: the runtime as an ACP agent over stdio (protocol version 1).

Each ACP session is one coordinator agent with the subagent tools; its session id is the
coordinator's session id in the store, so `session/load` continues it (and, through it, its
stored continuable children) in a later process. `session/prompt` is one coordinator turn;
`session/update` streams the coordinator's text (`agent_message_chunk`), its tool calls
(`tool_call` / `tool_call_update`) and every descendant's start, progress and end as tool calls
of their own (id `child:<session id>`, `_meta` naming the parent), so an editor can draw the tree.
`session/cancel` cancels the coordinator's turn, which cascades to every child it started.

Depth crosses processes in `_meta`: a `session/new` (or `session/load`) whose `_meta` carries
`subagent-runtime/depth: N` starts the coordinator at delegation depth N, so a runtime started by
another runtime's `acp` provider keeps counting from the parent's depth and the cap holds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, Final, TypeVar, TypeVarTuple

import gevent
from gevent.event import AsyncResult, Event
from gevent.pool import Group

from agent.errors import SessionBusyError, SessionLogError
from agent.events import check_utf8_path
from agent.history import with_tool_calls
from agent.options import AgentOptions
from providers.acp import DEPTH_META
from providers.acp_rpc import JsonRpcConnection, MethodNotFound, RpcFault
from subagent.live import live_agent
from subagent.serve.progress import ChildFeed, describe
from subagent.serve.stdio import ProtocolPipes, check_meta, serve_until_closed, stop_serving
from subagent.serve.wiring import Served
from subagent.tools import child_labels, install_subagent_tools

if TYPE_CHECKING:
    from pykka import Future

    from actors.agent_handle import Agent
    from agent.loop import TurnOutcome

__all__ = ["DEPTH_META", "IGNORED_MCP_META", "PROTOCOL_VERSION", "AcpAgentServer"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

PROTOCOL_VERSION: Final = 1

PARENT_META: Final = "subagent-runtime/parent"
# `_meta` key of the session/new and session/load answers: the names of the client's MCP
# servers this agent does not connect (docs/serve.md).
IGNORED_MCP_META: Final = "subagent-runtime/mcpServersNotConnected"

INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
MAX_LINE_BYTES = 16 * 1024 * 1024
# A prompt's blocks are walked on the hub: at most this many (a 10,000-block walk takes a few
# milliseconds; an editor's prompt has a handful, or a few hundred resources).
MAX_PROMPT_BLOCKS = 10_000
PROMPT_GRACE = 10.0
# The ACP methods a client must send as requests (with an id): as a notification they get no
# answer, so they are refused on stderr instead (docs/serve.md).
REQUEST_METHODS: Final = frozenset({"initialize", "session/new", "session/load", "session/prompt"})
# How much of a client's value (a session id, a method name) a warning line quotes.
QUOTED = 100

STOP_REASONS: Final = {
    "completed": "end_turn",
    "aborted": "cancelled",
    "max-tokens": "max_tokens",
    "refusal": "refusal",
}


def _check_protocol_version(params: object) -> None:
    """`initialize` names the latest version the client speaks, an integer (a uint16 in the
    ACP schema); any such version is answered with ours, the one we speak (the spec's
    negotiation: the client decides whether to go on). Anything else is not a version."""
    version = params.get("protocolVersion") if isinstance(params, Mapping) else None
    if type(version) is not int or not 0 <= version <= 0xFFFF:
        raise RpcFault(INVALID_PARAMS, "initialize needs protocolVersion, an integer (0-65535)")


def meta_depth(params: Mapping[str, Any]) -> int | None:
    """The delegation depth a session starts at, from `_meta`; `RpcFault` when malformed."""
    meta = params.get("_meta")
    if not isinstance(meta, Mapping) or DEPTH_META not in meta:
        return None
    depth = meta[DEPTH_META]
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        raise RpcFault(INVALID_PARAMS, f"_meta {DEPTH_META} must be a non-negative integer")
    return depth


def _quoted(value: object) -> str:
    """A client's value for a log line: its repr, cut to its start."""
    text = repr(value)
    return text if len(text) <= QUOTED else f"{text[:QUOTED]}... ({len(text) - QUOTED} cut)"


def _field(block: Mapping[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise RpcFault(INVALID_PARAMS, f"prompt block {where}: {key} must be a string")
    return value


def prompt_blocks(prompt: object) -> list[dict[str, Any]]:
    """ACP content blocks as the runtime's text blocks (text, resource links, text resources).

    A block of a known type whose required field is missing or of the wrong type is refused
    naming that field (not as an unsupported type); fields the runtime does not use (the
    schema's `annotations`, `_meta`, a client's own) are ignored, as ACP allows."""
    if not isinstance(prompt, list) or not prompt:
        raise RpcFault(INVALID_PARAMS, "prompt must be a non-empty list of content blocks")
    if len(prompt) > MAX_PROMPT_BLOCKS:
        raise RpcFault(
            INVALID_PARAMS, f"a prompt holds at most {MAX_PROMPT_BLOCKS:,} content blocks"
        )
    blocks: list[dict[str, Any]] = []
    for index, block in enumerate(prompt):
        kind = block.get("type") if isinstance(block, Mapping) else None
        where = f"{index} ({kind})"
        if kind == "text":
            blocks.append({"type": "text", "text": _field(block, "text", where)})
        elif kind == "resource_link":
            blocks.append({"type": "text", "text": f"[resource {_field(block, 'uri', where)}]"})
        elif kind == "resource":
            resource = block.get("resource")
            if not isinstance(resource, Mapping):
                raise RpcFault(INVALID_PARAMS, f"prompt block {where}: resource must be an object")
            uri = _field(resource, "uri", f"{where} resource")
            if not isinstance(resource.get("text"), str):
                raise RpcFault(INVALID_PARAMS, "only text resources are supported")
            blocks.append({"type": "text", "text": f"[resource {uri}]\n{resource['text']}"})
        else:
            shown = kind if isinstance(kind, str) or kind is None else type(kind).__name__
            raise RpcFault(INVALID_PARAMS, f"unsupported prompt block type {shown!r}")
    return blocks


def _joined_text(content: Iterable[object] | None) -> str:
    return "\n".join(str(b.get("text", "")) for b in content or () if isinstance(b, Mapping))


def _text_content(content: Iterable[object] | None) -> list[dict[str, Any]]:
    """A tool call's `content`: one `ToolCallContent` of the text, or none."""
    text = _joined_text(content)
    return [{"type": "content", "content": {"type": "text", "text": text}}] if text else []


def _chunk(kind: str, content: Iterable[object] | None) -> dict[str, Any] | None:
    """A message chunk update of the text (its `content` one content block), or None."""
    text = _joined_text(content)
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}} if text else None


class _Session:
    """One ACP session: its coordinator, the streams that report on it, its running prompt."""

    def __init__(self, server: AcpAgentServer, agent: Agent) -> None:
        self.server = server
        self.agent = agent
        self.prompting = False
        self.removers: list[Callable[[], None]] = []
        runtime = server.runtime
        self.feed = ChildFeed(runtime.subagents, runtime.ctx.agents, agent.id)
        self.removers.append(self.feed.close)
        self.removers.append(self.feed.add(self._on_child))
        self.removers.append(agent.add_progress_listener(self._on_own))
        self.turn_waiters: dict[str, AsyncResult] = {}
        self.opened: set[str] = set()  # children whose tool call the client has seen
        self.removers.append(agent.add_turn_listener(self._on_turn_end))

    @property
    def id(self) -> str:
        return str(self.agent.id)

    def update(self, update: dict[str, Any]) -> None:
        self.server.conn.notify("session/update", {"sessionId": self.id, "update": update})

    def _on_turn_end(self, outcome: TurnOutcome) -> None:
        waiter = self.turn_waiters.pop(str(outcome.message_id), None)
        if waiter is not None:
            waiter.set(outcome)

    def _on_own(self, event: Mapping[str, Any]) -> None:
        kind = event.get("kind")
        if kind == "model/chunk" and event.get("type") == "text" and event.get("text"):
            self.update(
                {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": str(event["text"])},
                }
            )
        elif kind == "tool/call":
            arguments = event.get("arguments")
            title = str(event.get("name"))
            if isinstance(arguments, Mapping) and isinstance(arguments.get("description"), str):
                title = f"{title}: {arguments['description']}"
            self.update(
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": str(event.get("call_id")),
                    "title": title,
                    "kind": "other",
                    "status": "in_progress",
                    "rawInput": dict(arguments) if isinstance(arguments, Mapping) else {},
                }
            )
        elif kind == "tool/result":
            update: dict[str, Any] = {
                "sessionUpdate": "tool_call_update",
                "toolCallId": str(event.get("call_id")),
                "status": "failed" if event.get("is_error") else "completed",
                "content": _text_content(event.get("content")),
            }
            if event.get("code"):
                update["_meta"] = {"subagent-runtime/code": event["code"]}
            self.update(update)

    def _parent_of(self, child: str, event: Mapping[str, Any]) -> str | None:
        parent: str | None = event.get("parent_id")
        if parent is None:
            agent = live_agent(self.server.runtime.ctx, child)
            parent = agent.header.parent_session if agent is not None else child.rpartition(".")[0]
        return parent

    def _on_child(self, event: Mapping[str, Any]) -> None:
        """A child's events as one tool call: opened at its first event (a child's progress can
        precede its `subagent/start`), back to `in_progress` when it starts again (a resumed
        continuable child), closed `completed`/`failed` at its end."""
        labels = child_labels(self.server.runtime.ctx)
        kind = event.get("type")
        child = str(event.get("id") or event.get("agent_id"))
        call_id = f"child:{child}"
        line = describe(event, labels)
        label = labels.get(child)
        title = f"subagent {child}" + (f": {label}" if label else "")
        meta = {PARENT_META: self._parent_of(child, event)}
        if child not in self.opened:
            self.opened.add(child)
            self.update(
                {
                    "sessionUpdate": "tool_call",
                    "toolCallId": call_id,
                    "title": title,
                    "kind": "other",
                    "status": "in_progress",
                    "_meta": meta,
                }
            )
        elif kind == "subagent/start":
            self.update(
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "title": title,
                    "status": "in_progress",
                    "_meta": meta,
                }
            )
        if kind == "subagent/end":
            failed = event.get("stop_reason") != "completed"
            content = _text_content(event.get("last_assistant_message"))
            if line:
                content.insert(0, {"type": "content", "content": {"type": "text", "text": line}})
            self.update(
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "status": "failed" if failed else "completed",
                    "content": content,
                }
            )
        elif kind != "subagent/start" and line is not None:
            self.update(
                {
                    "sessionUpdate": "tool_call_update",
                    "toolCallId": call_id,
                    "content": [{"type": "content", "content": {"type": "text", "text": line}}],
                }
            )

    def send(self, blocks: list[dict[str, Any]]) -> tuple[Future[str], AsyncResult]:
        """Queue the prompt's turn now (in mailbox order, before any later cancel)."""
        message_id = "acp-" + secrets.token_hex(6)
        waiter: AsyncResult = AsyncResult()
        self.turn_waiters[message_id] = waiter
        return self.agent.send(blocks, message_id=message_id), waiter

    def wait(self, accepted: Future[str], waiter: AsyncResult) -> dict[str, Any]:
        """The queued turn's stop reason (`cancelled` when a cancel discarded it unstarted)."""
        try:
            accepted.get()
            outcome = waiter.get()
        finally:
            for key, pending in list(self.turn_waiters.items()):
                if pending is waiter:
                    del self.turn_waiters[key]
        if outcome is None:
            return {"stopReason": "cancelled"}
        stop = STOP_REASONS.get(outcome.reason)
        if stop is None:
            why = outcome.message or outcome.cause or outcome.reason
            raise RpcFault(INTERNAL_ERROR, f"the coordinator's turn ended {outcome.reason}: {why}")
        return {"stopReason": stop}

    def cancelled(self, idle: Future[TurnOutcome | None], before: list[AsyncResult]) -> None:
        """After a cancel settles: a prompt sent `before` it whose message was discarded before
        its turn began gets no turn, so it is answered `cancelled` here."""
        with contextlib.suppress(Exception):
            idle.get()
        for waiter in before:
            if not waiter.ready():
                waiter.set(None)

    def close(self) -> None:
        while self.removers:
            with contextlib.suppress(ValueError):
                self.removers.pop()()


class AcpAgentServer:
    """One ACP client over `pipes`, served until it hangs up or `stop()`."""

    def __init__(self, served: Served, pipes: ProtocolPipes) -> None:
        self._served = served
        self.runtime = served.runtime
        self._sessions: dict[str, _Session] = {}
        self._group = Group()
        # The ids of the client's requests still being answered (see `_on_request`).
        self._running: set[object] = set()
        # The sessions being loaded, each set when its load ends (see `_load_session`).
        self._loading: dict[str, Event] = {}
        self._stop = Event()
        self._initialized = False
        self._uninstall = install_subagent_tools(self.runtime, tools=served.tools)
        self.conn = JsonRpcConnection(
            pipes.writer,
            pipes.reader,
            on_request=self._on_request,
            on_notification=self._on_notification,
            max_line_bytes=MAX_LINE_BYTES,
            name="acp-server",
            answer_bad_lines=True,
            require_version=True,
        )

    def serve(self) -> None:
        """Block (cooperatively) until the client hangs up or `stop()`; then tear down."""
        serve_until_closed(self.conn, self._stop, self.shutdown)

    def stop(self) -> None:
        """Begin the teardown (a signal): requests are refused from now on."""
        stop_serving(self.conn, self._stop)

    def shutdown(self) -> None:
        """Cancel running prompts (their children with them), then close the runtime."""
        for session in list(self._sessions.values()):
            if session.agent.status == "running":
                session.agent.cancel("the ACP agent is shutting down")
        self._group.join(timeout=PROMPT_GRACE)
        self._group.kill(block=True)
        for session in list(self._sessions.values()):
            session.close()
        self._uninstall()
        self._served.close()
        self.conn.shutdown("the ACP agent stopped")

    # -- requests --------------------------------------------------------------------------

    def _on_request(self, method: str, params: object) -> dict[str, Any] | gevent.Greenlet:
        if self.conn.request_id in self._running:
            # Its answer could not be told from the running request's: refused, never run.
            raise RpcFault(INVALID_REQUEST, "a request with this id is still running")
        check_meta(params)
        if method == "initialize":
            _check_protocol_version(params)
            self._initialized = True
            return {
                "protocolVersion": PROTOCOL_VERSION,
                "agentCapabilities": {
                    "loadSession": True,
                    "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                },
                "agentInfo": {"name": "subagent-runtime", "title": "Subagent runtime"},
                "authMethods": [],
            }
        if not self._initialized:
            raise RpcFault(-32600, "initialize first")
        if not isinstance(params, Mapping):
            raise RpcFault(INVALID_PARAMS, f"{method} needs an object of params")
        if method == "session/cancel":
            # A notification sent with an id: the cancel is done (a user pressed stop), and the
            # answer tells the client it spoke the protocol wrong.
            done = self._cancel(params)
            raise RpcFault(
                INVALID_REQUEST,
                "session/cancel is a notification: send it without an id "
                + ("(the turn was cancelled all the same)" if done else "(no such session)"),
            )
        if method == "session/new":
            return self._spawn(self._new_session, params)
        if method == "session/load":
            return self._spawn(self._load_session, params)
        if method == "session/prompt":
            session = self._session(params)
            if session.prompting:
                raise RpcFault(INVALID_PARAMS, "a prompt is already running in this session")
            blocks = prompt_blocks(params.get("prompt"))
            session.prompting = True
            accepted, waiter = session.send(blocks)
            return self._spawn(self._prompt, session, accepted, waiter)
        raise MethodNotFound(method)

    def _spawn(self, fn: Callable[[*Ts], object], *args: *Ts) -> gevent.Greenlet:
        """The request's answer, later: its id stays taken until the greenlet ends."""
        greenlet: gevent.Greenlet = self._group.spawn(self._guarded, fn, *args)
        rid = self.conn.request_id
        self._running.add(rid)
        greenlet.rawlink(lambda _done: self._running.discard(rid))
        return greenlet

    @staticmethod
    def _guarded(fn: Callable[[*Ts], T], *args: *Ts) -> T | RpcFault | MethodNotFound:
        """`fn`'s answer; a fault is returned (the connection answers it), so the hub prints
        no traceback of its own: a client's bad request is no crash, a stored log this request
        cannot use (corrupt, unreadable) is one warning line, anything else one traceback."""
        try:
            return fn(*args)
        except (RpcFault, MethodNotFound) as fault:
            return fault
        except (ValueError, TypeError, KeyError) as exc:
            return RpcFault(INVALID_PARAMS, f"{type(exc).__name__}: {exc}")
        except SessionLogError as exc:
            log.warning("acp server: %s: %s", type(exc).__name__, exc)
            return RpcFault(INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            log.exception("acp server: request failed")
            return RpcFault(INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")

    def _session(self, params: Mapping[str, Any]) -> _Session:
        session = self._sessions.get(str(params.get("sessionId")))
        if session is None:
            raise RpcFault(INVALID_PARAMS, f"unknown session {params.get('sessionId')!r}")
        return session

    @staticmethod
    def _cwd(params: Mapping[str, Any]) -> str:
        cwd = params.get("cwd")
        if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isdir(cwd):
            raise RpcFault(INVALID_PARAMS, f"cwd must be an absolute directory, got {cwd!r}")
        try:
            # A JSON `\udce9` escape is how a client could name a non-UTF-8 directory: refused
            # here by name, not as a failure deep in the session log (docs/decisions.md).
            return check_utf8_path(cwd, "cwd")
        except ValueError as exc:
            raise RpcFault(INVALID_PARAMS, str(exc)) from None

    def _options(self, depth: int | None) -> AgentOptions:
        return AgentOptions(model=self._served.model, subagent_depth=depth)

    @staticmethod
    def _not_connected(params: Mapping[str, Any]) -> dict[str, Any]:
        """The answer's `_meta` naming the client's MCP servers this agent does not connect.

        The spec asks an agent to connect them; the coordinator's tools are the subagent tools
        only (docs/serve.md). Refusing the session would lock out every client that always
        sends its servers (editors do), so the session opens, and the client is told in-band
        (and stderr says so) instead of the servers being dropped silently.
        """
        servers = params.get("mcpServers")
        if servers is None:
            return {}
        if not isinstance(servers, list):
            raise RpcFault(INVALID_PARAMS, f"mcpServers must be an array, got {servers!r}")
        if not servers:
            return {}
        names = [
            str(s.get("name")) if isinstance(s, Mapping) and s.get("name") else "?" for s in servers
        ]
        log.warning(
            "acp server: not connecting the client's MCP server(s) %s: this agent's tools are "
            "the subagent tools only",
            ", ".join(names),
        )
        return {"_meta": {IGNORED_MCP_META: names}}

    def _new_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        note = self._not_connected(params)
        depth = meta_depth(params)
        agent = self.runtime.agent(
            options=self._options(depth), cwd=self._cwd(params), delegation_depth=depth or 0
        )
        self._sessions[agent.id] = _Session(self, agent)
        log.info("acp server: session %s at depth %s", agent.id, agent.depth)
        return {"sessionId": agent.id, **note}

    def _load_session(self, params: Mapping[str, Any]) -> dict[str, Any]:
        session_id = params.get("sessionId")
        self._cwd(params)
        note = self._not_connected(params)
        depth = meta_depth(params)
        if not isinstance(session_id, str):
            raise RpcFault(INVALID_PARAMS, "sessionId must be a string")
        # A second load of a session while the first is still resuming it (an editor that
        # retries) waits for that one, then replays, as a load of a live session does.
        while (loading := self._loading.get(session_id)) is not None:
            loading.wait()
        if session_id not in self._sessions:
            self._loading[session_id] = loaded = Event()
            try:
                self._resume(session_id, depth)
            finally:
                del self._loading[session_id]
                loaded.set()
        self._replay(self._sessions[session_id])
        return note

    def _resume(self, session_id: str, depth: int | None) -> None:
        """The stored coordinator `session_id` as a session of this connection."""
        store = self.runtime.store
        if not store.exists(session_id):
            raise RpcFault(INVALID_PARAMS, f"no stored session {session_id!r}")
        header = store.header(session_id)
        if header.parent_session is not None:
            raise RpcFault(INVALID_PARAMS, f"{session_id} is a subagent, not a coordinator")
        try:
            agent = self.runtime.resume_agent(session_id, options=self._options(depth))
        except SessionBusyError:
            # Another `subagent acp` (another editor) on the same home has it open.
            raise RpcFault(
                INVALID_PARAMS,
                f"session {session_id} is open in another process; close it there first",
            ) from None
        self._sessions[session_id] = _Session(self, agent)

    def _replay(self, session: _Session) -> None:
        """The conversation so far as updates, as `session/load` promises the client."""
        loaded = self.runtime.store.inspect(session.id)
        # Tool calls told one by one, whichever format the log is in.
        for kind, data in with_tool_calls(loaded.events[loaded.header.seed_length :]):
            if kind in ("user/message", "assistant/message"):
                role = "user" if kind == "user/message" else "agent"
                chunk = _chunk(f"{role}_message_chunk", data["message"].get("content"))
                if chunk is not None:
                    session.update(chunk)
            elif kind == "tool/call":
                session.update(
                    {
                        "sessionUpdate": "tool_call",
                        "toolCallId": str(data["call_id"]),
                        "title": str(data["name"]),
                        "kind": "other",
                        "status": "in_progress",
                        "rawInput": data.get("arguments", {}),
                    }
                )
            elif kind == "tool/result":
                session.update(
                    {
                        "sessionUpdate": "tool_call_update",
                        "toolCallId": str(data["call_id"]),
                        "status": "failed" if data.get("is_error") else "completed",
                        "content": _text_content(data.get("content")),
                    }
                )

    def _prompt(
        self, session: _Session, accepted: Future[str], waiter: AsyncResult
    ) -> dict[str, Any]:
        try:
            return session.wait(accepted, waiter)
        finally:
            session.prompting = False

    # -- notifications ---------------------------------------------------------------------

    def _on_notification(self, method: str, params: object) -> None:
        """`session/cancel`; anything else gets no answer (a notification cannot), so what a
        client got wrong is said on stderr, not dropped without a word."""
        if method == "session/cancel":
            if not isinstance(params, Mapping):
                log.warning("acp server: session/cancel without an object of params: ignored")
            elif not self._cancel(params):
                log.warning(
                    "acp server: session/cancel for unknown session %s: nothing to cancel",
                    _quoted(params.get("sessionId")),
                )
        elif method in REQUEST_METHODS:
            log.warning("acp server: %s sent as a notification (no id): ignored", method)
        else:
            log.debug("acp server: ignored notification %s", _quoted(method))

    def _cancel(self, params: Mapping[str, Any]) -> bool:
        """Cancel the session's turn (nothing when idle); False when there is no such session."""
        session = self._sessions.get(str(params.get("sessionId")))
        if session is None:
            return False
        # The agent's cancel hook cancels every run it started; the turn ends `aborted`.
        before = list(session.turn_waiters.values())
        idle = session.agent.cancel("cancelled by the ACP client")
        self._group.spawn(session.cancelled, idle, before)
        return True
