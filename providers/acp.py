"""The `acp` provider: any agent that speaks the Agent Client Protocol, run as a subagent.

The child is an external process (Codex, Claude Code, Gemini CLI, fast-agent through their ACP
adapters) driven over JSON-RPC on its stdin/stdout. It is a *remote* run: a fresh parent-scoped id,
no `local_agent`, no start-time capabilities, no inherited context.

Resume is a capability discovered with `isinstance(provider, Resumable)`. `AcpProvider` never has
it; `ResumableAcpProvider` (built directly when you know the agent advertises `loadSession`, or
picked by `discover_acp_provider`, which asks the agent) adds `resume` through `session/load`.

Calls block the calling greenlet cooperatively (the providers-layer idiom); only `run.result` is
a future.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import gevent
from gevent.event import Event

from providers.acp_config import AcpConfig, ProgressCallback, check_cwd
from providers.acp_process import ProcessGroup
from providers.acp_rpc import (
    ConnectionClosed,
    JsonRpcConnection,
    MethodNotFound,
    RequestAborted,
    RpcError,
    StderrTail,
)
from providers.remote_run import RemoteRun
from subagent.errors import SubagentError
from subagent.types import (
    ABORTED,
    COMPLETED,
    ERROR,
    MAX_TOKENS,
    REFUSAL,
    ContentBlock,
    SubagentCapabilities,
    SubagentResult,
    SubagentResumeRequest,
    SubagentStartRequest,
)
from supervision.signal import AbortSignal

__all__ = [
    "PROTOCOL_VERSION",
    "STOP_REASONS",
    "AcpConfig",
    "AcpProvider",
    "AcpRun",
    "ResumableAcpProvider",
    "discover_acp_provider",
]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1

# ACP stop reason -> seam stop reason; anything unlisted is an error.
STOP_REASONS: dict[str, str] = {
    "end_turn": COMPLETED,
    "max_tokens": MAX_TOKENS,
    "refusal": REFUSAL,
    "cancelled": ABORTED,
    "max_turn_requests": ERROR,
}

PROGRESS_KINDS = frozenset({"tool_call", "tool_call_update", "agent_thought_chunk", "plan"})

_CLIENT_CAPABILITIES = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}


def _text_prompt(prompt: Sequence[ContentBlock]) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    for block in prompt:
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise SubagentError(
                "START_FAILED",
                f"the acp provider sends text blocks only, got {block.get('type')!r}",
            )
        blocks.append({"type": "text", "text": block["text"]})
    return blocks


def _parent_cwd(parent: Any) -> str:
    try:
        return check_cwd(getattr(parent, "cwd", None), "parent cwd")
    except ValueError as exc:
        raise SubagentError("START_FAILED", str(exc)) from None


# `_meta` key of session/new and session/load: the delegation depth the agent's session starts
# at (the parent's depth + 1). A runtime served with `subagent acp` starts its coordinator there,
# so the depth cap holds across the process boundary; other agents ignore the key.
DEPTH_META = "subagent-runtime/depth"


def session_params(cwd: str, parent: Any, load_session_id: str | None) -> dict[str, Any]:
    """The params of `session/new` (or `session/load` of `load_session_id`), `_meta` included."""
    params: dict[str, Any] = {"cwd": cwd, "mcpServers": []}
    if load_session_id is not None:
        params["sessionId"] = load_session_id
    depth = getattr(parent, "depth", None)
    if isinstance(depth, int) and not isinstance(depth, bool):
        params["_meta"] = {DEPTH_META: depth + 1}
    return params


def _parent_scoped_id(parent: Any) -> str:
    sid = getattr(parent, "session_id", None)
    token = secrets.token_hex(8)
    return f"{sid}.acp-{token}" if isinstance(sid, str) and sid else f"acp-{token}"


class _Child:
    """The spawned agent: its process group, JSON-RPC connection and stderr drain."""

    def __init__(self, config: AcpConfig, cwd: str) -> None:
        self.config = config
        self.group = ProcessGroup((config.command, *config.args), cwd=cwd, env=config.environment())
        self.stderr = StderrTail(self.group.popen.stderr)
        self.request_handler: Callable[[str, Any], Any] = self._no_run_request
        self.notification_handler: Callable[[str, Any], None] = lambda _m, _p: None
        self.conn = JsonRpcConnection(
            self.group.popen.stdin,
            self.group.popen.stdout,
            on_request=lambda m, p: self.request_handler(m, p),
            on_notification=lambda m, p: self.notification_handler(m, p),
            max_line_bytes=config.max_line_bytes,
            name=f"{config.name}[{self.group.pid}]",
        )
        self.agent_capabilities: dict[str, Any] = {}
        self._teardown: gevent.Greenlet | None = None

    @staticmethod
    def _no_run_request(method: str, _params: Any) -> Any:
        if method == "session/request_permission":
            return {"outcome": {"outcome": "cancelled"}}
        raise MethodNotFound(method)

    def handshake(self, signal: AbortSignal) -> None:
        result = self.conn.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": _CLIENT_CAPABILITIES,
                "clientInfo": {"name": "subagent-runtime", "version": "0.1.0"},
            },
            signal=signal,
        )
        if not isinstance(result, dict):
            raise _StartFailure(f"initialize returned {result!r}, not an object")
        version = result.get("protocolVersion")
        if version != PROTOCOL_VERSION:
            raise _StartFailure(f"the agent speaks ACP protocol {version!r}, not 1")
        caps = result.get("agentCapabilities")
        self.agent_capabilities = caps if isinstance(caps, dict) else {}

    def diagnostic(self, failure: BaseException) -> str:
        """What went wrong, plus the exit code (when the agent hung up) and its stderr tail."""
        if isinstance(failure, ConnectionClosed):
            parts = [failure.reason]
            # The agent hung up: give it a moment to be reaped so its exit code can be reported.
            code = self.group.returncode if failure.protocol_error else self.group.wait_leader(1.0)
        else:
            parts = [str(failure)]
            code = self.group.returncode
        if code is not None:
            parts.append(f"exit code {code}")
        tail = self.stderr.text().strip()
        if tail:
            parts.append(f"stderr tail: {tail[-2000:]}")
        return "; ".join(parts)

    def teardown(self, *, graceful: bool) -> None:
        """Reap the whole process group; concurrent callers all wait for the one teardown."""
        if self._teardown is None:
            self._teardown = gevent.spawn(self._do_teardown, graceful)
        self._teardown.get()  # re-raises a teardown fault in every caller

    def _do_teardown(self, graceful: bool) -> None:
        self.conn.close_input()
        self.group.terminate(
            self.config.eof_grace if graceful else None, self.config.terminate_grace
        )
        self.conn.shutdown("the agent process was torn down")
        self.stderr.greenlet.join(timeout=1.0)
        self.stderr.greenlet.kill(block=True)
        with contextlib.suppress(OSError, ValueError):
            self.group.popen.stderr.close()


class _StartFailure(Exception):
    pass


class AcpRun(RemoteRun):
    """One prompt turn of an external ACP agent. `result` never fails; always `dispose()`."""

    def __init__(
        self,
        run_id: str,
        child: _Child,
        session_id: str,
        signal: AbortSignal,
        on_progress: ProgressCallback | None,
    ) -> None:
        super().__init__(run_id)
        self._child = child
        self.acp_session_id = session_id
        self._on_progress = on_progress
        self._output: list[str] = []
        self._prompting = False
        self._disposed = Event()
        self._disposing = False
        child.request_handler = self._on_request
        child.notification_handler = self._on_notification
        self._turn: gevent.Greenlet | None = None
        self._remove_listener = signal.add_listener(self._on_abort)

    @property
    def pid(self) -> int:
        """The process-group leader's pid (the group id too)."""
        return self._child.group.pid

    def _begin(self, prompt: list[dict[str, Any]]) -> None:
        self._prompting = True
        self._turn = gevent.spawn(self._run_turn, prompt)

    def _run_turn(self, prompt: list[dict[str, Any]]) -> None:
        try:
            reply = self._child.conn.request(
                "session/prompt", {"sessionId": self.acp_session_id, "prompt": prompt}
            )
            stop = reply.get("stopReason") if isinstance(reply, dict) else None
            mapped = STOP_REASONS.get(stop, ERROR) if isinstance(stop, str) else ERROR
            diagnostic = None
            if mapped == ERROR:
                diagnostic = f"the agent ended its turn with stop reason {stop!r}"
            self._settle(mapped, diagnostic)
        except RpcError as exc:
            self._settle(ERROR, self._child.diagnostic(exc))
        except ConnectionClosed as exc:
            if not self._settled:
                self._settle(ERROR, self._child.diagnostic(exc))
        except Exception as exc:  # a crash here must still resolve the result
            log.exception("acp run %s: turn failed", self._id)
            self._settle(ERROR, f"internal error: {exc!r}")
        finally:
            self._prompting = False

    def _settle(self, stop_reason: str, diagnostic: str | None = None) -> None:
        if self._settled:
            return
        text = "".join(self._output)
        output = [{"type": "text", "text": text}] if text else []
        self._resolve(SubagentResult(output=output, stop_reason=stop_reason, diagnostic=diagnostic))

    def _cancel(self, why: str) -> None:
        was_prompting = self._prompting and not self._settled
        self._settle(ABORTED, why)
        if was_prompting:
            self._child.conn.notify("session/cancel", {"sessionId": self.acp_session_id})

    def _on_abort(self, reason: Any) -> None:
        self._cancel(f"aborted by the request signal: {reason!r}")

    def _on_request(self, method: str, params: Any) -> Any:
        if method != "session/request_permission":
            raise MethodNotFound(method)
        decision: dict[str, Any] = {"outcome": "cancelled"}
        if self._child.config.permission == "allow" and not self._settled:
            options = params.get("options") if isinstance(params, dict) else None
            for option in options if isinstance(options, list) else []:
                kind = option.get("kind") if isinstance(option, dict) else None
                if isinstance(kind, str) and kind.startswith("allow"):
                    decision = {"outcome": "selected", "optionId": option.get("optionId")}
                    break
        tool_call = params.get("toolCall") if isinstance(params, dict) else None
        self._progress("permission", {"toolCall": tool_call, "outcome": decision})
        return {"outcome": decision}

    def _on_notification(self, method: str, params: Any) -> None:
        if method != "session/update" or not isinstance(params, dict):
            return
        if params.get("sessionId") != self.acp_session_id or not self._prompting:
            return
        update = params.get("update")
        if not isinstance(update, dict):
            return
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = update.get("content")
            if isinstance(content, dict) and content.get("type") == "text" and not self._settled:
                text = content.get("text")
                if isinstance(text, str):
                    self._output.append(text)
        elif kind in PROGRESS_KINDS:
            self._progress(str(kind), update)

    def _progress(self, kind: str, update: Any) -> None:
        if self._on_progress is None:
            return
        try:
            self._on_progress({"run_id": self._id, "kind": kind, "update": update})
        except Exception:
            log.exception("acp run %s: progress callback raised", self._id)

    def dispose(self) -> None:
        """Settle `aborted` (if still running) at once, then reap the whole process group.

        Idempotent; every caller returns only once no process of the group is left.
        """
        if not self._disposing:
            self._disposing = True
            self._remove_listener()
            self._cancel("the run was disposed")
            try:
                self._child.teardown(graceful=True)
                if self._turn is not None:
                    self._turn.join()
            finally:
                self._disposed.set()
        self._disposed.wait()


class AcpProvider:
    """Runs an external ACP agent per child. No `resume`: see `ResumableAcpProvider`."""

    def __init__(self, config: AcpConfig) -> None:
        if not isinstance(config, AcpConfig):
            raise TypeError(f"config must be an AcpConfig, got {type(config).__name__}")
        self.config = config

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def capabilities(self) -> SubagentCapabilities:
        return SubagentCapabilities()

    @property
    def inherits_parent_context(self) -> bool:
        return False

    def start(self, request: SubagentStartRequest) -> AcpRun:
        """Spawn, handshake, open a session and send the prompt; return the published run.

        Rejects (`ABORTED` or `START_FAILED`) only after the whole process group is reaped.
        """
        if request.continuation is not None:
            raise SubagentError(
                "UNSUPPORTED_CAPABILITY", "continuable children need ResumableAcpProvider"
            )
        run_id = _parent_scoped_id(request.parent)
        return self._establish(request.prompt, request.parent, request.signal, run_id, None)

    def _establish(
        self,
        prompt: Sequence[ContentBlock],
        parent: Any,
        signal: AbortSignal,
        run_id: str,
        load_session_id: str | None,
    ) -> AcpRun:
        if signal.aborted:
            raise SubagentError("ABORTED", f"the signal aborted before start: {signal.reason!r}")
        blocks = _text_prompt(prompt)
        cwd = self.config.cwd or _parent_cwd(parent)
        try:
            child = _Child(self.config, cwd)
        except OSError as exc:
            raise SubagentError(
                "START_FAILED", f"cannot spawn {self.config.command}: {exc}"
            ) from exc
        try:
            child.handshake(signal)
            params = session_params(cwd, parent, load_session_id)
            if load_session_id is None:
                reply = child.conn.request("session/new", params, signal=signal)
                sid = reply.get("sessionId") if isinstance(reply, dict) else None
                if not isinstance(sid, str) or not sid:
                    raise _StartFailure(f"session/new returned no string sessionId: {reply!r}")
            else:
                if not child.agent_capabilities.get("loadSession"):
                    raise _StartFailure("the agent does not advertise loadSession")
                child.conn.request("session/load", params, signal=signal)
                sid = load_session_id
        except RequestAborted as exc:
            child.teardown(graceful=False)
            raise SubagentError("ABORTED", f"aborted during start: {exc.reason!r}") from None
        except (_StartFailure, RpcError, ConnectionClosed) as exc:
            diagnostic = child.diagnostic(exc)
            child.teardown(graceful=False)
            raise SubagentError("START_FAILED", diagnostic) from None
        except BaseException:
            child.teardown(graceful=False)
            raise
        if signal.aborted:  # fired as the handshake finished: still before publication
            child.teardown(graceful=False)
            raise SubagentError("ABORTED", f"aborted during start: {signal.reason!r}")
        run = AcpRun(run_id, child, sid, signal, self.config.on_progress)
        run._begin(blocks)
        return run


class ResumableAcpProvider(AcpProvider):
    """An `AcpProvider` for an agent that advertises `loadSession`: adds cold `resume`.

    A continuable start publishes the service's child id as `run.id` and records the agent's ACP
    session id for it in `config.session_index`; `resume` loads that session and drives one turn.
    """

    def start(self, request: SubagentStartRequest) -> AcpRun:
        if request.continuation is None:
            run_id = _parent_scoped_id(request.parent)
            return self._establish(request.prompt, request.parent, request.signal, run_id, None)
        run_id = request.continuation.session_id
        run = self._establish(request.prompt, request.parent, request.signal, run_id, None)
        self.config.session_index[run_id] = run.acp_session_id
        return run

    def resume(self, request: SubagentResumeRequest) -> AcpRun:
        if request.signal.aborted:
            raise SubagentError(
                "ABORTED", f"the signal aborted before resume: {request.signal.reason!r}"
            )
        acp_session_id = self.config.session_index.get(request.session_id)
        if not isinstance(acp_session_id, str):
            raise SubagentError(
                "UNKNOWN_CHILD", f"no ACP session is recorded for {request.session_id!r}"
            )
        return self._establish(
            request.prompt, request.parent, request.signal, request.session_id, acp_session_id
        )


def discover_acp_provider(config: AcpConfig, *, cwd: str | None = None) -> AcpProvider:
    """Ask the agent (spawned once, then reaped) whether it advertises `loadSession`, and return a
    `ResumableAcpProvider` if it does, else a plain `AcpProvider`."""
    provider = AcpProvider(config)
    where = check_cwd(cwd or config.cwd or _process_cwd(), "cwd")
    try:
        child = _Child(config, where)
    except OSError as exc:
        raise SubagentError("START_FAILED", f"cannot spawn {config.command}: {exc}") from exc
    try:
        child.handshake(AbortSignal.never())
    except (_StartFailure, RpcError, ConnectionClosed) as exc:
        raise SubagentError("START_FAILED", child.diagnostic(exc)) from None
    finally:
        child.teardown(graceful=True)
    if child.agent_capabilities.get("loadSession") is True:
        return ResumableAcpProvider(config)
    return provider


def _process_cwd() -> str:
    import os

    return os.getcwd()
