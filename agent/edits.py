"""One process-wide count of edits to what a model request is built from.

A model request carries the system prompt (`agent.prompt.SystemPrompt`, rendered over its
parent chain and the runtime's variables) and the tool specs (`agent.tools.ToolScope` over
its parent chain and the `ToolRegistry`). Each of those keys its own cache on a chain of
versions, which costs a walk of the chain per look-up. A turn asks for both on every step,
and between two steps they almost never change; so every edit of a section, a registration,
a scope's own tools or its restrictions also bumps this one counter, and a cache stamped
with it (the loop's per-agent request header) is valid while the count is unchanged. An
edit anywhere invalidates every such cache, which then re-asks the chain as before: a rare,
correct miss. The variables are not counted (a plain mapping anyone may change): a cache
compares them itself.
"""

from __future__ import annotations

__all__ = ["EDITS", "EditCount"]


class EditCount:
    """A counter that only grows; `bump` on every edit."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def bump(self) -> None:
        self.count += 1


EDITS = EditCount()
