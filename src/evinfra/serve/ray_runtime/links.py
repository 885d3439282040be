"""The queues of `serve/worker.py`, rebuilt on Ray actor calls.

A `NodeWorker` reads an inbox (`get(timeout=)`, `get_nowait()`, raising `queue.Empty`)
and writes to peers and an outbox with `put(msg)`. Here:

- `ActorLink` is a peer or the frontend's handle on a node: `put` becomes a fire-and-forget
  `post.remote(sender, seq, [msg])` on the node actor; a `KVPayload` leaves through the KV
  transport (the bytes are published, a `KVDescriptor` travels).
- `Mailbox` is the node's inbox: `deliver` restores each sender's order (a threaded actor
  does not promise to run calls in the order they were sent; the worker's protocol assumes
  per-sender order, as a pipe gives), and `get` turns descriptors back into payloads.
- `Outbox` holds what the worker sends to the frontend until the frontend's long poll
  takes it.
"""

from __future__ import annotations

import itertools
import queue
import threading
from typing import Any

from evinfra.serve.protocol import KVPayload
from evinfra.serve.ray_runtime.transport import KVDescriptor, KVTransport

FRONTEND = "frontend"
"""The sender name of messages from the frontend; nodes send as `node-<id>`."""


def node_sender(node_id: int) -> str:
    return f"node-{node_id}"


class ActorLink:
    """Sends messages to one node actor, numbered per (sender, receiver) pair."""

    def __init__(self, sender: str, handle: Any, transport: KVTransport) -> None:
        self.sender = sender
        self.handle = handle
        self.transport = transport
        self._seq = itertools.count(1)
        self._lock = threading.Lock()

    def put(self, msg: Any) -> Any:
        """Send `msg` (fire-and-forget); returns the call's ObjectRef, for a sender that
        wants to know when the node has it."""
        if isinstance(msg, KVPayload):
            msg = self.transport.publish(msg)
        with self._lock:  # the number and the send go together, or order is lost
            return self.handle.post.remote(self.sender, next(self._seq), [msg])


class Mailbox:
    """A node's inbox: in order per sender, KV fetched on the worker's thread."""

    def __init__(self, transport: KVTransport) -> None:
        self.transport = transport
        self._ready: queue.Queue[Any] = queue.Queue()
        self._next_seq: dict[str, int] = {}
        self._held: dict[str, dict[int, list[Any]]] = {}
        self._lock = threading.Lock()

    def deliver(self, sender: str, seq: int, messages: list[Any]) -> None:
        """Queue `messages` once every earlier message of `sender` is queued."""
        with self._lock:
            held = self._held.setdefault(sender, {})
            held[seq] = messages
            expected = self._next_seq.get(sender, 1)
            while expected in held:
                for msg in held.pop(expected):
                    self._ready.put(msg)
                expected += 1
            self._next_seq[sender] = expected

    @property
    def num_held(self) -> int:
        """Messages waiting for an earlier one of their sender."""
        with self._lock:
            return sum(len(batch) for held in self._held.values() for batch in held.values())

    def put(self, msg: Any) -> None:
        """Queue a message from this node itself (no ordering needed)."""
        self._ready.put(msg)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        msg = self._ready.get(block, timeout)
        if isinstance(msg, KVDescriptor):
            return self.transport.fetch(msg)
        return msg

    def get_nowait(self) -> Any:
        return self.get(block=False)


class Outbox:
    """Batches from the worker to the frontend, taken by a long poll."""

    def __init__(self) -> None:
        self._batches: queue.Queue[list[Any]] = queue.Queue()

    def put(self, batch: list[Any]) -> None:
        self._batches.put(batch)

    def take(self, timeout_s: float) -> list[list[Any]]:
        """Every batch queued, waiting up to `timeout_s` for the first; [] if none came."""
        try:
            batches = [self._batches.get(timeout=timeout_s)]
        except queue.Empty:
            return []
        while True:
            try:
                batches.append(self._batches.get_nowait())
            except queue.Empty:
                return batches
