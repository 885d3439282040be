"""A node as a Ray actor: the `local` runtime's `NodeWorker` loop on a thread inside it.

The actor builds the executor when it is created, and `connect` (once every node actor
exists) wires the worker to its peers and starts the loop. Calls are small and quick:
`post` hands messages to the inbox, `poll` (its own concurrency group, so a waiting poll
never holds up a `post`) returns what the worker published for the frontend.

A worker loop that crashes leaves the actor up but deaf; `poll` then raises, and the
frontend treats the node as dead (and kills the actor), as it would a dead process.
"""

from __future__ import annotations

import os
import threading
import traceback
from typing import Any

import ray

from evinfra.serve.executors import Executor, build_executor
from evinfra.serve.protocol import NodeStats, Shutdown, WorkerReady
from evinfra.serve.ray_runtime.links import ActorLink, Mailbox, Outbox, node_sender
from evinfra.serve.ray_runtime.transport import KVTransport
from evinfra.serve.worker import NodeWorker, WorkerSpec

POLL_GROUP = "poll"


class NodeLoopCrashed(RuntimeError):
    """The worker loop of a node actor raised; the node is as good as dead."""


class NodeActorImpl:
    def __init__(self, spec: WorkerSpec, transport: KVTransport) -> None:
        self.spec = spec
        self.transport = transport
        self.executor: Executor = build_executor(spec.executor, spec.num_blocks, spec.block_size)
        self.inbox = Mailbox(transport)
        self.outbox = Outbox()
        self.worker: NodeWorker | None = None
        self._thread: threading.Thread | None = None
        self._crash: str | None = None

    def connect(self, peers: list[Any]) -> tuple[WorkerReady, NodeStats, int]:
        """Wire the worker to every node actor (`peers[i]` is node i, this one included)
        and start its loop. Returns its ready message, first snapshot and PID."""
        me = node_sender(self.spec.node_id)
        links = [ActorLink(me, handle, self.transport) for handle in peers]
        self.worker = NodeWorker(self.spec, self.executor, self.inbox, self.outbox, links)
        vocab = int(getattr(self.executor, "vocab_size", self.spec.executor.vocab_size))
        ready = WorkerReady(
            self.spec.node_id,
            self.spec.num_blocks,
            self.spec.block_size,
            self.executor.kv_bytes_per_token,
            vocab,
        )
        stats = self.worker.stats()
        self._thread = threading.Thread(
            target=self._run, name=f"evinfra-node-{self.spec.node_id}", daemon=True
        )
        self._thread.start()
        return ready, stats, os.getpid()

    def _run(self) -> None:
        assert self.worker is not None
        try:
            self.worker.run()
        except BaseException:
            self._crash = traceback.format_exc()
            raise

    def post(self, sender: str, seq: int, messages: list[Any]) -> None:
        """Messages from `sender` (its `seq`-th call to this node)."""
        self.inbox.deliver(sender, seq, messages)

    @ray.method(concurrency_group=POLL_GROUP)
    def poll(self, timeout_s: float) -> list[list[Any]]:
        """What the worker published since the last poll (waits up to `timeout_s`).
        Raises `NodeLoopCrashed` once the loop has died."""
        batches = self.outbox.take(timeout_s)
        if not batches and self._crash is not None:
            raise NodeLoopCrashed(f"node {self.spec.node_id} loop crashed:\n{self._crash}")
        return batches

    def stop(self, timeout_s: float) -> bool:
        """Stop the loop after its current step; True when it has ended."""
        self.inbox.put(Shutdown())
        if self._thread is None:
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()


NodeActor: Any = ray.remote(concurrency_groups={POLL_GROUP: 1})(  # type: ignore[call-overload]
    NodeActorImpl
)
"""The Ray actor class (`NodeActor.options(...).remote(spec, transport)`)."""
