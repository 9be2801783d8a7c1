"""The demo scenario: every role happens, and a fixed seed gives the same final capture."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from agent.log import validate_log
from agent.loop import TurnOutcome
from agent.store import SessionStore
from subagent.cli.demo import no_summary
from subagent.demo import Demo, plan_children

GOLDEN_SEED_42 = """
coordinator idle  turn 3 step 1  tool send_message
├── worker-01 [spawn] error  turn 1 step 4  tool tally  (crashed, contained)
├── worker-02 [fork] aborted  turn 1 step 1  tool await_guidance  (cancelled by operator)
├── worker-03 [spawn] completed  turn 1 step 2  tool subagent
│   └── worker-03.1 [spawn] completed  turn 1 step 2  tool tally
├── worker-04 [spawn] completed  turn 2 step 1  tool long_task  (interrupted, resumed)
├── worker-05 [spawn] completed  turn 1 step 3  tool read_notes
├── worker-06 [spawn] completed  turn 1 step 2  tool await_guidance  (steered)
└── worker-07 [spawn] completed  turn 1 step 3  tool lookup
Summary
┏━━━━━━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━━━┳━━━━━━━┳━━━━━━━┳━━━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━┓
┃ agent       ┃ provider ┃ outcome   ┃ turns ┃ steps ┃ tools ┃ notes                 ┃
┡━━━━━━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━┩
│ worker-01   │ spawn    │ error     │     1 │     4 │     3 │ crashed, contained    │
│ worker-02   │ fork     │ aborted   │     1 │     1 │     1 │ cancelled by operator │
│ worker-03   │ spawn    │ completed │     1 │     2 │     1 │                       │
│ worker-03.1 │ spawn    │ completed │     1 │     2 │     1 │                       │
│ worker-04   │ spawn    │ completed │     2 │     2 │     1 │ interrupted, resumed  │
│ worker-05   │ spawn    │ completed │     1 │     3 │     2 │                       │
│ worker-06   │ spawn    │ completed │     1 │     2 │     1 │ steered               │
│ worker-07   │ spawn    │ completed │     1 │     3 │     2 │                       │
└─────────────┴──────────┴───────────┴───────┴───────┴───────┴───────────────────────┘
"""


def capture(tmp_path: Path, children: int, seed: int) -> tuple[str, Demo]:
    demo = Demo(str(tmp_path / "sessions"), children=children, seed=seed)
    try:
        demo.run()
        out = io.StringIO()
        console = Console(file=out, width=100, no_color=True, highlight=False)
        console.print(demo.tree.render())
        console.print(demo.tree.summary())
    finally:
        demo.close()
    text = "\n".join(line.rstrip() for line in out.getvalue().splitlines() if line.strip())
    return text, demo


def test_a_fixed_seed_gives_the_checked_in_capture(tmp_path: Path) -> None:
    text, _ = capture(tmp_path, 7, 42)
    assert text == GOLDEN_SEED_42.strip()


def test_the_capture_is_stable_across_runs_and_differs_across_seeds(tmp_path: Path) -> None:
    first, _ = capture(tmp_path / "a", 9, 3)
    again, _ = capture(tmp_path / "b", 9, 3)
    other, _ = capture(tmp_path / "c", 9, 4)
    assert first == again
    assert first != other


def test_every_role_happens_and_every_log_is_valid(tmp_path: Path) -> None:
    _, demo = capture(tmp_path, 6, 1)
    statuses = {n.label or demo.tree.label(n): n for n in demo.tree.descendants()}
    notes = [note for n in demo.tree.descendants() for note in n.notes]
    assert {
        "steered",
        "cancelled by operator",
        "crashed, contained",
        "interrupted",
        "resumed",
    } <= set(notes)
    outcomes = sorted(n.status for n in demo.tree.descendants())
    assert outcomes.count("error") == 1 and outcomes.count("aborted") == 1
    assert len(statuses) == 7  # six children and the lead's grandchild
    assert {n.provider for n in demo.tree.descendants()} == {"spawn", "fork"}
    store = SessionStore(tmp_path / "sessions")
    headers = store.list()
    assert len(headers) == 8  # the coordinator too
    for header in headers:
        validate_log(store.load(header.id).events)


def test_plans_assign_each_special_role_once() -> None:
    roles = [p.role for p in plan_children(12, 5)]
    for role in ("steer", "crash", "continuable", "cancel", "lead"):
        assert roles.count(role) == 1
    assert [p.role for p in plan_children(2, 5)] != []
    with pytest.raises(ValueError):
        plan_children(0, 1)


def test_the_coordinator_line_without_a_summary_says_why() -> None:
    assert no_summary(None, stopped=["worker-01"]) == "(cancelled before its summary)"
    failed = TurnOutcome(1, "error", fault=OSError(27, "File too large"))
    assert no_summary(failed, stopped=None) == (
        "(no summary: its log could not be written: [Errno 27] File too large)"
    )
    assert no_summary(TurnOutcome(1, "max-steps"), stopped=None) == (
        "(no summary: its turn ended max-steps)"
    )
