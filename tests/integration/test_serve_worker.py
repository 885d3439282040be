"""Node workers and the timed executor in one process (no spawn, no HTTP): the handoff
protocol between a prefill and a decode worker, preemption, aborts, and the executor's
clock and KV bytes."""

from __future__ import annotations

import queue
from typing import Any

import pytest

from evinfra.core.blocks import hash_token_blocks
from evinfra.core.types import Request, Role
from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.serve.executors import ExecutorSpec, WorkItem
from evinfra.serve.protocol import (
    Abort,
    FinishReason,
    Generation,
    KVPayload,
    PrefixPull,
    RequestFailed,
    Sampling,
    Submit,
    TokensOut,
)
from evinfra.serve.text import TextStream
from evinfra.serve.timed_executor import TimedExecutor
from evinfra.serve.worker import NodeWorker, WorkerSpec

BLOCK = 4


class FixedCost:
    """A cost model whose every step takes `step_s`."""

    def __init__(self, step_s: float) -> None:
        self.step_s = step_s
        self.shapes: list[BatchShape] = []
        self.kv_capacity_tokens = 1 << 20
        self.kv_bytes_per_token = 8

    def step_time_s(self, batch: BatchShape) -> float:
        self.shapes.append(batch)
        return self.step_s

    def decode_run_time_s(self, *args: Any) -> float:
        raise NotImplementedError


def timed(num_blocks: int = 64, step_s: float = 0.0) -> TimedExecutor:
    return TimedExecutor(FixedCost(step_s), num_blocks, BLOCK, 300, avoid_token_ids={0, 2})


class Cluster:
    """Workers wired through in-process queues; `run` steps them until quiet."""

    def __init__(self, num_nodes: int, num_blocks: int = 64) -> None:
        self.inboxes: list[queue.Queue[Any]] = [queue.Queue() for _ in range(num_nodes)]
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.workers = [
            NodeWorker(
                WorkerSpec(i, Role.MIXED, ExecutorSpec(), num_blocks, BLOCK, check_integrity=True),
                timed(num_blocks),
                self.inboxes[i],
                self.outbox,
                self.inboxes,
            )
            for i in range(num_nodes)
        ]
        self.events: list[Any] = []
        self._seq = 0

    def submit(
        self,
        rid: int,
        prompt: list[int],
        max_tokens: int,
        prefill: int,
        decode: int,
        pull_from: int | None = None,
    ) -> None:
        self._seq += 1
        req = Request(rid, tuple(hash_token_blocks(prompt, BLOCK)), len(prompt), max_tokens)
        gen = Generation(tuple(prompt), frozenset(), Sampling())
        self.inboxes[prefill].put(Submit(req, gen, decode, self._seq, pull_from))

    def run(self, max_rounds: int = 10_000) -> None:
        for _ in range(max_rounds):
            progressed = False
            for w in self.workers:
                while not w.inbox.empty():
                    w.handle(w.inbox.get_nowait())
                    progressed = True
                w._expire_pulls()
                progressed |= w.step()
                w._flush()
            while not self.outbox.empty():
                self.events.extend(self.outbox.get_nowait())
            if not progressed:
                return
        raise AssertionError("workers did not settle")

    def tokens(self, rid: int) -> tuple[list[int], FinishReason | None]:
        out: list[int] = []
        finish = None
        for e in self.events:
            if isinstance(e, TokensOut) and e.request_id == rid:
                out.extend(e.token_ids)
                finish = e.finish or finish
        return out, finish


PROMPTS = [[3 + (i * 37 + j * 11) % 200 for j in range(n)] for i, n in enumerate((3, 4, 9, 17))]


def test_disaggregated_equals_aggregated_and_frees_everything() -> None:
    agg, dis = Cluster(1), Cluster(2)
    for rid, p in enumerate(PROMPTS):
        agg.submit(rid, p, 10, 0, 0)
        dis.submit(rid, p, 10, 0, 1)
    agg.run()
    dis.run()
    for rid in range(len(PROMPTS)):
        got, finish = dis.tokens(rid)
        assert got == agg.tokens(rid)[0] and len(got) == 10 and finish is FinishReason.LENGTH
    moved = sum(e.num_transfer_bytes for e in dis.events if isinstance(e, TokensOut))
    assert moved > 0
    assert all(e.num_pulled_bytes == 0 for e in dis.events if isinstance(e, TokensOut))
    for w in dis.workers + agg.workers:
        w.sched.check_integrity()
        assert w.sched.is_idle and w.sched.pool.num_used_blocks == 0 and not w.jobs


def test_decode_node_reuses_its_cached_prefix_and_pulls_only_the_rest() -> None:
    c = Cluster(2)
    base = PROMPTS[3]
    c.submit(0, base, 6, 0, 1)
    c.run()
    first = sum(e.num_transfer_bytes for e in c.events if isinstance(e, TokensOut))
    c.submit(1, [*base, 7, 8, 9, 10, 11], 6, 0, 1)
    c.run()
    second = sum(e.num_transfer_bytes for e in c.events if isinstance(e, TokensOut)) - first
    bytes_per_block = BLOCK * c.workers[1].executor.kv_bytes_per_token
    assert first == 5 * bytes_per_block  # 17 computed tokens -> 5 blocks
    assert second == 2 * bytes_per_block  # node 1 holds the 4 full blocks of `base`
    ref = Cluster(1)
    ref.submit(1, [*base, 7, 8, 9, 10, 11], 6, 0, 0)
    ref.run()
    assert c.tokens(1)[0] == ref.tokens(1)[0]


def test_wrong_kv_bytes_change_the_output() -> None:
    """The timed executor's tokens depend on the transferred KV, so a broken transfer
    cannot pass the disaggregated-equals-aggregated check."""
    c = Cluster(2)
    original = c.workers[0].executor.read_blocks

    def corrupt(ids: Any) -> Any:
        data = original(ids)
        data[:] = 7
        return data

    c.workers[0].executor.read_blocks = corrupt  # type: ignore[assignment]
    ref = Cluster(1)
    for cl, decode in ((c, 1), (ref, 0)):
        cl.submit(0, PROMPTS[2], 8, 0, decode)
        cl.run()
    assert c.tokens(0)[0][0] == ref.tokens(0)[0][0]  # sampled on the prefill node
    assert c.tokens(0)[0][1:] != ref.tokens(0)[0][1:]


def test_preemption_under_a_small_pool_keeps_outputs() -> None:
    small, big = Cluster(1, num_blocks=12), Cluster(1, num_blocks=64)
    for cl in (small, big):
        for rid in range(4):
            cl.submit(rid, [*PROMPTS[rid % 4][:8], rid + 3], 14, 0, 0)
        cl.run()
    assert small.workers[0].sched.num_preemptions > 0
    for rid in range(4):
        assert small.tokens(rid) == big.tokens(rid)


def test_abort_frees_blocks_wherever_the_request_is() -> None:
    c = Cluster(2)
    c.submit(0, PROMPTS[3], 50, 0, 1)
    c.submit(1, PROMPTS[2], 50, 0, 0)
    for _ in range(3):
        for w in c.workers:
            while not w.inbox.empty():
                w.handle(w.inbox.get_nowait())
            w.step()
    for node in (0, 1):
        c.inboxes[node].put(Abort(0))
        c.inboxes[node].put(Abort(1))
    c.run()
    for w in c.workers:
        w.sched.check_integrity()
        assert w.sched.pool.num_used_blocks == 0 and not w.jobs and not w.pending_incoming


def test_lost_handoff_fails_the_request_on_the_decode_node() -> None:
    c = Cluster(2)
    c.submit(0, PROMPTS[1], 5, 0, 1)
    c.inboxes[1].put(KVPayload(0, 0, 0, None))  # arrives before any reservation: ignored
    c.run()
    assert c.tokens(0)[1] is FinishReason.LENGTH
    assert not any(isinstance(e, RequestFailed) for e in c.events)


def test_timed_executor_sleeps_the_cost_models_step_time() -> None:
    slept: list[float] = []
    now = [0.0]
    cost = FixedCost(0.25)
    ex = TimedExecutor(cost, 8, BLOCK, 100, sleep=slept.append, clock=lambda: now[0])
    shape = BatchShape((PrefillChunk(5, 0),), 0, 0, 8)
    out = ex.execute([WorkItem(1, (4, 5, 6, 7, 8), 0, (0, 1), True)], shape)
    assert slept == [0.25] and cost.shapes == [shape]
    again = ex.execute([WorkItem(1, (4, 5, 6, 7, 8), 0, (0, 1), True)], shape)
    assert out == again and 0 <= out[1] < 100
    assert ex.execute([], None) == {} and slept == [0.25, 0.25]


def test_timed_executor_blocks_round_trip() -> None:
    a, b = timed(8), timed(8)
    a.execute([WorkItem(1, tuple(range(10, 17)), 0, (2, 5), True)])
    b.write_blocks([6, 1], a.read_blocks([2, 5]).tobytes())
    assert (b.read_blocks([6, 1]) == a.read_blocks([2, 5])).all()
    wa = a.execute([WorkItem(1, (99,), 7, (2, 5), True)])
    wb = b.execute([WorkItem(1, (99,), 7, (6, 1), True)])
    assert wa[1] == wb[1]
    with pytest.raises(ValueError):
        b.write_blocks([0], b"short")


def test_text_stream_holds_back_a_possible_stop_string() -> None:
    from evinfra.serve.engine.tokenizer import ChatTokenizer, byte_level_spec

    tok = ChatTokenizer.from_spec(byte_level_spec())
    ids = tok.encode("hello END world")
    stream = TextStream(tok, ["END"])
    sent = "".join(stream.push([t]) for t in ids)
    assert stream.stopped and stream.text == "hello "
    assert sent + stream.finish() == "hello "
    assert stream.num_tokens == len(tok.encode("hello EN")) + 1


def _first_cached(c: Cluster, rid: int) -> int | None:
    return next(
        e.num_cached_tokens
        for e in c.events
        if isinstance(e, TokensOut) and e.request_id == rid and e.num_cached_tokens is not None
    )


def test_prefix_pull_moves_the_holders_blocks_and_keeps_the_output() -> None:
    """Node 0 served a session's first call; its next call is prefilled on node 1, told to
    pull the prefix from node 0: node 1 computes only what node 0 lacks, and the output
    equals one node serving both calls (the timed executor's tokens come from its KV)."""
    base, more = PROMPTS[3], [*PROMPTS[3], 7, 8, 9, 10, 11]
    c, ref, cold = Cluster(2), Cluster(1), Cluster(2)
    c.submit(0, base, 6, 0, 0)
    ref.submit(0, base, 6, 0, 0)
    cold.submit(0, base, 6, 0, 0)
    for cl in (c, ref, cold):
        cl.run()
    c.submit(1, more, 6, 1, 1, pull_from=0)
    ref.submit(1, more, 6, 0, 0)
    cold.submit(1, more, 6, 1, 1)
    for cl in (c, ref, cold):
        cl.run()
    assert c.tokens(1) == ref.tokens(1) and c.tokens(1)[1] is FinishReason.LENGTH
    assert _first_cached(c, 1) == 16 == _first_cached(ref, 1)  # base's 4 full blocks
    assert _first_cached(cold, 1) == 0  # without the pull node 1 computes everything
    puller = c.workers[1]
    assert puller.num_prefix_pulls == 1 and puller.num_prefix_blocks_pulled == 4
    moved = sum(e.num_transfer_bytes for e in c.events if isinstance(e, TokensOut))
    assert moved == 4 * BLOCK * puller.executor.kv_bytes_per_token
    # prefilled and decoded on node 1: all of it is the pull, none a hand-off
    assert sum(e.num_pulled_bytes for e in c.events if isinstance(e, TokensOut)) == moved
    for w in c.workers:
        w.sched.check_integrity()
        assert w.sched.pool.num_used_blocks == 0 and not w.jobs and not w._pulling


def test_prefix_pull_of_corrupted_bytes_changes_the_output() -> None:
    """The pulled blocks are the ones the prefill reads: bad bytes cannot go unnoticed."""
    c, ref = Cluster(2), Cluster(2)
    original = c.workers[0].executor.read_blocks

    def corrupt(ids: Any) -> Any:
        data = original(ids)
        data[:] = 7
        return data

    for cl in (c, ref):
        cl.submit(0, PROMPTS[3], 6, 0, 0)
        cl.run()
    c.workers[0].executor.read_blocks = corrupt  # type: ignore[assignment]
    for cl in (c, ref):
        cl.submit(1, [*PROMPTS[3], 5, 6], 6, 1, 1, pull_from=0)
        cl.run()
    assert c.tokens(1)[0] != ref.tokens(1)[0]


def test_prefix_pull_that_gets_no_answer_computes_after_the_timeout() -> None:
    c = Cluster(3)
    c.submit(0, PROMPTS[3], 6, 0, 0)
    c.run()
    silent = c.workers.pop(2)  # node 2 never answers
    c.submit(1, PROMPTS[3], 6, 1, 1, pull_from=2)
    c.run()
    assert c.tokens(1) == ([], None) and 1 in c.workers[1]._pulling
    assert c.workers[1].stats().num_waiting_requests == 1
    c.workers[1].clock = lambda: 1e12  # past the deadline
    c.run()
    ref = Cluster(1)
    ref.submit(1, PROMPTS[3], 6, 0, 0)
    ref.run()
    assert c.tokens(1) == ref.tokens(1)
    assert isinstance(silent.inbox.get_nowait(), PrefixPull)


def test_abort_while_pulling_leaves_nothing_and_drops_the_late_payload() -> None:
    c = Cluster(2)
    c.submit(0, PROMPTS[3], 6, 0, 0)
    c.run()
    c.submit(1, PROMPTS[3], 6, 1, 1, pull_from=0)
    w1 = c.workers[1]
    w1.handle(c.inboxes[1].get_nowait())  # the Submit: a PrefixPull goes to node 0
    assert 1 in w1._pulling
    c.inboxes[1].put(Abort(1))
    c.run()  # node 1 sees the abort, then node 0's payload
    assert c.tokens(1) == ([], None)
    for w in c.workers:
        w.sched.check_integrity()
        assert w.sched.pool.num_used_blocks == 0 and not w.jobs and not w._pulling


def test_prefix_pull_asks_only_for_the_blocks_the_puller_lacks() -> None:
    base, more = PROMPTS[3], [*PROMPTS[3], 7, 8, 9]
    c, ref = Cluster(2), Cluster(1)
    c.submit(0, base[:9], 4, 1, 1)  # node 1 holds base's first 2 blocks
    c.submit(1, base, 4, 0, 0)  # node 0 holds all 4
    ref.submit(1, base, 4, 0, 0)
    for cl in (c, ref):
        cl.run()
    c.submit(2, more, 6, 1, 1, pull_from=0)
    ref.submit(2, more, 6, 0, 0)
    for cl in (c, ref):
        cl.run()
    assert c.tokens(2) == ref.tokens(2)
    assert _first_cached(c, 2) == 16
    assert c.workers[1].num_prefix_blocks_pulled == 2
    moved = sum(e.num_transfer_bytes for e in c.events if isinstance(e, TokensOut))
    assert moved == 2 * BLOCK * c.workers[1].executor.kv_bytes_per_token
