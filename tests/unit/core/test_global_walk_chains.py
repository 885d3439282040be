"""The global index walks a prompt that extends one it walked before only from where each
node's old run is still known to hold (`_Chain.clean`): its answers must equal a fresh
walk after any mix of pool changes, prompts that grow, fork, shrink or repeat hashes,
and remembered prompts being forgotten."""

from hypothesis import example, given, settings
from hypothesis import strategies as st

from evinfra.core.global_index import GlobalBlockIndex
from evinfra.core.kv_pool import KVPool

ops = st.lists(
    st.tuples(
        st.sampled_from(["grow", "fork", "cut", "alloc", "free", "drop", "offload", "prefetch"]),
        st.integers(0, 2),
        st.integers(0, 2),
        st.lists(st.integers(0, 11), min_size=1, max_size=5),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(ops, st.integers(1, 4))
@example(  # a loss in the middle of a held run: the next walk starts before it
    [("grow", 0, 0, [1, 2, 3]), ("alloc", 0, 0, [2]), ("free", 0, 0, [0]), ("drop", 0, 0, [1])],
    1,
)
@example(  # losses by eviction, then a grown prompt walked from the last clean place
    [
        ("grow", 0, 0, [1, 2, 3, 4]),
        ("alloc", 0, 1, [3]),
        ("free", 0, 1, [0]),
        ("grow", 1, 0, [5, 6, 7, 8, 9]),
        ("alloc", 1, 1, [4]),
        ("grow", 0, 0, [10]),
    ],
    2,
)
@example(  # a hash repeated in a prompt: its loss counts from its first place
    [("grow", 0, 0, [1, 2, 1]), ("alloc", 0, 0, [1]), ("free", 0, 0, [0]), ("drop", 0, 0, [2])],
    1,
)
@example(  # a fork takes over its parent's prompt; the parent's, walked anew, shares hashes
    [
        ("grow", 0, 0, [1, 2, 3]),
        ("alloc", 0, 0, [2]),
        ("fork", 2, 0, [4]),
        ("free", 0, 0, [0]),
        ("drop", 0, 0, [1]),
    ],
    4,
)
def test_chained_walks_equal_fresh_walks(
    seq: list[tuple[str, int, int, list[int]]], max_chains: int
) -> None:
    pools = [KVPool(7, 3) for _ in range(3)]
    index = GlobalBlockIndex(3, max_chains=max_chains)
    for i, pool in enumerate(pools):
        index.attach(pool, i)
    prompts: list[tuple[int, ...]] = [(), (), ()]
    held: list[list[list[int]]] = [[], [], []]
    for op, s, node, new in seq:
        pool = pools[node]
        prompt = prompts[s]
        if op == "grow":
            prompts[s] = prompt + tuple(new)
        elif op == "fork":
            prompts[s] = prompts[(s + 1) % 3] + tuple(new)
        elif op == "cut":
            prompts[s] = prompt[: new[0] % (len(prompt) + 1)]
        elif op == "alloc" and prompt:
            hashes = list(dict.fromkeys(prompt))[: new[0] + 1]
            m = pool.match_prefix(hashes).num_device_blocks
            if pool.can_allocate_after(len(hashes) - m, hashes[:m]):
                ids = pool.acquire_cached(hashes[:m])
                extra = pool.try_allocate(len(hashes) - m)
                assert extra is not None
                pool.commit_many(extra, hashes[m:])
                held[node].append(ids + extra)
        elif op == "free" and held[node]:
            pool.free(held[node].pop(new[0] % len(held[node])))
        elif op == "drop":
            pool.drop(prompt[new[0] % (len(prompt) + 1) :])
        elif op == "offload":
            pool.offload(prompt[new[0] % (len(prompt) + 1) :])
        elif op == "prefetch":
            pool.prefetch(prompt)
        for prompt in prompts:
            # a pool asked about a list walks it afresh
            assert index.match_all(prompt) == [p.match_prefix(list(prompt)) for p in pools]
    _check_watch(index, max_chains)


def _check_watch(index: GlobalBlockIndex, max_chains: int) -> None:
    """Every hash of a remembered prompt is watched for it, and only those are."""
    chains = list(index._chains.values())
    assert len(chains) <= max_chains
    expected = {(h, id(c)) for c in chains for h in c.hashes}
    watched = set()
    for h, seen in index._watch.items():
        for chain, place in [seen] if isinstance(seen, tuple) else seen.items():
            assert chain.hashes[place] == h
            watched.add((h, id(chain)))
    assert watched == expected
