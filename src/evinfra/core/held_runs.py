"""A shared head of blocks held with one reference count (SGLang's `lock_ref` per radix
node, not per block): the system prompt that every running sequence of a node reads is
acquired and released hundreds of times a minute, and counting each of its blocks on every
call was a third of the blocks a call counted.

A held run is a list of blocks in use whose readers, all reading every block of the run,
are counted once, in `num_holders`; each block's word in the pool's reference-count list
is `HELD` plus its readers counted on their own (those that acquired or released some of
its blocks one by one). So a block's reference count is its word minus `HELD` plus its
run's holders, every word of a run is > 0 (in use, as for any block read), and taking or
dropping the whole run is O(1). The words keep the run's holders out, so one reader
taking its blocks one by one changes nothing the run knows; one that would take the last
count off a block's own part (a word of `HELD`) dissolves the run first (`dissolve`): the
holders go back into every block's word.
"""

from __future__ import annotations

HELD = 1 << 40
"""Added to the word of every block of a held run: above any count of readers."""


class HeldRun:
    __slots__ = ("block_ids", "num_holders")

    def __init__(self, block_ids: list[int], num_holders: int) -> None:
        self.block_ids = block_ids
        """The run's blocks, in the order its holders list them (a prefix of each)."""
        self.num_holders = num_holders
        """Readers of every block of the run counted here, not in the blocks' words."""


class HeldRuns:
    """The held runs of one pool, by member block."""

    def __init__(self, words: list[int]) -> None:
        self._words = words
        self.of: dict[int, HeldRun] = {}
        """Every block of a held run -> its run (a block is in at most one)."""
        self.num_held = 0
        """Held runs made, for tests and statistics."""
        self.num_dissolved = 0

    def at_head(self, block_ids: list[int]) -> HeldRun | None:
        """The held run whose blocks `block_ids` starts with, if any."""
        run = self.of.get(block_ids[0]) if block_ids else None
        if run is None or block_ids[: len(run.block_ids)] != run.block_ids:
            return None
        return run

    def hold(self, block_ids: list[int], num_holders: int) -> None:
        """Hold blocks in use that no held run holds, every one read by exactly
        `num_holders` readers now, as one run with that count (the readers are not
        told apart: any release of every block of the run takes one off it)."""
        run = HeldRun(block_ids, num_holders)
        words = self._words
        for block_id in block_ids:
            words[block_id] = HELD
        self.of.update(dict.fromkeys(block_ids, run))
        self.num_held += 1

    def dissolve(self, run: HeldRun) -> None:
        """Give every block of `run` its holders back in its word and forget the run."""
        words, of, num_holders = self._words, self.of, run.num_holders
        for block_id in run.block_ids:
            words[block_id] += num_holders - HELD
            del of[block_id]
        run.num_holders = 0
        self.num_dissolved += 1

    def count(self, block_id: int) -> int:
        """The reference count of a block of a held run (its word is >= `HELD`)."""
        return self._words[block_id] - HELD + self.of[block_id].num_holders

    def clear(self) -> None:
        self.of.clear()

    def check_integrity(self, hashes: list[int | None], index: dict[int, int]) -> None:
        """Raise AssertionError unless the blocks whose word is >= `HELD` are exactly
        the members of the held runs (so no block's own readers are negative), each
        run's blocks distinct and mapped to it, each run held, and each held block
        holding indexed content (`hashes`, `index`: the pool's; a held run is made of
        blocks acquired cached)."""
        words, of = self._words, self.of
        members = {b for b, word in enumerate(words) if word >= HELD}
        if members != set(of):
            raise AssertionError(f"blocks {sorted(members ^ set(of))[:5]} held without a run")
        for block_id, run in of.items():
            if run.num_holders < 1:
                raise AssertionError(f"held run at block {block_id} has no holder")
            if len(set(run.block_ids)) != len(run.block_ids):
                raise AssertionError(f"held run at block {block_id} repeats a block")
            if any(of.get(b) is not run for b in run.block_ids):
                raise AssertionError(f"held run at block {block_id} is not its blocks' run")
            content = hashes[block_id]
            if content is None or index.get(content) != block_id:
                raise AssertionError(f"held block {block_id} holds no indexed content")
