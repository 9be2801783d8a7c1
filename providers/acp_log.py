"""The local session log of a continuable ACP child: what makes it a first-class child.

The agent keeps its own transcript, but the continuation service finds, lists, authorizes and
resumes children through *our* store: a session header (parent, origin, depth), the descriptor,
and here the ACP record (provider name, agent command, ACP session id, cwd). So a continuable ACP
child gets an ordinary session log; each activation is one turn in it (the prompt as the user
message, the agent's reply text as one assistant message, the stop reason as the turn's end).
Nothing secret is recorded: of the environment only the *names* passed through.

The log is held open (locked) while an activation runs, so two processes never drive one ACP
child at once; a process that died mid-turn leaves an open turn, closed by the next `open`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from agent.events import Event, SessionHeader
from agent.log import SessionLog, event_positions

__all__ = ["ACP_RECORD_EVENT", "AcpRecord", "ChildLog", "SessionStoreLike", "read_record"]

ACP_RECORD_EVENT = "acp/session"
_TURN_START = frozenset({"turn/start"})


class SessionStoreLike(Protocol):
    """The part of `agent.store` a child log needs."""

    def create(self, header: SessionHeader, seed_events: Iterable[Any] = ...) -> SessionLog: ...

    def open(self, session_id: str) -> SessionLog: ...

    def scan(self, session_id: str, start: int = ...) -> Iterator[Event]: ...


@dataclass(frozen=True, slots=True)
class AcpRecord:
    """How to reach a continuable ACP child again, from any process."""

    provider: str
    command: str
    args: tuple[str, ...]
    pass_env: tuple[str, ...]
    acp_session_id: str
    cwd: str

    def to_json(self) -> dict[str, Any]:
        return {
            "ignorable": True,  # older readers skip it; the log stays valid
            "provider": self.provider,
            "command": self.command,
            "args": list(self.args),
            "pass_env": list(self.pass_env),
            "acp_session_id": self.acp_session_id,
            "cwd": self.cwd,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AcpRecord:
        """Raises `ValueError` naming the malformed field."""

        def text(key: str) -> str:
            value = data.get(key)
            if not isinstance(value, str) or not value:
                raise ValueError(f"acp record field {key!r} must be a non-empty string")
            return value

        def names(key: str) -> tuple[str, ...]:
            value = data.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"acp record field {key!r} must be a list of strings")
            return tuple(value)

        return cls(
            provider=text("provider"),
            command=text("command"),
            args=names("args"),
            pass_env=names("pass_env"),
            acp_session_id=text("acp_session_id"),
            cwd=text("cwd"),
        )


def read_record(store: SessionStoreLike, child_id: str) -> AcpRecord | None:
    """The child's ACP record (the latest one), or None when its log has none.

    Raises what the store raises for a missing or unreadable log, `ValueError` for a malformed
    record.
    """
    found: Mapping[str, Any] | None = None
    for event in store.scan(child_id):
        if event.get("type") == ACP_RECORD_EVENT:
            found = event.get("data")
    if found is None:
        return None
    if not isinstance(found, Mapping):
        raise ValueError("acp record is not an object")
    return AcpRecord.from_json(found)


class ChildLog:
    """One activation's turn in the child's log: opened when it starts, closed when it settles."""

    def __init__(self, log: SessionLog, turn: int) -> None:
        self._log = log
        self._turn = turn
        self._begun = False

    @classmethod
    def create(
        cls,
        store: SessionStoreLike,
        header: SessionHeader,
        prompt: Sequence[Mapping[str, Any]],
        source: Mapping[str, Any],
        descriptor: Mapping[str, Any],
        record: AcpRecord,
        trace: Mapping[str, str] | None = None,
    ) -> ChildLog:
        """Create the child's session with its first turn open: prompt, descriptor, record.

        Durable before the agent sees the prompt, so a crash mid-turn leaves a resumable child.
        `trace` is the first activation's W3C `traceparent` carrier (`agent.tracing.carrier`),
        kept beside the descriptor as a local child's is, so a later activation links to it.
        Raises the store's `SessionExistsError` when the id is taken.
        """
        log = store.create(header)
        try:
            child = cls(log, 1)
            child._open_turn(prompt, source)
            log.append("subagent/descriptor", {"descriptor": dict(descriptor), **(trace or {})})
            log.append(ACP_RECORD_EVENT, record.to_json())
            log.checkpoint("turn")
        except BaseException:
            log.close()
            raise
        return child

    @classmethod
    def acquire(cls, store: SessionStoreLike, child_id: str) -> ChildLog:
        """Take the stored child's log (an open tail left by a dead process is closed by `open`)
        before the agent is even started: one activation at a time, across processes.

        Raises the store's `SessionBusyError` when another activation holds it. Then `begin` the
        turn, or `release` the log.
        """
        log = store.open(child_id)
        turns = len(event_positions(log.events, _TURN_START))
        return cls(log, turns + 1)

    def begin(self, prompt: Sequence[Mapping[str, Any]], source: Mapping[str, Any]) -> None:
        """Open the activation's turn with its prompt, durably."""
        self._open_turn(prompt, source)
        self._log.checkpoint("turn")

    def release(self) -> None:
        """Give the log back when the activation did not start (a begun turn ends `error`)."""
        if self._begun:
            self.finish([], "error", "the activation failed to start")
        else:
            self._log.close()

    def _open_turn(self, prompt: Sequence[Mapping[str, Any]], source: Mapping[str, Any]) -> None:
        self._begun = True
        log = self._log
        log.append("turn/start", {"turn": self._turn})
        message = {
            "id": f"u{len(log.events)}",
            "role": "user",
            "content": [dict(block) for block in prompt],
            "source": dict(source),
        }
        log.append("user/message", {"message": message})

    @property
    def closed(self) -> bool:
        return self._log.closed

    def finish(
        self,
        output: Sequence[Mapping[str, Any]],
        reason: str,
        message: str | None,
        usage: Mapping[str, int] | None = None,
    ) -> None:
        """Record the agent's reply and how the turn ended, then release the log. Idempotent."""
        log = self._log
        if log.closed:
            return
        try:
            if output:
                log.append("step/start", {"turn": self._turn, "step": 1})
                reply = {
                    "id": f"a{len(log.events)}",
                    "role": "assistant",
                    "content": [dict(block) for block in output],
                    "tool_calls": [],
                }
                data: dict[str, Any] = {"message": reply, "finish": "stop"}
                if usage:
                    data["usage"] = dict(usage)  # what the agent reported (listings read it)
                log.append("assistant/message", data)
                log.append("step/end", {"turn": self._turn, "step": 1})
            end: dict[str, Any] = {"turn": self._turn, "reason": reason}
            if message:
                end["message"] = message
            log.append("turn/end", end)
            log.checkpoint("turn")
        finally:
            log.close()
