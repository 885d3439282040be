"""`evinfra sim` with every call cut to a context limit as `evinfra replay
--max-context-tokens` cuts it (`evinfra.serve.replay.cut_to_context`), so the simulator
predicts the calls the servers were sent. Writes summary.json (the same keys as `evinfra
sim --out`, plus `num_cut_calls` and `max_context_tokens`).

    .venv/bin/python benchmarks/dynamo/sim_cut.py --config CFG --max-context-tokens N --out DIR
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from evinfra.core.types import Request
from evinfra.serve.replay import check_max_context_tokens, cut_to_context
from evinfra.sim.config import load_config
from evinfra.sim.runner import SimResult, run_sim
from evinfra.sim.simulation import Simulation


def cut_like_replay(
    make: Callable[..., Request], max_context_tokens: int, block_size: int, cut: list[Request]
) -> Callable[..., Request]:
    """`make` with each request cut as the client cuts it; the cut ones are appended to
    `cut`. The prompt's head keeps its blocks (the same hashes); the output of a cut call
    is not the generator's, so it has no hashes a later call could hit."""

    def make_cut(rid: int, plan: Any, index: int) -> Request:
        req = make(rid, plan, index)
        num_prompt, num_out = cut_to_context(
            req.num_prompt_tokens, req.max_output_tokens, max_context_tokens
        )
        if (num_prompt, num_out) == (req.num_prompt_tokens, req.max_output_tokens):
            return req
        short = replace(req, prompt_hashes=req.prompt_hashes[: num_prompt // block_size],
                        num_prompt_tokens=num_prompt, max_output_tokens=num_out,
                        output_hashes=())  # fmt: skip
        cut.append(short)
        return short

    return make_cut


def simulate_cut(
    config: str, max_context_tokens: int | None, overrides: dict[str, Any] | None = None
) -> tuple[SimResult, list[Request]]:
    """The simulation of `config` (with `overrides`), each call cut to
    `max_context_tokens` (None: no cut), and the requests it cut."""
    cfg = load_config(config, overrides or {})
    cut: list[Request] = []

    def prepare(sim: Simulation) -> None:
        if max_context_tokens is not None:
            sim.make_request = cut_like_replay(sim.make_request, max_context_tokens,
                                               cfg.block_size, cut)  # fmt: skip

    return run_sim(cfg, prepare=prepare), cut


def run_cut(
    config: str, max_context_tokens: int | None, overrides: dict[str, Any] | None = None
) -> tuple[dict[str, Any], list[Request]]:
    """The simulation's summary (`evinfra sim`'s) and the requests it cut."""
    result, cut = simulate_cut(config, max_context_tokens, overrides)
    summary = dict(result.summary)
    summary["max_context_tokens"] = max_context_tokens
    summary["num_cut_calls"] = len(cut)
    return summary, cut


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--max-context-tokens", type=int, required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    try:
        check_max_context_tokens(args.max_context_tokens)
    except ValueError as err:
        p.error(f"argument --max-context-tokens: {err}")
    summary, cut = run_cut(args.config, args.max_context_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=float))
    print(f"{summary['system']}: mean e2e {summary['mean_e2e_s']:.3f} s, P95 TTFT "
          f"{summary['p95_ttft_s']:.3f} s, {len(cut)} call(s) cut", file=sys.stderr)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
