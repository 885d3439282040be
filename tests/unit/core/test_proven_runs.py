"""The cluster-wide index takes a node's long device run from its pool's proof (a freed
run ending near the prompt's end, still untouched) instead of walking it: every answer
must still be the node's own walk, whatever evicted, dropped or reused blocks since."""

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.eviction import EvictionPolicy, LRUEviction, ScoredEviction
from evinfra.core.global_index import GlobalBlockIndex
from evinfra.core.kv_pool import KVPool
from evinfra.core.tiered_eviction import TieredEviction

_SHARED = tuple(range(1, 6))
"""A system prompt every session starts with."""


def _eviction(kind: str) -> EvictionPolicy:
    if kind == "lru":
        return LRUEviction()
    if kind == "tiered":
        return TieredEviction(lambda h: float(h % 3 == 0), [0.0, 1.0])
    return ScoredEviction(lambda h: float(h % 2))


class _Cluster:
    """Pools reporting to one index, and sessions whose contexts grow call by call."""

    def __init__(self, kind: str, num_nodes: int, num_blocks: int) -> None:
        self.pools = [KVPool(num_blocks, 8, _eviction(kind)) for _ in range(num_nodes)]
        self.index = GlobalBlockIndex(num_nodes, min_proof_blocks=0, min_head_blocks=2)
        for i, pool in enumerate(self.pools):
            self.index.attach(pool, i)
        self.contexts: dict[int, tuple[int, ...]] = {}
        self.next_hash = 1000

    def fresh(self, n: int) -> tuple[int, ...]:
        self.next_hash += n
        return tuple(range(self.next_hash - n, self.next_hash))

    def call(self, session: int, node: int, num_new: int, num_tail: int) -> None:
        """A session's next call on `node`: its context plus new blocks, prefilled there
        and freed with the blocks it knows (as the scheduler frees a finished call)."""
        prompt = self.contexts.get(session, _SHARED) + self.fresh(num_new)
        pool = self.pools[node]
        cached = pool.match_prefix(prompt).num_device_blocks
        ids = pool.try_acquire_and_allocate(prompt[:cached], len(prompt) - cached + num_tail)
        if ids is None:
            return
        added = pool.commit_many(ids[cached : len(prompt)], prompt[cached:])
        # as the scheduler tells it: the prefix known held, which a block that found its
        # content already indexed elsewhere ends
        pool.free(ids, held_hashes=prompt if added == len(prompt) - cached else prompt[:cached])
        self.contexts[session] = prompt

    def check(self) -> None:
        for context in self.contexts.values():
            for prompt in (context, context + self.fresh(3), context[:-2]):
                got = self.index.match_all(prompt)
                walked = [pool.match_prefix(list(prompt)) for pool in self.pools]
                assert got == walked, prompt


steps = st.lists(
    st.tuples(
        st.sampled_from(["call", "call", "call", "copy", "drop", "offload", "evict", "clear"]),
        st.integers(0, 3),  # session
        st.integers(0, 2),  # node
        st.integers(0, 6),  # new blocks (or blocks cut)
        st.integers(0, 2),  # blocks still filling
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["lru", "tiered", "scored"]), steps)
def test_proven_runs_are_the_walk_of_each_node(
    kind: str, seq: list[tuple[str, int, int, int, int]]
) -> None:
    cluster = _Cluster(kind, num_nodes=3, num_blocks=40)
    pools = cluster.pools
    for op, session, node, n, tail in seq:
        context = cluster.contexts.get(session)
        if op == "call":
            cluster.call(session, node, n, tail)
        elif context is None:
            continue
        elif op == "copy":  # a decode node receives the context
            pools[node].import_cached(context)
        elif op == "drop":  # the session's context truncated
            pools[node].drop(context[len(context) - n :])
        elif op == "offload":
            pools[node].offload(context[len(context) - n :])
        elif op == "evict":  # another session's work takes blocks
            ids = pools[node].try_allocate(n)
            if ids is not None:
                pools[node].free(ids)
        elif op == "clear":
            pools[node].clear()
        cluster.check()
        for pool in pools:
            pool.check_integrity()


def test_a_session_next_prompt_is_proven_not_walked() -> None:
    """A shared head is walked once; past it, the nodes that served a session's last call
    prove its next prompt's runs. Without heads or proofs the same answers come from
    walks (no head remembered, num_proven 0)."""
    cluster = _Cluster("lru", num_nodes=4, num_blocks=64)
    index = cluster.index
    for node in range(4):  # every node holds the shared head
        cluster.call(10 + node, node, num_new=1, num_tail=0)
    cluster.call(0, node=1, num_new=20, num_tail=1)
    cluster.call(0, node=1, num_new=4, num_tail=1)
    cluster.pools[2].import_cached(cluster.contexts[0])  # copied, not freed: walked

    def runs() -> list[int]:
        prompt = cluster.contexts[0] + cluster.fresh(5)
        got = [m.num_device_blocks for m in index.match_all(prompt)]
        assert got == [pool.match_prefix(list(prompt)).num_device_blocks for pool in cluster.pools]
        return got

    assert runs() == [5, 29, 29, 5]  # a walk from the first block, which finds the head
    assert len(index.heads) == 1 and index.num_proven == 0
    assert runs() == [5, 29, 29, 5]
    assert index.num_proven == 1  # node 1's run; node 2's copy is walked from the head
    cluster.pools[1].drop(cluster.contexts[0][10:12])  # the run is touched: walked again
    assert runs() == [5, 10, 29, 5]
    assert index.num_proven == 1
    cluster.pools[3].drop(cluster.contexts[0][3:4])  # a head block changes: forgotten
    assert len(index.heads) == 0
    assert runs() == [5, 10, 29, 3]
