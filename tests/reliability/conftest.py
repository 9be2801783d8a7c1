"""Reliability suite switches.

CI runs every test here at a size that fits a 2-core machine; the full run (the figures in
docs/reliability.md) is `SUBAGENT_CHAOS_FULL=1 pytest tests/reliability`, or
`pytest tests/reliability --chaos-full` (the option exists only when this folder is named on the
command line, so the environment variable is the portable switch).
"""

from __future__ import annotations

import pytest
from reliability_kit import FULL_OPTION, full_run


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--chaos-full",
        action="store_true",
        default=False,
        help="run tests/reliability at full size (1,000 children x 10 seeds, ...)",
    )


def pytest_configure(config: pytest.Config) -> None:
    FULL_OPTION[0] = bool(config.getoption("--chaos-full", default=False))


@pytest.fixture
def full() -> bool:
    return full_run()
