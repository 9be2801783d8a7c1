"""Tools the model may call, and the one resolver that decides which of them an agent has.

Layers: a global `ToolRegistry` (deployment tools), then one `ToolScope` per agent that adds its
own tools (which shadow global ones of the same name) and narrows the view with `restrict()`.

Visibility is authority: `ToolScope.resolve()` is the single decision that both `specs()` (what
the model is shown) and `execute()` (what actually runs) consult, so a forged call to a hidden
tool is refused exactly like a call to a tool that does not exist (`UNKNOWN_TOOL`).

Restriction rules (documented in docs/tools.md as well):

- Restrictions are live and compose: each one narrows; a name is visible only when every active
  restriction admits it. Lifting one (the handle `restrict()` returns) restores what it hid.
- They apply to names that appear later too: a tool registered or added after an allow-list
  restriction stays hidden unless the list names it, and a later tool named in a deny list is
  hidden when it arrives. A filter can thus never be widened by registration order.
- Names in a filter must be known when it is applied (loud typo detection); an empty filter is
  refused, and so is an empty allow-list (it would hide everything; an empty deny-list beside an
  allow-list is harmless). All raise `SubagentError("INVALID_TOOL_FILTER")`.
- `add(tool, exempt=True)` adds a runtime-owned tool (the `structured_output` capture tool) that
  bypasses this scope's user filters: the runtime's contract with a child must not depend on
  whether the caller's allow-list happened to name it.
- `ToolScope(registry)` is flat: it sees the global registry only. `ToolScope(registry, parent)`
  inherits the parent's *visible* view (its scoped tools, minus what its restrictions hide) and
  layers its own tools and restrictions on top; exemption is per scope.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable

from agent.edits import EDITS
from agent.errors import TOOL_FAILED, ToolError
from agent.fastcheck import compile_fast_check
from agent.fastinit import fast_init
from agent.model import ToolCall, ToolSpec
from agent.options import AgentOptions
from subagent.errors import SubagentError
from subagent.schema import LARGE_SCHEMA_VALUES, more_values_than
from subagent.types import AgentView, ToolRestriction, TraceParent, text_block
from supervision.offload import offload
from supervision.signal import AbortError, AbortSignal

__all__ = [
    "INVALID_ARGS",
    "TOOL_FAILED",
    "UNKNOWN_TOOL",
    "Tool",
    "ToolCaller",
    "ToolContext",
    "ToolError",
    "ToolFn",
    "ToolHost",
    "ToolRegistry",
    "ToolResult",
    "ToolScope",
]

UNKNOWN_TOOL = "UNKNOWN_TOOL"
INVALID_ARGS = "INVALID_ARGS"

TOOL_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")

# Characters of a made-up tool name said back to the model: the name came from the model, so
# echoing it whole (100 kB, twice in the log) grows its context and the log for nothing.
ECHOED_NAME = 200


def _unknown(name: str) -> str:
    """What the model is told about a call of a tool it does not have."""
    if len(name) <= ECHOED_NAME:
        return f"unknown tool {name!r}"
    return f"unknown tool {name[:ECHOED_NAME]!r}... (a name of {len(name)} characters)"


# Enough to locate a problem without flooding the model's context with a wall of errors.
_MAX_ARG_ERRORS = 5
# jsonschema's messages quote the offending value (or key) whole: a 5 MB string where a boolean
# belongs made a 20 MB error result (escapes quadruple in a repr), logged and sent back to the
# model with every later request. Each message keeps its head and its tail (where jsonschema
# says what is wrong), this many characters of each, and says how much was cut between them.
_ARG_ERROR_KEEP = 200


def _clip(message: str) -> str:
    keep = _ARG_ERROR_KEEP
    if len(message) <= 3 * keep:
        return message
    cut = len(message) - 2 * keep
    return f"{message[:keep]} [... {cut:,} characters cut ...] {message[-keep:]}"


_versions = itertools.count(1)


# Every validator the runtime builds resolves `$ref` within its own schema only: a registry
# of our own retrieves nothing (`referencing`'s default). Without one, jsonschema fetched a
# `$ref` to `http://...` or `file:...` with a blocking `urllib` call on the hub, each time a
# model called the tool, from wherever the URL pointed (nothing downloads at run time).
LOCAL_REFS: Registry[Any] = Registry()


class ToolHost(Protocol):
    """What a tool may ask of the loop running it (`agent.loop.AgentCore`)."""

    def capture(self, value: object) -> None:
        """Stage a structured result; the turn concludes after this step."""
        ...


class ToolCaller(AgentView, Protocol):
    """The agent whose turn runs a tool (`actors.agent_handle.Agent`, a layer up): the seam's
    view of it (id, cwd, depth), its options and its loop. Its context is not named here: the
    context holds the tools, so naming it would be an import cycle; a tool that needs it narrows
    with `agent.parent.parent_agent`, which checks it."""

    @property
    def options(self) -> AgentOptions: ...

    @property
    def core(self) -> ToolHost: ...


@fast_init  # made on every call: a cheaper __init__, same fields (agent.fastinit)
@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a running tool may know about its caller."""

    # None only for a loop run without an agent handle (a bare `AgentCore`, as tests make).
    agent: ToolCaller | None
    session_id: str
    call_id: str
    signal: AbortSignal
    # The call's `execute_tool` span while tracing is on, else None.
    trace: TraceParent | None = None
    # Told the id of each child agent this call starts, wakes or waits on, so the caller can
    # attribute the child's progress to this call (an MCP server runs overlapping calls for one
    # agent).
    on_child: Callable[[str], None] | None = None

    @property
    def caller(self) -> ToolCaller:
        """The calling agent; a `ToolError` when the loop runs without one."""
        if self.agent is None:
            raise ToolError("this tool needs a calling agent", code=TOOL_FAILED)
        return self.agent


ToolFn = Callable[[Mapping[str, Any], ToolContext], "str | list[dict[str, Any]]"]


@fast_init  # made on every call: a cheaper __init__, same fields (agent.fastinit)
@dataclass(frozen=True, slots=True)
class ToolResult:
    """The outcome of one call, always a value: tool failures are reported to the model."""

    content: list[dict[str, Any]]
    is_error: bool = False
    code: str | None = None

    @classmethod
    def error(cls, code: str, message: str) -> ToolResult:
        return cls(content=[text_block(message)], is_error=True, code=code)


@dataclass(frozen=True, eq=False)
class Tool:
    """A callable the model may invoke. Arguments are checked against `parameters` first."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    fn: ToolFn
    concurrency_safe: bool = False
    # Compiled once: argument validation runs on every call.
    _validator: Draft202012Validator = field(init=False, repr=False, compare=False)
    _fast_check: Callable[[Any], bool] | None = field(init=False, repr=False, compare=False)
    _large: bool = field(init=False, repr=False, compare=False)
    _spec: ToolSpec = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME_RE.fullmatch(self.name):
            raise ValueError(f"invalid tool name {self.name!r}: must match {TOOL_NAME_RE.pattern}")
        if not isinstance(self.description, str):
            raise TypeError("tool description must be a string")
        if not isinstance(self.parameters, Mapping):
            raise TypeError("tool parameters must be a JSON Schema object (a mapping)")
        if self.parameters.get("type", "object") != "object":
            raise ValueError(f"tool {self.name!r}: parameters must describe an object")
        if not callable(self.fn):
            raise TypeError("tool fn must be callable")
        large = more_values_than(self.parameters, LARGE_SCHEMA_VALUES)
        try:
            if large:
                # The meta-schema check of a large schema runs for tens of milliseconds or
                # more (up to the RecursionError of one nested too deeply): in a thread, as
                # validation against it does, so a tool built inside a greenlet does not
                # stall the hub.
                offload(self._check_parameters)
                fast_check = None
            else:
                self._check_parameters()
                fast_check = compile_fast_check(self.parameters)
        except SchemaError as exc:
            raise ValueError(
                f"tool {self.name!r}: invalid parameters schema: {exc.message}"
            ) from exc
        except RecursionError:
            raise ValueError(
                f"tool {self.name!r}: parameters schema nested too deeply to check"
            ) from None
        validator = Draft202012Validator(self.parameters, registry=LOCAL_REFS)
        object.__setattr__(self, "_validator", validator)
        object.__setattr__(self, "_fast_check", fast_check)
        object.__setattr__(self, "_large", large)
        object.__setattr__(self, "_spec", ToolSpec(self.name, self.description, self.parameters))

    def _check_parameters(self) -> None:
        """Raise `SchemaError` unless `parameters` is a valid Draft 2020-12 schema.

        The meta-schema check costs ~0.2 ms per property; a subclass whose parameters were
        already held to a stricter subset (the structured-output capture tool) may replace it
        with that subset's own, linear check."""
        Draft202012Validator.check_schema(self.parameters)

    def spec(self) -> ToolSpec:
        return self._spec

    def argument_errors(self, arguments: object) -> list[str]:
        """Validation messages for `arguments`, empty when they fit `parameters`."""
        if type(arguments) is dict:
            instance = arguments  # the common case, without the ABC check
        elif not isinstance(arguments, Mapping):
            return [f"arguments must be an object, got {type(arguments).__name__}"]
        else:
            instance = dict(arguments)
        try:
            fast = self._fast_check
            if fast is not None and fast(instance):
                return []  # certainly valid; jsonschema is asked only when in doubt
        except RecursionError:
            return ["arguments are nested too deeply to validate"]
        if self._large:
            # jsonschema costs ~4-40 us per schema node it visits: on a large schema that is
            # tens of milliseconds, so it runs in a thread while every other greenlet runs on
            # (and a large schema has no fast check: compiling one would cost as much).
            return offload(self._slow_errors, instance)
        return self._slow_errors(instance)

    def _slow_errors(self, instance: dict[str, Any]) -> list[str]:
        """jsonschema's verdict: the authority (and the author of the messages)."""
        try:
            # Lazily, and no more than are shown: the cost of a wrong call is then bounded by
            # the first few problems, not by how many properties the schema has.
            found = list(
                itertools.islice(self._validator.iter_errors(instance), _MAX_ARG_ERRORS + 1)
            )
        except RecursionError:
            # Model-made arguments checked against a deeply recursive schema: still the
            # model's problem to fix, never a crash of the turn.
            return ["arguments are nested too deeply to validate"]
        except Unresolvable as exc:
            # The tool's own schema is at fault, not the model's arguments.
            raise ToolError(
                _clip(
                    f"tool {self.name!r} cannot check its arguments: its parameters refer to "
                    f"{exc.ref!r}, which is not in the schema (schemas are never fetched)"
                ),
                code=TOOL_FAILED,
            ) from None
        errors = sorted(found[:_MAX_ARG_ERRORS], key=lambda e: list(map(str, e.path)))
        out = []
        for err in errors:
            where = "/".join(str(p) for p in err.path)
            out.append(_clip(f"at /{where}: {err.message}" if where else err.message))
        if len(found) > _MAX_ARG_ERRORS:
            out.append("... and more")
        return out


class ToolRegistry:
    """The global tool layer every scope sees (before its own restrictions)."""

    def __init__(self) -> None:
        self._tools: dict[str, Tool] = {}
        self._version = next(_versions)
        self._specs: tuple[int, tuple[ToolSpec, ...]] | None = None
        # The tool `name` names, or None: the dict's own `get` (every tool call resolves
        # through it; registration changes the dict in place).
        self.get: Callable[[str], Tool | None] = self._tools.get

    @property
    def version(self) -> int:
        """Changes on every registration change; scopes key their caches on it."""
        return self._version

    def specs(self) -> list[ToolSpec]:
        """Every registered tool's spec, in insertion order: what an unrestricted scope shows
        (built once per registration change, shared by every such scope; do not mutate)."""
        return list(self.spec_tuple())

    def spec_tuple(self) -> tuple[ToolSpec, ...]:
        """`specs()` as one shared tuple (immutable: no copy for each model request)."""
        cached = self._specs
        if cached is None or cached[0] != self._version:
            cached = self._specs = (self._version, tuple(t.spec() for t in self._tools.values()))
        return cached[1]

    def register(self, tool: Tool) -> Callable[[], None]:
        """Add a global tool; returns an idempotent unregister function."""
        if not isinstance(tool, Tool):
            raise TypeError(f"expected Tool, got {type(tool).__name__}")
        if tool.name in self._tools:
            raise ValueError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._version = next(_versions)
        EDITS.bump()

        def unregister() -> None:
            if self._tools.get(tool.name) is tool:
                del self._tools[tool.name]
                self._version = next(_versions)
                EDITS.bump()

        return unregister

    def names(self) -> list[str]:
        """Registered names in insertion order."""
        return list(self._tools)

    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)


@dataclass(frozen=True, slots=True, eq=False)
class _Scoped:
    tool: Tool
    exempt: bool


@dataclass(frozen=True, slots=True, eq=False)
class _Restriction:
    allow: frozenset[str] | None
    deny: frozenset[str]

    def admits(self, name: str) -> bool:
        return (self.allow is None or name in self.allow) and name not in self.deny


def _names_arg(value: Iterable[str] | None, what: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise TypeError(f"{what} must be a collection of tool names, not a string")
    names = tuple(value)
    for n in names:
        if not isinstance(n, str):
            raise TypeError(f"{what} must contain strings, got {type(n).__name__}")
    return names


class ToolScope:
    """One agent's view of the tools: global layer, optional parent view, own tools, filters."""

    def __init__(self, registry: ToolRegistry, parent: ToolScope | None = None) -> None:
        if parent is not None and parent.registry is not registry:
            raise ValueError("a child scope must share its parent's registry")
        self._registry: ToolRegistry = registry
        self._parent = parent
        self._scoped: dict[str, _Scoped] = {}
        self._restrictions: list[_Restriction] = []
        self._version = next(_versions)
        self._specs_key: tuple[int, ...] | None = None
        self._specs: tuple[ToolSpec, ...] = ()

    @property
    def registry(self) -> ToolRegistry:
        return self._registry

    @property
    def parent(self) -> ToolScope | None:
        return self._parent

    @property
    def version(self) -> int:
        """Changes whenever this scope's own tools change (a cache key part)."""
        return self._version

    def _changed(self) -> None:
        self._version = next(_versions)
        EDITS.bump()

    def _key(self) -> tuple[int, ...]:
        key = [self._version]
        scope = self._parent
        while scope is not None:
            key.append(scope.version)
            scope = scope.parent
        key.append(self._registry.version)
        return tuple(key)

    # --- own tools -------------------------------------------------------------------------

    def add(self, tool: Tool, *, exempt: bool = False) -> Callable[[], None]:
        """Add a tool to this scope only (shadowing a same-named inherited one).

        `exempt=True` is for runtime-owned tools: they ignore this scope's restrictions.
        Returns an idempotent remove function.
        """
        if not isinstance(tool, Tool):
            raise TypeError(f"expected Tool, got {type(tool).__name__}")
        if tool.name in self._scoped:
            raise ValueError(f"a tool named {tool.name!r} is already in this scope")
        entry = _Scoped(tool, exempt)
        self._scoped[tool.name] = entry
        self._changed()

        def remove() -> None:
            if self._scoped.get(tool.name) is entry:
                del self._scoped[tool.name]
                self._changed()

        return remove

    # --- restriction -----------------------------------------------------------------------

    def restrict(
        self, allow: Iterable[str] | None = None, deny: Iterable[str] | None = None
    ) -> Callable[[], None]:
        """Narrow this scope's view; returns an idempotent function that lifts it.

        Every named tool must be known to the scope now; a filter naming nothing is refused.
        """
        allow_t = _names_arg(allow, "allow")
        deny_t = _names_arg(deny, "deny")
        if not allow_t and not deny_t:
            raise SubagentError("INVALID_TOOL_FILTER", "the tool filter names no tool")
        if allow_t is not None and not allow_t:
            # It would hide every tool, which no caller means beside a deny-list.
            raise SubagentError("INVALID_TOOL_FILTER", "the allow-list is empty")
        known = set(self._candidate_names())
        unknown = [n for n in (*(allow_t or ()), *(deny_t or ())) if n not in known]
        if unknown:
            listing = ", ".join(sorted(known)) or "(none)"
            raise SubagentError(
                "INVALID_TOOL_FILTER",
                f"unknown tool name(s) {', '.join(sorted(set(unknown)))}; known: {listing}",
            )
        entry = _Restriction(
            allow=None if allow_t is None else frozenset(allow_t), deny=frozenset(deny_t or ())
        )
        self._restrictions.append(entry)
        self._changed()

        def lift() -> None:
            for i, r in enumerate(self._restrictions):
                if r is entry:
                    del self._restrictions[i]
                    self._changed()
                    return

        return lift

    def apply(self, restriction: ToolRestriction) -> Callable[[], None]:
        """`restrict()` from the seam's `ToolRestriction` value."""
        return self.restrict(allow=restriction.allow, deny=restriction.deny)

    # --- the resolver ----------------------------------------------------------------------

    def _inherited(self, name: str) -> Tool | None:
        if self._parent is not None:
            return self._parent.resolve(name)
        return self._registry.get(name)

    def _candidate_names(self) -> list[str]:
        """Names this scope could show before its own restrictions, in stable order."""
        base = self._parent.names() if self._parent is not None else self._registry.names()
        return [n for n in base if n not in self._scoped] + list(self._scoped)

    def _admitted(self, name: str) -> bool:
        restrictions = self._restrictions
        return not restrictions or all(r.admits(name) for r in restrictions)

    def resolve(self, name: str) -> Tool | None:
        """The tool `name` names for this agent, or None when absent or hidden.

        The only visibility decision: `specs()` and `execute()` both go through it.
        """
        # Without restrictions (most scopes) nothing is hidden: no call per check.
        restricted = bool(self._restrictions)
        entry = self._scoped.get(name)
        if entry is not None:
            if entry.exempt or not restricted or self._admitted(name):
                return entry.tool
            return None
        if restricted and not self._admitted(name):
            return None
        parent = self._parent
        if parent is not None:
            return parent.resolve(name)
        return self._registry.get(name)

    def names(self) -> list[str]:
        """Visible names: inherited order first (global insertion order), then scoped."""
        return [n for n in self._candidate_names() if self.resolve(n) is not None]

    def specs(self) -> list[ToolSpec]:
        """What the model is shown; cached until anything in the chain changes."""
        return list(self.spec_tuple())

    def spec_tuple(self) -> tuple[ToolSpec, ...]:
        """`specs()` as the cached tuple itself (immutable, so shared: the loop takes it for
        every model request without a copy)."""
        if self._parent is None and not self._scoped and not self._restrictions:
            # The global layer as is (most children): the registry's shared tuple.
            return self._registry.spec_tuple()
        key = self._key()
        if key != self._specs_key:
            specs = []
            for n in self._candidate_names():
                tool = self.resolve(n)
                if tool is not None:
                    specs.append(tool.spec())
            self._specs, self._specs_key = tuple(specs), key
        return self._specs

    def is_concurrency_safe(self, name: str) -> bool:
        """Whether a call to `name` may run beside others; False for unknown or hidden names."""
        tool = self.resolve(name)
        return tool is not None and tool.concurrency_safe

    # --- execution -------------------------------------------------------------------------

    def execute(self, call: ToolCall, ctx: ToolContext) -> ToolResult:
        """Run one call. Failures become error results; only cancellation propagates.

        Raises only `AbortError` (the signal aborted: before the call, or while the tool ran,
        whatever the tool then raised) and non-`Exception` exits such as `GreenletExit`.
        """
        if ctx.signal.aborted:
            raise AbortError(reason=ctx.signal.reason)
        tool = self.resolve(call.name)
        if tool is None:
            return ToolResult.error(UNKNOWN_TOOL, _unknown(call.name))
        if call.invalid is not None:  # refused when the model made the call (ToolCall)
            return ToolResult.error(
                INVALID_ARGS, f"invalid arguments for {tool.name}: {call.invalid}"
            )
        try:
            problems = tool.argument_errors(call.arguments)
        except ToolError as exc:
            return ToolResult.error(exc.code, exc.message)
        if problems:
            return ToolResult.error(
                INVALID_ARGS, f"invalid arguments for {tool.name}: " + "; ".join(problems)
            )
        try:
            out = tool.fn(call.arguments, ctx)
        except ToolError as exc:
            return ToolResult.error(exc.code, exc.message)
        except AbortError:
            raise
        except Exception as exc:
            if ctx.signal.aborted:  # a failure caused by cancellation is cancellation
                raise AbortError(reason=ctx.signal.reason) from exc
            return ToolResult.error(TOOL_FAILED, f"{type(exc).__name__}: {exc}")
        if type(out) is str:  # the common case, without `_normalize`'s frame
            return ToolResult([{"type": "text", "text": out}])
        return _normalize(tool.name, out)


def _normalize(name: str, out: object) -> ToolResult:
    if isinstance(out, str):
        return ToolResult([text_block(out)])
    if isinstance(out, list) and all(
        isinstance(b, dict) and isinstance(b.get("type"), str) for b in out
    ):
        return ToolResult(list(out))
    return ToolResult.error(
        TOOL_FAILED,
        f"tool {name!r} returned {type(out).__name__}; expected text or a list of content blocks",
    )
