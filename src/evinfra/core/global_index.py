"""The cluster-wide block index: which nodes hold each block on device, and each node's
host tier.

Each pool reports what its device index gains and loses through a `PoolListener`; one
walk over a prompt then gives every node's device prefix match at once (a bitmask of nodes
per block), where asking every pool in turn costs nodes x prefix length. Host copies are
not indexed: a node's host run starts where its own device run ends, so each node's host
tier is asked from there, which costs one lookup for a node whose tier lacks the next
block (nearly all of them) and spares the index two updates for every block a full pool
evicts (its copy stored on host, another copy leaving the host). This is the global index
of the distributed KV manager (ARCHITECTURE.md), kept exact by the pools themselves.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate, repeat, takewhile
from operator import and_, neg, or_
from typing import Protocol

from evinfra.core.host_tier import HostTier, held_run
from evinfra.core.kv_pool import KVPool, PrefixMatch

_MAX_SHARED_MATCHES = 1 << 16


class PoolListener(Protocol):
    def on_device(self, block_hash: int, present: bool) -> None:
        """The pool's device index gained (True) or lost (False) `block_hash`."""

    def on_device_many(self, block_hashes: Sequence[int], present: bool) -> None:
        """`on_device` for each hash in turn (a pool's commits or imports at once)."""


class _NodeListener:
    __slots__ = ("_bit", "_device", "_masks", "_owner")

    def __init__(self, bit: int, owner: GlobalBlockIndex) -> None:
        self._bit = bit
        self._device = owner._device
        self._masks = owner._masks
        self._owner = owner

    def on_device(self, block_hash: int, present: bool) -> None:
        _flip(self._device, block_hash, self._bit, present, self._masks)
        self._owner.version += 1

    def on_device_many(self, block_hashes: Sequence[int], present: bool) -> None:
        _flip_many(self._device, block_hashes, self._bit, present, self._masks)
        self._owner.version += 1


_MAX_MASKS = 1 << 16
"""Distinct masks an index keeps one object for before it starts over (values stay right,
only the sharing is lost)."""


def _masks_to_fill(masks: dict[int, int]) -> dict[int, int]:
    """The index's canonical masks, emptied first once past `_MAX_MASKS`."""
    if len(masks) > _MAX_MASKS:
        masks.clear()
    return masks


def _flip_many(
    table: dict[int, int], keys: Sequence[int], bit: int, present: bool, masks: dict[int, int]
) -> None:
    """`_flip` each key in turn."""
    one = _masks_to_fill(masks).setdefault
    if present:  # setting a bit never empties a mask: one dict update, in C
        new = list(map(or_, map(table.get, keys, repeat(0)), repeat(bit)))
        table.update(zip(keys, map(one, new, new), strict=True))
        return
    keep = ~bit
    for key in keys:
        mask = table.get(key, 0) & keep
        if mask:
            table[key] = one(mask, mask)
        else:
            table.pop(key, None)


def _flip(table: dict[int, int], key: int, bit: int, present: bool, masks: dict[int, int]) -> None:
    mask = table.get(key, 0)
    mask = mask | bit if present else mask & ~bit
    if mask:
        table[key] = _masks_to_fill(masks).setdefault(mask, mask)
    else:
        table.pop(key, None)


class GlobalBlockIndex:
    def __init__(self, num_nodes: int) -> None:
        self.num_nodes = num_nodes
        self._device: dict[int, int] = {}
        self._host_tables: dict[int, Mapping[int, None]] = {}
        """Per node with a host tier, what the tier holds (`HostTier.contents`), read for
        the node's run where its device run ends."""
        self._masks: dict[int, int] = {}
        """One int object per node mask in use, shared by every block with that mask: a
        block's mask is read on every walk of a prompt through it, and a few shared
        objects stay in cache where one object a block does not."""
        self.version = 0
        """Bumped on every change a pool reports: a match stays valid while it holds."""
        self._memo_hashes: Sequence[int] | None = None
        self._memo_version = -1
        self._memo: list[PrefixMatch] = []
        self._shared: dict[int, PrefixMatch] = {}
        """One (frozen) match per pair of lengths, shared by every answer: a route asks
        about every node at once."""

    def _check_node(self, node_id: int) -> None:
        if not 0 <= node_id < self.num_nodes:
            raise ValueError(f"node {node_id} outside 0..{self.num_nodes - 1}")

    def listener(self, node_id: int) -> PoolListener:
        self._check_node(node_id)
        return _NodeListener(1 << node_id, self)

    def attach(self, pool: KVPool, node_id: int) -> None:
        """Make `pool` report to this index as node `node_id` (its current content too)."""
        listener = self.listener(node_id)
        pool.listener = listener
        for h in pool.cached_hashes():
            listener.on_device(h, True)
        self.attach_host(pool.host, node_id)

    def attach_host(self, host: HostTier, node_id: int) -> None:
        """Read node `node_id`'s host run from `host`, which tells this index when what
        it holds changes (a pool's tier: `attach` does it)."""
        self._check_node(node_id)
        host.on_change = self._host_changed
        if host.capacity_blocks:
            self._host_tables[node_id] = host.contents()
        else:
            self._host_tables.pop(node_id, None)
        self.version += 1

    def _host_changed(self) -> None:
        self.version += 1

    def nodes_holding(self, block_hash: int) -> list[int]:
        mask = self._device.get(block_hash, 0)
        return [i for i in range(self.num_nodes) if mask >> i & 1]

    def match_all(self, hashes: Sequence[int]) -> list[PrefixMatch]:
        """Every node's leading run of `hashes` on device, then on host (as
        `KVPool.match_prefix` would answer), in one pass over the prompt. The answer for a
        tuple is remembered until a pool reports a change (`last_match`)."""
        if type(hashes) is not tuple:
            return self._match_all(hashes)
        if hashes is not self._memo_hashes or self.version != self._memo_version:
            self._memo = self._match_all(hashes)
            self._memo_hashes, self._memo_version = hashes, self.version
        return list(self._memo)

    def last_match(self, hashes: Sequence[int], node_id: int) -> PrefixMatch | None:
        """Node `node_id`'s match of `hashes` from the last `match_all`, if that was of this
        very tuple and no pool has changed since; else None."""
        if hashes is self._memo_hashes and self.version == self._memo_version:
            return self._memo[node_id]
        return None

    def _match_all(self, hashes: Sequence[int]) -> list[PrefixMatch]:
        n = self.num_nodes
        device_len = _runs_by_node(map(self._device.get, hashes, repeat(0)), (1 << n) - 1, [0] * n)
        shared = self._shared
        if len(shared) > _MAX_SHARED_MATCHES:
            shared.clear()
        get, add = shared.get, shared.setdefault
        # each node's host run starts where its device run ends: one lookup for a node
        # whose tier lacks the next block (nearly every node)
        end = len(hashes)
        host_len: list[int] | None = None
        for node, table in self._host_tables.items():
            start = device_len[node]
            if start < end and hashes[start] in table:  # else no run: spare the call
                if host_len is None:
                    host_len = [0] * n
                host_len[node] = held_run(table, hashes, start)
        if host_len is None:
            return [get(k) or add(k, PrefixMatch(k, 0)) for k in device_len]
        return [
            get(key) or add(key, PrefixMatch(d, h))
            for d, h, key in zip(
                device_len, host_len, map(_pair_key, device_len, host_len), strict=True
            )
        ]


def _pair_key(num_device: int, num_host: int) -> int:
    return num_device if not num_host else num_device | num_host << 32


def _runs_by_node(masks: Iterable[int], nodes: int, runs: list[int]) -> list[int]:
    """Write into `runs` each of `nodes`' (a bitmask) leading run of blocks whose masks
    have its bit; returns `runs`. A running AND of the masks (in C, stopped once no node
    is left) only loses bits, so it never increases and each node's run ends where its
    bit goes: found by bisection, one per change."""
    alive = list(takewhile(bool, accumulate(masks, and_, initial=nodes)))
    start, end_all = 1, len(alive)
    while start < end_all:
        value = alive[start]
        end = bisect_right(alive, -value, lo=start, key=neg)
        after = alive[end] if end < end_all else 0
        for node in _bits(value & ~after):
            runs[node] = end - 1
        start = end
    return runs


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
