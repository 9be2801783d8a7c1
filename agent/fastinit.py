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

`fast_new` goes further for a class only the loop makes (`ModelRequest`, `ToolContext`): the
object is built as a mutable twin of the same slots (plain stores) and then becomes the frozen
class; the class cannot be subclassed (see its docstring).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["fast_init", "fast_new"]

T = TypeVar("T")


def fast_init(cls: type[T]) -> type[T]:
    """Replace the `__init__` of a frozen, slotted dataclass (apply above `@dataclass`)."""
    fields = _plain_fields(cls, "fast_init")
    namespace: dict[str, Any] = {"_MISSING": dataclasses.MISSING}
    params, values = _parameters(fields, namespace)
    body: list[str] = []
    for index, (f, value) in enumerate(zip(fields, values, strict=True)):
        setter = f"_set{index}"
        namespace[setter] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        body.append(f"    {setter}(self, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    signature = ", ".join(["self", *params])
    source = f"def __init__({signature}) -> None:\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, namespace)  # the way `dataclasses` itself writes an __init__
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    setattr(cls, "__init__", init)  # noqa: B010 (a class attribute, set once)
    return cls


def _plain_fields(cls: type[Any], who: str) -> tuple[dataclasses.Field[Any], ...]:
    """The fields of a frozen, slotted dataclass whose every field is a plain init field."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{who} needs a frozen, slotted dataclass, not {cls.__name__}")
    fields = dataclasses.fields(cls)
    # `fields` leaves out ClassVar and InitVar pseudo-fields; an InitVar is an __init__
    # parameter this rewrite would lose, so any pseudo-field is refused.
    if len(fields) != len(cls.__dataclass_fields__):
        raise TypeError(f"{who}: {cls.__name__} has ClassVar or InitVar fields")
    for f in fields:
        if not f.init:
            raise TypeError(f"{who}: {cls.__name__}.{f.name} is not a plain init field")
    return fields


def _parameters(
    fields: tuple[dataclasses.Field[Any], ...], namespace: dict[str, Any]
) -> tuple[list[str], list[str]]:
    """The dataclass's own parameters (same order, defaults, factories, keyword-only ones
    after a `*`) and each field's value expression; defaults and factories go in `namespace`."""
    positional: list[str] = []
    keyword: list[str] = []
    values: list[str] = []
    for index, f in enumerate(fields):
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
        values.append(value)
    return [*positional, *(["*", *keyword] if keyword else [])], values


def fast_new(cls: type[T]) -> type[T]:
    """Construct a final, frozen, slotted dataclass without a setter call per field (apply
    above `@dataclass`; for the step path's largest objects, which only the loop makes).

    `fast_init`'s per-field `__set__` is a method-wrapper call with an argument tuple (~45 ns
    above a plain slot store). Here the instance is made as a mutable twin class with the same
    slots (so the fields are plain stores) and then becomes the frozen class by `__class__`
    assignment, which CPython allows between classes of one layout: about half the cost for
    six fields or more. The class keeps its dataclass signature (on `__new__`; `__init__` is
    `object`'s), equality, hashing, `repr`, `replace` and frozenness; `copy` and `pickle`
    restore the fields as dataclasses do. It cannot be subclassed (a subclass's layout or
    signature would not fit `__new__`): a `TypeError` at class creation says so."""
    fields = _plain_fields(cls, "fast_new")
    if "__new__" in cls.__dict__:
        raise TypeError(f"fast_new: {cls.__name__} has its own __new__")
    twin = type(f"_{cls.__name__}Fields", (), {"__slots__": cls.__dict__["__slots__"]})
    namespace: dict[str, Any] = {
        "_MISSING": dataclasses.MISSING,
        "_new": object.__new__,
        "_Twin": twin,
        "_Cls": cls,
    }
    params, values = _parameters(fields, namespace)
    body = [f"    self.{f.name} = {value}" for f, value in zip(fields, values, strict=True)]
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = (
        f"def __new__({', '.join(['cls', *params])}):\n"
        "    self = _new(_Twin)\n" + "\n".join(body[: len(fields)]) + "\n"
        "    self.__class__ = _Cls\n"
        + "".join(line + "\n" for line in body[len(fields) :])
        + "    return self\n"
    )
    exec(source, namespace)  # the way `dataclasses` itself writes an __init__
    new = namespace["__new__"]
    new.__qualname__ = f"{cls.__qualname__}.__new__"
    new.__module__ = cls.__module__
    new.__doc__ = cls.__init__.__doc__
    setattr(cls, "__new__", staticmethod(new))  # noqa: B010 (a class attribute, set once)
    delattr(cls, "__init__")  # `object.__init__`: the arguments were `__new__`'s
    names = tuple(f.name for f in fields)

    def __reduce__(self: object) -> tuple[Any, ...]:
        return (_restored, (type(self), tuple(getattr(self, n) for n in names)))

    def __init_subclass__(sub: type, /, **kwargs: Any) -> None:
        raise TypeError(f"{cls.__name__} cannot be subclassed (agent.fastinit.fast_new)")

    setattr(cls, "__reduce__", __reduce__)  # noqa: B010
    setattr(cls, "__init_subclass__", classmethod(__init_subclass__))  # noqa: B010
    return cls


def _restored(cls: type[T], values: tuple[Any, ...]) -> T:
    """An instance with exactly these field values (a copy's, an unpickled one's): the state
    restored as dataclasses restore it, with no `__post_init__` again."""
    obj = object.__new__(cls)
    for f, value in zip(dataclasses.fields(cls), values, strict=True):  # type: ignore[arg-type]
        object.__setattr__(obj, f.name, value)
    return obj
