"""KV transfer links: a transfer holds its source's egress and its destination's ingress for
its duration and starts at the earliest time both are free that long; an end idle while
another transfer waits on its other end takes the next transfer in the gap, so the
cluster's queues stay bounded at any size."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.sim.links import LinkModel

EPS = 1e-9


def fixed(dur_s: float) -> LinkModel:
    return LinkModel(8, lambda src, dst, num_bytes, num_blocks: dur_s * num_bytes)


def test_transfers_through_one_end_queue_in_turn() -> None:
    links = fixed(1.0)
    assert links.schedule(0.0, 0, 1, 1, 1) == 1.0
    assert links.schedule(0.0, 2, 1, 1, 1) == 2.0  # 1's ingress busy until 1
    assert links.schedule(0.5, 0, 3, 1, 1) == 2.0  # 0's egress busy until 1
    assert links.busy_s == 3.0 and links.num_transfers == 3


def test_an_end_waiting_on_its_other_end_is_not_held() -> None:
    links = fixed(1.0)
    assert links.schedule(0.0, 0, 1, 3, 1) == 3.0  # 0's egress busy over [0, 3)
    # 0 -> 2 waits for 0's egress: [3, 4) on 2's ingress, which is free until then
    assert links.schedule(0.0, 0, 2, 1, 1) == 4.0
    # 3 -> 2 fits before it (a single "free from" time per end would start it at 4)
    assert links.schedule(0.5, 3, 2, 2, 1) == 2.5
    # a gap too short is passed over: [2.5, 3) on 2's ingress holds 0.5 s, not 1
    assert links.schedule(0.5, 4, 2, 1, 1) == 5.0


def test_nothing_to_move_takes_no_time_and_books_nothing() -> None:
    links = fixed(1.0)
    links.schedule(0.0, 0, 1, 5, 1)
    assert links.schedule(1.0, 0, 1, 0, 0) == 1.0
    assert links.schedule(1.0, 2, 3, 1, 1) == 2.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(0.0, 2.0),
            st.integers(0, 3),
            st.integers(0, 3),
            st.integers(1, 4),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_each_transfer_takes_the_earliest_start_free_on_both_ends(
    steps: list[tuple[float, int, int, int]],
) -> None:
    links = LinkModel(4, lambda s, d, b, n: 0.25 * b)
    booked: dict[tuple[str, int], list[tuple[float, float]]] = {}
    now = 0.0
    for gap, src, dst, size in steps:
        now += gap
        dur = 0.25 * size
        end = links.schedule(now, src, dst, size, 1)
        start = end - dur  # up to rounding
        ends = (booked.setdefault(("out", src), []), booked.setdefault(("in", dst), []))

        def free(
            t: float, dur: float = dur, ends: tuple[list[tuple[float, float]], ...] = ends
        ) -> bool:
            return all(e <= t + EPS or t + dur <= s + EPS for b in ends for s, e in b)

        assert start >= now - EPS and free(start)
        # no earlier start fits: every candidate is now or the end of a booked interval
        candidates = [now] + [e for b in ends for _, e in b if now <= e < start]
        assert not any(free(t) for t in candidates if t < start - EPS)
        for b in ends:
            b.append((start, end))


def test_queues_stay_bounded_as_the_cluster_grows() -> None:
    # uniform random pairs with each end 40% in use: the waits of 4 nodes and of 64
    # nodes are alike (one "free from" time per end queued 64 nodes without bound:
    # P95 wait over 100 s in 300 s)
    def p95_wait_s(num_nodes: int) -> float:
        rng = random.Random(0)
        dur = 0.014
        links = LinkModel(num_nodes, lambda s, d, b, n: dur)
        rate = 0.4 * num_nodes / dur
        t, waits = 0.0, []
        while t < 60.0:
            t += rng.expovariate(rate)
            src = rng.randrange(num_nodes)
            dst = rng.randrange(num_nodes - 1)
            dst += dst >= src
            waits.append(links.schedule(t, src, dst, 1, 1) - dur - t)
        waits.sort()
        return waits[int(0.95 * len(waits))]

    small, large = p95_wait_s(4), p95_wait_s(64)
    assert small < 0.05 and large < 0.05
    assert large < 2 * small
