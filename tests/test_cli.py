"""The `subagent` command, always through a real subprocess."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from gevent import subprocess as gsub
from seam_kit import wait_until

from agent.models import scripted as S
from agent.store import SessionStore
from providers.inprocess import ForkProvider, SpawnProvider
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools

REPO = Path(__file__).resolve().parent.parent


def cli(
    *args: str,
    home: Path | None = None,
    timeout: float = 60,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    module: str = "subagent.cli",
) -> subprocess.CompletedProcess[str]:
    """`python -m subagent.cli [--home HOME] ARGS`; stdin is empty unless given."""
    environ = {k: v for k, v in os.environ.items() if k != "SUBAGENT_HOME"}
    environ.update(env or {})
    argv = [sys.executable, "-m", module]
    if home is not None:
        argv += ["--home", str(home)]
    # gevent's subprocess: waiting for the child must not block the hub.
    return gsub.run(
        [*argv, *args],
        cwd=REPO,
        env=environ,
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


# -- a store the test made ------------------------------------------------------------------


class Made:
    root: str
    foreground: str
    continuable: str


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Made]]:
    home = tmp_path_factory.mktemp("home")
    model = S.ScriptedModel(lambda request: S.text("child reporting"))
    rt = Runtime(store=SessionStore(home / "sessions"), scripted=model)
    rt.subagents.register(SpawnProvider())
    rt.subagents.register(ForkProvider())
    install_subagent_tools(
        rt, tools=[SubagentToolConfig("spawn", name="subagent", background="continuable")]
    )
    model.script(
        "root-1",
        [
            S.tool_calls(
                [
                    ("subagent", {"description": "fg", "prompt": "do it"}),
                    (
                        "subagent",
                        {"description": "keeper", "prompt": "keep", "run_in_background": True},
                    ),
                ]
            ),
            S.text("all started"),
            S.text("noted"),
        ],
    )
    root = rt.agent(session_id="root-1")
    root.send("go").get()
    wait_until(lambda: bool(rt.tasks.list()) and all(t.settled for t in rt.tasks.list()))
    wait_until(lambda: root.status == "idle" and len(root.log.events) > 0)
    root.when_idle().get()
    rows = rt.subagents.list_children("root-1")
    out = Made()
    out.root = "root-1"
    out.foreground = next(r["id"] for r in rows if r["mode"] == "one-shot")
    out.continuable = next(r["id"] for r in rows if r["mode"] == "continuable")
    rt.close()
    yield home, out


def test_ls_lists_roots_and_children(made: tuple[Path, Made]) -> None:
    home, m = made
    roots = cli("ls", "--json", home=home)
    assert roots.returncode == 0, roots.stderr
    [row] = json.loads(roots.stdout)
    assert row["id"] == m.root and row["children"] == 2
    kids = cli("ls", m.root, "--json", home=home)
    assert kids.returncode == 0, kids.stderr
    rows = {r["id"]: r for r in json.loads(kids.stdout)}
    assert set(rows) == {m.foreground, m.continuable}
    assert rows[m.continuable]["label"] == "keeper"
    assert {r["activity"] for r in rows.values()} == {"stored"}
    text = cli("ls", m.root, home=home)
    assert text.returncode == 0 and m.continuable in text.stdout and "keeper" in text.stdout


def test_tree_shows_every_descendant(made: tuple[Path, Made]) -> None:
    home, m = made
    proc = cli("tree", m.root, "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    top, *rows = json.loads(proc.stdout)
    # The root's own row first (issue 17: its usage and its whole tree's), then descendants.
    assert top["id"] == m.root and top["mode"] == "root" and top["depth"] == 0
    assert {r["id"] for r in rows} == {m.foreground, m.continuable}
    text = cli("tree", m.root, home=home)
    assert text.stdout.splitlines()[0].startswith(m.root) and m.foreground in text.stdout


# Runs the CLI with the runtime wiring made unimportable: a listing that built a `Runtime` (or
# a `SubagentService`) to read the store would fail with ImportError.
_NO_RUNTIME = """
import sys
sys.modules["subagent.runtime"] = None
sys.modules["subagent.service"] = None
from subagent.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_ls_and_tree_read_the_store_without_building_a_runtime(made: tuple[Path, Made]) -> None:
    home, m = made
    environ = {k: v for k, v in os.environ.items() if k != "SUBAGENT_HOME"}
    answers = {}
    for command in ("ls", "tree"):
        argv = [sys.executable, "-c", _NO_RUNTIME, "--home", str(home), command, m.root, "--json"]
        proc = gsub.run(argv, cwd=REPO, env=environ, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        answers[command] = {r["id"]: r for r in json.loads(proc.stdout)}
    assert answers["tree"].pop(m.root)["mode"] == "root"  # `tree` shows its root row too
    for rows in answers.values():
        assert set(rows) == {m.foreground, m.continuable}
        assert rows[m.continuable]["label"] == "keeper"
        assert rows[m.continuable]["mode"] == "continuable"
        assert rows[m.foreground]["mode"] == "one-shot"
        assert {r["activity"] for r in rows.values()} == {"stored"}
    assert all("subtree_usage" in r for r in answers["tree"].values())


def test_log_shows_turns_steps_tools_and_the_descriptor(made: tuple[Path, Made]) -> None:
    home, m = made
    root_log = cli("log", m.root, home=home)
    assert root_log.returncode == 0, root_log.stderr
    assert "turn 1" in root_log.stdout and "step 1" in root_log.stdout
    assert "tool call subagent" in root_log.stdout and "tool result subagent" in root_log.stdout
    child_log = cli("log", m.continuable, home=home)
    assert '"label": "keeper"' in child_log.stdout and '"provider": "spawn"' in child_log.stdout
    as_json = json.loads(cli("log", m.root, "--json", home=home).stdout)
    assert as_json["header"]["id"] == m.root and as_json["events"][0]["seq"] == 0


def test_send_cold_resumes_a_stored_child(made: tuple[Path, Made]) -> None:
    home, m = made
    proc = cli("send", m.continuable, "hello again", "--json", home=home)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["delivery"] == "started" and result["status"] == "completed"
    assert "received: hello again" in result["output"]
    events = SessionStore(home / "sessions").load(m.continuable).events
    ends = [e["data"]["reason"] for e in events if e["type"] == "turn/end"]
    assert ends == ["completed", "completed"]


def test_send_to_a_one_shot_child_is_one_error_line(made: tuple[Path, Made]) -> None:
    home, m = made
    line = one_error_line(cli("send", m.foreground, "hi", home=home))
    assert "NOT_RESUMABLE" in line


def test_gc_dry_run_then_delete_by_status(tmp_path: Path, made: tuple[Path, Made]) -> None:
    home, _ = made
    copy = tmp_path / "copy"
    (copy / "sessions").mkdir(parents=True)
    for f in (home / "sessions").glob("*.session"):
        (copy / "sessions" / f.name).write_bytes(f.read_bytes())
    shutil.copytree(home / "sessions" / "headers", copy / "sessions" / "headers")
    old = 1.0  # the shared headers are long written (gc spares young ones)
    for f in (copy / "sessions" / "headers").iterdir():
        os.utime(f, (old, old))
    before = sorted(p.name for p in (copy / "sessions").glob("*.session"))
    dry = cli("gc", "--all", "--dry-run", "--json", home=copy)
    assert dry.returncode == 0, dry.stderr
    assert {r["action"] for r in json.loads(dry.stdout)} == {"would delete"}
    assert sorted(p.name for p in (copy / "sessions").glob("*.session")) == before
    gone = cli("gc", "--status", "completed", "--json", home=copy)
    assert gone.returncode == 0, gone.stderr
    rows = json.loads(gone.stdout)
    assert len([r for r in rows if r["status"] == "completed"]) == len(before)
    assert list((copy / "sessions").glob("*.session")) == []
    # No session names the shared headers any more: the same gc collected them.
    assert {r["status"] for r in rows if r["status"] != "completed"} == {"unused header"}
    assert list((copy / "sessions" / "headers").iterdir()) == []
    assert "needs" in one_error_line(cli("gc", home=copy))
    assert cli("gc", home=copy).returncode == 2


# -- the demo and its interrupts ------------------------------------------------------------


def test_demo_with_twenty_children_exits_zero_and_prints_the_summary(tmp_path: Path) -> None:
    proc = cli("demo", "--children", "20", "--seed", "3", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "Summary" in out and "worker-20" in out
    assert "coordinator: 18 of 20 workers reported" in out
    assert f"store: {tmp_path / 'sessions'}" in out and "(from --home)" in out
    assert len(SessionStore(tmp_path / "sessions").list()) >= 21


def test_demo_without_a_home_uses_and_names_a_temporary_store() -> None:
    proc = cli("demo", "--children", "5")
    assert proc.returncode == 0, proc.stderr
    assert "temporary directory" in proc.stdout.splitlines()[1]


def _demo_stores(tmp: Path) -> list[Path]:
    return sorted(tmp.glob("subagent-demo-*"))


def test_demo_deletes_its_temporary_store_unless_kept(tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path)}
    proc = cli("demo", "--children", "3", "--no-live", env=env)
    assert proc.returncode == 0, proc.stderr
    assert _demo_stores(tmp_path) == []
    assert proc.stdout.splitlines()[-2] == "store: deleted (pass --keep to keep it)"
    kept = cli("demo", "--children", "3", "--no-live", "--keep", env=env)
    assert kept.returncode == 0, kept.stderr
    [store] = _demo_stores(tmp_path)
    assert kept.stdout.splitlines()[-2] == f"store: {store / 'sessions'}"
    assert len(SessionStore(store / "sessions").list()) >= 4


def test_demo_header_counts_what_the_tree_shows(tmp_path: Path) -> None:
    proc = cli("demo", "--children", "8", "--no-live", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "subagent demo: 9 agents (8 children, 1 grandchild), seed 0"
    start = next(i for i, line in enumerate(lines) if line.startswith("coordinator "))
    end = lines.index("Summary")
    assert end - start - 1 == 9  # tree lines under the coordinator
    [counts] = [line for line in lines if line.startswith("agents: ")]
    assert sum(int(part.split()[0]) for part in counts[8:].split(", ")) == 9


def test_demo_help_lists_hold_and_keep() -> None:
    proc = cli("demo", "--help")
    assert proc.returncode == 0
    assert "--hold" in proc.stdout and "--keep" in proc.stdout


def test_ctrl_c_cancels_the_tree_and_reports_what_stopped(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "SUBAGENT_HOME"}
    argv = [sys.executable, "-m", "subagent.cli", "--home", str(tmp_path)]
    proc = gsub.Popen(
        [*argv, "demo", "--children", "6", "--hold", "--no-live"],
        cwd=REPO,
        env=env,
        stdout=gsub.PIPE,
        stderr=gsub.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("demo: holding")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130
    assert "interrupted; cancelling the tree" in err
    stopped = [line for line in out.splitlines() if line.startswith("interrupted: stopped")]
    assert stopped and "worker-" in stopped[0]
    assert "Traceback" not in err


# -- bad arguments and errors ------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        (),
        ("demo", "--children", "many"),
        ("frobnicate",),
        ("gc", "--older-than", "soon"),
        ("tree",),
        # Bad values exit 2 like any other bad argument (issue 12, item 5).
        ("demo", "--children", "0"),
        ("demo", "--children", "-3"),
        ("run", "x", "--max-depth", "-1"),
        ("run", "x", "--acp", ""),
        ("run", "x", "--acp", "true", "--prompt-file", "p.txt"),
        ("run", "", "--acp", "true"),
        ("gc",),
        # A malformed session id can name no session: a bad argument, not a failed lookup.
        ("log", "../escape"),
    ],
)
def test_bad_arguments_exit_two_with_one_line(args: tuple[str, ...]) -> None:
    proc = cli(*args)
    assert proc.returncode == 2, proc.stderr
    assert one_error_line(proc).endswith("(see --help)")


@pytest.mark.parametrize(
    "args",
    [
        ("ls", "root-1"),
        ("log", "nope"),
        ("tree", "nope"),
        ("send", "nope", "hi"),
    ],
)
def test_errors_are_one_line_without_traceback(tmp_path: Path, args: tuple[str, ...]) -> None:
    line = one_error_line(cli(*args, home=tmp_path / "nowhere"))
    assert line.startswith("subagent: error: ")


def test_debug_adds_the_traceback(tmp_path: Path) -> None:
    proc = cli("--debug", "log", "nope", home=tmp_path)
    assert proc.returncode == 1 and "Traceback" in proc.stderr


def test_log_of_an_unknown_session(made: tuple[Path, Made]) -> None:
    home, _ = made
    assert "no session" in one_error_line(cli("log", "nope", home=home))


def test_run_delegates_to_an_acp_child_and_prints_its_answer(tmp_path: Path) -> None:
    peer = REPO / "tests" / "acp_peers" / "minimal_agent.py"
    proc = cli("run", "hello there", "--acp", f"{sys.executable} {peer}", home=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "echo: hello there"
    assert any("acp task [acp] completed" in line for line in lines)


def test_run_with_both_model_and_acp_is_a_usage_error(tmp_path: Path) -> None:
    proc = cli("run", "x", "--acp", "true", "--model", "m", home=tmp_path)
    assert "either --acp or --base-url/--model" in one_error_line(proc)
    assert proc.returncode == 2
    assert cli("run", "x", home=tmp_path).returncode == 2  # neither
