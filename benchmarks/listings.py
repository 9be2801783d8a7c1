"""What a listing and an interrupt cost next to many ended remote children of another parent.

`python -m benchmarks listings [--n N] [--quick] [--json]`. One runtime: parent A ends N
one-shot remote children (`keep_settled` high enough that every end stays known) and has N/10
more running, parent B has 3 (two ended, one running). Then, per call (median of rounds of a
loop of calls): B's `list_children`, B's `list_descendants`, B's `interrupt` of its ended
child (an ancestor's "not running") and of an id known nowhere (`UNKNOWN_CHILD`), and A's
`list_children` (its answer is 1.1 N rows, so that one costs N anyway).

The children's provider is a stand-in for ACP or Ray (no local agent, a result settled at its
start or never): the service's remote-run bookkeeping is what is measured, not a transport.
No peer: the figure of interest is how B's calls change with N (compare `--n 100` with the
default), which `docs/performance.md` records before and after the run table was indexed.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from actors.gevent_actor import GeventFuture
from subagent.errors import SubagentError
from subagent.runtime import Runtime
from subagent.types import (
    SubagentCapabilities,
    SubagentResult,
    SubagentStartRequest,
    text_block,
)
from supervision.signal import AbortController

DEFAULT_N = 10_000
QUICK_N = 200
ROUNDS = 7
CALLS = 50


class _Run:
    """A remote-looking run: no local agent; completed at once unless told to hang."""

    def __init__(self, run_id: str, hang: bool) -> None:
        self.id = run_id
        self.local_agent = None
        self.result: GeventFuture[SubagentResult] = GeventFuture()
        if not hang:
            self.result.set(SubagentResult(output=[text_block("done")], stop_reason="completed"))

    def cancel(self, cause: object = None) -> None:
        self._settle("aborted")

    def dispose(self) -> None:
        self._settle("aborted")

    def _settle(self, stop_reason: str) -> None:
        if not self.result.done:
            self.result.set(SubagentResult(output=[], stop_reason=stop_reason))


class _Remote:
    """The stand-in provider: ids scoped by the parent, as ACP's and Ray's are."""

    name = "remote"
    capabilities = SubagentCapabilities()
    inherits_parent_context = False

    def __init__(self) -> None:
        self._count = 0

    def start(self, request: SubagentStartRequest) -> _Run:
        self._count += 1
        hang = any(b.get("text") == "hang" for b in request.prompt)
        return _Run(f"{request.parent.id}.remote-{self._count}", hang)


def _median_us(call: Callable[[], object]) -> float:
    rounds = []
    for _ in range(ROUNDS):
        began = time.perf_counter()
        for _ in range(CALLS):
            call()
        rounds.append((time.perf_counter() - began) / CALLS * 1e6)
    return round(statistics.median(rounds), 1)


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    n = n or (QUICK_N if getattr(args, "quick", False) else DEFAULT_N)
    # A store of its own (a listing reads every stored header): the two parents' logs only.
    with tempfile.TemporaryDirectory() as home, Runtime(store=home, keep_settled=n + 2) as rt:
        service = rt.subagents
        service.register(_Remote())

        def start(parent: Any, prompt: str) -> Any:
            request = SubagentStartRequest(
                prompt=[text_block(prompt)], parent=parent, signal=AbortController().signal
            )
            return service.start("remote", request)

        big, small = rt.agent(), rt.agent()
        began = time.perf_counter()
        for _ in range(n):
            handle = start(big, "one")
            handle.dispose()
        running = [start(big, "hang") for _ in range(n // 10)]
        filled = time.perf_counter() - began
        ended = []
        for _ in range(2):
            handle = start(small, "one")
            handle.dispose()
            ended.append(handle.id)
        live = start(small, "hang")
        service.sync()
        assert len(service.list_children(small.id)) == 3
        assert len(service.list_children(big.id)) == n + len(running)

        def unknown() -> None:
            with contextlib.suppress(SubagentError):
                service.interrupt("nobody", by=small)

        figures = {
            "n_ended_elsewhere": n,
            "n_running_elsewhere": len(running),
            "fill_s": round(filled, 2),
            "small_list_children_us": _median_us(lambda: service.list_children(small.id)),
            "small_list_descendants_us": _median_us(lambda: service.list_descendants(small.id)),
            "small_interrupt_ended_us": _median_us(lambda: service.interrupt(ended[0], by=small)),
            "small_interrupt_unknown_us": _median_us(unknown),
            "big_list_children_ms": round(
                _median_us(lambda: service.list_children(big.id)) / 1000, 2
            ),
        }
        for handle in [live, *running]:
            handle.dispose()
    return figures
