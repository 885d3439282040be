"""`evinfra workload generate` and `evinfra workload stats`.

`add_workload_parser` registers the commands on the main CLI; each subcommand's handler is
stored as `func` and returns an exit code. `python -m evinfra.workloads.cli` runs them alone.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from evinfra.workloads.factory import KINDS, TRACE_FORMATS, load_trace, make_workload
from evinfra.workloads.session_jsonl import write_session_jsonl
from evinfra.workloads.stats import format_stats, workload_stats


def add_workload_parser(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Register `workload generate` and `workload stats` on `subparsers`."""
    parser = subparsers.add_parser("workload", help="generate agent workloads, inspect traces")
    sub = parser.add_subparsers(dest="workload_command", required=True)

    gen = sub.add_parser("generate", help="write generated sessions as session JSONL")
    gen.add_argument("--kind", required=True, choices=KINDS)
    gen.add_argument("--num-sessions", type=int, required=True)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--out", required=True, type=Path, help="output file (.jsonl)")
    gen.add_argument(
        "--session-rate", type=float, default=1.0, help="new sessions per second (default 1)"
    )
    gen.add_argument("--duration-s", type=float, default=None, help="stop arrivals after this")
    gen.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a generator parameter (repeatable), e.g. profile=tracelab, arrival=bursty, "
        "coding.keep_last_observations=5 (mixed)",
    )
    gen.set_defaults(func=run_generate)

    stats = sub.add_parser("stats", help="statistics of a trace or session file")
    stats.add_argument("file", type=Path)
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument("--format", choices=TRACE_FORMATS, default=None)
    stats.add_argument("--block-size", type=int, default=64, help="tokens per block (reuse)")
    stats.set_defaults(func=run_stats)


def parse_params(items: list[str]) -> dict[str, str]:
    params: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"--param expects NAME=VALUE, got {item!r}")
        params[name.strip()] = value.strip()
    return params


def run_generate(args: argparse.Namespace) -> int:
    try:
        workload = make_workload(
            args.kind,
            seed=args.seed,
            session_rate_per_s=args.session_rate,
            num_sessions=args.num_sessions,
            duration_s=args.duration_s,
            hints=True,
            params=parse_params(args.param),
        )
        with args.out.open("w", encoding="utf-8") as out:
            num_rows = write_session_jsonl(workload.arrivals(), out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {num_rows} calls of {args.kind} sessions to {args.out}")
    return 0


def run_stats(args: argparse.Namespace) -> int:
    try:
        workload = load_trace(args.file, fmt=args.format)
        stats = workload_stats(workload.arrivals(), block_size=args.block_size)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(stats.to_dict(), indent=2))
    else:
        print(format_stats(stats))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="evinfra")
    commands = parser.add_subparsers(dest="command", required=True)
    add_workload_parser(commands)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
