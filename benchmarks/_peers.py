"""Peer frameworks measured in the same process as our runtime (used by `fanout` and `resume`).

Each peer runs its own asyncio loop to completion inside one call (`asyncio.run`): while it runs,
the gevent hub is blocked, which is fine in a benchmark as long as each side is measured on its
own. Nothing here monkey-patches anything. A peer that cannot be imported or fails reports
`None` figures and the reason, never an exception.

Peers:
- autogen-core `SingleThreadedAgentRuntime`: N agents, each answering 10 request/reply rounds
  through the runtime, sleeping 10 ms before each reply; plus its agent creation rate.
- OpenAI Agents SDK `Runner`: N runs of a scripted conversation (9 tool calls, then a text
  answer) against a fake `Model` that sleeps 10 ms per call; no network, tracing disabled.
- LangGraph: a thread whose checkpoint holds ~M messages in a SQLite checkpointer; time from
  `invoke(...)` on a fresh graph over the same database to the first node call.
"""

from __future__ import annotations

import asyncio
import os
import resource
import sqlite3
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "autogen_creation",
    "autogen_fanout",
    "autogen_fanout_one_message",
    "autogen_idle_kib",
    "cpu_s",
    "langgraph_resume",
    "openai_agents_fanout",
    "peer_failure",
    "pykka_threads_fanout",
]


def cpu_s() -> float:
    """User + system CPU of this process (all threads), seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peer_failure(name: str, exc: BaseException) -> dict[str, Any]:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {"available": False, "reason": f"{name}: {last}"}


# -- autogen-core ----------------------------------------------------------------------------


@dataclass
class _Round:
    index: int


@dataclass
class _Hello:
    pass


def autogen_fanout(n: int, steps: int = 10, latency: float = 0.01) -> dict[str, Any]:
    """N agents x `steps` sleep-then-reply rounds, driven concurrently through the runtime."""
    try:
        ag = _autogen()
    except Exception as exc:  # ImportError, or a broken install
        return peer_failure("autogen-core", exc)

    async def on_round(self: Any, message: _Round, ctx: Any) -> _Round:
        await asyncio.sleep(latency)
        return _Round(message.index + 1)

    Worker = _routed_agent(ag, "bench worker", _Round, on_round)

    async def main() -> dict[str, Any]:
        runtime = ag.SingleThreadedAgentRuntime()
        await Worker.register(runtime, "worker", Worker)
        runtime.start()

        async def drive(k: int) -> int:
            target = ag.AgentId("worker", str(k))
            reply = _Round(0)
            for _ in range(steps):
                reply = await runtime.send_message(reply, target)
            return reply.index

        t0 = time.perf_counter()
        c0 = cpu_s()
        done = await asyncio.gather(*(drive(k) for k in range(n)))
        wall = time.perf_counter() - t0
        cpu = cpu_s() - c0
        await runtime.stop_when_idle()
        await runtime.close()
        if done != [steps] * n:
            raise AssertionError("autogen: a conversation did not finish all its rounds")
        return {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)}

    return _run_fanout_peer(
        "autogen-core",
        main,
        n,
        steps,
        "no log, no lifecycle events; agents created lazily by the first message",
    )


def autogen_fanout_one_message(n: int, steps: int = 10, latency: float = 0.01) -> dict[str, Any]:
    """N agents, one message each; the handler sleeps `latency` `steps` times (no per-step
    work at all): the shape closest to one child doing `steps` model calls."""
    try:
        ag = _autogen()
    except Exception as exc:
        return peer_failure("autogen-core", exc)

    async def on_round(self: Any, message: _Round, ctx: Any) -> _Round:
        for _ in range(steps):
            await asyncio.sleep(latency)
        return _Round(message.index + steps)

    Worker = _routed_agent(ag, "bench worker", _Round, on_round)

    async def main() -> dict[str, Any]:
        runtime = ag.SingleThreadedAgentRuntime()
        await Worker.register(runtime, "worker", Worker)
        runtime.start()
        import gc

        gc.collect()
        t0 = time.perf_counter()
        c0 = cpu_s()
        done = await asyncio.gather(
            *(runtime.send_message(_Round(0), ag.AgentId("worker", str(k))) for k in range(n))
        )
        gc.collect()  # the deferred collection is part of the cost
        wall = time.perf_counter() - t0
        cpu = cpu_s() - c0
        await runtime.stop_when_idle()
        await runtime.close()
        if [d.index for d in done] != [steps] * n:
            raise AssertionError("autogen: a message was not answered")
        return {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)}

    return _run_fanout_peer(
        "autogen-core",
        main,
        n,
        steps,
        "one message per agent, `steps` sleeps in its handler; no log, no events",
    )


def autogen_idle_kib(n: int) -> dict[str, Any]:
    """RSS per idle autogen agent: N agents instantiated (one message each), then kept."""
    try:
        ag = _autogen()
    except Exception as exc:
        return peer_failure("autogen-core", exc)
    from benchmarks._measure import rss_bytes

    async def on_hello(self: Any, message: _Hello, ctx: Any) -> _Hello:
        return message

    Greeter = _routed_agent(ag, "bench greeter", _Hello, on_hello)

    async def main() -> dict[str, Any]:
        import gc

        runtime = ag.SingleThreadedAgentRuntime()
        await Greeter.register(runtime, "greeter", Greeter)
        runtime.start()
        gc.collect()
        rss0 = rss_bytes()
        await asyncio.gather(
            *(runtime.send_message(_Hello(), ag.AgentId("greeter", str(k))) for k in range(n))
        )
        gc.collect()
        per = (rss_bytes() - rss0) / n
        await runtime.stop_when_idle()
        await runtime.close()
        return {"available": True, "n": n, "rss_per_idle_agent_kib": round(per / 1024, 2)}

    try:
        return asyncio.run(main())
    except Exception as exc:
        return peer_failure("autogen-core", exc)


def pykka_threads_fanout(n: int, steps: int = 10, latency: float = 0.01) -> dict[str, Any]:
    """Pykka's own ThreadingActor at the same N: one OS thread per actor, one message each whose
    handler sleeps `latency` `steps` times."""
    import gc
    import threading

    import pykka

    class Sleeper(pykka.ThreadingActor):
        use_daemon_thread = True

        def on_receive(self, message: Any) -> Any:
            for _ in range(steps):
                time.sleep(latency)
            return steps

    stack = threading.stack_size()
    try:
        threading.stack_size(256 * 1024)  # N threads must fit the machine
        gc.collect()
        t0 = time.perf_counter()
        c0 = cpu_s()
        refs = [Sleeper.start() for _ in range(n)]
        futures = [ref.ask("go", block=False) for ref in refs]
        done = pykka.get_all(futures)
        wall = time.perf_counter() - t0
        cpu = cpu_s() - c0
        pykka.get_all([ref.stop(block=False) for ref in refs])
    except Exception as exc:
        return peer_failure("pykka ThreadingActor", exc)
    finally:
        threading.stack_size(stack)
    if done != [steps] * n:
        return {"available": False, "reason": "pykka threads: a message was not answered"}
    return {
        "available": True,
        "n": n,
        "wall_s": round(wall, 4),
        "cpu_s": round(cpu, 4),
        "cpu_per_step_us": round(cpu / (n * steps) * 1e6, 2),
        "note": "one OS thread per actor (256 KiB stacks), started inside the timed window",
    }


def _run_fanout_peer(
    name: str, main: Callable[[], Any], n: int, steps: int, note: str
) -> dict[str, Any]:
    """Run a peer's asyncio fan-out to completion and add the per-step figures (or its failure)."""
    try:
        figures: dict[str, Any] = asyncio.run(main())
    except Exception as exc:
        return peer_failure(name, exc)
    figures.update(
        available=True,
        n=n,
        cpu_per_step_us=round(figures["cpu_s"] / (n * steps) * 1e6, 2),
        note=note,
    )
    return figures


def autogen_creation(n: int) -> dict[str, Any]:
    """Agents/s: N fresh agent ids, each instantiated and answering one no-latency message."""
    try:
        ag = _autogen()
    except Exception as exc:
        return peer_failure("autogen-core", exc)

    async def on_hello(self: Any, message: _Hello, ctx: Any) -> _Hello:
        return message

    Greeter = _routed_agent(ag, "bench greeter", _Hello, on_hello)

    async def main() -> dict[str, Any]:
        runtime = ag.SingleThreadedAgentRuntime()
        await Greeter.register(runtime, "greeter", Greeter)
        runtime.start()
        t0 = time.perf_counter()
        await asyncio.gather(
            *(runtime.send_message(_Hello(), ag.AgentId("greeter", str(k))) for k in range(n))
        )
        wall = time.perf_counter() - t0
        await runtime.stop_when_idle()
        await runtime.close()
        return {"creation_per_s": round(n / wall), "wall_s": round(wall, 4)}

    try:
        figures = asyncio.run(main())
    except Exception as exc:
        return peer_failure("autogen-core", exc)
    figures.update(available=True, n=n)
    return figures


def _autogen() -> Any:
    """autogen-core's module (raises when it is not installed or broken)."""
    import autogen_core

    return autogen_core


def _routed_agent(ag: Any, description: str, message_type: type, handler: Any) -> Any:
    """A RoutedAgent class whose one handler is `handler(self, message, ctx)`.

    autogen reads the handler's type hints at decoration time; with postponed annotations (this
    module) they must be real objects, so they are set here and the class is built by hand.
    """
    handler.__annotations__ = {
        "message": message_type,
        "ctx": ag.MessageContext,
        "return": message_type,
    }

    def __init__(self: Any) -> None:
        ag.RoutedAgent.__init__(self, description)

    handle = ag.message_handler(handler)
    return type("BenchAgent", (ag.RoutedAgent,), {"__init__": __init__, "handle": handle})


# -- OpenAI Agents SDK --------------------------------------------------------------------------


def openai_agents_fanout(n: int, steps: int = 10, latency: float = 0.01) -> dict[str, Any]:
    """N concurrent `Runner.run` conversations against a fake model (no network, no tracing)."""
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    os.environ.setdefault("OPENAI_API_KEY", "sk-benchmark-not-used")
    try:
        from agents import (
            Agent,
            ModelResponse,
            RunConfig,
            Runner,
            Usage,
            function_tool,
            set_tracing_disabled,
        )
        from agents.models.interface import Model
        from openai.types.responses import (
            ResponseFunctionToolCall,
            ResponseOutputMessage,
            ResponseOutputText,
        )
    except Exception as exc:
        return peer_failure("openai-agents", exc)
    set_tracing_disabled(True)

    class FakeModel(Model):
        """Counts its calls per conversation from the input: tool calls until `steps`."""

        async def get_response(
            self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
        ) -> Any:
            await asyncio.sleep(latency)
            calls = (
                0
                if isinstance(input, str)
                else sum(1 for item in input if _item_type(item) == "function_call")
            )
            if calls + 1 < steps:
                call = ResponseFunctionToolCall(
                    type="function_call",
                    call_id=f"call_{calls}",
                    name="noop",
                    arguments="{}",
                    id=f"fc_{calls}",
                    status="completed",
                )
                return ModelResponse(output=[call], usage=Usage(), response_id=None)
            message = ResponseOutputMessage(
                id="msg_final",
                type="message",
                role="assistant",
                status="completed",
                content=[ResponseOutputText(type="output_text", text="done", annotations=[])],
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError

    @function_tool
    def noop() -> str:
        """Do nothing."""
        return "ok"

    model = FakeModel()
    agent = Agent(name="child", instructions="bench", model=model, tools=[noop])
    config = RunConfig(tracing_disabled=True)

    async def main() -> dict[str, Any]:
        t0 = time.perf_counter()
        c0 = cpu_s()
        results = await asyncio.gather(
            *(
                Runner.run(agent, f"task {k}", max_turns=steps + 5, run_config=config)
                for k in range(n)
            )
        )
        wall = time.perf_counter() - t0
        cpu = cpu_s() - c0
        if any(r.final_output != "done" for r in results):
            raise AssertionError("agents-sdk: a conversation did not finish")
        return {"wall_s": round(wall, 4), "cpu_s": round(cpu, 4)}

    return _run_fanout_peer(
        "openai-agents",
        main,
        n,
        steps,
        "fake Model (asyncio.sleep per call), function tool 'noop', tracing disabled",
    )


def _item_type(item: Any) -> Any:
    if isinstance(item, dict):
        return item.get("type")
    return getattr(item, "type", None)


# -- LangGraph ------------------------------------------------------------------------------


def langgraph_resume(messages: int, repeats: int = 5) -> dict[str, Any]:
    """A thread holding `messages` messages in a SQLite checkpointer (written in one checkpoint,
    then reopened): time from `invoke` on a fresh graph + connection to the first node call."""
    try:
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, MessagesState, StateGraph
    except Exception as exc:
        return peer_failure("langgraph", exc)

    try:
        return _langgraph_resume(
            messages, repeats, SqliteSaver, StateGraph, MessagesState, START, END
        )
    except Exception as exc:
        return peer_failure("langgraph", exc)


def _langgraph_resume(
    messages: int,
    repeats: int,
    saver_cls: Any,
    graph_cls: Any,
    state_cls: Any,
    start: Any,
    end: Any,
) -> dict[str, Any]:
    from langchain_core.messages import AIMessage, HumanMessage

    seen: list[float] = []

    def model_node(state: Any) -> dict[str, Any]:
        seen.append(time.perf_counter())
        return {"messages": [AIMessage(content="ok")]}

    def build(saver: Any) -> Any:
        graph = graph_cls(state_cls)
        graph.add_node("model", model_node)
        graph.add_edge(start, "model")
        graph.add_edge("model", end)
        return graph.compile(checkpointer=saver)

    with tempfile.TemporaryDirectory(prefix="bench-langgraph-") as tmp:
        path = os.path.join(tmp, "checkpoints.sqlite")
        config = {"configurable": {"thread_id": "child"}}
        history: list[Any] = []
        for i in range(messages // 2):
            history.append(HumanMessage(content=f"user message {i}", id=f"h{i}"))
            history.append(AIMessage(content=f"assistant reply {i}", id=f"a{i}"))
        t0 = time.perf_counter()
        conn = sqlite3.connect(path, check_same_thread=False)
        app = build(saver_cls(conn))
        app.update_state(config, {"messages": history})
        conn.close()
        build_s = time.perf_counter() - t0
        size = os.path.getsize(path)

        samples: list[float] = []
        for i in range(repeats):
            seen.clear()
            t0 = time.perf_counter()
            conn = sqlite3.connect(path, check_same_thread=False)
            app = build(saver_cls(conn))
            app.invoke({"messages": [HumanMessage(content=f"resume {i}")]}, config)
            samples.append(seen[0] - t0)
            state = app.get_state(config)
            count = len(state.values["messages"])
            conn.close()
    samples.sort()
    return {
        "available": True,
        "messages": messages,
        "state_messages_after": count,
        "db_bytes": size,
        "build_s": round(build_s, 3),
        "resume_to_first_node_ms_median": round(samples[len(samples) // 2] * 1e3, 2),
        "resume_to_first_node_ms_min": round(samples[0] * 1e3, 2),
        "repeats": repeats,
        "note": "one checkpoint holding the whole MessagesState; fresh connection + graph each",
    }
