"""The `ray` runtime: the `local` runtime's policies and node loop on Ray actors, with KV
moving between nodes through a `KVTransport` (Ray's object store by default).

Ray is an optional dependency (`evinfra[ray]`); importing this package does not import
it, `RayCluster` and the node actor do.
"""
