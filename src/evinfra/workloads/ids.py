"""Deterministic content ids.

Content ids name segments (core.blocks.Segment): equal ids mean equal content, so they
must be shared where content is shared (a system prompt used by every session of a kind,
a block id repeated in a trace) and distinct everywhere else. They are derived with
SplitMix64 from integer keys only: Python's `hash` of a str is salted per process, so no
string ever feeds an id.
"""

from __future__ import annotations

import zlib

_U64 = (1 << 64) - 1
_ID_MASK = (1 << 62) - 1


def mix64(*keys: int) -> int:
    """SplitMix64 folded over `keys`: a well-spread 64-bit value, stable across runs."""
    return _fold(0x9E3779B97F4A7C15, keys)


def _fold(z: int, keys: tuple[int, ...]) -> int:
    """`mix64`'s state after folding `keys` into state `z` (a fold: mix64(*a, *b) is
    _fold(_fold(seed, a), b), so a fixed leading part of the keys is folded once)."""
    for key in keys:
        z = (z ^ (key & _U64)) & _U64
        z = (z + 0x9E3779B97F4A7C15) & _U64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
        z ^= z >> 31
    return z


def text_key(text: str) -> int:
    """A stable integer for a short name (a kind, a file name) to use as an id key."""
    return zlib.crc32(text.encode("utf-8"))


# Namespaces keep the id spaces of generators and trace loaders apart.
NS_GENERATED = 1
NS_TRACE = 2
NS_SHARED = 3

# Roles of a derived id inside a namespace.
ROLE_CONTENT = 1
ROLE_OUTPUT = 2
ROLE_PROMPT = 3


class IdSource:
    """Hands out fresh content ids for one session: (namespace, session index, counter).

    Ids are 62-bit: among ten million ids (a large simulation) the chance that any two
    collide is about 1e-5.
    """

    __slots__ = ("_counter", "_state")

    def __init__(self, *keys: int) -> None:
        self._state = mix64(*keys)
        """mix64's state after the session's keys: each id folds in only its counter."""
        self._counter = 0

    def fresh(self) -> int:
        self._counter += 1
        return _fold(self._state, (self._counter,)) & _ID_MASK


def shared_id(*keys: int) -> int:
    """The id of content shared by construction (a kind's system prompt for one seed)."""
    return mix64(NS_SHARED, *keys) & _ID_MASK


def trace_block_id(file_key: int, hash_id: int) -> int:
    """The content id of a trace's block hash id: equal hash ids in one file share it."""
    return mix64(NS_TRACE, file_key, ROLE_CONTENT, hash_id) & _ID_MASK


def trace_output_id(file_key: int, row_index: int) -> int:
    """A fresh content id for the output of trace row `row_index`."""
    return mix64(NS_TRACE, file_key, ROLE_OUTPUT, row_index) & _ID_MASK


def trace_prompt_id(file_key: int, row_index: int) -> int:
    """A fresh content id for the whole prompt of a trace row without prefix information."""
    return mix64(NS_TRACE, file_key, ROLE_PROMPT, row_index) & _ID_MASK
