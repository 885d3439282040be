"""Results identity for simulator changes: a fixed list of short fixed-seed runs, each
reduced to two sha256 digests (the summary without its wall-clock keys; every request
record, time sample and session time), so a speed change can be shown to change no result.

    .venv/bin/python benchmarks/sim_digest.py --out /tmp/before.txt       # on the old code
    .venv/bin/python benchmarks/sim_digest.py --compare /tmp/before.txt   # on the new code
    .venv/bin/python benchmarks/sim_digest.py --only evolving-coding-kv0.1

The runs use `sim_speed.py`'s settings (kimi-k2 on GB300, 1/16 sessions/s per GPU, seed 0)
on 64 GPUs for 120-300 simulated seconds, over `evolving`, `dynamo`, `aggregated` and
`oracle`; coding, mixed and computer-use; `kv_capacity_scale` 1, 0.2, 0.1 and 0.03 (at
0.1 also with tiers told by messages, `tier_messages`); and per-chunk allocation with
integrity checks on every step (32 GPUs: the checks are slow). About 2.5 CPU minutes in
all. To compare two trees, run this script from either with `PYTHONPATH=<tree>/src`; the
first line on stderr names the `evinfra` that was imported. Exits 1 when `--compare`
finds any difference. The digests cover every record field and summary key, so a change
that adds one (3f17e2b: the KV moved split by kind) differs from older digests in every
run: make the base digest from a tree on the same side of it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

import evinfra
from evinfra.sim.config import SimConfig
from evinfra.sim.metrics import Metrics
from evinfra.sim.runner import run_sim

WALL_CLOCK_KEYS = frozenset({"wall_s", "events_per_s", "sim_s_per_wall_s"})
RATE_PER_GPU = 1 / 16

CASES: dict[str, dict[str, Any]] = {
    "evolving-coding": {"system": "evolving", "duration_s": 300.0},
    "dynamo-coding": {"system": "dynamo", "duration_s": 300.0},
    "aggregated-coding": {"system": "aggregated", "duration_s": 200.0},
    "oracle-coding": {"system": "oracle", "duration_s": 200.0},
    "evolving-mixed": {"system": "evolving", "workload": "mixed", "duration_s": 240.0},
    "dynamo-mixed": {"system": "dynamo", "workload": "mixed", "duration_s": 240.0},
    "evolving-computer-use": {"system": "evolving", "workload": "computer-use"},
    "evolving-coding-kv0.2": {"system": "evolving", "kv_capacity_scale": 0.2},
    "evolving-coding-kv0.1": {"system": "evolving", "kv_capacity_scale": 0.1, "duration_s": 300.0},
    "evolving-coding-kv0.1-tier-messages": {
        "system": "evolving",
        "system_options": {"tier_messages": True},
        "kv_capacity_scale": 0.1,
    },
    "evolving-mixed-kv0.03": {
        "system": "evolving",
        "workload": "mixed",
        "kv_capacity_scale": 0.03,
        "duration_s": 120.0,
    },
    "evolving-coding-32-chunk-checked": {
        "system": "evolving",
        "num_gpus": 32,
        "kv_allocation": "chunk",
        "check_integrity": True,
        "kv_capacity_scale": 0.2,
        "duration_s": 120.0,
    },
    "dynamo-mixed-32-chunk-checked": {
        "system": "dynamo",
        "workload": "mixed",
        "num_gpus": 32,
        "kv_allocation": "chunk",
        "check_integrity": True,
        "duration_s": 120.0,
    },
}


def make_config(overrides: dict[str, Any]) -> SimConfig:
    data: dict[str, Any] = {
        "workload": "coding",
        "model": "kimi-k2",
        "gpu": "gb300",
        "num_gpus": 64,
        "duration_s": 200.0,
        "drain_s": 30.0,
        "seed": 0,
    }
    data.update(overrides)
    data["session_rate"] = RATE_PER_GPU * data["num_gpus"]
    data["warmup_s"] = min(30.0, data["duration_s"] / 4)
    return SimConfig(**data)


def summary_digest(summary: dict[str, Any]) -> str:
    items = sorted((k, v) for k, v in summary.items() if k not in WALL_CLOCK_KEYS)
    return hashlib.sha256(repr(items).encode()).hexdigest()


def records_digest(metrics: Metrics) -> str:
    """Every field of every record and sample, in the order the run made them; floats by
    `repr`, which round-trips, so any changed bit changes the digest."""
    h = hashlib.sha256()
    for record in metrics.records.values():
        h.update(repr(dataclasses.astuple(record)).encode())
    for sample in metrics.samples:
        h.update(repr(dataclasses.astuple(sample)).encode())
    h.update(repr(list(metrics.session_start_s.items())).encode())
    h.update(repr(list(metrics.session_end_s.items())).encode())
    h.update(repr(metrics.planner_predictions).encode())
    return h.hexdigest()


def digest_line(name: str) -> str:
    result = run_sim(make_config(CASES[name]))
    return f"{name} {summary_digest(result.summary)} {records_digest(result.metrics)}"


def read_lines(path: Path) -> dict[str, str]:
    return {line.split()[0]: line for line in path.read_text().splitlines() if line.strip()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", nargs="+", choices=sorted(CASES), metavar="NAME")
    p.add_argument("--out", type=Path, help="save the lines to FILE")
    p.add_argument("--compare", type=Path, help="diff against a saved FILE; exit 1 on any change")
    args = p.parse_args(argv)
    expected = read_lines(args.compare) if args.compare is not None else None
    print(f"evinfra from {Path(evinfra.__file__).parent}", file=sys.stderr)
    lines = []
    num_different = 0
    for name in args.only or list(CASES):
        start = time.process_time()
        line = digest_line(name)
        lines.append(line)
        verdict = ""
        if expected is not None:
            same = expected.get(name) == line
            num_different += not same
            verdict = " same" if same else " DIFFERENT" if name in expected else " MISSING there"
        print(line + verdict, flush=True)
        print(f"  {name}: {time.process_time() - start:.1f} CPU s", file=sys.stderr)
    if args.out is not None:
        args.out.write_text("".join(line + "\n" for line in lines))
    if expected is not None:
        print(f"{num_different} of {len(lines)} runs differ", file=sys.stderr)
    return 1 if num_different else 0


if __name__ == "__main__":
    sys.exit(main())
