"""The `evinfra` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from evinfra.sim.cli import add_sim_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="evinfra", description="Agent-adaptive LLM serving: simulate, serve, benchmark."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    add_sim_parser(sub)
    _add_optional(sub)
    return parser


def _add_optional(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    # commands whose modules may need extras (the server needs torch and fastapi)
    try:
        from evinfra.workloads.cli import add_workload_parser
    except ImportError:
        pass
    else:
        add_workload_parser(sub)
    try:
        from evinfra.serve.cli import add_demo_parser, add_replay_parser, add_serve_parser
    except ImportError:
        pass
    else:
        add_serve_parser(sub)
        add_replay_parser(sub)
        add_demo_parser(sub)
    try:
        from evinfra.bench.cli import add_bench_parser
    except ImportError:
        pass
    else:
        add_bench_parser(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None) or args.func
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
