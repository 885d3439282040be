"""A session's next call acquires the blocks its last call freed: KVPool finds them from
the freed run (checked block by block) and must give exactly the index's blocks, also
after evictions reuse them, and never look at blocks a clear() forgot."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.eviction import EvictionPolicy, LRUEviction, ScoredEviction
from evinfra.core.kv_pool import KVPool
from evinfra.core.tiered_eviction import TieredEviction


def make_eviction(kind: str) -> EvictionPolicy:
    """LRU and tiers mark their candidates in the pool's counts; scores do not."""
    if kind == "lru":
        return LRUEviction()
    if kind == "tiered":
        return TieredEviction(lambda h: float(h % 3 == 0), [0.0, 1.0])
    return ScoredEviction(lambda h: float(h % 2))


def run_of(pool: KVPool, hashes: tuple[int, ...], num_tail: int = 1) -> list[int]:
    """Blocks for `hashes` (committed) plus `num_tail` blocks still filling."""
    ids = pool.try_acquire_and_allocate((), len(hashes) + num_tail)
    assert ids is not None
    pool.commit_many(ids[: len(hashes)], hashes)
    return ids


def test_a_freed_run_is_acquired_again_as_the_same_blocks() -> None:
    pool = KVPool(16)
    ids = run_of(pool, (1, 2, 3))
    pool.free(ids)
    assert pool._freed_runs[3].block_ids == ids[:3]  # keyed by the last hash, tail left out
    again = pool.try_acquire_and_allocate((1, 2, 3), 2)
    assert again is not None and again[:3] == ids[:3]
    pool.check_integrity()


def test_a_run_whose_blocks_were_reused_falls_back_to_the_index() -> None:
    pool = KVPool(3)
    ids = run_of(pool, (1, 2), num_tail=0)
    pool.free(ids)
    pool.free(run_of(pool, (7, 8, 9), num_tail=0))  # evicts 1 and 2: blocks reused
    assert not pool.holds(1)
    run_of(pool, (5,), num_tail=0)  # held: takes the first block of the old run
    refilled = run_of(pool, (1, 2), num_tail=0)  # same content, other blocks now
    assert refilled != ids
    got = pool.try_acquire_and_allocate((1, 2), 0)
    assert got == [pool.block_of(1), pool.block_of(2)] == refilled
    pool.check_integrity()


def test_clear_forgets_the_runs() -> None:
    pool = KVPool(8)
    pool.free(run_of(pool, (1, 2, 3)))
    pool.clear()
    assert not pool._freed_runs
    pool.free(run_of(pool, (1,)))
    assert pool.try_acquire_and_allocate((1,), 0) == [pool.block_of(1)]


def test_an_untouched_run_is_taken_whole_and_a_touched_one_block_by_block() -> None:
    pool = KVPool(16)
    ids = run_of(pool, (1, 2, 3))
    pool.free(ids)
    assert pool.eviction.run_at(ids[2]) == 3  # queued tail first, in one call
    again = pool.try_acquire_and_allocate((1, 2, 3), 1)
    assert again is not None and again[:3] == ids[:3]
    assert [pool.ref_count(b) for b in again] == [1, 1, 1, 1]
    pool.free(again)
    shared = pool.try_acquire_and_allocate((1,), 0)  # another sequence takes the head
    assert shared == ids[:1] and pool.eviction.run_at(ids[2]) == 0
    assert pool.try_acquire_and_allocate((1, 2, 3), 0) == ids[:3]
    assert [pool.ref_count(b) for b in ids[:3]] == [2, 1, 1]
    pool.check_integrity()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 4), st.integers(0, 6), st.booleans()), max_size=30),
    st.sampled_from(["lru", "tiered", "scored"]),
)
def test_acquired_blocks_are_always_the_index_blocks(
    steps: list[tuple[int, int, bool]], eviction: str
) -> None:
    """Sessions (1..4) whose contexts grow by a few blocks per call, freed and acquired
    again, in a pool small enough to evict."""
    pool = KVPool(12, eviction=make_eviction(eviction))
    contexts: dict[int, tuple[int, ...]] = {}
    for session, num_new, keep in steps:
        prompt = contexts.get(session, ())
        match = pool.match_prefix(prompt)
        cached = prompt[: match.num_device_blocks]
        new_hashes = tuple(1000 * session + len(prompt) + i for i in range(num_new))
        ids = pool.try_acquire_and_allocate(cached, len(prompt) - len(cached) + num_new + 1)
        if ids is None:
            continue
        assert ids[: len(cached)] == [pool.block_of(h) for h in cached]
        context = prompt + new_hashes
        pool.commit_many(ids[len(cached) : len(context)], context[len(cached) :])
        pool.free(ids)
        contexts[session] = context if keep else ()
        pool.check_integrity()


@given(kind=st.sampled_from(["lru", "tiered", "scored"]), num_known=st.integers(0, 5))
@settings(max_examples=30, deadline=None)
def test_free_told_the_held_hashes_does_what_a_plain_free_does(kind: str, num_known: int) -> None:
    """`free(ids, held_hashes)` only spares reading what the caller knows: the same
    candidates in the same order, the same freed run, the same counts (a shared head
    still read by another holder, a tail not committed)."""
    pools = [KVPool(16, eviction=make_eviction(kind)) for _ in range(2)]
    for told, pool in enumerate(pools):
        head = run_of(pool, (1, 2), num_tail=0)  # another holder keeps reading these
        ids = pool.try_acquire_and_allocate((1, 2), 4)
        assert ids is not None and ids[:2] == head
        pool.commit_many(ids[2:5], (3, 4, 5))  # the last block is still filling
        known = (1, 2, 3, 4, 5)[:num_known] if told else ()
        pool.free(ids, known)
        pool.check_integrity()
    plain, told_pool = pools
    assert [plain.ref_count(b) for b in range(6)] == [told_pool.ref_count(b) for b in range(6)]
    assert list(plain._freed_runs) == list(told_pool._freed_runs)
    for a, b in zip(plain._freed_runs.values(), told_pool._freed_runs.values(), strict=True):
        assert (a.block_ids, a.start, a.hashes, a.mark) == (b.block_ids, b.start, b.hashes, b.mark)
    order = [p.try_allocate(p.num_free_blocks) for p in pools]
    assert order[0] == order[1]


def test_free_told_more_held_hashes_than_blocks_refuses() -> None:
    pool = KVPool(8)
    ids = run_of(pool, (1, 2), num_tail=0)
    with pytest.raises(ValueError, match="held hashes"):
        pool.free(ids, (1, 2, 3))


@given(
    kind=st.sampled_from(["lru", "tiered", "scored"]),
    num_blocks=st.integers(1, 8),
    data=st.data(),
)
@settings(max_examples=150, deadline=None)
def test_free_told_a_slice_of_held_hashes_matches_a_plain_free_for_any_sharing(
    kind: str, num_blocks: int, data: st.DataObject
) -> None:
    """The held blocks are released in slices when only a head of them is still read by
    others, block by block otherwise: either way as a plain free, then and after (the
    same candidates, order, freed run and counts; the run acquired again the same)."""
    num_committed = data.draw(st.integers(0, num_blocks))
    num_known = data.draw(st.integers(0, num_committed))
    shared = data.draw(st.sets(st.integers(0, max(num_committed - 1, 0))))
    shared &= set(range(num_committed))
    hashes = tuple(range(1, num_committed + 1))
    pools = [KVPool(24, eviction=make_eviction(kind)) for _ in range(2)]
    results: list[object] = []
    for told, pool in enumerate(pools):
        ids = run_of(pool, hashes, num_tail=num_blocks - num_committed)
        pool.acquire_cached([hashes[i] for i in sorted(shared)])  # another holder
        pool.free(ids, hashes[:num_known] if told else ())
        pool.check_integrity()
        runs = [(r.block_ids, r.start, r.hashes, r.mark) for r in pool._freed_runs.values()]
        refs = list(pool._ref)
        again = pool.try_acquire_and_allocate(hashes, 1)
        pool.check_integrity()
        results.append((runs, refs, again, list(pool._ref)))
        results.append(pool.try_allocate(pool.num_free_blocks))  # the eviction order
    assert results[0] == results[2] and results[1] == results[3]
