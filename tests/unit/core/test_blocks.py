from evinfra.core.blocks import (
    Segment,
    common_prefix_len,
    hash_segment_blocks,
    hash_token_blocks,
)


def test_token_hashes_are_chained() -> None:
    a = hash_token_blocks([1, 2, 3, 4, 5, 6, 7], 2)
    b = hash_token_blocks([9, 2, 3, 4, 5, 6], 2)
    assert len(a) == 3 and len(b) == 3
    # same block content after a different parent: different hash
    assert a[1] != b[1]
    assert hash_token_blocks([1, 2, 3, 4], 2) == a[:2]


def test_segment_hashes_match_at_any_split() -> None:
    whole, n = hash_segment_blocks([Segment(1, 10), Segment(2, 6)], 4)
    assert n == 16 and len(whole) == 4
    longer, _ = hash_segment_blocks([Segment(1, 10), Segment(2, 6), Segment(3, 5)], 4)
    assert longer[:4] == whole
    cut, _ = hash_segment_blocks([Segment(1, 10), Segment(4, 6)], 4)
    # the first two blocks hold only segment 1; the third mixes 1 and 4
    assert common_prefix_len(whole, cut) == 2
