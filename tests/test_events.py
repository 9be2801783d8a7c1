"""Event vocabulary, session header and the lossless-JSON check."""

from __future__ import annotations

import math
from collections import OrderedDict
from enum import Enum
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent import events as ev
from agent.events import SessionHeader, is_ignorable, validate_session_id
from agent.jsoncheck import MAX_DEPTH, check_json

# -- check_json -------------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=30,
)


@given(json_values)
def test_lossless_values_pass_and_round_trip_through_msgpack(value: Any) -> None:
    check_json(value)
    packed = msgpack.packb(value, use_bin_type=True)
    assert msgpack.unpackb(packed) == value


class Color(Enum):
    RED = "red"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"x": math.nan}, "data.x"),
        ({"x": math.inf}, "data.x"),
        ({"x": [1, -math.inf]}, "data.x[1]"),
        ({1: "a"}, "data"),
        ({"a": {None: 1}}, "data.a"),
        ({"b": b"raw"}, "data.b"),
        ({"s": {1, 2}}, "data.s"),
        ({"t": (1, 2)}, "data.t"),
        ({"o": object()}, "data.o"),
        ({"e": Color.RED}, "data.e"),
        ({"d": OrderedDict(a=1)}, "data.d"),
        ({"big": 2**64}, "data.big"),
        ({"neg": -(2**63) - 1}, "data.neg"),
        ({"l": [{"deep": [1, 2, {"k": bytearray(b"x")}]}]}, "data.l[0].deep[2].k"),
    ],
)
def test_lossy_values_raise_type_error_naming_the_path(value: Any, path: str) -> None:
    with pytest.raises(TypeError) as info:
        check_json(value)
    assert str(info.value).startswith(path + ":")


def test_where_prefixes_the_path() -> None:
    with pytest.raises(TypeError, match=r"^turn/start\.data\.x:"):
        check_json({"x": math.nan}, where="turn/start.data")


def test_cycles_are_named() -> None:
    loop: dict[str, Any] = {"a": []}
    loop["a"].append(loop)
    with pytest.raises(TypeError, match=r"data\.a\[0\]: cycle"):
        check_json(loop)


def test_nesting_limit() -> None:
    ok: Any = "leaf"
    for _ in range(MAX_DEPTH - 1):
        ok = [ok]
    check_json(ok)
    too_deep: Any = ok
    for _ in range(2):
        too_deep = [too_deep]
    with pytest.raises(TypeError, match="nested deeper"):
        check_json(too_deep)


def test_shared_but_acyclic_values_are_fine() -> None:
    shared = {"k": 1}
    check_json({"a": shared, "b": [shared, shared]})


# -- vocabulary --------------------------------------------------------------------------------


def test_event_type_names() -> None:
    assert {
        "turn/start",
        "turn/end",
        "step/start",
        "step/end",
        "user/message",
        "assistant/message",
        "tool/call",
        "tool/result",
        "request/header",
        "session/end-seed",
        "subagent/descriptor",
        "inbox/accepted",
        "inbox/claimed",
        "inbox/discarded",
    } == ev.EVENT_TYPES
    assert {
        "completed",
        "aborted",
        "error",
        "max-tokens",
        "blocked",
        "refusal",
        "interrupted",
        "budget-exceeded",
    } == ev.TURN_END_REASONS


def test_is_ignorable_needs_literal_true() -> None:
    base: ev.Event = {"type": "x/new", "seq": 0, "time": 0.0, "data": {"ignorable": True}}
    assert is_ignorable(base)
    assert not is_ignorable({**base, "data": {"ignorable": 1}})
    assert not is_ignorable({**base, "data": {}})


@pytest.mark.parametrize("good", ["a", "A1", "0.b-c_d", "x" * 128])
def test_valid_session_ids(good: str) -> None:
    assert validate_session_id(good) == good


@pytest.mark.parametrize(
    "bad", ["", ".hidden", "-x", "a/b", "../etc", "a\\b", "x" * 129, "a b", "é", "a\n", 5]
)
def test_invalid_session_ids(bad: Any) -> None:
    with pytest.raises(ValueError):
        validate_session_id(bad)


# -- header ------------------------------------------------------------------------------------


def test_header_round_trip_and_defaults() -> None:
    header = SessionHeader(
        id="child-1",
        created_at=12.5,
        cwd="/tmp",
        parent_session="parent",
        origin="subagent",
        delegation_depth=2,
        seed_length=7,
    )
    assert header.version == 3  # format 3: no step/start, tool/call or step/end events
    assert SessionHeader.from_json(header.to_json()) == header
    check_json(header.to_json())
    plain = SessionHeader(id="p")
    assert plain.parent_session is None and plain.origin is None
    assert plain.delegation_depth == 0 and plain.seed_length == 0
    assert isinstance(plain.created_at, float) and plain.cwd


def test_header_ignores_unknown_keys_but_needs_required_ones() -> None:
    data = SessionHeader(id="a", created_at=1.0, cwd="/").to_json()
    assert SessionHeader.from_json({**data, "future": 1}).id == "a"
    del data["cwd"]
    with pytest.raises(ValueError, match="cwd"):
        SessionHeader.from_json(data)
    with pytest.raises(TypeError):
        SessionHeader.from_json([1])


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "../x"},
        {"version": 4},
        {"version": 0},
        {"origin": "user"},
        {"delegation_depth": -1},
        {"seed_length": 1.5},
        {"parent_session": "a/b"},
    ],
)
def test_header_rejects_bad_fields(bad: dict[str, Any]) -> None:
    fields: dict[str, Any] = {"id": "a", "created_at": 1.0, "cwd": "/"}
    fields.update(bad)
    with pytest.raises(ValueError):
        SessionHeader(**fields)


def test_header_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        SessionHeader("a")  # type: ignore[call-arg]


def test_header_to_json_names_every_field() -> None:
    """`to_json` is spelled out for speed: a field added to the header must be added there."""
    import dataclasses

    header = SessionHeader(id="a", created_at=1.0, cwd="/", delegation_depth=2, seed_length=0)
    assert set(header.to_json()) == {f.name for f in dataclasses.fields(SessionHeader)}
    assert SessionHeader.from_json(header.to_json()) == header
