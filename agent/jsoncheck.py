"""Lossless-JSON check for event data, run on every append.

An event must come back from the log exactly as it went in, through msgpack, JSON (ACP) and
Ray alike, so only exact `dict`/`list`/`str`/`int`/`float`/`bool`/`None` are accepted: no
NaN/inf, no non-string keys, no bytes, sets, tuples, subclasses (enums) or other objects, and
ints must fit msgpack's 64-bit range. The fast path only answers yes/no (it runs ~10 times per
step); the slow path re-walks a rejected value to name the offending path.
"""

from __future__ import annotations

from typing import Any, TypeVar, overload

__all__ = ["MAX_DEPTH", "check_json", "explain", "is_lossless", "repair_surrogates"]

# Nesting deeper than this is rejected; it also bounds the walk over a cyclic value.
MAX_DEPTH = 200

_INT_MIN = -(2**63)
_INT_MAX = 2**64 - 1

_K = TypeVar("_K")
_T = TypeVar("_T")


def check_json(value: object, where: str = "data") -> None:
    """Raise TypeError naming the first path in `value` that is not lossless JSON."""
    if not _ok(value, 0):
        _explain(value, where, 0, [])
        # _explain always raises for a value _ok rejects; this guards a divergence.
        raise TypeError(f"{where}: not lossless JSON")  # pragma: no cover


# `v: Any`: the hot path (every append) dispatches on `t = type(v)` once, which the checker
# does not narrow through; `_explain` below is the same walk, typed `object`, for failures.
def _ok(v: Any, depth: int) -> bool:
    t = type(v)
    if t is str or t is bool or v is None:
        return True
    if t is int:
        return bool(_INT_MIN <= v <= _INT_MAX)
    if t is float:
        return bool(v - v == 0.0)  # False for NaN and +-inf
    if depth >= MAX_DEPTH:
        return False
    if t is dict:
        for k, x in v.items():
            if type(k) is not str:
                return False
            tx = type(x)
            if tx is str or tx is bool or x is None:
                continue
            if not _ok(x, depth + 1):
                return False
        return True
    if t is list:
        for x in v:
            tx = type(x)
            if tx is str or tx is bool or x is None:
                continue
            if not _ok(x, depth + 1):
                return False
        return True
    return False


def _explain(v: object, path: str, depth: int, stack: list[int]) -> None:
    # The slow path (a rejected value): `type(v) is X` narrows `v` for the checker as it goes.
    t = type(v)
    if t is str or t is bool or v is None:
        return
    if type(v) is int:
        if not _INT_MIN <= v <= _INT_MAX:
            raise TypeError(f"{path}: integer {v} is outside the 64-bit range")
        return
    if type(v) is float:
        if not v - v == 0.0:
            raise TypeError(f"{path}: {v!r} is not a finite float")
        return
    if type(v) is dict or type(v) is list:
        if id(v) in stack:
            raise TypeError(f"{path}: cycle (the value contains itself)")
        if depth >= MAX_DEPTH:
            raise TypeError(f"{path}: nested deeper than {MAX_DEPTH} levels")
        stack.append(id(v))
        if type(v) is dict:
            for k, x in v.items():
                if type(k) is not str:
                    raise TypeError(f"{path}: key {k!r} is a {type(k).__name__}, not a str")
                _explain(x, f"{path}.{k}", depth + 1, stack)
        elif type(v) is list:
            for i, x in enumerate(v):
                _explain(x, f"{path}[{i}]", depth + 1, stack)
        stack.pop()
        return
    raise TypeError(f"{path}: {t.__name__} is not lossless JSON")


def is_lossless(value: object, depth: int = 0) -> bool:
    """True when `value` passes `check_json` (the loader's test of a decoded frame); `depth`
    is how deep `value` sits in the checked whole (the nesting limit counts from the top)."""
    return _ok(value, depth)


def explain(value: object, where: str) -> str:
    """Why `value` fails `check_json`, as one line (for a loader's corruption report)."""
    try:
        _explain(value, where, 0, [])
    except TypeError as exc:
        return str(exc)
    return f"{where}: not lossless JSON"  # pragma: no cover


def _fix(text: str) -> str:
    # UTF-16 round trip: a valid surrogate pair becomes its character, a lone half U+FFFD.
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


@overload
def repair_surrogates(value: str) -> str: ...
@overload
def repair_surrogates(value: list[_T]) -> list[_T]: ...
@overload
def repair_surrogates(value: dict[_K, _T]) -> dict[_K, _T]: ...
def repair_surrogates(value: object) -> object:
    """Replace lone surrogates in every str of a lossless-JSON value, in place where it can.

    Lone surrogates come from outside: a JSON `\\ud83d` escape from a model or an ACP agent, or
    `surrogateescape`d bytes in argv. They cannot be encoded as UTF-8, so no log, wire or
    terminal can carry them; see docs/decisions.md. Containers are repaired in place, so a
    caller that kept a reference to part of the value (the conversation history shares the
    logged content blocks) sees the same text as the log. Returns the repaired value (a new
    object only when `value` itself is a str).
    """
    if type(value) is str:
        return _fix(value)
    if type(value) is list:
        for i, x in enumerate(value):
            tx = type(x)
            if tx is str or tx is list or tx is dict:
                value[i] = repair_surrogates(x)
    elif type(value) is dict:
        items = list(value.items())
        if any(type(k) is str and k != _fix(k) for k, _ in items):
            value.clear()
            for k, x in items:
                value[_fix(k) if type(k) is str else k] = repair_surrogates(x)
        else:
            for k, x in items:
                tx = type(x)
                if tx is str or tx is list or tx is dict:
                    value[k] = repair_surrogates(x)
    return value
