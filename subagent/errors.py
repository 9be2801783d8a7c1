"""Typed, loud failures of the seam. Each carries a stable `code` callers may branch on."""

from __future__ import annotations

__all__ = ["ERROR_CODES", "SubagentDepthError", "SubagentError"]

# Every code the runtime raises, with what it means; docs/seam.md lists the same.
ERROR_CODES: dict[str, str] = {
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
    "PERSISTENCE_UNAVAILABLE": "continuation needs a persistent session store",
    "CONTINUATION_UNAVAILABLE": "continuation needs ctx.tasks and ctx.agents",
    "DUPLICATE_CHILD": "a child with that id is live or already stored",
    "UNKNOWN_CHILD": "no live or stored child has that id",
    "UNAUTHORIZED": "the sender is not allowed to address that child",
    "NOT_RESUMABLE": "the child log has no usable descriptor",
    "ORPHANED_CHILD": "the child's parent session is no longer stored, so nobody can resume it",
    "RUNTIME_CLOSED": "the runtime is closed",
}


class SubagentError(Exception):
    """A seam failure with a stable `code` (one of `ERROR_CODES`)."""

    def __init__(self, code: str, message: str | None = None) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown SubagentError code {code!r}")
        self.code = code
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
