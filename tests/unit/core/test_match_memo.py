"""The remembered prefix match of a prompt (KVPool and GlobalBlockIndex) must equal a fresh
walk after every change that can alter a match: allocate and commit, free, eviction,
drop, offload and prefetch (tier moves), import, host stores and their evictions, clear."""

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.global_index import GlobalBlockIndex
from evinfra.core.kv_pool import KVPool, PrefixMatch

PROMPT = tuple(range(0, 14))
OTHER = tuple(range(4, 18))


def spy_walk_starts(pool: KVPool) -> list[int]:
    """Where each of `pool`'s prefix walks from now on starts (0: the prompt's first hash)."""
    starts: list[int] = []
    walk = pool._match

    def spy(hashes: Sequence[int], limit: int | None, start: int = 0) -> PrefixMatch:
        starts.append(start)
        return walk(hashes, limit, start)

    pool._match = spy  # type: ignore[method-assign]
    return starts


def make_pools(num_nodes: int = 2) -> tuple[list[KVPool], GlobalBlockIndex]:
    pools = [KVPool(8, 4) for _ in range(num_nodes)]
    index = GlobalBlockIndex(num_nodes)
    for i, pool in enumerate(pools):
        index.attach(pool, i)
    return pools, index


def committed(pool: KVPool, num_blocks: int) -> list[int]:
    """Allocate `num_blocks` and commit them as PROMPT's first blocks."""
    ids = pool.try_allocate(num_blocks)
    assert ids is not None
    for block_id, h in zip(ids, PROMPT[:num_blocks], strict=True):
        pool.commit(block_id, h)
    return ids


def test_a_repeated_match_does_not_walk_the_prompt_again() -> None:
    pool = KVPool(8, 4)
    committed(pool, 3)
    first = pool.match_prefix(PROMPT)

    def walk(hashes: Sequence[int], limit: int | None, start: int = 0) -> PrefixMatch:
        raise AssertionError("walked the prompt again")

    pool._match = walk  # type: ignore[method-assign]
    assert pool.match_prefix(PROMPT) == first == PrefixMatch(3, 0)
    assert pool.match_prefix(PROMPT, 2) == PrefixMatch(2, 0)
    with pytest.raises(AssertionError, match="walked"):
        pool.commit(pool.try_allocate(1)[0], 99)  # type: ignore[index]
        pool.match_prefix(PROMPT)


def test_free_alone_keeps_the_match_and_eviction_changes_it() -> None:
    pool = KVPool(3, 0)
    ids = committed(pool, 3)
    key = pool.match_key
    pool.free(ids)  # reference counts only: the blocks stay indexed
    assert pool.match_key == key
    assert pool.match_prefix(PROMPT) == PrefixMatch(3, 0)
    pool.try_allocate(1)  # evicts the tail
    assert pool.match_key != key
    assert pool.match_prefix(PROMPT) == PrefixMatch(2, 0)


def test_tier_moves_change_the_match() -> None:
    pool = KVPool(4, 4)
    ids = committed(pool, 3)
    pool.free(ids)
    assert pool.match_prefix(PROMPT) == PrefixMatch(3, 0)
    assert pool.offload(PROMPT[1:3]) == 2  # to host
    assert pool.match_prefix(PROMPT) == PrefixMatch(1, 2)
    assert pool.prefetch(PROMPT[1:2]) == 1  # one back to device
    assert pool.match_prefix(PROMPT) == PrefixMatch(2, 1)
    pool.drop(PROMPT[2:3])  # the host copy goes
    assert pool.match_prefix(PROMPT) == PrefixMatch(2, 0)
    pool.store_host(PROMPT[2])
    assert pool.match_prefix(PROMPT) == PrefixMatch(2, 1)
    pool.clear()
    assert pool.match_prefix(PROMPT) == PrefixMatch(0, 0)
    assert pool.import_cached(PROMPT[:2]) == 2
    assert pool.match_prefix(PROMPT) == PrefixMatch(2, 0)


def test_a_pool_that_only_gained_content_walks_only_past_the_old_match() -> None:
    pool = KVPool(8, 4)
    ids = pool.try_allocate(4)
    assert ids is not None
    for block_id, h in zip(ids[:2], PROMPT[:2], strict=True):
        pool.commit(block_id, h)
    assert pool.match_prefix(PROMPT) == PrefixMatch(2, 0)
    starts = spy_walk_starts(pool)
    pool.commit(ids[2], PROMPT[2])
    pool.commit(ids[3], 99)
    assert pool.match_prefix(PROMPT) == PrefixMatch(3, 0)
    pool.free(ids)
    pool.drop([99])  # a loss: the whole prompt is walked again
    assert pool.match_prefix(PROMPT) == PrefixMatch(3, 0)
    assert starts == [2, 0]


def test_after_a_loss_an_untouched_freed_run_is_not_walked_again() -> None:
    # chained hashes of a session's context: its freed run proves its blocks still held
    pool = KVPool(12, 0)
    other = pool.try_allocate(6)
    assert other is not None
    pool.commit_many(other, (50, 51, 52, 53, 54, 55))
    pool.free(other)  # the oldest candidates
    context = PROMPT[:6]
    ids = pool.try_acquire_and_allocate((), 6)
    assert ids is not None
    pool.commit_many(ids, context)
    pool.free(ids)
    prompt = PROMPT[:8]  # the next call: the context and two new blocks
    assert pool.match_prefix(prompt) == PrefixMatch(6, 0)
    pool.try_allocate(1)  # evicts 55 (LRU: the other run's tail): the match is stale
    walk = pool._match
    starts = spy_walk_starts(pool)
    assert pool.match_prefix(prompt) == PrefixMatch(6, 0) == walk(list(prompt), None)
    assert starts == [6]  # walked only past the run
    pool.drop(context[4:5])  # a block of the run lost: the run is touched, walked again
    assert pool.match_prefix(prompt) == PrefixMatch(4, 0) == walk(list(prompt), None)
    assert starts == [6, 0]


def test_a_freed_run_proves_nothing_past_a_lost_head() -> None:
    pool = KVPool(12, 0)
    head = pool.try_acquire_and_allocate((), 2)  # still read by another sequence
    assert head is not None
    pool.commit_many(head, PROMPT[:2])
    ids = pool.try_acquire_and_allocate(PROMPT[:2], 4)
    assert ids is not None
    pool.commit_many(ids[2:], PROMPT[2:6])
    pool.free(ids)  # a freed run of blocks 2-5 after a head in use
    pool.free(head)
    prompt = PROMPT[:8]
    assert pool.match_prefix(prompt) == PrefixMatch(6, 0)
    pool.drop(PROMPT[:1])  # the head's first block: the run is untouched, the head is not
    assert pool.match_prefix(prompt) == PrefixMatch(0, 0)


def test_truncated_match_is_the_match_of_the_prefix() -> None:
    m = PrefixMatch(3, 2)
    assert [m.truncated(k) for k in range(7)] == [
        PrefixMatch(0, 0),
        PrefixMatch(1, 0),
        PrefixMatch(2, 0),
        PrefixMatch(3, 0),
        PrefixMatch(3, 1),
        PrefixMatch(3, 2),
        PrefixMatch(3, 2),
    ]


ops = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.sampled_from(
            ["alloc", "free", "drop", "offload", "prefetch", "import", "store_host", "clear"]
        ),
        st.integers(0, 13),
        st.integers(1, 5),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_remembered_matches_equal_a_fresh_walk_after_any_operations(
    seq: list[tuple[int, str, int, int]],
) -> None:
    pools, index = make_pools()
    held: list[list[list[int]]] = [[], []]
    for node, op, a, b in seq:
        pool = pools[node]
        hashes = list(range(a, a + b))
        if op == "alloc":  # a sequence: its cached prefix, then new blocks (may evict)
            m = pool.match_prefix(hashes)
            n = b - m.num_device_blocks
            ids = pool.try_acquire_and_allocate(hashes[: m.num_device_blocks], n)
            if ids is None:
                continue
            k = m.num_device_blocks
            for blk, h in zip(ids[k:], hashes[k:], strict=True):
                pool.commit(blk, h)
            held[node].append(ids)
        elif op == "free" and held[node]:
            pool.free(held[node].pop(a % len(held[node])))
        elif op == "drop":
            pool.drop(hashes)
        elif op == "offload":
            pool.offload(hashes)
        elif op == "prefetch":
            pool.prefetch(hashes)
        elif op == "import":
            pool.import_cached(hashes)
        elif op == "store_host":
            for h in hashes:
                pool.store_host(h)
        elif op == "clear" and not held[node]:
            pool.clear()
        pool.check_integrity()
        for p in pools:  # another prompt remembered alongside
            assert p.match_prefix(OTHER) == p.match_prefix(list(OTHER))
        fresh = [p.match_prefix(list(PROMPT)) for p in pools]  # lists are never remembered
        assert index.match_all(PROMPT) == fresh
        assert index.match_all(PROMPT) == fresh  # remembered
        for i, p in enumerate(pools):
            assert index.last_match(PROMPT, i) == fresh[i]
            assert p.match_prefix(PROMPT) == fresh[i]
            assert p.match_prefix(PROMPT) == fresh[i]  # remembered
            for limit in (0, a, len(PROMPT) - 1):
                assert p.match_prefix(PROMPT, limit) == p.match_prefix(list(PROMPT[:limit]))
        # a match adopted from the index is the pool's own
        pools[1 - node].adopt_match(PROMPT, fresh[1 - node])
        assert pools[1 - node].match_prefix(PROMPT) == fresh[1 - node]


def test_last_match_is_forgotten_when_any_pool_changes() -> None:
    pools, index = make_pools()
    index.match_all(PROMPT)
    assert index.last_match(PROMPT, 0) == PrefixMatch(0, 0)
    assert index.last_match(tuple(PROMPT), 0) is not None  # the same tuple object
    assert index.last_match(PROMPT[:3], 0) is None  # another prompt
    ids = pools[1].try_allocate(1)
    assert ids is not None
    pools[1].commit(ids[0], PROMPT[0])
    assert index.last_match(PROMPT, 0) is None
    assert index.match_all(PROMPT) == [PrefixMatch(0, 0), PrefixMatch(1, 0)]
