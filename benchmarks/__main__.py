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
        if isinstance(value, dict):
            _print_table(value, prefix=f"{prefix}{key}.")
        else:
            print(f"{prefix}{key:<40} {value}")


if __name__ == "__main__":
    sys.exit(main())
