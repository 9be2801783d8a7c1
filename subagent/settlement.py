"""How a background child's outcome settles its task: the one path shared by the background
one-shot delegation (`subagent.tools.delegate`) and continuable activations
(`subagent.continuation`).

A task's `output` is the child's content blocks (`SubagentResult.output`, the seam's type),
never a string: text is made only where a model reads it (`task_output` formats the blocks,
naming a non-text block instead of dropping it). A failed or killed task's `detail` is the
headline a model can act on, then the child's diagnostic.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final, Protocol

from subagent.types import (
    ABORTED,
    BUDGET_EXCEEDED,
    COMPLETED,
    ERROR,
    MAX_TOKENS,
    REFUSAL,
    MessageSource,
    SubagentResult,
)

__all__ = [
    "MAX_SUMMARY_CHARS",
    "Outcome",
    "TaskSettler",
    "blocks_text",
    "headline",
    "one_line",
    "outcome_of",
    "output_text",
    "settle_task",
    "summary",
    "tell_parent",
]

log = logging.getLogger(__name__)

# How a background child ended: its result, or the infrastructure fault the seam could not
# represent (the run's result future raised).
Outcome = SubagentResult | BaseException

MAX_SUMMARY_CHARS: Final = 300

_HEADLINES: Final = {
    ABORTED: "Subagent was cancelled before it finished.",
    ERROR: "Subagent failed with an error.",
    MAX_TOKENS: "Subagent ran out of output tokens before it finished.",
    REFUSAL: "Subagent declined the task.",
    BUDGET_EXCEEDED: "Subagent used up its token or cost budget before it finished.",
}


class TaskSettler(Protocol):
    """The part of the task service a settlement uses (`subagent.tasks.TaskService`)."""

    def settle(
        self, task_id: str, status: str, output: object = None, detail: str | None = None
    ) -> bool: ...


class _Result(Protocol):
    def get(self) -> SubagentResult: ...


class _Reply(Protocol):
    def get(self) -> object: ...


class _Parent(Protocol):
    @property
    def id(self) -> str: ...

    def send(self, content: Sequence[Mapping[str, Any]], source: MessageSource) -> _Reply: ...


def headline(stop_reason: str) -> str:
    """One line a model can act on; an unknown stop reason is reported as a failure."""
    return _HEADLINES.get(
        stop_reason,
        f"Subagent ended with stop reason {stop_reason!r}, which is treated as a failure.",
    )


def blocks_text(blocks: Sequence[Mapping[str, Any]]) -> str:
    """The text of content blocks (a non-text block is named, not dropped)."""
    parts: list[str] = []
    for block in blocks:
        if block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        else:
            parts.append(f"[{block.get('type')} block]")
    return "\n".join(parts)


def output_text(result: SubagentResult) -> str:
    """The text of the child's output blocks."""
    return blocks_text(result.output)


def outcome_of(result: _Result) -> Outcome:
    """Wait for a run's result: the result, or the exception its future raised."""
    try:
        return result.get()
    except BaseException as exc:
        return exc


def settle_task(tasks: TaskSettler, task_id: str, outcome: Outcome) -> None:
    """Settle the task of a background child from how it ended (output: the child's blocks)."""
    if isinstance(outcome, BaseException):
        tasks.settle(task_id, "failed", detail=f"{type(outcome).__name__}: {outcome}")
        return
    output = list(outcome.output)
    if outcome.stop_reason == COMPLETED:
        tasks.settle(task_id, "completed", output=output)
        return
    status = "killed" if outcome.stop_reason == ABORTED else "failed"
    detail = headline(outcome.stop_reason)
    if outcome.diagnostic:
        detail = f"{detail} {outcome.diagnostic}"
    tasks.settle(task_id, status, output=output, detail=detail)


def one_line(text: str, limit: int = MAX_SUMMARY_CHARS) -> str:
    """Whitespace collapsed to single spaces, clipped to `limit` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def summary(label: str, child_id: str, outcome: Outcome) -> str:
    """The one-line summary of how a background child (or an activation) ended."""
    who = f"Subagent {label!r} ({child_id})" if label else f"Subagent {child_id}"
    if isinstance(outcome, BaseException):
        return one_line(f"{who} crashed: {type(outcome).__name__}: {outcome}")
    if outcome.stop_reason == COMPLETED:
        return one_line(f"{who} completed.")
    detail = f": {outcome.diagnostic}" if outcome.diagnostic else ""
    return one_line(f"{who} ended {outcome.stop_reason}{detail}.")


def tell_parent(parent: _Parent, content: Sequence[Mapping[str, Any]], note: str) -> bool:
    """Deliver a settlement notice (source `subagent-settled`); False (logged) if it could not."""
    try:
        parent.send(list(content), MessageSource.subagent_settled(note)).get()
    except Exception:
        log.exception("could not deliver a settlement notice to %s", parent.id)
        return False
    return True
