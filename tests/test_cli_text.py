"""Text from a model, an agent or a file is printed as text by every command: no rich markup
is parsed, no terminal control sequence reaches the terminal (issue 12, item 2)."""

from __future__ import annotations

import io
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console
from seam_kit import wait_until
from test_cli import REPO, cli

from agent.loop import TurnOutcome
from agent.models import scripted as S
from agent.store import SessionStore
from providers.inprocess import SpawnProvider
from subagent.cli.common import make_console
from subagent.cli.text import DataConsole, shown
from subagent.cli_tree import TreeModel
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools

# What the issue saw vanish or crash, then every kind of escape a model could emit.
MARKUP = "list[int] or dict[str, Any]; see [link] and matrix[i][j] arr[/i] :smile:"
ESCAPES = "title\x1b]0;owned\x07 csi\x1b[2J c1\x9b31m bidi\u202eevil del\x7f bell\x07"
LABEL = "[b]x[/i]\x1b[31m"
ANSWER = f"{MARKUP} {ESCAPES}"
CWD_NAME = "/d[/i]\x1b]0;c\x07"  # recorded as given: short, so no table cuts it
RAW = ("\x1b", "\x07", "\x9b", "\u202e", "\x7f")


def assert_clean(out: str) -> None:
    """No control character of the model's reached the output."""
    for raw in RAW:
        assert raw not in out, f"raw {raw!r} in output"


def test_shown_escapes_controls_and_keeps_text() -> None:
    assert shown(MARKUP) == MARKUP
    assert shown("a\nb\tc") == "a\nb\tc"
    assert shown("a\nb", one_line=True) == "a\\x0ab"
    assert shown("\x1b]0;t\x07") == "\\x1b]0;t\\x07"
    assert shown("\x9b\u202e\udcff") == "\\x9b\\u202e\\udcff"


def test_the_console_never_parses_markup_whatever_it_is_asked() -> None:
    out = io.StringIO()
    console = DataConsole(out, plain=True)
    console.print(ANSWER, markup=True, emoji=True)
    assert_clean(out.getvalue())
    assert out.getvalue().rstrip("\n") == shown(ANSWER)


def test_the_live_tree_shows_labels_and_tool_names_as_data() -> None:
    # The live view renders this tree on a terminal console: its Text must be data already.
    tree = TreeModel(_NoAgents(), "root", LABEL)
    tree.on_lifecycle({"type": "subagent/start", "id": "c1", "parent_id": "root", "provider": "p"})
    tree.nodes["c1"].label = "m[i][j] arr[/i]\x1b]0;owned\x07\u202e"
    tree.on_progress({"agent_id": "c1", "kind": "tool/call", "name": "[/i]\x1b]8;;x\x07"})
    tree.note("c1", "[red]n\x1b[0m")
    for console_kind in ("terminal", "plain"):
        out = io.StringIO()
        console = Console(file=out, width=400, force_terminal=console_kind == "terminal")
        console.print(tree.render(times=True))
        console.print(tree.summary())
        text = out.getvalue()
        # A terminal console adds its own style escapes; none of the model's survive.
        for raw in ("\x1b]0;owned", "\x1b[2J", "\x9b", "\u202e", "\x1b]8;;x", "\x07"):
            assert raw not in text
    plain = io.StringIO()
    make_console(plain).print(tree.render())
    make_console(plain).print(tree.summary())
    assert shown(LABEL) in plain.getvalue()
    assert "m[i][j] arr[/i]\\x1b]0;owned\\x07\\u202e" in plain.getvalue()
    assert "[/i]\\x1b]8;;x\\x07" in plain.getvalue() and "[red]n\\x1b[0m" in plain.getvalue()


def test_the_finished_tree_marks_an_end_it_never_saw_unknown() -> None:
    """`finish`: a child whose `subagent/end` never came is `unknown`, not a stale `running`;
    a root whose log failed is `error`; an end that did arrive is kept."""
    tree = TreeModel(_NoAgents(), "root", "coordinator")
    for child in ("c1", "c2"):
        tree.on_lifecycle(
            {"type": "subagent/start", "id": child, "parent_id": "root", "provider": "p"}
        )
    tree.on_progress({"agent_id": "root", "kind": "turn/start", "turn": 1})
    tree.on_lifecycle({"type": "subagent/end", "id": "c1", "stop_reason": "aborted"})
    tree.finish(TurnOutcome(turn=1, reason="error", fault=OSError(27, "File too large")))
    assert [(n.status, n.notes) for n in tree.descendants()] == [
        ("aborted", []),
        ("unknown", ["end not seen"]),
    ]
    assert tree.nodes["root"].status == "error"
    assert tree.counts() == {"aborted": 1, "unknown": 1}
    done = TreeModel(_NoAgents(), "root", "coordinator")
    done.on_progress({"agent_id": "root", "kind": "turn/start", "turn": 1})
    done.finish(TurnOutcome(turn=1, reason="completed"))
    assert done.nodes["root"].status == "idle"


class _NoAgents:
    agents: dict[str, object] = {}


# -- every command, through a real subprocess ---------------------------------------------


@pytest.fixture(scope="module")
def tricky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """A store whose child has a model-chosen label and answer full of markup and escapes."""
    home = tmp_path_factory.mktemp("home")
    model = S.ScriptedModel(lambda request: S.text(ANSWER))
    rt = Runtime(store=SessionStore(home / "sessions"), scripted=model)
    rt.subagents.register(SpawnProvider())
    install_subagent_tools(
        rt, tools=[SubagentToolConfig("spawn", name="subagent", background="continuable")]
    )
    model.script(
        "root-t",
        [
            S.tool_call(
                "subagent", {"description": LABEL, "prompt": "go", "run_in_background": True}
            ),
            S.text("started"),
            S.text("noted"),
        ],
    )
    # The header's cwd is text from a file too (a directory may be named anything).
    root = rt.agent(session_id="root-t", cwd=CWD_NAME)
    root.send("go").get()
    wait_until(lambda: bool(rt.tasks.list()) and all(t.settled for t in rt.tasks.list()))
    wait_until(lambda: root.status == "idle")
    root.when_idle().get()
    [row] = rt.subagents.list_children("root-t")
    rt.close()
    yield home, "root-t", row["id"]


def test_ls_prints_the_cwd_as_text(tricky: tuple[Path, str, str]) -> None:
    home, _, _ = tricky
    proc = cli("ls", home=home)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc.stdout)
    assert shown(CWD_NAME) in proc.stdout


def test_ls_parent_prints_the_label_as_text(tricky: tuple[Path, str, str]) -> None:
    home, root, _ = tricky
    proc = cli("ls", root, home=home)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc.stdout)
    assert shown(LABEL) in proc.stdout


def test_tree_root_prints_the_label_as_text(tricky: tuple[Path, str, str]) -> None:
    home, root, _ = tricky
    proc = cli("tree", root, home=home)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc.stdout)
    assert shown(LABEL) in proc.stdout


def test_log_child_prints_the_answer_and_descriptor_as_text(tricky: tuple[Path, str, str]) -> None:
    home, _, child = tricky
    proc = cli("log", child, home=home)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc.stdout)
    assert f"assistant (stop): {shown(ANSWER)}" in proc.stdout
    root_log = cli("log", "root-t", home=home)
    assert root_log.returncode == 0, root_log.stderr
    assert_clean(root_log.stdout)
    assert shown(CWD_NAME) in root_log.stdout


def test_send_prints_the_reply_as_text(tricky: tuple[Path, str, str]) -> None:
    home, _, child = tricky
    proc = cli("send", child, f"again {ANSWER}", home=home)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc.stdout)
    assert f"received: again {shown(ANSWER)}" in proc.stdout


def test_run_prints_the_answer_as_text(tmp_path: Path) -> None:
    # The ACP peer echoes the prompt: the answer is whatever the test wants a model to say.
    peer = REPO / "tests" / "acp_peers" / "minimal_agent.py"
    proc = cli("run", ANSWER, "--acp", f"{sys.executable} {peer}", "--no-live", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_clean(proc.stdout)
    assert proc.stdout.splitlines()[-1] == f"echo: {shown(ANSWER)}"


def test_run_prints_a_multi_line_answer_whole(tmp_path: Path) -> None:
    peer = REPO / "tests" / "acp_peers" / "minimal_agent.py"
    prompt = "first [b]line[/b]\n  second line\n" + "x" * 120_000
    proc = cli("run", prompt, "--acp", f"{sys.executable} {peer}", "--no-live", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith(f"echo: {prompt}\n")


def test_error_lines_escape_what_they_quote(tmp_path: Path) -> None:
    # A malformed session id is a bad argument (exit 2: it can name no session, so it is not a
    # failed lookup); the usage line quotes it escaped all the same.
    proc = cli("log", "bad\x1b]0;x\x07id", home=tmp_path)
    assert proc.returncode == 2
    assert_clean(proc.stderr)
    assert proc.stderr.startswith("subagent log: error: argument SESSION: invalid session id")
