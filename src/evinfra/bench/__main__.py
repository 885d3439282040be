"""`python -m evinfra.bench SCENARIO.yaml ...`: the same as `evinfra bench`."""

from __future__ import annotations

import argparse
import sys

from evinfra.bench.cli import add_bench_parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m evinfra.bench")
    sub = parser.add_subparsers(dest="command", required=True)
    add_bench_parser(sub)
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return int(args.handler(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
