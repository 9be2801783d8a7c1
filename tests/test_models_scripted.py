"""The scripted model and the model registry."""

from __future__ import annotations

from typing import Any

import gevent
import pytest

from agent.model import ModelAdapter, ModelError, ModelRequest, ModelResponse, ToolCall
from agent.models import ModelRegistry, parse_route
from agent.models import scripted as s
from agent.models.scripted import ScriptedModel
from supervision.errors import Cancelled
from supervision.signal import AbortController, AbortError, AbortSignal


def req(
    session: str = "a",
    text: str = "hi",
    *,
    turn: int = 1,
    step: int = 1,
    signal: AbortSignal | None = None,
) -> ModelRequest:
    return ModelRequest(
        session_id=session,
        model="default",
        system="",
        messages=[{"role": "user", "content": [{"type": "text", "text": text}]}],
        tools=(),
        signal=signal or AbortSignal.never(),
        turn=turn,
        step=step,
    )


def background(fn: Any, *args: Any) -> gevent.Greenlet:
    """Spawn a call whose exception comes back through `outcome` (not printed by the hub)."""

    def run() -> Any:
        try:
            return fn(*args)
        except (Exception, Cancelled) as e:  # an abort is a Cancelled, not an Exception
            return e

    return gevent.spawn(run)


def outcome(g: gevent.Greenlet) -> Any:
    result = g.get()
    if isinstance(result, (Exception, Cancelled)):
        raise result
    return result


def collect() -> tuple[list[Any], Any]:
    got: list[Any] = []
    return got, got.append


# --- steps -------------------------------------------------------------------------------------


def test_is_a_model_adapter() -> None:
    assert isinstance(ScriptedModel(), ModelAdapter)


def test_text_step_answers_and_reports_progress() -> None:
    m = ScriptedModel()
    m.script("a", [s.text("hello")])
    got, sink = collect()
    r = m.complete(req(), sink)
    assert r == ModelResponse(({"type": "text", "text": "hello"},), (), "stop")
    assert got == [{"type": "text", "text": "hello"}]


def test_tool_call_ids_derive_from_turn_and_step_unless_given() -> None:
    m = ScriptedModel()
    m.script(
        "a",
        [
            s.tool_call("read", {"path": "x"}),
            s.tool_call("read", {"path": "y"}, id="mine", text="looking"),
            s.tool_calls([("a", {}), ToolCall("t9", "b", {"k": 1}), ("c", {"z": 2}, None)]),
        ],
    )
    r1 = m.complete(req(turn=2, step=3))
    assert r1.finish == "tool_calls" and r1.content == ()
    assert r1.tool_calls == (ToolCall("call_2_3_0", "read", {"path": "x"}),)
    r2 = m.complete(req())
    assert r2.tool_calls == (ToolCall("mine", "read", {"path": "y"}),)
    assert r2.content == ({"type": "text", "text": "looking"},)
    r3 = m.complete(req(turn=1, step=5))
    assert [c.id for c in r3.tool_calls] == ["call_1_5_0", "t9", "call_1_5_2"]
    assert [c.name for c in r3.tool_calls] == ["a", "b", "c"]


@pytest.mark.parametrize(
    ("step", "finish", "text"),
    [
        (s.max_tokens("partial"), "max-tokens", "partial"),
        (s.refusal("no"), "refusal", "no"),
        (s.text(""), "stop", None),
    ],
)
def test_finish_kinds(step: s.Step, finish: str, text: str | None) -> None:
    m = ScriptedModel()
    m.script("a", [step])
    r = m.complete(req())
    assert r.finish == finish
    assert r.content == (({"type": "text", "text": text},) if text else ())


def test_error_step_raises_model_error() -> None:
    m = ScriptedModel()
    m.script("a", [s.error("boom")])
    with pytest.raises(ModelError, match="boom"):
        m.complete(req())


def test_hang_waits_for_the_signal_then_raises_abort() -> None:
    m = ScriptedModel()
    m.script("a", [s.hang()])
    c = AbortController()
    g = background(m.complete, req(signal=c.signal))
    gevent.idle()  # let it reach its wait
    assert not g.ready()
    c.abort()
    with pytest.raises(AbortError):
        outcome(g)


def test_abort_with_a_non_abort_reason_still_raises_abort_error() -> None:
    m = ScriptedModel()
    m.script("a", [s.hang()])
    c = AbortController()
    g = background(m.complete, req(signal=c.signal))
    gevent.idle()
    reason = TimeoutError("deadline")
    c.abort(reason)
    with pytest.raises(AbortError) as info:
        outcome(g)
    assert info.value.reason is reason


def test_already_aborted_raises_without_consuming_a_step() -> None:
    m = ScriptedModel()
    m.script("a", [s.text("one")])
    c = AbortController()
    c.abort()
    with pytest.raises(AbortError):
        m.complete(req(signal=c.signal))
    assert m.complete(req()).content[0]["text"] == "one"
    assert len(m.requests) == 1


def test_chunks_are_paced_and_streamed_in_order() -> None:
    m = ScriptedModel()
    m.script("a", [s.chunks(["a", "b", "c"], latency=0.001)])
    got, sink = collect()
    r = m.complete(req(), sink)
    assert [p["text"] for p in got] == ["a", "b", "c"]
    assert r.content == ({"type": "text", "text": "abc"},) and r.finish == "stop"


def test_chunks_stop_when_aborted_between_parts() -> None:
    m = ScriptedModel()
    m.script("a", [s.chunks(["a", "b", "c"], latency=3600)])
    c = AbortController()
    got: list[Any] = []

    def sink(p: Any) -> None:
        got.append(p)
        c.abort()  # abort during the wait that follows the first chunk

    with pytest.raises(AbortError):
        m.complete(req(signal=c.signal), sink)
    assert [p["text"] for p in got] == ["a"]


def test_latency_is_abortable() -> None:
    m = ScriptedModel()
    m.script("a", [s.text("late", latency=3600)])
    c = AbortController()
    g = background(m.complete, req(signal=c.signal))
    gevent.idle()
    assert not g.ready()
    c.abort()
    with pytest.raises(AbortError):
        outcome(g)


def test_latency_then_answer() -> None:
    m = ScriptedModel()
    m.script("a", [s.text("ok", latency=0.001)])
    assert m.complete(req()).content[0]["text"] == "ok"


def test_plain_steps_never_yield_to_the_hub() -> None:
    """The benchmarks need a call to be a function call, not a context switch."""
    m = ScriptedModel()
    m.script("*", [s.text("x")], repeat=True)
    ran: list[int] = []
    other = gevent.spawn(ran.append, 1)
    for i in range(100):
        m.complete(req(session=str(i)))
    assert ran == []
    other.join()
    assert ran == [1]


# --- scripts, cursors, responders --------------------------------------------------------------


def test_exhausted_script_is_a_clear_model_error() -> None:
    m = ScriptedModel()
    m.script("a", [s.text("one")])
    m.complete(req())
    with pytest.raises(ModelError, match=r"script exhausted for session 'a' after 1 steps"):
        m.complete(req())


def test_default_script_has_a_cursor_per_session() -> None:
    m = ScriptedModel()
    m.script("*", [s.text("1"), s.text("2")])
    m.script("special", [s.text("S")])
    out = [m.complete(req(session=sid)).content[0]["text"] for sid in ("a", "b", "a", "special")]
    assert out == ["1", "1", "2", "S"]
    with pytest.raises(ModelError, match="exhausted"):
        m.complete(req(session="special"))


def test_rescripting_restarts_the_cursor() -> None:
    m = ScriptedModel()
    m.script("*", [s.text("1")])
    m.complete(req())
    m.script("*", [s.text("again")])
    assert m.complete(req()).content[0]["text"] == "again"


def test_repeat_cycles() -> None:
    m = ScriptedModel()
    m.script("a", [s.text("x"), s.text("y")], repeat=True)
    assert [m.complete(req()).content[0]["text"] for _ in range(5)] == ["x", "y", "x", "y", "x"]


def test_responder_computes_the_reply() -> None:
    m = ScriptedModel(responder=s.echo)
    assert m.complete(req(text="ping")).content == ({"type": "text", "text": "ping"},)

    def by_step(r: ModelRequest) -> s.Step | str:
        return s.tool_call("t", {"n": r.step}) if r.step == 1 else f"done at {r.step}"

    m2 = ScriptedModel(responder=by_step)
    assert m2.complete(req(step=1)).tool_calls[0].arguments == {"n": 1}
    assert m2.complete(req(step=2)).content == ({"type": "text", "text": "done at 2"},)


def test_scripts_win_over_the_responder() -> None:
    m = ScriptedModel(responder=lambda r: "from responder")
    m.script("a", [s.text("scripted")])
    assert m.complete(req("a")).content[0]["text"] == "scripted"
    assert m.complete(req("b")).content[0]["text"] == "from responder"


def test_bad_responder_result_is_a_model_error() -> None:
    m = ScriptedModel(responder=lambda r: 42)  # type: ignore[arg-type,return-value]
    with pytest.raises(ModelError, match="responder returned int"):
        m.complete(req())


def test_no_script_and_no_responder() -> None:
    with pytest.raises(ModelError, match="no script for session 'a'"):
        ScriptedModel().complete(req())


def test_records_requests_overall_and_per_session() -> None:
    m = ScriptedModel(responder=s.echo)
    r1, r2, r3 = req("a"), req("b"), req("a", "again")
    for r in (r1, r2, r3):
        m.complete(r)
    assert m.requests == [r1, r2, r3]
    assert m.requests_for("a") == [r1, r3] and m.requests_for("b") == [r2]
    assert m.requests_for("zzz") == []
    quiet = ScriptedModel(responder=s.echo, record=False)
    quiet.complete(r1)
    assert quiet.requests == []


def test_constructors_validate() -> None:
    with pytest.raises(ValueError):
        s.text("x", latency=-1)
    with pytest.raises(TypeError):
        s.text(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        s.tool_call("t", [1])  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        s.tool_calls([])
    with pytest.raises(TypeError):
        ScriptedModel().script("a", ["text"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        ScriptedModel().script("a", [], repeat=True)


# --- registry -----------------------------------------------------------------------------------


def test_registry_resolves_prefix_and_model_name() -> None:
    reg = ModelRegistry()
    m = ScriptedModel()
    reg.register("scripted", m)
    assert reg.resolve("scripted:default") == (m, "default")
    # Only the first colon splits: fine-tuned model names contain colons.
    assert reg.resolve("scripted:ft:gpt-4o:org:1") == (m, "ft:gpt-4o:org:1")
    assert "scripted" in reg and reg.prefixes() == ["scripted"]


def test_registry_unknown_prefix_names_the_known_ones() -> None:
    reg = ModelRegistry()
    reg.register("scripted", ScriptedModel())
    reg.register("openai", ScriptedModel())
    with pytest.raises(ValueError, match=r"unknown model prefix 'nope'.*openai, scripted"):
        reg.resolve("nope:x")


@pytest.mark.parametrize("route", ["", "scripted", "scripted:", ":model", " scripted:x"])
def test_registry_malformed_routes(route: str) -> None:
    with pytest.raises(ValueError, match="malformed model route"):
        parse_route(route)


def test_registry_unregister_is_idempotent_and_only_removes_its_own() -> None:
    reg = ModelRegistry()
    first, second = ScriptedModel(), ScriptedModel()
    undo = reg.register("p", first)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("p", second)
    undo()
    undo()
    undo_second = reg.register("p", second)
    undo()  # the stale undo must not remove the new registration
    assert reg.resolve("p:m")[0] is second
    undo_second()
    with pytest.raises(ValueError, match="known: none"):
        reg.resolve("p:m")


def test_registry_validates_arguments() -> None:
    reg = ModelRegistry()
    with pytest.raises(TypeError):
        reg.register("p", object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        reg.register("a:b", ScriptedModel())
    with pytest.raises(ValueError):
        reg.register("", ScriptedModel())
    with pytest.raises(TypeError):
        reg.resolve(3)  # type: ignore[arg-type]
