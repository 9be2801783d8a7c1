"""The `acp` provider: any agent that speaks the Agent Client Protocol, run as a subagent.

The child is an external process (Codex, Claude Code, Gemini CLI, fast-agent through their ACP
adapters) driven over JSON-RPC on its stdin/stdout. It is a *remote* run: a fresh parent-scoped id,
no `local_agent`, no start-time capabilities, no inherited context.

Resume is a capability discovered with `isinstance(provider, Resumable)`. `AcpProvider` never has
it; `ResumableAcpProvider` (built directly when you know the agent advertises `loadSession`, or
picked by `discover_acp_provider`, which asks the agent) adds continuable children: each gets a
session log in the parent's store (`providers.acp_log`), so the continuation service lists,
continues, restarts and cold-resumes it (through `session/load`) like a local child.

Bounded and leak-free: each handshake request has a timeout, the process we started is watched
(a dead launcher ends the run even if its child holds stdout), the whole process group is reaped
on every path, and the kernel kills the agent if this process dies (`PR_SET_PDEATHSIG`).

Calls block the calling greenlet cooperatively (the providers-layer idiom); only `run.result` is
a future.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Unpack

import gevent
from gevent.event import Event

from agent import tracing
from agent.events import SessionHeader, SessionLogError
from agent.frames import MAX_FRAME
from agent.jsoncheck import repair_surrogates
from agent.store import SessionBusyError, SessionNotFoundError
from agent.usage import MAX_COUNT as MAX_USAGE_COUNT
from providers.acp_config import AcpConfig, AcpOverrides, ProgressCallback, check_cwd
from providers.acp_log import AcpRecord, ChildLog, SessionStoreLike, read_record
from providers.acp_process import ProcessGroup
from providers.acp_rpc import (
    ConnectionClosed,
    JsonRpcConnection,
    MethodNotFound,
    RequestAborted,
    RequestTimedOut,
    RpcError,
    StderrTail,
)
from providers.acp_text import quoted, short_text
from providers.errors import AgentProcessExited
from providers.remote_run import RemoteRun
from subagent.errors import SubagentError
from subagent.types import (
    ABORTED,
    COMPLETED,
    ERROR,
    MAX_TOKENS,
    REFUSAL,
    ContentBlock,
    MessageSource,
    SubagentCapabilities,
    SubagentResult,
    SubagentResumeRequest,
    SubagentStartRequest,
    child_depth,
    depth_of,
)
from supervision.group import TaskGroup
from supervision.signal import AbortSignal

__all__ = [
    "DEPTH_META",
    "MAX_OUTPUT_BYTES",
    "PROTOCOL_VERSION",
    "STOP_REASONS",
    "AcpConfig",
    "AcpProvider",
    "AcpRun",
    "AgentProcessExited",
    "ResumableAcpProvider",
    "discover_acp_provider",
    "provider_for_stored_child",
    "session_params",
]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1

# ACP stop reason -> seam stop reason; anything unlisted is an error. `cancelled` is `aborted`
# only when we cancelled (and then the run already settled `aborted`): an agent that ends its
# turn `cancelled` on its own, e.g. after a refused permission, ends `error` with a diagnostic.
STOP_REASONS: dict[str, str] = {
    "end_turn": COMPLETED,
    "max_tokens": MAX_TOKENS,
    "refusal": REFUSAL,
    "cancelled": ABORTED,
    "max_turn_requests": ERROR,
}

# Which `session/request_permission` option each policy picks, in order of preference.
_PERMISSION_PREFERENCE: dict[str, tuple[str, ...]] = {
    "allow": ("allow_once", "allow_always"),
    "reject": ("reject_once", "reject_always"),
}

# The most answer a run keeps, in UTF-8 bytes: what one session-log frame holds (`MAX_FRAME`),
# less room for the event around it. More could never reach the parent (its tool result, or the
# settlement notice of a continuable child, is refused by the log) nor the child's own log, and
# an agent streaming without end would otherwise fill this process's memory; past it the run
# ends `error` and the agent is reaped. (It counted characters once: 64 Mi of them in a
# three-byte script made a 192 MiB event no log takes, and the child's turn went unrecorded.)
MAX_OUTPUT_BYTES = MAX_FRAME - 1024 * 1024

# How many refused tool calls a diagnostic names (the rest are counted).
_REFUSED_NAMED = 5

_SURROGATE = re.compile("[\ud800-\udfff]")

PROGRESS_KINDS = frozenset({"tool_call", "tool_call_update", "agent_thought_chunk", "plan"})

_CLIENT_CAPABILITIES = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}


def _text_prompt(prompt: Sequence[ContentBlock]) -> list[dict[str, Any]]:
    """The prompt as the text blocks ACP sends, lone surrogates repaired to U+FFFD as everywhere
    in the runtime (docs/decisions.md): the wire is UTF-8 JSON and cannot carry them."""
    blocks: list[dict[str, Any]] = []
    for block in prompt:
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise SubagentError(
                "START_FAILED",
                f"the acp provider sends text blocks only, got {block.get('type')!r}",
            )
        blocks.append({"type": "text", "text": repair_surrogates(block["text"])})
    return blocks


def _parent_cwd(parent: object) -> str:
    try:
        return check_cwd(getattr(parent, "cwd", None), "parent cwd")
    except ValueError as exc:
        raise SubagentError("START_FAILED", str(exc)) from None


# `_meta` key of session/new and session/load: the delegation depth the agent's session starts
# at (the parent's depth + 1). A runtime served with `subagent acp` starts its coordinator there,
# so the depth cap holds across the process boundary; other agents ignore the key.
DEPTH_META = "subagent-runtime/depth"


def session_params(
    cwd: str,
    parent: object,
    trace: tracing.TraceParent | None = None,
    *,
    depth: int | None = None,
) -> dict[str, Any]:
    """The params of `session/new` (and, with a `sessionId`, `session/load`): built in one place
    so per-parent metadata (`_meta`: the delegation depth, the trace context) reaches both.

    `depth` is the child's, as the service computed it for a start; a resume (or a direct call)
    leaves it None and the parent's depth + 1 is sent."""
    params: dict[str, Any] = {"cwd": cwd, "mcpServers": []}
    if depth is None:
        parent_depth = getattr(parent, "depth", None)
        if isinstance(parent_depth, int) and not isinstance(parent_depth, bool):
            depth = child_depth(parent)
    if depth is not None:
        params["_meta"] = {DEPTH_META: depth}
    # The W3C trace context of this activation (docs/tracing.md): the agent's spans join it.
    meta = tracing.carrier(trace)
    if meta:
        params["_meta"] = {**params.get("_meta", {}), **meta}
    return params


def _choose_permission(policy: str, params: object) -> dict[str, Any]:
    """The outcome for a permission request: the policy's preferred option the agent offers.

    `reject` answers with the agent's own reject option (`cancelled` is reserved for a cancelled
    turn, and an agent may take it as one); only when none is offered does it answer `cancelled`.
    `allow` falls back to a reject option when the agent offers no allow option.
    """
    options = params.get("options") if isinstance(params, dict) else None
    by_kind: dict[str, Any] = {}
    for option in options if isinstance(options, list) else []:
        if isinstance(option, dict) and isinstance(option.get("kind"), str):
            by_kind.setdefault(option["kind"], option.get("optionId"))
    preference = _PERMISSION_PREFERENCE[policy]
    if policy == "allow":
        preference += _PERMISSION_PREFERENCE["reject"]
    for kind in preference:
        if by_kind.get(kind) is not None:
            return {"outcome": "selected", "optionId": by_kind[kind], "kind": kind}
    return {"outcome": "cancelled"}


def _parent_scoped_id(parent: object) -> str:
    sid = getattr(parent, "session_id", None)
    token = secrets.token_hex(8)
    return f"{sid}.acp-{token}" if isinstance(sid, str) and sid else f"acp-{token}"


class _TextBuffer:
    """An answer's text, chunk after chunk, in memory close to the text's own.

    A list of the chunks costs some 60 bytes of string object per chunk, so a flood of
    one-character chunks took 60 times the memory of its text, far past what
    `MAX_OUTPUT_BYTES` means to bound; `io.StringIO` (before Python 3.12) keeps up to 100,000
    small strings before it joins them. Here every `_JOIN_EVERY` chunks are joined into one.
    """

    _JOIN_EVERY = 256

    def __init__(self) -> None:
        self._parts: list[str] = []
        self._recent: list[str] = []

    def write(self, text: str) -> None:
        recent = self._recent
        recent.append(text)
        if len(recent) >= self._JOIN_EVERY:
            self._parts.append("".join(recent))
            recent.clear()

    def text(self) -> str:
        return "".join(self._parts) + "".join(self._recent)


class _Child:
    """The spawned agent: its process group, JSON-RPC connection and stderr drain."""

    def __init__(self, config: AcpConfig, cwd: str) -> None:
        self.config = config
        self.group = ProcessGroup((config.command, *config.args), cwd=cwd, env=config.environment())
        self.stderr = StderrTail(self.group.stderr)
        self.request_handler: Callable[[str, Any], Any] = self._no_run_request
        self.notification_handler: Callable[[str, Any], None] = lambda _m, _p: None
        self.conn = JsonRpcConnection(
            self.group.stdin,
            self.group.stdout,
            on_request=lambda m, p: self.request_handler(m, p),
            on_notification=lambda m, p: self.notification_handler(m, p),
            max_line_bytes=config.max_line_bytes,
            name=f"{config.name}[{self.group.pid}]",
        )
        self.agent_capabilities: dict[str, Any] = {}
        self._teardown: gevent.Greenlet | None = None
        # The leader watcher and the teardown; the teardown ends the watcher (close spares it).
        self._tasks = TaskGroup(f"acp-child:{config.name}")
        # Watches the process we started: a launcher's death must end the run even when a
        # descendant it left behind still holds stdout open.
        self._tasks.spawn(self._watch_leader)

    @staticmethod
    def _no_run_request(method: str, _params: object) -> dict[str, Any]:
        if method == "session/request_permission":
            return {"outcome": {"outcome": "cancelled"}}  # no turn is running
        raise MethodNotFound(method)

    def _watch_leader(self) -> None:
        """When the leader exits: drain what it wrote, close the connection, reap the group."""
        self.group.wait_leader(None)
        # The agent's last words (a final update, its answer) may still be in the pipe.
        self.conn.closed.wait(timeout=self.config.exit_drain)
        if self.conn.failure is None:
            self.conn.shutdown("the agent process exited")
        if self._teardown is None:
            self._teardown = self._tasks.spawn(self._do_teardown, False)

    def request(self, method: str, params: object, signal: AbortSignal) -> object:
        """A handshake-phase request, bounded by `handshake_timeout`."""
        return self.conn.request(
            method, params, signal=signal, timeout=self.config.handshake_timeout
        )

    def handshake(self, signal: AbortSignal) -> None:
        result = self.request(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": _CLIENT_CAPABILITIES,
                "clientInfo": {"name": "subagent-runtime", "version": "0.1.0"},
            },
            signal,
        )
        if not isinstance(result, dict):
            raise _StartFailure(f"initialize returned {quoted(result)}, not an object")
        version = result.get("protocolVersion")
        if version != PROTOCOL_VERSION:
            raise _StartFailure(f"the agent speaks ACP protocol {quoted(version)}, not 1")
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
            self._teardown = self._tasks.spawn(self._do_teardown, graceful)
        self._teardown.get()  # re-raises a teardown fault in every caller

    def _do_teardown(self, graceful: bool) -> None:
        self.conn.close_input()
        self.group.terminate(
            self.config.eof_grace if graceful else None, self.config.terminate_grace
        )
        self._tasks.close()  # the watcher, unless it is the one tearing down
        self.conn.shutdown("the agent process was torn down")
        self.stderr.close(grace=1.0)
        with contextlib.suppress(OSError, ValueError):
            self.group.stderr.close()


class _StartFailure(Exception):
    pass


class AcpRun(RemoteRun):
    """One prompt turn of an external ACP agent; always `dispose()`.

    `result` never fails for a one-shot run. A continuable activation (one with a child log)
    faults with `AgentProcessExited` when its agent dies mid-turn, so the continuation service
    restarts it; every other ending is a result, recorded in the child's log first.
    """

    def __init__(
        self,
        run_id: str,
        child: _Child,
        session_id: str,
        signal: AbortSignal,
        on_progress: ProgressCallback | None,
        log: ChildLog | None = None,
    ) -> None:
        super().__init__(run_id)
        self._child = child
        self.acp_session_id = session_id
        self._on_progress = on_progress
        self._log = log
        # A continuable activation whose agent process dies is a crash (restarted by the
        # continuation service); a one-shot run ends `error`.
        self._crash_is_fault = log is not None
        self._output = _TextBuffer()
        self._surrogates = False  # whether a chunk held a lone surrogate half
        self._output_bytes = 0
        # What the agent reported spending (agent.usage keys), if it reports anything: the
        # prompt response's `usage` (ACP, unstable), and the session's cumulative cost from
        # `usage_update` notifications.
        self._usage: dict[str, int] = {}
        self._cost: dict[str, Any] | None = None
        # The tool calls the agent was refused permission for: how many, and the first few
        # titles (cleaned and cut) that the diagnostic names.
        self._refused: list[str] = []
        self._refusals = 0
        self._prompting = False
        self._disposed = Event()
        self._disposing = False
        child.request_handler = self._on_request
        child.notification_handler = self._on_notification
        self._turn: gevent.Greenlet | None = None
        self._tasks = TaskGroup(f"acp-run:{run_id}")  # the turn; dispose joins it
        self._remove_listener = signal.add_listener(self._on_abort)

    @property
    def pid(self) -> int:
        """The process-group leader's pid (the group id too)."""
        return self._child.group.pid

    def begin(self, prompt: list[dict[str, Any]]) -> None:
        """Send the prompt turn (once, right after the provider built the run)."""
        self._prompting = True
        self._turn = self._tasks.spawn(self._run_turn, prompt)

    def _run_turn(self, prompt: list[dict[str, Any]]) -> None:
        try:
            reply = self._child.conn.request(
                "session/prompt",
                {"sessionId": self.acp_session_id, "prompt": prompt},
                on_answer=self._answered,
            )
            stop = reply.get("stopReason") if isinstance(reply, dict) else None
            if isinstance(reply, dict):
                self._usage = acp_usage(reply.get("usage"))
            mapped = STOP_REASONS.get(stop, ERROR) if isinstance(stop, str) else ERROR
            diagnostic = None
            if mapped == ABORTED:  # we did not cancel: we would have settled already
                mapped = ERROR
                diagnostic = "the agent ended its turn cancelled, though nobody cancelled it"
                if self._refusals:
                    diagnostic += f"; it was refused permission for: {self._refused_titles()}"
            elif mapped == ERROR:
                diagnostic = f"the agent ended its turn with stop reason {quoted(stop)}"
            self._settle(mapped, diagnostic)
        except RpcError as exc:
            self._settle(ERROR, self._child.diagnostic(exc))
        except ConnectionClosed as exc:
            if not self._settled:
                diagnostic = self._child.diagnostic(exc)
                if self._crash_is_fault and not exc.protocol_error:
                    self._crash(diagnostic)
                else:
                    self._settle(ERROR, diagnostic)
            # Nobody reads the agent any more (it wrote a bad line, or closed its stdout and
            # may live on): reap it now rather than at `dispose`, which a holder of the handle
            # may call late (it still waits for this teardown, and is the one told if it
            # failed). A teardown already under way (dispose, the leader's exit) is joined.
            try:
                self._child.teardown(graceful=False)
            except Exception:
                log.warning("acp run %s: reaping the agent failed", self._id, exc_info=True)
        except Exception as exc:  # a crash here must still resolve the result
            log.debug("acp run %s: turn failed", self._id, exc_info=True)  # a result: debug
            self._settle(ERROR, f"internal error: {exc!r}")
        finally:
            self._prompting = False

    def _answered(self) -> None:
        """The agent answered `session/prompt`: its turn is over, and what it streams after
        the answer (ACP has it send every update before) is no part of it."""
        self._prompting = False

    def _settle(self, stop_reason: str, diagnostic: str | None = None) -> None:
        if self._settled:
            return
        text = self._output_text()
        output = [{"type": "text", "text": text}] if text else []
        self._record(output, stop_reason, diagnostic)
        extra: dict[str, Any] = {}
        if self._usage:
            extra["usage"] = dict(self._usage)
        if self._cost is not None:
            extra["acp_cost"] = dict(self._cost)
        self._resolve(
            SubagentResult(
                output=output, stop_reason=stop_reason, diagnostic=diagnostic, extra=extra
            )
        )

    def _output_text(self) -> str:
        """The answer so far, lone surrogates (an agent's JSON `\\ud800` escapes) repaired to
        U+FFFD as everywhere in the runtime: no log, wire or terminal can carry them."""
        text = self._output.text()
        return repair_surrogates(text) if self._surrogates else text

    def _crash(self, diagnostic: str) -> None:
        if self._settled:
            return
        text = self._output_text()
        self._record([{"type": "text", "text": text}] if text else [], ERROR, diagnostic)
        # `diagnostic` waited for the agent to be reaped: one still running only hung up.
        what = "died" if self._child.group.returncode is not None else "hung up, still running,"
        self._fault(AgentProcessExited(f"the ACP agent process {what} mid-turn: {diagnostic}"))

    def _record(
        self, output: list[dict[str, Any]], stop_reason: str, diagnostic: str | None
    ) -> None:
        """End the activation's turn in the child's log (continuable runs only), before settling:
        whoever sees the result may resume the child at once."""
        if self._log is None:
            return
        try:
            self._log.finish(output, stop_reason, diagnostic, usage=self._usage)
        except Exception:
            log.exception("acp run %s: recording the turn's end failed", self._id)

    def _cancel(self, why: str) -> None:
        was_prompting = self._prompting and not self._settled
        self._settle(ABORTED, why)
        if was_prompting:
            self._child.conn.notify("session/cancel", {"sessionId": self.acp_session_id})

    def _on_abort(self, reason: object) -> None:
        self._cancel(f"aborted by the request signal: {reason!r}")

    def _on_request(self, method: str, params: object) -> dict[str, Any]:
        if method != "session/request_permission":
            raise MethodNotFound(method)
        if self._settled:
            # The turn was cancelled (ACP's answer for that is `cancelled`) or has ended: the
            # run's story is told, nothing of it is reported or counted any more.
            return {"outcome": {"outcome": "cancelled"}}
        decision = _choose_permission(self._child.config.permission, params)
        kind = decision.pop("kind", None)
        tool_call = params.get("toolCall") if isinstance(params, dict) else None
        if not (isinstance(kind, str) and kind.startswith("allow")):
            title = tool_call.get("title") if isinstance(tool_call, dict) else None
            self._refusals += 1
            if len(self._refused) < _REFUSED_NAMED:
                self._refused.append(short_text(title) if isinstance(title, str) else "")
        self._progress("permission", {"toolCall": tool_call, "outcome": decision, "kind": kind})
        return {"outcome": decision}

    def _refused_titles(self) -> str:
        names = ", ".join(title or "a tool call" for title in self._refused)
        more = self._refusals - len(self._refused)
        return f"{names} and {more:,} more" if more else names

    def _on_notification(self, method: str, params: object) -> None:
        if method != "session/update" or not isinstance(params, dict):
            return
        if params.get("sessionId") != self.acp_session_id or not self._prompting:
            return
        if self._settled:
            # Cancelled, disposed or past its bound: what the agent still streams until it is
            # reaped is no progress of a run that has ended (nor output of it).
            return
        update = params.get("update")
        if not isinstance(update, dict):
            return
        kind = update.get("sessionUpdate")
        if kind == "agent_message_chunk":
            content = update.get("content")
            if isinstance(content, dict) and content.get("type") == "text":
                text = content.get("text")
                if isinstance(text, str) and text:
                    # `isascii` reads a flag: an ASCII chunk is its length in bytes and holds no
                    # surrogate. Otherwise both are checked here, per chunk, so a huge answer is
                    # not walked again at the end (then repaired whole, so a pair split across
                    # two chunks still becomes its character; a lone half and U+FFFD are both
                    # three bytes).
                    if text.isascii():
                        size = len(text)
                    else:
                        size = len(text.encode("utf-8", "surrogatepass"))
                        if _SURROGATE.search(text) is not None:
                            self._surrogates = True
                    self._output_bytes += size
                    if self._output_bytes > MAX_OUTPUT_BYTES:
                        self._overflow()
                        return
                    self._output.write(text)
        elif kind == "usage_update":
            cost = acp_cost(update.get("cost"))
            if cost is not None:
                self._cost = cost
            self._progress("usage_update", update)
        elif kind in PROGRESS_KINDS:
            self._progress(str(kind), update)

    def _overflow(self) -> None:
        """The answer passed `MAX_OUTPUT_BYTES`: end the run `error` and reap the agent (off the
        reader greenlet, which is telling us this and must not wait)."""
        self._settle(
            ERROR,
            f"the agent's answer exceeds {MAX_OUTPUT_BYTES:,} bytes (UTF-8); the run was ended",
        )
        self._child.conn.notify("session/cancel", {"sessionId": self.acp_session_id})
        self._tasks.spawn(self._reap)

    def _reap(self) -> None:
        try:
            self._child.teardown(graceful=False)
        except Exception:
            log.warning("acp run %s: reaping the agent failed", self._id, exc_info=True)

    def _progress(self, kind: str, update: object) -> None:
        if self._on_progress is None:
            return
        try:
            self._on_progress({"run_id": self._id, "kind": kind, "update": update})
        except Exception:
            log.exception("acp run %s: progress callback raised", self._id)

    def cancel(self, cause: object = None) -> None:
        """Cancel the turn (a parent's cancel, an ancestor's interrupt): settle `aborted` with
        the cause as its diagnostic, ask the agent to stop (`session/cancel`) and reap it off
        the caller's greenlet, as `dispose` would: a cancelled turn leaves no agent running.
        Without this method the run's actor disposed the run, whose diagnostic then read "the
        run was disposed" whatever the cancel's cause."""
        if self._settled or self._disposing:
            return
        self._cancel("cancelled" if cause is None else str(cause))
        self._tasks.spawn(self._reap)

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
                self._tasks.join()  # the turn ends on the torn-down connection
            finally:
                self._tasks.close()
                if self._log is not None and not self._log.closed:  # never settled normally
                    self._record([], ABORTED, "the run was disposed")
                self._disposed.set()
        self._disposed.wait()


class AcpProvider:
    """Runs an external ACP agent per child. No `resume`: see `ResumableAcpProvider`."""

    # The child runs in another process: its activation span is a CLIENT (docs/tracing.md).
    remote_process = True

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
        return self._establish(
            request.prompt,
            request.parent,
            request.signal,
            run_id,
            trace=request.trace,
            depth=request.depth,
        )

    def _establish(
        self,
        prompt: Sequence[ContentBlock],
        parent: object,
        signal: AbortSignal,
        run_id: str,
        *,
        cwd: str | None = None,
        load_session_id: str | None = None,
        record_log: Callable[[str, str, list[dict[str, Any]]], ChildLog] | None = None,
        trace: tracing.TraceParent | None = None,
        depth: int | None = None,
    ) -> AcpRun:
        """Spawn and handshake, open (`session/new`) or load (`session/load`) the ACP session,
        let `record_log(cwd, acp session id, prompt)` record the activation, start the turn.

        Every failure reaps the process group before it raises.
        """
        if signal.aborted:
            raise SubagentError("ABORTED", f"the signal aborted before start: {signal.reason!r}")
        blocks = _text_prompt(prompt)
        cwd = cwd or self.config.cwd or _parent_cwd(parent)
        try:
            child = _Child(self.config, cwd)
        except OSError as exc:
            raise SubagentError(
                "START_FAILED", f"cannot spawn {self.config.command}: {exc}"
            ) from exc
        child_log: ChildLog | None = None
        try:
            child.handshake(signal)
            params = session_params(cwd, parent, trace, depth=depth)
            if load_session_id is None:
                reply = child.request("session/new", params, signal)
                sid = reply.get("sessionId") if isinstance(reply, dict) else None
                if not isinstance(sid, str) or not sid:
                    raise _StartFailure(
                        f"session/new returned no string sessionId: {quoted(reply)}"
                    )
            else:
                if not child.agent_capabilities.get("loadSession"):
                    raise _StartFailure("the agent does not advertise loadSession")
                child.request("session/load", {**params, "sessionId": load_session_id}, signal)
                sid = load_session_id
            if signal.aborted:  # fired as the handshake finished: still before publication
                raise RequestAborted(signal.reason)
            if record_log is not None:
                child_log = record_log(cwd, sid, blocks)
        except RequestAborted as exc:
            child.teardown(graceful=False)
            raise SubagentError("ABORTED", f"aborted during start: {exc.reason!r}") from None
        except RequestTimedOut as exc:
            diagnostic = child.diagnostic(_StartFailure(f"{exc} (handshake_timeout)"))
            child.teardown(graceful=False)
            raise SubagentError("START_FAILED", diagnostic) from None
        except (_StartFailure, RpcError, ConnectionClosed) as exc:
            diagnostic = child.diagnostic(exc)
            child.teardown(graceful=False)
            raise SubagentError("START_FAILED", diagnostic) from None
        except BaseException:
            child.teardown(graceful=False)
            raise
        run = AcpRun(run_id, child, sid, signal, self.config.on_progress, child_log)
        run.begin(blocks)
        return run


class ResumableAcpProvider(AcpProvider):
    """An `AcpProvider` for an agent that advertises `loadSession`: adds cold `resume`.

    A continuable start publishes the service's child id as `run.id` and gives the child a
    session log in the parent's store (header, descriptor, ACP record, one turn per activation),
    so the continuation service lists, continues, restarts and cold-resumes it like a local
    child; the ACP session id is also kept in `config.session_index`. `resume` loads that
    session (`session/load`) and drives one turn.
    """

    def start(self, request: SubagentStartRequest) -> AcpRun:
        continuation = request.continuation
        parent = request.parent
        if continuation is None:
            run_id = _parent_scoped_id(parent)
            return self._establish(
                request.prompt,
                parent,
                request.signal,
                run_id,
                trace=request.trace,
                depth=request.depth,
            )
        run_id = continuation.session_id
        depth = request.depth  # None on a direct call: session_params then asks the parent
        store = _store_of(parent)
        descriptor = continuation.descriptor
        record_log = None
        if store is not None and descriptor is not None:
            data = descriptor if isinstance(descriptor, Mapping) else descriptor.to_json()
            source = MessageSource.coordinator(parent.id).to_json()

            def record_log(cwd: str, sid: str, blocks: list[dict[str, Any]]) -> ChildLog:
                header = SessionHeader(
                    id=run_id,
                    cwd=cwd,
                    parent_session=parent.id,
                    origin="subagent",
                    delegation_depth=depth_of(request),
                )
                record = self._record(sid, cwd)
                # The first activation's traceparent: a resumed activation links to it.
                first = tracing.carrier(request.trace)
                return ChildLog.create(store, header, blocks, source, data, record, first)

        run = self._establish(
            request.prompt,
            parent,
            request.signal,
            run_id,
            record_log=record_log,
            trace=request.trace,
            depth=depth,
        )
        self.config.session_index[run_id] = run.acp_session_id
        return run

    def _record(self, acp_session_id: str, cwd: str) -> AcpRecord:
        config = self.config
        return AcpRecord(
            provider=config.name,
            command=config.command,
            args=tuple(config.args),
            pass_env=tuple(config.pass_env),
            acp_session_id=acp_session_id,
            cwd=cwd,
        )

    def resume(self, request: SubagentResumeRequest) -> AcpRun:
        if request.signal.aborted:
            raise SubagentError(
                "ABORTED", f"the signal aborted before resume: {request.signal.reason!r}"
            )
        child_id = request.session_id
        store = _store_of(request.parent)
        record = _stored_record(store, child_id) if store is not None else None
        if record is not None:
            acp_session_id: Any = record.acp_session_id
            cwd: str | None = record.cwd
            if not os.path.isdir(record.cwd):
                raise SubagentError(
                    "START_FAILED", f"the child's recorded cwd {record.cwd!r} is gone"
                )
        else:
            acp_session_id = self.config.session_index.get(child_id)
            cwd = None
        if not isinstance(acp_session_id, str):
            raise SubagentError("UNKNOWN_CHILD", f"no ACP session is recorded for {child_id!r}")
        if record is None or store is None:  # a raw resume without a store: nothing to record
            return self._establish(
                request.prompt,
                request.parent,
                request.signal,
                child_id,
                load_session_id=acp_session_id,
                trace=request.trace,
            )
        # Held before the agent starts: a second activation (here or in another process) is
        # refused before it could load the same ACP session twice.
        try:
            held = ChildLog.acquire(store, child_id)
        except SessionBusyError:
            raise SubagentError(
                "START_FAILED", f"child {child_id!r} is already active (its log is open)"
            ) from None
        source = request.source.to_json()

        def record_log(_cwd: str, _sid: str, blocks: list[dict[str, Any]]) -> ChildLog:
            held.begin(blocks, source)
            return held

        try:
            return self._establish(
                request.prompt,
                request.parent,
                request.signal,
                child_id,
                cwd=cwd,
                load_session_id=acp_session_id,
                record_log=record_log,
                trace=request.trace,
            )
        except BaseException:
            held.release()
            raise


def _store_of(parent: object) -> SessionStoreLike | None:
    """The parent's session store when it is a real agent (a bare test parent has none)."""
    ctx = getattr(parent, "ctx", None)
    store = getattr(ctx, "store", None)
    return store if callable(getattr(store, "create", None)) else None


def _stored_record(store: SessionStoreLike, child_id: str) -> AcpRecord | None:
    try:
        return read_record(store, child_id)
    except (SessionNotFoundError, KeyError):
        return None
    except (SessionLogError, OSError, ValueError) as exc:
        raise SubagentError(
            "NOT_RESUMABLE", f"the ACP record of child {child_id!r} cannot be read: {exc}"
        ) from exc


def provider_for_stored_child(
    store: SessionStoreLike,
    child_id: str,
    *,
    pass_env: Sequence[str] = (),
    **overrides: Unpack[AcpOverrides],
) -> ResumableAcpProvider | None:
    """A provider that reaches a stored continuable ACP child again, from its ACP record: same
    name, command, arguments and passed-through variable names (plus `pass_env`). None when the
    child is not an ACP child. For a process that did not start the child (`subagent send`)."""
    record = _stored_record(store, child_id)
    if record is None:
        return None
    try:
        config = AcpConfig(
            name=record.provider,
            command=record.command,
            args=record.args,
            pass_env=tuple(dict.fromkeys((*record.pass_env, *pass_env))),
            **overrides,
        )
    except ValueError as exc:
        raise SubagentError(
            "NOT_RESUMABLE", f"child {child_id!r}: the recorded ACP agent cannot run: {exc}"
        ) from exc
    return ResumableAcpProvider(config)


def discover_acp_provider(
    config: AcpConfig, *, cwd: str | None = None, signal: AbortSignal | None = None
) -> AcpProvider:
    """Ask the agent (spawned once, then reaped) whether it advertises `loadSession`, and return a
    `ResumableAcpProvider` if it does, else a plain `AcpProvider`.

    Bounded by `config.handshake_timeout` (`START_FAILED`) and by `signal` (`ABORTED`).
    """
    signal = signal or AbortSignal.never()
    if signal.aborted:
        raise SubagentError("ABORTED", f"the signal aborted before discovery: {signal.reason!r}")
    provider = AcpProvider(config)
    where = check_cwd(cwd or config.cwd or os.getcwd(), "cwd")
    try:
        child = _Child(config, where)
    except OSError as exc:
        raise SubagentError("START_FAILED", f"cannot spawn {config.command}: {exc}") from exc
    try:
        child.handshake(signal)
    except RequestAborted as exc:
        raise SubagentError("ABORTED", f"aborted during discovery: {exc.reason!r}") from None
    except RequestTimedOut as exc:
        failure = _StartFailure(f"{exc} (handshake_timeout)")
        raise SubagentError("START_FAILED", child.diagnostic(failure)) from None
    except (_StartFailure, RpcError, ConnectionClosed) as exc:
        raise SubagentError("START_FAILED", child.diagnostic(exc)) from None
    finally:
        child.teardown(graceful=not signal.aborted)
    if child.agent_capabilities.get("loadSession") is True:
        return ResumableAcpProvider(config)
    return provider


# ACP's (unstable) `PromptResponse.usage` keys -> ours (agent.usage).
_ACP_USAGE_KEYS = (
    ("inputTokens", "input_tokens"),
    ("outputTokens", "output_tokens"),
    ("cachedReadTokens", "cache_read_input_tokens"),
    ("cachedWriteTokens", "cache_creation_input_tokens"),
)


def acp_usage(raw: object) -> dict[str, int]:
    """An ACP prompt response's `usage` in our shape; `{}` when absent or malformed.

    ACP counts reasoning as `thoughtTokens` beside `outputTokens` and may count cached input
    inside `inputTokens`; whatever `totalTokens` holds beyond the mapped kinds is counted as
    output, so our total equals the agent's.

    A count the session log cannot carry (beyond `agent.usage.MAX_COUNT`, 2**64-1) is no count
    any turn spent: it is dropped like any malformed one, so an agent's absurd report neither
    loses the child's log record nor fails the parent's accounting."""
    if not isinstance(raw, dict):
        return {}
    out: dict[str, int] = {}
    for theirs, ours in _ACP_USAGE_KEYS:
        value = raw.get(theirs)
        if type(value) is int and 0 <= value <= MAX_USAGE_COUNT:
            out[ours] = value
    if not out:
        return {}
    total = raw.get("totalTokens")
    if type(total) is int and sum(out.values()) < total <= MAX_USAGE_COUNT:
        out["output_tokens"] = out.get("output_tokens", 0) + total - sum(out.values())
    return out


def acp_cost(raw: object) -> dict[str, Any] | None:
    """A `usage_update`'s `cost` (`{"amount", "currency"}`) as reported, or None when it is
    malformed: an amount that is no finite, non-negative number (a bool, `1e400` read as
    infinity, an int beyond a float's exact range), or a currency that is no short printable
    name."""
    if not isinstance(raw, dict):
        return None
    amount, currency = raw.get("amount"), raw.get("currency")
    if type(amount) is int:
        if not 0 <= amount <= 2**53:
            return None
    elif type(amount) is not float or not (math.isfinite(amount) and amount >= 0):
        return None
    if not isinstance(currency, str) or not 0 < len(currency) <= 16:
        return None
    if not currency.isprintable():
        return None
    return {"amount": amount, "currency": currency}
