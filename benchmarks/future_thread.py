"""What a thread check on our futures costs per ask (docs/decisions.md, "A future waited on
from another thread").

`python -m benchmarks future_thread [--n N] [--quick] [--json]`. A `GeventFuture` waited on
from a thread that is not its hub's either hangs or breaks the hub's own waiters (gevent's
`InvalidThreadUseError`), so `get()` refuses it: the future records its thread when it is made
(one `threading.get_ident()` and a slot) and compares on the path that must wait. This
measures, in one process and in alternating rounds, the same future made with and without that
record (the two classes below differ by that line only), against what an ask costs: an ask
answered in place (`ask_now` on an idle actor) and one through the mailbox (a loop greenlet).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import gevent
from pykka import Future

from actors import gevent_actor
from actors.gevent_actor import GeventActor, GeventFuture

DEFAULT_N = 50_000
QUICK_N = 5_000
ROUNDS = 31

_ident = threading.get_ident


class _Before(GeventFuture[Any]):
    """`GeventFuture` as it was made before the check (its `__init__` then called `super()`)."""

    __slots__ = ()

    def __init__(self) -> None:
        super(GeventFuture, self).__init__()
        self.settlement = None
        self._event = None
        self._callbacks = None


class _Unowned(GeventFuture[Any]):
    """`GeventFuture` as made now, without the record."""

    __slots__ = ()

    def __init__(self) -> None:
        Future.__init__(self)
        self.settlement = None
        self._event = None
        self._callbacks = None


class _Owned(GeventFuture[Any]):
    """The same, recording its thread (what the check adds to making a future)."""

    __slots__ = ("thread",)

    def __init__(self) -> None:
        Future.__init__(self)
        self.settlement = None
        self._event = None
        self._callbacks = None
        self.thread = _ident()


class _Echo(GeventActor):
    lazy_loop = True

    def on_receive(self, message: Any) -> Any:
        return message


def _per_call_ns(fn: Callable[[], object], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e9


def _life(cls: type[GeventFuture[Any]]) -> Callable[[], object]:
    def life() -> object:
        future = cls()
        future.set(1)
        return future.get()

    return life


def run(n: int | None, args: argparse.Namespace) -> dict[str, Any]:
    n = n or (QUICK_N if getattr(args, "quick", False) else DEFAULT_N)
    ref = _Echo.start()
    actor = gevent_actor.actor_of(ref)
    assert actor is not None
    in_place = lambda: actor.ask_now(1, block=False).get()  # noqa: E731
    through_mailbox = lambda: ref.ask(1, block=False).get()  # noqa: E731
    samples: dict[str, list[float]] = {
        k: []
        for k in ("before", "unowned", "owned", "shipped", "ident", "ask_in_place", "ask_mailbox")
    }
    try:
        for _ in range(ROUNDS):  # alternating, so drift on a shared machine hits both alike
            samples["before"].append(_per_call_ns(_life(_Before), n))
            samples["unowned"].append(_per_call_ns(_life(_Unowned), n))
            samples["owned"].append(_per_call_ns(_life(_Owned), n))
            samples["shipped"].append(_per_call_ns(_life(GeventFuture), n))
            samples["ident"].append(_per_call_ns(_ident, n))
            samples["ask_in_place"].append(_per_call_ns(in_place, n // 4))
            samples["ask_mailbox"].append(_per_call_ns(through_mailbox, n // 20))
            gevent.sleep(0)
    finally:
        ref.stop()
    best = {k: min(v) for k, v in samples.items()}
    made = best["owned"] - best["unowned"]  # every future: the record
    # Paired: each round's difference, then their median (a shared machine's load drifts
    # between rounds, much less within one).
    paired = statistics.median(
        o - u for o, u in zip(samples["owned"], samples["unowned"], strict=True)
    )
    waited = made + best["ident"]  # a future that must wait: the record and the compare
    return {
        "n": n,
        "rounds": ROUNDS,
        "future_life_ns_before": round(best["before"], 1),
        "future_life_ns_without_record": round(best["unowned"], 1),
        "future_life_ns_with_record": round(best["owned"], 1),
        "future_life_ns_shipped": round(best["shipped"], 1),
        "get_ident_ns": round(best["ident"], 1),
        "check_ns_ask_in_place": round(made, 1),
        "check_ns_ask_in_place_paired_median": round(paired, 1),
        "check_ns_ask_mailbox": round(waited, 1),
        "ask_in_place_ns": round(best["ask_in_place"], 1),
        "ask_mailbox_ns": round(best["ask_mailbox"], 1),
        "check_share_of_ask_in_place": round(made / best["ask_in_place"], 4),
        "check_share_of_ask_mailbox": round(waited / best["ask_mailbox"], 4),
        "notes": [
            "future life = make, set, get (settled): what every ask's reply goes through",
            "an ask answered in place is settled when read: only the record; one through the "
            "mailbox waits: the record and one get_ident() compare",
            "alternating rounds in one process, each figure its best round; the record's cost "
            "is also given as the median of the per-round differences (paired)",
            "before: the class as it was (super().__init__(), no record); shipped: as it is",
        ],
    }
