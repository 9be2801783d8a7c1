"""Benchmarks: `python -m benchmarks NAME [--n N] [--json]`.

Each benchmark is a module `benchmarks/NAME.py` with `run(n: int | None, options) -> dict`. The
dict holds the figures, the peers measured in the same process, and the ratios; with `--json`
it is printed as one JSON object on the last line of stdout. Timing lives here, never in tests.
"""
