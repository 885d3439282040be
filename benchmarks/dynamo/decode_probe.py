"""What the mocker's decode polynomial counts as "active KV tokens", measured.

The `dynamo-polynomial` cost model prices a decode pass at u = active KV tokens / KV
capacity. Two readings give the same u when no two running requests share a prefix and
very different ones when they do:

- `per_sequence`: the sum of the decoding sequences' contexts, a shared prefix counted
  once per sequence (evinfra's `utilisation_source: decode_context`);
- `distinct`: the distinct tokens the running sequences hold in the KV, a shared prefix
  counted once (what a paged KV pool's blocks in use are);

and a third, `capped`: the per-sequence reading with u capped at 1.

Each case here is a set of requests sent at once, alone on one engine (one node, nothing
else running), `num_requests` of them sharing `shared_blocks` prompt blocks (512 tokens
each) and each with `unique_blocks` of its own; the cases run one after the other, far
enough apart not to overlap. Per case the measured median inter-token gap is set beside
the polynomial under each reading (at mid-decode), so the reading the engine uses is the
one its gaps follow. The first two cases share nothing (both readings agree: a check of
the probe itself).

Run inside the side-by-side namespace: `run_side_by_side.sh --decode-probe --out DIR`
(about 2 minutes). Writes DIR/decode_probe.json and prints a table.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from report import read_jsonl, token_timing

from evinfra.costmodel.dynamo_polynomial import decode_ms

TRACE_BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class DecodeCase:
    num_requests: int
    shared_blocks: int
    unique_blocks: int

    @property
    def prompt_tokens(self) -> int:
        return (self.shared_blocks + self.unique_blocks) * TRACE_BLOCK_TOKENS

    def active_tokens(self, reading: str, generated: int) -> int:
        """Active KV tokens under `reading` with `generated` output tokens per request."""
        own = self.unique_blocks * TRACE_BLOCK_TOKENS + generated
        shared = self.shared_blocks * TRACE_BLOCK_TOKENS
        if reading == "per_sequence":
            return self.num_requests * (shared + own)
        if reading == "distinct":
            return shared + self.num_requests * own
        raise ValueError(f"unknown reading {reading!r}")


READINGS = ("per_sequence", "distinct")

DEFAULT_CASES = (
    DecodeCase(num_requests=1, shared_blocks=0, unique_blocks=2),
    DecodeCase(num_requests=4, shared_blocks=0, unique_blocks=4),
    DecodeCase(num_requests=1, shared_blocks=0, unique_blocks=40),
    DecodeCase(num_requests=4, shared_blocks=30, unique_blocks=1),
    DecodeCase(num_requests=8, shared_blocks=20, unique_blocks=1),
)
"""On a 2,048-block (32k-token) engine: the readings agree on the first three (u about
0.03, 0.26 and 0.63) and part on the last two (u 1.9 against 0.52; 2.6 against 0.43,
where the per-sequence reading is at the polynomial's 1 ms floor)."""


@dataclass(frozen=True, slots=True)
class DecodeProbeTrace:
    cases: tuple[DecodeCase, ...] = DEFAULT_CASES
    output_tokens: int = 96
    spacing_ms: int = 7000
    """Between cases: a case's prefill and 96 decode passes of at most 34 ms fit well."""

    @property
    def duration_s(self) -> float:
        return len(self.cases) * self.spacing_ms / 1000.0

    def write(self, path: Path) -> None:
        """Mooncake-format rows; each case's prefix has hash ids of its own."""
        rows, next_id = [], 0
        for i, case in enumerate(self.cases):
            shared = list(range(next_id, next_id + case.shared_blocks))
            next_id += case.shared_blocks
            for _ in range(case.num_requests):
                own = list(range(next_id, next_id + case.unique_blocks))
                next_id += case.unique_blocks
                rows.append({
                    "timestamp": i * self.spacing_ms, "input_length": case.prompt_tokens,
                    "output_length": self.output_tokens, "hash_ids": shared + own,
                })  # fmt: skip
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def predicted_ms(
    case: DecodeCase, kv_capacity_tokens: int, output_tokens: int, speedup_ratio: float = 1.0
) -> dict[str, float]:
    """The polynomial's decode pass under each reading, at mid-decode; `capped` is the
    per-sequence reading with u capped at 1 (evinfra's cost model since the probe)."""
    mid = output_tokens // 2
    u = {r: case.active_tokens(r, mid) / kv_capacity_tokens for r in READINGS}
    u["capped"] = min(u["per_sequence"], 1.0)
    return {r: float(decode_ms(v)) / speedup_ratio for r, v in u.items()}


def measured_gaps_ms(
    run_dir: Path, trace: DecodeProbeTrace, leading_extra: bool
) -> list[float | None]:
    """Per case, the median inter-token gap (ms) over its requests' middle halves (the
    decode with every request of the case running); None where none finished."""
    rows = sorted(read_jsonl(run_dir / "requests.jsonl"), key=lambda r: float(r["send_s"]))
    out: list[float | None] = []
    start = 0
    for case in trace.cases:
        gaps: list[float] = []
        for row in rows[start : start + case.num_requests]:
            timing = token_timing(row, leading_extra)
            if timing is not None and timing[1]:
                g = timing[1]
                gaps.extend(g[len(g) // 4 : len(g) - len(g) // 4])
        start += case.num_requests
        out.append(statistics.median(gaps) * 1000.0 if gaps else None)
    return out


def closest_reading(measured: float, predicted: dict[str, float]) -> str:
    """The reading nearest the measured gap; ties (the readings agree) go to the first."""
    return min(predicted, key=lambda r: abs(predicted[r] - measured) / predicted[r])


def results(
    trace: DecodeProbeTrace, kv_capacity_tokens: int, measured: dict[str, list[float | None]]
) -> list[dict[str, Any]]:
    rows = []
    for i, case in enumerate(trace.cases):
        pred = predicted_ms(case, kv_capacity_tokens, trace.output_tokens)
        row: dict[str, Any] = {
            "num_requests": case.num_requests,
            "shared_tokens": case.shared_blocks * TRACE_BLOCK_TOKENS,
            "own_tokens": case.unique_blocks * TRACE_BLOCK_TOKENS,
            "predicted_ms": pred,
            "measured_ms": {},
            "closest": {},
        }
        for label, values in measured.items():
            value = values[i]
            row["measured_ms"][label] = value
            row["closest"][label] = None if value is None else closest_reading(value, pred)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    labels = list(rows[0]["measured_ms"]) if rows else []
    head = "| requests | shared / own tokens | per-sequence (ms) | capped at u = 1 (ms) "
    head += "| distinct (ms) |" + "".join(f" {label} measured (ms) |" for label in labels)
    lines = [head, "|---:|---|---:|---:|---:|" + "---:|" * len(labels)]
    for r in rows:
        cells = [
            f"{r['num_requests']}",
            f"{r['shared_tokens']:,} / {r['own_tokens']:,}",
            f"{r['predicted_ms']['per_sequence']:.1f}",
            f"{r['predicted_ms']['capped']:.1f}",
            f"{r['predicted_ms']['distinct']:.1f}",
        ]
        for label in labels:
            v = r["measured_ms"][label]
            cells.append("n/a" if v is None else f"{v:.1f} ({r['closest'][label]})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
