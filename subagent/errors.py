"""Typed, loud failures of the seam. Each `SubagentError` carries a stable `code` callers may
branch on; `ErrorCode` names every one, so a misspelt code is a type error.

The face's part of the exception tree, in one module (supervision/errors.py holds the root,
the one cancellation `Cancelled`, and the picture of the whole tree)::

    SubagentRuntimeError                  the root: `from subagent import SubagentRuntimeError`
    ├── SubagentError                     a seam failure with a stable `code` (`ErrorCode`)
    │   ├── SubagentDepthError            DEPTH_EXCEEDED, with the depths involved
    │   └── UnsupportedSchemaError        UNSUPPORTED_SCHEMA, with every violation
    ├── DescriptorError  [ValueError]     a malformed subagent descriptor; `field` names it
    ├── UnknownTaskError [KeyError]       no task has that id
    └── CliError                          the `subagent` command's one-line failure (exit 1)
        └── UsageError                    a bad argument value (exit 2)

A builtin second base in brackets is kept so code written before the tree still catches it.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

from supervision.errors import SubagentRuntimeError

__all__ = [
    "ERROR_CODES",
    "CliError",
    "DescriptorError",
    "ErrorCode",
    "SubagentDepthError",
    "SubagentError",
    "UnknownTaskError",
    "UnsupportedSchemaError",
    "UsageError",
]

ErrorCode = Literal[
    "NO_PROVIDER",
    "DUPLICATE_PROVIDER",
    "UNSUPPORTED_CAPABILITY",
    "UNSUPPORTED_SCHEMA",
    "DEPTH_EXCEEDED",
    "BUDGET_EXCEEDED",
    "NO_PRICE",
    "INVALID_TOOL_FILTER",
    "START_FAILED",
    "ABORTED",
    "RUN_TERMINAL",
    "RUN_DISPOSED",
    "INBOX_FULL",
    "PERSISTENCE_UNAVAILABLE",
    "CONTINUATION_UNAVAILABLE",
    "DUPLICATE_CHILD",
    "UNKNOWN_CHILD",
    "UNAUTHORIZED",
    "NOT_RESUMABLE",
    "ORPHANED_CHILD",
    "RUNTIME_CLOSED",
    "WRONG_THREAD",
]

# Every code the runtime raises, with what it means; docs/seam.md lists the same.
ERROR_CODES: Final[dict[ErrorCode, str]] = {
    "NO_PROVIDER": "no provider is registered under that name",
    "DUPLICATE_PROVIDER": "a provider with that name is already registered",
    "UNSUPPORTED_CAPABILITY": "the request needs a feature the provider lacks",
    "UNSUPPORTED_SCHEMA": "the output schema is outside the supported subset",
    "DEPTH_EXCEEDED": "the child would be deeper than max_depth allows",
    "BUDGET_EXCEEDED": "the parent has no token or cost budget left for a child",
    "NO_PRICE": "a cost budget holds the child but its model route has no price",
    "INVALID_TOOL_FILTER": "the tool filter is empty or names an unknown tool",
    "START_FAILED": "the provider could not establish the child",
    "ABORTED": "the request signal aborted before the child was published",
    "RUN_TERMINAL": "the run has settled, so it cannot take this operation",
    "RUN_DISPOSED": "the run was disposed",
    "INBOX_FULL": "the agent already holds as many pending messages as its inbox bound allows",
    "PERSISTENCE_UNAVAILABLE": "continuation needs a persistent session store",
    "CONTINUATION_UNAVAILABLE": "continuation needs ctx.tasks and ctx.agents",
    "DUPLICATE_CHILD": "a child with that id is live or already stored",
    "UNKNOWN_CHILD": "no live or stored child has that id",
    "UNAUTHORIZED": "the sender is not allowed to address that child",
    "NOT_RESUMABLE": "the child log has no usable descriptor",
    "ORPHANED_CHILD": "the child's parent session is no longer stored, so nobody can resume it",
    "RUNTIME_CLOSED": "the runtime is closed",
    "WRONG_THREAD": "the runtime was called from a thread other than the one that made it",
}
assert set(ERROR_CODES) == set(get_args(ErrorCode)), "ErrorCode and ERROR_CODES disagree"

# How many schema violations one UnsupportedSchemaError message lists.
_MAX_LISTED = 50


class SubagentError(SubagentRuntimeError):
    """A seam failure with a stable `code` (one of `ERROR_CODES`)."""

    def __init__(self, code: ErrorCode, message: str | None = None) -> None:
        if code not in ERROR_CODES:  # the Literal guards typed callers; this guards the rest
            raise ValueError(f"unknown SubagentError code {code!r}")
        self.code: ErrorCode = code
        self.detail = message or ERROR_CODES[code]
        super().__init__(f"{code}: {self.detail}")


class SubagentDepthError(SubagentError):
    """The computed child depth is above the absolute, inclusive `max_depth` cap."""

    def __init__(self, attempted_depth: int, max_depth: int) -> None:
        self.attempted_depth = attempted_depth
        self.max_depth = max_depth
        super().__init__(
            "DEPTH_EXCEEDED",
            f"child depth {attempted_depth} is above max_depth {max_depth}",
        )


class UnsupportedSchemaError(SubagentError):
    """`UNSUPPORTED_SCHEMA` carrying every violation, so a caller can fix them all at once."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = list(violations)
        listed = "; ".join(self.violations[:_MAX_LISTED])
        if len(self.violations) > _MAX_LISTED:
            listed += f"; ... and {len(self.violations) - _MAX_LISTED} more"
        super().__init__(
            "UNSUPPORTED_SCHEMA", "output schema is outside the supported subset: " + listed
        )


class DescriptorError(SubagentRuntimeError, ValueError):
    """A descriptor of the current version is malformed; `field` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"descriptor field {field!r}: {message}")


class UnknownTaskError(SubagentRuntimeError, KeyError):
    """No task has that id (in this service)."""

    def __init__(self, task_id: object) -> None:
        super().__init__(task_id)
        self.task_id = task_id

    def __str__(self) -> str:
        return f"no task with id {self.task_id!r}"


class CliError(SubagentRuntimeError):
    """A user-facing failure: printed as one line, exit 1."""


class UsageError(CliError):
    """A bad argument value found after parsing: printed like argparse's errors, exit 2."""
