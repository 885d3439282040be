"""SeenHashes answers as a set of the same hashes would, across its merges."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import evinfra.sim.seen_hashes as seen_hashes
from evinfra.sim.seen_hashes import SeenHashes

HASH = st.integers(min_value=0, max_value=(1 << 63) - 1)
# few distinct values so that batches repeat each other and themselves
SMALL = st.integers(min_value=0, max_value=40) | HASH


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.booleans(), st.lists(SMALL, max_size=12)),
        max_size=60,
    ),
    min_merge=st.sampled_from([1, 2, 5, 1 << 16]),
    filter_bits=st.sampled_from([1, 2, 8]),
)
def test_agrees_with_a_set(
    steps: list[tuple[bool, list[int]]], min_merge: int, filter_bits: int
) -> None:
    old = seen_hashes.MIN_MERGE, seen_hashes.MIN_FILTER_BYTES, seen_hashes.FILTER_BITS_PER_HASH
    # small: merges every few updates, a filter that starts at 8 bits and grows, and at one
    # bit a hash most misses pass it (the binary search must still answer no)
    seen_hashes.MIN_MERGE, seen_hashes.MIN_FILTER_BYTES = min_merge, 1
    seen_hashes.FILTER_BITS_PER_HASH = filter_bits
    try:
        seen = SeenHashes()
        model: set[int] = set()
        for is_update, values in steps:
            if is_update:
                seen.update(values)
                model.update(values)
            assert seen.count_in(values) == sum(1 for v in values if v in model)
            assert all((v in seen) == (v in model) for v in values)
            assert seen.num_distinct() == len(model)
            assert bool(np.all(np.diff(seen._sorted) > 0))  # merges keep one copy
            bits = np.frombuffer(seen._bits, dtype=np.uint8)
            for h in seen._sorted.tolist():  # every held hash has its bit
                i = h & seen._mask
                assert bits[i >> 3] >> (i & 7) & 1
        assert (-1 in seen) is False and ("x" in seen) is False
    finally:
        seen_hashes.MIN_MERGE, seen_hashes.MIN_FILTER_BYTES, seen_hashes.FILTER_BITS_PER_HASH = old


def test_merges_into_the_sorted_array() -> None:
    seen = SeenHashes()
    values = list(range(3 * seen_hashes.MIN_MERGE))
    for i in range(0, len(values), 1000):
        seen.update(values[i : i + 1000])
        # the newest stay in the set only until they reach the merge bound
        assert len(seen._recent) < max(seen_hashes.MIN_MERGE, len(seen._sorted) >> 3)
    assert seen.num_distinct() == len(values) and len(seen._sorted) >= 2 * seen_hashes.MIN_MERGE
    assert seen.count_in([0, len(values) - 1, len(values)]) == 2
