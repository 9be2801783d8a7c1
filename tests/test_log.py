"""Invariant replay, completed-turn prefix, and the live SessionLog's append/checkpoint."""

from __future__ import annotations

import copy
import math
from typing import Any

import gevent
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.events import Event, SessionHeader
from agent.frames import decode_frames, encode_header
from agent.log import (
    InvariantError,
    LogReplay,
    SessionLog,
    closing_events,
    completed_turn_prefix,
    validate_log,
)

TEXT = [{"type": "text", "text": "hi"}]


def user(text: str = "hi") -> dict[str, Any]:
    return {
        "message": {
            "id": "u",
            "role": "user",
            "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"},
        }
    }


def assistant(calls: list[str] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    return {
        "message": {
            "id": "a",
            "role": "assistant",
            "content": TEXT,
            "tool_calls": [{"id": c, "name": "t", "arguments": {}} for c in calls],
        },
        "finish": "tool_calls" if calls else "stop",
    }


def call(call_id: str) -> dict[str, Any]:
    return {"call_id": call_id, "name": "t", "arguments": {}}


def result(call_id: str) -> dict[str, Any]:
    return {"call_id": call_id, "name": "t", "content": TEXT, "is_error": False}


def accepted(message_id: str) -> dict[str, Any]:
    return {"message_id": message_id, "kind": "send", "content": TEXT, "source": {"kind": "user"}}


def log_of(*pairs: tuple[str, dict[str, Any]]) -> list[Event]:
    return [{"type": t, "seq": i, "time": 0.0, "data": d} for i, (t, d) in enumerate(pairs)]


def one_turn(turn: int = 1) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("turn/start", {"turn": turn}),
        ("user/message", user()),
        ("step/start", {"turn": turn, "step": 1}),
        ("assistant/message", assistant(["c1"])),
        ("tool/call", call("c1")),
        ("tool/result", result("c1")),
        ("step/end", {"turn": turn, "step": 1}),
        ("step/start", {"turn": turn, "step": 2}),
        ("user/message", user("steer")),
        ("assistant/message", assistant()),
        ("step/end", {"turn": turn, "step": 2}),
        ("turn/end", {"turn": turn, "reason": "completed"}),
    ]


V1 = SessionHeader(id="s-v1", version=1)  # a log written before format 2


def rejects(
    pairs: list[tuple[str, dict[str, Any]]], seq: int, match: str, version: int = 1
) -> None:
    """The rules of a format-1 log by default (these tests predate format 2)."""
    with pytest.raises(InvariantError, match=match) as info:
        validate_log(log_of(*pairs), SessionHeader(id="s", version=version))
    assert info.value.seq == seq


def test_a_full_turn_validates() -> None:
    replay = validate_log(log_of(*one_turn(1), *one_turn(2)))
    assert replay.turn == 2 and not replay.turn_open and replay.seq == 24


# -- one test per rule -------------------------------------------------------------------------


def test_seq_must_be_contiguous_from_zero() -> None:
    events = log_of(*one_turn())
    events[3] = {**events[3], "seq": 4}
    with pytest.raises(InvariantError, match="seq 4 where 3") as info:
        validate_log(events)
    assert info.value.seq == 3
    with pytest.raises(InvariantError) as info:
        validate_log(log_of(*one_turn())[1:])
    assert info.value.seq == 0


@pytest.mark.parametrize(
    ("event", "match"),
    [
        ({"type": 1, "seq": 0, "time": 0.0, "data": {}}, "type must be a str"),
        ({"type": "turn/start", "seq": 0, "time": 0.0, "data": []}, "data must be a dict"),
        ({"type": "turn/start", "seq": 0, "time": "x", "data": {"turn": 1}}, "time"),
        ({"type": "turn/start", "seq": 0, "time": 0.0, "data": {}}, "turn must be an int"),
        ("nope", "not a dict"),
    ],
)
def test_envelope(event: Any, match: str) -> None:
    with pytest.raises(InvariantError, match=match):
        validate_log([event])


def test_turns_number_from_one_without_gaps() -> None:
    rejects([("turn/start", {"turn": 2})], 0, "turn 2 follows turn 0")
    rejects([*one_turn(1), ("turn/start", {"turn": 3})], 12, "turn 3 follows turn 1")
    rejects([*one_turn(1), ("turn/start", {"turn": 1})], 12, "follows")


def test_turns_do_not_nest() -> None:
    rejects([("turn/start", {"turn": 1}), ("turn/start", {"turn": 2})], 1, "while turn 1")


def test_turn_end_rules() -> None:
    rejects([("turn/end", {"turn": 1, "reason": "completed"})], 0, "no open turn")
    start = ("turn/start", {"turn": 1})
    rejects([start, ("turn/end", {"turn": 2, "reason": "completed"})], 1, "names turn 2")
    rejects([start, ("turn/end", {"turn": 1, "reason": "bored"})], 1, "unknown turn/end reason")
    rejects(
        [
            start,
            ("step/start", {"turn": 1, "step": 1}),
            ("turn/end", {"turn": 1, "reason": "error"}),
        ],
        2,
        "step 1 is open",
    )
    rejects([start, ("turn/end", {"turn": 1, "reason": "error", "message": 3})], 1, "message")
    for reason in ("completed", "aborted", "error", "max-tokens", "blocked", "interrupted"):
        validate_log(log_of(start, ("turn/end", {"turn": 1, "reason": reason, "cause": {}})))


def test_step_rules() -> None:
    start = ("turn/start", {"turn": 1})
    s1 = ("step/start", {"turn": 1, "step": 1})
    e1 = ("step/end", {"turn": 1, "step": 1})
    rejects([s1], 0, "outside a turn")
    rejects([start, ("step/start", {"turn": 1, "step": 2})], 1, "1.1 was expected")
    rejects([start, ("step/start", {"turn": 2, "step": 1})], 1, "expected")
    rejects([start, s1, ("step/start", {"turn": 1, "step": 2})], 2, "step 1 is open")
    rejects([start, e1], 1, "no open step")
    rejects([start, s1, ("step/end", {"turn": 1, "step": 2})], 2, "closes 1.1")
    rejects([start, s1, e1, ("step/start", {"turn": 1, "step": 1})], 3, "1.2 was expected")
    # Steps restart at 1 in each turn.
    validate_log(
        log_of(
            start, s1, e1, ("turn/end", {"turn": 1, "reason": "completed"}),
            ("turn/start", {"turn": 2}), ("step/start", {"turn": 2, "step": 1}),
        )
    )  # fmt: skip


def test_user_message_placement() -> None:
    start = ("turn/start", {"turn": 1})
    s1 = ("step/start", {"turn": 1, "step": 1})
    rejects([("user/message", user())], 0, "outside a turn")
    rejects(
        [start, s1, ("assistant/message", assistant()), ("user/message", user())], 3, "right after"
    )
    rejects(
        [start, s1, ("step/end", {"turn": 1, "step": 1}), ("user/message", user())],
        3,
        "right after",
    )
    # Prompt, several steers, and inbox accounting in between are all fine.
    validate_log(
        log_of(
            start,
            ("inbox/accepted", accepted("m")),
            ("inbox/claimed", {"message_id": "m"}),
            ("user/message", user()),
            s1,
            ("request/header", {"system": "s", "tools": []}),
            ("user/message", user("a")),
            ("user/message", user("b")),
        )
    )  # fmt: skip
    bad = user()
    bad["message"]["role"] = "assistant"
    rejects([start, ("user/message", bad)], 1, "role 'user'")


def test_assistant_message_rules() -> None:
    start = ("turn/start", {"turn": 1})
    rejects([start, ("assistant/message", assistant())], 1, "outside a step")
    s1 = ("step/start", {"turn": 1, "step": 1})
    bad = assistant()
    bad["message"]["tool_calls"] = {}
    rejects([start, s1, ("assistant/message", bad)], 2, "tool_calls must be a list")
    rejects([start, s1, ("assistant/message", {**assistant(), "usage": 3})], 2, "usage")
    rejects([start, s1, ("assistant/message", {"message": assistant()["message"]})], 2, "finish")


def test_tool_call_and_result_pairing() -> None:
    start = ("turn/start", {"turn": 1})
    s1 = ("step/start", {"turn": 1, "step": 1})
    rejects([start, ("tool/call", call("c"))], 1, "tool/call outside a step")
    rejects([start, s1, ("tool/result", result("c"))], 2, "unknown call")
    rejects([start, s1, ("tool/call", call("c")), ("tool/call", call("c"))], 3, "repeats")
    rejects(
        [
            start,
            s1,
            ("tool/call", call("c")),
            ("tool/result", result("c")),
            ("tool/result", result("c")),
        ],
        4,
        "second tool/result",
    )
    rejects(
        [start, s1, ("tool/call", call("c")), ("tool/result", {**result("c"), "is_error": 0})],
        3,
        "bool",
    )
    rejects(
        [start, s1, ("tool/call", call("c")), ("tool/result", {**result("c"), "code": 1})],
        3,
        "code",
    )
    # A result must pair a call of the same turn.
    rejects(
        [
            start, s1, ("tool/call", call("c")), ("step/end", {"turn": 1, "step": 1}),
            ("turn/end", {"turn": 1, "reason": "aborted"}), ("turn/start", {"turn": 2}),
            ("tool/result", result("c")),
        ],
        6,
        "unknown call",
    )  # fmt: skip
    rejects([("tool/result", result("c"))], 0, "outside a turn")
    # Ids may repeat across turns.
    t1 = [
        ("turn/start", {"turn": 1}), s1, ("tool/call", call("c")), ("tool/result", result("c")),
        ("step/end", {"turn": 1, "step": 1}), ("turn/end", {"turn": 1, "reason": "completed"}),
    ]  # fmt: skip
    validate_log(log_of(*t1, ("turn/start", {"turn": 2}), ("step/start", {"turn": 2, "step": 1}),
                        ("tool/call", call("c"))))  # fmt: skip


def test_descriptor_only_inside_a_turn() -> None:
    desc = ("subagent/descriptor", {"descriptor": {"provider": "spawn"}})
    rejects([desc], 0, "outside a turn")
    validate_log(log_of(("turn/start", {"turn": 1}), desc))


def test_end_seed_rules() -> None:
    turn = one_turn()
    validate_log(log_of(*turn, ("session/end-seed", {"length": 12})))
    rejects([*turn, ("session/end-seed", {"length": 3})], 12, "length 3 at seq 12")
    rejects([("turn/start", {"turn": 1}), ("session/end-seed", {"length": 1})], 1, "inside a turn")
    header = SessionHeader(id="a", seed_length=12)
    validate_log(log_of(*turn, ("session/end-seed", {"length": 12})), header)
    with pytest.raises(InvariantError, match="seed ends inside an open turn") as info:
        validate_log(log_of(*turn[:5]), SessionHeader(id="a", seed_length=5))
    assert info.value.seq == 4


def test_inbox_accounting() -> None:
    acc = (
        "inbox/accepted",
        {"message_id": "m", "kind": "steer", "content": TEXT, "source": {"kind": "user"}},
    )
    validate_log(log_of(acc, ("inbox/discarded", {"message_id": "m", "reason": "cancelled"})))
    rejects([("inbox/claimed", {"message_id": "m"})], 0, "never accepted")
    rejects([acc, acc], 1, "accepted twice")
    rejects(
        [acc, ("inbox/claimed", {"message_id": "m"}), ("inbox/claimed", {"message_id": "m"})],
        2,
        "twice",
    )
    rejects([({"type": "inbox/accepted"}["type"], {**acc[1], "kind": "later"})], 0, "kind")
    rejects([("inbox/discarded", {"message_id": "m"})], 0, "reason")


def test_unknown_types_load_only_when_ignorable() -> None:
    validate_log(log_of(("x/future", {"ignorable": True, "k": 1}), *one_turn()))
    rejects([("x/future", {"k": 1})], 0, "unknown event type")
    rejects([("x/future", {"ignorable": "yes"})], 0, "unknown event type")


def test_request_header_fields() -> None:
    rejects([("request/header", {"system": "s"})], 0, "tools must be a list")


def test_a_failed_feed_leaves_the_replay_unchanged() -> None:
    replay = LogReplay()
    events = log_of(*one_turn())
    for event in events[:4]:
        replay.feed(event)
    bad: Event = {"type": "tool/result", "seq": 4, "time": 0.0, "data": result("nope")}
    with pytest.raises(InvariantError):
        replay.feed(bad)
    for event in events[4:]:
        replay.feed(event)
    assert not replay.turn_open


# -- completed_turn_prefix and repair closing --------------------------------------------------


def test_completed_turn_prefix() -> None:
    assert completed_turn_prefix([]) == []
    assert completed_turn_prefix(log_of(*one_turn()[:5])) == []
    two = log_of(*one_turn(1), *one_turn(2)[:4])
    prefix = completed_turn_prefix(two)
    assert prefix == two[:12]
    assert not validate_log(prefix).turn_open


def test_closing_events_close_an_open_turn() -> None:
    pairs = one_turn()[:5]  # tool/call c1 open inside step 1
    events = log_of(*pairs, ("tool/call", call("c2")))
    replay = validate_log(events, V1)
    closing = closing_events(replay)
    assert [t for t, _ in closing] == ["tool/result", "tool/result", "step/end", "turn/end"]
    assert [d.get("call_id") for t, d in closing[:2]] == ["c1", "c2"]
    assert all(d["is_error"] and d["code"] == "INTERRUPTED" for _, d in closing[:2])
    assert closing[-1][1]["reason"] == "interrupted"
    full = events + [
        {"type": t, "seq": len(events) + i, "time": 0.0, "data": d}
        for i, (t, d) in enumerate(closing)
    ]
    assert not validate_log(full, V1).turn_open
    assert closing_events(validate_log(log_of(*one_turn()))) == []


# -- generated logs ----------------------------------------------------------------------------


@st.composite
def valid_logs(draw: st.DrawFn) -> list[Event]:
    pairs: list[tuple[str, dict[str, Any]]] = []
    inbox = 0

    def maybe_inbox() -> None:
        nonlocal inbox
        if draw(st.booleans()):
            inbox += 1
            mid = f"m{inbox}"
            pairs.append(("inbox/accepted", accepted(mid)))
            if draw(st.booleans()):
                pairs.append(("inbox/claimed", {"message_id": mid}))

    for turn in range(1, draw(st.integers(0, 4)) + 1):
        maybe_inbox()
        pairs.append(("turn/start", {"turn": turn}))
        pairs.append(("user/message", user()))
        if draw(st.booleans()):
            pairs.append(("subagent/descriptor", {"descriptor": {"v": 1}}))
        call_n = 0
        for step in range(1, draw(st.integers(1, 3)) + 1):
            pairs.append(("step/start", {"turn": turn, "step": step}))
            if draw(st.booleans()):
                pairs.append(("user/message", user("steer")))
            ids = [f"c{call_n + i}" for i in range(draw(st.integers(0, 2)))]
            call_n += len(ids)
            pairs.append(("assistant/message", assistant(ids)))
            for cid in ids:
                pairs.append(("tool/call", call(cid)))
                maybe_inbox()
            for cid in ids:
                pairs.append(("tool/result", result(cid)))
            pairs.append(("step/end", {"turn": turn, "step": step}))
        pairs.append(
            ("turn/end", {"turn": turn, "reason": draw(st.sampled_from(["completed", "error"]))})
        )
    return log_of(*pairs)


def renumber(events: list[Event]) -> list[Event]:
    return [{**e, "seq": i} for i, e in enumerate(events)]


@settings(max_examples=150)
@given(valid_logs(), st.data())
def test_generated_logs_and_all_their_prefixes_validate(
    events: list[Event], data: st.DataObject
) -> None:
    gevent.sleep(0)  # many examples in one test: let the hub run between them
    validate_log(events)
    cut = data.draw(st.integers(0, len(events)))
    validate_log(events[:cut])
    prefix = completed_turn_prefix(events[:cut])
    assert not validate_log(prefix).turn_open


STRUCTURAL = {"turn/start", "step/start", "step/end", "tool/call"}


@settings(max_examples=300)
@given(valid_logs(), st.data())
def test_mutations_are_rejected(events: list[Event], data: st.DataObject) -> None:
    gevent.sleep(0)  # many examples in one test: let the hub run between them
    if not events:
        return
    kind = data.draw(
        st.sampled_from(["seq", "drop", "dup-result", "unknown", "turn-number", "time"])
    )
    mutated = copy.deepcopy(events)
    if kind == "seq":
        index = data.draw(st.integers(0, len(events) - 1))
        mutated[index]["seq"] += data.draw(st.sampled_from([-1, 1, 2]))
    elif kind == "drop":
        candidates = [
            i
            for i, e in enumerate(events)
            if e["type"] in STRUCTURAL or (e["type"] == "turn/end" and i < len(events) - 1)
        ]
        index = data.draw(st.sampled_from(candidates))
        mutated = renumber(mutated[:index] + mutated[index + 1 :])
    elif kind == "dup-result":
        results = [i for i, e in enumerate(events) if e["type"] == "tool/result"]
        if not results:
            return
        index = data.draw(st.sampled_from(results))
        mutated = renumber(
            [*mutated[: index + 1], copy.deepcopy(mutated[index]), *mutated[index + 1 :]]
        )
    elif kind == "unknown":
        index = data.draw(st.integers(0, len(events)))
        odd: Event = {"type": "x/unknown", "seq": 0, "time": 0.0, "data": {}}
        mutated = renumber([*mutated[:index], odd, *mutated[index:]])
    elif kind == "turn-number":
        starts = [i for i, e in enumerate(events) if e["type"] == "turn/start"]
        index = data.draw(st.sampled_from(starts))
        mutated[index]["data"]["turn"] += data.draw(st.sampled_from([-1, 1]))
    else:
        index = data.draw(st.integers(0, len(events) - 1))
        mutated[index]["time"] = "later"  # type: ignore[typeddict-item]
    with pytest.raises(InvariantError) as info:
        validate_log(mutated, V1)  # format-1 events: dropping a tool/call or step/end is a break
    assert 0 <= info.value.seq < len(mutated)


# -- SessionLog --------------------------------------------------------------------------------


class RecordingSink:
    def __init__(self, fail_write: bool = False, fail_sync: bool = False) -> None:
        self.data = bytearray(encode_header(SessionHeader(id="s", created_at=1.0, cwd="/")))
        self.writes = 0
        self.syncs = 0
        self.closed = False
        self.fail_write = fail_write
        self.fail_sync = fail_sync

    def write(self, data: bytes | bytearray) -> None:
        if self.fail_write:
            raise OSError("disk full")
        self.writes += 1
        self.data += data

    def sync(self) -> None:
        if self.fail_sync:
            raise OSError("EIO")
        self.syncs += 1

    def close(self) -> None:
        self.closed = True


def make_log(sink: RecordingSink, durability: Any = "turn") -> SessionLog:
    return SessionLog(SessionHeader(id="s", created_at=1.0, cwd="/"), [], sink, durability)


def test_append_assigns_seq_time_and_buffers_without_writing() -> None:
    sink = RecordingSink()
    log = make_log(sink)
    first = log.append("turn/start", {"turn": 1})
    second = log.append("user/message", user())
    assert (first["seq"], second["seq"]) == (0, 1)
    assert isinstance(first["time"], float)
    assert log.events == [first, second]
    assert sink.writes == 0
    log.checkpoint("step")
    assert sink.writes == 1
    _, events, _, torn = decode_frames(bytes(sink.data), "s")
    assert events == [first, second] and not torn


def test_append_rejects_lossy_data_and_bad_structure_at_the_call_site() -> None:
    log = make_log(RecordingSink())
    with pytest.raises(TypeError, match=r"turn/start\.data\.x"):
        log.append("turn/start", {"turn": 1, "x": math.inf})
    with pytest.raises(InvariantError, match="outside a turn"):
        log.append("step/start", {"turn": 1, "step": 1})
    assert log.events == []
    assert log.append("turn/start", {"turn": 1})["seq"] == 0


@pytest.mark.parametrize(
    ("kind", "data", "error", "match"),
    [
        # Flat events skip the lossless-JSON walk; the replay and the strict encoder still
        # refuse everything the walk would have, at the call site.
        ("turn/start", {"turn": 2**64}, TypeError, r"turn/start\.data\.turn: integer"),
        ("turn/start", {"turn": -(2**63) - 1}, TypeError, r"turn/start\.data\.turn: integer"),
        ("turn/start", {"turn": True}, InvariantError, "turn must be an int"),
        ("turn/start", {"turn": 1.0}, InvariantError, "turn must be an int"),
        ("turn/start", {"turn": math.nan}, InvariantError, "turn must be an int"),
        ("turn/start", {"turn": 1, "x": b"raw"}, TypeError, r"turn/start\.data\.x: bytes"),
        ("turn/start", {"turn": 1, "x": math.nan}, TypeError, r"turn/start\.data\.x"),
        ("turn/start", {"turn": 1, 2: "x"}, TypeError, "key 2 is a int"),
        ("inbox/claimed", {"message_id": ("m",)}, TypeError, r"message_id: tuple"),
        ("inbox/claimed", {"message_id": 5}, InvariantError, "message_id must be a str"),
    ],
)
def test_flat_events_are_still_checked_without_the_walk(
    kind: str, data: dict[str, Any], error: type[Exception], match: str
) -> None:
    log = make_log(RecordingSink())
    with pytest.raises(error, match=match):
        log.append(kind, data)
    assert log.events == []
    assert log.append("turn/start", {"turn": 1})["seq"] == 0


def test_a_flat_event_with_a_lone_surrogate_is_repaired() -> None:
    log = make_log(RecordingSink())
    log.append("turn/start", {"turn": 1})
    log.append("user/message", user())
    log.append("turn/end", {"turn": 1, "reason": "completed"})
    data = {"message_id": "m\ud800"}
    log.append("inbox/accepted", accepted("m\ud800"))
    log.append("inbox/claimed", data)
    assert data["message_id"] == "m\ufffd"
    assert log.events[-1]["data"] == {"message_id": "m\ufffd"}


def test_prechecked_data_still_meets_the_strict_encoder_and_the_replay() -> None:
    log = make_log(RecordingSink())
    log.append("turn/start", {"turn": 1})
    log.append("user/message", user())
    log.append("step/start", {"turn": 1, "step": 1})
    with pytest.raises(TypeError, match=r"tool/call\.data\.arguments\.k: tuple"):
        log.append("tool/call", {**call("c"), "arguments": {"k": (1,)}}, prechecked=True)
    with pytest.raises(InvariantError, match="name must be a str"):
        log.append("tool/call", {**call("c"), "name": 7}, prechecked=True)
    assert len(log.events) == 3
    assert log.append("tool/call", call("c"), prechecked=True)["seq"] == 3


@pytest.mark.parametrize(
    ("durability", "step_syncs", "turn_syncs"),
    [("turn", 0, 1), ("step", 1, 2), ("none", 0, 0)],
)
def test_durability_settings(durability: str, step_syncs: int, turn_syncs: int) -> None:
    sink = RecordingSink()
    log = make_log(sink, durability)
    log.append("turn/start", {"turn": 1})
    log.checkpoint("step")
    assert sink.writes == 1 and sink.syncs == step_syncs
    log.append("turn/end", {"turn": 1, "reason": "completed"})
    log.checkpoint("turn")
    assert sink.writes == 2 and sink.syncs == turn_syncs
    log.checkpoint("turn")  # nothing new: no write, no sync
    assert sink.writes == 2 and sink.syncs == turn_syncs


def test_close_flushes_and_syncs_then_refuses_appends() -> None:
    sink = RecordingSink()
    log = make_log(sink)
    log.append("turn/start", {"turn": 1})
    log.close()
    log.close()
    assert sink.writes == 1 and sink.syncs == 1 and sink.closed
    with pytest.raises(ValueError, match="closed"):
        log.append("turn/end", {"turn": 1, "reason": "completed"})


@pytest.mark.parametrize("failure", ["fail_write", "fail_sync"])
def test_a_failed_write_or_sync_raises_and_poisons_the_log(failure: str) -> None:
    sink = RecordingSink(**{failure: True})
    log = make_log(sink)
    log.append("turn/start", {"turn": 1})
    with pytest.raises(OSError):
        log.checkpoint("turn")
    with pytest.raises(OSError, match="unusable"):
        log.append("turn/end", {"turn": 1, "reason": "completed"})
    with pytest.raises(OSError, match="unusable"):
        log.checkpoint("turn")
    log.close()
    assert sink.closed


def test_checkpoint_point_is_checked() -> None:
    with pytest.raises(ValueError):
        make_log(RecordingSink()).checkpoint("request")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        make_log(RecordingSink(), "sometimes")


def _deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"k": value}
    return value


_TEXT = [{"type": "text", "text": "ok"}]


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        # The step's own shapes skip the walk (agent.log._PLAIN); each value here differs from
        # such a shape in one place the walk must still see, so the append refuses it as before.
        ("tool/result", {**result("c"), "content": [{"type": "text", "text": math.nan}]}),
        ("tool/result", {**result("c"), "content": [{"type": "text", "text": "x", 1: "y"}]}),
        ("tool/result", {**result("c"), "content": [{"type": "text", "n": math.inf}]}),
        ("tool/result", {**result("c"), "extra": {1: "x"}}),
        ("tool/result", {**result("c"), "content": [{"type": "image", "data": math.nan}]}),
        ("assistant/message", {"message": {**assistant()["message"], "content": [{3: "x"}]}}),
        (
            "assistant/message",
            {
                **assistant(["c"]),
                "message": {
                    **assistant(["c"])["message"],
                    "tool_calls": [{"id": "c", "name": "t", "arguments": {"x": math.nan}}],
                },
            },
        ),
        (
            "assistant/message",
            {
                **assistant(["c"]),
                "message": {
                    **assistant(["c"])["message"],
                    "tool_calls": [{"id": "c", "name": "t", "arguments": _deep(197)}],
                },
            },
        ),
        *(
            (
                "assistant/message",
                {
                    **assistant(["c"]),
                    "message": {
                        **assistant(["c"])["message"],
                        "tool_calls": [{"id": "c", "name": "t", "arguments": bad}],
                    },
                },
            )
            # Flat arguments are checked without the walk (agent.log.is_plain_reply).
            for bad in ({"x": math.inf}, {"x": 2**64}, {"x": -(2**63) - 1}, {1: "x"}, {"x": b"y"})
        ),
        ("assistant/message", {**assistant(), "usage": {"input_tokens": math.inf}}),
        ("assistant/message", {**assistant(), "usage": {1: 2}}),
    ],
)
def test_the_step_shapes_that_skip_the_walk_still_refuse_what_it_refuses(
    kind: str, data: dict[str, Any]
) -> None:
    from agent.jsoncheck import is_lossless

    assert not is_lossless(data)
    log = make_log(RecordingSink())
    log.append("turn/start", {"turn": 1})
    log.append("user/message", user())
    log.append("step/start", {"turn": 1, "step": 1})
    log.append("assistant/message", assistant(["c"]))
    log.append("tool/call", call("c"))
    with pytest.raises(TypeError, match=rf"{kind}\.data"):
        log.append(kind, data)
    assert len(log.events) == 5
    # The plain shapes themselves are accepted (and logged as given).
    log.append("tool/result", {**result("c"), "content": _TEXT, "code": "X"})
    log.append("step/end", {"turn": 1, "step": 1})
    log.append("step/start", {"turn": 1, "step": 2})
    deep_enough = {**assistant(["d"])["message"]}
    deep_enough["tool_calls"] = [{"id": "d", "name": "t", "arguments": _deep(195)}]
    log.append("assistant/message", {"message": deep_enough, "finish": "tool_calls"})
    assert log.events[-1]["data"]["message"]["tool_calls"][0]["arguments"] == _deep(195)


_SOURCE = {"kind": "coordinator", "sender_session_id": "s1"}


def _accepted(**changes: Any) -> dict[str, Any]:
    return {"message_id": "m0", "kind": "send", "content": _TEXT, "source": _SOURCE, **changes}


def _user_message(**changes: Any) -> dict[str, Any]:
    return {"message": {"id": "m0", "role": "user", "content": _TEXT, "source": _SOURCE, **changes}}


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        # A prompt's shapes skip the walk too (a child's first prompt, every steer); each value
        # differs from the plain shape in one place the walk must still see.
        ("inbox/accepted", _accepted(content=[{"type": "text", "text": math.nan}])),
        ("inbox/accepted", _accepted(content=[{"type": "text", "text": "x", 1: "y"}])),
        ("inbox/accepted", _accepted(source={"kind": "user", "n": math.inf})),
        ("inbox/accepted", _accepted(source={1: "user"})),
        ("inbox/accepted", _accepted(extra={"x": math.nan})),
        ("user/message", _user_message(content=[{"type": "image", "data": math.nan}])),
        ("user/message", _user_message(source={"kind": "user", "n": math.nan})),
        ("user/message", _user_message(extra={2: "x"})),
        ("user/message", {**_user_message(), "extra": math.inf}),
    ],
)
def test_the_prompt_shapes_that_skip_the_walk_still_refuse_what_it_refuses(
    kind: str, data: dict[str, Any]
) -> None:
    from agent.jsoncheck import is_lossless

    assert not is_lossless(data)
    log = make_log(RecordingSink())
    if kind == "user/message":
        log.append("inbox/accepted", _accepted())
        log.append("inbox/claimed", {"message_id": "m0"})
        log.append("turn/start", {"turn": 1})
    with pytest.raises(TypeError, match=rf"{kind}\.data"):
        log.append(kind, data)
    before = len(log.events)
    # The plain shape itself is accepted and logged as given.
    log.append(kind, _accepted() if kind == "inbox/accepted" else _user_message())
    assert log.events[before]["data"]["content" if kind == "inbox/accepted" else "message"]


_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**65), max_value=2**65)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=3)
    | st.binary(max_size=2)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=2) | st.integers(0, 3), inner, max_size=3)
    ),
    max_leaves=8,
)


@settings(max_examples=300)
@given(st.dictionaries(st.text(max_size=2) | st.integers(0, 2), _VALUES, max_size=4), _VALUES)
def test_a_plain_reply_is_lossless(arguments: dict[Any, Any], content_text: object) -> None:
    """`is_plain_reply` answers "certainly lossless" or "walk it", never more permissive."""
    from agent.jsoncheck import is_lossless
    from agent.log import is_plain_reply

    gevent.sleep(0)
    message = {
        "id": "a1",
        "role": "assistant",
        "content": [{"type": "text", "text": content_text}],
        "tool_calls": [{"id": "c", "name": "t", "arguments": arguments}],
    }
    if is_plain_reply(message):
        assert is_lossless(message, 1)


# Every field rule of every event type, as (type, field, exact type, required): the replay tests
# them in one generated expression per type (`agent.log._fields_check`); each broken field must
# still be refused, naming that field, whichever it is.
_FIELD_RULES = [
    ("turn/start", "turn", int, True),
    ("turn/end", "turn", int, True),
    ("turn/end", "reason", str, True),
    ("turn/end", "message", str, False),
    ("step/start", "turn", int, True),
    ("step/start", "step", int, True),
    ("step/end", "turn", int, True),
    ("step/end", "step", int, True),
    ("user/message", "message", dict, True),
    ("assistant/message", "message", dict, True),
    ("assistant/message", "finish", str, True),
    ("assistant/message", "usage", dict, False),
    ("tool/call", "call_id", str, True),
    ("tool/call", "name", str, True),
    ("tool/call", "arguments", dict, True),
    ("tool/result", "call_id", str, True),
    ("tool/result", "name", str, True),
    ("tool/result", "content", list, True),
    ("tool/result", "is_error", bool, True),
    ("tool/result", "code", str, False),
    ("session/end-seed", "length", int, True),
    ("subagent/descriptor", "descriptor", dict, True),
    ("inbox/accepted", "message_id", str, True),
    ("inbox/accepted", "kind", str, True),
    ("inbox/accepted", "content", list, True),
    ("inbox/accepted", "source", dict, True),
    ("inbox/claimed", "message_id", str, True),
    ("inbox/discarded", "message_id", str, True),
    ("inbox/discarded", "reason", str, True),
]
_GOOD: dict[type, Any] = {int: 1, str: "x", list: [], dict: {}, bool: False}
_WRONG: dict[type, Any] = {int: True, str: 1, list: (), dict: [], bool: 0}


@pytest.mark.parametrize(("kind", "field", "typ", "required"), _FIELD_RULES)
def test_each_field_rule_refuses_its_field_by_name(
    kind: str, field: str, typ: type, required: bool
) -> None:
    good = {f: _GOOD[t] for k, f, t, r in _FIELD_RULES if k == kind and r}
    what = {int: "an int", str: "a str", list: "a list", dict: "a dict", bool: "a bool"}[typ]
    wrongs = [_WRONG[typ]] + ([None] if required else [])
    if required:
        wrongs.append("missing")
    for wrong in wrongs:
        data = dict(good)
        if wrong == "missing":
            del data[field]
        else:
            data[field] = wrong
        with pytest.raises(InvariantError, match=f"{kind}: {field} must be {what}"):
            LogReplay(None).feed_next(kind, data)
    # Fields are checked in their order: the first broken one is named.
    if required and len(good) > 1:
        broken = {f: None for f in good}
        first = next(f for k, f, t, r in _FIELD_RULES if k == kind and r)
        with pytest.raises(InvariantError, match=f"{kind}: {first} must be"):
            LogReplay(None).feed_next(kind, broken)


def test_next_seq_is_the_seq_the_next_event_gets() -> None:
    """The loop and the actor name replies, prompts and steers by it (`a{seq}`, `m{seq}`,
    `s{seq}`): it must be the next event's seq whatever happened, a refused append included,
    and count the events a log was opened with."""
    log = make_log(RecordingSink())
    assert log.next_seq == 0
    assert log.append("turn/start", {"turn": 1})["seq"] == 0
    assert log.next_seq == len(log.events) == 1
    with pytest.raises(InvariantError):
        log.append("turn/start", {"turn": 2})  # turn 1 is open
    assert log.next_seq == len(log.events) == 1
    assert log.append("turn/end", {"turn": 1, "reason": "completed"})["seq"] == log.next_seq - 1
    loaded = SessionLog(log.header, list(log.events), RecordingSink())
    assert loaded.next_seq == len(loaded.events) == 2
    with pytest.raises(AttributeError):
        loaded.next_seq = 5  # type: ignore[misc]
