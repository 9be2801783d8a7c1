"""Tools: registry, scopes, restrict() as visibility AND authority, execution outcomes."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import gevent
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.model import ToolCall, ToolSpec
from agent.tools import (
    INVALID_ARGS,
    TOOL_FAILED,
    UNKNOWN_TOOL,
    Tool,
    ToolContext,
    ToolError,
    ToolRegistry,
    ToolResult,
    ToolScope,
)
from subagent.errors import SubagentError
from subagent.types import ToolRestriction
from supervision.offload import offload
from supervision.signal import AbortController, AbortError

OBJ: dict[str, Any] = {"type": "object"}


def echo(tag: str) -> Any:
    def fn(args: Mapping[str, Any], ctx: ToolContext) -> str:
        return f"{tag}:{dict(args)}"

    return fn


def mk(name: str, tag: str | None = None, **kw: Any) -> Tool:
    params = kw.pop("parameters", OBJ)
    return Tool(name, f"the {name} tool", params, kw.pop("fn", echo(tag or name)), **kw)


def ctx(signal_owner: AbortController | None = None) -> ToolContext:
    owner = signal_owner or AbortController()
    return ToolContext(agent=None, session_id="s1", call_id="c1", signal=owner.signal)


def call(name: str, **args: Any) -> ToolCall:
    return ToolCall(id="c1", name=name, arguments=args)


def run(scope: ToolScope, name: str, **args: Any) -> ToolResult:
    return scope.execute(call(name, **args), ctx())


def text(result: ToolResult) -> str:
    found: str = result.content[0]["text"]
    return found


def spec_names(scope: ToolScope) -> list[str]:
    return [s.name for s in scope.specs()]


@pytest.fixture
def reg() -> ToolRegistry:
    r = ToolRegistry()
    for n in ("read", "write", "bash"):
        r.register(mk(n))
    return r


# --- Tool construction ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "_x", "Read_File-2", "A" * 64])
def test_valid_tool_names(name: str) -> None:
    assert mk(name).name == name


@pytest.mark.parametrize("name", ["", "1a", "-a", "a b", "a.b", "A" * 65, "a\n", "ä"])
def test_invalid_tool_names(name: str) -> None:
    with pytest.raises(ValueError, match="invalid tool name"):
        mk(name)


def test_parameters_checked_against_meta_schema() -> None:
    with pytest.raises(ValueError, match="invalid parameters schema"):
        mk("t", parameters={"type": "object", "properties": {"x": {"type": "nope"}}})
    with pytest.raises(ValueError, match="must describe an object"):
        mk("t", parameters={"type": "string"})
    with pytest.raises(TypeError):
        mk("t", parameters=[])  # type: ignore[arg-type]


def test_spec_and_concurrency_flag() -> None:
    t = mk("t", concurrency_safe=True)
    assert t.spec() == ToolSpec("t", "the t tool", OBJ)
    assert t.spec() is t.spec()
    r = ToolRegistry()
    r.register(t)
    r.register(mk("u"))
    scope = ToolScope(r)
    assert scope.is_concurrency_safe("t")
    assert not scope.is_concurrency_safe("u")
    assert not scope.is_concurrency_safe("missing")
    scope.restrict(deny=["t"])
    assert not scope.is_concurrency_safe("t")


def test_validator_compiled_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import agent.tools as tools_mod

    built: list[object] = []
    real = tools_mod.Draft202012Validator

    class Counting:
        check_schema = staticmethod(real.check_schema)

        def __new__(cls, schema: Any, **options: Any) -> Any:
            built.append(schema)
            return real(schema, **options)

    monkeypatch.setattr(tools_mod, "Draft202012Validator", Counting)
    t = mk("t", parameters={"type": "object", "properties": {"n": {"type": "integer"}}})
    scope = ToolScope(ToolRegistry())
    scope.add(t)
    for i in range(5):
        assert not run(scope, "t", n=i).is_error
    assert len(built) == 1


# --- registry ------------------------------------------------------------------------------


def test_registry_order_duplicates_and_unregister(reg: ToolRegistry) -> None:
    assert reg.names() == ["read", "write", "bash"]
    with pytest.raises(ValueError, match="already registered"):
        reg.register(mk("read"))
    extra = mk("extra")
    unregister = reg.register(extra)
    assert reg.get("extra") is extra
    unregister()
    unregister()  # idempotent
    assert reg.get("extra") is None
    # A stale unregister does not remove a later tool of the same name.
    again = mk("extra", "v2")
    reg.register(again)
    unregister()
    assert reg.get("extra") is again


# --- scopes, shadowing ---------------------------------------------------------------------


def test_specs_order_global_then_scoped(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    scope.add(mk("zeta"))
    scope.add(mk("alpha"))
    assert spec_names(scope) == ["read", "write", "bash", "zeta", "alpha"]


def test_scoped_tool_shadows_global_for_this_scope_only(reg: ToolRegistry) -> None:
    a, b = ToolScope(reg), ToolScope(reg)
    remove = a.add(mk("read", "scoped"))
    assert run(a, "read").content[0]["text"].startswith("scoped:")
    assert run(b, "read").content[0]["text"].startswith("read:")
    assert spec_names(a).count("read") == 1
    remove()
    assert run(a, "read").content[0]["text"].startswith("read:")


def test_duplicate_scoped_name_raises(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    scope.add(mk("x"))
    with pytest.raises(ValueError, match="already in this scope"):
        scope.add(mk("x"))


def test_flat_child_does_not_inherit_parent_scoped_tools(reg: ToolRegistry) -> None:
    parent = ToolScope(reg)
    parent.add(mk("parent_only"))
    parent.restrict(deny=["bash"])
    child = ToolScope(reg)
    assert spec_names(child) == ["read", "write", "bash"]
    assert run(child, "parent_only").code == UNKNOWN_TOOL


def test_a_made_up_tool_name_is_said_back_cut(reg: ToolRegistry) -> None:
    """The name comes from the model: a long one is said back in part, with its length."""
    scope = ToolScope(reg)
    assert text(run(scope, "nope")) == "unknown tool 'nope'"
    result = run(scope, "n" * 50_000)
    assert result.code == UNKNOWN_TOOL
    said = text(result)
    assert said.startswith("unknown tool 'nnn") and said.endswith("(a name of 50000 characters)")
    assert len(said) < 300


def test_layered_child_inherits_parent_visible_view(reg: ToolRegistry) -> None:
    parent = ToolScope(reg)
    parent.add(mk("parent_only"))
    lift = parent.restrict(deny=["bash"])
    child = ToolScope(reg, parent=parent)
    child.add(mk("child_only"))
    assert spec_names(child) == ["read", "write", "parent_only", "child_only"]
    assert run(child, "bash").code == UNKNOWN_TOOL
    with pytest.raises(SubagentError) as ei:
        child.restrict(deny=["bash"])  # hidden from the parent means unknown to the child
    assert ei.value.code == "INVALID_TOOL_FILTER"
    child.restrict(allow=["read", "child_only"])
    assert spec_names(child) == ["read", "child_only"]
    assert spec_names(parent) == ["read", "write", "parent_only"]  # parent unaffected
    lift()
    assert "bash" in spec_names(parent)
    assert "bash" not in spec_names(child)  # still outside the child's own allow-list


def test_child_scope_must_share_registry(reg: ToolRegistry) -> None:
    with pytest.raises(ValueError):
        ToolScope(ToolRegistry(), parent=ToolScope(reg))


# --- restrict: visibility and authority ----------------------------------------------------


def test_deny_hides_from_specs_and_refuses_execution(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    scope.restrict(deny=["bash"])
    assert spec_names(scope) == ["read", "write"]
    forged = run(scope, "bash")
    assert forged.is_error and forged.code == UNKNOWN_TOOL
    assert scope.resolve("bash") is None


def test_allow_keeps_only_named(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    scope.restrict(allow=["read"])
    assert spec_names(scope) == ["read"]
    assert run(scope, "write").code == UNKNOWN_TOOL
    assert not run(scope, "read").is_error


def test_hidden_tool_function_never_runs(reg: ToolRegistry) -> None:
    ran: list[str] = []

    def fn(args: Mapping[str, Any], c: ToolContext) -> str:
        ran.append("x")
        return "ran"

    scope = ToolScope(reg)
    scope.add(mk("secret", fn=fn))
    scope.restrict(deny=["secret"])
    assert run(scope, "secret").code == UNKNOWN_TOOL
    assert ran == []


def test_restrictions_compose_and_lift(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    lift_a = scope.restrict(allow=["read", "write"])
    lift_b = scope.restrict(deny=["write"])
    assert spec_names(scope) == ["read"]
    # A later, wider allow-list cannot widen the view: each restriction narrows.
    lift_c = scope.restrict(allow=["read", "write", "bash"])
    assert spec_names(scope) == ["read"]
    lift_b()
    lift_b()  # idempotent
    assert spec_names(scope) == ["read", "write"]
    lift_a()
    lift_c()
    assert spec_names(scope) == ["read", "write", "bash"]


def test_allow_and_deny_together(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    scope.restrict(allow=["read", "write"], deny=["write"])
    assert spec_names(scope) == ["read"]


def test_apply_tool_restriction_value(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    scope.apply(ToolRestriction(allow=("bash",)))
    assert spec_names(scope) == ["bash"]


@pytest.mark.parametrize(
    ("allow", "deny"),
    [(["nope"], None), (None, ["read", "nope"]), (["read"], ["nope"])],
)
def test_unknown_names_raise(reg: ToolRegistry, allow: Any, deny: Any) -> None:
    scope = ToolScope(reg)
    with pytest.raises(SubagentError) as ei:
        scope.restrict(allow=allow, deny=deny)
    assert ei.value.code == "INVALID_TOOL_FILTER"
    assert "nope" in str(ei.value)
    assert spec_names(scope) == ["read", "write", "bash"]  # nothing half-applied


@pytest.mark.parametrize(
    ("allow", "deny"), [(None, None), ([], None), (None, []), ([], []), ([], ["read"])]
)
def test_empty_filter_raises(reg: ToolRegistry, allow: Any, deny: Any) -> None:
    with pytest.raises(SubagentError) as ei:
        ToolScope(reg).restrict(allow=allow, deny=deny)
    assert ei.value.code == "INVALID_TOOL_FILTER"


def test_string_filter_is_a_type_error(reg: ToolRegistry) -> None:
    with pytest.raises(TypeError):
        ToolScope(reg).restrict(allow="read")


def test_restriction_applies_to_tools_added_later(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    scope.restrict(allow=["read"])
    scope.add(mk("late_scoped"))
    reg.register(mk("late_global"))
    assert spec_names(scope) == ["read"]
    assert run(scope, "late_scoped").code == UNKNOWN_TOOL
    assert run(scope, "late_global").code == UNKNOWN_TOOL


def test_deny_applies_to_a_name_that_returns(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    remove = scope.add(mk("tmp"))
    scope.restrict(deny=["tmp"])
    remove()
    # Removing and re-adding under the same name does not escape the deny.
    scope.add(mk("tmp", "v2"))
    assert run(scope, "tmp").code == UNKNOWN_TOOL
    assert "tmp" not in spec_names(scope)


def test_exempt_tool_bypasses_restrictions(reg: ToolRegistry) -> None:
    scope = ToolScope(reg)
    scope.restrict(allow=["read"])
    scope.add(mk("structured_output"), exempt=True)
    assert spec_names(scope) == ["read", "structured_output"]
    assert not run(scope, "structured_output").is_error
    # Exemption is the runtime's, not inherited by a child scope's own filters.
    child = ToolScope(reg, parent=scope)
    child.restrict(allow=["read"])
    assert spec_names(child) == ["read"]


def test_specs_cache_invalidates_on_every_change(reg: ToolRegistry) -> None:
    parent = ToolScope(reg)
    child = ToolScope(reg, parent=parent)
    assert spec_names(child) == ["read", "write", "bash"]
    unregister = reg.register(mk("g"))
    assert spec_names(child)[-1] == "g"
    remove = parent.add(mk("p"))
    assert spec_names(child)[-1] == "p"
    lift = parent.restrict(deny=["p"])
    assert "p" not in spec_names(child)
    lift()
    remove()
    unregister()
    assert spec_names(child) == ["read", "write", "bash"]
    specs = child.specs()
    specs.clear()  # callers get a copy
    assert spec_names(child) == ["read", "write", "bash"]


@given(
    allow=st.one_of(st.none(), st.sets(st.sampled_from("abcdef"))),
    deny=st.one_of(st.none(), st.sets(st.sampled_from("abcdef"))),
    probe=st.sampled_from("abcdefz"),
)
def test_one_resolver_for_specs_and_execute(
    allow: set[str] | None, deny: set[str] | None, probe: str
) -> None:
    """Shown exactly when runnable, for any filter: the model never sees what it cannot call."""
    gevent.sleep(0)  # one example at a time: a property run must not starve the hub
    r = ToolRegistry()
    for n in "abc":
        r.register(mk(n))
    scope = ToolScope(r)
    for n in "def":
        scope.add(mk(n))
    if (not allow and not deny) or allow == set():
        with pytest.raises(SubagentError):
            scope.restrict(allow=allow, deny=deny)
        return
    scope.restrict(allow=allow, deny=deny)
    shown = probe in spec_names(scope)
    expected = (allow is None or probe in allow) and probe not in (deny or set()) and probe != "z"
    assert shown == expected
    result = run(scope, probe)
    assert (result.code == UNKNOWN_TOOL) == (not shown)


# --- execution outcomes --------------------------------------------------------------------

NUM = {
    "type": "object",
    "properties": {"n": {"type": "integer"}},
    "required": ["n"],
    "additionalProperties": False,
}


def test_invalid_args() -> None:
    scope = ToolScope(ToolRegistry())
    scope.add(mk("t", parameters=NUM))
    for bad in ({}, {"n": "x"}, {"n": 1, "extra": 2}):
        r = scope.execute(ToolCall("c", "t", bad), ctx())
        assert r.is_error and r.code == INVALID_ARGS
        assert r.content[0]["type"] == "text" and "invalid arguments for t" in r.content[0]["text"]
    r = scope.execute(ToolCall("c", "t", {"n": "x"}), ctx())
    assert "at /n" in r.content[0]["text"]
    r = scope.execute(ToolCall("c", "t", "nope"), ctx())  # type: ignore[arg-type]
    assert r.code == INVALID_ARGS
    assert not scope.execute(ToolCall("c", "t", {"n": 3}), ctx()).is_error


def test_success_text_and_blocks() -> None:
    scope = ToolScope(ToolRegistry())
    scope.add(mk("text", fn=lambda a, c: "hello"))
    blocks = [{"type": "text", "text": "a"}, {"type": "image", "data": "…"}]
    scope.add(mk("blocks", fn=lambda a, c: blocks))
    assert run(scope, "text") == ToolResult([{"type": "text", "text": "hello"}], False, None)
    assert run(scope, "blocks").content == blocks


def test_context_reaches_tool() -> None:
    seen: list[ToolContext] = []
    scope = ToolScope(ToolRegistry())
    scope.add(mk("t", fn=lambda a, c: seen.append(c) or "ok"))
    c = ctx()
    scope.execute(call("t"), c)
    assert seen == [c]


def test_tool_failed_on_exception_and_bad_return() -> None:
    def boom(a: Mapping[str, Any], c: ToolContext) -> str:
        raise KeyError("missing")

    scope = ToolScope(ToolRegistry())
    scope.add(mk("boom", fn=boom))
    scope.add(mk("bad", fn=lambda a, c: 42))
    scope.add(mk("badlist", fn=lambda a, c: [{"no": "type"}]))
    r = run(scope, "boom")
    assert r.is_error and r.code == TOOL_FAILED
    assert r.content[0]["text"] == "KeyError: 'missing'"
    assert run(scope, "bad").code == TOOL_FAILED
    assert run(scope, "badlist").code == TOOL_FAILED


def test_tool_error_chooses_code() -> None:
    def fn(a: Mapping[str, Any], c: ToolContext) -> str:
        raise ToolError("file not found", code="NOT_FOUND")

    scope = ToolScope(ToolRegistry())
    scope.add(mk("t", fn=fn))
    scope.add(mk("d", fn=lambda a, c: (_ for _ in ()).throw(ToolError("plain"))))
    r = run(scope, "t")
    assert (r.is_error, r.code, r.content[0]["text"]) == (True, "NOT_FOUND", "file not found")
    assert run(scope, "d").code == TOOL_FAILED
    with pytest.raises(ValueError):
        ToolError("x", code="")


def test_abort_error_propagates() -> None:
    def fn(a: Mapping[str, Any], c: ToolContext) -> str:
        raise AbortError()

    scope = ToolScope(ToolRegistry())
    scope.add(mk("t", fn=fn))
    with pytest.raises(AbortError):
        run(scope, "t")


def test_abort_during_tool_becomes_abort_error_and_aborted_signal_refuses_to_start() -> None:
    owner = AbortController()
    reason = RuntimeError("cancelled by parent")

    def fn(a: Mapping[str, Any], c: ToolContext) -> str:
        owner.abort(reason)
        c.signal.raise_if_aborted()  # raises the reason itself, a RuntimeError
        return "unreachable"

    ran: list[int] = []
    scope = ToolScope(ToolRegistry())
    scope.add(mk("t", fn=fn))
    scope.add(mk("u", fn=lambda a, c: ran.append(1) or "ok"))
    with pytest.raises(AbortError) as ei:
        scope.execute(call("t"), ctx(owner))
    assert ei.value.reason is reason and ei.value.__cause__ is reason
    with pytest.raises(AbortError) as ei:
        scope.execute(call("u"), ctx(owner))
    assert ei.value.reason is reason
    assert ran == []


def test_greenlet_kill_propagates() -> None:
    entered = gevent.event.Event()
    outcome: list[object] = []

    def fn(a: Mapping[str, Any], c: ToolContext) -> str:
        entered.set()
        gevent.event.Event().wait()  # parks until killed
        return "never"

    scope = ToolScope(ToolRegistry())
    scope.add(mk("t", fn=fn))

    def worker() -> None:
        outcome.append(run(scope, "t"))

    g = gevent.spawn(worker)
    entered.wait()
    g.kill()  # raises GreenletExit inside fn; it must not become a TOOL_FAILED result
    assert g.dead and outcome == []
    assert isinstance(g.value, gevent.GreenletExit)


def _deep(depth: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_a_call_refused_at_construction_is_invalid_args_and_never_runs() -> None:
    """Issue 12 item 11: `ToolCall` screens what a model sent; execute answers the refusal."""
    ran: list[Any] = []
    scope = ToolScope(ToolRegistry())
    scope.add(Tool("t", "", {"type": "object"}, lambda args, c: (ran.append(args), "ok")[1]))
    # Built in a worker thread: 20,000 fresh dicts can set off a full cyclic collection, which
    # on a loaded machine in a long suite holds the hub past the block detector's 0.1 s. That
    # pause is the test's input being made, not the code under test (which walks 129 levels).
    deep = offload(_deep, 20_000)
    call = ToolCall("c", "t", deep)
    del deep
    assert call.arguments == {} and call.invalid is not None
    result = scope.execute(call, ctx())
    assert result.is_error and result.code == INVALID_ARGS and ran == []
    assert "invalid arguments for t: arguments nested deeper than" in result.content[0]["text"]
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic  # a cycle is infinitely deep: refused, never walked for ever
    assert ToolCall("c", "t", cyclic).invalid is not None
    # An unknown tool is still reported as unknown first.
    assert scope.execute(ToolCall("c", "nope", _deep(500)), ctx()).code == UNKNOWN_TOOL


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"x": math.nan}, "arguments.x"),
        ({"x": math.inf}, "arguments.x"),
        ({"x": (1, 2)}, "arguments.x: tuple"),
        ({"x": 2**64}, "arguments.x: integer"),
        ({1: "x"}, "key 1"),
        ({"x": b"raw"}, "arguments.x: bytes"),
    ],
)
def test_flat_arguments_are_screened_as_strictly_as_nested_ones(
    arguments: dict[Any, Any], named: str
) -> None:
    """Flat arguments (no dict or list inside) skip the depth walk, not the lossless check."""
    call = ToolCall("c", "t", arguments)
    assert call.arguments == {} and call.invalid is not None and named in call.invalid
    assert ToolCall("c", "t", {"wrap": arguments}).invalid is not None
    assert ToolCall("c", "t", {"x": 1, "y": "s", "z": None, "w": 1.5}).invalid is None


def _properties_chain(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


RECURSIVE_REF = {
    "$defs": {"n": {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}}},
    "$ref": "#/$defs/n",
}


def test_argument_validation_never_raises_recursion_error() -> None:
    """Arguments that reach validation unscreened (a direct call) against a recursive schema
    are reported as invalid, never a RecursionError out of the tool layer."""
    tool = Tool("t", "", RECURSIVE_REF, lambda args, c: "ok")
    assert tool.argument_errors(_deep(1_000)) == ["arguments are nested too deeply to validate"]
    assert tool.argument_errors(_deep(10)) == []


def test_a_parameters_schema_too_deep_to_check_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="nested too deeply"):
        Tool("t", "", _properties_chain(2_000), lambda args, c: "ok")


def _ticks_during(build: Any) -> int:
    """How often another greenlet ran while `build()` ran in this one: zero when `build` never
    yields the hub."""
    ticks = [0]

    def tick() -> None:
        while True:
            ticks[0] += 1
            gevent.sleep(0)

    ticker = gevent.spawn(tick)
    gevent.sleep(0)  # the ticker is running before the build starts
    start = ticks[0]
    try:
        build()
        return ticks[0] - start  # read before kill(), which yields
    finally:
        ticker.kill()


def test_a_large_parameters_schema_is_checked_off_the_hub() -> None:
    # Its meta-schema check runs for tens of milliseconds: other greenlets run meanwhile.
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(600)}}
    assert _ticks_during(lambda: Tool("t", "", wide, lambda args, c: "ok")) > 0

    def too_deep() -> None:
        with pytest.raises(ValueError, match="nested too deeply"):
            Tool("t", "", _properties_chain(2_000), lambda args, c: "ok")

    assert _ticks_during(too_deep) > 0
