"""What every remote run shares: a parent-scoped id, no local agent, a result settled once.

A remote child (an ACP process, a child on a Ray host) has no `Agent` in this process, so the
seed's remote identity applies: `run.id` is minted by the provider, `local_agent` is None. The
result is the runtime's one settle-once primitive (`Deferred`): the first settlement wins.
"""

from __future__ import annotations

import pykka

from actors.gevent_actor import Deferred
from subagent.types import SubagentResult

__all__ = ["RemoteRun"]


class RemoteRun:
    def __init__(self, run_id: str) -> None:
        self._id = run_id
        self._result: Deferred[SubagentResult] = Deferred()

    @property
    def id(self) -> str:
        return self._id

    @property
    def local_agent(self) -> None:
        return None

    @property
    def result(self) -> pykka.Future[SubagentResult]:
        return self._result

    @property
    def _settled(self) -> bool:
        return self._result.settled

    @property
    def settled(self) -> bool:
        return self._result.settled

    def _resolve(self, result: SubagentResult) -> bool:
        """Settle with `result` unless already settled; returns whether this call settled it."""
        return self._result.resolve(result)

    def _fault(self, exc: BaseException) -> bool:
        """Fail the result (an infrastructure fault the seam cannot represent), once."""
        return self._result.reject(exc)
