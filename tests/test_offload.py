"""`supervision.offload`: results and errors come back from the pool thread, quietly."""

from __future__ import annotations

import pytest

from supervision.offload import offload


def test_the_value_comes_back() -> None:
    assert offload(sum, [1, 2, 3]) == 6


def test_the_error_is_raised_here_and_not_printed(capfd: pytest.CaptureFixture[str]) -> None:
    def fails() -> None:
        raise OSError("disk on fire")

    with pytest.raises(OSError, match="disk on fire"):
        offload(fails)
    # gevent's own apply() would also print the traceback as an unhandled error.
    assert "Traceback" not in capfd.readouterr().err
