"""evinfra's own torch engine on one GPU, step by step, next to the roofline cost model.

    PYTHONPATH=src python3 benchmarks/gpu_calibration.py --device cuda --out OUT [--layers 8]
    .venv/bin/python benchmarks/gpu_calibration.py --device cpu --tiny --out /tmp/cal  # smoke

Times `TorchExecutor.execute` (the server's path: AttentionBatch, paged KV, sampling) on a
Llama-3-70B-shaped decoder cut to --layers layers, then Llama-3-8B (32 layers) if time
remains; bf16, seeded random weights. Each step's median is set next to the `roofline`
prediction for one H200 (tp=1) and a floor (the roofline at the measured ceilings, no fixed
overheads); one hooked step per point says where the time goes. Writes calibration.json,
profile-<shape>.json and report.md under --out after every point; starts no point that
--time-budget-s would not cover. Needs torch, numpy and evinfra on PYTHONPATH only.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from evinfra.costmodel.base import BatchShape, PrefillChunk
from evinfra.costmodel.catalog import get_gpu, get_model
from evinfra.costmodel.node import NodeSpec
from evinfra.costmodel.profile import ProfileTable
from evinfra.costmodel.registry import make_cost_model
from evinfra.costmodel.roofline import RooflineCostModel
from evinfra.costmodel.spec import Dtype, ModelSpec
from evinfra.serve.engine.config import LlamaConfig
from evinfra.serve.engine.executor import SeqWork, TorchExecutor
from evinfra.serve.engine.model import LlamaDecoder, Rotary

RESERVE_S = 5.0  # no point starts with less than this left
Predict = Callable[["Point"], dict[str, Any]]

LLAMA_3_8B = replace(
    get_model("llama-3-70b"),
    name="llama-3-8b",
    num_layers=32,
    num_dense_layers=32,
    hidden_size=4096,
    num_q_heads=32,
    num_kv_heads=8,
    dense_ffn_size=14336,
    num_params_total=8.03e9,
    num_params_active=8.03e9,
    source="Llama-3-8B config.json: hidden 4096, 32 layers, 32/8 heads, FFN 14336",
)


# ---- what to measure ------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Point:
    """One engine step: `num_seqs` sequences each computing `num_new_tokens` on top of
    `num_cached_tokens` already in KV (a decode's context is its cached tokens + 1)."""

    kind: str  # "prefill" or "decode"
    num_seqs: int
    num_new_tokens: int
    num_cached_tokens: int

    @property
    def context_tokens(self) -> int:
        return self.num_cached_tokens + self.num_new_tokens

    @property
    def label(self) -> str:
        if self.kind == "decode":
            return f"decode {self.num_seqs} x ctx {self.context_tokens}"
        on = f" on {self.num_cached_tokens}" if self.num_cached_tokens else ""
        return f"prefill {self.num_new_tokens}{on}"

    def batch(self) -> BatchShape:
        kv = self.num_seqs * self.context_tokens
        if self.kind == "decode":
            return BatchShape((), self.num_seqs, kv, kv)
        chunk = PrefillChunk(self.num_new_tokens, self.num_cached_tokens)
        return BatchShape(prefill_chunks=(chunk,) * self.num_seqs, num_kv_tokens_in_use=kv)


@dataclass(frozen=True, slots=True)
class Plan:
    key: str  # names the profile file
    spec: ModelSpec  # the shape that runs (maybe fewer layers than the real model)
    full_num_layers: int
    points: tuple[Point, ...]


def grid(
    prefill_tokens: Sequence[int],
    batch_sizes: Sequence[int],
    contexts: Sequence[int],
    on_context: Sequence[tuple[int, int]],
) -> tuple[Point, ...]:
    """Most important first: prefill, decode by context then batch, prefill on a context."""
    return (
        *(Point("prefill", 1, t, 0) for t in prefill_tokens),
        *(Point("decode", b, 1, c - 1) for c in contexts for b in batch_sizes),
        *(Point("prefill", 1, t, c) for t, c in on_context),
    )


def make_plans(args: argparse.Namespace) -> list[Plan]:
    if args.tiny:
        points = grid((16, 64, 128), (1, 4, 8), (32, 128), ((32, 64),))
        return [Plan("tiny", get_model("tiny"), 2, points)]
    n = args.layers
    seventy = get_model("llama-3-70b")
    cut = replace(seventy, name=f"llama-3-70b-{n}l", num_layers=n, num_dense_layers=n)
    points = grid(
        (512, 1024, 2048, 4096, 8192),
        (1, 8, 32, 64, 128, 256),
        (1024, 4096, 16384),
        ((2048, 8192), (2048, 32768)),
    )
    plans = [Plan("llama-3-70b", cut, seventy.num_layers, points)]
    if not args.no_8b:
        plans.append(Plan("llama-3-8b", LLAMA_3_8B, LLAMA_3_8B.num_layers, points))
    return plans


# ---- timing -------------------------------------------------------------------------
class Clock:
    """CUDA events on a GPU (stream order), perf_counter on the CPU (ops are synchronous)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def mark(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record()
        return event

    def ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two marks (after `sync`)."""
        return float(start.elapsed_time(end)) if self.cuda else (end - start) * 1e3


class Regions:
    """Forward hooks marking the start of `first` and the end of `last` for each
    (key, first, last); `sums_ms()` adds up the spans per key (spans of a key never nest)."""

    def __init__(self, clock: Clock, regions: Sequence[tuple[str, nn.Module, nn.Module]]) -> None:
        self.clock = clock
        self.spans: list[tuple[str, Any, Any]] = []
        self._open: dict[str, Any] = {}
        self._handles: list[RemovableHandle] = []
        for key, first, last in regions:  # the hooks return None: inputs, outputs untouched
            self._handles.append(first.register_forward_pre_hook(lambda *_, k=key: self._start(k)))
            self._handles.append(last.register_forward_hook(lambda *_, k=key: self._end(k)))

    def _start(self, key: str) -> None:
        self._open[key] = self.clock.mark()

    def _end(self, key: str) -> None:
        self.spans.append((key, self._open.pop(key), self.clock.mark()))

    def sums_ms(self) -> dict[str, float]:
        sums: dict[str, float] = {}
        for key, start, end in self.spans:
            sums[key] = sums.get(key, 0.0) + self.clock.ms(start, end)
        self.spans.clear()
        return sums

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def layer_regions(model: LlamaDecoder, detail: bool) -> list[tuple[str, nn.Module, nn.Module]]:
    """All layers as one span; with `detail`, also each layer's attention, its four
    projections and its MLP."""
    layers: list[Any] = list(model.model.layers)  # DecoderLayers
    regions: list[tuple[str, nn.Module, nn.Module]] = [("layers", layers[0], layers[-1])]
    for layer in layers if detail else ():
        attn = layer.self_attn
        regions.append(("attn", attn, attn))
        regions += [("proj", m, m) for m in (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj)]
        regions.append(("mlp", layer.mlp, layer.mlp))
    return regions


class Budget:
    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.deadline = self.start + seconds

    def elapsed_s(self) -> float:
        return time.monotonic() - self.start

    def left_s(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, message: str) -> None:
        print(f"[{self.elapsed_s():6.1f}s] {message}", flush=True)


# ---- ceilings -----------------------------------------------------------------------
def timed_ms(clock: Clock, fn: Callable[[], object], iters: int, groups: int = 3) -> float:
    """Median over `groups` of the mean time of `iters` back-to-back calls."""
    fn()
    clock.sync()
    times = []
    for _ in range(groups):
        start = clock.mark()
        for _ in range(iters):
            fn()
        end = clock.mark()
        clock.sync()
        times.append(clock.ms(start, end) / iters)
    return statistics.median(times)


def measure_ceilings(device: torch.device, dtype: torch.dtype, tiny: bool) -> dict[str, Any]:
    """A square bf16 matmul's FLOP/s and a device-to-device copy's bytes/s (read + write)."""
    n, num_bytes, iters = (256, 4 << 20, 3) if tiny else (8192, 2 << 30, 20)
    clock, gen = Clock(device), torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn((n, n), generator=gen, device=device).to(dtype) for _ in range(2))
    timed_ms(clock, lambda: a @ b, iters)  # brings the clocks up
    mm_ms = timed_ms(clock, lambda: a @ b, iters)
    src = torch.ones(num_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    cp_ms = timed_ms(clock, lambda: dst.copy_(src), iters)
    return {
        "matmul_n": n,
        "matmul_tflops": 2 * n**3 / (mm_ms * 1e-3) / 1e12,
        "copy_bytes": num_bytes,
        "copy_gb_s": 2 * num_bytes / (cp_ms * 1e-3) / 1e9,
    }


def probe_sdpa(config: LlamaConfig, device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """The SDPA backends that accept the engine's two attention calls (GQA): a causal
    prefill chunk without a mask, and the masked call (decodes, chunks after a cached
    prefix). A refusal keeps torch's warnings and error as the reason."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    h, kvh, d, n = config.num_heads, config.num_kv_heads, config.head_dim, 256
    q, q_decode = (
        torch.randn((b, h, t, d), device=device, dtype=dtype) for b, t in ((1, n), (4, 1))
    )
    # keys as the engine passes them: [seqs, tokens, kv heads, dim] transposed
    k, k_decode = (
        torch.randn((b, n, kvh, d), device=device, dtype=dtype).transpose(1, 2) for b in (1, 4)
    )
    mask = torch.ones((4, 1, 1, n), dtype=torch.bool, device=device)
    sdpa = F.scaled_dot_product_attention
    calls: dict[str, Callable[[], object]] = {
        "prefill_causal_gqa": lambda: sdpa(q, k, k, is_causal=True, enable_gqa=True),
        "masked_gqa": lambda: sdpa(q_decode, k_decode, k_decode, attn_mask=mask, enable_gqa=True),
    }
    backends = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")
    result: dict[str, Any] = {}
    for name, call in calls.items():
        accepted, refused = [], {}
        for backend in backends:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    with sdpa_kernel(getattr(SDPBackend, backend)):
                        call()
                    accepted.append(backend)
                except Exception as err:  # a probe: any refusal is an answer
                    why = [*(str(w.message) for w in caught), str(err)]
                    refused[backend] = " / ".join(why)[:600]
        result[name] = {"accepted": accepted, "refused": refused}
    return result


# ---- the engine -----------------------------------------------------------------------
def llama_config(spec: ModelSpec) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.dense_ffn_size,
        num_layers=spec.num_layers,
        num_heads=spec.num_q_heads,
        num_kv_heads=spec.num_kv_heads,
        rope_theta=500000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=spec.tie_word_embeddings,
        max_position_embeddings=131072,
    )


@torch.no_grad()
def random_model(
    config: LlamaConfig, device: torch.device, dtype: torch.dtype, seed: int
) -> LlamaDecoder:
    """The decoder built on the meta device and filled on `device` from a seeded generator
    (N(0, 0.02) matrices, norms near one): no minutes of CPU init for 70B-wide layers."""
    with torch.device("meta"):
        model = LlamaDecoder(config).to(dtype=dtype)
    model = model.to_empty(device=device)
    if config.tie_word_embeddings:  # to_empty gives each module its own tensor
        model.lm_head.weight = model.model.embed_tokens.weight
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, param in model.named_parameters():
        mean, std = (1.0, 0.1) if name.endswith("norm.weight") else (0.0, 0.02)
        param.normal_(mean, std, generator=gen)
    model.rotary = Rotary(config.head_dim, config.rope_theta).to(device)
    return model


def blocks_needed(point: Point, block_size: int) -> int:
    return point.num_seqs * -(-point.context_tokens // block_size)


def kv_capacity_blocks(plan: Plan, args: argparse.Namespace, bytes_per_block: int) -> int:
    """Blocks for the largest point, at most --max-kv-tokens and, on a GPU, --kv-fraction
    of the memory free after the weights (the rest holds the activations)."""
    blocks = min(
        max(blocks_needed(p, args.block_size) for p in plan.points),
        args.max_kv_tokens // args.block_size,
    )
    if args.device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        blocks = min(blocks, int(args.kv_fraction * free // bytes_per_block))
    return max(int(blocks), 1)


def make_works(point: Point, block_size: int, vocab_size: int, seed: int) -> list[SeqWork]:
    """The point's sequences on disjoint blocks, laid out from block 0."""
    rng = random.Random(seed)
    per_seq = -(-point.context_tokens // block_size)
    return [
        SeqWork(
            seq_id=i,
            token_ids=tuple(rng.randrange(vocab_size) for _ in range(point.num_new_tokens)),
            num_computed_tokens=point.num_cached_tokens,
            block_table=tuple(range(i * per_seq, (i + 1) * per_seq)),
            sample=True,
        )
        for i in range(point.num_seqs)
    ]


def measure_point(
    ex: TorchExecutor, works: list[SeqWork], args: argparse.Namespace, budget: Budget
) -> dict[str, Any]:
    """Median wall time of `execute(works)` after warm-ups, with the layers' share, then
    one step with every region hooked (its parts)."""
    clock = Clock(ex.device)

    def step(regions: Regions) -> tuple[float, dict[str, float]]:
        clock.sync()
        start = time.perf_counter()
        ex.execute(works)
        clock.sync()
        return (time.perf_counter() - start) * 1e3, regions.sums_ms()

    if clock.cuda:
        torch.cuda.reset_peak_memory_stats()
    hooks = Regions(clock, layer_regions(ex.model, detail=False))
    try:
        first_ms, _ = step(hooks)
        if first_ms < args.point_cap_s * 250:  # a second warm-up when it is cheap
            first_ms, _ = step(hooks)
        room_s = min(args.point_cap_s, budget.left_s() - RESERVE_S)
        num_repeats = max(1, min(args.repeats, int(room_s * 1e3 / max(first_ms, 1e-3))))
        runs = [step(hooks) for _ in range(num_repeats)]
    finally:
        hooks.remove()
    hooks = Regions(clock, layer_regions(ex.model, detail=True))
    try:
        hooked_ms, parts = step(hooks)
    finally:
        hooks.remove()
    step_ms = statistics.median(ms for ms, _ in runs)
    layers_ms = statistics.median(sums["layers"] for _, sums in runs)
    return {
        "measured_ms": step_ms,
        "measured_ms_all": [ms for ms, _ in runs],
        "layers_ms": layers_ms,
        "outside_layers_ms": step_ms - layers_ms,
        "breakdown": {
            "proj_ms": parts["proj"],
            "attention_core_ms": parts["attn"] - parts["proj"],
            "mlp_ms": parts["mlp"],
            "norms_residual_ms": parts["layers"] - parts["attn"] - parts["mlp"],
            "outside_layers_ms": hooked_ms - parts["layers"],
            "hooked_step_ms": hooked_ms,
        },
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if clock.cuda else None,
    }


def full_model_ms(outside_ms: float, layers_ms: float, num_layers: int, full: int) -> float:
    """A step of the full model: the time outside the layers once, the layers x full / run."""
    return outside_ms + layers_ms * full / num_layers


# ---- predictions --------------------------------------------------------------------
def predictor(spec: ModelSpec, block_size: int, ceilings: dict[str, Any]) -> Predict:
    """Predictions for one H200, tp=1: the roofline as the simulator builds it (registry,
    defaults), its parts, and the floor: the roofline at the measured ceilings with no
    fixed overheads."""
    gpu = get_gpu("h200")
    node = NodeSpec(spec, gpu, 1, kv_dtype=Dtype.BF16, block_size=block_size)
    flops = min(1.0, max(1e-9, ceilings["matmul_tflops"] * 1e12 / gpu.bf16_flops))
    hbm = min(1.0, max(1e-9, ceilings["copy_gb_s"] * 1e9 / gpu.hbm_bandwidth_bytes_s))
    measured = {"prefill_flops": flops, "decode_flops": flops, "hbm": hbm}
    floor = make_cost_model("roofline", node, **measured, step_overhead_s=0, layer_overhead_s=0)
    roofline, parts = make_cost_model("roofline", node), RooflineCostModel(node)

    def predict(point: Point) -> dict[str, Any]:
        batch, ms = point.batch(), 1e3
        split = parts.breakdown(batch)
        return {
            "roofline_ms": roofline.step_time_s(batch) * ms,
            "roofline_compute_ms": split.compute_s * ms,
            "roofline_memory_ms": split.memory_s * ms,
            "roofline_fixed_ms": split.fixed_s * ms,
            "roofline_bound": split.bound,
            "floor_ms": floor.step_time_s(batch) * ms,
        }

    return predict


# ---- outputs ------------------------------------------------------------------------
def write_atomic(path: Path, text: str) -> None:
    """A run killed mid-write leaves the previous version."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def fill_row(row: list[float | None], xs: Sequence[int]) -> tuple[list[float], list[int]]:
    """A decode row's holes on the straight line (in context) through its first and last
    measured cells: decode time is close to linear in the KV read. Also the filled indices."""
    known = [(x, y) for x, y in zip(xs, row, strict=True) if y is not None]
    (x0, y0), (x1, y1) = known[0], known[-1]
    slope = (y1 - y0) / (x1 - x0) if x1 != x0 else 0.0
    line = [y0 + slope * (x - x0) for x in xs]
    filled = [y if y is not None else max(f, 1e-3) for y, f in zip(row, line, strict=True)]
    return filled, [i for i, y in enumerate(row) if y is None]


def profile_table(data: dict[str, Any], shape: dict[str, Any]) -> ProfileTable | None:
    """The full-model table: prefill of one sequence without cached context; decode rows
    with at least two measured contexts (or the only one), holes filled by `fill_row`."""
    ok = [p for p in shape["points"] if p["status"] == "ok"]
    chunks = sorted(
        (p["num_new_tokens"], p["full_model_ms"])
        for p in ok
        if p["kind"] == "prefill" and p["num_cached_tokens"] == 0
    )
    cells = {
        (p["num_seqs"], p["context_tokens"]): p["full_model_ms"]
        for p in ok
        if p["kind"] == "decode"
    }
    contexts = sorted({c for _, c in cells})
    batches, rows, filled_cells = [], [], []
    for b in sorted({b for b, _ in cells}):
        row = [cells.get((b, c)) for c in contexts]
        if sum(y is not None for y in row) >= min(2, len(contexts)):
            filled, holes = fill_row(row, contexts)
            batches.append(float(b))
            rows.append(tuple(filled))
            filled_cells += [f"{b}x{contexts[i]}" for i in holes]
    if not chunks or not rows:
        return None
    run, full, cfg = shape["num_layers_run"], shape["full_num_layers"], data["config"]
    source = (
        f"benchmarks/gpu_calibration.py, {data['started_at']}: evinfra TorchExecutor on "
        f"{data['device_name']}, torch {data['torch']}, {cfg['dtype']}, random weights, block "
        f"size {cfg['block_size']}; {shape['model']} ran {run} of {full} layers, a step = time "
        f"outside the layers + layer time x {full}/{run}; median of up to {cfg['repeats']} "
        f"steps. Prefill: one sequence, no cached context. Decode: batch x 1 token at a "
        f"context of C tokens; cells filled linearly in context: {filled_cells or 'none'}."
    )
    return ProfileTable(
        prefill_tokens=tuple(float(t) for t, _ in chunks),
        prefill_ms=tuple(ms for _, ms in chunks),
        decode_batch_sizes=tuple(batches),
        decode_context_tokens=tuple(float(c) for c in contexts),
        decode_ms=tuple(rows),
        source=source,
    )


REPORT_HEAD = """\
ratio = measured / roofline (one H200, tp=1; above 1: slower than predicted); floor = the
roofline at the measured ceilings, no fixed overheads. Parts (ms, one hooked step): q/k/v/o
projections, attention core (rotary, KV write, gather, SDPA), MLP, norms and residuals, and
outside the layers (batch building, embedding, LM head, sampling). full = the full model's
step (the profile table's value).

| step | measured ms | roofline ms | ratio | floor ms | / floor | bound | proj | attn core \
| mlp | norms | outside | full ms |
|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"""


def report_markdown(data: dict[str, Any]) -> str:
    state = "complete" if data["complete"] else "incomplete (cut short, or still running)"
    lines = [
        "# evinfra torch engine on one GPU against the roofline",
        "",
        f"{data['device_name']}, torch {data['torch']} (CUDA {data['cuda']}), "
        f"{data['config']['dtype']}, started {data['started_at']}, "
        f"{data.get('elapsed_s', 0.0):.0f} s, {state}.",
    ]
    if c := data["ceilings"]:
        lines += [
            "",
            f"Ceilings: bf16 matmul {c['matmul_n']}^3 at {c['matmul_tflops']:.0f} TFLOP/s; "
            f"device copy {c['copy_gb_s']:.0f} GB/s (read + write).",
        ]
    for call, r in data.get("sdpa", {}).items():
        lines.append(f"SDPA backends accepting {call}: {', '.join(r['accepted']) or 'none'}.")
    for key, shape in data["shapes"].items():
        layers = f"{shape.get('num_layers_run')} of {shape.get('full_num_layers')} layers"
        lines += ["", f"## {key}: {shape.get('model')} ({layers})", "", REPORT_HEAD]
        for p in shape["points"]:
            if p["status"] != "ok":
                lines.append(f"| {p['label']} | {p['status']}: {p.get('reason', '')} |")
                continue
            b = p["breakdown"]
            values = [p[k] for k in ("measured_ms", "roofline_ms", "ratio", "floor_ms")]
            values.append(p["ratio_to_floor"])
            parts = [b[k] for k in ("proj_ms", "attention_core_ms", "mlp_ms", "norms_residual_ms")]
            parts += [b["outside_layers_ms"], p["full_model_ms"]]
            lines.append(
                f"| {p['label']} | {' | '.join(f'{v:.2f}' for v in values)} | "
                f"{p['roofline_bound']} | {' | '.join(f'{v:.1f}' for v in parts)} |"
            )
        if "error" in shape:
            lines += ["", f"Failed: {shape['error']}"]
    return "\n".join(lines) + "\n"


class Results:
    def __init__(self, out: Path, info: dict[str, Any]) -> None:
        self.out = out
        self.data: dict[str, Any] = {**info, "complete": False, "ceilings": {}, "shapes": {}}

    def shape(self, key: str) -> dict[str, Any]:
        shapes: dict[str, dict[str, Any]] = self.data["shapes"]
        return shapes.setdefault(key, {"points": []})

    def save(self, elapsed_s: float) -> None:
        self.data["elapsed_s"] = elapsed_s
        write_atomic(self.out / "calibration.json", json.dumps(self.data, indent=1))
        write_atomic(self.out / "report.md", report_markdown(self.data))
        for key, shape in self.data["shapes"].items():
            table = profile_table(self.data, shape)
            if table is not None:
                write_atomic(self.out / f"profile-{key}.json", table.to_json())


# ---- the run ------------------------------------------------------------------------
def skip_reason(
    point: Point, record: dict[str, Any], state: dict[str, Any], budget: Budget
) -> str | None:
    """Why not to run the point: its KV does not fit, a step no larger ran out of memory,
    or its estimated time (roofline x the worst ratio so far x 3 steps) is not left."""
    if blocks_needed(point, state["block_size"]) > state["num_blocks"]:
        return f"needs {blocks_needed(point, state['block_size'])} KV blocks"
    size = point.num_seqs * point.context_tokens
    if any(f.kind == point.kind and size >= f.num_seqs * f.context_tokens for f in state["oom"]):
        return "a step no larger ran out of memory"
    if budget.left_s() - RESERVE_S < record["roofline_ms"] * 1e-3 * state["worst_ratio"] * 3:
        return "time budget"
    return None


def run_point(
    ex: TorchExecutor, plan: Plan, point: Point, args: argparse.Namespace, budget: Budget
) -> dict[str, Any]:
    works = make_works(point, args.block_size, ex.config.vocab_size, args.seed)
    try:
        record = {**measure_point(ex, works, args, budget), "status": "ok"}
    except Exception as err:  # an OOM or a failing kernel must not end the run
        oom = isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err)
        return {"status": "oom" if oom else "error", "reason": f"{type(err).__name__}: {err}"[:300]}
    finally:
        del works
        gc.collect()
        if ex.device.type == "cuda":
            torch.cuda.empty_cache()
    run, full = plan.spec.num_layers, plan.full_num_layers
    record["full_model_ms"] = full_model_ms(
        record["outside_layers_ms"], record["layers_ms"], run, full
    )
    record["tokens_per_s"] = point.num_seqs * point.num_new_tokens / record["measured_ms"] * 1e3
    return record


def run_plan(plan: Plan, args: argparse.Namespace, results: Results, budget: Budget) -> None:
    device, key, config = torch.device(args.device), plan.key, llama_config(plan.spec)
    budget.log(f"{key}: building {plan.spec.name}")
    started = time.monotonic()
    model = random_model(config, device, args.dtype, args.seed)
    bytes_per_block = args.block_size * config.kv_elements_per_token() * args.dtype.itemsize
    num_blocks = kv_capacity_blocks(plan, args, bytes_per_block)
    ex = TorchExecutor(model, num_blocks, args.block_size, dtype=args.dtype, device=device)
    shape = results.shape(key)
    shape.update(
        model=plan.spec.name,
        num_layers_run=plan.spec.num_layers,
        full_num_layers=plan.full_num_layers,
        num_kv_blocks=num_blocks,
        kv_gib=num_blocks * bytes_per_block / 2**30,
        build_s=time.monotonic() - started,
    )
    budget.log(f"{key}: built in {shape['build_s']:.1f} s, KV {shape['kv_gib']:.1f} GiB")
    if device.type == "cuda" and "sdpa" not in results.data:
        try:
            results.data["sdpa"] = probe_sdpa(config, device, args.dtype)
        except Exception as err:  # a diagnosis only: never the reason to lose a plan
            results.data["sdpa"] = {"probe": {"accepted": [], "refused": {"all": repr(err)}}}
    predict = predictor(plan.spec, args.block_size, results.data["ceilings"])
    state: dict[str, Any] = {
        "block_size": args.block_size, "num_blocks": num_blocks, "oom": [], "worst_ratio": 5.0
    }  # fmt: skip
    for point in plan.points:
        record = {"label": point.label, **asdict(point), "context_tokens": point.context_tokens}
        record.update(predict(point))
        reason = skip_reason(point, record, state, budget)
        record.update(
            {"status": "skipped", "reason": reason}
            if reason
            else run_point(ex, plan, point, args, budget)
        )
        if record["status"] == "ok":
            record["ratio"] = record["measured_ms"] / record["roofline_ms"]
            record["ratio_to_floor"] = record["measured_ms"] / record["floor_ms"]
            state["worst_ratio"] = max(state["worst_ratio"], record["ratio"])
            budget.log(
                f"{key}: {point.label}: {record['measured_ms']:.2f} ms, roofline "
                f"{record['roofline_ms']:.2f} ms, ratio {record['ratio']:.2f}"
            )
        else:
            state["oom"] += [point] if record["status"] == "oom" else []
            budget.log(f"{key}: {point.label}: {record['status']}: {record['reason']}")
        shape["points"].append(record)
        results.save(budget.elapsed_s())
    del ex, model
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--tiny", action="store_true", help="a 2-layer test model, a few points")
    p.add_argument("--layers", type=int, default=8, help="layers of the 70B shape that run")
    p.add_argument("--no-8b", action="store_true", help="skip the Llama-3-8B shape")
    p.add_argument("--time-budget-s", type=float, default=420.0)
    p.add_argument("--block-size", type=int, default=16, help="the server's default")
    p.add_argument("--repeats", type=int, default=5, help="timed steps per point, at most")
    p.add_argument("--point-cap-s", type=float, default=6.0, help="timed steps stop here")
    p.add_argument("--kv-fraction", type=float, default=0.55, help="of free memory, for KV")
    p.add_argument("--max-kv-tokens", type=int, default=1 << 20)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    if args.device == "cpu":  # one thread: steadier on a shared machine; restored after
        torch.set_num_threads(1)
    try:
        return run(args)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace) -> int:
    budget = Budget(args.time_budget_s)
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    args.dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("--device cuda, but torch sees no GPU", file=sys.stderr, flush=True)
            return 2
        # before the first allocation: fewer fragmentation OOMs between point shapes
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = device.type == "cuda"
    results = Results(
        args.out,
        {
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "python": sys.version.split()[0],
            "config": config,
        },
    )
    budget.log(f"{results.data['device_name']}, torch {torch.__version__}, out {args.out}")
    c = results.data["ceilings"] = measure_ceilings(device, args.dtype, args.tiny)
    budget.log(f"ceilings: {c['matmul_tflops']:.1f} TFLOP/s, copy {c['copy_gb_s']:.1f} GB/s")
    results.save(budget.elapsed_s())
    for plan in make_plans(args):
        if budget.left_s() < 6 * RESERVE_S:
            budget.log(f"{plan.key}: not started, {budget.left_s():.0f} s left")
            continue
        try:
            run_plan(plan, args, results, budget)
        except Exception as err:  # building the model, say: keep what the others measured
            results.shape(plan.key)["error"] = f"{type(err).__name__}: {err}"[:500]
            budget.log(f"{plan.key}: failed: {err}")
        results.save(budget.elapsed_s())
    results.data["complete"] = True
    results.save(budget.elapsed_s())
    budget.log(f"done: {', '.join(sorted(p.name for p in args.out.iterdir()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
