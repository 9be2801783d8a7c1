"""The seam's vocabulary in Python names: pure data and protocols, no behaviour.

Every layer may import this module; it imports nothing of ours but `supervision.signal`.
Content blocks are JSON-native dicts (`{"type": "text", "text": ...}`) so they cross msgpack,
ACP and Ray unchanged. Optional runtime capabilities are discovered with `isinstance` against
the `runtime_checkable` protocols `Steerable` and `Resumable` (the seed's TypeScript narrowing).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from supervision.signal import AbortSignal

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from pykka import Future

__all__ = [
    "ABORTED",
    "BUDGET_EXCEEDED",
    "COMPLETED",
    "ERROR",
    "KNOWN_STOP_REASONS",
    "MAX_TOKENS",
    "REFUSAL",
    "AgentView",
    "ContentBlock",
    "ContinuationDescriptor",
    "MessageSource",
    "OptionsView",
    "Resumable",
    "Steerable",
    "SubagentCapabilities",
    "SubagentContinuation",
    "SubagentProvider",
    "SubagentResult",
    "SubagentResumeRequest",
    "SubagentRun",
    "SubagentStartRequest",
    "ToolRestriction",
    "TraceParent",
    "child_depth",
    "depth_of",
    "is_failure",
    "make_trace_parent",
    "text_block",
]

ContentBlock = Mapping[str, Any]

# Stop reasons form an open set: a backend may add its own; consumers treat unknown ones as failure.
COMPLETED = "completed"
ABORTED = "aborted"
ERROR = "error"
MAX_TOKENS = "max-tokens"
REFUSAL = "refusal"
# A token budget on the child's chain was used up (see docs/decisions.md, "Token budgets").
BUDGET_EXCEEDED = "budget-exceeded"
KNOWN_STOP_REASONS = frozenset({COMPLETED, ABORTED, ERROR, MAX_TOKENS, REFUSAL, BUDGET_EXCEEDED})


def is_failure(stop_reason: str) -> bool:
    """Everything but `completed` is a failure, including reasons this version does not know."""
    return stop_reason != COMPLETED


def text_block(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


@dataclass(frozen=True, slots=True)
class SubagentCapabilities:
    """Start-time features, checked before a run exists. `depth_limit` pairs with `max_depth`."""

    output_schema: bool = False
    depth_limit: bool = False
    tool_filter: bool = False
    persona: bool = False
    # The runtime can see the child's token usage, so it can hold a `token_budget`.
    token_budget: bool = False

    @classmethod
    def all(cls) -> SubagentCapabilities:
        return cls(
            output_schema=True, depth_limit=True, tool_filter=True, persona=True, token_budget=True
        )


@dataclass(frozen=True, slots=True)
class ToolRestriction:
    """Child tool scoping: `allow` keeps only the named tools, `deny` hides the named ones."""

    allow: tuple[str, ...] | None = None
    deny: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        if self.allow is not None:
            out["allow"] = list(self.allow)
        if self.deny is not None:
            out["deny"] = list(self.deny)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ToolRestriction:
        allow = data.get("allow")
        deny = data.get("deny")
        return cls(
            allow=None if allow is None else tuple(allow),
            deny=None if deny is None else tuple(deny),
        )


class OptionsView(Protocol):
    """Agent options as the seam reads them (`agent.options.AgentOptions` has this and more):
    the model route a child defaults to. A provider that builds an agent checks for the real
    options type itself."""

    @property
    def model(self) -> str: ...


class AgentView(Protocol):
    """An agent as the seam sees it: a request's `parent`, a run's `local_agent`.

    Who it is and where it stands. The live agent (`actors.agent_handle.Agent`) and Ray's
    stand-in for a parent in another process have these members and more; a provider that
    needs the agent's context narrows with `agent.parent.parent_agent`, which checks it. The
    vocabulary cannot name the agent layer (tests/test_layers.py), hence a Protocol here.
    """

    @property
    def id(self) -> str: ...

    @property
    def cwd(self) -> str: ...

    @property
    def depth(self) -> int: ...

    @property
    def options(self) -> OptionsView: ...


class ContinuationDescriptor(Protocol):
    """A continuable child's composition as a provider reads it: `subagent.descriptor.
    SubagentDescriptor`, named by its members because that module imports this one."""

    @property
    def provider(self) -> str: ...

    @property
    def label(self) -> str: ...

    @property
    def model(self) -> str: ...

    @property
    def persona(self) -> str | None: ...

    @property
    def tool_filter(self) -> ToolRestriction | None: ...

    @property
    def token_budget(self) -> int | None: ...

    @property
    def cost_budget(self) -> float | None: ...

    def to_json(self) -> dict[str, Any]: ...


MESSAGE_SOURCE_KINDS = frozenset({"user", "coordinator", "subagent-report", "subagent-settled"})


@dataclass(frozen=True, slots=True)
class MessageSource:
    """Who a message is from. Attribution only: a source grants no authority."""

    kind: str
    sender_session_id: str | None = None
    summary: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in MESSAGE_SOURCE_KINDS:
            raise ValueError(f"unknown MessageSource kind {self.kind!r}")
        if self.kind == "coordinator" and not isinstance(self.sender_session_id, str):
            raise ValueError("a coordinator source needs sender_session_id")

    @classmethod
    def user(cls) -> MessageSource:
        return cls("user")

    @classmethod
    def coordinator(cls, sender_session_id: str) -> MessageSource:
        return cls("coordinator", sender_session_id=sender_session_id)

    @classmethod
    def subagent_settled(cls, summary: str) -> MessageSource:
        return cls("subagent-settled", summary=summary)

    def to_json(self) -> dict[str, str]:
        out = {"kind": self.kind}
        if self.sender_session_id is not None:
            out["sender_session_id"] = self.sender_session_id
        if self.summary is not None:
            out["summary"] = self.summary
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MessageSource:
        return cls(
            kind=data["kind"],
            sender_session_id=data.get("sender_session_id"),
            summary=data.get("summary"),
        )


@dataclass(frozen=True, slots=True)
class TraceParent:
    """Where an agent's work hangs in a trace; a value that crosses greenlets, mailboxes and the
    seam (`SubagentStartRequest.trace`), made and read by `agent.tracing`.

    `activation=True`: the span in `context` is this agent's activation span (made by the run
    layer), so the agent's model and tool spans hang directly under it. Otherwise the agent
    opens its own `invoke_agent` span per turn under `context`. `name` is the agent's display
    name (a child's label) for span names and `gen_ai.agent.name`.
    """

    context: Context
    activation: bool = False
    name: str | None = None


def _trace_parent_maker() -> Callable[[Context, bool, str | None], TraceParent]:
    """`TraceParent(context, activation, name)` without the frozen `__init__`'s generic steps
    (one `object.__setattr__` per field through the dataclass machinery, ~0.4-0.8 us): the
    slots are filled through their descriptors. Made once per tool call and activation."""
    new = object.__new__
    slots = TraceParent.__dict__
    set_context = slots["context"].__set__
    set_activation = slots["activation"].__set__
    set_name = slots["name"].__set__

    def make(context: Context, activation: bool, name: str | None) -> TraceParent:
        made: TraceParent = new(TraceParent)
        set_context(made, context)
        set_activation(made, activation)
        set_name(made, name)
        return made

    return make


# The same value as `TraceParent(context, activation, name)`, made cheaper (all arguments given).
make_trace_parent = _trace_parent_maker()


@dataclass(frozen=True, slots=True)
class SubagentContinuation:
    """The service-allocated child id and the descriptor snapshot a continuable start carries."""

    session_id: str
    descriptor: ContinuationDescriptor


@dataclass(frozen=True, slots=True)
class SubagentStartRequest:
    """What a caller asks for. The service validates it against the provider, never mutates it."""

    prompt: Sequence[ContentBlock]
    parent: AgentView  # the spawning agent
    signal: AbortSignal
    agent_options: OptionsView | None = None  # an `agent.options.AgentOptions` for local children
    output_schema: Mapping[str, Any] | None = None
    max_depth: int | None = None
    tool_filter: ToolRestriction | None = None
    persona: str | None = None
    continuation: SubagentContinuation | None = None
    # The most tokens the child and its descendants may spend; never more than the parent has
    # left (the child's budget is clamped to that). Needs the `token_budget` capability.
    token_budget: int | None = None
    # The most USD the child and its descendants may spend (priced by the runtime's price
    # table), clamped like `token_budget`; needs the same capability.
    cost_budget: float | None = None
    # Tracing (None while tracing is off): from the tool layer,
    # where the child hangs (its call's `execute_tool` span, named with the child's label); as
    # the provider receives it, the context of the child's own activation span.
    trace: TraceParent | None = None
    # The child's delegation depth, computed once by the service where it validates the request
    # (the parent's depth + 1, checked against `max_depth`) and carried to the provider, which
    # writes it into the child's header. None on a request that has not been through the
    # service (a provider called directly): `depth_of` computes it there, by the same rule.
    depth: int | None = None


@dataclass(frozen=True, slots=True)
class SubagentResumeRequest:
    """A fully resolved request to cold-resume a persisted continuable child."""

    session_id: str
    prompt: Sequence[ContentBlock]
    source: MessageSource
    parent: AgentView  # the live parent agent recorded in the child's header
    signal: AbortSignal
    descriptor: ContinuationDescriptor
    trace: TraceParent | None = None  # as `SubagentStartRequest.trace`


@dataclass(frozen=True, slots=True)
class SubagentResult:
    """The terminal outcome of a run. A non-`completed` reason means `output` may be partial."""

    output: Sequence[ContentBlock]
    stop_reason: str
    structured: Any = None
    diagnostic: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class SubagentRun(Protocol):
    """A ready child: one disposable activation. Always `dispose()` it."""

    @property
    def id(self) -> str: ...

    @property
    def local_agent(self) -> AgentView | None:
        """The child agent when it runs in this process, else None."""
        ...

    @property
    def result(self) -> Future[SubagentResult]: ...

    def dispose(self) -> None:
        """Cancel what remains and return at quiescence. Idempotent."""


@runtime_checkable
class Steerable(Protocol):
    """Live steering: the returned future fulfils once the running turn admitted the message."""

    def steer(self, content: Sequence[ContentBlock], source: MessageSource) -> Future[None]: ...


@runtime_checkable
class SubagentProvider(Protocol):
    """One named child-agent transport."""

    @property
    def name(self) -> str: ...

    @property
    def capabilities(self) -> SubagentCapabilities: ...

    @property
    def inherits_parent_context(self) -> bool: ...

    def start(self, request: SubagentStartRequest) -> SubagentRun:
        """Return only after publication; on failure or abort, clean up first, then raise."""
        ...


@runtime_checkable
class Resumable(Protocol):
    """The continuation capability: cold-resume a persisted child for one more turn."""

    def resume(self, request: SubagentResumeRequest) -> SubagentRun: ...


def child_depth(parent: object) -> int:
    """The delegation depth of a child of `parent`: one below it (a parent without a depth is
    a root, at 0). The one definition of the rule; the service applies it once per start."""
    depth: int = getattr(parent, "depth", 0)
    return depth + 1


def depth_of(request: SubagentStartRequest) -> int:
    """The depth of the child `request` starts: as the service computed it when it validated
    the request, or (for a request that never went through the service) by `child_depth`."""
    return request.depth if request.depth is not None else child_depth(request.parent)
