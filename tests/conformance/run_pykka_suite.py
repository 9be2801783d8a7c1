"""Run Pykka's own test suite with a `gevent` runtime added to its RUNTIMES.

Usage: `python tests/conformance/run_pykka_suite.py [pytest args]`.

The suite comes from the pykka sdist, fetched with pip at run time and never committed. It is
unpacked into the git-ignored `tests/conformance/_pykka_tests/` (reused if already there), a
`gevent` entry is added to the RUNTIMES of its conftest, and pytest runs there with its own
rootdir, so our `tests/conftest.py` (hub monitor, leak check) does not apply to it.

Exit status: pytest's (non-zero on any failure). Extra arguments go to pytest, e.g.
`-k gevent` to run the gevent runtime only. Needs `pytest-mock` (Pykka's suite uses `mocker`).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PYKKA_VERSION = "4.5.0"
HERE = Path(__file__).resolve().parent
WORKDIR = HERE / "_pykka_tests"

# Tests that cannot apply to a cooperative runtime, as pytest node-id substrings, with why.
# Deselected for the gevent runtime only. Keep this empty unless there is a real reason.
NOT_APPLICABLE: dict[str, str] = {}

FIXTURE_ANCHOR = '@pytest.fixture(scope="session", params=RUNTIMES.values())'

GEVENT_RUNTIME = """
# --- added by subagent-runtime tests/conformance/run_pykka_suite.py ---
import gevent  # noqa: E402
import gevent.event  # noqa: E402

from actors.gevent_actor import GeventActor, GeventFuture  # noqa: E402

RUNTIMES["gevent"] = pytest.param(
    Runtime(
        name="gevent",
        actor_class=GeventActor,
        event_class=gevent.event.Event,
        future_class=GeventFuture,
        sleep_func=gevent.sleep,
    ),
    id="gevent",
)
# --- end of addition ---


"""

PYTEST_INI = """[pytest]
addopts = -p no:cacheprovider -ra
"""


def fetch_sdist(into: Path) -> Path:
    """Download the pykka sdist with pip (source only, no dependencies)."""
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-binary",
        ":all:",
        "--no-deps",
        "--quiet",
        "--dest",
        str(into),
        f"pykka=={PYKKA_VERSION}",
    ]
    subprocess.run(cmd, check=True)
    found = sorted(into.glob(f"pykka-{PYKKA_VERSION}.tar.gz"))
    if not found:
        msg = f"pip did not produce pykka-{PYKKA_VERSION}.tar.gz in {into}"
        raise SystemExit(msg)
    return found[0]


def unpack_tests(sdist: Path, dest: Path) -> None:
    """Extract only `pykka-X/tests/` of the sdist into `dest/tests/`."""
    prefix = f"pykka-{PYKKA_VERSION}/tests/"
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and m.isfile()]
        if not members:
            msg = f"{sdist} has no {prefix}"
            raise SystemExit(msg)
        for member in members:
            member.name = "tests/" + member.name[len(prefix) :]
            tar.extract(member, dest, filter="data")


def add_gevent_runtime(conftest: Path) -> None:
    text = conftest.read_text()
    if 'RUNTIMES["gevent"]' in text:
        return
    if FIXTURE_ANCHOR not in text:
        msg = f"cannot find where to add the gevent runtime in {conftest}; did Pykka change?"
        raise SystemExit(msg)
    conftest.write_text(text.replace(FIXTURE_ANCHOR, GEVENT_RUNTIME + FIXTURE_ANCHOR, 1))


def prepare(workdir: Path) -> None:
    marker = workdir / f".pykka-{PYKKA_VERSION}"
    if marker.exists():
        return
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        unpack_tests(fetch_sdist(Path(tmp)), workdir)
    add_gevent_runtime(workdir / "tests" / "conftest.py")
    (workdir / "pytest.ini").write_text(PYTEST_INI)
    marker.write_text("ready\n")


def main(argv: list[str]) -> int:
    prepare(WORKDIR)
    args = [sys.executable, "-m", "pytest", "-c", str(WORKDIR / "pytest.ini")]
    args += ["--rootdir", str(WORKDIR), "--confcutdir", str(WORKDIR)]
    for node, reason in NOT_APPLICABLE.items():
        print(f"not applicable to gevent: {node}: {reason}")
        args += ["--deselect", node]
    args += ["tests", *argv]
    return subprocess.run(args, cwd=WORKDIR, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
