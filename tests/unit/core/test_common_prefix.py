"""common_prefix_len's C-level slice comparisons agree with a walk, on tuples and lists."""

from hypothesis import given
from hypothesis import strategies as st

from evinfra.core.blocks import common_prefix_len


def walk(a: list[int], b: list[int]) -> int:
    i = 0
    while i < min(len(a), len(b)) and a[i] == b[i]:
        i += 1
    return i


@given(
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.integers(0, 3), max_size=40),
    st.lists(st.integers(0, 3), max_size=40),
)
def test_agrees_with_a_walk(shared: list[int], a_tail: list[int], b_tail: list[int]) -> None:
    a, b = shared + a_tail, shared + b_tail
    expected = walk(a, b)
    assert common_prefix_len(a, b) == expected
    assert common_prefix_len(tuple(a), tuple(b)) == expected
    assert common_prefix_len(tuple(a), b) == expected  # mixed types walk
    assert common_prefix_len(range(len(a)), list(range(len(b)))) == min(len(a), len(b))
