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
from itertools import count

from evinfra.core.sequence import DecodeClock, Sequence

_Entry = tuple[int, int, int, Sequence]
"""(clock step, run position, push number, sequence): unique before the sequence."""


class DecodeBatch:
    def __init__(self, block_size: int) -> None:
        self.clock = DecodeClock()
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
        return len(self._finish)

    def __contains__(self, seq: object) -> bool:
        return seq in self._finish

    # -- membership --------------------------------------------------------------------
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
        """The fewest outputs any sequence on the clock has left (None when empty)."""
        heap, finish = self._finish_heap, self._finish
        while heap:
            key, pos, _, seq = heap[0]
            if finish.get(seq) == key and pos == seq.run_pos:
                return key - self.clock.steps
            heapq.heappop(heap)
        return None

    def rooms(self) -> list[int]:
        """Per sequence on the clock (not being handled), tokens it can still decode into
        its blocks before the next one needs a new block."""
        now = self.clock.steps
        return [key - now for key in self._need.values()]

    def num_context_tokens(self) -> int:
        """Sum of num_computed_tokens + 1 over the sequences on the clock."""
        n = len(self._finish)
        return self._context_offset + n * (self.clock.steps + 1)

    def _compact(self, index: dict[Sequence, int]) -> list[_Entry]:
        heap = [(key, seq.run_pos, next(self._push_id), seq) for seq, key in index.items()]
        heapq.heapify(heap)
        return heap

    def check_integrity(self, running: list[Sequence]) -> None:
        on_clock = [s for s in running if s in self._finish]
        if len(on_clock) != len(self._finish):
            raise AssertionError("a sequence on the decode clock is not running")
        for seq in on_clock:
            if self._finish[seq] != seq.finish_step:
                raise AssertionError(f"sequence {seq.seq_id}: stale finish step")
            if seq in self._need and self._need[seq] != seq.need_step(self._block_size):
                raise AssertionError(f"sequence {seq.seq_id}: stale need step")
        context = sum(s.num_computed_tokens + 1 for s in on_clock)
        if context != self.num_context_tokens():
            raise AssertionError(f"decode context {self.num_context_tokens()} != {context}")


def _first(item: tuple[int, Sequence]) -> int:
    return item[0]
