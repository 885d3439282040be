import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.eviction import LRUEviction, ScoredEviction
from evinfra.core.kv_pool import KVPool
from evinfra.core.tiered_eviction import TieredEviction


def make_pool(num_blocks: int = 8, num_host: int = 0) -> KVPool:
    return KVPool(num_blocks, num_host)


def test_free_releases_tail_first_and_lru_evicts_in_that_order() -> None:
    pool = make_pool(6)
    ids = pool.try_allocate(3)
    assert ids == [0, 1, 2]
    for i, h in enumerate((10, 11, 12)):
        assert pool.commit(ids[i], h)
    pool.free(ids)
    assert isinstance(pool.eviction, LRUEviction)
    # the tail block leaves first, the prefix root last
    assert pool.eviction.order() == [2, 1, 0]
    pool.check_integrity()
    # three empty blocks are used before any cached one is evicted
    extra = pool.try_allocate(3)
    assert extra == [3, 4, 5]
    assert pool.num_evicted_blocks == 0
    pool.check_integrity()
    more = pool.try_allocate(2)
    assert more == [2, 1]
    assert pool.num_evicted_blocks == 2
    assert pool.match_prefix([10, 11, 12]).num_device_blocks == 1
    pool.check_integrity()


def test_hit_takes_block_out_of_eviction_queue() -> None:
    pool = make_pool(4)
    ids = pool.try_allocate(2)
    assert ids is not None
    pool.commit(ids[0], 1)
    pool.commit(ids[1], 2)
    pool.free(ids)
    got = pool.acquire_cached([1])
    assert got == [ids[0]]
    assert isinstance(pool.eviction, LRUEviction)
    assert pool.eviction.order() == [ids[1]]
    pool.check_integrity()
    pool.free(got)
    # re-freed later, so it is now the most recently used
    assert pool.eviction.order() == [ids[1], ids[0]]


def test_evicted_content_goes_to_host_and_is_matched_there() -> None:
    pool = make_pool(2, num_host=4)
    ids = pool.try_allocate(2)
    assert ids is not None
    pool.commit(ids[0], 7)
    pool.commit(ids[1], 8)
    pool.free(ids)
    assert pool.try_allocate(2) is not None
    m = pool.match_prefix([7, 8, 9])
    assert (m.num_device_blocks, m.num_host_blocks) == (0, 2)
    pool.check_integrity()


def test_allocation_fails_cleanly_when_short() -> None:
    pool = make_pool(2)
    assert pool.try_allocate(3) is None
    assert pool.num_free_blocks == 2
    pool.check_integrity()


def test_drop_frees_dead_blocks_now_but_not_ones_in_use() -> None:
    pool = make_pool(4, num_host=4)
    ids = pool.try_allocate(3)
    assert ids is not None
    for i, h in enumerate((1, 2, 3)):
        pool.commit(ids[i], h)
    pool.free(ids[1:])
    pool.store_host(1)
    assert pool.drop([1, 2, 3]) == 2
    assert pool.holds(1) and not pool.holds(2) and not pool.holds(3)
    assert 1 not in pool.host
    pool.check_integrity()


def test_scored_eviction_pops_lowest_score_then_lru() -> None:
    scores = {1: 5.0, 2: 1.0, 3: 1.0, 4: 9.0}
    ev = ScoredEviction(lambda h: scores[h])
    for block_id, h in ((0, 1), (1, 2), (2, 3), (3, 4)):
        ev.add(block_id, h)
    scores[4] = 0.0
    ev.rescore([3])
    assert [ev.pop() for _ in range(4)] == [3, 1, 2, 0]
    assert ev.pop() is None


def test_integrity_check_catches_corruption() -> None:
    pool = make_pool(4)
    ids = pool.try_allocate(1)
    assert ids is not None
    pool.commit(ids[0], 42)
    pool._index[99] = ids[0]  # corrupt on purpose
    try:
        pool.check_integrity()
    except AssertionError:
        return
    raise AssertionError("corruption went unnoticed")


ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.integers(1, 4), st.integers(0, 30)),
        st.tuples(st.just("free"), st.integers(0, 10), st.integers(0, 0)),
        st.tuples(st.just("match"), st.integers(0, 30), st.integers(1, 6)),
        st.tuples(st.just("drop"), st.integers(0, 30), st.integers(1, 3)),
        st.tuples(st.just("offload"), st.integers(0, 30), st.integers(1, 3)),
        st.tuples(st.just("prefetch"), st.integers(0, 30), st.integers(1, 3)),
        st.tuples(st.just("import"), st.integers(0, 30), st.integers(1, 14)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_random_sequences_keep_integrity(seq: list[tuple[str, int, int]]) -> None:
    pool = KVPool(12, 6)
    held: list[list[int]] = []
    for op, a, b in seq:
        if op == "alloc":
            # a sequence: cached prefix from hashes b.., then new blocks
            hashes = list(range(b, b + a))
            m = pool.match_prefix(hashes)
            if not pool.can_allocate_after(a - m.num_device_blocks, hashes[: m.num_device_blocks]):
                continue
            got = pool.acquire_cached(hashes[: m.num_device_blocks])
            new = pool.try_allocate(a - m.num_device_blocks)
            assert new is not None
            for i, block_id in enumerate(new):
                pool.commit(block_id, hashes[m.num_device_blocks + i])
            held.append(got + new)
        elif op == "free" and held:
            pool.free(held.pop(a % len(held)))
        elif op == "match":
            m = pool.match_prefix(list(range(a, a + b)))
            assert m.num_blocks <= b
        elif op == "drop":
            pool.drop(list(range(a, a + b)))
        elif op == "offload":
            pool.offload(list(range(a, a + b)))
        elif op == "prefetch":
            pool.prefetch(list(range(a, a + b)))
        elif op == "import":
            hashes = list(range(a, a + b))
            missing = [h for h in hashes if not pool.holds(h)]
            room = pool.num_free_blocks
            used = pool.num_used_blocks
            n = pool.import_cached(hashes)
            assert n == min(len(missing), room)
            assert all(pool.holds(h) for h in missing[:n])  # none evicted by its own import
            assert pool.num_used_blocks == used  # installed unused
        pool.check_integrity()
        assert pool.num_used_blocks == len({x for h in held for x in h})
    for h in held:
        pool.free(h)
    pool.check_integrity()
    assert pool.num_used_blocks == 0


@pytest.mark.parametrize("strategy", ["scored", "tiered"])
def test_rescore_by_hash_finds_blocks_through_the_pool_index(strategy: str) -> None:
    scores = {10: -1.0, 11: -1.0, 12: -1.0}

    def score(h: int) -> float:
        return scores[h]

    ev: ScoredEviction | TieredEviction = (
        ScoredEviction(score) if strategy == "scored" else TieredEviction(score, (-1.0, 0.0))
    )
    pool = KVPool(3, eviction=ev)
    ids = pool.try_allocate(3)
    assert ids is not None
    for b, h in zip(ids, (10, 11, 12), strict=True):
        pool.commit(b, h)
    pool.free(ids)  # tail first: 12, 11, 10 in eviction order at equal scores
    assert pool.try_allocate(1) is not None  # scores all three, evicts 12
    assert not pool.holds(12) and pool.holds(11)
    scores[11] = 0.0
    ev.rescore_hashes([11, 12, 99])  # 12 is gone and 99 never was: ignored
    assert pool.try_allocate(1) is not None
    assert pool.holds(11) and not pool.holds(10)  # 11 now outranks 10
    pool.check_integrity()


def test_an_import_queues_its_blocks_tail_first_and_unused() -> None:
    pool = make_pool(8)
    assert pool.import_cached([7, 8, 9]) == 3
    assert isinstance(pool.eviction, LRUEviction)
    assert pool.eviction.order() == [pool.block_of(h) for h in (9, 8, 7)]
    assert pool.num_used_blocks == 0
    pool.check_integrity()


@pytest.mark.parametrize("strategy", ["lru", "tiered"])
def test_freeing_a_held_block_no_one_reads_names_it(strategy: str) -> None:
    # the shared head of a held prefix is released in one pass; a block in it that no one
    # reads any more is a double free, named before any count changes
    ev = LRUEviction() if strategy == "lru" else TieredEviction(lambda h: -1.0, (-1.0, 0.0))
    pool = KVPool(8, eviction=ev)
    ids = pool.try_allocate(3)
    assert ids is not None
    pool.commit_many(ids, [11, 12, 13])
    pool.free(ids[:1], held_hashes=[11])
    assert pool.ref_count(ids[0]) == 0
    with pytest.raises(ValueError, match=f"free of block {ids[0]} with ref count 0"):
        pool.free(ids, held_hashes=[11, 12, 13])
    assert [pool.ref_count(b) for b in ids] == [0, 1, 1]
    pool.acquire_cached([11])
    pool.acquire_cached([11, 12])
    pool.free(ids, held_hashes=[11, 12, 13])  # a shared head (2, 2) before the held tail
    assert [pool.ref_count(b) for b in ids] == [1, 1, 0]
    pool.check_integrity()
