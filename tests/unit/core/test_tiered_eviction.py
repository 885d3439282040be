"""Tiered eviction: the lowest tier first, entry order inside a tier, lazy scoring."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.eviction import ScoredEviction
from evinfra.core.tiered_eviction import TieredEviction

TIERS = (-2.0, -1.0, 0.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "add_many", "remove", "pop"]), st.integers(0, 30)),
        max_size=100,
    ),
    st.lists(st.sampled_from(TIERS), min_size=40, max_size=40),
)
def test_static_tiers_evict_as_lowest_score_then_lru(
    ops: list[tuple[str, int]], tiers: list[float]
) -> None:
    """With scores that do not change, the order is ScoredEviction's: lowest score, then
    the order blocks were freed."""
    tiered = TieredEviction(lambda h: tiers[h], TIERS)
    scored = ScoredEviction(lambda h: tiers[h])
    held: set[int] = set()
    for op, b in ops:
        if op == "add" and b not in held:
            tiered.add(b, b)
            scored.add(b, b)
            held.add(b)
        elif op == "add_many":
            run = [x for x in range(b, min(b + 5, 40)) if x not in held]
            tiered.add_many(run, run)
            scored.add_many(run, run)
            held.update(run)
        elif op == "remove":
            tiered.remove(b)
            scored.remove(b)
            held.discard(b)
        elif op == "pop":
            victim = scored.pop()
            assert tiered.pop() == victim
            held.discard(-1 if victim is None else victim)
        assert len(tiered) == len(scored) == len(held)
        assert all(x in tiered for x in held)
    assert tiered.num_scored <= scored.num_scored


def test_lowest_tier_candidate_wins_without_scoring_newer_blocks() -> None:
    reads: list[int] = []
    tier = {1: -1.0, 2: -2.0, 3: -2.0}

    def score(h: int) -> float:
        reads.append(h)
        return tier.get(h, 0.0)

    ev = TieredEviction(score, TIERS)
    for b in (1, 2, 3):
        ev.add(b, b)
    assert ev.pop() == 2  # 1 scored (active), 2 scored (away: stop); 3 stays unscored
    assert reads == [1, 2]
    for b in range(10, 50):
        ev.add(b, b)
    reads.clear()
    assert ev.pop() == 3  # no away block scored: 3 scored next (away), wins at once
    assert reads == [3]
    assert ev.order()[0] == 1  # then the active one, then the 40 shared


def test_rescore_moves_a_block_to_the_end_of_its_new_tier_and_pop_revalidates() -> None:
    tier = dict.fromkeys(range(6), -1.0)
    ev = TieredEviction(lambda h: tier[h], TIERS)
    ev.add_many(list(range(6)), list(range(6)))
    ev.pop()  # scores all six (none away), evicts 0
    tier[1] = 0.0  # its session turned shared
    tier[4] = -2.0  # its session left
    ev.rescore([1, 4, 99])
    assert ev.order() == [4, 2, 3, 5, 1]
    assert len(ev) == 5  # counted, not summed over the tiers: moves keep the count
    tier[4] = 0.0  # came back before the eviction: the pop reads it again
    assert ev.pop() == 2
    assert ev.order() == [3, 5, 1, 4]  # 4 entered the shared tier after 1
    assert len(ev) == 4
    ev.remove(5)
    ev.remove(5)
    assert len(ev) == 3


def test_unknown_score_and_bad_tiers_are_errors() -> None:
    with pytest.raises(ValueError, match="ascending"):
        TieredEviction(lambda h: 0.0, (0.0, -1.0))
    ev = TieredEviction(lambda h: 5.0, TIERS)
    ev.add(1, 1)
    with pytest.raises(ValueError, match="not one of the tiers"):
        ev.pop()
