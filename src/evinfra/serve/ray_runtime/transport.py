"""How a KV payload travels from the node that holds the blocks to the node that pulls them.

The node worker (`serve/worker.py`) answers a `KVPull` with a `KVPayload` holding the
blocks' bytes. Between processes on one machine the bytes ride inside the message (the
`local` runtime's pipes). On a Ray cluster the message stays small: the sender publishes
the bytes and sends a `KVDescriptor`; the receiver's inbox fetches them before its worker
sees the payload. A transport is the pair `publish` / `fetch`:

- `InlineKVTransport`: the descriptor carries the bytes (the local queues' shape).
- `ObjectStoreKVTransport`: `ray.put` the bytes, the descriptor carries the `ObjectRef`;
  the receiver `ray.get`s it (shared memory on one host, Ray's object transfer between
  hosts).
- An RDMA transport (NIXL on GPU clusters) would be a third: `publish` registers the
  source blocks' device memory and returns its remote descriptors (the bytes never leave
  the GPU), `fetch` posts the RDMA reads into the destination's blocks and waits for
  completion. Nothing else in the runtime changes.

A fetch that fails (the sender died and its object went with it, or it timed out) yields
a payload with `data=None`, which the worker turns into a clear request failure.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

from evinfra.serve.protocol import KVPayload

log = logging.getLogger(__name__)

TRANSPORTS = ("object-store", "inline")


@dataclass(frozen=True, slots=True)
class KVDescriptor:
    """A KV payload in flight: who sent which blocks, and the transport's handle on the
    bytes (the bytes themselves, an `ObjectRef`, or remote memory descriptors)."""

    src_node: int
    request_id: int
    first_block: int
    num_bytes: int
    handle: Any


class KVTransport(Protocol):
    @property
    def name(self) -> str: ...

    def publish(self, payload: KVPayload) -> KVDescriptor:
        """Make the payload's bytes reachable by the receiver; returns the small message
        that travels instead. Called on the sending node; mutates nothing."""

    def fetch(self, descriptor: KVDescriptor) -> KVPayload:
        """The payload back, on the receiving node (`data=None` when the bytes are lost)."""


class InlineKVTransport:
    """The bytes ride inside the message."""

    name = "inline"

    def publish(self, payload: KVPayload) -> KVDescriptor:
        data = payload.data or b""
        return KVDescriptor(
            payload.src_node, payload.request_id, payload.first_block, len(data), payload.data
        )

    def fetch(self, descriptor: KVDescriptor) -> KVPayload:
        return KVPayload(
            descriptor.src_node, descriptor.request_id, descriptor.first_block, descriptor.handle
        )


class ObjectStoreKVTransport:
    """The bytes go through Ray's object store; the message carries the `ObjectRef`.

    The sending node owns the object; the receiver borrows it, so it stays alive while the
    descriptor is in flight and is freed once the receiver has written the blocks."""

    name = "object-store"

    def __init__(self, fetch_timeout_s: float = 30.0) -> None:
        self.fetch_timeout_s = fetch_timeout_s

    def publish(self, payload: KVPayload) -> KVDescriptor:
        import ray

        if payload.data is None:  # nothing to move: the sender no longer holds the request
            return InlineKVTransport().publish(payload)
        ref = ray.put(payload.data)
        return KVDescriptor(
            payload.src_node, payload.request_id, payload.first_block, len(payload.data), ref
        )

    def fetch(self, descriptor: KVDescriptor) -> KVPayload:
        import ray

        handle = descriptor.handle
        if not isinstance(handle, ray.ObjectRef):
            return InlineKVTransport().fetch(descriptor)
        try:
            data = ray.get(handle, timeout=self.fetch_timeout_s)
        except Exception as exc:  # lost with its owner, or too slow: the request fails
            log.warning("KV of request %d from node %d lost: %r",
                        descriptor.request_id, descriptor.src_node, exc)  # fmt: skip
            data = None
        if data is not None and not isinstance(data, bytes):
            data = bytes(data)
        return KVPayload(descriptor.src_node, descriptor.request_id, descriptor.first_block, data)


def make_transport(name: str) -> KVTransport:
    if name == "object-store":
        return ObjectStoreKVTransport()
    if name == "inline":
        return InlineKVTransport()
    raise ValueError(f"KV transport must be one of {TRANSPORTS}, got {name!r}")
