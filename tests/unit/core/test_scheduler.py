import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.allocation import Allocation
from evinfra.core.blocks import hash_token_blocks
from evinfra.core.kv_pool import KVPool
from evinfra.core.scheduler import NodeScheduler, SchedulerConfig
from evinfra.core.sequence import SeqPhase
from evinfra.core.types import Request, Role

BS = 4


def make_request(rid: int, prompt: list[int], num_out: int) -> Request:
    full = prompt + [1000 + rid * 100 + i for i in range(num_out)]
    prompt_hashes = hash_token_blocks(prompt, BS)
    all_hashes = hash_token_blocks(full, BS)
    return Request(
        rid, tuple(prompt_hashes), len(prompt), num_out, tuple(all_hashes[len(prompt_hashes) :])
    )


def make_sched(
    num_blocks: int = 64,
    budget: int = 16,
    max_seqs: int = 4,
    allocation: Allocation = Allocation.PROMPT,
    max_chunk: int | None = None,
    num_host_blocks: int = 0,
) -> NodeScheduler:
    cfg = SchedulerConfig(BS, budget, max_seqs, max_chunk, allocation)
    return NodeScheduler(0, KVPool(num_blocks, num_host_blocks), cfg, Role.MIXED)


def run_to_idle(sched: NodeScheduler, max_steps: int = 10_000) -> list[int]:
    finished: list[int] = []
    for _ in range(max_steps):
        plan = sched.schedule()
        if plan is None:
            break
        assert plan.num_tokens <= sched.config.max_num_batched_tokens
        assert len(plan.decodes) + len(plan.chunks) <= sched.config.max_num_seqs
        out = sched.complete_step(plan)
        finished += [s.seq_id for s in out.finished]
        sched.check_integrity()
    return finished


def test_chunked_prefill_respects_budget_and_samples_once() -> None:
    sched = make_sched(budget=8)
    sched.enqueue_prefill(make_request(1, list(range(20)), 3), decode_here=True)
    plans = []
    while (plan := sched.schedule()) is not None:
        plans.append(plan)
        sched.complete_step(plan)
    chunk_sizes = [c.num_new_tokens for p in plans for c in p.chunks]
    assert chunk_sizes == [8, 8, 4]
    # 3 outputs: one sampled by the prefill, two decode steps
    assert sum(len(p.decodes) for p in plans) == 2
    assert sched.is_idle
    sched.check_integrity()


def test_second_turn_hits_first_turns_prompt_and_output() -> None:
    sched = make_sched()
    prompt = list(range(12))
    r1 = make_request(1, prompt, 8)
    sched.enqueue_prefill(r1, decode_here=True)
    run_to_idle(sched)
    # the next turn resends prompt + output + new tokens
    full = prompt + [1000 + 100 + i for i in range(8)]
    r2 = make_request(2, [*full, 7, 7, 7, 7], 2)
    seq = sched.enqueue_prefill(r2, decode_here=True)
    plan = sched.schedule()
    assert plan is not None
    # 20 tokens of turn 1 -> 5 full blocks, of which the last holds the final output
    # token, whose KV was never computed: 4 blocks hit
    assert seq.num_cached_tokens == 16
    assert plan.chunks[0].num_new_tokens == 24 - 16


@pytest.mark.parametrize("allocation", list(Allocation))
def test_preemption_when_kv_runs_out_loses_nothing(allocation: Allocation) -> None:
    sched = make_sched(num_blocks=10, budget=64, max_seqs=8, allocation=allocation)
    for rid in range(4):
        sched.enqueue_prefill(make_request(rid, [rid] * 8, 12), decode_here=True)
    finished = run_to_idle(sched)
    assert sorted(finished) == [0, 1, 2, 3]
    assert sched.num_preemptions > 0
    assert sched.pool.num_used_blocks == 0


def test_handoff_and_incoming_move_a_sequence_between_nodes() -> None:
    pre = make_sched()
    dec = NodeScheduler(1, KVPool(64), pre.config, Role.DECODE)
    pre.set_role(Role.PREFILL)
    req = make_request(5, list(range(10)), 4)
    pre.enqueue_prefill(req, decode_here=False)
    plan = pre.schedule()
    assert plan is not None
    out = pre.complete_step(plan)
    assert [s.seq_id for s in out.handoffs] == [5]
    assert pre.handoff[5].phase is SeqPhase.HANDOFF
    num_blocks = dec.try_reserve_incoming(req, out.handoffs[0].num_generated)
    # 10 computed tokens: two full blocks and a partial one move; none is cached there
    assert num_blocks == 3
    pre.release_handoff(5)
    dec.accept_incoming(5)
    assert pre.pool.match_prefix(req.prompt_hashes).num_device_blocks == 2
    assert run_to_idle(dec) == [5]
    pre.check_integrity()
    dec.check_integrity()


def test_decode_run_equals_single_steps() -> None:
    a, b = make_sched(budget=64), make_sched(budget=64)
    for sched in (a, b):
        for rid, n in ((1, 9), (2, 5)):
            sched.enqueue_prefill(make_request(rid, [rid] * 6, n), decode_here=True)
        plan = sched.schedule()
        assert plan is not None
        sched.complete_step(plan)
    k = a.max_decode_run_steps()
    assert k == 4  # request 2 has 4 tokens left after the prefill's one
    seqs = list(a.running)
    a.reserve_decode_run(seqs, k)
    out = a.apply_decode_run(seqs, k)
    for _ in range(k):
        plan = b.schedule()
        assert plan is not None
        b.complete_step(plan)
    assert [s.seq_id for s in out.finished] == [2]
    assert [(s.seq_id, s.num_computed_tokens, len(s.block_ids)) for s in a.running] == [
        (s.seq_id, s.num_computed_tokens, len(s.block_ids)) for s in b.running
    ]
    a.check_integrity()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 12), st.integers(0, 3)), max_size=12),
    st.integers(6, 40),
    st.integers(4, 32),
    st.sampled_from(list(Allocation)),
    st.sampled_from([None, 3, 8]),
)
def test_no_request_lost_or_finished_twice(
    reqs: list[tuple[int, int, int]],
    num_blocks: int,
    budget: int,
    allocation: Allocation,
    max_chunk: int | None,
) -> None:
    sched = make_sched(num_blocks, budget, 4, allocation, max_chunk)
    ids = []
    for rid, (plen, nout, family) in enumerate(reqs):
        # requests that cannot fit the whole pool are not sent
        if -(-(plen + nout) // BS) > num_blocks:
            continue
        sched.enqueue_prefill(make_request(rid, [family] * plen, nout), decode_here=True)
        ids.append(rid)
    finished = run_to_idle(sched)
    assert sorted(finished) == ids
    assert sched.is_idle and sched.pool.num_used_blocks == 0
    # each prompt counted once, however often it was preempted and re-admitted
    assert sched.num_prompt_tokens_seen == sum(
        plen for rid, (plen, _, _) in enumerate(reqs) if rid in ids
    )


def test_a_burst_sharing_a_prefix_computes_it_once() -> None:
    sched = make_sched(budget=16, max_seqs=8)
    shared = list(range(32))
    seqs = [
        sched.enqueue_prefill(make_request(rid, [*shared, 90 + rid] * 1, 2), decode_here=True)
        for rid in range(3)
    ]
    run_to_idle(sched)
    # the first computes the 32 shared tokens; the others are admitted only once it has
    # (the step budget is spent) and find them cached, block by block as committed
    assert [s.num_cached_tokens for s in seqs] == [0, 32, 32]


def test_a_block_whose_content_another_block_holds_is_not_held() -> None:
    """Two sequences compute the same prompt in one step: the second one's commit finds
    each hash indexed already, so its blocks stay empty and its free reads them (the
    integrity check compares every held block's content with the sequence's hashes)."""
    sched = make_sched(budget=64, max_seqs=4)
    prompt = list(range(16))
    seqs = [sched.enqueue_prefill(make_request(rid, prompt, 3), True) for rid in range(2)]
    plan = sched.schedule()
    assert plan is not None and len(plan.chunks) == 2
    sched.complete_step(plan)
    sched.check_integrity()
    assert [s.num_committed_blocks for s in seqs] == [4, 4]
    assert [s.num_held_blocks for s in seqs] == [4, 0]
    run_to_idle(sched)
    assert sched.is_idle and sched.pool.num_used_blocks == 0
