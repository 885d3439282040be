"""Per-chunk KV allocation (`SchedulerConfig.allocation`): admission, step-by-step blocks,
preemption, and the invariants every mode keeps."""

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.allocation import Allocation, parse_allocation
from evinfra.core.kv_pool import KVPool
from evinfra.core.scheduler import NodeScheduler, StepPlan
from evinfra.core.sequence import SeqPhase, Sequence
from evinfra.core.types import Role
from tests.unit.core.test_scheduler import BS, make_request, make_sched, run_to_idle

PROMPT, CHUNK, FITS = Allocation.PROMPT, Allocation.CHUNK, Allocation.CHUNK_WHEN_PROMPT_FITS


def step(sched: NodeScheduler) -> StepPlan:
    plan = sched.schedule()
    assert plan is not None
    sched.complete_step(plan)
    sched.check_integrity()
    return plan


def chunks_of(plan: StepPlan) -> list[tuple[int, int]]:
    return [(c.seq.seq_id, c.num_new_tokens) for c in plan.chunks]


def with_long_decode(allocation: Allocation, num_blocks: int = 16) -> NodeScheduler:
    """A node whose 8 first blocks hold a sequence (id 0) decoding for 16 tokens (it fits
    12 blocks: a request larger than the pool is never sent)."""
    sched = make_sched(num_blocks, budget=32, max_seqs=8, allocation=allocation, max_chunk=8)
    sched.enqueue_prefill(make_request(0, [0] * 29, 16), decode_here=True)
    while not sched.running:
        step(sched)
    assert len(sched.running[0].block_ids) == 8
    return sched


def test_allocation_names_parse() -> None:
    assert [parse_allocation(a.value) for a in Allocation] == list(Allocation)
    assert parse_allocation(CHUNK) is CHUNK
    try:
        parse_allocation("lazy")
    except ValueError as exc:
        assert "prompt, chunk, chunk-when-prompt-fits" in str(exc)
    else:
        raise AssertionError("an unknown name parsed")


def test_a_long_prompt_holds_back_the_queue_when_it_takes_its_whole_prompt() -> None:
    for allocation in (PROMPT, FITS):
        sched = with_long_decode(allocation)
        sched.enqueue_prefill(make_request(1, [1] * 40, 2), decode_here=True)  # 10 blocks
        sched.enqueue_prefill(make_request(2, [2] * 5, 2), decode_here=True)
        plan = step(sched)
        # 8 blocks free: the 10-block prompt waits, and the short one behind it too
        assert chunks_of(plan) == []
        assert [s.seq_id for s in sched.waiting] == [1, 2]


def test_per_chunk_allocation_lets_a_long_prompt_and_the_one_behind_it_start() -> None:
    sched = with_long_decode(CHUNK)
    sched.enqueue_prefill(make_request(1, [1] * 40, 2), decode_here=True)
    sched.enqueue_prefill(make_request(2, [2] * 5, 2), decode_here=True)
    plan = sched.schedule()
    assert plan is not None
    assert chunks_of(plan) == [(1, 8), (2, 5)]
    # only the chunks' blocks: 2 for the long prompt's first 8 tokens, 2 for the 5 tokens
    assert [len(c.seq.block_ids) for c in plan.chunks] == [2, 2]
    assert sched.pool.num_free_blocks == 16 - 8 - 4
    sched.complete_step(plan)
    sched.check_integrity()


def test_chunk_blocks_are_allocated_step_by_step() -> None:
    counts: dict[Allocation, list[int]] = {}
    for allocation in Allocation:
        sched = make_sched(budget=8, allocation=allocation)
        seq = sched.enqueue_prefill(make_request(1, list(range(20)), 3), decode_here=True)
        counts[allocation] = []
        while (plan := sched.schedule()) is not None:
            counts[allocation].append(len(seq.block_ids))
            sched.complete_step(plan)
        sched.check_integrity()
    # 20 prompt tokens in chunks of 8, 8, 4, then two decodes (tokens 21 and 22)
    assert counts[PROMPT] == [5, 5, 5, 6, 6]
    assert counts[CHUNK] == counts[FITS] == [2, 4, 5, 6, 6]


def test_admission_takes_the_cached_prefix_and_the_first_chunk() -> None:
    sched = make_sched(budget=8, allocation=CHUNK)
    shared = list(range(16))
    sched.enqueue_prefill(make_request(1, [*shared, 50], 1), decode_here=True)
    run_to_idle(sched)
    seq = sched.enqueue_prefill(make_request(2, [*shared, *range(60, 80)], 1), decode_here=True)
    plan = sched.schedule()
    assert plan is not None
    # 4 cached blocks acquired, then 8 new tokens: 2 more blocks, not the prompt's 9
    assert seq.num_cached_tokens == 16
    assert chunks_of(plan) == [(2, 8)]
    assert len(seq.block_ids) == 6
    assert seq.num_committed_blocks == 4
    sched.complete_step(plan)
    sched.check_integrity()


def test_host_hits_are_onboarded_at_admission_under_per_chunk_allocation() -> None:
    for allocation in Allocation:
        sched = make_sched(num_blocks=8, budget=8, allocation=allocation, num_host_blocks=32)
        prompt = list(range(24))
        sched.enqueue_prefill(make_request(1, prompt, 1), decode_here=True)
        run_to_idle(sched)
        # a 7-block stranger evicts the first prompt's blocks to the host tier
        sched.enqueue_prefill(make_request(2, [9] * 28, 1), decode_here=True)
        run_to_idle(sched)
        assert sched.pool.match_prefix(make_request(1, prompt, 1).prompt_hashes).num_blocks == 6
        seq = sched.enqueue_prefill(make_request(3, [*prompt, 7, 7], 1), decode_here=True)
        plan = sched.schedule()
        assert plan is not None
        match_host = seq.num_host_cached_tokens // BS
        assert match_host > 0
        assert plan.num_onboarded_blocks == match_host
        assert seq.num_cached_tokens == 24
        assert chunks_of(plan) == [(3, 2)]
        sched.complete_step(plan)
        sched.check_integrity()


def test_a_prefill_node_holds_the_whole_prompt_when_it_hands_off() -> None:
    pre = make_sched(budget=8, allocation=CHUNK)
    pre.set_role(Role.PREFILL)
    req = make_request(5, list(range(22)), 4)
    seq = pre.enqueue_prefill(req, decode_here=False)
    blocks = []
    while not pre.handoff:
        step(pre)
        blocks.append(len(seq.block_ids))
    assert blocks == [2, 4, 6]
    assert pre.handoff[5] is seq and len(seq.block_ids) == 6  # ceil(22 / 4)
    dec = NodeScheduler(1, KVPool(64), pre.config, Role.DECODE)
    assert dec.try_reserve_incoming(req, seq.num_generated) == 6
    pre.release_handoff(5)
    dec.accept_incoming(5)
    assert run_to_idle(dec) == [5]
    pre.check_integrity()


def test_a_newer_prefill_waits_rather_than_preempt_an_older_decode() -> None:
    sched = with_long_decode(CHUNK, num_blocks=12)
    old = sched.running[0]
    prefill = sched.enqueue_prefill(make_request(1, [1] * 24, 2), decode_here=True)
    steps = [step(sched) for _ in range(4)]
    assert [chunks_of(p) for p in steps] == [[(1, 8)], [(1, 8)], [], []]
    assert [[s.seq_id for s in p.decodes] for p in steps] == [[0]] * 4
    # step 3: the pool is full and its third chunk needs 2 blocks: only sequences admitted
    # after it may be preempted, so it waits with its 4 blocks; step 4: the older decode
    # needs a 9th block and preempts the newer, half-allocated prefill
    assert [p.preempted for p in steps] == [(), (), (), (prefill,)]
    assert old.phase is SeqPhase.DECODING and len(old.block_ids) == 9
    assert prefill.phase is SeqPhase.WAITING and prefill.num_preemptions == 1
    assert run_to_idle(sched) == [0, 1]


def test_preempted_prefill_is_requeued_first_and_keeps_its_computed_blocks_cached() -> None:
    sched = make_sched(num_blocks=12, budget=32, max_seqs=8, allocation=CHUNK, max_chunk=8)
    older = sched.enqueue_prefill(make_request(1, [1] * 32, 2), decode_here=True)
    newer = sched.enqueue_prefill(make_request(2, [2] * 24, 2), decode_here=True)
    plan = step(sched)
    assert chunks_of(plan) == [(1, 8), (2, 8)]  # 2 + 2 blocks
    plan = step(sched)
    assert chunks_of(plan) == [(1, 8), (2, 8)]  # 4 + 4 blocks
    plan = step(sched)
    # 1 takes 2 more (6), 2 takes the last 2 (6): the pool is full
    assert chunks_of(plan) == [(1, 8), (2, 8)]
    assert sched.pool.num_free_blocks == 0
    assert newer.phase is SeqPhase.DECODING  # its 24 tokens are in
    next_plan = sched.schedule()
    assert next_plan is not None
    plan = next_plan
    # the newer one's decode needs a 7th block: it may not preempt the older prefill and
    # waits; the older one's last chunk needs 2 blocks and preempts the newer one, which
    # goes back to the queue's head (nothing is admitted in a step that preempted)
    assert plan.preempted == (newer,)
    assert plan.decodes == ()
    assert chunks_of(plan) == [(1, 8)]
    # (mypy keeps the DECODING narrowing above across schedule(), which changed it)
    assert newer.phase is SeqPhase.WAITING  # type: ignore[comparison-overlap]
    assert newer.block_ids == []
    assert list(sched.waiting) == [newer] and newer.num_preemptions == 1
    sched.complete_step(plan)
    sched.check_integrity()
    assert older.num_computed_tokens == 32
    assert run_to_idle(sched) == [1, 2]
    assert newer.num_preemptions == 1
    assert newer.num_cached_tokens == 0  # the first admission's figure is kept
    assert sched.num_prompt_tokens_seen == 32 + 24


def test_a_decode_preempts_a_half_allocated_prefill() -> None:
    # without this two half-allocated prefills, or a prefill and an older decode, could
    # wait on each other for ever
    sched = with_long_decode(CHUNK, num_blocks=12)
    old = sched.running[0]
    sched.enqueue_prefill(make_request(1, [1] * 32, 2), decode_here=True)
    while sched.pool.num_free_blocks:
        step(sched)
    prefill: Sequence = sched.prefilling[0]
    assert len(prefill.block_ids) == 4
    preempted: list[Sequence] = []
    while old.phase is SeqPhase.DECODING and not preempted:
        plan = step(sched)
        preempted = list(plan.preempted)
    assert preempted == [prefill]
    assert old.phase is SeqPhase.DECODING
    assert run_to_idle(sched) == [0, 1]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.integers(1, 10), st.integers(0, 2), st.integers(0, 6)),
        max_size=10,
    ),
    st.integers(8, 30),
    st.integers(4, 24),
    st.sampled_from(list(Allocation)),
    st.sampled_from([None, 4, 7]),
    st.sampled_from([0, 16]),
)
def test_requests_arriving_between_steps_all_finish_once(
    reqs: list[tuple[int, int, int, int]],
    num_blocks: int,
    budget: int,
    allocation: Allocation,
    max_chunk: int | None,
    num_host_blocks: int,
) -> None:
    """Arrivals between steps, shared prefixes, a host tier: each step's chunks hold the
    blocks they write, the budget holds, and every request finishes exactly once."""
    sched = make_sched(num_blocks, budget, 4, allocation, max_chunk, num_host_blocks)
    pending = sorted(
        (at, rid, plen, nout, family) for rid, (plen, nout, family, at) in enumerate(reqs)
    )
    expected, finished = [], []
    for now in range(10_000):
        while pending and pending[0][0] <= now:
            _, rid, plen, nout, family = pending.pop(0)
            if -(-(plen + nout) // BS) <= num_blocks:  # larger ones are never sent
                prompt = [family] * (plen // 2) + [100 + rid] * (plen - plen // 2)
                sched.enqueue_prefill(make_request(rid, prompt, nout), decode_here=True)
                expected.append(rid)
        plan = sched.schedule()
        if plan is None:
            if not pending:
                break
            continue
        assert plan.num_tokens <= budget
        for c in plan.chunks:
            assert len(c.seq.block_ids) * BS >= c.num_context_tokens + c.num_new_tokens
            assert max_chunk is None or c.num_new_tokens <= max_chunk
        out = sched.complete_step(plan)
        finished += [s.seq_id for s in out.finished]
        sched.check_integrity()
    assert sorted(finished) == sorted(expected)
    assert sched.is_idle and sched.pool.num_used_blocks == 0
