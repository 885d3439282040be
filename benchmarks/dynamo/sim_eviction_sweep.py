"""The simulator's view of agent-aware eviction at the side-by-side scale: `evolving`,
its `evolving-lru` ablation and aggregated Dynamo on the same engines (the configs the
side-by-side run simulates), over KV pool sizes, session counts and load durations.

    .venv/bin/python benchmarks/dynamo/sim_eviction_sweep.py [--workloads coding,mixed]
        [--num-blocks 512,1024,2048] [--concurrency 12,24] [--duration-s 20,60] [--out DIR]

Prints one line per cell: mean end-to-end latency and KV hit rate of each system.
Bounded: each simulation is killed past 300 s (they take well under a second here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from launch import Deployment, EngineShape  # noqa: E402
from matrix import Limits, WorkloadRun, sim_config, write_sim_config  # noqa: E402
from side_by_side import num_tiny_device_blocks  # noqa: E402

REPO = HERE.parent.parent
SYSTEMS = (
    ("evolving", Deployment("evinfra", system="evolving")),
    ("evolving-lru", Deployment("evinfra", system="evolving-lru")),
    ("dynamo-agg", Deployment("dynamo-agg")),
)


def simulate(cfg: dict[str, object], out: Path) -> dict[str, float]:
    path = out / "config.yaml"
    write_sim_config(path, cfg)
    argv = [str(REPO / ".venv/bin/evinfra"), "sim", "--config", str(path), "--quiet",
            "--out", str(out)]  # fmt: skip
    subprocess.run(argv, check=True, capture_output=True, timeout=300)
    summary: dict[str, float] = json.loads((out / "summary.json").read_text())
    return summary


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="coding,mixed,computer-use")
    p.add_argument("--num-blocks", default="512,1024,2048")
    p.add_argument("--concurrency", default="12,24")
    p.add_argument("--duration-s", default="20,60")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="keep the simulations here")
    args = p.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="evinfra-sweep-"))
    for kind in args.workloads.split(","):
        for num_blocks in map(int, args.num_blocks.split(",")):
            for concurrency in map(int, args.concurrency.split(",")):
                for duration_s in map(float, args.duration_s.split(",")):
                    shape = replace(EngineShape(), num_blocks=num_blocks)
                    run = WorkloadRun(kind, kind=kind, concurrency=concurrency, shape=shape)
                    limits = Limits(duration_s=duration_s, seed=args.seed)
                    cell = f"{kind}-{num_blocks}b-{concurrency}c-{duration_s:.0f}s"
                    row = {}
                    for name, dep in SYSTEMS:
                        cfg = sim_config(dep, run, limits, num_tiny_device_blocks(16))
                        row[name] = simulate(cfg, root / cell / name)
                    e2e = " ".join(f"{n} {row[n]['mean_e2e_s']:.3f}" for n, _ in SYSTEMS)
                    hit = " ".join(f"{row[n]['kv_hit_rate']:.3f}" for n, _ in SYSTEMS)
                    lru = row["evolving-lru"]["mean_e2e_s"] / row["evolving"]["mean_e2e_s"]
                    print(f"{cell}: mean e2e {e2e} (lru/evolving {lru:.3f}); hit {hit}",
                          flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
