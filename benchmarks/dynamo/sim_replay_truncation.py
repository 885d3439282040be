"""The simulator on a side-by-side run's evinfra config, once with the generator's calls
as they are (a call longer than a node's KV is rejected, as Dynamo's mocker rejects it)
and once cut as `evinfra replay` cuts them for evinfra's server: that server lists
`max_model_len` = its KV (`num_blocks * block_size`), so the client keeps a longer prompt's
head and caps its output at a quarter of it (`serve/replay.py` `cut_to_context`; the
side-by-side now passes that limit to every server's replay, `--max-context-tokens`).
Prints the P95 TTFT and mean e2e of both, per allocation, and the calls cut.

    .venv/bin/python benchmarks/dynamo/sim_replay_truncation.py RUN/sim/coding/evinfra-evolving.yaml
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from evinfra.core.types import Request
from evinfra.sim.config import load_config
from evinfra.sim.runner import build_node_spec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_cut import run_cut

ALLOCATIONS = ("prompt", "chunk", "chunk-when-prompt-fits")


def run(path: str, allocation: str, truncate: bool) -> tuple[dict[str, Any], list[Request]]:
    overrides = {"kv_allocation": allocation}
    cfg = load_config(path, overrides)
    num_blocks = max(1, int(build_node_spec(cfg).num_device_blocks * cfg.kv_capacity_scale))
    return run_cut(path, num_blocks * cfg.block_size if truncate else None, overrides)


def main(paths: list[str]) -> None:
    for path in paths:
        print(path)
        for allocation in ALLOCATIONS:
            for truncate in (False, True):
                s, cut = run(path, allocation, truncate)
                what = "cut as replayed" if truncate else "as generated  "
                print(f"  {allocation:24s} {what}  mean e2e {s['mean_e2e_s']:6.3f} s  "
                      f"P95 TTFT {s['p95_ttft_s']:6.3f} s  rejected {s['num_rejected']}  "
                      f"preemptions {s['num_preemptions']}  cut "
                      f"{[(r.num_prompt_tokens, r.max_output_tokens) for r in cut]}")  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
