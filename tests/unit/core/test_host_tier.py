from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.host_tier import HostTier


class _Changes:
    """Counts the tier's change calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> None:
        self.calls += 1


def make_tier(capacity_blocks: int) -> tuple[HostTier, _Changes]:
    tier, changes = HostTier(capacity_blocks), _Changes()
    tier.on_change = changes
    return tier, changes


def test_store_many_past_capacity_evicts_what_it_stored_first() -> None:
    tier, changes = make_tier(2)
    tier.store_many([1, 2, 3, 1])
    assert tier.hashes() == [3, 1]
    assert (tier.num_offloaded, tier.num_evicted) == (4, 2)
    assert changes.calls == 1


def test_a_refresh_is_no_change_and_a_full_tier_evicts_the_oldest() -> None:
    tier, changes = make_tier(4)
    tier.store_many([1, 2, 3])
    tier.store_many([5, 6, 7])
    assert tier.hashes() == [3, 5, 6, 7]
    assert (tier.num_offloaded, tier.num_evicted, changes.calls) == (6, 2, 2)
    tier.store_many([7, 5])  # held: only the order moves
    tier.touch([3])
    assert tier.hashes() == [6, 7, 5, 3]
    assert changes.calls == 2
    assert tier.drop([9]) == 0 and changes.calls == 2
    assert tier.drop([6, 9]) == 1 and changes.calls == 3
    tier.clear()
    tier.clear()
    assert (tier.hashes(), changes.calls) == ([], 4)


def test_an_empty_tier_holds_nothing_and_never_changes() -> None:
    tier, changes = make_tier(0)
    tier.store_many([1, 2])
    tier.store(3)
    assert (tier.hashes(), tier.num_offloaded, changes.calls) == ([], 0, 0)


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 4),
    st.lists(st.lists(st.integers(0, 8), max_size=10), max_size=8),
)
def test_store_many_is_store_in_turn(capacity: int, batches: list[list[int]]) -> None:
    one, _ = make_tier(capacity)
    many, changes = make_tier(capacity)
    for batch in batches:
        before = (many.hashes(), many.num_offloaded, changes.calls)
        for h in batch:
            one.store(h)
        many.store_many(batch)
        assert many.hashes() == one.hashes()
        assert (many.num_offloaded, many.num_evicted) == (one.num_offloaded, one.num_evicted)
        assert len(many) <= capacity
        # told once when a copy came in (and so, when full, one left), else never
        stored = many.num_offloaded > before[1]
        assert changes.calls == before[2] + stored
        if set(many.hashes()) != set(before[0]):
            assert stored
