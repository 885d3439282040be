"""The ray runtime's pieces that need no Ray: the mailbox that restores each sender's
order, the inline KV transport, and the recovery rules (role coverage, resumption).

The node workers here talk through `ActorLink`s and `Mailbox`es exactly as the node
actors do, but the "actor calls" are delivered in a scrambled order in-process: the
disaggregation protocol must still produce the single-node output."""

from __future__ import annotations

import queue
import random
from dataclasses import replace
from typing import Any

import pytest

from evinfra.core.blocks import hash_token_blocks
from evinfra.core.types import Request, Role, RoleChange, Route
from evinfra.serve.executors import ExecutorSpec
from evinfra.serve.protocol import (
    Abort,
    FinishReason,
    Generation,
    KVPayload,
    NodeStats,
    Sampling,
    SetRole,
    Submit,
    TokensOut,
)
from evinfra.serve.ray_runtime.links import FRONTEND, ActorLink, Mailbox, Outbox
from evinfra.serve.ray_runtime.recovery import coverage_changes, depends_on, forget_node, resume
from evinfra.serve.ray_runtime.transport import (
    InlineKVTransport,
    KVDescriptor,
    make_transport,
)
from evinfra.serve.requests import LiveRequest, RequestHandle
from evinfra.serve.timed_executor import TimedExecutor
from evinfra.serve.view import NodeState
from evinfra.serve.worker import NodeWorker, WorkerSpec

BLOCK = 4


class FixedCost:
    kv_capacity_tokens = 1 << 20
    kv_bytes_per_token = 8

    def step_time_s(self, batch: Any) -> float:
        return 0.0

    def decode_run_time_s(self, *args: Any) -> float:
        raise AssertionError("not used")


class ScrambledActor:
    """Stands in for a node actor handle: `post.remote` calls are held and delivered to
    the mailbox in a random order."""

    def __init__(self, mailbox: Mailbox, rng: random.Random) -> None:
        self.mailbox = mailbox
        self.rng = rng
        self.calls: list[tuple[str, int, list[Any]]] = []
        self.post = self

    def remote(self, sender: str, seq: int, messages: list[Any]) -> None:
        self.calls.append((sender, seq, messages))

    def deliver(self) -> bool:
        self.rng.shuffle(self.calls)
        calls, self.calls = self.calls, []
        for call in calls:
            self.mailbox.deliver(*call)
        return bool(calls)


def make_nodes(roles: list[Role], seed: int) -> tuple[list[NodeWorker], list[ScrambledActor]]:
    rng = random.Random(seed)
    transport = InlineKVTransport()
    mailboxes = [Mailbox(transport) for _ in roles]
    actors = [ScrambledActor(m, rng) for m in mailboxes]
    workers = []
    for i, role in enumerate(roles):
        links = [ActorLink(f"node-{i}", a, transport) for a in actors]
        spec = WorkerSpec(i, role, ExecutorSpec(), 64, BLOCK, check_integrity=True)
        executor = TimedExecutor(FixedCost(), 64, BLOCK, 300, avoid_token_ids={0})
        workers.append(NodeWorker(spec, executor, mailboxes[i], Outbox(), links))
    return workers, actors


def submit(rid: int, ids: list[int], decode_node: int, num_tokens: int = 8) -> Submit:
    request = Request(rid, tuple(hash_token_blocks(ids, BLOCK)), len(ids), num_tokens)
    gen = Generation(tuple(ids), frozenset(), Sampling())
    return Submit(request, gen, decode_node, rid + 1)


def pump(
    workers: list[NodeWorker], actors: list[ScrambledActor]
) -> tuple[dict[int, list[int]], set[int]]:
    """Deliver, handle, step until nothing moves; the tokens and finishes per request."""
    out: dict[int, list[int]] = {}
    finished: set[int] = set()
    for _ in range(10_000):
        progressed = any([a.deliver() for a in actors])
        for w in workers:
            while True:
                try:
                    w.handle(w.inbox.get_nowait())
                except queue.Empty:
                    break
                progressed = True
            progressed |= w.step()
            w._flush()
            for batch in w.outbox.take(0.0):
                for msg in batch:
                    if isinstance(msg, TokensOut):
                        out.setdefault(msg.request_id, []).extend(msg.token_ids)
                        if msg.finish is FinishReason.LENGTH:
                            finished.add(msg.request_id)
        if not progressed:
            break
    for w in workers:
        w.sched.check_integrity()
        assert w.sched.is_idle and w.sched.pool.num_used_blocks == 0
    return out, finished


PROMPTS = [[3 + (i * 37 + j * 11) % 200 for j in range(n)] for i, n in enumerate((3, 9, 17))]


def run_requests(roles: list[Role], decode_node: int, seed: int) -> dict[int, list[int]]:
    workers, actors = make_nodes(roles, seed)
    front = ActorLink(FRONTEND, actors[0], InlineKVTransport())
    for rid, ids in enumerate(PROMPTS):
        front.put(submit(rid, ids, decode_node))
    out, finished = pump(workers, actors)
    assert finished == set(out) == set(range(len(PROMPTS)))
    return out


@pytest.mark.parametrize("seed", range(4))
def test_scrambled_frontend_calls_keep_their_order(seed: int) -> None:
    """An abort sent after its submit, and role switches, take effect in the order sent."""
    workers, actors = make_nodes([Role.MIXED], seed)
    front = ActorLink(FRONTEND, actors[0], InlineKVTransport())
    front.put(submit(0, PROMPTS[2], 0))
    front.put(Abort(0))
    for i, role in enumerate((Role.DECODE, Role.PREFILL, Role.DECODE, Role.MIXED)):
        front.put(SetRole(role, control_seq=i + 1))
    front.put(submit(1, PROMPTS[1], 0))
    out, finished = pump(workers, actors)
    assert finished == {1} and 0 not in out
    assert workers[0].sched.role is Role.MIXED


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scrambled_actor_calls_still_give_the_single_node_output(seed: int) -> None:
    single = run_requests([Role.MIXED], decode_node=0, seed=seed)
    disagg = run_requests([Role.PREFILL, Role.DECODE], decode_node=1, seed=seed)
    assert disagg == single and all(len(v) == 8 for v in single.values())


def test_mailbox_releases_a_senders_messages_in_order() -> None:
    box = Mailbox(InlineKVTransport())
    box.deliver("a", 3, ["a3"])
    box.deliver("a", 2, ["a2x", "a2y"])
    box.deliver("b", 1, ["b1"])
    assert box.get_nowait() == "b1" and box.num_held == 3
    box.deliver("a", 1, ["a1"])
    assert [box.get_nowait() for _ in range(4)] == ["a1", "a2x", "a2y", "a3"]
    assert box.num_held == 0


def test_inline_transport_and_mailbox_turn_descriptors_back_into_payloads() -> None:
    box = Mailbox(InlineKVTransport())
    payload = KVPayload(1, 7, 2, b"\x01\x02\x03")
    link = ActorLink("node-1", ScrambledActor(box, random.Random(0)), InlineKVTransport())
    link.put(payload)
    sent = link.handle.calls[0][2][0]
    assert isinstance(sent, KVDescriptor) and sent.num_bytes == 3
    link.handle.deliver()
    assert box.get_nowait() == payload
    with pytest.raises(ValueError, match="nixl"):
        make_transport("nixl")


def test_outbox_take_returns_every_batch_or_nothing() -> None:
    box = Outbox()
    assert box.take(0.0) == []
    box.put([1])
    box.put([2, 3])
    assert box.take(0.0) == [[1], [2, 3]]


def node(node_id: int, role: Role, alive: bool = True, decodes: int = 0) -> NodeState:
    stats = NodeStats(
        node_id, role, True, BLOCK, 64, 60, 4, 0, 0, decodes, 0, 0, frozenset({11, 12}),
        0, 0, 0, 0, 0, 0, 0, 0.0,
    )  # fmt: skip
    return NodeState(node_id, stats, alive=alive)


def test_coverage_gives_the_survivors_both_roles() -> None:
    P, D, M = Role.PREFILL, Role.DECODE, Role.MIXED
    assert coverage_changes([node(0, P), node(1, D, alive=False)]) == [RoleChange(0, M)]
    assert coverage_changes([node(0, M), node(1, D, alive=False)]) == []
    three = [node(0, P, alive=False), node(1, D, decodes=3), node(2, D, decodes=1)]
    assert coverage_changes(three) == [RoleChange(2, P)]
    assert coverage_changes([node(0, P), node(1, P), node(2, D, alive=False)]) == [RoleChange(0, D)]
    assert coverage_changes([node(0, P), node(1, D)]) == []
    assert coverage_changes([node(0, P, alive=False)]) == []


def test_a_forgotten_node_matches_no_prefix_and_counts_no_load() -> None:
    n = node(0, Role.DECODE, decodes=2)
    n.incoming[5] = 3
    assert n.match_prefix([11, 12]).num_blocks == 2
    forget_node(n)
    assert not n.alive and not n.is_serving
    assert n.match_prefix([11, 12]).num_blocks == 0
    assert n.num_running_decodes == 0 and n.num_free_blocks == 0


def live(route: Route | None, num_output_tokens: int) -> LiveRequest:
    request = Request(1, (), 3, 10)
    gen = Generation((5, 6, 7), frozenset({2}), Sampling())
    req = LiveRequest(request, gen, RequestHandle(1, 3, lambda h: None), 0.0, route)
    req.num_output_tokens = num_output_tokens
    return req


def test_a_request_depends_on_its_prefill_node_only_until_its_kv_moved() -> None:
    assert depends_on(live(Route(0, 1), 0), 0) and depends_on(live(Route(0, 1), 0), 1)
    assert not depends_on(live(Route(0, 1), 3), 0) and depends_on(live(Route(0, 1), 3), 1)
    assert depends_on(live(Route(2, 2), 3), 2) and not depends_on(live(Route(2, 2), 0), 1)
    assert not depends_on(live(None, 0), 0)


def test_resume_appends_the_streamed_tokens_and_keeps_the_budget() -> None:
    r = live(Route(0, 1), 3)
    resumed = resume(r.request, r.generation, [8, 9, 10], 42, block_size=BLOCK)
    assert resumed is not None
    assert resumed.request.request_id == 42
    assert resumed.generation == replace(r.generation, prompt_ids=(5, 6, 7, 8, 9, 10))
    assert resumed.request.num_prompt_tokens == 6 and resumed.request.max_output_tokens == 7
    assert resumed.request.prompt_hashes == tuple(hash_token_blocks([5, 6, 7, 8, 9, 10], BLOCK))
    assert resume(r.request, r.generation, list(range(10)), 43, block_size=BLOCK) is None


def test_ray_flags_become_options() -> None:
    import argparse

    from evinfra.serve.ray_runtime.options import RayOptions, add_ray_flags, ray_options

    p = argparse.ArgumentParser()
    add_ray_flags(p)
    flags = "--address auto --num-gpus-per-node 8 --node-resource rack-0=1 --kv-transport inline"
    args = p.parse_args([*flags.split(), "--object-store-mb", "64", "--max-planner-restarts", "1"])
    opts = ray_options(args)
    assert opts == RayOptions(
        address="auto", num_gpus_per_node=8.0, node_resources={"rack-0": 1.0},
        transport="inline", object_store_memory_bytes=64 * 1024 * 1024, max_planner_restarts=1,
    )  # fmt: skip
    with pytest.raises(ValueError, match="NAME=AMOUNT"):
        ray_options(p.parse_args(["--node-resource", "rack-0"]))
    with pytest.raises(ValueError, match="transport"):
        RayOptions(transport="nixl")
