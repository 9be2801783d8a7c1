"""A cheaper `__init__` for the frozen, slotted dataclasses the step path makes.

A step makes five of them (`ModelRequest`, `ModelResponse`, `ToolCall`, `ToolContext`,
`ToolResult`). The `__init__` that `dataclasses` writes for a frozen class sets each field
with `object.__setattr__(self, name, value)`: a global look-up, an attribute look-up and a
generic setattr per field, ~1.3-1.9 us an object. Setting each slot through its own member
descriptor does the same thing (the class stays frozen: assignment still raises
`FrozenInstanceError`) in about half the time.

`fast_init` rewrites only `__init__`, from the class's own `dataclasses.fields`: the same
parameters in the same order, the same defaults and default factories, keyword-only fields
kept keyword-only, and `__post_init__` called last. `replace`, `fields`, equality, hashing and
`repr` are the dataclass's own. tests/test_fastinit.py holds each class to its dataclass
signature.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["fast_init"]

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Replace the `__init__` of a frozen, slotted dataclass (apply above `@dataclass`)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"fast_init needs a frozen, slotted dataclass, not {cls.__name__}")
    namespace: dict[str, Any] = {"_MISSING": dataclasses.MISSING}
    positional: list[str] = []
    keyword: list[str] = []
    body: list[str] = []
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    # `fields` leaves out ClassVar and InitVar pseudo-fields; an InitVar is an __init__
    # parameter this rewrite would lose, so any pseudo-field is refused.
    if len(fields) != len(cls.__dataclass_fields__):  # type: ignore[attr-defined]
        raise TypeError(f"fast_init: {cls.__name__} has ClassVar or InitVar fields")
    for index, f in enumerate(fields):
        if not f.init:
            raise TypeError(f"fast_init: {cls.__name__}.{f.name} is not a plain init field")
        setter = f"_set{index}"
        namespace[setter] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        value = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"_default{index}"] = f.default
            param = f"{f.name}=_default{index}"
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory{index}"] = f.default_factory
            param = f"{f.name}=_MISSING"
            value = f"_factory{index}() if {f.name} is _MISSING else {f.name}"
        else:
            param = f.name
        (keyword if f.kw_only else positional).append(param)
        body.append(f"    {setter}(self, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}) -> None:\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, namespace)  # the way `dataclasses` itself writes an __init__
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 (a class attribute, set once)
    return cls
