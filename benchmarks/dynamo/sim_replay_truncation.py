"""The simulator on a side-by-side run's evinfra config, once with the generator's calls
as they are (a call longer than a node's KV is rejected, as Dynamo's mocker rejects it)
and once cut as `evinfra replay` cuts them for evinfra's server: that server lists
`max_model_len` = its KV (`num_blocks * block_size`), so the client keeps a longer prompt's
head and caps its output at a quarter of it (`serve/replay.py` `_payload`); Dynamo lists
none, gets the whole prompt and rejects it. Prints the P95 TTFT and mean e2e of both, per
allocation, and the calls cut.

    .venv/bin/python benchmarks/dynamo/sim_replay_truncation.py RUN/sim/coding/evinfra-evolving.yaml
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from evinfra.core.types import Request
from evinfra.sim.config import load_config
from evinfra.sim.metrics import summarize
from evinfra.sim.runner import build_simulation

ALLOCATIONS = ("prompt", "chunk", "chunk-when-prompt-fits")


def cut_like_replay(
    make: Callable[..., Request], max_context_tokens: int, block_size: int, cut: list[Request]
) -> Callable[..., Request]:
    def make_cut(rid: int, plan: Any, index: int) -> Request:
        req = make(rid, plan, index)
        if req.num_prompt_tokens + req.max_output_tokens <= max_context_tokens:
            return req
        num_out = min(req.max_output_tokens, max(1, max_context_tokens // 4))
        num_prompt = max_context_tokens - num_out
        # the head's blocks are the same blocks; what generation fills after it is new
        short = replace(req, prompt_hashes=req.prompt_hashes[: num_prompt // block_size],
                        num_prompt_tokens=num_prompt, max_output_tokens=num_out,
                        output_hashes=())  # fmt: skip
        cut.append(short)
        return short

    return make_cut


def run(path: str, allocation: str, truncate: bool) -> tuple[dict[str, Any], list[Request]]:
    cfg = load_config(path, {"kv_allocation": allocation})
    sim, spec = build_simulation(cfg)
    cut: list[Request] = []
    if truncate:
        num_blocks = max(1, int(spec.num_device_blocks * cfg.kv_capacity_scale))
        sim.make_request = cut_like_replay(
            sim.make_request, num_blocks * cfg.block_size, cfg.block_size, cut
        )
    metrics = sim.run()
    summary = summarize(metrics, warmup_s=cfg.warmup_s, end_s=cfg.duration_s, num_gpus=cfg.num_gpus)
    return dict(summary), cut


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
