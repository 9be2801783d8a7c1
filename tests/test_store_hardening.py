"""The store against hostile and unusual files (issue 12 items 13-18, 20).

Read-only mounts, damaged headers, frames that decode to values JSON cannot hold, symlinks,
FIFOs and directories wearing a session's name, leftovers of interrupted creates, the store
directory's mode, children whose parent was collected and children live in another process.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from gevent import subprocess as gsub
from test_cli import REPO, Made, cli, made, one_error_line

from agent.events import SessionHeader, SessionLogError
from agent.frames import CorruptSessionError, _frame
from agent.store import TMP_GRACE, MemoryStore, SessionStore, _try_lock

__all__ = ["made"]  # the module-scoped store of test_cli, shared


def copy_home(made: tuple[Path, Made], dest: Path) -> tuple[Path, Made]:
    home, m = made
    (dest / "sessions").mkdir(parents=True)
    for f in (home / "sessions").iterdir():
        if f.is_dir():  # the store's shared request headers
            shutil.copytree(f, dest / "sessions" / f.name)
        else:
            shutil.copy2(f, dest / "sessions" / f.name)
    return dest, m


def sessions(home: Path) -> Path:
    return home / "sessions"


# -- 15: only JSON-native values ------------------------------------------------------------


BAD_VALUES: dict[str, Any] = {
    "bytes": b"\x00raw",
    "empty-bytes": b"",
    "ext": msgpack.ExtType(5, b"x"),
    "nan": float("nan"),
    "inf": float("inf"),
    "bytes-key": {b"k": 1},
}


def _append_raw(path: Path, value: Any, *, in_time: bool = False) -> int:
    """Append one CRC-valid frame whose event carries `value`; returns its byte offset."""
    store = SessionStore(path.parent)
    seq = len(store.inspect(path.name[: -len(".session")]).events)
    event = {
        "type": "x/note",
        "seq": seq,
        "time": value if in_time else 1.0,
        "data": {"ignorable": True, "value": value},
    }
    offset = path.stat().st_size
    with open(path, "ab") as f:
        f.write(_frame(msgpack.packb(event, use_bin_type=True)))
    return offset


@pytest.mark.parametrize("kind", sorted(BAD_VALUES))
def test_a_crc_valid_frame_with_a_value_json_cannot_hold_is_corruption(
    tmp_path: Path, made: tuple[Path, Made], kind: str
) -> None:
    home, m = copy_home(made, tmp_path)
    store = SessionStore(sessions(home))
    offset = _append_raw(sessions(home) / f"{m.root}.session", BAD_VALUES[kind])
    with pytest.raises(CorruptSessionError) as info:
        store.inspect(m.root)
    assert info.value.offset == offset
    with pytest.raises(CorruptSessionError):
        list(store.scan(m.root))
    proc = cli("log", m.root, "--json", home=home)
    assert f"corrupt session at byte {offset}" in one_error_line(proc)
    assert proc.stdout == ""


def test_a_nan_time_is_corruption_too(tmp_path: Path, made: tuple[Path, Made]) -> None:
    home, m = copy_home(made, tmp_path)
    offset = _append_raw(sessions(home) / f"{m.root}.session", float("nan"), in_time=True)
    with pytest.raises(CorruptSessionError) as info:
        SessionStore(sessions(home)).inspect(m.root)
    assert info.value.offset == offset


def test_non_ascii_text_still_loads() -> None:
    store = MemoryStore()
    log = store.create(SessionHeader(id="s1", created_at=1.0, cwd="/ÄÉ"))
    log.append("x/note", {"ignorable": True, "text": "Ąę Ωω Жж ÇÈ 1.5", "n": 1.5})
    log.close()
    assert store.inspect("s1").events[0]["data"]["text"] == "Ąę Ωω Жж ÇÈ 1.5"


# -- 16: links, FIFOs, directories, bounded reads -------------------------------------------


def test_a_symlinked_session_is_never_followed(tmp_path: Path, made: tuple[Path, Made]) -> None:
    home, m = copy_home(made, tmp_path / "home")
    outside = tmp_path / "outside.session"
    shutil.copy2(sessions(home) / f"{m.root}.session", outside)
    (sessions(home) / f"{m.root}.session").unlink()
    os.symlink(outside, sessions(home) / f"{m.root}.session")
    store = SessionStore(sessions(home))
    assert store.exists(m.root)  # the id is taken, by something that is not a session
    assert m.root not in {h.id for h in store.list()}
    with pytest.raises(CorruptSessionError, match="symbolic link"):
        store.inspect(m.root)
    assert "symbolic link" in one_error_line(cli("log", m.root, home=home))
    gc = cli("gc", "--all", "--json", home=home)
    assert gc.returncode == 0, gc.stderr
    rows = {r["id"]: r for r in json.loads(gc.stdout)}
    assert rows[m.root]["status"] == "corrupt"
    assert rows[m.root]["action"].startswith("skipped (not a regular file")
    assert outside.read_bytes()  # the link's target is untouched


def test_a_symlink_to_dev_zero_is_reported_not_read(tmp_path: Path) -> None:
    (tmp_path / "sessions").mkdir()
    os.symlink("/dev/zero", tmp_path / "sessions" / "zero.session")
    proc = cli("gc", "--all", "--dry-run", "--json", home=tmp_path, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [
        {"id": "zero", "status": "corrupt", "age_seconds": None, "action": "would delete"}
    ]


def test_a_device_named_like_a_session_is_reported_not_read(tmp_path: Path) -> None:
    store = SessionStore(tmp_path / "sessions")
    store.ensure_root()
    try:
        os.mknod(store.root / "zero.session", stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except OSError as exc:
        pytest.skip(f"cannot make a device node here: {exc}")
    with pytest.raises(CorruptSessionError, match="not a regular file"):
        store.inspect("zero")
    with pytest.raises(CorruptSessionError, match="not a regular file"):
        store.load("zero")
    _, [bad] = store.census()
    assert (bad.id, bad.offset) == ("zero", 0)


def test_a_fifo_or_a_directory_named_like_a_session_never_stalls_or_aborts_gc(
    tmp_path: Path, made: tuple[Path, Made]
) -> None:
    home, _m = copy_home(made, tmp_path)
    os.mkfifo(sessions(home) / "pipe.session")
    (sessions(home) / "dir.session").mkdir()
    listing = cli("ls", "--json", home=home, timeout=30)
    assert listing.returncode == 0, listing.stderr
    statuses = {r["id"]: r["status"] for r in json.loads(listing.stdout)}
    assert statuses["pipe"].startswith("corrupt at byte 0: not a regular file")
    assert statuses["dir"] == "corrupt at byte 0: not a regular file (a directory)"
    proc = cli("gc", "--status", "corrupt", "--json", home=home, timeout=30)
    assert proc.returncode == 0, proc.stderr
    rows = {r["id"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == {"pipe", "dir"}
    assert all(r["action"].startswith("skipped (not a regular file") for r in rows.values())
    assert (sessions(home) / "dir.session").is_dir()
    assert stat.S_ISFIFO(os.lstat(sessions(home) / "pipe.session").st_mode)


# -- 13: a read-only store --------------------------------------------------------------------


@pytest.fixture
def read_only_home(tmp_path: Path, made: tuple[Path, Made]) -> Iterator[tuple[Path, Made]]:
    """The test store on a real read-only mount (a tmpfs remounted `ro`)."""
    mount_point = tmp_path / "ro"
    mount_point.mkdir()
    try:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount_point)],
            check=True,
            capture_output=True,
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here: {exc}")
    try:
        home, m = copy_home(made, mount_point)
        with open(sessions(home) / f"{m.foreground}.session", "ab") as f:
            f.write(b"\x00\x00\x01\x00torn")  # a torn tail: loading it means a repair
        subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
        with pytest.raises(OSError):  # the mount really is read-only
            (sessions(home) / "probe").write_bytes(b"x")
        yield home, m
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def test_reading_a_read_only_store_needs_read_access_only(
    read_only_home: tuple[Path, Made],
) -> None:
    home, m = read_only_home
    log = cli("log", m.continuable, home=home)
    assert log.returncode == 0, log.stderr
    assert '"label": "keeper"' in log.stdout
    as_json = cli("log", m.root, "--json", home=home)
    assert as_json.returncode == 0 and json.loads(as_json.stdout)["header"]["id"] == m.root
    roots = cli("ls", "--json", home=home)
    assert roots.returncode == 0, roots.stderr
    assert [r["id"] for r in json.loads(roots.stdout)] == [m.root]
    kids = cli("ls", m.root, "--json", home=home)
    assert {r["id"] for r in json.loads(kids.stdout)} == {m.foreground, m.continuable}
    tree = cli("tree", m.root, "--json", home=home)
    top, *rows = json.loads(tree.stdout)
    assert top["id"] == m.root and {r["id"] for r in rows} == {m.foreground, m.continuable}
    dry = cli("gc", "--all", "--dry-run", "--json", home=home)
    assert dry.returncode == 0, dry.stderr
    statuses = {r["id"]: r["status"] for r in json.loads(dry.stdout)}
    assert statuses == {m.root: "completed", m.continuable: "completed", m.foreground: "open"}
    torn = cli("log", m.foreground, home=home)
    assert torn.returncode == 0 and "a resume would repair it" in torn.stdout
    store = SessionStore(sessions(home))
    assert store.load(m.root).header.id == m.root  # nothing to repair: loads as is
    with pytest.raises(SessionLogError, match="needs a repair, but its store is not writable"):
        store.load(m.foreground)


# -- 14: damaged headers are listed -----------------------------------------------------------


def test_a_session_with_a_damaged_header_is_listed_as_corrupt(
    tmp_path: Path, made: tuple[Path, Made]
) -> None:
    home, m = copy_home(made, tmp_path)
    path = sessions(home) / f"{m.continuable}.session"
    data = bytearray(path.read_bytes())
    data[12] ^= 0xFF  # inside the header frame's payload: its CRC no longer matches
    path.write_bytes(bytes(data))
    roots = cli("ls", "--json", home=home)
    assert roots.returncode == 0, roots.stderr
    rows = {r["id"]: r for r in json.loads(roots.stdout)}
    assert rows[m.continuable]["status"] == "corrupt at byte 0: torn header frame"
    text = cli("ls", home=home)
    assert m.continuable in text.stdout and "corrupt at byte 0" in text.stdout
    for args in (("ls", m.root), ("tree", m.root), ("tree", m.root, "--json")):
        proc = cli(*args, home=home)
        assert proc.returncode == 0, proc.stderr
        assert f"session {m.continuable} cannot be placed" in proc.stderr
        assert "corrupt at byte 0: torn header frame" in proc.stderr


# -- 17: leftovers of interrupted creates -------------------------------------------------------


def test_gc_removes_stale_temporaries_and_never_one_in_use(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    store = SessionStore(root)
    store.create(SessionHeader(id="s1", created_at=1.0, cwd="/")).close()
    old = 1.0  # epoch seconds: far older than the grace period
    linked = root / ".s1.aaaa0001.tmp"  # a finished create's second name
    os.link(root / "s1.session", linked)
    stale = root / ".s2.aaaa0002.tmp"  # a create killed before its link
    stale.write_bytes(b"partial")
    os.utime(stale, (old, old))
    fresh = root / ".s3.aaaa0003.tmp"  # maybe a create in progress: too young to judge
    fresh.write_bytes(b"partial")
    held = root / ".s4.aaaa0004.tmp"  # old, but a live create holds it
    held.write_bytes(b"partial")
    os.utime(held, (old, old))
    fd = os.open(held, os.O_RDWR)
    try:
        assert _try_lock(fd)
        dry = cli("gc", "--status", "corrupt", "--dry-run", "--json", home=tmp_path)
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout) == [
            {
                "id": linked.name,
                "status": "temporary",
                "age_seconds": None,
                "action": "would remove",
            },
            {
                "id": stale.name,
                "status": "temporary",
                "age_seconds": None,
                "action": "would remove",
            },
        ]
        assert linked.exists() and stale.exists()
        done = cli("gc", "--status", "corrupt", home=tmp_path)
        assert done.returncode == 0, done.stderr
        assert "removed 2 temporary file(s)" in done.stdout
    finally:
        os.close(fd)
    assert sorted(p.name for p in root.iterdir()) == sorted([fresh.name, held.name, "s1.session"])
    assert store.inspect("s1").header.id == "s1"
    assert TMP_GRACE <= 300  # a leftover is collected within minutes, not never


# -- 18: the directory's mode -------------------------------------------------------------------


@pytest.mark.parametrize("umask", [0o000, 0o022, 0o277])
def test_the_sessions_directory_is_created_0700_whatever_the_umask(
    tmp_path: Path, umask: int
) -> None:
    previous = os.umask(umask)
    try:
        store = SessionStore(tmp_path / "lib" / "sessions")
        store.create(SessionHeader(id="s1", created_at=1.0, cwd="/")).close()
    finally:
        os.umask(previous)
    assert stat.S_IMODE(os.stat(store.root).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(store.root / "s1.session").st_mode) == 0o600
    home = tmp_path / "cli"
    argv = [sys.executable, "-m", "subagent.cli", "--home", str(home)]
    proc = gsub.run(
        [*argv, "demo", "--children", "1", "--no-live"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.umask(umask),
    )
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(home / "sessions").st_mode) == 0o700


# -- 20: orphaned children, children live elsewhere ---------------------------------------------


def test_send_to_a_child_whose_parent_was_collected_says_orphaned(
    tmp_path: Path, made: tuple[Path, Made]
) -> None:
    home, m = copy_home(made, tmp_path)
    SessionStore(sessions(home)).delete(m.root)
    line = one_error_line(cli("send", m.continuable, "hello", home=home))
    assert "ORPHANED_CHILD" in line and m.root in line
    roots = cli("ls", "--json", home=home)
    statuses = {r["id"]: r["status"] for r in json.loads(roots.stdout)}
    orphaned = f"orphaned (parent {m.root} is gone)"
    assert statuses == {m.foreground: orphaned, m.continuable: orphaned}


HOLDER = r"""
import sys, gevent
from agent.models import scripted as S
from agent.store import SessionStore
from providers.inprocess import SpawnProvider
from subagent.runtime import Runtime
from subagent.tools import SubagentToolConfig, install_subagent_tools

def respond(request):
    if request.session_id == "holder":
        if request.step == 1:
            args = {"description": "slow", "prompt": "wait", "run_in_background": True}
            return S.tool_call("subagent", args)
        return S.text("started")
    print(request.session_id, flush=True)  # the child is running: its model is called
    gevent.get_hub().threadpool.spawn(sys.stdin.read).get()  # until the test closes stdin
    return S.text("child done")

rt = Runtime(store=SessionStore(sys.argv[1]), scripted=S.ScriptedModel(respond))
rt.subagents.register(SpawnProvider())
install_subagent_tools(
    rt, tools=[SubagentToolConfig("spawn", name="subagent", background="continuable")]
)
root = rt.agent(session_id="holder")
root.send("go").get()
root.when_idle().get()
for task in rt.tasks.list():
    rt.tasks.wait(task.id)
rt.close()
"""


def test_ls_in_another_process_shows_a_live_child_as_running_elsewhere(tmp_path: Path) -> None:
    holder = gsub.Popen(
        [sys.executable, "-c", HOLDER, str(sessions(tmp_path))],
        cwd=REPO,
        stdin=gsub.PIPE,
        stdout=gsub.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdin is not None
        child = holder.stdout.readline().strip()
        assert child, "the holder process did not start its child"
        live = cli("ls", "holder", "--json", home=tmp_path)
        assert live.returncode == 0, live.stderr
        [row] = json.loads(live.stdout)
        assert (row["id"], row["activity"]) == (child, "running elsewhere")
        roots = json.loads(cli("ls", "--json", home=tmp_path).stdout)
        assert [(r["id"], r["status"]) for r in roots] == [("holder", "running elsewhere")]
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    [row] = json.loads(cli("ls", "holder", "--json", home=tmp_path).stdout)
    assert row["activity"] == "stored"
