"""Runtime wiring: options checked at construction, the opt-in GC freeze, close is final."""

from __future__ import annotations

import gc

import pytest
from seam_kit import kit

from agent.store import MemoryStore
from subagent.errors import SubagentError
from subagent.runtime import Runtime


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_gc_freeze_every_must_be_a_positive_int(bad: object) -> None:
    with pytest.raises(ValueError):
        Runtime(store=MemoryStore(), gc_freeze_every=bad)  # type: ignore[arg-type]


def test_gc_freeze_every_freezes_after_n_starts_and_close_unfreezes() -> None:
    gc.unfreeze()
    with kit(gc_freeze_every=3) as k:
        parent = k.parent()
        runs = [k.start(parent, str(i)) for i in range(2)]
        k.flush_events()
        assert gc.get_freeze_count() == 0
        runs.append(k.start(parent, "third"))
        k.flush_events()
        assert gc.get_freeze_count() > 0
        for run in runs:
            run.result.get(timeout=5)
            run.dispose()
    assert gc.get_freeze_count() == 0


def test_a_closed_runtime_refuses_starts() -> None:
    with kit() as k:
        parent = k.parent()
        k.runtime.close()
        with pytest.raises(SubagentError) as info:
            k.start(parent)
        assert info.value.code == "RUNTIME_CLOSED"
