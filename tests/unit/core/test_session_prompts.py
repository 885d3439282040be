"""Sessions whose contexts grow call by call, served on several nodes: the cluster-wide
index's answer for a session's prompts (its context, the context grown, the context cut)
and each pool's own answer for the prompt tuple (from its remembered matches and freed
runs, `KVPool.match_prefix`) must be each node's plain walk, whatever evicted, dropped,
offloaded or reused blocks since."""

from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.global_index import GlobalBlockIndex
from evinfra.core.kv_pool import KVPool
from tests.unit.core.test_freed_runs import make_eviction

_SHARED = tuple(range(1, 6))
"""A system prompt every session starts with."""


class _Cluster:
    """Pools reporting to one index, and sessions whose contexts grow call by call."""

    def __init__(self, kind: str, num_nodes: int, num_blocks: int) -> None:
        self.pools = [KVPool(num_blocks, 8, make_eviction(kind)) for _ in range(num_nodes)]
        self.index = GlobalBlockIndex(num_nodes)
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
                walked = [pool.match_prefix(list(prompt)) for pool in self.pools]
                assert self.index.match_all(prompt) == walked, prompt
                assert [pool.match_prefix(prompt) for pool in self.pools] == walked, prompt


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
def test_session_prompts_match_each_node_walk(
    kind: str, seq: list[tuple[str, int, int, int, int]]
) -> None:
    cluster = _Cluster(kind, num_nodes=3, num_blocks=30)
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
            ids = pools[node].try_allocate(3 * n)
            if ids is not None:
                pools[node].free(ids)
        elif op == "clear":
            pools[node].clear()
        cluster.check()
        for pool in pools:
            pool.check_integrity()
