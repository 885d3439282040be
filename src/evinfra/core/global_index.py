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
from functools import reduce
from itertools import accumulate, compress, islice, repeat, takewhile
from operator import and_, neg, or_
from typing import Protocol

from evinfra.core.host_tier import HostTier, held_run
from evinfra.core.kv_pool import RUN_LOOKBACK, KVPool, PrefixMatch
from evinfra.core.shared_heads import MIN_HEAD_BLOCKS, SharedHeads

_MAX_SHARED_MATCHES = 1 << 16


class PoolListener(Protocol):
    def on_device(self, block_hash: int, present: bool) -> None:
        """The pool's device index gained (True) or lost (False) `block_hash`."""

    def on_device_many(self, block_hashes: Sequence[int], present: bool) -> None:
        """`on_device` for each hash in turn (a pool's commits or imports at once)."""

    def on_freed_run(self, last_hash: int) -> None:
        """The pool remembers a freed run ending at `last_hash` that its
        `proven_prefix` can prove while it stays untouched."""


class _NodeListener:
    __slots__ = ("_bit", "_device", "_masks", "_owner", "_run_ends")

    def __init__(self, bit: int, owner: GlobalBlockIndex) -> None:
        self._bit = bit
        self._device = owner._device
        self._masks = owner._masks
        self._run_ends = owner._run_ends
        self._owner = owner

    def on_device(self, block_hash: int, present: bool) -> None:
        owner = self._owner
        if _flip(self._device, block_hash, self._bit, present, self._masks, owner.heads.pin):
            owner.heads.forget()
        owner.version += 1

    def on_device_many(self, block_hashes: Sequence[int], present: bool) -> None:
        owner = self._owner
        if _flip_many(self._device, block_hashes, self._bit, present, self._masks, owner.heads.pin):
            owner.heads.forget()
        owner.version += 1

    def on_freed_run(self, last_hash: int) -> None:
        # a hint only, never cleared per run: a stale entry costs one proof that fails
        ends = self._run_ends
        if len(ends) > _MAX_RUN_ENDS:
            ends.clear()
        ends[last_hash] = ends.get(last_hash, 0) | self._bit


_MAX_MASKS = 1 << 16
"""Distinct masks an index keeps one object for before it starts over (values stay right,
only the sharing is lost)."""

_MAX_RUN_ENDS = 1 << 16
"""Freed-run ends an index remembers before it starts over (a pool keeps at most 1,024
runs; a forgotten end only costs that run's proof)."""

_MIN_PROOF_BLOCKS = 64
"""Fewer blocks past a shared head are walked: looking for proofs costs as much."""


def _masks_to_fill(masks: dict[int, int]) -> dict[int, int]:
    """The index's canonical masks, emptied first once past `_MAX_MASKS`."""
    if len(masks) > _MAX_MASKS:
        masks.clear()
    return masks


def _flip_many(
    table: dict[int, int],
    keys: Sequence[int],
    bit: int,
    present: bool,
    masks: dict[int, int],
    pin: int = 0,
) -> bool:
    """`_flip` each key in turn; returns whether any key's mask has `pin`."""
    one = _masks_to_fill(masks).setdefault
    if present:  # setting a bit never empties a mask: one dict update, in C
        new = list(map(or_, map(table.get, keys, repeat(0)), repeat(bit)))
        table.update(zip(keys, map(one, new, new), strict=True))
        return bool(pin and reduce(or_, new, 0) & pin)
    keep = ~bit
    seen = 0
    for key in keys:
        mask = table.get(key, 0) & keep
        if mask:
            table[key] = one(mask, mask)
            seen |= mask
        else:
            table.pop(key, None)
    return bool(seen & pin)


def _flip(
    table: dict[int, int], key: int, bit: int, present: bool, masks: dict[int, int], pin: int = 0
) -> bool:
    """Set (`present`) or clear `bit` in `key`'s mask, dropping an empty mask; returns
    whether the mask has `pin` (the block is in a remembered shared head)."""
    mask = table.get(key, 0)
    mask = mask | bit if present else mask & ~bit
    if mask:
        table[key] = _masks_to_fill(masks).setdefault(mask, mask)
    else:
        table.pop(key, None)
    return bool(mask & pin)


class GlobalBlockIndex:
    def __init__(
        self,
        num_nodes: int,
        min_proof_blocks: int = _MIN_PROOF_BLOCKS,
        min_head_blocks: int = MIN_HEAD_BLOCKS,
    ) -> None:
        self.num_nodes = num_nodes
        self.min_proof_blocks = min_proof_blocks
        """Past a shared head, fewer blocks than this are walked, not proven (`_prove`)."""
        self.num_proven = 0
        """Node runs proven by their pools instead of walked, so far."""
        self._device: dict[int, int] = {}
        self._masks: dict[int, int] = {}
        """One int object per node mask in use, shared by every block with that mask: a
        block's mask is read on every walk of a prompt through it, and a few shared
        objects stay in cache where one object a block does not."""
        masks = self._masks
        self.heads = SharedHeads(
            self._device,
            1 << num_nodes,
            lambda m: _masks_to_fill(masks).setdefault(m, m),
            min_head_blocks,
        )
        """Shared heads of prompts, walked once while their blocks do not change."""
        self._pools: dict[int, KVPool] = {}
        self._run_ends: dict[int, int] = {}
        """Nodes (a mask) whose pool reported a freed run ending at each hash: a prompt
        ending shortly after one may be proven held up to there by that pool
        (`KVPool.proven_prefix`) instead of walked."""
        self._host_tables: dict[int, Mapping[int, None]] = {}
        """Per node with a host tier, what the tier holds (`HostTier.contents`), read for
        the node's run where its device run ends."""
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
        self._pools[node_id] = pool
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

    def _prove(self, hashes: tuple[int, ...], device_len: list[int], nodes: int, known: int) -> int:
        """Of `nodes` (a mask; each holds the first `known` of `hashes`), those whose
        pools prove a longer leading run held on device without a lookup per block
        (`KVPool.proven_prefix`: a freed run ending near the prompt's end, still
        untouched), with each one's proven length written into `device_len`. These are
        the long runs of a session's next prompt (the nodes that prefilled and decoded
        its last call), which a walk reads block by block in a table of every node's
        blocks."""
        ends = self._run_ends
        if len(hashes) - known < self.min_proof_blocks or not ends:
            return 0  # a short walk costs less than looking for proofs
        lo = max(known, len(hashes) - RUN_LOOKBACK)
        # where reported runs end among the last hashes (in C), latest first
        run_ends = list(
            compress(range(lo + 1, len(hashes) + 1), map(ends.__contains__, hashes[lo:]))
        )
        proven = 0
        pools = self._pools
        for end in reversed(run_ends):
            for node in _bits(ends.get(hashes[end - 1], 0) & nodes & ~proven):
                pool = pools.get(node)
                run = pool.proven_at(hashes, end, known) if pool is not None else 0
                if run > known:
                    device_len[node] = run
                    proven |= 1 << node
        if proven:
            self.num_proven += proven.bit_count()
        return proven

    def _device_runs(self, hashes: Sequence[int]) -> list[int]:
        """Every node's leading run of `hashes` on device. From a remembered shared head:
        a walk on from its end of the nodes that hold it whole, save those whose pools
        prove their runs (walked on from the proof: usually no further). Without one,
        a walk from the first block, which may leave one to remember."""
        n = self.num_nodes
        mask_of = self._device.get
        runs = [0] * n
        head = self.heads.find(hashes) if type(hashes) is tuple and len(self.heads) else None
        if head is None:
            alive = _alive(map(mask_of, hashes, repeat(0)), (1 << n) - 1)
            _runs_from(alive, runs, 0)
            if type(hashes) is tuple:
                self.heads.keep(hashes, alive)
            return runs
        assert type(hashes) is tuple  # only a tuple's head is looked for
        known = len(head.hashes)  # held whole by head.alive; by no other node from the first
        proven = self._prove(hashes, runs, head.alive, known)
        rest = map(mask_of, islice(hashes, known, None), repeat(0))
        _runs_from(_alive(rest, head.alive & ~proven), runs, known)
        for node in _bits(proven):
            start = runs[node]
            masks = map(mask_of, islice(hashes, start, None), repeat(0))
            runs[node] = start + len(list(takewhile((1 << node).__and__, masks)))
        return runs

    def _match_all(self, hashes: Sequence[int]) -> list[PrefixMatch]:
        n = self.num_nodes
        device_len = self._device_runs(hashes)
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


def _alive(masks: Iterable[int], nodes: int) -> list[int]:
    """The running AND of `nodes` (a bitmask) and the masks, in C, up to the first empty
    one: entry i holds the nodes that hold the first i blocks."""
    return list(takewhile(bool, accumulate(masks, and_, initial=nodes)))


def _runs_from(alive: list[int], runs: list[int], offset: int) -> None:
    """Write into `runs` each node's run of blocks from `_alive` (of the blocks from
    `offset` on, where every node in it holds the first `offset`), plus `offset`. The
    running AND only loses bits, so it never increases and each node's run ends where
    its bit goes: found by bisection, one per change."""
    end_all = len(alive)
    if offset and end_all:  # the nodes lost at once hold the first `offset` only
        for node in _bits(alive[0] & ~(alive[1] if end_all > 1 else 0)):
            runs[node] = offset
    start = 1
    while start < end_all:
        value = alive[start]
        end = bisect_right(alive, -value, lo=start, key=neg)
        after = alive[end] if end < end_all else 0
        for node in _bits(value & ~after):
            runs[node] = offset + end - 1
        start = end


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
