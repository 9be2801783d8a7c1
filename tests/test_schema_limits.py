"""Issue 12 item 12: output schemas are bounded, and no schema within the bounds stalls the hub.

Checking a 2,000-property schema used to block every other greenlet for 1.5 s (the capture
tool's meta-schema check, ~0.7 ms per property, on the hub), and 200,000 properties never
finished. The suite's hub-block detector (tests/conftest.py) fails any of these tests whose
code holds the hub for more than 0.1 s, so running a child at the limits is the proof.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from seam_kit import kit

from agent.model import ModelRequest
from agent.models import scripted as S
from subagent.errors import SubagentError
from subagent.schema import (
    MAX_DEPTH,
    MAX_NODES,
    MAX_PROPERTIES,
    MAX_TEXT,
    UnsupportedSchemaError,
    check_output_schema,
    schema_violations,
)

UNION_OPTIONS = 20
UNION_FIELDS = 9


def _deep_chain(levels: int) -> dict[str, Any]:
    """An object schema `levels` objects deep, one property per level."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"d": schema}, "required": ["d"]}
    return schema


def _deep_value(levels: int) -> Any:
    value: Any = "leaf"
    for _ in range(levels):
        value = {"d": value}
    return value


CHAIN = MAX_DEPTH // 2 - 1  # each level is two schema nodes deep (object, then property)


def at_the_limit() -> dict[str, Any]:
    """Exactly `MAX_PROPERTIES` properties: enums, a union of objects, the deepest nesting."""
    union = {
        "oneOf": [
            {
                "type": "object",
                "properties": {f"f{o}_{j}": {"type": "string"} for j in range(UNION_FIELDS)},
                "required": [f"f{o}_{j}" for j in range(UNION_FIELDS)],
                "additionalProperties": False,
            }
            for o in range(UNION_OPTIONS)
        ]
    }
    used = 2 + UNION_OPTIONS * UNION_FIELDS + CHAIN  # "union", "deep", the union, the chain
    flat = MAX_PROPERTIES - used
    properties: dict[str, Any] = {
        f"p{i}": {"type": "integer", "enum": [0, 1, 2, 3], "description": "a small number"}
        for i in range(flat)
    }
    properties["union"] = union
    properties["deep"] = _deep_chain(CHAIN)
    return {"type": "object", "properties": properties, "required": sorted(properties)}


def good_value(schema: dict[str, Any]) -> dict[str, Any]:
    value: dict[str, Any] = {name: 1 for name in schema["properties"] if name.startswith("p")}
    value["union"] = {f"f{UNION_OPTIONS - 1}_{j}": "x" for j in range(UNION_FIELDS)}
    value["deep"] = _deep_value(CHAIN)
    return value


def bad_value(schema: dict[str, Any]) -> dict[str, Any]:
    """Wrong everywhere: every enum, the union (matches no option), the deep leaf."""
    value: dict[str, Any] = {name: "no" for name in schema["properties"] if name.startswith("p")}
    value["union"] = {f"f0_{j}": 1 for j in range(UNION_FIELDS)}
    value["deep"] = _deep_value(CHAIN - 1)
    return value


def count_properties(schema: Any) -> int:
    pending, total = [schema], 0
    while pending:
        node = pending.pop()
        if isinstance(node, dict):
            if isinstance(node.get("properties"), dict):
                total += len(node["properties"])
            pending.extend(node.values())
        elif isinstance(node, list):
            pending.extend(node)
    return total


def test_a_schema_at_the_limits_is_accepted() -> None:
    schema = at_the_limit()
    assert count_properties(schema) == MAX_PROPERTIES
    assert schema_violations(schema) == []


def test_a_child_with_a_schema_at_the_limits_never_stalls_the_hub() -> None:
    """Start, a wrong capture (validated in full by jsonschema), a right one, the result: the
    hub-block detector fails this test if any of it holds the hub for more than 0.1 s."""
    schema = at_the_limit()
    good, bad = good_value(schema), bad_value(schema)
    with kit() as k:
        replies: Iterator[S.Step] = iter(
            [S.tool_call("structured_output", bad), S.tool_call("structured_output", good)]
        )

        def respond(request: ModelRequest) -> S.Step:
            return next(replies)

        k.respond = respond
        run = k.start(k.parent(), output_schema=schema)
        result = run.result.get(timeout=30)
        assert result.stop_reason == "completed"
        assert result.structured == good
        child = k.store.load(run.id).events
        run.dispose()
        results = [e["data"] for e in child if e["type"] == "tool/result"]
        assert [r.get("code") for r in results] == ["INVALID_ARGS", None]
        text = results[0]["content"][0]["text"]
        assert "invalid arguments for structured_output" in text and "... and more" in text


def _over(limit: str) -> dict[str, Any]:
    if limit == "properties":
        props = {f"p{i}": {"type": "string"} for i in range(MAX_PROPERTIES + 1)}
        return {"type": "object", "properties": props}
    if limit == "values":
        return {
            "type": "object",
            "properties": {"e": {"type": "integer", "enum": list(range(MAX_NODES))}},
        }
    if limit == "text":
        return {"type": "object", "description": "x" * (MAX_TEXT + 1)}
    return HUGE


# The 200,000 properties: refused at once, not walked in full. Built at import, so
# that making it is not blamed on the test (the hub-block detector watches only tests).
HUGE = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(200_000)}}


@pytest.mark.parametrize("limit", ["properties", "values", "text", "huge"])
def test_a_schema_over_a_limit_is_unsupported_schema_and_no_child_is_made(limit: str) -> None:
    schema = _over(limit)
    with pytest.raises(UnsupportedSchemaError) as info:
        check_output_schema(schema)
    assert info.value.code == "UNSUPPORTED_SCHEMA"
    (violation,) = info.value.violations
    assert violation.startswith("#: the schema is too large: more than ")
    with kit() as k:
        parent = k.parent()
        with pytest.raises(SubagentError) as started:
            k.start(parent, output_schema=schema)
        assert started.value.code == "UNSUPPORTED_SCHEMA"
        assert k.service.runs() == [] and list(k.runtime.ctx.agents) == [parent.id]


def test_an_oversized_schema_still_reports_what_was_found_before_the_bound() -> None:
    props: dict[str, Any] = {"bad": {"type": "strnig"}}
    props.update({f"p{i}": {"type": "string"} for i in range(MAX_PROPERTIES)})
    violations = schema_violations({"type": "object", "properties": props})
    assert violations[-1].startswith("#: the schema is too large")
    assert len(violations) <= 2
