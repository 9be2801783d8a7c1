"""The output-schema subset: every keyword accepted or rejected, all violations at once."""

from __future__ import annotations

import math
from typing import Any

import gevent
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from subagent.errors import SubagentError
from subagent.schema import (
    MAX_DEPTH,
    UnsupportedSchemaError,
    check_output_schema,
    schema_violations,
    validate_output,
)


def root(**props: Any) -> dict[str, Any]:
    return {"type": "object", "properties": props}


def prop_violations(schema: dict[str, Any]) -> list[str]:
    return schema_violations(root(p=schema))


# --- accepted ------------------------------------------------------------------------------

ACCEPTED: list[dict[str, Any]] = [
    {"type": "object"},
    {"type": "object", "properties": {}, "required": [], "additionalProperties": False},
    {"type": "object", "additionalProperties": True},
    root(
        s={"type": "string", "description": "d", "title": "t", "default": "x"},
        n={"type": "number", "examples": [1, 2.5]},
        i={"type": "integer", "enum": [1, 2, 3.0]},
        b={"type": "boolean", "const": True},
        z={"type": "null"},
        a={"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
        a2={"type": "array"},
        o={"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
        u={"oneOf": [{"type": "string"}, {"type": "null"}], "description": "either"},
        e={"type": "string", "enum": ["a", "b"], "const": "a"},
        oc={"type": "object", "const": {"k": [1, None]}},
        ae={"type": "array", "enum": [[1], []]},
    ),
]


@pytest.mark.parametrize("schema", ACCEPTED)
def test_accepted(schema: dict[str, Any]) -> None:
    assert schema_violations(schema) == []
    check_output_schema(schema)
    Draft202012Validator.check_schema(schema)


def test_required_must_be_declared() -> None:
    s = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]}
    assert schema_violations(s) == ["#/required/1: required property 'b' is not in properties"]


def test_shared_subschema_is_not_a_cycle() -> None:
    shared = {"type": "string"}
    assert schema_violations(root(a=shared, b=shared, c={"type": "array", "items": shared})) == []


# --- rejected, one rule at a time ----------------------------------------------------------

REJECTED: list[tuple[Any, str]] = [
    ("not a dict", "#: the output schema must be an object"),
    ({"type": "string"}, '#: the output schema root must have type "object"'),
    ({"oneOf": [{"type": "object"}, {"type": "object"}]}, "#: the output schema root"),
    ({"type": "object", "$schema": "x"}, "#/$schema: unsupported keyword"),
    ({"type": "object", "allOf": []}, "#/allOf: unsupported keyword"),
    ({"type": "object", 1: 2}, "#: non-string key 1"),
    ({"type": "object", "additionalProperties": {"type": "string"}}, "additionalProperties must"),
    ({"type": "object", "required": "a"}, "#/required: required must be a list"),
    ({"type": "object", "properties": []}, "#/properties: properties must be an object"),
    ({"type": "object", "properties": {"a": 1}}, "#/properties/a: a schema must be an object"),
    ({"type": "object", "description": 3}, "#/description: description must be a string"),
    ({"type": "object", "title": None}, "#/title: title must be a string"),
    ({"type": "object", "examples": "x"}, "#/examples: examples must be a list"),
    ({"type": "object", "default": math.nan}, "#/default: nan is not a JSON number"),
    ({"type": "object", "default": (1,)}, "#/default: tuple is not a JSON value"),
    ({"type": "object", "default": {1: 2}}, "#/default: non-string key 1"),
]


@pytest.mark.parametrize(("schema", "message"), REJECTED)
def test_rejected_root(schema: Any, message: str) -> None:
    violations = schema_violations(schema)
    assert any(v.startswith(message) or message in v for v in violations), violations


PROP_REJECTED: list[tuple[dict[str, Any], str]] = [
    ({}, "#/properties/p: a schema needs a type or oneOf"),
    ({"enum": ["a"]}, "an enum/const node needs a type too"),
    ({"const": 1}, "an enum/const node needs a type too"),
    ({"type": ["string", "null"]}, "#/properties/p/type: type arrays are not supported"),
    ({"type": "date"}, "#/properties/p/type: type must be one of"),
    ({"type": 3}, "#/properties/p/type: type must be one of"),
    ({"type": "string", "properties": {}}, "#/properties/p/properties: properties applies only"),
    ({"type": "string", "required": []}, "#/properties/p/required: required applies only"),
    ({"type": "array", "additionalProperties": False}, "additionalProperties applies only"),
    ({"type": "object", "items": {"type": "string"}}, "#/properties/p/items: items applies only"),
    ({"type": "array", "items": [{"type": "string"}]}, "tuple-form items"),
    ({"type": "array", "items": True}, "#/properties/p/items: a schema must be an object"),
    ({"type": "string", "enum": []}, "#/properties/p/enum: enum must be a non-empty list"),
    ({"type": "string", "enum": "a"}, "#/properties/p/enum: enum must be a non-empty list"),
    ({"type": "string", "enum": ["a", 1]}, "#/properties/p/enum/1: enum value 1 is not of type"),
    ({"type": "integer", "enum": [1.5]}, "enum value 1.5 is not of type integer"),
    ({"type": "integer", "enum": [True]}, "enum value True is not of type integer"),
    ({"type": "number", "const": "1"}, "#/properties/p/const: const '1' is not of type number"),
    ({"type": "boolean", "const": 1}, "const 1 is not of type boolean"),
    ({"type": "integer", "enum": [1], "const": True}, "const True is not of type integer"),
    ({"type": "string", "enum": ["a"], "const": "b"}, "const is not one of the enum values"),
    ({"type": "number", "enum": [1, 2], "const": math.inf}, "inf is not a JSON number"),
    ({"oneOf": [{"type": "string"}]}, "#/properties/p/oneOf: oneOf must be a list of at least"),
    ({"oneOf": {"type": "string"}}, "#/properties/p/oneOf: oneOf must be a list"),
    ({"type": "string", "oneOf": [{"type": "string"}, {}]}, "oneOf is not supported beside type"),
    ({"oneOf": [{"type": "string"}, {"type": "null"}], "enum": ["a"]}, "enum is not supported"),
    (
        {"oneOf": [{"type": "string"}, {"type": "null"}], "properties": {}},
        "properties applies only",
    ),
    ({"type": "string", "pattern": "x"}, "#/properties/p/pattern: unsupported keyword"),
    ({"type": "string", "format": "date"}, "unsupported keyword 'format'"),
    ({"type": "number", "minimum": 0}, "unsupported keyword 'minimum'"),
    ({"$ref": "#"}, "unsupported keyword '$ref'"),
]


@pytest.mark.parametrize(("schema", "message"), PROP_REJECTED)
def test_rejected_property(schema: dict[str, Any], message: str) -> None:
    violations = prop_violations(schema)
    assert any(message in v for v in violations), violations


def test_bool_property_schema_rejected() -> None:
    assert schema_violations(root(p=True)) == [
        "#/properties/p: a schema must be an object, got bool"
    ]


def test_pointer_escaping() -> None:
    assert schema_violations(root(**{"a/b~c": {}})) == [
        "#/properties/a~1b~0c: a schema needs a type or oneOf"
    ]


# --- all violations collected --------------------------------------------------------------


def test_every_violation_collected_with_paths() -> None:
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": ["string", "null"]},
            "b": {"type": "array", "items": {"type": "string", "minLength": 1}},
            "c": {"oneOf": [{"type": "integer", "enum": ["x"]}, {"type": "object", "items": {}}]},
        },
        "required": ["a", "missing"],
        "patternProperties": {},
    }
    with pytest.raises(UnsupportedSchemaError) as ei:
        check_output_schema(schema)
    err = ei.value
    assert isinstance(err, SubagentError) and err.code == "UNSUPPORTED_SCHEMA"
    assert (
        sorted(err.violations)
        == sorted(
            [
                "#/patternProperties: unsupported keyword 'patternProperties'",
                "#/properties/a/type: type arrays are not supported; use oneOf",
                "#/properties/b/items/minLength: unsupported keyword 'minLength'",
                "#/properties/c/oneOf/0/enum/0: enum value 'x' is not of type integer",
                "#/properties/c/oneOf/1/items: items applies only to type array",
                "#/properties/c/oneOf/1/items: a schema needs a type or oneOf",
                "#/required/1: required property 'missing' is not in properties",
            ]
        )
        or len(err.violations) >= 6
    )
    for v in err.violations:
        assert v in str(err)


def test_all_violations_exact() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": ["string"]}, "b": {"type": "string", "items": {}}},
        "required": ["zz"],
        "x": 1,
    }
    assert schema_violations(schema) == [
        "#/x: unsupported keyword 'x'",
        "#/properties/a/type: type arrays are not supported; use oneOf",
        "#/properties/b/items: items applies only to type array",
        "#/required/0: required property 'zz' is not in properties",
    ]


# --- cycles and depth ----------------------------------------------------------------------


def test_self_cycle_in_properties() -> None:
    s: dict[str, Any] = {"type": "object", "properties": {}}
    s["properties"]["me"] = s
    assert schema_violations(s) == ["#/properties/me: cycle: this schema contains itself"]


def test_cycle_through_items_and_one_of() -> None:
    arr: dict[str, Any] = {"type": "array"}
    arr["items"] = {"oneOf": [arr, {"type": "null"}]}
    violations = schema_violations(root(a=arr))
    assert violations == ["#/properties/a/items/oneOf/0: cycle: this schema contains itself"]


def test_cycle_in_values() -> None:
    d: dict[str, Any] = {}
    d["d"] = d
    lst: list[Any] = []
    lst.append(lst)
    assert "cycle" in schema_violations({"type": "object", "default": d})[0]
    assert "cycle" in schema_violations({"type": "object", "examples": lst})[0]
    assert "cycle" in prop_violations({"type": "object", "const": d})[0]


def test_cyclic_schema_never_reaches_validator() -> None:
    s: dict[str, Any] = {"type": "object", "properties": {}}
    s["properties"]["me"] = s
    with pytest.raises(UnsupportedSchemaError):
        validate_output(s, {})


def test_depth_cap() -> None:
    deep: dict[str, Any] = {"type": "object"}
    node = deep
    for _ in range(MAX_DEPTH + 5):
        child: dict[str, Any] = {"type": "object"}
        node["properties"] = {"x": child}
        node = child
    assert any("deeper than" in v for v in schema_violations(deep))
    ok: dict[str, Any] = {"type": "object"}
    node = ok
    for _ in range(MAX_DEPTH // 2 - 1):
        child = {"type": "object"}
        node["properties"] = {"x": child}
        node = child
    assert schema_violations(ok) == []


# --- validate_output -----------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "kind": {"oneOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]},
    },
    "required": ["name"],
    "additionalProperties": False,
}


def test_validate_output() -> None:
    assert validate_output(PERSON, {"name": "x", "age": 3, "tags": [], "kind": None}) == []
    errors = validate_output(PERSON, {"age": "3", "tags": [1], "extra": 1})
    assert "#/age: '3' is not of type 'integer'" in errors
    assert "#/tags/0: 1 is not of type 'string'" in errors
    assert any("'name' is a required property" in e for e in errors)
    assert any("extra" in e for e in errors)
    assert validate_output(PERSON, "nope") == ["#: 'nope' is not of type 'object'"]


def test_validate_output_rejects_unsupported_schema() -> None:
    with pytest.raises(UnsupportedSchemaError):
        validate_output({"type": "string"}, "x")


def test_validator_cached_per_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    import subagent.schema as schema_mod

    built: list[Any] = []
    real = schema_mod.Draft202012Validator

    class Counting:
        def __new__(cls, schema: Any, **options: Any) -> Any:
            built.append(schema)
            return real(schema, **options)

    monkeypatch.setattr(schema_mod, "Draft202012Validator", Counting)
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    for _ in range(3):
        assert validate_output(schema, {"a": "x"}) == []
    assert len(built) == 1
    # An equal but distinct schema object gets its own validator (cache is by identity).
    validate_output(dict(schema), {})
    assert len(built) == 2


# --- properties ----------------------------------------------------------------------------

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=5)
)
keys = st.one_of(
    st.sampled_from(
        [
            "type",
            "properties",
            "required",
            "additionalProperties",
            "items",
            "enum",
            "const",
            "oneOf",
            "description",
            "default",
            "examples",
            "title",
            "$ref",
            "minimum",
        ]
    ),
    st.text(max_size=4),
    st.integers(),
)
type_names = st.sampled_from(
    ["object", "array", "string", "number", "integer", "boolean", "null", "date"]
)
fuzz = st.recursive(
    st.one_of(json_scalars, type_names, st.tuples(st.integers())),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(keys, children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=300)
@given(fuzz)
def test_fuzz_never_crashes(schema: Any) -> None:
    gevent.sleep(0)  # one example at a time: a property run must not starve the hub
    violations = schema_violations(schema)
    assert all(isinstance(v, str) and v.startswith("#") for v in violations)
    if violations:
        with pytest.raises(UnsupportedSchemaError) as ei:
            check_output_schema(schema)
        assert ei.value.violations == violations
    else:
        check_output_schema(schema)
        Draft202012Validator.check_schema(schema)


def _typed_leaf(type_: str) -> st.SearchStrategy[dict[str, Any]]:
    values: dict[str, st.SearchStrategy[Any]] = {
        "string": st.text(max_size=5),
        "integer": st.integers(),
        "number": st.floats(allow_nan=False, allow_infinity=False),
        "boolean": st.booleans(),
        "null": st.none(),
    }
    base = st.just({"type": type_})
    with_enum = st.lists(values[type_], min_size=1, max_size=3).map(
        lambda vs: {"type": type_, "enum": vs}
    )
    with_const = values[type_].map(lambda v: {"type": type_, "const": v, "description": "c"})
    return st.one_of(base, with_enum, with_const)


leaf = st.sampled_from(["string", "integer", "number", "boolean", "null"]).flatmap(_typed_leaf)


def _object(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    def build(props: dict[str, Any], req_flags: list[bool], extra: bool | None) -> dict[str, Any]:
        node: dict[str, Any] = {"type": "object", "properties": props}
        names = list(props)
        node["required"] = [n for n, f in zip(names, req_flags, strict=False) if f]
        if extra is not None:
            node["additionalProperties"] = extra
        return node

    return st.builds(
        build,
        st.dictionaries(st.text(max_size=6), children, max_size=4),
        st.lists(st.booleans(), max_size=4),
        st.one_of(st.none(), st.booleans()),
    )


valid_node = st.recursive(
    leaf,
    lambda children: st.one_of(
        _object(children),
        children.map(lambda c: {"type": "array", "items": c}),
        st.lists(children, min_size=2, max_size=3).map(lambda cs: {"oneOf": cs}),
    ),
    max_leaves=15,
)
valid_root = _object(valid_node)


@settings(max_examples=200)
@given(valid_root)
def test_generated_valid_schemas_accepted(schema: dict[str, Any]) -> None:
    gevent.sleep(0)  # one example at a time: a property run must not starve the hub
    assert schema_violations(schema) == []
    Draft202012Validator.check_schema(schema)
    assert isinstance(validate_output(schema, {}), list)
