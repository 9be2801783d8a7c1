"""The fast argument check is never more permissive than jsonschema: whenever it says valid,
jsonschema agrees. (When it says no, jsonschema decides, so it may be as strict as it likes.)"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from agent.fastcheck import compile_fast_check

TYPES = ["object", "array", "string", "integer", "number", "boolean", "null"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.floats(-3, 3, allow_nan=False),
    st.sampled_from(["", "a", "b"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
    ),
    max_leaves=8,
)


def schemas() -> st.SearchStrategy[dict[str, Any]]:
    leaf = st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(
                st.sampled_from(TYPES), st.lists(st.sampled_from(TYPES), min_size=1, max_size=3)
            ),
            "enum": st.lists(scalars, min_size=1, max_size=3),
            "const": scalars,
            "description": st.just("d"),
        },
    )
    return st.recursive(
        leaf,
        lambda inner: st.fixed_dictionaries(
            {},
            optional={
                "type": st.sampled_from(TYPES),
                "properties": st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
                "required": st.lists(st.sampled_from(["a", "b", "c"]), max_size=3, unique=True),
                "additionalProperties": st.one_of(st.booleans(), inner),
                "items": inner,
            },
        ),
        max_leaves=6,
    )


@settings(max_examples=400)
@given(schemas(), values)
def test_fast_valid_implies_jsonschema_valid(schema: dict[str, Any], value: Any) -> None:
    check = compile_fast_check(schema)
    assert check is not None
    if check(value):
        assert Draft202012Validator(schema).is_valid(value), (schema, value)


def test_typical_tool_schemas_take_the_fast_path() -> None:
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["path"],
        "additionalProperties": False,
    }
    check = compile_fast_check(schema)
    assert check is not None
    assert check({"path": "x", "limit": 3})
    assert not check({"limit": 3})  # missing required: left to jsonschema's message
    assert not check({"path": "x", "other": 1})
    assert not check({"path": "x", "limit": True})  # a bool is not an integer


def test_anything_else_is_left_to_jsonschema() -> None:
    assert compile_fast_check({"type": "string", "pattern": "^a"}) is None
    assert compile_fast_check({"type": "object", "properties": {"a": {"minimum": 1}}}) is None
    assert compile_fast_check({"$ref": "#/x"}) is None
