"""Session event vocabulary: the envelope, the type constants and the session header.

Events are plain dicts (`Event` is only a TypedDict for the type checker) because the loop
appends ~10 per step and they cross msgpack, ACP and Ray unchanged. Placement rules live in
`agent.log` (the invariant replay); this module says what each type is called and carries.

Forward compatibility: an event of a type this version does not know loads only when its data
says `"ignorable": true`; any other unknown type is an error at load and validation, so an old
reader never silently drops something a newer writer considered essential.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal, TypedDict

from agent.errors import SessionLogError
from agent.fastinit import fast_init

__all__ = [
    "ASSISTANT_MESSAGE",
    "EVENT_TYPES",
    "HEADER_VERSION",
    "INBOX_ACCEPTED",
    "INBOX_CLAIMED",
    "INBOX_DISCARDED",
    "REQUEST_HEADER",
    "SESSION_END_SEED",
    "SESSION_ID_PATTERN",
    "STEP_END",
    "STEP_START",
    "SUBAGENT_DESCRIPTOR",
    "TOOL_CALL",
    "TOOL_RESULT",
    "TURN_END",
    "TURN_END_REASONS",
    "TURN_START",
    "USER_MESSAGE",
    "Event",
    "SessionHeader",
    "SessionLogError",
    "TurnEndReason",
    "check_utf8_path",
    "is_ignorable",
    "validate_session_id",
]

TURN_START: Final = "turn/start"  # {turn}
TURN_END: Final = "turn/end"  # {turn, reason, cause?, message?}
STEP_START: Final = "step/start"  # {turn, step}; written in formats 1 and 2 only
STEP_END: Final = "step/end"  # {turn, step}
USER_MESSAGE: Final = "user/message"  # {message: {id, role: "user", content, source}}
# {message: {...tool_calls}, finish, usage?}: one per model response; `usage` is that response's
# token usage (agent.usage.USAGE_KEYS), the record that per-session and subtree sums read.
ASSISTANT_MESSAGE: Final = "assistant/message"
TOOL_CALL: Final = "tool/call"  # {call_id, name, arguments}, logged before dispatch
TOOL_RESULT: Final = "tool/result"  # {call_id, name, content, is_error, code?}
REQUEST_HEADER: Final = "request/header"  # {system, tools: [{name, description, parameters}]}
SESSION_END_SEED: Final = "session/end-seed"  # {length}
SUBAGENT_DESCRIPTOR: Final = "subagent/descriptor"  # {descriptor}
INBOX_ACCEPTED: Final = "inbox/accepted"  # {message_id, kind: send|steer, content, source}
INBOX_CLAIMED: Final = "inbox/claimed"  # {message_id}
INBOX_DISCARDED: Final = "inbox/discarded"  # {message_id, reason}

EVENT_TYPES: Final = frozenset(
    {
        TURN_START,
        TURN_END,
        STEP_START,
        STEP_END,
        USER_MESSAGE,
        ASSISTANT_MESSAGE,
        TOOL_CALL,
        TOOL_RESULT,
        REQUEST_HEADER,
        SESSION_END_SEED,
        SUBAGENT_DESCRIPTOR,
        INBOX_ACCEPTED,
        INBOX_CLAIMED,
        INBOX_DISCARDED,
    }
)

TurnEndReason = Literal[
    "completed",
    "aborted",
    "error",
    "max-tokens",
    "blocked",
    "refusal",
    "interrupted",
    "budget-exceeded",
]
TURN_END_REASONS: Final = frozenset(
    {
        "completed",
        "aborted",
        "error",
        "max-tokens",
        "blocked",
        "refusal",
        "interrupted",
        "budget-exceeded",
    }
)

# 3: a step is its assistant/message and its tool/results, no step/start is written
# (docs/decisions.md, "Log format 3"). 2: calls are opened by their assistant/message, and no
# tool/call or step/end is written ("A step in three events"). Version 1 and 2 logs load,
# replay and resume as they are, and keep being written in their format.
HEADER_VERSION: Final = 3

# Session ids become file names, so they are restricted to a safe alphabet (no path escapes).
SESSION_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


class Event(TypedDict):
    type: str
    seq: int
    time: float
    data: dict[str, Any]


def is_ignorable(event: Event) -> bool:
    """Whether an event of an unknown type may be skipped by this reader."""
    data = event.get("data")
    return type(data) is dict and data.get("ignorable") is True


def check_utf8_path(path: str, what: str) -> str:
    """`path`, or `ValueError` when it holds bytes that are not UTF-8 (Python hands such a name
    over `surrogateescape`d): a session log, an ACP message and a trace are UTF-8 text, so no
    record of the directory could name it (docs/decisions.md)."""
    if not path.isascii():
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(
                f"{what} {path!r} is not valid UTF-8 (a directory name with non-UTF-8 bytes): "
                "the runtime records paths as UTF-8 text and cannot work there; rename the "
                "directory or use another one"
            ) from None
    return path


def validate_session_id(session_id: object) -> str:
    """Return the id, or raise ValueError (ids become file names)."""
    # Letters and digits only (the common case, e.g. minted ids): the pattern holds, no regex.
    if (
        type(session_id) is str
        and session_id.isascii()
        and session_id.isalnum()
        and len(session_id) <= 128
    ):
        return session_id
    if type(session_id) is not str or not SESSION_ID_PATTERN.fullmatch(session_id):
        raise ValueError(
            f"invalid session id {session_id!r}: must match {SESSION_ID_PATTERN.pattern}"
        )
    return session_id


@fast_init  # made once per child: a cheaper __init__, same fields (agent.fastinit)
@dataclass(frozen=True, slots=True, kw_only=True)
class SessionHeader:
    """The first frame of a session file: identity and lineage that never change.

    Keyword-only, so adding a field never shifts a caller's positional arguments.
    """

    id: str
    created_at: float = field(default_factory=time.time)
    cwd: str = field(default_factory=os.getcwd)
    parent_session: str | None = None
    origin: Literal["subagent"] | None = None
    delegation_depth: int = 0
    seed_length: int = 0
    version: int = HEADER_VERSION

    def __post_init__(self) -> None:
        validate_session_id(self.id)
        if type(self.version) is not int or not 1 <= self.version <= HEADER_VERSION:
            raise ValueError(f"unsupported session header version {self.version!r}")
        if type(self.created_at) not in (int, float):
            raise TypeError("created_at must be a number (epoch seconds)")
        if type(self.cwd) is not str:
            raise TypeError("cwd must be a str")
        check_utf8_path(self.cwd, "cwd")
        if self.parent_session is not None:
            validate_session_id(self.parent_session)
        if self.origin not in (None, "subagent"):
            raise ValueError(f"origin must be 'subagent' or None, not {self.origin!r}")
        for name in ("delegation_depth", "seed_length"):
            value = getattr(self, name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} must be a non-negative int, not {value!r}")

    def to_json(self) -> dict[str, Any]:
        # Spelled out (once per session created): `dataclasses.fields` costs more than the rest.
        return {
            "id": self.id,
            "created_at": self.created_at,
            "cwd": self.cwd,
            "parent_session": self.parent_session,
            "origin": self.origin,
            "delegation_depth": self.delegation_depth,
            "seed_length": self.seed_length,
            "version": self.version,
        }

    @classmethod
    def from_json(cls, data: object) -> SessionHeader:
        """Build from `to_json` output; unknown keys are ignored (written by a newer minor)."""
        if type(data) is not dict:
            raise TypeError(f"session header must be a dict, not {type(data).__name__}")
        missing = [k for k in ("id", "created_at", "cwd", "version") if k not in data]
        if missing:
            raise ValueError(f"session header lacks {', '.join(missing)}")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
