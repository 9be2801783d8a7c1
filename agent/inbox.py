"""How much one agent's inbox holds: `InboxLimits`, read by the agent actor from its context.

Its own module, importing nothing, so the commands' parsers (`subagent.limits`) read the
defaults without loading the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_MAX_PENDING_STEERS", "DEFAULT_MAX_QUEUED_SENDS", "InboxLimits"]

# A pending steer costs about 0.6 KB besides its text (measured: 10,000 steers of 100
# characters held 7.6 MB), a queued send about as much. An honest sender has a handful pending
# per step; a loop that never waits for admission has thousands, and at 200,000 one child held
# 300 MB. A thousand of each is far above the first and keeps the second under 1 MB of
# bookkeeping per agent (plus the text itself).
DEFAULT_MAX_PENDING_STEERS = 1_000
DEFAULT_MAX_QUEUED_SENDS = 1_000


@dataclass(frozen=True, slots=True)
class InboxLimits:
    """How many messages one agent holds before it refuses more (`INBOX_FULL`): steers waiting
    for a step boundary of the running turn, and sends waiting for a turn. Per agent: a
    flooded child refuses, its siblings do not notice."""

    steers: int = DEFAULT_MAX_PENDING_STEERS
    sends: int = DEFAULT_MAX_QUEUED_SENDS

    def __post_init__(self) -> None:
        for name in ("steers", "sends"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"inbox limit {name} must be an int, got {type(value).__name__}")
            if value < 1:
                raise ValueError(f"inbox limit {name} must be positive, got {value}")
