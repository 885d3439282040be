"""Blocks with chained prefix hashes.

A block's hash covers its parent's hash and its own content, so equal hashes mean equal
prefixes. Content is either real token ids (the servers) or *segments*: runs of virtual
tokens named by a content id (the simulator and the trace loaders), which hash the same
way without materialising tokens. Python's `hash` of a tuple of ints is deterministic
across processes (PYTHONHASHSEED only salts str and bytes), so hashes are stable.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

ROOT_HASH = 0x5EED
_MASK = (1 << 63) - 1

_T = TypeVar("_T")


def chain_hash(parent_hash: int, content: tuple[int, ...]) -> int:
    """The hash of a block whose parent has `parent_hash` and whose content is `content`."""
    return hash((parent_hash, content)) & _MASK


def hash_token_blocks(
    token_ids: Sequence[int], block_size: int, parent_hash: int = ROOT_HASH
) -> list[int]:
    """Chained hashes of the full blocks of `token_ids`; a partial tail block is not hashed."""
    hashes: list[int] = []
    h = parent_hash
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        h = chain_hash(h, tuple(token_ids[start : start + block_size]))
        hashes.append(h)
    return hashes


@dataclass(frozen=True, slots=True)
class Segment:
    """A run of `num_tokens` virtual tokens; token i of it is (content_id, i)."""

    content_id: int
    num_tokens: int


def hash_segment_blocks(
    segments: Iterable[Segment], block_size: int, parent_hash: int = ROOT_HASH
) -> tuple[list[int], int]:
    """Chained hashes of the full blocks of a sequence of segments, and its token count.

    A block's content is the list of (content_id, start, end) runs it covers, so the cost
    is per block and per segment, never per token.
    """
    hashes: list[int] = []
    h = parent_hash
    runs: list[int] = []
    fill = 0
    total = 0
    for seg in segments:
        offset = 0
        while offset < seg.num_tokens:
            take = min(block_size - fill, seg.num_tokens - offset)
            runs.extend((seg.content_id, offset, offset + take))
            offset += take
            fill += take
            if fill == block_size:
                h = chain_hash(h, tuple(runs))
                hashes.append(h)
                runs.clear()
                fill = 0
        total += seg.num_tokens
    return hashes, total


def num_blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks needed to hold `num_tokens` tokens (a partial block counts)."""
    return -(-num_tokens // block_size)


def common_prefix_len(a: Sequence[_T], b: Sequence[_T]) -> int:
    """Number of leading equal entries of two sequences (hash lists, segment tuples)."""
    n = min(len(a), len(b))
    if type(a) is not type(b) or type(a) not in (tuple, list):
        i = 0
        while i < n and a[i] == b[i]:
            i += 1
        return i
    # slices compare in C; a context usually extends the other (one comparison), else
    # bisect for the first difference: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
