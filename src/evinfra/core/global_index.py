"""The cluster-wide block index: which nodes hold each block, on device and on host.

Each pool reports what it indexes and forgets through a `PoolListener`; one walk over a
prompt then gives every node's prefix match at once (a bitmask of nodes per block), where
asking every pool in turn costs nodes x prefix length. This is the global index of the
distributed KV manager (ARCHITECTURE.md), kept exact by the pools themselves.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from itertools import accumulate, islice, repeat, takewhile
from operator import and_, neg, or_
from typing import Protocol, TypeAlias

from evinfra.core.kv_pool import KVPool, PrefixMatch

_MAX_SHARED_MATCHES = 1 << 16
_CHAINS_PER_NODE = 512
"""Prompts remembered per node of the cluster (a session's next call finds its last)."""


class PoolListener(Protocol):
    def on_device(self, block_hash: int, present: bool) -> None:
        """The pool's device index gained (True) or lost (False) `block_hash`."""

    def on_host(self, block_hash: int, present: bool) -> None:
        """The pool's host tier gained or lost `block_hash`."""

    def on_device_many(self, block_hashes: Sequence[int], present: bool) -> None:
        """`on_device` for each hash in turn (a pool's commits or imports at once)."""

    def on_host_many(self, block_hashes: Sequence[int], present: bool) -> None:
        """`on_host` for each hash in turn (an eviction's offloads at once)."""


class _Chain:
    """A prompt walked before and, per node, how much of it the node still holds for
    certain: `clean[node]` leading blocks, none of them lost since (a device loss of a
    hash of the prompt lowers it to that hash's place). The next prompt that extends
    this one is walked, for each node, from there on only."""

    __slots__ = ("clean", "hashes")

    def __init__(self, hashes: tuple[int, ...], clean: list[int]) -> None:
        self.hashes = hashes
        self.clean = clean


_Watch: TypeAlias = tuple[_Chain, int] | dict[_Chain, int]
"""Who must hear that a hash was lost: one (chain, place in its prompt), or several
(a prefix several remembered prompts share: a system prompt, a parent's context)."""


class _NodeListener:
    __slots__ = ("_bit", "_device", "_host", "_node", "_owner")

    def __init__(self, node: int, owner: GlobalBlockIndex) -> None:
        self._node = node
        self._bit = 1 << node
        self._device = owner._device
        self._host = owner._host
        self._owner = owner

    def on_device(self, block_hash: int, present: bool) -> None:
        _flip(self._device, block_hash, self._bit, present)
        if not present:
            self._owner._lost((block_hash,), self._node)
        self._owner.version += 1

    def on_host(self, block_hash: int, present: bool) -> None:
        _flip(self._host, block_hash, self._bit, present)
        self._owner.version += 1

    def on_device_many(self, block_hashes: Sequence[int], present: bool) -> None:
        _flip_many(self._device, block_hashes, self._bit, present)
        if not present:
            self._owner._lost(block_hashes, self._node)
        self._owner.version += 1

    def on_host_many(self, block_hashes: Sequence[int], present: bool) -> None:
        _flip_many(self._host, block_hashes, self._bit, present)
        self._owner.version += 1


def _flip_many(table: dict[int, int], keys: Sequence[int], bit: int, present: bool) -> None:
    """`_flip` each key in turn."""
    if present:  # setting a bit never empties a mask: one dict update, in C
        masks = map(or_, map(table.get, keys, repeat(0)), repeat(bit))
        table.update(zip(keys, masks, strict=True))
        return
    keep = ~bit
    for key in keys:
        mask = table.get(key, 0) & keep
        if mask:
            table[key] = mask
        else:
            table.pop(key, None)


def _flip(table: dict[int, int], key: int, bit: int, present: bool) -> None:
    mask = table.get(key, 0)
    mask = mask | bit if present else mask & ~bit
    if mask:
        table[key] = mask
    else:
        table.pop(key, None)


class GlobalBlockIndex:
    def __init__(self, num_nodes: int, max_chains: int | None = None) -> None:
        self.num_nodes = num_nodes
        self._device: dict[int, int] = {}
        self._host: dict[int, int] = {}
        self.version = 0
        """Bumped on every change a pool reports: a match stays valid while it holds."""
        self._memo_hashes: Sequence[int] | None = None
        self._memo_version = -1
        self._memo: list[PrefixMatch] = []
        self._device_only: dict[int, PrefixMatch] = {}
        """One (frozen) device-only match per length, shared by every answer: a route
        asks about every node at once."""
        self._chains: OrderedDict[int, _Chain] = OrderedDict()
        """Prompts walked recently, by their last hash, least recently walked first."""
        self._max_chains = _CHAINS_PER_NODE * num_nodes if max_chains is None else max_chains
        self._watch: dict[int, _Watch] = {}
        """Every hash of a remembered prompt: where in which prompts it lies."""

    def listener(self, node_id: int) -> PoolListener:
        if not 0 <= node_id < self.num_nodes:
            raise ValueError(f"node {node_id} outside 0..{self.num_nodes - 1}")
        return _NodeListener(node_id, self)

    def attach(self, pool: KVPool, node_id: int) -> None:
        """Make `pool` report to this index as node `node_id` (its current content too)."""
        listener = self.listener(node_id)
        pool.listener = listener
        pool.host.listener = listener
        for h in pool.cached_hashes():
            listener.on_device(h, True)
        for h in pool.host.hashes():
            listener.on_host(h, True)

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
        device_len = [0] * n
        if type(hashes) is tuple and hashes:
            self._device_runs(hashes, device_len)
        else:
            _walk(self._device, hashes, 0, (1 << n) - 1, device_len)
        host = self._host
        if not host:
            shared = self._device_only
            if len(shared) > _MAX_SHARED_MATCHES:
                shared.clear()
            get, add = shared.get, shared.setdefault
            return [get(k) or add(k, PrefixMatch(k, 0)) for k in device_len]
        out = []
        for node in range(n):
            start = device_len[node]
            bit = 1 << node
            run = 0
            for h in hashes[start:]:
                if not host.get(h, 0) & bit:
                    break
                run += 1
            out.append(PrefixMatch(start, run))
        return out

    def _device_runs(self, hashes: tuple[int, ...], device_len: list[int]) -> None:
        """Each node's leading run of `hashes` on device, into `device_len`. A prompt that
        extends one walked before (a session's next call: found by the old prompt's last
        hash) is walked, for each node, only from where that node's old run is still
        known to hold (`_Chain.clean`): one lookup for a node that held no more of it, the
        new blocks for the nodes that held all of it."""
        chains, device = self._chains, self._device
        chain = None
        for last in filter(chains.__contains__, reversed(hashes)):
            found = chains[last]
            if hashes[: len(found.hashes)] == found.hashes:
                chain = found
            break
        if chain is None:
            _walk(device, hashes, 0, (1 << self.num_nodes) - 1, device_len)
            chain = _Chain(hashes, device_len[:])
            self._watch_hashes(chain, 0)
        else:
            device_len[:] = chain.clean
            starts: dict[int, int] = {}
            for node, start in enumerate(chain.clean):
                starts[start] = starts.get(start, 0) | 1 << node
            get, num = device.get, len(hashes)
            for start, mask in starts.items():
                # usually none of them holds the next block: their runs stay as they were
                if start < num and get(hashes[start], 0) & mask:
                    _walk(device, hashes, start, mask, device_len)
            del chains[chain.hashes[-1]]
            num_old = len(chain.hashes)
            chain.hashes = hashes
            chain.clean = device_len[:]
            self._watch_hashes(chain, num_old)
        replaced = chains.pop(hashes[-1], None)
        if replaced is not None:  # another prompt ending in the same hash (not chained)
            self._unwatch(replaced)
        chains[hashes[-1]] = chain
        if len(chains) > self._max_chains:
            self._unwatch(chains.popitem(last=False)[1])

    def _watch_hashes(self, chain: _Chain, start: int) -> None:
        """Have the losses of `chain.hashes[start:]` lower `chain.clean`."""
        watch = self._watch
        new = chain.hashes[start:]
        if not any(map(watch.__contains__, new)):  # new blocks, usually: in C
            # backwards, so that a hash repeated in the prompt keeps its first place
            places = range(len(chain.hashes) - 1, start - 1, -1)
            watch.update(zip(reversed(new), zip(repeat(chain), places, strict=False), strict=True))
            return
        for place in range(start, len(chain.hashes)):
            h = chain.hashes[place]
            seen = watch.get(h)
            if seen is None:
                watch[h] = (chain, place)
            elif isinstance(seen, tuple):
                if seen[0] is not chain:  # else: a repeat, later in the same prompt
                    watch[h] = {seen[0]: seen[1], chain: place}
            else:
                seen.setdefault(chain, place)

    def _unwatch(self, chain: _Chain) -> None:
        """Forget a chain no longer remembered."""
        watch = self._watch
        for h in chain.hashes:
            seen = watch.get(h)
            if isinstance(seen, tuple):
                if seen[0] is chain:
                    del watch[h]
            elif seen is not None and seen.pop(chain, None) is not None and len(seen) == 1:
                watch[h] = next(iter(seen.items()))

    def _lost(self, block_hashes: Sequence[int], node: int) -> None:
        """Node `node` no longer holds these hashes on device: remembered prompts holding
        them know their node's run only up to the first of them."""
        watched: Iterator[_Watch] = filter(None, map(self._watch.get, block_hashes))
        for seen in watched:
            if isinstance(seen, tuple):
                chain, place = seen
                if place < chain.clean[node]:
                    chain.clean[node] = place
            else:
                for each, at in seen.items():
                    if at < each.clean[node]:
                        each.clean[node] = at


def _walk(
    device: dict[int, int], hashes: Sequence[int], start: int, mask: int, device_len: list[int]
) -> None:
    """For the nodes in `mask`, each holding `hashes[:start]`: its run from `start` on,
    into `device_len`. One pass over the hashes for all of them: a running AND of the
    masks (in C, stopped once no node is left) only loses bits, so it never increases
    and each node's run ends where its bit goes, found by bisection, one per change."""
    masks = map(device.get, islice(hashes, start, None), repeat(0))
    alive = list(takewhile(bool, accumulate(masks, and_, initial=mask)))
    i, num = 0, len(alive)
    while i < num:
        value = alive[i]
        end = bisect_right(alive, -value, lo=i, key=neg)
        after = alive[end] if end < num else 0
        for node in _bits(value & ~after):
            device_len[node] = start + end - 1
        i = end


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out
