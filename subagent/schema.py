"""The object-rooted output-schema subset a child's structured result may be asked to satisfy.

The subset is small on purpose: every accepted schema must be expressible as the parameters of
the forced capture tool on any model provider, so anything outside it is rejected at start
(`SubagentError("UNSUPPORTED_SCHEMA")`) with every violation listed, never silently loosened.

Rules:

- The root is a schema with `type: "object"`.
- Every schema node has a `type` (one string, no type arrays) or is a `oneOf` of at least two
  schemas, which then carries only annotations beside it. A node with only `enum` or `const` is
  rejected: give it a `type`, so the values can be checked against it.
- `properties`, `required` (strings declared in `properties`) and `additionalProperties` (a
  bool) belong to `object`; `items` (one schema) to `array`; `enum` (non-empty) and `const` may
  appear on any typed node and their values must be of that type; with both, `const` must be in
  `enum`. Annotations: `description`, `title` (strings), `default`, `examples` (a list).
- Everything is plain JSON: dicts with string keys, lists, strings, finite numbers, bools,
  None. Tuples, sets, NaN and cycles are rejected; nesting is capped at `MAX_DEPTH`.
- Size is bounded, so that checking a schema, building the child's capture tool and validating
  a capture stay short on the hub (docs/decisions.md): at most `MAX_PROPERTIES` property
  declarations in all, `MAX_NODES` JSON values in all (every member and element counts), and
  `MAX_TEXT` characters of keys and strings. The walk stops as soon as a bound is passed, so an
  oversized schema is refused in time proportional to the bound, not to its size.

Paths in messages are JSON pointers rooted at `#`.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from jsonschema import Draft202012Validator
from referencing import Registry

from subagent.errors import UnsupportedSchemaError

__all__ = [
    "LARGE_SCHEMA_VALUES",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_PROPERTIES",
    "MAX_TEXT",
    "UnsupportedSchemaError",
    "check_output_schema",
    "more_values_than",
    "schema_violations",
    "validate_output",
]

# Deep enough for any real result shape, shallow enough that validation never nears the
# interpreter's recursion limit.
MAX_DEPTH = 32
# Property declarations in the whole schema (every `properties` member, at any depth): the
# strictest provider cap we know of (OpenAI structured outputs) is the same 5,000.
MAX_PROPERTIES = 5_000
# JSON values in the whole schema, enum/const/default/examples included.
MAX_NODES = 50_000
# Characters of all keys and strings together (descriptions included).
MAX_TEXT = 1_000_000

TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
ANNOTATIONS = frozenset({"description", "title", "default", "examples"})
_OBJECT_ONLY = ("properties", "required", "additionalProperties")
_ARRAY_ONLY = ("items",)
KEYWORDS = frozenset({"type", "oneOf", "enum", "const", *_OBJECT_ONLY, *_ARRAY_ONLY, *ANNOTATIONS})


class _TooLarge(Exception):
    """Ends the walk the moment a size bound is passed (the violation is already recorded)."""


def _ptr(path: tuple[str, ...]) -> str:
    return "#" + "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def _is_type(value: object, type_: str) -> bool:
    if type_ == "object":
        return isinstance(value, dict)
    if type_ == "array":
        return isinstance(value, list)
    if type_ == "string":
        return isinstance(value, str)
    if type_ == "boolean":
        return isinstance(value, bool)
    if type_ == "null":
        return value is None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return type_ == "number" or isinstance(value, int) or value.is_integer()


def _json_equal(a: object, b: object) -> bool:
    """JSON equality: unlike Python's `==`, `true` is not `1`."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    return type(a) is type(b) and bool(a == b)


class _Checker:
    def __init__(self) -> None:
        self.violations: list[str] = []
        self._stack: set[int] = set()
        self._nodes = 1  # the root
        self._properties = 0
        self._text = 0

    def add(self, path: tuple[str, ...], message: str) -> None:
        self.violations.append(f"{_ptr(path)}: {message}")

    def _members(self, container: dict[Any, Any] | list[Any]) -> None:
        """Count a container's members (and a dict's keys as text) before walking them."""
        self._nodes += len(container)
        if isinstance(container, dict):
            self._text += sum(len(k) for k in container if isinstance(k, str))
        self._bound()

    def _bound(self) -> None:
        if self._nodes > MAX_NODES:
            self._too_large(f"more than {MAX_NODES:,} JSON values")
        if self._properties > MAX_PROPERTIES:
            self._too_large(f"more than {MAX_PROPERTIES:,} properties")
        if self._text > MAX_TEXT:
            self._too_large(f"more than {MAX_TEXT:,} characters of keys and strings")

    def _too_large(self, what: str) -> None:
        self.add((), f"the schema is too large: {what} (see docs/seam.md for the limits)")
        raise _TooLarge

    def json_value(self, value: object, path: tuple[str, ...], depth: int) -> bool:
        """Record why `value` is not plain JSON; True when it is."""
        if depth > MAX_DEPTH:
            self.add(path, f"nested deeper than {MAX_DEPTH} levels")
            return False
        if isinstance(value, str):
            self._text += len(value)
            self._bound()
            return True
        if value is None or isinstance(value, bool | int):
            return True
        if isinstance(value, float):
            if math.isfinite(value):
                return True
            self.add(path, f"{value!r} is not a JSON number")
            return False
        if isinstance(value, dict | list):
            if id(value) in self._stack:
                self.add(path, "cycle: this value contains itself")
                return False
            self._stack.add(id(value))
            self._members(value)
            try:
                ok = True
                if isinstance(value, dict):
                    for k, v in value.items():
                        if not isinstance(k, str):
                            self.add(path, f"non-string key {k!r}")
                            ok = False
                        elif not self.json_value(v, (*path, k), depth + 1):
                            ok = False
                else:
                    for i, v in enumerate(value):
                        if not self.json_value(v, (*path, str(i)), depth + 1):
                            ok = False
                return ok
            finally:
                self._stack.discard(id(value))
        self.add(path, f"{type(value).__name__} is not a JSON value")
        return False

    def node(self, schema: object, path: tuple[str, ...], depth: int) -> None:
        if depth > MAX_DEPTH:
            self.add(path, f"schema nested deeper than {MAX_DEPTH} levels")
            return
        if not isinstance(schema, dict):
            self.add(path, f"a schema must be an object, got {type(schema).__name__}")
            return
        if id(schema) in self._stack:
            self.add(path, "cycle: this schema contains itself")
            return
        self._stack.add(id(schema))
        self._members(schema)
        try:
            self._node_body(schema, path, depth)
        finally:
            self._stack.discard(id(schema))

    def _node_body(self, schema: dict[Any, Any], path: tuple[str, ...], depth: int) -> None:
        for key in schema:
            if not isinstance(key, str):
                self.add(path, f"non-string key {key!r}")
            elif key not in KEYWORDS:
                self.add((*path, key), f"unsupported keyword {key!r}")

        for key in ("description", "title"):
            if key in schema:
                if isinstance(schema[key], str):
                    self._text += len(schema[key])
                    self._bound()
                else:
                    self.add((*path, key), f"{key} must be a string")
        if "default" in schema:
            self.json_value(schema["default"], (*path, "default"), depth + 1)
        if "examples" in schema:
            examples = schema["examples"]
            if isinstance(examples, list):
                self.json_value(examples, (*path, "examples"), depth + 1)
            else:
                self.add((*path, "examples"), "examples must be a list")

        type_ = self._type(schema, path)
        has_one_of = "oneOf" in schema
        if has_one_of:
            self._one_of(schema, path, depth)
        elif "type" not in schema:
            hint = (
                " (an enum/const node needs a type too)"
                if "enum" in schema or "const" in schema
                else ""
            )
            self.add(path, f"a schema needs a type or oneOf{hint}")

        # Keywords that only make sense for one type; without a valid type they are misplaced.
        for key in _OBJECT_ONLY:
            if key in schema and type_ != "object":
                self.add((*path, key), f"{key} applies only to type object")
        for key in _ARRAY_ONLY:
            if key in schema and type_ != "array":
                self.add((*path, key), f"{key} applies only to type array")
        for key in ("enum", "const"):
            if key in schema and type_ is None and "type" not in schema and has_one_of:
                self.add((*path, key), f"{key} is not supported beside oneOf")

        if type_ == "object":
            self._object(schema, path, depth)
        elif type_ == "array" and "items" in schema:
            items = schema["items"]
            if isinstance(items, list):
                self.add((*path, "items"), "tuple-form items (a list) is not supported")
            else:
                self.node(items, (*path, "items"), depth + 1)
        self._values(schema, type_, path, depth)

    def _type(self, schema: dict[Any, Any], path: tuple[str, ...]) -> str | None:
        if "type" not in schema:
            return None
        type_ = schema["type"]
        if isinstance(type_, list):
            self.add((*path, "type"), "type arrays are not supported; use oneOf")
            return None
        if not isinstance(type_, str) or type_ not in TYPES:
            self.add((*path, "type"), f"type must be one of {', '.join(sorted(TYPES))}")
            return None
        if "oneOf" in schema:
            self.add((*path, "oneOf"), "oneOf is not supported beside type")
        return type_

    def _one_of(self, schema: dict[Any, Any], path: tuple[str, ...], depth: int) -> None:
        options = schema["oneOf"]
        if not isinstance(options, list) or len(options) < 2:
            self.add((*path, "oneOf"), "oneOf must be a list of at least two schemas")
            if not isinstance(options, list):
                return
        if id(options) in self._stack:
            self.add((*path, "oneOf"), "cycle: this list contains itself")
            return
        self._stack.add(id(options))
        self._members(options)
        try:
            for i, option in enumerate(options):
                self.node(option, (*path, "oneOf", str(i)), depth + 1)
        finally:
            self._stack.discard(id(options))

    def _object(self, schema: dict[Any, Any], path: tuple[str, ...], depth: int) -> None:
        props = schema.get("properties")
        declared: set[str] = set()
        if "properties" in schema:
            if isinstance(props, dict):
                self._properties += len(props)
                self._members(props)
                for name, sub in props.items():
                    if not isinstance(name, str):
                        self.add((*path, "properties"), f"non-string property name {name!r}")
                        continue
                    declared.add(name)
                    self.node(sub, (*path, "properties", name), depth + 1)
            else:
                self.add((*path, "properties"), "properties must be an object of schemas")
        if "required" in schema:
            required = schema["required"]
            if not isinstance(required, list):
                self.add((*path, "required"), "required must be a list of property names")
            else:
                self._members(required)
                seen: set[str] = set()
                for i, name in enumerate(required):
                    where = (*path, "required", str(i))
                    if not isinstance(name, str):
                        self.add(where, "required entries must be strings")
                    elif name in seen:
                        self.add(where, f"{name!r} is listed twice")
                    elif name not in declared:
                        self.add(where, f"required property {name!r} is not in properties")
                    if isinstance(name, str):
                        seen.add(name)
        if "additionalProperties" in schema and not isinstance(
            schema["additionalProperties"], bool
        ):
            self.add(
                (*path, "additionalProperties"),
                "additionalProperties must be true or false (schemas are not supported)",
            )

    def _values(
        self, schema: dict[Any, Any], type_: str | None, path: tuple[str, ...], depth: int
    ) -> None:
        enum_ok = False
        if "enum" in schema:
            enum = schema["enum"]
            where = (*path, "enum")
            if not isinstance(enum, list) or not enum:
                self.add(where, "enum must be a non-empty list")
            elif self.json_value(enum, where, depth + 1):
                enum_ok = True
                if type_ is not None:
                    for i, v in enumerate(enum):
                        if not _is_type(v, type_):
                            self.add((*where, str(i)), f"enum value {v!r} is not of type {type_}")
        if "const" in schema:
            const = schema["const"]
            where = (*path, "const")
            if self.json_value(const, where, depth + 1):
                if type_ is not None and not _is_type(const, type_):
                    self.add(where, f"const {const!r} is not of type {type_}")
                if enum_ok and not any(_json_equal(const, v) for v in schema["enum"]):
                    self.add(where, "const is not one of the enum values")


def schema_violations(schema: object) -> list[str]:
    """Every reason `schema` is outside the subset, as `#/json/pointer: message` strings."""
    checker = _Checker()
    if not isinstance(schema, dict):
        checker.add((), f"the output schema must be an object, got {type(schema).__name__}")
        return checker.violations
    if schema.get("type") != "object":
        checker.add((), 'the output schema root must have type "object"')
    # A size bound ends the walk; it is recorded, beside what was found before it.
    with contextlib.suppress(_TooLarge):
        checker.node(schema, (), 0)
    return checker.violations


# Above this many JSON values a schema is "large": walking it, or validating against it, costs
# milliseconds. Tools validate against a large schema in a thread (agent/tools.py); the service
# checks a large output schema in a thread before admission (subagent/service.py).
LARGE_SCHEMA_VALUES = 1_000

Runner = Callable[[Callable[[Any], list[str]], Any], list[str]]


def more_values_than(value: object, limit: int) -> bool:
    """Whether `value` holds more than `limit` JSON values (members and elements count, and
    the value itself). Iterative, and stops counting past `limit`: cheap on any input, a
    cyclic one included."""
    count = 0
    pending = [value]
    while pending:
        item = pending.pop()
        count += 1
        if count > limit:
            return True
        if isinstance(item, Mapping):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return False


# Verdicts on large schemas, by id() and kept alive (so an id is not reused while cached): a
# start checks its schema before admission (in a thread), at admission and when it builds
# the capture tool, and only the first walks it.
_verdicts: OrderedDict[int, tuple[Any, list[str]]] = OrderedDict()


def check_output_schema(schema: object, run: Runner | None = None) -> None:
    """Raise `UnsupportedSchemaError` (code `UNSUPPORTED_SCHEMA`) listing every violation.

    A large schema's verdict is remembered: like a validated one, a schema is treated as
    immutable once checked. `run(schema_violations, schema)`, when given, performs the walk of
    a large schema not seen before (`supervision.offload.offload`, to keep it off the hub)."""
    if not more_values_than(schema, LARGE_SCHEMA_VALUES):
        violations = schema_violations(schema)
    else:
        key = id(schema)
        hit = _verdicts.get(key)
        if hit is not None and hit[0] is schema:
            _verdicts.move_to_end(key)
            violations = hit[1]
        else:
            violations = (
                schema_violations(schema) if run is None else run(schema_violations, schema)
            )
            _verdicts[key] = (schema, violations)
            if len(_verdicts) > _CACHE_SIZE:
                _verdicts.popitem(last=False)
    if violations:
        raise UnsupportedSchemaError(violations)


# Retrieves nothing (`referencing`'s default; jsonschema's own fetches over the network).
_LOCAL_REFS: Registry[Any] = Registry()

# Keyed by id() with the schema kept alive beside its validator, so an id is never reused
# while cached. Schemas are treated as immutable once validated against.
_CACHE_SIZE = 128
_validators: OrderedDict[int, tuple[Mapping[str, Any], Draft202012Validator]] = OrderedDict()


def _validator(schema: Mapping[str, Any]) -> Draft202012Validator:
    key = id(schema)
    hit = _validators.get(key)
    if hit is not None and hit[0] is schema:
        _validators.move_to_end(key)
        return hit[1]
    check_output_schema(schema)  # also guarantees no cycle ever reaches jsonschema
    # The subset has no `$ref`; the registry makes sure no schema is ever fetched regardless.
    validator = Draft202012Validator(schema, registry=_LOCAL_REFS)
    _validators[key] = (schema, validator)
    if len(_validators) > _CACHE_SIZE:
        _validators.popitem(last=False)
    return validator


def validate_output(schema: Mapping[str, Any], value: object) -> list[str]:
    """Why `value` does not satisfy `schema` (empty when it does).

    Raises `UnsupportedSchemaError` if `schema` itself is outside the subset.
    """
    errors = sorted(_validator(schema).iter_errors(value), key=lambda e: list(map(str, e.path)))
    return [f"{_ptr(tuple(map(str, e.path)))}: {e.message}" for e in errors]
