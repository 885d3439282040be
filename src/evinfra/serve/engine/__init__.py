"""The `local` runtime's real model executor: a hand-written Llama-family decoder in
PyTorch with a paged KV cache, its GGUF loader and tokenizer.

Importing this package needs torch (the `serve` extra); nothing in `core/` or `policy/`
imports it.
"""
