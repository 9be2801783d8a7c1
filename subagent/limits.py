"""Limits the commands (`subagent run`, `mcp`, `acp`) put on what a model can ask of them.

The library's `Runtime` sets no per-parent cap: a host chooses. A command serves a model it does
not control, so it caps by default. Kept here, apart from the commands, so parsers read them
without importing the runtime.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_CHILDREN_PER_PARENT", "MAX_CHILDREN_PER_PARENT"]

# A real model can answer with thousands of `subagent` calls in one reply. Past this many
# children of one agent at once the rest wait for a slot (in order), so a runaway reply costs
# time, not the machine. Per parent, not per tree: a tree-wide cap could deadlock with every
# slot held by a parent waiting on children that cannot start.
DEFAULT_MAX_CHILDREN_PER_PARENT = 16
# The largest cap a flag or a config file may set: beyond it the cap is a typo.
MAX_CHILDREN_PER_PARENT = 10_000
