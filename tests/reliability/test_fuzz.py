"""Hypothesis fuzzing of every parser that reads data from outside: output schemas, prompt
templates, continuation descriptors, session frames, and the ACP JSON-RPC stream.

Each property states the exact contract: a well-formed input is accepted, a malformed one is
refused with the module's own error type, and nothing else ever escapes (no KeyError, no
RecursionError, no hang). Every example yields to the hub first, so a long property run never
blocks it. Examples per property: `FUZZ_EXAMPLES` (CI) or ten times that in the full run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import re
import struct
import zlib
from collections.abc import Callable
from typing import Any

import gevent
import msgpack
import pytest
from gevent.fileobject import FileObjectPosix
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from reliability_kit import size

from agent.events import SessionHeader
from agent.frames import MAGIC, CorruptSessionError, decode_frames, encode_event, encode_header
from agent.log import InvariantError, validate_log
from agent.prompt import PromptError, render_template
from agent.store import MemoryStore, _MemoryFile
from agent.tools import Tool
from providers.acp_rpc import (
    ConnectionClosed,
    JsonRpcConnection,
    MethodNotFound,
    RpcError,
    usable_id,
)
from subagent.descriptor import (
    DescriptorError,
    SubagentDescriptor,
    Unclassifiable,
    parse_descriptor,
)
from subagent.schema import (
    MAX_DEPTH,
    UnsupportedSchemaError,
    check_output_schema,
    schema_violations,
)
from subagent.types import ToolRestriction

EXAMPLES = size(int(os.environ.get("FUZZ_EXAMPLES", "150")), 1500)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # reproducible in CI; the full run explores the same way, longer
)
# Counted by the tests, reported by docs/reliability.md ("bad inputs tried").
TRIED: dict[str, int] = {}


def tried(kind: str) -> None:
    TRIED[kind] = TRIED.get(kind, 0) + 1
    gevent.sleep(0)  # one example never blocks the hub; the loop between them switches too


# -- JSON values -----------------------------------------------------------------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=12,
)
# Anything Python: what a careless caller might pass as "JSON".
hostile_values = st.recursive(
    json_scalars
    | st.floats()
    | st.binary(max_size=4)
    | st.sampled_from([set(), frozenset({1}), (), (1, 2), object(), b"", 1j, ...]),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=4) | st.integers() | st.none(), inner, max_size=3)
        | st.tuples(inner, inner)
    ),
    max_leaves=12,
)


# -- output-schema subset --------------------------------------------------------------------------

TYPES = ["object", "array", "string", "number", "integer", "boolean", "null"]
VALUE_OF: dict[str, st.SearchStrategy[Any]] = {
    "string": st.text(max_size=5),
    "number": st.floats(allow_nan=False, allow_infinity=False, width=32) | st.integers(-5, 5),
    "integer": st.integers(-100, 100),
    "boolean": st.booleans(),
    "null": st.none(),
    "object": st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    "array": st.lists(st.integers(), max_size=2),
}


def schema_annotations() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "description": st.text(max_size=10),
            "title": st.text(max_size=10),
            "default": json_values,
            "examples": st.lists(json_values, max_size=2),
        },
    )


@st.composite
def valid_schema(draw: st.DrawFn, depth: int = 0, root: bool = False) -> dict[str, Any]:
    """A schema inside the subset, by construction from the rules."""
    if not root and depth < 4 and draw(st.integers(0, 7)) == 0:
        options = draw(st.lists(valid_schema(depth + 1), min_size=2, max_size=3))
        return {"oneOf": options, **draw(schema_annotations())}
    type_ = "object" if root else draw(st.sampled_from(TYPES if depth < 4 else TYPES[2:]))
    node: dict[str, Any] = {"type": type_, **draw(schema_annotations())}
    if type_ == "object":
        props: list[str] = draw(st.lists(st.text(min_size=1, max_size=4), max_size=3, unique=True))
        with_properties: bool = draw(st.booleans())
        if props or with_properties:
            node["properties"] = {n: draw(valid_schema(depth + 1)) for n in props}
        with_required: bool = draw(st.booleans())
        if props and with_required:
            node["required"] = draw(st.lists(st.sampled_from(props), unique=True, max_size=3))
        if draw(st.booleans()):
            node["additionalProperties"] = draw(st.booleans())
    elif type_ == "array" and draw(st.booleans()):
        node["items"] = draw(valid_schema(depth + 1))
    if type_ not in ("object", "array"):
        values = VALUE_OF[type_]
        if draw(st.booleans()):
            enum = draw(st.lists(values, min_size=1, max_size=3))
            node["enum"] = enum
            if draw(st.booleans()):
                node["const"] = draw(st.sampled_from(enum))
        elif draw(st.booleans()):
            node["const"] = draw(values)
    return node


def _nodes(schema: Any, out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(schema, dict):
        out.append(schema)
        for sub in (schema.get("properties") or {}).values():
            _nodes(sub, out)
        if isinstance(schema.get("items"), dict):
            _nodes(schema["items"], out)
        for sub in schema.get("oneOf") or []:
            _nodes(sub, out)
    return out


def _deep(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "array", "items": node}
    return node


def _edit(node: dict[Any, Any], drop: tuple[str, ...] = (), **put: Any) -> None:
    for key in drop:
        node.pop(key, None)
    node.update(put)


def _one_of_beside_type(node: dict[Any, Any]) -> None:
    if "type" in node:
        node["oneOf"] = [{"type": "string"}, {"type": "null"}]
    else:
        node["type"] = "string"


def _too_deep(node: dict[Any, Any]) -> None:
    node.clear()
    node.update(_deep(MAX_DEPTH + 2))


def _cycle(node: dict[Any, Any]) -> None:
    _edit(node, type="array", items=node)


def _non_string_key(node: dict[Any, Any]) -> None:
    node[1] = "x"


Mutation = Callable[[dict[Any, Any]], None]
# Each mutation breaks exactly one rule of subagent/schema.py's docstring.
MUTATIONS: dict[str, Mutation] = {
    "unknown keyword": lambda n: _edit(n, pattern="x"),
    "type array": lambda n: _edit(n, type=["string", "null"]),
    "unknown type": lambda n: _edit(n, type="date"),
    "no type nor oneOf": lambda n: _edit(n, ("type", "oneOf"), enum=[1]),
    "oneOf of one": lambda n: _edit(n, ("type",), oneOf=[{"type": "string"}]),
    "oneOf beside type": _one_of_beside_type,
    "properties off object": lambda n: _edit(n, type="string", properties={}),
    "items off array": lambda n: _edit(n, type="number", items={"type": "null"}),
    "tuple items": lambda n: _edit(n, type="array", items=[{"type": "null"}]),
    "schema additionalProperties": lambda n: _edit(
        n, type="object", additionalProperties={"type": "string"}
    ),
    "required undeclared": lambda n: _edit(n, type="object", properties={}, required=["ghost"]),
    "required twice": lambda n: _edit(
        n, type="object", properties={"a": {"type": "null"}}, required=["a", "a"]
    ),
    "empty enum": lambda n: _edit(n, type="string", enum=[]),
    "enum of wrong type": lambda n: _edit(n, type="integer", enum=["1"]),
    "bool is not integer": lambda n: _edit(n, type="integer", const=True),
    "const outside enum": lambda n: _edit(n, type="string", enum=["a"], const="b"),
    "NaN const": lambda n: _edit(n, type="number", const=math.nan),
    "tuple default": lambda n: _edit(n, default=(1, 2)),
    "non-string key": _non_string_key,
    "description not str": lambda n: _edit(n, description=3),
    "examples not list": lambda n: _edit(n, examples="x"),
    "too deep": _too_deep,
    "cycle": _cycle,
}


@FUZZ
@given(valid_schema(root=True))
def test_schemas_inside_the_subset_are_accepted(schema: dict[str, Any]) -> None:
    tried("schema")
    assert schema_violations(schema) == []
    check_output_schema(schema)
    Draft202012Validator.check_schema(schema)  # and jsonschema agrees it is a schema
    Tool(name="structured_output", description="", parameters=schema, fn=lambda a, c: "")


@FUZZ
@given(valid_schema(root=True), st.sampled_from(sorted(MUTATIONS)), st.data())
def test_each_broken_rule_is_rejected_with_every_violation_listed(
    schema: dict[str, Any], mutation: str, data: st.DataObject
) -> None:
    tried("schema")
    schema = copy.deepcopy(schema)
    nodes = _nodes(schema, [])
    node = data.draw(st.sampled_from(nodes))
    MUTATIONS[mutation](node)
    with pytest.raises(UnsupportedSchemaError) as info:
        check_output_schema(schema)
    assert info.value.code == "UNSUPPORTED_SCHEMA"
    assert info.value.violations and all(v.startswith("#") for v in info.value.violations)


@FUZZ
@given(hostile_values)
def test_any_value_as_a_schema_never_raises_anything_else(value: Any) -> None:
    tried("schema")
    violations = schema_violations(value)
    assert isinstance(violations, list) and all(isinstance(v, str) for v in violations)
    if isinstance(value, dict):
        value = {"type": "object", "properties": {"p": value}}
        violations = schema_violations(value)
        assert all(isinstance(v, str) for v in violations)


# -- templates -------------------------------------------------------------------------------------

NAME = re.compile(r"^[a-z][a-z0-9_]*$")
template_pieces = st.lists(
    st.sampled_from(
        ["{{", "}}", "{", "}", " ", "\t", "\n", "a", "b1", "x_y", "Z", "-", "{{a}}", "é"]
    )
    | st.text(max_size=4),
    max_size=12,
).map("".join)
variables = st.dictionaries(
    st.sampled_from(["a", "b1", "x_y", "z", "A"]),
    st.none() | st.text(max_size=6) | st.just("{{a}}"),
    max_size=4,
)


def reference_render(template: str, values: dict[str, str | None]) -> str:
    """An independent reading of agent/prompt.py's rules, to compare against."""
    out, pos = [], 0
    while True:
        start = template.find("{{", pos)
        end = template.find("}}", start + 2) if start >= 0 else -1
        if start < 0 or end < 0:
            out.append(template[pos:])
            return "".join(out)
        name = template[start + 2 : end].strip(" \t")
        if not NAME.fullmatch(name):
            raise PromptError("malformed")
        if values.get(name) is None:
            raise PromptError("unknown or unset")
        out.append(template[pos:start])
        out.append(values[name])  # type: ignore[arg-type]
        pos = end + 2


@FUZZ
@given(template_pieces, variables)
def test_templates_render_exactly_per_the_rules_or_raise_prompt_error(
    template: str, values: dict[str, str | None]
) -> None:
    tried("template")
    try:
        expected: str | None = reference_render(template, values)
    except PromptError:
        expected = None
    try:
        got: str | None = render_template(template, values)
    except PromptError:
        got = None
    assert got == expected


# -- descriptors -----------------------------------------------------------------------------------

names = st.text(min_size=1, max_size=6)
valid_descriptors = st.builds(
    SubagentDescriptor,
    provider=names,
    label=names,
    model=st.tuples(st.sampled_from(["scripted", "openai"]), names).map(":".join),
    persona=st.none() | st.text(max_size=8),
    tool_filter=st.none()
    | st.builds(
        ToolRestriction,
        allow=st.none() | st.lists(names, min_size=1, max_size=3).map(tuple),
        deny=st.none() | st.lists(names, min_size=1, max_size=3).map(tuple),
    ),
)
descriptor_like = st.fixed_dictionaries(
    {},
    optional={
        "version": st.sampled_from([1, 1, 1, 2, 0, "1", None, True, 1.0]),
        "provider": names | json_values,
        "label": names | json_values,
        "model": st.sampled_from(["scripted:x", "x", ":x", "x:", " a:b"]) | json_values,
        "persona": st.none() | st.text(max_size=4) | json_values,
        "tool_filter": st.none()
        | json_values
        | st.fixed_dictionaries(
            {},
            optional={
                "allow": json_values | st.lists(names),
                "deny": json_values | st.lists(names),
            },
        ),
        "extra": json_values,
    },
)


@FUZZ
@given(valid_descriptors)
def test_descriptors_round_trip_through_their_json(descriptor: SubagentDescriptor) -> None:
    tried("descriptor")
    data = json.loads(json.dumps(descriptor.to_json()))
    assert parse_descriptor(data) == descriptor


@FUZZ
@given(descriptor_like | hostile_values)
def test_any_descriptor_payload_parses_is_unclassifiable_or_names_its_field(data: Any) -> None:
    tried("descriptor")
    try:
        parsed = parse_descriptor(data)
    except DescriptorError as exc:
        assert isinstance(exc.field, str) and exc.field
        return
    assert isinstance(parsed, (SubagentDescriptor, Unclassifiable))
    if isinstance(parsed, SubagentDescriptor):
        assert parse_descriptor(parsed.to_json()) == parsed


# -- session frames --------------------------------------------------------------------------------


def _frame(payload: bytes) -> bytes:
    return struct.pack(">II", len(payload), zlib.crc32(payload)) + payload


def _valid_log_bytes() -> bytes:
    header = SessionHeader(id="fuzz", created_at=1.0, cwd="/")
    events = [
        {"type": "turn/start", "seq": 0, "time": 1.0, "data": {"turn": 1}},
        {
            "type": "user/message",
            "seq": 1,
            "time": 1.0,
            "data": {"message": {"id": "m", "role": "user", "content": []}},
        },
        {"type": "turn/end", "seq": 2, "time": 1.0, "data": {"turn": 1, "reason": "completed"}},
    ]
    return encode_header(header) + b"".join(encode_event(e) for e in events)  # type: ignore[arg-type]


VALID_LOG = _valid_log_bytes()


@st.composite
def mutated_log(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID_LOG)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "append", "zero"]))
        at = draw(st.integers(0, max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[at : at + draw(st.integers(1, 16))]
        elif kind == "truncate":
            del data[at:]
        elif kind == "append":
            data += draw(st.binary(max_size=32))
        else:
            data[at : at + 8] = bytes(len(data[at : at + 8]))
    return bytes(data)


msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=6)
    | st.binary(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.text(max_size=4) | st.integers(-9, 9) | st.binary(max_size=3), inner, max_size=3
        )
    ),
    max_leaves=10,
)


@st.composite
def crc_valid_log(draw: st.DrawFn) -> bytes:
    """Frames with correct lengths and CRCs around arbitrary msgpack: only meaning is wrong."""
    header = draw(
        st.just(
            {"magic": MAGIC, "header": SessionHeader(id="fuzz", created_at=1.0, cwd="/").to_json()}
        )
        | st.fixed_dictionaries(
            {"magic": st.just(MAGIC) | msgpack_values, "header": msgpack_values}
        )
        | msgpack_values
    )
    frames = [_frame(msgpack.packb(header, use_bin_type=True))]
    for event in draw(
        st.lists(
            msgpack_values
            | st.fixed_dictionaries(
                {
                    "type": st.text(max_size=12),
                    "seq": st.integers(0, 3),
                    "time": st.floats(),
                    "data": msgpack_values,
                }
            ),
            max_size=4,
        )
    ):
        frames.append(_frame(msgpack.packb(event, use_bin_type=True)))
    return b"".join(frames)


def _decode_or_corrupt(data: bytes) -> None:
    try:
        _header, events, good, torn = decode_frames(data, "fuzz")
    except CorruptSessionError:
        return
    assert 0 < good <= len(data)
    assert torn == (good < len(data))
    assert all(type(e) is dict for e in events)


def _load_or_refused(data: bytes) -> None:
    store = MemoryStore(durability="none")
    store.files["fuzz"] = _MemoryFile(data)
    try:
        loaded = store.load("fuzz")
    except (CorruptSessionError, InvariantError):
        return
    validate_log(loaded.events, loaded.header)


@FUZZ
@given(st.binary(max_size=256) | mutated_log())
def test_random_and_mutated_bytes_decode_or_raise_corrupt_session_error(data: bytes) -> None:
    tried("frames")
    _decode_or_corrupt(data)
    _load_or_refused(data)


@FUZZ
@given(crc_valid_log())
def test_crc_valid_frames_of_any_msgpack_are_refused_by_type(data: bytes) -> None:
    tried("frames")
    _decode_or_corrupt(data)
    _load_or_refused(data)


@FUZZ
@given(
    st.lists(
        st.dictionaries(st.sampled_from(["type", "seq", "time", "data"]), msgpack_values),
        max_size=5,
    )
)
def test_validate_log_raises_only_invariant_error(events: list[dict[str, Any]]) -> None:
    tried("frames")
    with contextlib.suppress(InvariantError):
        validate_log(events)  # type: ignore[arg-type]


class _TooMuchWork(BaseException):
    pass


def test_a_crafted_torn_tail_is_classified_in_linear_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A torn last frame makes the decoder look for a valid frame inside the torn region. Here the
    region's bytes are shaped so that one 4-byte window in four reads as a length that fits in
    the file (00 06 00 00 = 393,216), so a scan that CRCs each candidate does ~n/4 CRCs of
    393 KB. The work is counted, not timed: past 16x the file size the test stops it."""
    import agent.frames as frames

    data = VALID_LOG + struct.pack(">II", 0x00FFFFFF, 0) + b"\x00\x06\x00\x00" * (200 * 1024)
    budget = [16 * len(data)]
    real = frames._crc32

    def counting(chunk: Any, *args: Any) -> int:
        budget[0] -= len(chunk)
        if budget[0] < 0:
            raise _TooMuchWork(
                f"more than {16 * len(data)} bytes CRC'd for a {len(data)}-byte file"
            )
        return real(chunk, *args)

    monkeypatch.setattr(frames, "_crc32", counting)
    try:
        _h, _events, good, torn = decode_frames(data, "crafted")
    except _TooMuchWork as exc:
        pytest.fail(f"quadratic torn-tail scan: {exc}")
    assert torn and good == len(VALID_LOG)


# -- ACP JSON-RPC stream ---------------------------------------------------------------------------

MAX_LINE = 256
ids = st.sampled_from([0, 0, 1, 7, -1, "0", None, 0.5, [0], {"a": 0}])
rpc_lines = st.one_of(
    st.builds(lambda i, r: {"jsonrpc": "2.0", "id": i, "result": r}, ids, json_values),
    st.builds(
        lambda i, c: {"jsonrpc": "2.0", "id": i, "error": {"code": c, "message": "no"}},
        ids,
        st.integers(-33000, 0),
    ),
    st.builds(
        lambda m, p: {"jsonrpc": "2.0", "method": m, "params": p}, st.text(max_size=10), json_values
    ),
    st.builds(
        lambda i, m: {"jsonrpc": "2.0", "id": i, "method": m, "params": {}},
        ids,
        st.sampled_from(
            ["session/request_permission", "fs/read_text_file", "terminal/create", "x"]
        ),
    ),
    json_values,
).map(lambda obj: json.dumps(obj).encode())
raw_lines = st.one_of(
    rpc_lines,
    st.binary(max_size=40),  # garbage, invalid UTF-8 included
    st.just(b""),
    st.integers(MAX_LINE - 2, MAX_LINE + 3).map(lambda n: b'"' + b"x" * n + b'"'),  # around the cap
    st.sampled_from([b"{", b'{"id": 0', b"[" * 50, b"nul", b"  ", b"\xff\xfe"]),
)
stream = st.lists(raw_lines, max_size=6).flatmap(
    lambda lines: st.tuples(st.just(lines), st.booleans(), st.integers(1, 64))
)


def expected_outcome(lines: list[bytes], trailing_newline: bool) -> tuple[str, Any]:
    """What JSON-RPC 2.0 says request id 0 gets from this stream, then EOF."""
    pieces = [line + b"\n" for line in lines]
    if pieces and not trailing_newline:
        pieces[-1] = pieces[-1][:-1]
    text = b"".join(pieces)
    for raw in text.splitlines(keepends=True):
        if len(raw) > MAX_LINE and not (len(raw) == MAX_LINE + 1 and raw.endswith(b"\n")):
            return ("closed", None)
        if not raw.strip():
            continue
        try:
            message = json.loads(raw)
        except ValueError:
            return ("closed", None)
        if not isinstance(message, dict):
            return ("closed", None)
        if isinstance(message.get("method"), str):
            if "id" in message and not usable_id(message["id"]):
                return ("closed", None)  # a request whose id cannot be echoed: a bad line
            continue
        if "id" in message and ("result" in message or "error" in message):
            rid = message["id"]
            if type(rid) is int and rid == 0:  # JSON-RPC ids: a bool is not a number
                if message.get("error") is not None:
                    return ("error", None)
                return ("result", message.get("result"))
            continue
        return ("closed", None)
    return ("closed", None)


def run_stream(
    lines: list[bytes],
    trailing_newline: bool,
    chunk: int,
    max_line: int = MAX_LINE,
    guard: float = 10.0,
) -> tuple[str, Any, list[bytes]]:
    out_r, out_w = os.pipe()
    in_r, in_w = os.pipe()
    agent_stdout = FileObjectPosix(out_r, "rb")
    agent_stdin = FileObjectPosix(in_w, "wb")
    answers: list[bytes] = []

    def on_request(method: str, params: Any) -> Any:
        if method == "session/request_permission":
            return {"outcome": {"outcome": "cancelled"}}
        raise MethodNotFound(method)

    conn = JsonRpcConnection(
        agent_stdin,
        agent_stdout,
        on_request=on_request,
        on_notification=lambda m, p: None,
        max_line_bytes=max_line,
        name="fuzz",
    )
    drain_file = FileObjectPosix(in_r, "rb")

    def drain() -> None:
        for line in drain_file:
            answers.append(line)

    drainer = gevent.spawn(drain)
    asking = gevent.spawn(conn.request, "session/prompt", {})
    # The agent answers only what it was asked: feed the stream once our request went out.
    with gevent.Timeout(10, AssertionError("the request was never written")):
        while not answers:
            gevent.sleep(0.001)
    payload = b"".join(line + b"\n" for line in lines)
    if lines and not trailing_newline:
        payload = payload[:-1]
    writer = FileObjectPosix(out_w, "wb")
    for at in range(0, len(payload), chunk):
        writer.write(payload[at : at + chunk])
        writer.flush()
        gevent.sleep(0)
    writer.close()  # EOF
    # A hang here is the finding: the guard turns it into a failure instead of a stuck run.
    with gevent.Timeout(guard, AssertionError("the request never completed after EOF")):
        asking.join()
    try:
        outcome: tuple[str, Any] = ("result", asking.get())
    except RpcError:
        outcome = ("error", None)
    except ConnectionClosed:
        outcome = ("closed", None)
    conn.shutdown("fuzz done")
    with gevent.Timeout(10, AssertionError("the connection did not shut down")):
        drainer.join()
    drain_file.close()
    return outcome[0], outcome[1], answers


@FUZZ
@given(stream)
def test_acp_streams_resolve_the_request_exactly_as_json_rpc_says(
    case: tuple[list[bytes], bool, int],
) -> None:
    lines, trailing_newline, chunk = case
    tried("acp")
    assume(all(b"\n" not in line and b"\r" not in line for line in lines))
    kind, value, _answers = run_stream(lines, trailing_newline, chunk)
    assert (kind, value) == expected_outcome(lines, trailing_newline)


def test_acp_deeply_nested_json_fails_the_request_instead_of_killing_the_reader() -> None:
    """A hostile agent's line of 100,000 '[' makes json.loads raise RecursionError, which is
    neither OSError nor ValueError: the reader must still fail the pending request."""
    tried("acp")
    kind, _value, _answers = run_stream(
        [b"[" * 100_000], True, 1 << 16, max_line=1 << 20, guard=2.0
    )
    assert kind == "closed"


@pytest.mark.parametrize("bad_id", [b"false"])  # a bool is no JSON-RPC id (fixed in 7a8b6bf)
def test_acp_a_boolean_id_answers_no_request(bad_id: bytes) -> None:
    tried("acp")
    line = b'{"jsonrpc": "2.0", "id": ' + bad_id + b', "result": "forged"}'
    kind, value, _answers = run_stream([line], True, 64)
    assert (kind, value) == ("closed", None)
