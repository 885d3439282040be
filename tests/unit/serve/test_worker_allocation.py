"""The KV allocation setting reaches the servers' node workers (`evinfra serve
--kv-allocation`), and a worker allocating per chunk streams every request's tokens once,
through preemptions of half-prefilled requests."""

from __future__ import annotations

import queue
from typing import Any

from evinfra.cli import build_parser
from evinfra.core.allocation import Allocation
from evinfra.core.blocks import hash_token_blocks
from evinfra.core.types import Request, Role
from evinfra.serve.cli import serve_settings
from evinfra.serve.executors import ExecutorSpec
from evinfra.serve.protocol import Generation, Sampling, Submit, TokensOut
from evinfra.serve.server import build_frontend
from evinfra.serve.timed_executor import TimedExecutor
from evinfra.serve.worker import NodeWorker, WorkerSpec
from tests.unit.serve.test_worker_eviction import BLOCK, NoCost


def test_the_serve_flag_reaches_every_worker_spec() -> None:
    base = ["serve", "--executor", "timed", "--model", "tiny", "--port", "1"]
    cases: list[tuple[list[str], Allocation]] = [
        ([], Allocation.PROMPT),
        (["--kv-allocation", "chunk"], Allocation.CHUNK),
    ]
    for flags, allocation in cases:
        args = build_parser().parse_args([*base, *flags])
        settings = serve_settings(args)
        assert settings.allocation is allocation
        cluster = build_frontend(settings).cluster
        assert cluster.config.allocation is allocation
        assert cluster._worker_spec(1, Role.MIXED).allocation is allocation


def test_a_worker_allocating_per_chunk_streams_every_token_once() -> None:
    num_blocks = 10
    spec = WorkerSpec(
        0, Role.MIXED, ExecutorSpec(), num_blocks, BLOCK, max_num_batched_tokens=8,
        max_num_seqs=8, allocation=Allocation.CHUNK, check_integrity=True,
    )  # fmt: skip
    executor = TimedExecutor(NoCost(), num_blocks, BLOCK, 300)  # type: ignore[arg-type]
    inbox: queue.Queue[Any] = queue.Queue()
    outbox: queue.Queue[Any] = queue.Queue()
    worker = NodeWorker(spec, executor, inbox, outbox, [inbox])
    outputs = {1: 10, 2: 8, 3: 6}
    for rid, num_out in outputs.items():
        prompt = [7 * rid + i for i in range(20)]  # 5 blocks each, nothing shared
        request = Request(rid, tuple(hash_token_blocks(prompt, BLOCK)), len(prompt), num_out)
        gen = Generation(tuple(prompt), frozenset(), Sampling())
        worker.handle(Submit(request, gen, 0, rid))
    schedule = worker.sched.schedule
    preempted_prefills: list[int] = []

    def watched() -> Any:
        plan = schedule()
        if plan is not None:
            preempted_prefills.extend(s.seq_id for s in plan.preempted if s.num_generated == 0)
        return plan

    worker.sched.schedule = watched  # type: ignore[method-assign]
    while worker.step():
        worker._flush()
    worker._flush()
    tokens: dict[int, list[int]] = {rid: [] for rid in outputs}
    finishes: dict[int, int] = {rid: 0 for rid in outputs}
    while not outbox.empty():
        for msg in outbox.get():
            if isinstance(msg, TokensOut):
                tokens[msg.request_id] += msg.token_ids
                finishes[msg.request_id] += msg.finish is not None
    assert {rid: len(t) for rid, t in tokens.items()} == outputs
    assert finishes == {1: 1, 2: 1, 3: 1}
    assert preempted_prefills  # 3 x 5 prompt blocks (plus outputs) on a 10-block pool
    assert worker.sched.is_idle and worker.sched.pool.num_used_blocks == 0
