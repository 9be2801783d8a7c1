"""Cancellation and supervision: the bottom layer. It knows gevent and nothing else of ours."""

from supervision.child import Child, Exit, ExitKind
from supervision.errors import (
    AbortError,
    Cancelled,
    ChildKilled,
    RestartIntensityExceeded,
    SubagentRuntimeError,
    SupervisorClosedError,
    SupervisorError,
)
from supervision.greenlet_child import GreenletChild, spawn_child
from supervision.group import TaskGroup
from supervision.signal import AbortController, AbortSignal
from supervision.supervisor import ChildSpec, RestartType, Strategy, Supervisor

__all__ = [
    "AbortController",
    "AbortError",
    "AbortSignal",
    "Cancelled",
    "Child",
    "ChildKilled",
    "ChildSpec",
    "Exit",
    "ExitKind",
    "GreenletChild",
    "RestartIntensityExceeded",
    "RestartType",
    "Strategy",
    "SubagentRuntimeError",
    "Supervisor",
    "SupervisorClosedError",
    "SupervisorError",
    "TaskGroup",
    "spawn_child",
]
