"""A node's paged KV pool: a device tier of blocks with reference counts and a prefix
index, and an optional host tier.

Every device block is in exactly one state: free (no content), evictable (cached content,
no reader: a candidate for the eviction strategy) or in use (ref count > 0, cached or
not). `try_allocate` takes free blocks first and then evicts; an evicted block's content
is offloaded to the host tier when there is one. Block ids double as slots in a real
executor's KV tensor, so the servers use this same pool.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import compress, filterfalse, islice, takewhile
from typing import Protocol

from evinfra.core.eviction import EvictionPolicy, LRUEviction
from evinfra.core.host_tier import HostTier, held_run


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Leading blocks of a hash list held on this node: first on device, then on host."""

    num_device_blocks: int
    num_host_blocks: int

    @property
    def num_blocks(self) -> int:
        return self.num_device_blocks + self.num_host_blocks

    def truncated(self, num_blocks: int) -> PrefixMatch:
        """The match of the first `num_blocks` hashes of the list this one matched."""
        if num_blocks >= self.num_blocks:
            return self
        device = min(self.num_device_blocks, num_blocks)
        return PrefixMatch(device, num_blocks - device)


_Memo = tuple[tuple[int, ...], int, int, int, int, PrefixMatch]
"""(prompt, version, removals, host copies offloaded, host size, match) when matched."""
_MAX_MEMOS = 256
_MAX_FREED_RUNS = 1024
_MAX_RUN_LOOKBACK = 32
"""How far from the end of a cached prefix `_locate` looks for a freed run ending there."""


class _FreedRun:
    """A freed block list up to its last block with content, and (`mark` < 0) how to
    know whether its blocks from `start` on are still the untouched run of candidates
    that free made: queued tail first under that mark, none taken since
    (`EvictionPolicy.run_at`)."""

    __slots__ = ("block_ids", "hashes", "mark", "start")

    def __init__(
        self, block_ids: list[int], start: int, hashes: tuple[int, ...] | None, mark: int
    ) -> None:
        self.block_ids = block_ids
        self.start = start
        self.hashes = hashes
        """What the blocks from `start` on held when freed (with a mark only)."""
        self.mark = mark


_UNUSED = (0).__ge__
"""Whether a block's word is that of a block no one reads (0, or a candidate's mark)."""


def _as_list(items: Sequence[int]) -> list[int]:
    """`items` itself when it is a list (a fresh slice), else a list of it."""
    return items if type(items) is list else list(items)


def _num_unused(counts: list[int]) -> int:
    """How many of these reference counts are those of unused blocks (<= 0)."""
    if not counts:
        return 0
    first = counts[0]
    if counts.count(first) == len(counts):  # one freed run, or one holder: usual
        return len(counts) if first <= 0 else 0
    return sum(map(_UNUSED, counts))


class PoolListenerLike(Protocol):
    def on_device(self, block_hash: int, present: bool) -> None: ...

    def on_device_many(self, block_hashes: Sequence[int], present: bool) -> None: ...


class KVPool:
    def __init__(
        self,
        num_device_blocks: int,
        num_host_blocks: int = 0,
        eviction: EvictionPolicy | None = None,
        offload_on_evict: bool = True,
    ) -> None:
        if num_device_blocks <= 0:
            raise ValueError(f"num_device_blocks must be > 0, got {num_device_blocks}")
        self.num_device_blocks = num_device_blocks
        self.host = HostTier(num_host_blocks)
        self.eviction: EvictionPolicy = eviction if eviction is not None else LRUEviction()
        self.offload_on_evict = offload_on_evict
        # per-block state grows as blocks are first handed out (ids in order), so a pool
        # of millions of blocks costs nothing until it is used
        self._ref: list[int] = []
        """Readers of each block when > 0; 0 or (strategies that mark their candidates
        here, `bind_blocks`) a negative mark when no one reads it."""
        self._hash: list[int | None] = []
        self._index: dict[int, int] = {}
        self._free: list[int] = []
        """Blocks handed out before and returned empty (popped from the end)."""
        self._num_in_use = 0
        self.num_evicted_blocks = 0
        self.num_dropped_blocks = 0
        self.listener: PoolListenerLike | None = None
        """Told of every hash indexed or forgotten (the cluster-wide block index)."""
        self._version = 0
        """Bumped whenever the device index gains or loses a hash (see `match_key`)."""
        self._num_removals = 0
        """Bumped whenever the device index loses a hash: until then matches only grow."""
        # recent prompts' matches by tuple identity (the tuple is held, so its id is not
        # reused): the router, admission and the simulator ask about the same prompt
        self._memos: OrderedDict[int, _Memo] = OrderedDict()
        self._freed_runs: OrderedDict[int, _FreedRun] = OrderedDict()
        """Recently freed block lists up to their last block with content, by that
        block's hash (a chained hash names its whole prefix): a session's next call
        acquires that run again, found without an index lookup per block."""
        self.eviction.bind_index(self._index.get)
        self._marked = self.eviction.bind_blocks(self._ref)
        """The strategy marks its candidates' words itself: a block freed into it needs
        no 0 written first."""

    # -- queries ---------------------------------------------------------------------
    @property
    def _num_fresh(self) -> int:
        return self.num_device_blocks - len(self._ref)

    def _take_empty(self) -> int | None:
        if self._free:
            return self._free.pop()
        if len(self._ref) < self.num_device_blocks:
            self._ref.append(0)
            self._hash.append(None)
            return len(self._ref) - 1
        return None

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now: empty ones plus evictable cached ones."""
        return len(self._free) + self._num_fresh + len(self.eviction)

    @property
    def num_used_blocks(self) -> int:
        return self._num_in_use

    @property
    def num_cached_blocks(self) -> int:
        return len(self._index)

    def usage(self) -> float:
        return self._num_in_use / self.num_device_blocks

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= self.num_free_blocks

    def can_allocate_after(self, num_blocks: int, cached_hashes: Sequence[int]) -> bool:
        """Whether `num_blocks` new blocks fit once `cached_hashes` (all indexed) are
        acquired: acquiring an unused cached block takes it off the evictable count."""
        return self._fits_after(num_blocks, self._locate(cached_hashes)[0])

    def _fits_after(self, num_blocks: int, cached_ids: list[int]) -> bool:
        # holding an unused cached block takes it off the evictable count
        num_taken = _num_unused(list(map(self._ref.__getitem__, cached_ids)))
        return num_blocks <= self.num_free_blocks - num_taken

    @property
    def match_key(self) -> tuple[int, int, int]:
        """Changes whenever a prefix match can change: the device index gains or loses a
        hash (commit, eviction, drop, offload, prefetch, import, clear) or the host tier's
        content changes (a new copy always counts as offloaded; losses shrink it).
        Reference counts and eviction order do not enter a match."""
        host = self.host
        return (self._version, host.num_offloaded, len(host))

    def match_prefix(self, hashes: Sequence[int], limit: int | None = None) -> PrefixMatch:
        """The leading blocks of `hashes[:limit]` held here (device run, then host run).
        A tuple's full match is remembered: asked again about the same prompt (or a
        prefix of it, through `limit`) it costs O(1) while `match_key` holds, and O(new
        blocks) when the pool has only gained content since (no device hash or host copy
        lost: the device run can only have grown)."""
        if type(hashes) is not tuple:
            return self._match(hashes, limit)
        host = self.host
        memo = self._memos.get(id(hashes))
        if memo is None or memo[0] is not hashes:
            match = self._match(hashes, None, self._proven(hashes))
        elif memo[1] == self._version and memo[3] == host.num_offloaded and memo[4] == len(host):
            match = memo[5]  # still current: remembering it again would change nothing
            return match if limit is None else match.truncated(limit)
        elif memo[2] == self._num_removals and host.num_offloaded - memo[3] == len(host) - memo[4]:
            match = self._match(hashes, None, memo[5].num_device_blocks)
        else:
            match = self._match(hashes, None, self._proven(hashes))
        self._remember(hashes, match)
        return match if limit is None else match.truncated(limit)

    def adopt_match(self, hashes: tuple[int, ...], match: PrefixMatch) -> None:
        """Remember `match` as this pool's current match of `hashes`, computed elsewhere
        from an exact mirror of its content (the cluster-wide block index, right after
        asking it), so the next `match_prefix(hashes)` does not walk the prompt again."""
        self._remember(hashes, match)

    def _remember(self, hashes: tuple[int, ...], match: PrefixMatch) -> None:
        memos = self._memos
        if len(memos) >= _MAX_MEMOS and id(hashes) not in memos:
            memos.popitem(last=False)  # the oldest
        host = self.host
        memos[id(hashes)] = (
            hashes,
            self._version,
            self._num_removals,
            host.num_offloaded,
            len(host),
            match,
        )

    def _proven(self, hashes: tuple[int, ...]) -> int:
        """How many leading `hashes` are indexed, known without a lookup for each: those
        of a freed run ending at one of the last hashes that is still untouched (its
        blocks hold what they held when freed, compared as one tuple) and the head before
        it, looked up; 0 when no such run is known. Lost content (eviction under
        pressure) makes a remembered match stale, and a walk of the whole prompt in a
        dict of the pool's every hash costs a cache miss or two per hash."""
        if not self._marked:
            return 0
        runs = self._freed_runs
        for end in range(len(hashes), max(0, len(hashes) - _MAX_RUN_LOOKBACK), -1):
            run = runs.get(hashes[end - 1])
            if run is None or len(run.block_ids) != end:
                continue
            start = run.start
            if self._untouched(run) and run.hashes == hashes[start:end]:
                head = len(list(takewhile(self._index.__contains__, hashes[:start])))
                return end if head == start else head
        return 0

    def _match(self, hashes: Sequence[int], limit: int | None, start: int = 0) -> PrefixMatch:
        # the leading run of indexed hashes, counted in C (prompts run to 1,000s of blocks);
        # the first `start` are known to be indexed
        if limit is not None and limit < len(hashes):
            hashes = hashes[:limit]
        index = self._index
        n = start + len(list(takewhile(index.__contains__, islice(hashes, start, None))))
        host = self.host
        if not len(host) or n == len(hashes):
            return PrefixMatch(n, 0)
        return PrefixMatch(n, held_run(host.contents(), hashes, n))

    def holds(self, block_hash: int) -> bool:
        return block_hash in self._index

    def block_of(self, block_hash: int) -> int | None:
        return self._index.get(block_hash)

    def hash_of(self, block_id: int) -> int | None:
        return self._hash[block_id]

    def ref_count(self, block_id: int) -> int:
        return max(self._ref[block_id], 0)

    def cached_hashes(self) -> list[int]:
        return list(self._index)

    # -- mutations -------------------------------------------------------------------
    def acquire_cached(self, hashes: Sequence[int]) -> list[int]:
        """Take a reference on the device blocks of `hashes` (all must be indexed)."""
        ids, start, end = self._locate(hashes)
        self._acquire_located(ids, start, end, *self._outside_run(ids, start, end))
        return ids

    def try_acquire_and_allocate(
        self, cached_hashes: Sequence[int], num_new: int
    ) -> list[int] | None:
        """`acquire_cached(cached_hashes)` followed by `try_allocate(num_new)`, all or
        nothing: None (and nothing taken) when the new blocks would not fit once the
        cached ones are held. The cached blocks come first in the list returned."""
        ids, start, end = self._locate(cached_hashes)
        others, counts, num_unused = self._outside_run(ids, start, end)
        if num_new > self.num_free_blocks - num_unused:
            return None
        self._acquire_located(ids, start, end, others, counts, num_unused)
        new_ids = self.try_allocate(num_new)
        assert new_ids is not None
        ids += new_ids
        return ids

    def _locate(self, hashes: Sequence[int]) -> tuple[list[int], int, int]:
        """The device blocks holding `hashes` (all indexed), in order, and where in them
        one untouched run of candidates lies, `ids[start:end]` (0, 0 if none is known).
        A run freed recently that ends at one of the last hashes is taken instead of
        looked up: its candidate part checked as a whole when the eviction strategy
        still holds it untouched (each block then holds what it held when freed), the
        rest block by block (a block holding a hash is the index's entry for it); the
        few blocks after it (a context grown since, a prefix pulled) are looked up."""
        runs, index = self._freed_runs, self._index
        for end in range(len(hashes), max(0, len(hashes) - _MAX_RUN_LOOKBACK), -1):
            run = runs.get(hashes[end - 1])
            if run is None or len(run.block_ids) != end:
                continue
            ids = run.block_ids
            start = run.start
            if self._untouched(run):
                if run.hashes == tuple(hashes[start:end]) and self._holds(
                    ids[:start], hashes[:start]
                ):
                    return ids + list(map(index.__getitem__, hashes[end:])), start, end
            elif self._holds(ids, hashes[:end]):
                return ids + list(map(index.__getitem__, hashes[end:])), 0, 0
        return list(map(index.__getitem__, hashes)), 0, 0

    def _untouched(self, run: _FreedRun) -> bool:
        """Whether the strategy still holds `run`'s candidate part as its free queued it,
        none taken since: each of those blocks then holds what it held when freed
        (`run.hashes`)."""
        ids = run.block_ids
        return (
            bool(run.mark)
            and self._ref[ids[-1]] == run.mark
            and self.eviction.run_at(ids[-1]) == len(ids) - run.start
        )

    def _holds(self, block_ids: list[int], hashes: Sequence[int]) -> bool:
        """Whether these blocks hold these hashes, in order."""
        return list(map(self._hash.__getitem__, block_ids)) == _as_list(hashes)

    def _outside_run(
        self, ids: list[int], start: int, end: int
    ) -> tuple[list[int], list[int], int]:
        """For located blocks (`_locate`): the blocks outside the untouched run
        `ids[start:end]`, their reference counts, and how many of `ids` are unused."""
        others = ids[:start] + ids[end:] if end else ids
        counts = list(map(self._ref.__getitem__, others))
        return others, counts, end - start + _num_unused(counts)

    def _remember_run(
        self,
        block_ids: Sequence[int],
        cached_ids: list[int],
        cached_hashes: list[int],
        held_run: Sequence[int] | None = None,
    ) -> None:
        """Remember `block_ids` as a freed run (`_FreedRun`). `cached_ids` went to the
        strategy with `cached_hashes` in one call; `held_run`, when given, says they are
        the held prefix's last blocks (tail first) and holds their hashes in order."""
        held = self._hash
        end = len(block_ids)
        while end and held[block_ids[end - 1]] is None:  # a tail still filling
            end -= 1
            if len(block_ids) - end > 8:
                return
        last = held[block_ids[end - 1]] if end else None
        if last is None:
            return
        start, mark, hashes = 0, 0, None
        num = len(cached_ids)
        # the blocks up to `end` that went to the strategy (tail first, in one call) are
        # usually its last ones (the first are shared, still read by others)
        if self._marked and num and cached_ids[0] == block_ids[end - 1]:
            if held_run is not None:  # they end the held prefix, so are its last ones
                start, mark = end - num, min(self._ref[cached_ids[0]], 0)
                hashes = held_run if type(held_run) is tuple else tuple(held_run)
            elif num <= end and cached_ids[::-1] == _as_list(block_ids[end - num : end]):
                start, mark = end - num, min(self._ref[cached_ids[0]], 0)
                hashes = tuple(reversed(cached_hashes))
        runs = self._freed_runs
        runs.pop(last, None)
        runs[last] = _FreedRun(_as_list(block_ids[:end]), start, hashes, mark)
        if len(runs) > _MAX_FREED_RUNS:
            runs.popitem(last=False)

    def _acquire_located(
        self,
        ids: list[int],
        start: int,
        end: int,
        others: list[int],
        counts: list[int],
        num_unused: int,
    ) -> None:
        """Take a reference on `ids`: `ids[start:end]` one untouched run of candidates
        (one call takes them from the strategy), `others` the rest, with reference
        counts `counts`; `num_unused` unused blocks in all."""
        if end:
            self.eviction.remove_run(ids[end - 1])
            self._num_in_use += end - start
            ref = self._ref
            for block_id in islice(ids, start, end):
                ref[block_id] = 1
            num_unused -= end - start
        if others:
            self._acquire_counted(others, counts, num_unused)

    def _acquire_counted(self, ids: list[int], counts: list[int], num_unused: int) -> None:
        # the hot path of every cache hit, given the blocks' reference counts: unused
        # blocks leave the eviction candidates in one call (their words are overwritten
        # right after, as `bind_blocks` asks), then every count goes up (the blocks of a
        # prefix are distinct: chained hashes never repeat in one)
        ref = self._ref
        if num_unused == len(ids):  # a freed context taken up again: usual
            if ids:
                self.eviction.remove_many(ids)
                self._num_in_use += num_unused
            for block_id in ids:
                ref[block_id] = 1
            return
        if num_unused:
            self.eviction.remove_many(list(compress(ids, map(_UNUSED, counts))))
            self._num_in_use += num_unused
            for block_id, count in zip(ids, counts, strict=True):
                ref[block_id] = count + 1 if count > 0 else 1
            return
        for block_id, count in zip(ids, counts, strict=True):
            ref[block_id] = count + 1

    def try_allocate(self, num_blocks: int) -> list[int] | None:
        """Take `num_blocks` empty blocks, evicting cached ones if needed; None if short.
        Empty blocks come first (returned ones, last returned first, then never used
        ones), then the eviction strategy's victims in its order."""
        if num_blocks > self.num_free_blocks:
            return None
        free, ref = self._free, self._ref
        k = min(num_blocks, len(free))
        ids = free[len(free) - k :]
        ids.reverse()
        del free[len(free) - k :]
        fresh = min(num_blocks - k, self._num_fresh)
        if fresh:
            first = len(ref)
            ref.extend([0] * fresh)
            self._hash.extend([None] * fresh)
            ids.extend(range(first, first + fresh))
        if len(ids) < num_blocks:
            victims = self.eviction.pop_many(num_blocks - len(ids))
            assert len(victims) == num_blocks - len(ids), "eviction strategy lost a block"
            # the strategy's order does not read the index or the host tier: the victims'
            # content is forgotten after the last pop, in one pass
            self._forget_many(victims, self.offload_on_evict)
            ids += victims
            self.num_evicted_blocks += num_blocks - k - fresh
        for block_id in ids:
            ref[block_id] = 1
        self._num_in_use += num_blocks
        return ids

    def _forget(self, block_id: int, offload: bool) -> None:
        self._forget_many([block_id], offload)

    def _forget_many(self, block_ids: list[int], offload: bool) -> None:
        """`_forget` each block in turn: the listener and the host tier hear of the lost
        hashes in one call each, in the same order."""
        held, index = self._hash, self._index
        lost: list[int] = []
        for block_id in block_ids:
            h = held[block_id]
            if h is not None:
                if index.get(h) == block_id:
                    del index[h]
                    lost.append(h)
                held[block_id] = None
        if lost:
            self._version += len(lost)
            self._num_removals += len(lost)
            if self.listener is not None:
                self.listener.on_device_many(lost, False)
            if offload:
                self.host.store_many(lost)

    def commit(self, block_id: int, block_hash: int) -> bool:
        """Record a full block's content so later requests can hit it.

        Returns False when another block already holds that content (the block stays
        private to its sequence and is freed as empty).
        """
        if self._ref[block_id] <= 0:
            raise ValueError(f"commit on block {block_id} which is not in use")
        if self._hash[block_id] is not None:
            return self._index.get(block_hash) == block_id
        if block_hash in self._index:
            return False
        self._hash[block_id] = block_hash
        self._index[block_hash] = block_id
        self._version += 1
        if self.listener is not None:
            self.listener.on_device(block_hash, True)
        return True

    def commit_many(self, block_ids: Sequence[int], block_hashes: Sequence[int]) -> int:
        """`commit` each block with its hash, in order (a sequence's newly computed full
        blocks); the listener hears of the new hashes in one call. Returns how many
        blocks took their hash into the index."""
        refs, held, index = self._ref, self._hash, self._index
        added: list[int] = []
        for block_id, block_hash in zip(block_ids, block_hashes, strict=True):
            if refs[block_id] <= 0:
                raise ValueError(f"commit on block {block_id} which is not in use")
            if held[block_id] is not None or block_hash in index:
                continue
            held[block_id] = block_hash
            index[block_hash] = block_id
            added.append(block_hash)
        if added:
            self._version += len(added)
            if self.listener is not None:
                self.listener.on_device_many(added, True)
        return len(added)

    def store_host(self, block_hash: int) -> None:
        """Write-through offload: copy a block's content to the host tier now."""
        self.host.store(block_hash)

    def free(self, block_ids: Sequence[int], held_hashes: Sequence[int] = ()) -> None:
        """Drop one reference on each block. Pass a sequence's blocks in order: they are
        released tail first, so LRU evicts a finished sequence's tail before its prefix.
        `held_hashes`, when given, are what the leading blocks are known to hold (a
        sequence's cached and committed prefix): those blocks' content is not read."""
        cached_ids, cached_hashes, held_run = self._release(block_ids, held_hashes)
        self._remember_run(block_ids, cached_ids, cached_hashes, held_run)

    def _release(
        self, block_ids: Sequence[int], held_hashes: Sequence[int] = ()
    ) -> tuple[list[int], list[int], Sequence[int] | None]:
        """Drop a reference on each block, tail first; returns the blocks that became
        candidates, in the order given to the strategy, with their hashes, and (when
        those are exactly the held blocks from some place on) their hashes in order,
        a slice of `held_hashes`. The first `len(held_hashes)` blocks hold those hashes
        (the caller knows): in a pool far larger than the cache, reading each block's
        slot of `_hash` is a cache miss."""
        cached_ids: list[int] = []
        cached_hashes: list[int] = []
        num_empty_before = len(self._free)
        num_held = len(held_hashes)
        if num_held > len(block_ids):
            raise ValueError(f"{num_held} held hashes for {len(block_ids)} blocks")
        held_run: Sequence[int] | None = None
        tail_first = reversed(block_ids)
        self._release_each(islice(tail_first, len(block_ids) - num_held), cached_ids, cached_hashes)
        if num_held:
            held_run = self._release_held(
                tail_first, block_ids, held_hashes, cached_ids, cached_hashes
            )
        if cached_ids:
            self.eviction.add_many(cached_ids, cached_hashes)
        self._num_in_use -= len(cached_ids) + len(self._free) - num_empty_before
        return cached_ids, cached_hashes, held_run

    def _release_each(
        self, tail_first: Iterator[int], cached_ids: list[int], cached_hashes: list[int]
    ) -> None:
        """`_release`'s pass block by block, reading each candidate's content: a block
        without content goes to the free list, one with content to the candidates."""
        refs, hashes, empty, marked = self._ref, self._hash, self._free, self._marked
        for block_id in tail_first:
            ref = refs[block_id]
            if ref == 1:
                # content held by a block is always the index's entry for it (commit,
                # prefetch and import set both; _forget clears both)
                h = hashes[block_id]
                if h is None:
                    refs[block_id] = 0
                    empty.append(block_id)
                else:
                    if not marked:
                        refs[block_id] = 0
                    cached_ids.append(block_id)
                    cached_hashes.append(h)
            elif ref > 1:
                refs[block_id] = ref - 1
            else:
                raise ValueError(f"free of block {block_id} with ref count {max(ref, 0)}")

    def _release_held(
        self,
        tail_first: Iterator[int],
        block_ids: Sequence[int],
        held_hashes: Sequence[int],
        cached_ids: list[int],
        cached_hashes: list[int],
    ) -> Sequence[int] | None:
        """`_release`'s pass over the held blocks (`tail_first` goes on with them), adding
        to its candidates; returns their hashes in order (a slice of `held_hashes`) when
        the candidates are the held blocks from some place on and no others. Usually the
        blocks no one else reads are those after a shared head: handed over as slices,
        their counts read in one pass, not block by block."""
        refs = self._ref
        num_held = len(held_hashes)
        held_ids = _as_list(block_ids[:num_held])
        counts = list(map(refs.__getitem__, held_ids))
        first = counts.index(1) if 1 in counts else num_held
        if counts.count(1) != num_held - first:  # a candidate before a shared block: rare
            # block by block, the content read from the pool: a held block's is the told hash
            self._release_each(tail_first, cached_ids, cached_hashes)
            return None
        for block_id, ref in zip(held_ids[:first], counts, strict=False):
            if ref <= 1:
                raise ValueError(f"free of block {block_id} with ref count {max(ref, 0)}")
            refs[block_id] = ref - 1
        if first == num_held:
            return None
        unread = held_ids[first:]
        unread.reverse()
        if not self._marked:
            for block_id in unread:
                refs[block_id] = 0
        forward = held_hashes[first:]
        held_run = None if cached_ids else forward  # none after the held blocks: usual
        cached_ids += unread
        cached_hashes += reversed(forward)
        return held_run

    def drop(self, hashes: Sequence[int]) -> int:
        """Free dead content at once (compaction, truncation, a finished session): unused
        device blocks go straight to the free list and host copies are forgotten. Blocks
        still read by a running sequence are left alone. Returns device blocks freed."""
        n = self._free_unused(hashes, offload=False)
        self.host.drop(hashes)
        self.num_dropped_blocks += n
        return n

    def offload(self, hashes: Sequence[int]) -> int:
        """Move unused cached blocks to the host tier and free their device blocks now.
        Blocks in use are left alone. Returns device blocks freed."""
        return self._free_unused(hashes, offload=True)

    def _free_unused(self, hashes: Sequence[int], *, offload: bool) -> int:
        """Take the unused device blocks holding `hashes` off the eviction candidates,
        forget their content (a host copy kept when `offload`) and free them now."""
        n = 0
        for h in hashes:
            block_id = self._index.get(h)
            if block_id is not None and self._ref[block_id] <= 0:
                self.eviction.remove(block_id)
                self._ref[block_id] = 0
                self._forget(block_id, offload=offload)
                self._free.append(block_id)
                n += 1
        return n

    def prefetch(self, hashes: Sequence[int]) -> int:
        """Bring host copies of `hashes` into empty device blocks (never evicting), as
        cached unused blocks. Stops at the first hash the host lacks or when no empty block
        is left. Returns blocks brought in."""
        if not self.host:  # nothing to bring: skip the walk past the device-held prefix
            return 0
        ids: list[int] = []
        brought: list[int] = []
        index, host = self._index, self.host
        for h in filterfalse(index.__contains__, hashes):  # checked as the loop reaches h
            if h not in host:
                break
            block_id = self._take_empty()
            if block_id is None:
                break
            self._hash[block_id] = h
            index[h] = block_id
            ids.append(block_id)
            brought.append(h)
        if brought:
            if self.listener is not None:
                self.listener.on_device_many(brought, True)
            self.eviction.add_many(ids, brought)
            self._version += len(brought)
        return len(brought)

    def import_cached(self, hashes: Sequence[int]) -> int:
        """Install content received from another node as cached unused blocks, evicting
        if needed (a prefix pulled ahead of a prefill). Returns blocks installed: the
        first ones missing here, as many as fit."""
        index = self._index
        missing = list(dict.fromkeys(filterfalse(index.__contains__, hashes)))
        missing = missing[: self.num_free_blocks]
        if not missing:
            return 0
        ids = self.try_allocate(len(missing))
        assert ids is not None
        self._version += 1
        held = self._hash
        for block_id, h in zip(ids, missing, strict=True):
            held[block_id] = h
        index.update(zip(missing, ids, strict=True))
        if self.listener is not None:
            self.listener.on_device_many(missing, True)
        self._release(ids)  # unused now: cached, evictable tail first (not a prefix run)
        return len(missing)

    def clear(self) -> None:
        """Lose every cached block (a worker restart). Blocks in use must be freed first."""
        if self._num_in_use:
            raise ValueError(f"clear with {self._num_in_use} blocks in use")
        for block_id in list(self._index.values()):
            self.eviction.remove(block_id)
            self._forget(block_id, offload=False)
        self._ref.clear()  # the list the strategy was bound to
        self._hash, self._free = [], []
        self._freed_runs.clear()
        self._version += 1
        self._num_removals += 1
        self.host.clear()

    # -- integrity -------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Raise AssertionError unless free + evictable + in use == total, every index
        entry points at a live block holding that hash, and ref counts agree."""
        total = self.num_device_blocks
        seen = len(self._ref)
        if len(self._hash) != seen or seen > total:
            raise AssertionError(f"block state for {seen} blocks of {total}")
        free = set(self._free)
        if len(free) != len(self._free) or any(b >= seen for b in free):
            raise AssertionError("a block is on the free list twice or was never handed out")
        in_use = {b for b in range(seen) if self._ref[b] > 0}
        evictable = {b for b in range(seen) if b in self.eviction}
        if len(evictable) != len(self.eviction):
            raise AssertionError("eviction strategy holds unknown blocks")
        marked = {b for b in range(seen) if self._ref[b] < 0}
        if marked - evictable or (marked and not self._marked):
            raise AssertionError(f"blocks {sorted(marked - evictable)[:5]} marked, not candidates")
        if free & in_use or free & evictable or in_use & evictable:
            raise AssertionError("a block is in two states")
        num_free = len(free) + self._num_fresh
        if num_free + len(evictable) + len(in_use) != total:
            raise AssertionError(
                f"free {num_free} + evictable {len(evictable)} + in use {len(in_use)}"
                f" != total {total}"
            )
        if len(in_use) != self._num_in_use:
            raise AssertionError(f"in-use counter {self._num_in_use} != {len(in_use)}")
        for h, block_id in self._index.items():
            if self._hash[block_id] != h:
                raise AssertionError(f"index entry {h:x} points at block {block_id} without it")
            if block_id in free:
                raise AssertionError(f"index entry {h:x} points at free block {block_id}")
        for block_id, content in enumerate(self._hash):
            if content is not None and self._index.get(content) != block_id:
                raise AssertionError(f"block {block_id} holds {content:x} but is not indexed")
        for block_id in evictable:
            content = self._hash[block_id]
            if content is None or self._index.get(content) != block_id:
                raise AssertionError(f"evictable block {block_id} is not indexed")
        for block_id in free:
            if self._hash[block_id] is not None:
                raise AssertionError(f"free block {block_id} still has content")
        self.host.check_integrity()
