"""A node's decode batch advanced by one step counter.

Every decode step moves each running sequence by one token. Instead of touching each
sequence, the batch moves a node-level `DecodeClock`; a sequence on the clock reads its
counters as its own value plus the clock's steps since it joined. What a step must still
do per sequence is known in advance from those counters: the step at which a sequence's
next token needs a block, and the step at which it has generated all its outputs. Two
heaps keyed by those steps hand the scheduler only the sequences due, so a step or a run
of steps costs O(sequences that need a block or finish), not O(batch).

Heap entries are dropped lazily: an entry is live while `_need`/`_finish` map its
sequence to the same key and the sequence still has the entry's run position (a held
sequence or one given blocks gets a new entry; one that left the clock has none; one that
joined again has a new position).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence as Seq
from itertools import count

from evinfra.core.kv_pool import KVPool
from evinfra.core.sequence import DecodeClock, Sequence

_Entry = tuple[int, int, int, Sequence]
"""(clock step, run position, push number, sequence): unique before the sequence."""


class DecodeBatch:
    """A node's running sequences: those on the clock, and those `joining` it: added since
    the last plan (the step in flight does not advance them; they join when the next step
    is planned)."""

    def __init__(self, block_size: int) -> None:
        self.clock = DecodeClock()
        self.joining: list[Sequence] = []
        self._block_size = block_size
        self._finish: dict[Sequence, int] = {}
        """Sequence on the clock -> the clock step at which it is done."""
        self._need: dict[Sequence, int] = {}
        """Sequence on the clock -> the clock step whose token needs a block it lacks
        (absent while the scheduler is handling it)."""
        self._finish_heap: list[_Entry] = []
        self._need_heap: list[_Entry] = []
        self._push_id = count()
        self._context_offset = 0
        """Sum over the sequences on the clock of num_computed_tokens - clock steps."""

    def __len__(self) -> int:
        """Sequences on the clock (not counting those joining)."""
        return len(self._finish)

    def __contains__(self, seq: object) -> bool:
        return seq in self._finish

    # -- membership --------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """A sequence starts decoding: it joins the clock at the next plan."""
        self.joining.append(seq)

    def remove(self, seq: Sequence) -> None:
        if seq in self._finish:
            self.leave(seq)
        else:
            self.joining.remove(seq)

    def join_all(self) -> None:
        for seq in self.joining:
            self.join(seq)
        self.joining = []

    def join_listed(self, seqs: Seq[Sequence]) -> None:
        """Those of `seqs` still joining join now (a decode run planned without a plan)."""
        if self.joining:
            listed = set(seqs)
            joining = [s for s in self.joining if s in listed]
            if joining:
                self.joining = [s for s in self.joining if s not in listed]
                for seq in joining:
                    self.join(seq)

    def join(self, seq: Sequence) -> None:
        seq.join_clock(self.clock)
        self._context_offset += seq.clock_offset
        self._track_finish(seq)
        self.track_need(seq)

    def leave(self, seq: Sequence) -> None:
        if seq not in self._finish:
            return
        self._context_offset -= seq.clock_offset
        del self._finish[seq]
        self._need.pop(seq, None)
        seq.leave_clock()

    def hold(self, seq: Sequence, num_steps: int) -> None:
        """`num_steps` steps of the clock did not include `seq`."""
        self._context_offset -= num_steps
        seq.hold(num_steps)
        self._track_finish(seq)
        if seq in self._need:
            self.track_need(seq)

    def advance(self, num_steps: int) -> None:
        self.clock.steps += num_steps

    # -- what is due ---------------------------------------------------------------------
    def track_need(self, seq: Sequence) -> None:
        """Re-read when `seq` next needs a block (after it got blocks, or was handled)."""
        key = seq.need_step(self._block_size)
        self._need[seq] = key
        heapq.heappush(self._need_heap, (key, seq.run_pos, next(self._push_id), seq))
        if len(self._need_heap) > 2 * len(self._need) + 64:
            self._need_heap = self._compact(self._need)

    def _track_finish(self, seq: Sequence) -> None:
        key = seq.finish_step
        self._finish[seq] = key
        heapq.heappush(self._finish_heap, (key, seq.run_pos, next(self._push_id), seq))
        if len(self._finish_heap) > 2 * len(self._finish) + 64:
            self._finish_heap = self._compact(self._finish)

    def take_needing(self, last_step: int) -> list[Sequence]:
        """Sequences whose token of a clock step up to `last_step` needs a block, in run
        order. They leave the need index: the caller gives them blocks (or not) and calls
        `track_need` for each still on the clock."""
        heap, need = self._need_heap, self._need
        out: list[tuple[int, Sequence]] = []
        while heap and heap[0][0] <= last_step:
            key, pos, _, seq = heapq.heappop(heap)
            if need.get(seq) == key and pos == seq.run_pos:
                del need[seq]
                out.append((pos, seq))
        out.sort(key=_first)
        return [seq for _, seq in out]

    def take_finished(self) -> list[Sequence]:
        """Sequences done at the clock's current step, in run order; raises if one
        overshot its output limit."""
        heap, finish, now = self._finish_heap, self._finish, self.clock.steps
        out: list[tuple[int, Sequence]] = []
        while heap and heap[0][0] <= now:
            key, pos, _, seq = heapq.heappop(heap)
            if finish.get(seq) == key and pos == seq.run_pos:
                if key < now:
                    raise ValueError(f"decode overshoots the output limit of {seq.seq_id}")
                out.append((pos, seq))
        out.sort(key=_first)
        return [seq for _, seq in out]

    def min_remaining_outputs(self) -> int | None:
        """The fewest outputs any running sequence has left (None when there is none)."""
        out = [s.num_remaining_outputs for s in self.joining]
        heap, finish = self._finish_heap, self._finish
        while heap:
            key, pos, _, seq = heap[0]
            if finish.get(seq) == key and pos == seq.run_pos:
                out.append(key - self.clock.steps)
                break
            heapq.heappop(heap)
        return min(out, default=None)

    def rooms(self) -> list[int]:
        """Per running sequence (but those being handled), tokens it can still decode into
        its blocks before the next one needs a new block."""
        now, bs = self.clock.steps, self._block_size
        out = [key - now for key in self._need.values()]
        out += [len(s.block_ids) * bs - s.num_computed_tokens for s in self.joining]
        return out

    def room_bound(self) -> tuple[int, int]:
        """How many rooms `rooms` lists, and a floor under every one of them (the need
        heap's first key may be stale, and lower than any live one): O(joining)."""
        num_rooms = len(self._need) + len(self.joining)
        floor = self._need_heap[0][0] - self.clock.steps if self._need else 0
        if self.joining:
            bs = self._block_size
            floor = min(
                floor, *(len(s.block_ids) * bs - s.num_computed_tokens for s in self.joining)
            )
        return num_rooms, floor

    def num_context_tokens(self) -> int:
        """Sum of num_computed_tokens + 1 over the running sequences."""
        n = len(self._finish)
        context = self._context_offset + n * (self.clock.steps + 1)
        return context + sum(s.num_computed_tokens + 1 for s in self.joining)

    def allocate_run(self, pool: KVPool, num_steps: int) -> None:
        """Give the sequences on the clock that cross a block boundary within `num_steps`
        steps their blocks from `pool`, in decode order."""
        bs = self._block_size
        due = self.take_needing(self.clock.steps + num_steps - 1)
        try:
            for seq in due:
                need = seq.num_blocks_needed(seq.num_computed_tokens + num_steps, bs)
                ids = pool.try_allocate(need)
                if ids is None:
                    raise ValueError(f"decode run of {num_steps} steps exceeds free KV")
                seq.block_ids.extend(ids)
        finally:
            for seq in due:
                self.track_need(seq)

    def _compact(self, index: dict[Sequence, int]) -> list[_Entry]:
        heap = [(key, seq.run_pos, next(self._push_id), seq) for seq, key in index.items()]
        heapq.heapify(heap)
        return heap

    def check_integrity(self, running: list[Sequence]) -> None:
        """Raise AssertionError unless the running sequences are, in join order, the ones
        on the clock and the joining ones, with every index entry current."""
        joining = self.joining
        if [s.run_pos for s in running] != sorted(s.run_pos for s in running):
            raise AssertionError("running sequences out of their join order")
        on_clock = [s for s in running if s in self._finish]
        if len(on_clock) != len(self._finish):
            raise AssertionError("a sequence on the decode clock is not running")
        if len(on_clock) + len(joining) != len(running) or any(s in self for s in joining):
            raise AssertionError("a running sequence is neither on the decode clock nor joining")
        for seq in on_clock:
            if self._finish[seq] != seq.finish_step:
                raise AssertionError(f"sequence {seq.seq_id}: stale finish step")
            if seq in self._need and self._need[seq] != seq.need_step(self._block_size):
                raise AssertionError(f"sequence {seq.seq_id}: stale need step")
        context = sum(s.num_computed_tokens + 1 for s in running)
        if context != self.num_context_tokens():
            raise AssertionError(f"decode context {self.num_context_tokens()} != {context}")


def longest_run(rooms: list[int], max_steps: int, num_free_blocks: int, block_size: int) -> int:
    """The most decode steps, up to `max_steps`, whose new blocks fit in `num_free_blocks`,
    given each sequence's room (tokens it can still decode into its blocks): a run of
    `steps` needs ceil((steps - room) / block_size) blocks for every room below `steps`."""
    rooms = sorted(rooms)

    def extra(steps: int) -> int:
        total = 0
        for room in rooms:
            if room >= steps:
                break
            total += (steps - room + block_size - 1) // block_size
        return total

    if extra(max_steps) <= num_free_blocks:
        return max_steps
    lo, hi = 0, max_steps  # extra(lo) fits, extra(hi) does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if extra(mid) <= num_free_blocks:
            lo = mid
        else:
            hi = mid
    return lo


def _first(item: tuple[int, Sequence]) -> int:
    return item[0]
