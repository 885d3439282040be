"""Tiered eviction: the lowest tier first, entry order inside a tier, lazy scoring."""

from collections import OrderedDict
from collections.abc import Callable

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evinfra.core import tiered_eviction
from evinfra.core.eviction import LRUEviction, ScoredEviction
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


def test_a_run_scored_into_one_tier_moves_there_whole() -> None:
    """A freed context whose blocks all score active enters the active tier as one run,
    untouched: taking the context up again is one `remove_run`, not a removal per block."""

    def tier(h: int) -> float:
        return -1.0 if h < 40 else -2.0

    def score_run(hashes: list[int]) -> list[float]:
        return list(map(tier, hashes))

    ev = TieredEviction(tier, TIERS, score_run)
    words = [0] * 64
    ev.bind_blocks(words)
    ev.add_many(list(range(40)), list(range(40)))
    ev.add_many([40, 41], [40, 41])
    assert ev.pop_many(2) == [40, 41]
    assert ev.num_scored == 42
    assert ev.order() == list(range(40)) and ev.run_at(0) == 40
    ev.remove_run(0)
    assert len(ev) == 0


def test_a_scored_run_whose_tier_rises_moves_whole_when_few_victims_are_wanted() -> None:
    """The head run of the lowest scored tier, its session back (a higher tier now),
    moves up whole even when `pop_many` wants fewer blocks than a read: it stays one
    untouched run, and the run scorer reads it in a few doubling parts."""
    tier_of = {h: -1.0 for h in range(51)} | {60: -2.0}
    num_reads = [0]

    def score_run(hashes: list[int]) -> list[float]:
        num_reads[0] += 1
        return [tier_of[h] for h in hashes]

    ev = TieredEviction(tier_of.__getitem__, TIERS, score_run)
    ev.bind_blocks([0] * 64)
    ev.add_many(list(range(40)), list(range(40)))
    ev.add_many([50], [50])
    ev.add_many([60], [60])
    assert ev.pop_many(1) == [60]
    tier_of.update({h: 0.0 for h in range(40)})  # the session came back
    num_reads[0] = 0
    assert ev.pop_many(1) == [50]
    assert ev.run_at(0) == 40 and ev.order() == list(range(40))
    assert num_reads[0] <= 8


def test_unknown_score_and_bad_tiers_are_errors() -> None:
    with pytest.raises(ValueError, match="ascending"):
        TieredEviction(lambda h: 0.0, (0.0, -1.0))
    ev = TieredEviction(lambda h: 5.0, TIERS)
    ev.add(1, 1)
    with pytest.raises(ValueError, match="not one of the tiers"):
        ev.pop()


class OneAtATime:
    """The order `TieredEviction` keeps, written plainly as first designed: an ordered
    dict of unscored blocks and one per tier, each pop reading blocks one at a time
    (the reference for the batched reads and the whole-run moves)."""

    def __init__(self, score: Callable[[int], float]) -> None:
        self.score = score
        self.pending: OrderedDict[int, int] = OrderedDict()
        self.tiers: list[OrderedDict[int, int]] = [OrderedDict() for _ in TIERS]
        self.num_scored = 0

    def tier(self, block_hash: int) -> int:
        self.num_scored += 1
        return TIERS.index(self.score(block_hash))

    def add_many(self, ids: list[int], hashes: list[int]) -> None:
        self.pending.update(zip(ids, hashes, strict=True))

    def remove_many(self, ids: list[int]) -> None:
        for b in ids:
            self.pending.pop(b, None)
            for tier in self.tiers:
                tier.pop(b, None)

    def pop(self) -> int | None:
        floor, just_scored = self.tiers[0], None
        while True:
            while not floor and self.pending:
                just_scored, block_hash = self.pending.popitem(last=False)
                index = self.tier(block_hash)
                if not index:
                    return just_scored
                self.tiers[index][just_scored] = block_hash
            lowest = next(filter(None, self.tiers), None)
            if lowest is None:
                return None
            block_id, block_hash = next(iter(lowest.items()))
            del lowest[block_id]
            if block_id != just_scored:
                index = self.tier(block_hash)
                if self.tiers[index] is not lowest:
                    self.tiers[index][block_id] = block_hash
                    continue
            return block_id

    def rescore(self, ids: list[int]) -> None:
        for b in ids:
            for tier in self.tiers:
                if b in tier:
                    index = self.tier(tier[b])
                    if self.tiers[index] is not tier:
                        self.tiers[index][b] = tier.pop(b)
                    break

    def order(self) -> list[int]:
        later: list[list[int]] = [[] for _ in TIERS]
        for b, h in self.pending.items():
            later[TIERS.index(self.score(h))].append(b)
        return [b for tier, more in zip(self.tiers, later, strict=True) for b in [*tier, *more]]

    def __len__(self) -> int:
        return len(self.pending) + sum(map(len, self.tiers))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add_many", "remove", "pop", "pop_many", "retier", "rescore"]),
            st.integers(0, 39),
            st.sampled_from(TIERS),
            st.integers(1, 12),
        ),
        max_size=120,
    ),
    st.integers(1, 4),
    st.booleans(),
)
def test_batched_reads_pop_as_one_at_a_time_while_tiers_change(
    ops: list[tuple[str, int, float, int]], batch: int, by_runs: bool
) -> None:
    """Tiers change between pops (sessions come and go): reading unscored blocks a few
    at a time (and scoring them together, `by_runs`) evicts, scores and orders exactly
    as taking them one by one; so does `pop_many`, as that many pops in a row."""
    check_against_one_at_a_time(ops, batch, by_runs, 40)


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add_many", "pop", "pop_many", "pop_many", "retier", "retier"]),
            st.integers(0, 7),
            st.sampled_from(TIERS),
            st.integers(1, 8),
        ),
        max_size=60,
    ),
    st.integers(1, 4),
    st.booleans(),
)
# a scored head that moved down is read again by the pop that takes it
@example([("retier", 2, -2.0, 1), ("pop_many", 0, -1.0, 3)], 4, False)
# the unscored run out right after a victim: the next pop reads the tier's head again
@example(
    [
        ("pop_many", 0, -1.0, 5),
        ("retier", 7, -2.0, 1),
        ("add_many", 6, -1.0, 2),
        ("pop_many", 0, -1.0, 3),
    ],
    4,
    False,
)
def test_pop_many_as_pops_in_a_row_on_few_blocks(
    ops: list[tuple[str, int, float, int]], batch: int, by_runs: bool
) -> None:
    """Few blocks, many tier changes: `pop_many` meets scored tiers whose heads moved up
    or down since they were read, and unscored blocks running out mid-pop."""
    start = [("add_many", 0, -1.0, 6), ("pop", 0, -1.0, 1)]  # five blocks scored active
    check_against_one_at_a_time(start + ops, batch, by_runs, 8)


def check_against_one_at_a_time(
    ops: list[tuple[str, int, float, int]], batch: int, by_runs: bool, num_ids: int
) -> None:
    tier = dict.fromkeys(range(num_ids), -1.0)
    reads: list[list[int]] = [[], []]

    def scorer(side: int):  # type: ignore[no-untyped-def]
        def score(h: int) -> float:
            reads[side].append(h)
            return tier[h]

        return score

    words = [0] * num_ids

    def score_run(hashes: list[int]) -> list[float]:
        return [tier[h] for h in hashes]

    batched = TieredEviction(scorer(0), TIERS, score_run if by_runs else None)
    reference = OneAtATime(scorer(1))
    batched.bind_blocks(words)
    held: set[int] = set()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tiered_eviction, "_SCORE_BATCH", batch)
        for op, b, score, length in ops:
            if op == "add_many":
                run = [x for x in range(b, min(b + length, num_ids)) if x not in held]
                for ev in (batched, reference):
                    ev.add_many(run, run)
                held.update(run)
            elif op == "remove":
                run = [x for x in range(b, min(b + length, num_ids)) if x in held]
                for ev in (batched, reference):
                    ev.remove_many(run)
                for x in run:
                    words[x] = 0  # the owner overwrites the words of blocks taken out
                held.difference_update(run)
            elif op == "pop":
                victim = reference.pop()
                assert batched.pop() == victim
                held.discard(-1 if victim is None else victim)
            elif op == "pop_many":
                victims: list[int] = []
                while len(victims) < length:
                    victim = reference.pop()
                    if victim is None:
                        break
                    victims.append(victim)
                assert batched.pop_many(length) == victims
                held.difference_update(victims)
            elif op == "retier":
                tier[b] = score
            else:
                for ev in (batched, reference):
                    ev.rescore([b, (b + 1) % num_ids, b])
            assert reads[0] == reads[1] or by_runs  # a run scorer reads ahead (unrecorded)
            assert batched.order() == reference.order()
            assert len(batched) == len(reference) == len(held)
            assert batched.num_scored == reference.num_scored
            batched._queue.check_integrity()


@pytest.mark.parametrize("make", [LRUEviction, lambda: ScoredEviction(lambda h: float(h % 3))])
def test_pop_many_is_pops_in_a_row(make) -> None:  # type: ignore[no-untyped-def]
    one, many = make(), make()
    for ev in (one, many):
        ev.add_many(list(range(10)), list(range(10)))
    assert many.pop_many(4) == [one.pop() for _ in range(4)]
    assert many.pop_many(9) == [one.pop() for _ in range(6)]
    assert many.pop_many(2) == [] and one.pop() is None
