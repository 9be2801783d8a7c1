"""The agent actor's message vocabulary, and the content check every sender applies.

`Send(content, source)`, `Steer(content, source)`, `Cancel(cause, keep_inbox)`, `WhenIdle()`,
`Close()` for a live agent; `CancelRun()` and `DisposeRun()` for a run's ref. The actor that
answers them is `actors.agent_actor.AgentActor`; the handle that sends them is
`actors.agent_handle.Agent`. Each message names its reply (`Asks[R]`), so an ask of it is
typed: a send's message id, a steer's admitted message id (None from a remote run, as the
seam's `steer` resolves), the last turn's outcome for a cancel or `WhenIdle`, nothing for a
close or a dispose (they reply at quiescence).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NotRequired, TypedDict

from actors.deferred import Deferred
from actors.gevent_actor import Asks
from agent import tracing
from agent.fastinit import fast_init
from agent.json_types import JsonObject
from agent.loop import TurnOutcome
from subagent.types import MessageSource

if TYPE_CHECKING:
    from actors.local_run import LocalRun

__all__ = [
    "Block",
    "Cancel",
    "CancelRun",
    "Close",
    "DisposeRun",
    "QueuedSend",
    "Send",
    "Steer",
    "WhenIdle",
    "check_content",
]

# A content block as the actors pass it along: JSON, read-only (`check_content` makes it).
Block = JsonObject


class QueuedSend(TypedDict):
    """A send waiting in an agent's inbox for its turn (the `message` of `run_turn`); also
    what a resumed agent restores from its log's accepted, unclaimed sends."""

    id: str
    content: list[Block]
    source: JsonObject  # `MessageSource.to_json()`
    trace: NotRequired[tracing.TraceParent]  # where the turn's spans hang, if told


@fast_init  # made once per child: a cheaper __init__, same fields (agent.fastinit)
@dataclass(frozen=True, slots=True)
class Send(Asks[str]):
    """Queue the next turn; wakes an idle agent. Replies with the message id. With `run`, the
    message is that run's activation prompt: the actor settles the run's result."""

    content: Sequence[Block]
    source: MessageSource
    message_id: str | None = None
    # Where the turn hangs in a trace (agent.tracing), carried across the mailbox explicitly.
    trace: tracing.TraceParent | None = field(default=None, compare=False)
    run: LocalRun | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Steer(Asks[str | None]):
    """Add to the running turn at its next step boundary. Replies once admitted: with the
    admitted message's id from a local agent, with what the provider's `steer` resolves (None,
    by the seam) from a remote run. `reply`, when given, is settled instead of the ask's own
    reply, so a forwarding actor can hand its caller's deferred along without a relay."""

    content: Sequence[Block]
    source: MessageSource
    reply: Deferred[str | None] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Cancel(Asks[TurnOutcome | None]):
    """Abort the running turn. Replies when the agent is idle again, with the last turn's
    outcome (None before any turn). `keep_inbox=True` keeps queued sends (held until the next
    `Send`); otherwise they are discarded. `cause` is anything with a `str()`."""

    cause: object = None
    keep_inbox: bool = False


@dataclass(frozen=True, slots=True)
class CancelRun(Asks[None]):
    """For a run's ref: abort the activation (its result settles `aborted` unless it already
    completed), and the runs this agent started. Told, as a rule (the reply is None)."""

    cause: object = None


@dataclass(frozen=True, slots=True)
class DisposeRun(Asks[None]):
    """For a run's ref: cancel what remains, close the agent, stop. Replies at quiescence."""


@dataclass(frozen=True, slots=True)
class WhenIdle(Asks[TurnOutcome | None]):
    """Replies with the last turn's outcome once no turn runs and none will start by itself."""


@dataclass(frozen=True, slots=True)
class Close(Asks[None]):
    """Abort the running turn, close the log, stop the actor. Replies at quiescence. Queued
    sends stay pending in the log for a later resume."""

    cause: object = None


def check_content(content: object) -> list[Block]:
    """Validate content blocks at the call site: a list of `{"type": ..., ...}` dicts."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, (list, tuple)):
        raise TypeError(f"content must be a list of content blocks, got {type(content).__name__}")
    for block in content:
        # A plain dict (nearly every block) skips the `Mapping` ABC check.
        if (type(block) is not dict and not isinstance(block, Mapping)) or not isinstance(
            block.get("type"), str
        ):
            raise TypeError("each content block must be a dict with a string 'type'")
    return list(content)
