"""Strict templates and scoped system-prompt sections."""

from __future__ import annotations

import contextlib

import gevent
import pytest
from hypothesis import given
from hypothesis import strategies as st

import agent.prompt as prompt_mod
from agent.prompt import (
    PERSONA_SECTION,
    PromptError,
    SystemPrompt,
    check_template,
    render_template,
    template_names,
)

V = {"cwd": "/home/u", "model": "m1", "unset": None}


# --- templates -----------------------------------------------------------------------------


def test_substitutes_names() -> None:
    assert render_template("in {{cwd}} with {{model}}", V) == "in /home/u with m1"
    assert render_template("{{cwd}}{{cwd}}", V) == "/home/u/home/u"


def test_spaces_and_tabs_inside_braces_allowed() -> None:
    assert render_template("{{ cwd }}|{{\tmodel\t}}", V) == "/home/u|m1"


def test_no_braces_fast_path_returns_same_object() -> None:
    text = "plain text with { single } braces and }} closers"
    assert render_template(text, {}) is text


def test_unknown_name_raises_listing_registered() -> None:
    with pytest.raises(PromptError) as ei:
        render_template("hi {{user}}", V)
    msg = str(ei.value)
    assert "'user'" in msg and "cwd, model, unset" in msg


def test_unknown_name_with_no_variables() -> None:
    with pytest.raises(PromptError, match=r"\(none\)"):
        render_template("{{x}}", {})


def test_registered_but_none_raises() -> None:
    with pytest.raises(PromptError, match="registered but has no value"):
        render_template("{{unset}}", V)


def test_non_string_value_raises() -> None:
    with pytest.raises(PromptError, match="must be a string"):
        render_template("{{n}}", {"n": 3})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    "template",
    [
        "{{}}",
        "{{ }}",
        "{{Bad}}",
        "{{1a}}",
        "{{_a}}",
        "{{a b}}",
        "{{a-b}}",
        "{{a.b}}",
        "{{a\n}}",
        "{{\na}}",
        "x {{a ... and more text }}",
        "{{a {{cwd}}",
        "{{{cwd}}}",
    ],
)
def test_malformed_groups_raise(template: str) -> None:
    with pytest.raises(PromptError, match="malformed template group"):
        render_template(template, V)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("open {{ never closed", "open {{ never closed"),
        ("{{", "{{"),
        ("{{cwd}} then {{ dangling", "/home/u then {{ dangling"),
        ("a }} b", "a }} b"),
        ("{cwd}", "{cwd}"),
    ],
)
def test_lone_open_and_close_are_literal(template: str, expected: str) -> None:
    assert render_template(template, V) == expected


def test_values_are_never_rescanned() -> None:
    out = render_template("{{a}} {{b}}", {"a": "{{b}}", "b": "{{ Bad"})
    assert out == "{{b}} {{ Bad"


@given(st.text(alphabet=st.characters(blacklist_characters="{"), max_size=40))
def test_values_verbatim_property(value: str) -> None:
    gevent.sleep(0)  # one example at a time: a property run must not starve the hub
    assert render_template("<{{v}}>", {"v": value}) == f"<{value}>"


@given(st.text(max_size=60))
def test_render_never_raises_anything_but_prompt_error(template: str) -> None:
    gevent.sleep(0)  # one example at a time: a property run must not starve the hub
    with contextlib.suppress(PromptError):
        render_template(template, {"a": "x"})


def test_template_names_and_check_template() -> None:
    assert template_names("{{b}} {{a}} {{b}}") == ["b", "a"]
    assert template_names("none") == []
    check_template("{{cwd}} {{unset}}", V)  # unset values are fine for a static check
    with pytest.raises(PromptError, match="'nope'"):
        check_template("{{nope}}", {"cwd"})
    with pytest.raises(PromptError, match="malformed"):
        check_template("{{Bad}}", {"cwd"})


# --- sections ------------------------------------------------------------------------------


def test_sections_render_by_order_then_insertion() -> None:
    p = SystemPrompt()
    p.set_section("late", "C", order=200)
    p.set_section("b", "B1")
    p.set_section("first", "A", order=0)
    p.set_section("b2", "B2")
    assert p.render({}) == "A\n\nB1\n\nB2\n\nC"
    assert p.section_names() == ["first", "b", "b2", "late"]


def test_replacing_keeps_insertion_position_and_remove() -> None:
    p = SystemPrompt()
    p.set_section("a", "A")
    remove_b = p.set_section("b", "B")
    p.set_section("a", "A2")
    assert p.render({}) == "A2\n\nB"
    remove_b()
    remove_b()  # idempotent
    assert p.render({}) == "A2"


def test_stale_remove_leaves_replacement() -> None:
    p = SystemPrompt()
    remove = p.set_section("a", "old")
    p.set_section("a", "new")
    remove()
    assert p.render({}) == "new"


def test_sections_are_templates_and_errors_name_the_section() -> None:
    p = SystemPrompt()
    p.set_section("env", "cwd={{cwd}}")
    assert p.render(V) == "cwd=/home/u"
    p.set_section("bad", "{{who}}")
    with pytest.raises(PromptError, match=r"section 'bad'.*'who'"):
        p.render(V)


def test_malformed_section_rejected_at_set() -> None:
    p = SystemPrompt()
    with pytest.raises(PromptError, match="section 'x'"):
        p.set_section("x", "{{Bad}}")
    assert p.section_names() == []


def test_empty_sections_skipped() -> None:
    p = SystemPrompt()
    p.set_section("a", "A")
    p.set_section("empty", "")
    p.set_section("c", "C")
    assert p.render({}) == "A\n\nC"


def test_bad_arguments() -> None:
    p = SystemPrompt()
    with pytest.raises(ValueError):
        p.set_section("", "x")
    with pytest.raises(TypeError):
        p.set_section("a", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.set_section("a", "x", order="1")  # type: ignore[arg-type]


def test_child_shadows_persona_for_itself_alone() -> None:
    parent = SystemPrompt()
    parent.set_section(PERSONA_SECTION, "You are {{model}}, the deployment.", order=0)
    parent.set_section("rules", "Be brief.")
    child = SystemPrompt(parent=parent)
    sibling = SystemPrompt(parent=parent)
    child.set_section(PERSONA_SECTION, "You are a reviewer in {{cwd}}.", order=0)
    assert child.render(V) == "You are a reviewer in /home/u.\n\nBe brief."
    assert parent.render(V) == "You are m1, the deployment.\n\nBe brief."
    assert sibling.render(V) == "You are m1, the deployment.\n\nBe brief."
    assert child.section_text(PERSONA_SECTION) == "You are a reviewer in {{cwd}}."
    assert parent.section_text(PERSONA_SECTION) == "You are {{model}}, the deployment."
    assert PERSONA_SECTION == "deployment:persona"


def test_child_sees_parent_changes_and_unshadows_on_remove() -> None:
    parent = SystemPrompt()
    parent.set_section("a", "A")
    child = SystemPrompt(parent=parent)
    remove = child.set_section("a", "child A")
    assert child.render({}) == "child A"
    parent.set_section("z", "Z", order=500)
    assert child.render({}) == "child A\n\nZ"
    remove()
    assert child.render({}) == "A\n\nZ"
    assert child.has_section("z") and not child.has_section("nope")
    assert child.section_text("nope") is None


def test_child_shadow_with_empty_text_hides_parent_section() -> None:
    parent = SystemPrompt()
    parent.set_section("a", "A")
    parent.set_section("b", "B")
    child = SystemPrompt(parent=parent)
    child.set_section("a", "")
    assert child.render({}) == "B"
    assert parent.render({}) == "A\n\nB"


def test_render_is_cached_and_invalidated(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = prompt_mod.render_template

    def counting(template: str, variables: object) -> str:
        calls.append(template)
        return real(template, variables)  # type: ignore[arg-type]

    monkeypatch.setattr(prompt_mod, "render_template", counting)
    parent = SystemPrompt()
    parent.set_section("a", "{{cwd}}")
    child = SystemPrompt(parent=parent)
    first = child.render(V)
    assert child.render(dict(V)) is first
    assert len(calls) == 1
    # A new value, a change in the child, and a change in the parent each re-render.
    assert child.render({**V, "cwd": "/tmp"}) == "/tmp"
    child.set_section("b", "B")
    assert child.render(V) == "/home/u\n\nB"
    parent.set_section("a", "P")
    assert child.render(V) == "P\n\nB"
    assert len(calls) == 1 + 1 + 2 + 2


def test_a_scope_without_sections_shares_its_parents_rendering() -> None:
    base = SystemPrompt()
    base.set_section("base", "Hello {{name}}.")
    children = [SystemPrompt(parent=base) for _ in range(3)]
    texts = [child.render({"name": "x"}) for child in children]
    assert texts == ["Hello x."] * 3
    assert all(t is texts[0] for t in texts)  # one string for the siblings
    remove = children[0].set_section("own", "Mine.")
    assert children[0].render({"name": "x"}) == "Hello x.\n\nMine."
    assert children[1].render({"name": "y"}) == "Hello y."
    remove()
    assert children[0].render({"name": "x"}) == "Hello x."
    base.set_section("base", "Bye.")
    assert [c.render({"name": "x"}) for c in children] == ["Bye."] * 3
