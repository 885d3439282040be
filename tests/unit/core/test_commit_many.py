"""Committing a run of blocks at once (`KVPool.commit_many`, the global index's
`on_device_many`, `Sequence.known_hashes_between`) leaves the same state as committing
them one by one."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.global_index import GlobalBlockIndex
from evinfra.core.kv_pool import KVPool
from evinfra.core.sequence import Sequence
from evinfra.core.types import Request


def make_pool_in_index(num_blocks: int = 24) -> tuple[KVPool, GlobalBlockIndex]:
    pool = KVPool(num_blocks, 4)
    index = GlobalBlockIndex(2)
    index.attach(pool, 1)
    return pool, index


def state(pool: KVPool, index: GlobalBlockIndex) -> tuple[object, ...]:
    pool.check_integrity()
    hashes = sorted(pool.cached_hashes())
    return (
        [pool.block_of(h) for h in hashes],
        [index.nodes_holding(h) for h in range(40)],
        pool.match_key,
    )


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(0, 30), min_size=1, max_size=12),
    st.lists(st.integers(0, 30), max_size=6),
)
def test_commit_many_equals_commits_in_order(hashes: list[int], earlier: list[int]) -> None:
    """Duplicates inside the run and hashes already held elsewhere stay private, as with
    `commit`; the index hears of exactly the hashes indexed."""
    one, one_index = make_pool_in_index()
    many, many_index = make_pool_in_index()
    for pool in (one, many):
        held = pool.try_allocate(len(earlier))
        assert held is not None
        for block_id, h in zip(held, earlier, strict=True):
            pool.commit(block_id, h)
    ids_one = one.try_allocate(len(hashes))
    ids_many = many.try_allocate(len(hashes))
    assert ids_one is not None and ids_many is not None and ids_one == ids_many
    results = [one.commit(b, h) for b, h in zip(ids_one, hashes, strict=True)]
    assert many.commit_many(ids_many, hashes) == sum(results)
    assert state(one, one_index) == state(many, many_index)
    assert [many.hash_of(b) for b in ids_many] == [one.hash_of(b) for b in ids_one]


def test_commit_many_rejects_a_block_not_in_use() -> None:
    pool, _ = make_pool_in_index()
    ids = pool.try_allocate(2)
    assert ids is not None
    pool.free(ids[1:])
    with pytest.raises(ValueError, match="not in use"):
        pool.commit_many(ids, [5, 6])


def test_on_device_many_sets_and_clears_bits() -> None:
    index = GlobalBlockIndex(3)
    a, b = index.listener(0), index.listener(2)
    a.on_device_many([7, 8, 7], True)
    b.on_device_many([8], True)
    assert [index.nodes_holding(h) for h in (7, 8)] == [[0], [0, 2]]
    version = index.version
    a.on_device_many([8, 7], False)
    assert [index.nodes_holding(h) for h in (7, 8)] == [[], [2]]
    assert index.version != version


def test_known_hashes_between_stops_at_the_first_unknown_output() -> None:
    request = Request(1, (11, 12, 13), 3 * 4, 8, output_hashes=(21,))
    seq = Sequence(request)
    assert list(seq.known_hashes_between(1, 3)) == [12, 13]
    assert list(seq.known_hashes_between(2, 6)) == [13, 21]
    assert list(seq.known_hashes_between(4, 6)) == []
    seq.output_hashes.append(22)
    assert list(seq.known_hashes_between(0, 6)) == [11, 12, 13, 21, 22]
    assert list(seq.known_hashes_between(3, 5)) == [21, 22]
