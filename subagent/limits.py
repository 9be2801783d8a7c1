"""Limits on what a model, a client or a sender can ask of the runtime.

Children per parent: the library's `Runtime` sets no cap (a host chooses); a command (`subagent
run`, `mcp`, `acp`) serves a model it does not control, so it caps by default. Kept here, apart
from the commands, so parsers read them without importing the runtime.

Inbox bounds (`Runtime(max_pending_steers=..., max_queued_sends=...)`): every runtime has them,
far above honest use, because past them the process itself is at risk. They are defined in
`agent.inbox` (the agent actor, a layer below, reads them from its context) and named here
with the other limits.
"""

from __future__ import annotations

from agent.inbox import DEFAULT_MAX_PENDING_STEERS, DEFAULT_MAX_QUEUED_SENDS

__all__ = [
    "DEFAULT_MAX_CHILDREN_PER_PARENT",
    "DEFAULT_MAX_PENDING_STEERS",
    "DEFAULT_MAX_QUEUED_SENDS",
    "MAX_CHILDREN_PER_PARENT",
]

# A real model can answer with thousands of `subagent` calls in one reply. Past this many
# children of one agent at once the rest wait for a slot (in order), so a runaway reply costs
# time, not the machine. Per parent, not per tree: a tree-wide cap could deadlock with every
# slot held by a parent waiting on children that cannot start.
DEFAULT_MAX_CHILDREN_PER_PARENT = 16
# The largest cap a flag or a config file may set: beyond it the cap is a typo.
MAX_CHILDREN_PER_PARENT = 10_000
