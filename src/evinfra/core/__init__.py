"""The pure policy core: types, blocks, KV pools, node schedulers. No clock, no I/O."""
