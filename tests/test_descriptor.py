"""The continuable child's descriptor: versioned, strict for its own version, never a crash."""

from __future__ import annotations

import json
from typing import Any

import gevent
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from subagent.descriptor import (
    DESCRIPTOR_EVENT,
    DESCRIPTOR_VERSION,
    DescriptorError,
    SubagentDescriptor,
    Unclassifiable,
    authoritative_descriptor,
    parse_descriptor,
)
from subagent.types import ToolRestriction

FULL = SubagentDescriptor(
    provider="spawn",
    label="researcher",
    model="scripted:default",
    persona="You are terse.",
    tool_filter=ToolRestriction(allow=("read", "grep"), deny=("write",)),
)
MINIMAL = SubagentDescriptor(provider="fork", label="helper", model="openai:gpt-4o-mini")


def _good() -> dict[str, Any]:
    return FULL.to_json()


def _event(seq: int, type_: str, data: dict[str, Any]) -> dict[str, Any]:
    return {"type": type_, "seq": seq, "time": 0.0, "data": data}


def _desc_event(seq: int, descriptor: Any) -> dict[str, Any]:
    return _event(seq, DESCRIPTOR_EVENT, {"descriptor": descriptor})


# -- shape ---------------------------------------------------------------------------------------


def test_to_json_is_versioned_lossless_json_and_round_trips() -> None:
    for d in (FULL, MINIMAL):
        data = d.to_json()
        assert data["version"] == 1 and DESCRIPTOR_VERSION == 3
        assert json.loads(json.dumps(data, allow_nan=False)) == data
        assert parse_descriptor(data) == d
    assert MINIMAL.to_json() == {
        "version": 1,
        "provider": "fork",
        "label": "helper",
        "model": "openai:gpt-4o-mini",
    }


def test_descriptor_holds_only_the_explicit_composition_fields() -> None:
    # Never the options object, never depth, never the output schema.
    assert set(FULL.to_json()) == {
        "version",
        "provider",
        "label",
        "model",
        "persona",
        "tool_filter",
    }
    assert not hasattr(FULL, "agent_options")
    assert not hasattr(FULL, "depth")
    assert not hasattr(FULL, "output_schema")


def test_descriptor_is_frozen() -> None:
    with pytest.raises(AttributeError):
        FULL.model = "x:y"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"provider": 1}, TypeError),
        ({"label": None}, TypeError),
        ({"model": b"a:b"}, TypeError),
        ({"persona": 3}, TypeError),
        ({"tool_filter": {"allow": ["x"]}}, TypeError),
        ({"provider": ""}, ValueError),
        ({"label": ""}, ValueError),
        ({"model": "no-colon"}, ValueError),
        ({"model": ":model"}, ValueError),
        ({"model": "prefix:"}, ValueError),
        ({"tool_filter": ToolRestriction(allow=("",))}, ValueError),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs: dict[str, Any], error: type[Exception]) -> None:
    base: dict[str, Any] = {"provider": "spawn", "label": "l", "model": "a:b"}
    with pytest.raises(error):
        SubagentDescriptor(**{**base, **kwargs})


# -- parsing: malformed current version names the field ------------------------------------------


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("provider"), "provider"),
        (lambda d: d.pop("label"), "label"),
        (lambda d: d.pop("model"), "model"),
        (lambda d: d.update(provider=7), "provider"),
        (lambda d: d.update(provider=""), "provider"),
        (lambda d: d.update(label=["x"]), "label"),
        (lambda d: d.update(model="gpt-4o"), "model"),
        (lambda d: d.update(model=None), "model"),
        (lambda d: d.update(persona=1.5), "persona"),
        (lambda d: d.update(tool_filter="read"), "tool_filter"),
        (lambda d: d.update(tool_filter={"allow": "read"}), "tool_filter"),
        (lambda d: d.update(tool_filter={"allow": [1]}), "tool_filter"),
        (lambda d: d.update(tool_filter={"deny": [""]}), "tool_filter"),
        (lambda d: d.update(tool_filter={"only": ["x"]}), "tool_filter"),
        (lambda d: d.update(depth=2), "depth"),
        (lambda d: d.update(output_schema={}), "output_schema"),
    ],
)
def test_malformed_current_version_raises_naming_the_field(mutate: Any, field: str) -> None:
    data = _good()
    mutate(data)
    with pytest.raises(DescriptorError) as info:
        parse_descriptor(data)
    assert info.value.field == field
    assert field in str(info.value)
    assert isinstance(info.value, ValueError)


def test_optional_fields_may_be_absent_or_null() -> None:
    data = MINIMAL.to_json()
    assert parse_descriptor({**data, "persona": None, "tool_filter": None}) == MINIMAL
    parsed = parse_descriptor({**data, "tool_filter": {}})
    assert isinstance(parsed, SubagentDescriptor)
    assert parsed.tool_filter == ToolRestriction()


@pytest.mark.parametrize(
    "data",
    [
        {**FULL.to_json(), "version": 4},
        {**FULL.to_json(), "version": 0},
        {**FULL.to_json(), "version": "1"},
        {**FULL.to_json(), "version": True},
        {**FULL.to_json(), "version": 1.0},
        {k: v for k, v in FULL.to_json().items() if k != "version"},
        {"version": 99, "anything": "a future runtime wrote this"},
        None,
        [],
        "descriptor",
        42,
    ],
)
def test_unknown_version_or_shape_is_unclassifiable_not_an_error(data: Any) -> None:
    result = parse_descriptor(data)
    assert isinstance(result, Unclassifiable)
    assert result.reason


# -- fuzzing -------------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
field_values = st.one_of(
    json_values,
    st.sampled_from(["spawn", "a:b", "", "x", ":", "a:", " a:b"]),
    st.fixed_dictionaries(
        {},
        optional={
            "allow": st.lists(st.text(max_size=4), max_size=3) | json_values,
            "deny": st.lists(st.text(max_size=4), max_size=3) | json_values,
        },
    ),
)
descriptor_like = st.fixed_dictionaries(
    {},
    optional={
        "version": st.sampled_from([1, 1, 1, 2, 3, 4, 0, "1", None, True]),
        "provider": field_values,
        "label": field_values,
        "model": field_values,
        "persona": field_values,
        "tool_filter": field_values,
        "extra": json_values,
    },
)

# Near misses: a valid payload with one field replaced, removed or added.
near_valid = st.builds(
    lambda base, key, value, drop: (
        {k: v for k, v in base.items() if k != key} if drop else {**base, key: value}
    ),
    st.sampled_from([FULL.to_json(), MINIMAL.to_json()]),
    st.sampled_from(
        ["provider", "label", "model", "persona", "tool_filter", "version", "extra", "depth"]
    ),
    field_values,
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(st.one_of(json_values, descriptor_like, near_valid))
def test_parse_descriptor_never_raises_anything_else(data: Any) -> None:
    gevent.sleep(0)  # many examples in one test: let the hub (and its monitor) breathe
    try:
        result = parse_descriptor(data)
    except DescriptorError as exc:
        assert (
            isinstance(data, dict)
            and data.get("version") in (1, 2, 3)
            and data.get("version") is not True
        )
        assert exc.field
        return
    assert isinstance(result, SubagentDescriptor | Unclassifiable)
    if isinstance(result, SubagentDescriptor):
        assert parse_descriptor(result.to_json()) == result


@given(
    st.builds(
        SubagentDescriptor,
        provider=st.text(min_size=1, max_size=10),
        label=st.text(min_size=1, max_size=10),
        model=st.tuples(
            st.text(min_size=1, max_size=5).filter(lambda p: ":" not in p and p == p.strip()),
            st.text(min_size=1, max_size=5),
        ).map(":".join),
        persona=st.none() | st.text(max_size=10),
        tool_filter=st.none()
        | st.builds(
            ToolRestriction,
            allow=st.none() | st.lists(st.text(min_size=1, max_size=4), max_size=3).map(tuple),
            deny=st.none() | st.lists(st.text(min_size=1, max_size=4), max_size=3).map(tuple),
        ),
    )
)
def test_every_valid_descriptor_round_trips_through_json(d: SubagentDescriptor) -> None:
    gevent.sleep(0)
    assert parse_descriptor(json.loads(json.dumps(d.to_json()))) == d


# -- the authoritative descriptor ----------------------------------------------------------------


def test_first_descriptor_after_the_fork_prefix_is_authoritative() -> None:
    parent_desc = SubagentDescriptor(provider="parent", label="p", model="a:b")
    later = SubagentDescriptor(provider="later", label="l", model="c:d")
    events = [
        _event(0, "turn/start", {}),
        _desc_event(1, parent_desc.to_json()),  # inherited through the fork's seed
        _event(2, "turn/end", {}),
        _event(3, "session/end-seed", {"length": 3}),
        _event(4, "turn/start", {}),
        _desc_event(5, FULL.to_json()),
        _desc_event(6, later.to_json()),
    ]
    assert authoritative_descriptor(events, seed_length=3) == FULL
    # Without a prefix the parent's own descriptor would be first.
    assert authoritative_descriptor(events, seed_length=0) == parent_desc
    # Consumed lazily: it stops at the first match.
    consumed: list[int] = []

    def stream() -> Any:
        for e in events:
            consumed.append(e["seq"])
            yield e

    assert authoritative_descriptor(stream(), seed_length=3) == FULL
    assert consumed == [0, 1, 2, 3, 4, 5]


def test_no_descriptor_after_the_prefix_is_none() -> None:
    events = [_desc_event(0, FULL.to_json()), _event(1, "turn/start", {})]
    assert authoritative_descriptor(events, seed_length=1) is None
    assert authoritative_descriptor([], seed_length=0) is None


def test_a_later_good_descriptor_does_not_rescue_a_bad_first_one() -> None:
    bad = {**FULL.to_json(), "model": "nope"}
    with pytest.raises(DescriptorError) as info:
        authoritative_descriptor([_desc_event(0, bad), _desc_event(1, FULL.to_json())], 0)
    assert info.value.field == "model"
    future = {**FULL.to_json(), "version": 4}
    got = authoritative_descriptor([_desc_event(0, future), _desc_event(1, FULL.to_json())], 0)
    assert isinstance(got, Unclassifiable)


def test_descriptor_event_without_payload_is_unclassifiable() -> None:
    got = authoritative_descriptor([_event(0, DESCRIPTOR_EVENT, {})], 0)
    assert isinstance(got, Unclassifiable)


def test_authoritative_descriptor_rejects_bad_seed_length() -> None:
    with pytest.raises(TypeError):
        authoritative_descriptor([], seed_length="0")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        authoritative_descriptor([], seed_length=True)
    with pytest.raises(ValueError):
        authoritative_descriptor([], seed_length=-1)
