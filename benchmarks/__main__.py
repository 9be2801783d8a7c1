"""Entry point: `python -m benchmarks NAME [--n N] [--json]`."""

from __future__ import annotations

import argparse
import importlib
import json
import pkgutil
import sys
from typing import Any

import benchmarks


def available() -> list[str]:
    return sorted(
        m.name for m in pkgutil.iter_modules(benchmarks.__path__) if not m.name.startswith("_")
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("name", choices=available())
    parser.add_argument("--n", type=int, default=None, help="problem size (benchmark default)")
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument(
        "--quick", action="store_true", help="a smaller run that only checks the benchmark works"
    )
    args = parser.parse_args(argv)
    if args.n is not None and args.n <= 0:
        parser.error("--n must be positive")
    module: Any = importlib.import_module(f"benchmarks.{args.name}")
    figures: dict[str, Any] = module.run(args.n, args)
    figures.setdefault("benchmark", args.name)
    if args.json:
        print(json.dumps(figures, sort_keys=True))
    else:
        _print_table(figures)
    return 0


def _print_table(figures: dict[str, Any], prefix: str = "") -> None:
    for key, value in figures.items():
        if key == "targets" and isinstance(value, list):
            _print_targets(value)
        elif isinstance(value, dict):
            _print_table(value, prefix=f"{prefix}{key}.")
        else:
            print(f"{prefix}{key:<40} {value}")


def _print_targets(rows: list[dict[str, Any]]) -> None:
    """The issue's table: each figure, ours, the same-run peer, the ratio, the target."""
    print(f"{'figure':<72} {'ours':>10} {'peer':>10} {'ratio':>8} {'floor':>10}  target  met")
    for row in rows:
        cells = [_cell(row.get(k)) for k in ("ours", "peer", "ratio", "floor")]
        met = {True: "yes", False: "NO", None: "-"}[row.get("met")]
        print(
            f"{row['figure']:<72} {cells[0]:>10} {cells[1]:>10} {cells[2]:>8} {cells[3]:>10}  "
            f"{row['target']}  {met}"
        )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
