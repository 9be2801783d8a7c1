"""An ACP agent built on the official `agent-client-protocol` SDK, for the provider's tests.

`python sdk_agent.py MODE`; each mode is one behaviour the client must survive:

- normal: thought, plan, tool call, then `echo: <prompt>`; a prompt `stop:<reason>` ends the turn
  with that ACP stop reason instead, `env:<NAME>` answers that variable's value. Advertises
  `loadSession`; `session/load` replays history first. With $ACP_PEER_STATE naming a directory,
  sessions persist there (as a real agent's do), so another process can `session/load` them:
  `recall` answers `recalled: <earlier prompts, joined by " | ">`, `crash` exits 3 mid-turn,
  `hang` reports `hanging` and never ends its turn. `usage` reports a `usage_update` (context
  100/1000, cost 0.25 USD) and ends its turn with (unstable) usage: 100 input, 20 output,
  5 thought, 30 cache read, 155 in total.

When $ACP_PEER_NOTIFY names a unix socket, the peer connects at start-up and reports lines there
(`pid <pid>`, `new_session`, `grandchild <pid>`) so tests synchronise on events, not sleeps.
- permission: asks `session/request_permission` and reports the outcome it got.
- unknown: calls `fs/read_text_file` and an extension method it was never offered.
- wait: waits for `session/cancel`, then ends `cancelled`. Writes $ACP_PEER_MARKER on cancel.
- ignore_cancel: never ends its turn, ignores `session/cancel`.
- stubborn: like ignore_cancel, but also ignores SIGTERM and stdin EOF, and forks a grandchild
  that ignores SIGTERM (the case that leaves orphans when only the leader is signalled).
- crash: sends a chunk, writes to stderr, exits 3 mid-turn.
- slow_new: never answers `session/new`.
- no_session_id: answers `session/new` without a sessionId.
- stderr_spam: writes megabytes to stderr before answering.
- garbage: writes a non-JSON line to stdout mid-turn.
- huge_line: sends one agent_message_chunk larger than the client's line limit.
- big_number: writes a valid JSON-RPC notification holding a 5,000-digit number mid-turn.
- flood_output: streams 72 MiB of answer in 1 MiB chunks, then never ends its turn.
- escape_garbage: writes a non-JSON line with terminal escapes and rich markup mid-turn.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from typing import Any

import acp
from acp import (
    InitializeResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PromptResponse,
    plan_entry,
    start_tool_call,
    update_agent_message_text,
    update_agent_thought_text,
    update_plan,
    update_user_message_text,
)
from acp.schema import (
    AgentCapabilities,
    Cost,
    PermissionOption,
    ToolCallUpdate,
    Usage,
    UsageUpdate,
)

MODE = sys.argv[1] if len(sys.argv) > 1 else "normal"
KNOWN_STOP_REASONS = {"end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"}
_notify: socket.socket | None = None


def report(line: str) -> None:
    """Tell the test what happened (a unix socket write: instant, fine to do synchronously)."""
    global _notify
    path = os.environ.get("ACP_PEER_NOTIFY")
    if not path:
        return
    if _notify is None:
        _notify = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _notify.connect(path)
    _notify.sendall(line.encode() + b"\n")


def _state_file(session_id: str) -> str | None:
    state = os.environ.get("ACP_PEER_STATE")
    if not state:
        return None
    return os.path.join(state, hashlib.sha256(session_id.encode()).hexdigest()[:16] + ".json")


def load_history(session_id: str) -> list[str] | None:
    """The session's earlier prompts, or None when it was never stored."""
    path = _state_file(session_id)
    if path is None or not os.path.exists(path):
        return None
    with open(path) as f:
        history: list[str] = json.load(f)
    return history


def save_history(session_id: str, history: list[str]) -> None:
    path = _state_file(session_id)
    if path is not None:
        with open(path, "w") as f:
            json.dump(history, f)


class PeerAgent:
    def __init__(self) -> None:
        self.conn: Any = None
        self.cancelled = asyncio.Event()
        self.grandchild: subprocess.Popen[bytes] | None = None

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    async def initialize(self, protocol_version: int, **kwargs: Any) -> InitializeResponse:
        caps = AgentCapabilities(load_session=MODE == "normal")
        return InitializeResponse(protocol_version=1, agent_capabilities=caps)

    async def new_session(self, cwd: str, **kwargs: Any) -> Any:
        report("new_session")
        if MODE == "slow_new":
            await asyncio.sleep(3600)
        if MODE == "no_session_id":
            return {}
        if MODE == "stubborn":
            self.grandchild = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import signal, time\n"
                    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                    "time.sleep(3600)\n",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            report(f"grandchild {self.grandchild.pid}")
        session_id = f"sess-{uuid.uuid4().hex[:8]}:{cwd}"
        save_history(session_id, [])
        return NewSessionResponse(session_id=session_id)

    async def load_session(self, cwd: str, session_id: str, **kwargs: Any) -> LoadSessionResponse:
        report(f"load_session {session_id}")
        if _state_file(session_id) is None:
            history = ["old prompt"]
        else:
            stored = load_history(session_id)
            if stored is None:
                raise acp.RequestError.invalid_params({"sessionId": "unknown session"})
            history = stored
        for said in history:
            await self.conn.session_update(session_id, update_user_message_text(said))
            await self.conn.session_update(session_id, update_agent_message_text("old answer"))
        return LoadSessionResponse()

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        marker = os.environ.get("ACP_PEER_MARKER")
        if marker:
            with open(marker, "w") as f:
                f.write("cancelled")
        self.cancelled.set()

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        text = "".join(getattr(block, "text", "") for block in prompt)
        say = self.say(session_id)
        if MODE == "normal":
            history = load_history(session_id)
            if history is not None:
                save_history(session_id, [*history, text])
            if text == "recall":
                await say(f"recalled: {' | '.join(history or [])}")
                return PromptResponse(stop_reason="end_turn")
            if text == "crash":
                await say("about to crash")
                os._exit(3)
            if text == "hang":
                await say("hanging")
                report("hanging")
                await asyncio.sleep(3600)
            if text.startswith("stop:"):
                await say("partial")
                if text[5:] not in KNOWN_STOP_REASONS:
                    return {"stopReason": text[5:]}  # type: ignore[return-value]
                return PromptResponse(stop_reason=text[5:])
            if text == "usage":
                cost = Cost(amount=0.25, currency="USD")
                update = UsageUpdate(session_update="usage_update", used=100, size=1000, cost=cost)
                await self.conn.session_update(session_id, update)
                await say("spent")
                usage = Usage(
                    input_tokens=100,
                    output_tokens=20,
                    thought_tokens=5,
                    cached_read_tokens=30,
                    total_tokens=155,
                )
                return PromptResponse(stop_reason="end_turn", usage=usage)
            if text.startswith("env:"):
                await say(os.environ.get(text[4:], "<unset>"))
                return PromptResponse(stop_reason="end_turn")
            await self.conn.session_update(session_id, update_agent_thought_text("thinking"))
            await self.conn.session_update(session_id, update_plan([plan_entry("answer")]))
            await self.conn.session_update(session_id, start_tool_call("t1", "look around"))
            await say("echo: ")
            await say(text)
            await say(f" [session {session_id}]")
            return PromptResponse(stop_reason="end_turn")
        if MODE == "permission":
            options = [
                PermissionOption(option_id="no", name="Reject", kind="reject_once"),
                PermissionOption(option_id="yes", name="Allow", kind="allow_once"),
            ]
            reply = await self.conn.request_permission(
                session_id=session_id,
                tool_call=ToolCallUpdate(tool_call_id="t1", title="write a file"),
                options=options,
            )
            outcome = reply.outcome
            await say(f"permission: {outcome.outcome}:{getattr(outcome, 'option_id', '')}")
            return PromptResponse(stop_reason="end_turn")
        if MODE == "unknown":
            codes = []
            try:
                await self.conn.read_text_file(session_id=session_id, path="/etc/hostname")
            except acp.RequestError as exc:
                codes.append(exc.code)
            try:
                await self.conn.ext_method("peer/ping", {})
            except acp.RequestError as exc:
                codes.append(exc.code)
            await say(f"codes: {codes}")
            return PromptResponse(stop_reason="end_turn")
        if MODE == "wait":
            await say("waiting")
            await self.cancelled.wait()
            return PromptResponse(stop_reason="cancelled")
        if MODE in ("ignore_cancel", "stubborn"):
            pid = self.grandchild.pid if self.grandchild is not None else 0
            await say(f"grandchild {pid}")
            await asyncio.sleep(3600)
        if MODE == "crash":
            await say("about to crash")
            sys.stderr.write("boom: the peer crashed on purpose\n")
            sys.stderr.flush()
            os._exit(3)
        if MODE == "stderr_spam":
            line = "spam " * 200 + "\n"
            for _ in range(5000):  # ~5 MB, far more than a pipe buffer holds
                sys.stderr.write(line)
            sys.stderr.flush()
            await say("survived the spam")
            return PromptResponse(stop_reason="end_turn")
        if MODE == "garbage":
            await say("before garbage")
            os.write(1, b"this is not json\n")
            await asyncio.sleep(3600)
        if MODE == "big_number":
            await say("before the number")
            number = "9" * 5000
            line = '{"jsonrpc":"2.0","method":"session/update","params":{"n":' + number + "}}\n"
            os.write(1, line.encode())
            await asyncio.sleep(3600)
        if MODE == "flood_output":
            for _ in range(72):
                await say("y" * (1 << 20))
            await asyncio.sleep(3600)
        if MODE == "escape_garbage":
            await say("before garbage")
            os.write(1, b"\x1b[2J\x1b]0;pwned\x07[bold red]boom[/] \x9b31m\n")
            await asyncio.sleep(3600)
        if MODE == "huge_line":
            await say("x" * 100_000)
            await asyncio.sleep(3600)
        return PromptResponse(stop_reason="end_turn")

    def say(self, session_id: str) -> Any:
        async def send(text: str) -> None:
            await self.conn.session_update(session_id, update_agent_message_text(text))

        return send


async def main() -> None:
    report(f"pid {os.getpid()}")
    if MODE == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    await acp.run_agent(PeerAgent())
    if MODE == "stubborn":  # outlive stdin EOF too
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(main())
