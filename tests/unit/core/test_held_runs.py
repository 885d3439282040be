"""A shared head acquired ahead of a freed run is held as one run with one count
(`HeldRuns`): acquiring or releasing it whole touches no block's word. The pool must
behave exactly as one that counts every block on its own: the same blocks handed out,
the same reference counts, the same eviction order, whatever readers do with its blocks
(take part of the head, free part of what they hold)."""

from hypothesis import event, given, settings
from hypothesis import strategies as st

from evinfra.core.eviction import EvictionPolicy, LRUEviction, ScoredEviction
from evinfra.core.held_runs import HELD
from evinfra.core.kv_pool import KVPool
from evinfra.core.tiered_eviction import TieredEviction

HEAD = (1, 2, 3, 4)
"""A system prompt every session's context starts with."""


def make_eviction(kind: str) -> EvictionPolicy:
    if kind == "lru":
        return LRUEviction()
    if kind == "tiered":
        return TieredEviction(lambda h: float(h % 3 == 0), [0.0, 1.0])
    return ScoredEviction(lambda h: float(h % 2))


def start(pool: KVPool, context: tuple[int, ...], num_new: int) -> list[int] | None:
    """A call: the cached prefix of `context` acquired, the rest and `num_new` more
    blocks allocated, the context's blocks committed."""
    cached = context[: pool.match_prefix(context).num_device_blocks]
    ids = pool.try_acquire_and_allocate(cached, len(context) - len(cached) + num_new)
    if ids is not None:
        pool.commit_many(ids[len(cached) : len(context)], context[len(cached) :])
    return ids


def test_a_shared_head_is_held_once_and_released_to_the_eviction_queue_in_order() -> None:
    pool = KVPool(32)
    reader = start(pool, (*HEAD, 10), 1)  # reads the head while the others come and go
    assert reader is not None
    freed = {}
    for session in (20, 30):
        ids = start(pool, (*HEAD, session, session + 1), 1)
        assert ids is not None
        pool.free(ids)  # a freed run behind the head, which the reader still reads
        freed[session] = ids
    head = reader[: len(HEAD)]
    again = []
    for s in (20, 30):
        ids = start(pool, (*HEAD, s, s + 1, s + 2), 1)
        assert ids is not None
        again.append(ids)
    assert again[0][:3] == freed[20][:3] and again[1][:3] == freed[30][:3]
    # the first acquire ahead of a freed run made the head one held run, of all readers;
    # the second added one to its count and wrote no block's word
    assert [pool._ref[b] for b in head] == [HELD] * len(HEAD)
    run = pool._held.of[head[0]]
    assert run.block_ids == head and run.num_holders == 3
    assert [pool.ref_count(b) for b in head] == [3] * len(HEAD)
    pool.check_integrity()
    for ids in again:
        pool.free(ids)
        pool.check_integrity()
    assert run.num_holders == 1 and pool._ref[head[0]] == HELD
    pool.free(reader)  # the last holder: the head's blocks become candidates, tail first
    assert not pool._held.of and pool._held.num_dissolved == 1
    assert isinstance(pool.eviction, LRUEviction)
    committed = reader[:-1]  # the last block was never filled: it went back empty
    assert pool.eviction.order()[-len(committed) :] == committed[::-1]
    pool.check_integrity()


def test_a_reader_freeing_part_of_a_held_run_dissolves_it() -> None:
    pool = KVPool(32)
    reader = start(pool, HEAD, 0)
    other = start(pool, (*HEAD, 5), 1)
    assert reader is not None and other is not None
    pool.free(other)
    again = start(pool, (*HEAD, 5), 1)
    assert again is not None and pool._held.of
    pool.free(reader[:2])  # not a whole run: the run's count goes back to its blocks
    assert not pool._held.of
    assert [pool.ref_count(b) for b in reader] == [1, 1, 2, 2]
    pool.check_integrity()
    pool.free(reader[2:])
    pool.free(again)
    assert [pool.ref_count(b) for b in again] == [0] * len(again)
    pool.check_integrity()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("call"), st.integers(1, 3), st.integers(1, 3)),
        st.tuples(st.just("call"), st.integers(1, 3), st.integers(1, 3)),
        st.tuples(st.just("head"), st.integers(1, len(HEAD)), st.just(0)),
        st.tuples(st.just("free"), st.integers(0, 7), st.just(0)),
        st.tuples(st.just("split"), st.integers(0, 7), st.integers(1, 6)),
        st.tuples(st.just("alloc"), st.integers(1, 6), st.just(0)),
    ),
    min_size=12,
    max_size=50,
)


@settings(max_examples=400, deadline=None)
@given(ops, st.sampled_from(["lru", "tiered", "scored"]), st.integers(12, 48))
def test_held_runs_change_nothing_a_per_block_pool_does(
    steps: list[tuple[str, int, int]], eviction: str, num_blocks: int
) -> None:
    """Two pools, one holding shared heads and one counting every block, driven by the
    same calls: sessions whose contexts start with one head and grow (a session's next
    call frees its last one first), readers of part of the head, frees of all or part of
    what a holder holds, allocations that evict."""
    pools = [
        KVPool(num_blocks, eviction=make_eviction(eviction), hold_shared_heads=hold)
        for hold in (True, False)
    ]
    contexts: dict[int, tuple[int, ...]] = {}
    holders: dict[int, list[int]] = {}
    """Block lists held, by session (1..4) or by reader (from 10 on)."""
    num_readers = 0

    def free(key: int, split: int = 0) -> None:
        ids = holders.pop(key)
        parts = [ids[:split], ids[split:]] if split else [ids]
        for pool in pools:
            for part in parts:
                pool.free(part)

    for op, a, b in steps:
        got: list[list[int] | None] = []
        key = a
        if op == "call":  # session a's next call, its context grown by b blocks
            if a in holders:
                free(a)
            context = contexts.get(a, HEAD)
            new = tuple(1000 * a + len(context) + i for i in range(b))
            got = [start(pool, context, b + 1) for pool in pools]
            for pool, ids in zip(pools, got, strict=True):
                if ids is not None:
                    pool.commit_many(ids[len(context) : len(context) + b], new)
                    contexts[a] = context + new
        elif op in ("head", "alloc"):  # a reader of the head's first a blocks, or new ones
            num_readers += 1
            key = 10 + num_readers
            cached = HEAD[: min(a, pools[0].match_prefix(HEAD).num_device_blocks)]
            if op == "head":
                got = [pool.try_acquire_and_allocate(cached, 0) for pool in pools]
            else:
                got = [pool.try_allocate(a) for pool in pools]
        elif holders:
            free(sorted(holders)[a % len(holders)], b if op == "split" else 0)
        assert got[:1] == got[1:]
        if got and got[0] is not None:
            holders[key] = got[0]
        for pool in pools:
            pool.check_integrity()
        seen = len(pools[1]._ref)
        assert [pools[0].ref_count(b) for b in range(seen)] == [
            pools[1].ref_count(b) for b in range(seen)
        ]
        assert pools[0].num_free_blocks == pools[1].num_free_blocks
        if eviction != "scored":
            assert pools[0].eviction.order() == pools[1].eviction.order()  # type: ignore[attr-defined]
    event(f"held runs made: {min(pools[0]._held.num_held, 3)}")
    event(f"dissolved: {min(pools[0]._held.num_dissolved, 3)}")
    for key in list(holders):  # everyone leaves: the same candidates, in the same order
        free(key)
        for pool in pools:
            pool.check_integrity()
    victims = [pool.try_allocate(num_blocks) for pool in pools]
    assert victims[0] == victims[1]
