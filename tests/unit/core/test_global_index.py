from hypothesis import given, settings
from hypothesis import strategies as st

from evinfra.core.global_index import GlobalBlockIndex, _flip, _flip_many
from evinfra.core.host_tier import HostTier
from evinfra.core.kv_pool import KVPool


def _hosts(index: GlobalBlockIndex, num_nodes: int) -> list[HostTier]:
    tiers = [HostTier(1000) for _ in range(num_nodes)]
    for i, tier in enumerate(tiers):
        index.attach_host(tier, i)
    return tiers


def test_one_walk_matches_every_pool() -> None:
    pools = [KVPool(8, 4) for _ in range(3)]
    index = GlobalBlockIndex(3)
    for i, p in enumerate(pools):
        index.attach(p, i)
    for i, hashes in enumerate(([1, 2, 3], [1, 2], [9])):
        ids = pools[i].try_allocate(len(hashes))
        assert ids is not None
        for b, h in zip(ids, hashes, strict=True):
            pools[i].commit(b, h)
    pools[1].store_host(3)
    got = index.match_all([1, 2, 3, 4])
    assert [(m.num_device_blocks, m.num_host_blocks) for m in got] == [(3, 0), (2, 1), (0, 0)]
    assert index.nodes_holding(2) == [0, 1]


def test_a_remembered_match_sees_host_changes() -> None:
    """The index reads the host tiers themselves; a change to one must still end the
    answer it remembers for a prompt."""
    pools = [KVPool(8, 4) for _ in range(2)]
    index = GlobalBlockIndex(2)
    for i, p in enumerate(pools):
        index.attach(p, i)
    prompt = (1, 2, 3)

    def runs() -> list[tuple[int, int]]:
        return [(m.num_device_blocks, m.num_host_blocks) for m in index.match_all(prompt)]

    assert runs() == [(0, 0), (0, 0)]
    pools[1].store_host(1)
    pools[1].store_host(2)
    assert runs() == [(0, 0), (0, 2)]
    pools[1].drop([2])
    assert runs() == [(0, 0), (0, 1)]
    pools[1].host.clear()
    assert runs() == [(0, 0), (0, 0)]


ops = st.lists(
    st.tuples(
        st.integers(0, 2),
        st.sampled_from(["alloc", "free", "drop", "offload", "prefetch", "clear"]),
        st.integers(0, 12),
        st.integers(1, 4),
    ),
    max_size=50,
)


@settings(max_examples=100, deadline=None)
@given(ops)
def test_index_agrees_with_pools_after_any_operations(seq: list[tuple[int, str, int, int]]) -> None:
    pools = [KVPool(6, 3) for _ in range(3)]
    index = GlobalBlockIndex(3)
    for i, p in enumerate(pools):
        index.attach(p, i)
    held: list[list[list[int]]] = [[], [], []]
    for node, op, a, b in seq:
        pool = pools[node]
        hashes = list(range(a, a + b))
        if op == "alloc":
            m = pool.match_prefix(hashes)
            n = b - m.num_device_blocks
            if not pool.can_allocate_after(n, hashes[: m.num_device_blocks]):
                continue
            got = pool.acquire_cached(hashes[: m.num_device_blocks])
            new = pool.try_allocate(n)
            assert new is not None
            for blk, h in zip(new, hashes[m.num_device_blocks :], strict=True):
                pool.commit(blk, h)
            held[node].append(got + new)
        elif op == "free" and held[node]:
            pool.free(held[node].pop())
        elif op == "drop":
            pool.drop(hashes)
        elif op == "offload":
            pool.offload(hashes)
        elif op == "prefetch":
            pool.prefetch(hashes)
        elif op == "clear" and not held[node]:
            pool.clear()
        probe = list(range(0, 16))
        for start in (0, a):
            q = probe[start:]
            assert index.match_all(q) == [p.match_prefix(q) for p in pools]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sets(st.integers(0, 9), max_size=10), min_size=0, max_size=40),
    st.sets(st.integers(0, 9)),
)
def test_match_all_agrees_with_a_walk_per_node(
    holders: list[set[int]], host_nodes: set[int]
) -> None:
    """Block i of the prompt is held on device by the nodes in holders[i] (any pattern,
    not only prefixes), and on host by `host_nodes`: each node's answer is its own walk."""
    num_nodes = 10
    index = GlobalBlockIndex(num_nodes)
    listeners = [index.listener(i) for i in range(num_nodes)]
    hosts = _hosts(index, num_nodes)
    hashes = [1000 + i for i in range(len(holders))]
    for h, nodes in zip(hashes, holders, strict=True):
        for node in nodes:
            listeners[node].on_device(h, True)
        for node in host_nodes:
            hosts[node].store(h)
    got = index.match_all(hashes)
    for node in range(num_nodes):
        device = 0
        while device < len(holders) and node in holders[device]:
            device += 1
        host = len(holders) - device if node in host_nodes else 0
        assert (got[node].num_device_blocks, got[node].num_host_blocks) == (device, host)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(st.sets(st.integers(0, 9), max_size=10), st.sets(st.integers(0, 9), max_size=10)),
        max_size=40,
    )
)
def test_host_runs_agree_with_a_walk_per_node(held: list[tuple[set[int], set[int]]]) -> None:
    """Block i is held on device by held[i][0] and on host by held[i][1], any pattern:
    each node's host run starts where its device run ends and stops at its first miss."""
    num_nodes = 10
    index = GlobalBlockIndex(num_nodes)
    listeners = [index.listener(i) for i in range(num_nodes)]
    hosts = _hosts(index, num_nodes)
    hashes = [1000 + i for i in range(len(held))]
    for h, (device_nodes, host_nodes) in zip(hashes, held, strict=True):
        for node in device_nodes:
            listeners[node].on_device(h, True)
        for node in host_nodes:
            hosts[node].store(h)
    hosts[0].store(1)  # a host tier that is never empty
    got = index.match_all(hashes)
    for node in range(num_nodes):
        device = 0
        while device < len(held) and node in held[device][0]:
            device += 1
        host = 0
        while device + host < len(held) and node in held[device + host][1]:
            host += 1
        assert (got[node].num_device_blocks, got[node].num_host_blocks) == (device, host)
        twin = got[(node + 1) % num_nodes]
        if twin == got[node]:  # equal answers are one (frozen) object
            assert twin is got[node]


def test_equal_masks_are_one_object() -> None:
    """A block's node mask is read on every walk through it: blocks held by the same
    nodes share one int object (few objects, kept in cache), however each mask was made."""
    index = GlobalBlockIndex(40)
    listeners = [index.listener(i) for i in range(40)]
    listeners[33].on_device_many([1, 2], True)
    listeners[35].on_device_many([1, 2], True)
    listeners[35].on_device(3, True)
    listeners[33].on_device(3, True)
    listeners[34].on_device_many([4], True)
    listeners[33].on_device_many([4], True)
    listeners[35].on_device_many([4], True)
    listeners[34].on_device_many([4], False)
    masks = [index._device[h] for h in (1, 2, 3, 4)]
    assert masks[0] == (1 << 33 | 1 << 35)
    assert all(m is masks[0] for m in masks)
    assert [m.num_device_blocks for m in index.match_all([1, 2, 3, 4, 5])][33:36] == [4, 0, 4]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.booleans(), st.lists(st.integers(0, 7), max_size=8)),
        max_size=30,
    )
)
def test_flip_many_is_flip_in_turn(steps: list[tuple[int, bool, list[int]]]) -> None:
    # keys may repeat inside a call; masks that empty leave the table; equal masks are
    # one object
    many: dict[int, int] = {}
    one: dict[int, int] = {}
    many_masks: dict[int, int] = {}
    one_masks: dict[int, int] = {}
    for node, present, keys in steps:
        _flip_many(many, keys, 1 << node, present, many_masks)
        for key in keys:
            _flip(one, key, 1 << node, present, one_masks)
        assert many == one and 0 not in many.values()
        assert all(mask is many_masks[mask] for mask in many.values())
