import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.decode_batch import DecodeBatch
from evinfra.core.kv_pool import KVPool
from evinfra.core.scheduler import NodeScheduler, SchedulerConfig
from evinfra.core.sequence import Sequence
from evinfra.core.types import Request, Role

BS = 4


def make_seq(rid: int, num_computed: int, num_blocks: int, num_out: int, run_pos: int) -> Sequence:
    seq = Sequence(Request(rid, (), num_computed, num_out))
    seq.num_computed_tokens = num_computed
    seq.num_generated = 1
    seq.block_ids = list(range(num_blocks))
    seq.run_pos = run_pos
    return seq


def test_a_step_moves_every_sequence_and_finishes_in_run_order() -> None:
    batch = DecodeBatch(BS)
    late = make_seq(1, 5, 2, 3, run_pos=2)  # 2 outputs left
    early = make_seq(2, 6, 2, 3, run_pos=1)  # 2 outputs left
    long = make_seq(3, 7, 2, 9, run_pos=3)
    for seq in (late, early, long):
        batch.join(seq)
    assert batch.num_context_tokens() == 6 + 7 + 8
    assert batch.min_remaining_outputs() == 2
    batch.advance(1)
    assert batch.take_finished() == []
    assert (late.num_computed_tokens, late.num_generated) == (6, 2)
    batch.advance(1)
    assert batch.take_finished() == [early, late]
    assert batch.num_context_tokens() == 8 + 9 + 10
    for seq in (early, late):
        batch.leave(seq)
    assert (late.num_computed_tokens, late.num_generated) == (7, 3)
    assert late not in batch and len(batch) == 1
    assert batch.min_remaining_outputs() == 6


def test_a_held_sequence_does_not_move() -> None:
    batch = DecodeBatch(BS)
    a, b = make_seq(1, 5, 2, 3, run_pos=1), make_seq(2, 5, 2, 3, run_pos=2)
    batch.join(a)
    batch.join(b)
    batch.advance(1)
    batch.hold(b, 1)  # the step did not decode b
    assert (a.num_computed_tokens, b.num_computed_tokens) == (6, 5)
    batch.advance(1)
    assert batch.take_finished() == [a]
    batch.leave(a)
    batch.advance(1)
    assert batch.take_finished() == [b]
    assert batch.num_context_tokens() == 8


def test_needing_a_block_is_due_at_the_block_boundary() -> None:
    batch = DecodeBatch(BS)
    full = make_seq(1, 8, 2, 20, run_pos=1)  # its next token starts block 3
    room = make_seq(2, 5, 2, 20, run_pos=2)  # room for tokens 5, 6, 7
    batch.join(full)
    batch.join(room)
    assert sorted(batch.rooms()) == [0, 3]
    assert batch.take_needing(batch.clock.steps) == [full]
    full.block_ids.append(9)
    batch.track_need(full)
    # within 4 steps: room needs a block at its 4th step, full has 4 tokens of room
    assert batch.take_needing(batch.clock.steps + 3) == [room]
    batch.track_need(room)
    batch.advance(3)
    assert batch.take_needing(batch.clock.steps) == [room]


def test_an_overshoot_is_refused() -> None:
    batch = DecodeBatch(BS)
    seq = make_seq(1, 5, 3, 2, run_pos=1)  # 1 output left
    batch.join(seq)
    batch.advance(2)
    with pytest.raises(ValueError, match="overshoots"):
        batch.take_finished()


def test_a_sequence_joining_during_a_step_is_not_advanced_by_it() -> None:
    sched = NodeScheduler(0, KVPool(64), SchedulerConfig(BS, 16, 4), Role.MIXED)
    prompt_a = Request(1, (), 6, 5)
    sched.enqueue_prefill(prompt_a, decode_here=True)
    plan = sched.schedule()
    assert plan is not None
    sched.complete_step(plan)
    plan = sched.schedule()  # a decode of request 1
    assert plan is not None and len(plan.decodes) == 1
    # request 2 arrives from a prefill node while the step runs
    assert sched.try_reserve_incoming(Request(2, (), 6, 5), num_generated=1) is not None
    joined = sched.accept_incoming(2)
    sched.complete_step(plan)
    assert (joined.num_computed_tokens, joined.num_generated) == (6, 1)
    assert sched.running[0].num_generated == 2
    sched.check_integrity()
    plan = sched.schedule()
    assert plan is not None and len(plan.decodes) == 2
    assert plan.num_decode_context_tokens == (7 + 1) + (6 + 1)
    sched.complete_step(plan)
    assert [s.num_generated for s in sched.running] == [3, 2]
    sched.check_integrity()


OPS = ["submit", "incoming", "step", "run", "stop"]


@settings(max_examples=80, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(OPS), st.integers(1, 9)),
        max_size=40,
    ),
    st.integers(8, 40),
)
def test_counters_follow_the_plans_that_decoded_them(
    ops: list[tuple[str, int]], num_blocks: int
) -> None:
    """Each sequence's counters move exactly by the steps of the plans that list it, while
    sequences join mid-step, stop, get preempted and decode in runs cut short."""
    sched = NodeScheduler(0, KVPool(num_blocks), SchedulerConfig(BS, 12, 4), Role.MIXED)
    generated: dict[int, int] = {}
    plan = None
    finished: list[int] = []

    def complete(stopped: frozenset[int]) -> None:
        nonlocal plan
        if plan is None:
            return
        for chunk in plan.chunks:
            if chunk.completes_prefill:
                generated[chunk.seq.seq_id] = chunk.seq.num_generated + 1
        for seq in plan.decodes:
            generated[seq.seq_id] += 1
        out = sched.complete_step(plan, stopped)
        finished.extend(s.seq_id for s in out.finished)
        plan = None

    for rid, (op, n) in enumerate(ops):
        if op == "submit" and 2 + n <= num_blocks * BS // 2:
            sched.enqueue_prefill(Request(rid, (), 2 + n, n), decode_here=True)
        elif op == "incoming" and 2 * n <= num_blocks * BS // 2:
            if sched.try_reserve_incoming(Request(rid, (), n, n + 1), num_generated=1):
                generated[rid] = 1
                sched.accept_incoming(rid)  # possibly while a step is in flight
        elif op in ("step", "stop"):
            first = sched.running[:1] if op == "stop" else []
            complete(frozenset(s.seq_id for s in first))
            plan = sched.schedule()
        elif op == "run":
            complete(frozenset())
            plan = sched.schedule()
            k = sched.max_decode_run_steps() if plan and not plan.chunks else 0
            if plan is not None and k > 1 and len(plan.decodes) == len(sched.running):
                sched.reserve_decode_run(plan.decodes, k)
                cut = min(k, n)
                for seq in plan.decodes:
                    generated[seq.seq_id] += cut
                out = sched.apply_decode_run(plan.decodes, cut)
                finished.extend(s.seq_id for s in out.finished)
                plan = None
        sched.check_integrity()
        for seq in [*sched.running, *sched.prefilling, *sched.waiting]:
            assert seq.num_generated == generated.get(seq.seq_id, 0), seq.seq_id
    complete(frozenset())
    finished += run_to_idle(sched)
    assert len(finished) == len(set(finished))
    assert sched.is_idle and sched.pool.num_used_blocks == 0


def run_to_idle(sched: NodeScheduler) -> list[int]:
    finished: list[int] = []
    while (plan := sched.schedule()) is not None:
        finished += [s.seq_id for s in sched.complete_step(plan).finished]
        sched.check_integrity()
    return finished
