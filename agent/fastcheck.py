"""A fast "certainly valid" check for the plain JSON Schemas tool parameters usually are.

Tool arguments are validated on every call, and jsonschema's general machinery costs several
microseconds even for `{"type": "object", "properties": {"x": {"type": "integer"}}}`. For
schemas built only from the common keywords, `compile_fast_check` returns a function that says
True only when the value is certainly valid; anything it is unsure of returns False, and the
caller then asks jsonschema, which stays the authority (and writes the error messages). So the
fast path can make validation cheaper, never more permissive.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["compile_fast_check"]

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset({"description", "title", "default", "examples", "$comment"})
_SUPPORTED = (
    frozenset({"type", "properties", "required", "additionalProperties", "items", "enum", "const"})
    | _ANNOTATIONS
)

# Exact Python types per JSON type. Conservative on purpose: 1.0 as "integer" and tuples as
# "array" are left to jsonschema.
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
}


def compile_fast_check(schema: object) -> Check | None:
    """The fast check for `schema`, or None when it uses anything outside the plain keywords."""
    try:
        return _compile(schema)
    except _Unsupported:
        return None


class _Unsupported(Exception):
    pass


def _compile(schema: object) -> Check:
    if schema is True:
        return _always
    if not isinstance(schema, Mapping) or not set(schema) <= _SUPPORTED:
        raise _Unsupported
    checks: list[Check] = []
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else kind
        if not isinstance(kinds, list) or not all(k in _TYPES for k in kinds):
            raise _Unsupported
        allowed = tuple(t for k in kinds for t in _TYPES[k])
        exclude_bool = bool not in allowed
        checks.append(
            lambda v: isinstance(v, allowed) and not (exclude_bool and isinstance(v, bool))
        )
    if "enum" in schema:
        options = schema["enum"]
        if not isinstance(options, list):
            raise _Unsupported
        checks.append(lambda v: any(type(v) is type(o) and v == o for o in options))
    if "const" in schema:
        const = schema["const"]
        checks.append(lambda v: type(v) is type(const) and v == const)
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        checks.append(_object_check(schema))
    if "items" in schema:
        item = _compile(schema["items"])
        checks.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
    if not checks:
        return _always
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(check(v) for check in checks)


def _object_check(schema: Mapping[str, Any]) -> Check:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    extra = schema.get("additionalProperties", True)
    if not isinstance(properties, Mapping) or not isinstance(required, list):
        raise _Unsupported
    fields = {name: _compile(sub) for name, sub in properties.items()}
    extra_check = None if extra is True else (_never if extra is False else _compile(extra))

    def check(value: object) -> bool:
        if not isinstance(value, dict):
            return True  # not an object: these keywords do not apply
        for name in required:
            if name not in value:
                return False
        for name, item in value.items():
            field = fields.get(name)
            if field is not None:
                if not field(item):
                    return False
            elif extra_check is not None and not extra_check(item):
                return False
        return True

    return check


def _always(_value: object) -> bool:
    return True


def _never(_value: object) -> bool:
    return False
