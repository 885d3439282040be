from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.host_tier import HostTier


class _Held:
    """A listener that keeps the set of hashes it was told are held."""

    def __init__(self) -> None:
        self.held: set[int] = set()

    def on_host(self, block_hash: int, present: bool) -> None:
        if present:
            self.held.add(block_hash)
        else:
            self.held.discard(block_hash)

    def on_host_many(self, block_hashes: Sequence[int], present: bool) -> None:
        for h in block_hashes:
            self.on_host(h, present)


def make_tier(capacity_blocks: int) -> tuple[HostTier, _Held]:
    tier, held = HostTier(capacity_blocks), _Held()
    tier.listener = held
    return tier, held


def test_store_many_past_capacity_evicts_what_it_stored_first() -> None:
    tier, held = make_tier(2)
    tier.store_many([1, 2, 3, 1])
    assert tier.hashes() == [3, 1]
    assert held.held == {1, 3}
    assert (tier.num_offloaded, tier.num_evicted) == (4, 2)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 4),
    st.lists(st.lists(st.integers(0, 8), max_size=10), max_size=8),
)
def test_store_many_is_store_in_turn(capacity: int, batches: list[list[int]]) -> None:
    one, held_one = make_tier(capacity)
    many, held_many = make_tier(capacity)
    for batch in batches:
        for h in batch:
            one.store(h)
        many.store_many(batch)
        assert many.hashes() == one.hashes()
        assert held_many.held == held_one.held == set(one.hashes())
        assert (many.num_offloaded, many.num_evicted) == (one.num_offloaded, one.num_evicted)


class _Calls:
    """A listener that logs every call it gets, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], bool]] = []

    def on_host(self, block_hash: int, present: bool) -> None:
        self.calls.append(([block_hash], present))

    def on_host_many(self, block_hashes: Sequence[int], present: bool) -> None:
        self.calls.append((list(block_hashes), present))


def test_store_many_tells_what_left_then_what_came_in_each_in_order() -> None:
    # the lists a faster store_many must keep: an eviction's offloads into a full tier
    # evict the oldest copies first; a hash held already is refreshed, not stored
    tier, calls = HostTier(4), _Calls()
    tier.listener = calls
    tier.store_many([1, 2, 3])
    tier.store_many([5, 6, 7])
    assert tier.hashes() == [3, 5, 6, 7]
    assert calls.calls == [([1, 2, 3], True), ([1, 2], False), ([5, 6, 7], True)]
    assert (tier.num_offloaded, tier.num_evicted) == (6, 2)
    tier.store_many([7, 8])
    assert tier.hashes() == [5, 6, 7, 8]
    assert calls.calls[3:] == [([3], False), ([8], True)]
