"""RunQueue keeps the exact order of an OrderedDict of blocks added in runs: removals,
re-adds, pops from the front and compactions never reorder what is queued."""

from collections import OrderedDict

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evinfra.core import run_queue
from evinfra.core.run_queue import RunQueue


def make_queue(*runs: list[int]) -> RunQueue:
    queue = RunQueue()
    for run in runs:
        queue.add_many(run, [100 + b for b in run])
    return queue


def test_pops_follow_add_order_and_skip_removed_blocks() -> None:
    queue = make_queue([3, 1, 2], [7, 5])
    queue.remove_many([1, 7])
    assert list(queue.items()) == [(3, 103), (2, 102), (5, 105)]
    assert [queue.pop_front() for _ in range(4)] == [(3, 103), (2, 102), (5, 105), None]
    assert len(queue) == 0


def test_a_block_added_again_moves_to_the_back_with_its_new_hash() -> None:
    queue = make_queue([1, 2, 3])
    queue.remove(2)
    queue.add(2, 999)
    queue.add_many([1], [555])  # still queued: moves too
    assert list(queue.items()) == [(3, 103), (2, 999), (1, 555)]
    queue.check_integrity()


def test_remove_many_returns_the_blocks_not_queued() -> None:
    queue = make_queue([1, 2])
    assert queue.remove_many([2, 9, 1, 8]) == [9, 8]
    assert queue.remove(1) is False
    with pytest.raises(ValueError, match="hashes"):
        queue.add_many([4, 5], [1])


def test_an_untouched_run_is_taken_whole() -> None:
    queue = make_queue([3, 1, 2], [7, 5], [9])
    assert (queue.run_at(3), queue.run_at(1), queue.run_at(7)) == (3, 0, 2)
    queue.remove(5)
    assert queue.run_at(7) == 0  # touched
    queue.remove_run(3)
    assert list(queue.items()) == [(7, 107), (9, 109)]
    assert queue.pop_front() == (7, 107)
    with pytest.raises(ValueError, match="untouched"):
        queue.remove_run(7)
    queue.check_integrity()


def test_bound_to_an_owner_the_queue_marks_its_words() -> None:
    words = [0] * 8
    queue = RunQueue(words)
    queue.add_many([4, 2], [14, 12])
    assert words[4] == words[2] < 0 and 4 in queue and 3 not in queue
    queue.remove_run(4)
    words[4] = words[2] = 1  # the owner overwrites them (a pool: a reference count)
    queue.check_integrity()
    assert len(queue) == 0 and queue.pop_front() is None


ops = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.integers(0, 30), max_size=8, unique=True)),
        st.tuples(st.just("remove"), st.lists(st.integers(0, 30), max_size=8)),
        st.tuples(st.just("pop"), st.integers(1, 4)),
        st.tuples(st.just("take"), st.integers(0, 30)),
        st.tuples(st.just("front"), st.tuples(st.integers(1, 6), st.integers(0, 6))),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops, st.booleans())
def test_same_order_as_an_ordered_dict(steps: list[tuple[str, object]], bound: bool) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_queue, "_MIN_STALE_TO_COMPACT", 2)  # compact often
        check_against_ordered_dict(steps, bound)


def check_against_ordered_dict(steps: list[tuple[str, object]], bound: bool) -> None:
    """Bound, the test is the owner: it adds only blocks not queued and overwrites the
    words of blocks it takes out."""
    words = [0] * 31
    queue = RunQueue(words) if bound else RunQueue()
    model: OrderedDict[int, int] = OrderedDict()
    runs: list[list[int]] = []  # each add call's blocks, while untouched
    for i, (op, arg) in enumerate(steps):
        if op == "add":
            assert isinstance(arg, list)
            if bound:
                arg = [b for b in arg if b not in model]
            runs = [r for r in runs if not set(r) & set(arg)]
            for b in arg:  # a queued block added again moves to the back
                model.pop(b, None)
                model[b] = 1000 * i + b
            queue.add_many(arg, [1000 * i + b for b in arg])
            if arg:
                runs.append(list(arg))
        elif op == "remove":
            assert isinstance(arg, list)
            if bound:
                arg = list(dict.fromkeys(arg))
            runs = [r for r in runs if not set(r) & set(arg)]
            missing = [b for b in arg if model.pop(b, None) is None]
            assert queue.remove_many(arg) == missing
            if bound:
                for b in arg:
                    words[b] = 0
        elif op == "take":
            assert isinstance(arg, int)
            run = next((r for r in runs if r[0] == arg), None)
            assert queue.run_at(arg) == (len(run) if run else 0)
            if run:
                queue.remove_run(arg)
                runs.remove(run)
                for b in run:
                    del model[b]
                    words[b] = 0
        elif op == "front":
            assert isinstance(arg, tuple)
            max_blocks, num_used = arg
            ids, hashes = queue.front(max_blocks)
            assert 0 < len(ids) <= max_blocks if model else ids == []
            assert list(zip(ids, hashes, strict=True)) == list(model.items())[: len(ids)]
            queue.take_front(min(num_used, len(ids)))
            for b in ids[:num_used]:
                del model[b]
                runs = [r for r in runs if b not in r]
        else:
            assert isinstance(arg, int)
            for _ in range(arg):
                expected = model.popitem(last=False) if model else None
                if expected is not None:
                    runs = [r for r in runs if expected[0] not in r]
                assert queue.pop_front() == expected
        queue.check_integrity()
        assert list(queue.items()) == list(model.items())
        assert len(queue) == len(model)
        assert all(b in queue for b in model)


lane_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("add"),
            st.tuples(st.integers(0, 2), st.lists(st.integers(0, 30), max_size=8, unique=True)),
        ),
        st.tuples(st.just("remove"), st.lists(st.integers(0, 30), max_size=8)),
        st.tuples(st.just("take"), st.integers(0, 30)),
        st.tuples(
            st.just("move"),
            st.tuples(st.integers(0, 2), st.integers(1, 9), st.integers(0, 2), st.booleans()),
        ),
    ),
    max_size=60,
)


@settings(max_examples=1000, deadline=None)
@given(lane_ops)
# a run that left its lane whole and came back behind another is no longer its front
@example(
    [
        ("add", (1, [0])),
        ("add", (1, [1])),
        ("move", (1, 1, 0, False)),
        ("move", (0, 1, 1, False)),
        ("move", (1, 1, 0, False)),
    ]
)
def test_lanes_keep_the_order_of_an_ordered_dict_each(steps: list[tuple[str, object]]) -> None:
    """Bound (a pool's words), three lanes: blocks moved from one lane's front, read as
    `front` gives them, join the other lane's back in order; a run moved whole keeps its
    state (still untouched: `run_at` counts it wherever it is), part of one moved is a
    new run; removal finds blocks in any lane."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_queue, "_MIN_STALE_TO_COMPACT", 2)
        words = [0] * 31
        queue = RunQueue(words, num_lanes=3)
        lanes: list[OrderedDict[int, int]] = [OrderedDict() for _ in range(3)]
        runs: list[tuple[list[int], list[int], bool]] = []  # blocks, live ones, untouched
        for i, (op, arg) in enumerate(steps):
            queued = {b for lane in lanes for b in lane}
            if op == "add":
                assert isinstance(arg, tuple)
                lane, blocks = arg
                blocks = [b for b in blocks if b not in queued]
                lanes[lane].update((b, 1000 * i + b) for b in blocks)
                queue.add_many(blocks, [1000 * i + b for b in blocks], lane)
                runs.append((blocks, list(blocks), True))
            elif op == "remove":
                assert isinstance(arg, list)
                blocks = list(dict.fromkeys(arg))
                assert queue.remove_many(blocks) == [b for b in blocks if b not in queued]
                runs = [
                    (
                        r,
                        [b for b in live if b not in blocks],
                        untouched and not set(r) & set(blocks),
                    )
                    for r, live, untouched in runs
                ]
                for b in blocks:
                    for lane in lanes:
                        lane.pop(b, None)
                    words[b] = 0
            elif op == "take":
                assert isinstance(arg, int)
                run = next((r for r in runs if r[2] and r[0][0] == arg), None)
                assert queue.run_at(arg) == (len(run[0]) if run else 0)
                if run:
                    queue.remove_run(arg)
                    runs.remove(run)
                    for b in run[0]:
                        for lane in lanes:
                            lane.pop(b, None)
                        words[b] = 0
            else:
                assert isinstance(arg, tuple)
                src, num, dst, whole = arg
                ids, hashes = queue.front(1 << 30 if whole else num, src)
                assert list(zip(ids, hashes, strict=True)) == list(lanes[src].items())[: len(ids)]
                moved = ids[: min(num, len(ids))] if not whole else ids
                queue.move_front(len(moved), src, dst)
                if src != dst and moved:
                    for b in moved:
                        lanes[dst][b] = lanes[src].pop(b)
                    if not any(live == moved for _, live, _ in runs):  # part of a run
                        runs = [
                            (r, [b for b in live if b not in moved], False)
                            if set(live) & set(moved)
                            else (r, live, untouched)
                            for r, live, untouched in runs
                        ] + [(moved, list(moved), True)]
            runs = [r for r in runs if r[1]]
            queue.check_integrity()
            for lane, model in enumerate(lanes):
                assert list(queue.items(lane)) == list(model.items())
                assert queue.lane_sizes[lane] == len(model)
                assert all(queue.lane_of(b) == lane for b in model)
            assert len(queue) == sum(map(len, lanes))
