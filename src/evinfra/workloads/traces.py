"""Trace loaders: Mooncake JSONL and Azure CSV, replayed open-loop (every row its own
one-call session, sent at its timestamp divided by the rate scale).

Malformed rows raise ValueError naming the file, the line and the field.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from evinfra.core.blocks import Segment
from evinfra.core.types import ContextEvent
from evinfra.workloads.ids import text_key, trace_block_id, trace_output_id, trace_prompt_id
from evinfra.workloads.types import Call, SessionArrival, SessionPlan

TRACE_KIND = "trace"
MOONCAKE_BLOCK_TOKENS = 512


class TraceWorkload:
    """A workload read from a file: its sessions, sorted by start time."""

    def __init__(self, name: str, arrivals: list[SessionArrival], *, hints: bool = True) -> None:
        self._name = name
        self._arrivals = sorted(arrivals, key=lambda a: a.start_s)
        self.hints = hints

    @property
    def name(self) -> str:
        return self._name

    @property
    def concurrency(self) -> int | None:
        return None

    @property
    def num_sessions(self) -> int:
        return len(self._arrivals)

    def arrivals(self) -> Iterator[SessionArrival]:
        return iter(self._arrivals)


class RowError(ValueError):
    """A malformed trace row; the message starts with `FILE line N:`."""

    def __init__(self, path: Path, lineno: int, message: str) -> None:
        super().__init__(f"{path} line {lineno}: {message}")


def check_rate_scale(rate_scale: float) -> None:
    if not rate_scale > 0 or math.isinf(rate_scale):
        raise ValueError(f"rate_scale must be a positive number, got {rate_scale}")


def read_json_rows(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise RowError(path, lineno, f"not valid JSON ({e.msg})") from None
            if not isinstance(row, dict):
                raise RowError(path, lineno, "a row must be a JSON object")
            yield lineno, row


def get_number(row: dict[str, Any], field: str, path: Path, lineno: int) -> float:
    value = row.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RowError(path, lineno, f"field {field!r} must be a finite number, got {value!r}")
    if value < 0:
        raise RowError(path, lineno, f"field {field!r} must not be negative, got {value!r}")
    return float(value)


def get_int(row: dict[str, Any], field: str, path: Path, lineno: int, minimum: int = 0) -> int:
    value = row.get(field)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RowError(path, lineno, f"field {field!r} must be an integer, got {value!r}")
    if value < minimum:
        raise RowError(path, lineno, f"field {field!r} must be at least {minimum}, got {value}")
    return value


def get_hash_ids(
    row: dict[str, Any], num_input_tokens: int, block_tokens: int, path: Path, lineno: int
) -> list[int]:
    ids = row.get("hash_ids")
    if not isinstance(ids, list) or not all(
        isinstance(h, int) and not isinstance(h, bool) for h in ids
    ):
        raise RowError(path, lineno, "field 'hash_ids' must be a list of integers")
    expected = -(-num_input_tokens // block_tokens)
    if len(ids) != expected:
        raise RowError(
            path,
            lineno,
            f"field 'hash_ids' has {len(ids)} ids, but input_length {num_input_tokens} "
            f"needs {expected} blocks of {block_tokens} tokens",
        )
    return ids


class BlockSegments:
    """Segments for trace block ids: block i of a prompt is a segment named by its hash id
    (equal ids share content); the last block holds what remains of the input."""

    def __init__(self, file_key: int, block_tokens: int) -> None:
        self._file_key = file_key
        self._block_tokens = block_tokens
        self._full: dict[int, Segment] = {}

    def segments(self, hash_ids: list[int], num_input_tokens: int) -> tuple[Segment, ...]:
        out = [self._full_block(h) for h in hash_ids[:-1]]
        if hash_ids:
            tail = num_input_tokens - self._block_tokens * (len(hash_ids) - 1)
            if tail == self._block_tokens:
                out.append(self._full_block(hash_ids[-1]))
            else:
                out.append(Segment(trace_block_id(self._file_key, hash_ids[-1]), tail))
        return tuple(out)

    def _full_block(self, hash_id: int) -> Segment:
        # One object per id: equal prefixes then compare by identity (fast).
        seg = self._full.get(hash_id)
        if seg is None:
            seg = Segment(trace_block_id(self._file_key, hash_id), self._block_tokens)
            self._full[hash_id] = seg
        return seg


def one_call_session(
    session_id: str, segments: tuple[Segment, ...], num_output_tokens: int, output_id: int
) -> SessionPlan:
    call = Call(segments, num_output_tokens, output_id, 0.0, ContextEvent.START)
    return SessionPlan(session_id, TRACE_KIND, (call,))


def load_mooncake(
    path: Path, *, rate_scale: float = 1.0, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> TraceWorkload:
    """Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`."""
    check_rate_scale(rate_scale)
    file_key = text_key(path.name)
    blocks = BlockSegments(file_key, block_tokens)
    arrivals: list[SessionArrival] = []
    for lineno, row in read_json_rows(path):
        timestamp_ms = get_number(row, "timestamp", path, lineno)
        num_input = get_int(row, "input_length", path, lineno, minimum=1)
        num_output = max(1, get_int(row, "output_length", path, lineno))
        hash_ids = get_hash_ids(row, num_input, block_tokens, path, lineno)
        plan = one_call_session(
            f"{path.stem}-{lineno}",
            blocks.segments(hash_ids, num_input),
            num_output,
            trace_output_id(file_key, lineno),
        )
        arrivals.append(SessionArrival(timestamp_ms / 1000.0 / rate_scale, plan))
    return TraceWorkload(path.stem, arrivals)


AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


def load_azure(path: Path, *, rate_scale: float = 1.0) -> TraceWorkload:
    """Azure LLM inference CSV (TIMESTAMP, ContextTokens, GeneratedTokens). There is no
    prefix information: every prompt is distinct content."""
    check_rate_scale(rate_scale)
    file_key = text_key(path.name)
    rows: list[tuple[datetime, SessionPlan]] = []
    with path.open(encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header[:3]) != AZURE_COLUMNS:
            raise RowError(path, 1, f"expected the header {','.join(AZURE_COLUMNS)}")
        for record in reader:
            lineno = reader.line_num
            if not record or not any(cell.strip() for cell in record):
                continue
            if len(record) < 3:
                raise RowError(path, lineno, f"expected 3 columns, got {len(record)}")
            try:
                when = datetime.fromisoformat(record[0].strip())
            except ValueError:
                raise RowError(
                    path, lineno, f"field 'TIMESTAMP' is not a date: {record[0]!r}"
                ) from None
            num_input = _csv_int(record[1], "ContextTokens", path, lineno, minimum=1)
            num_output = max(1, _csv_int(record[2], "GeneratedTokens", path, lineno, minimum=0))
            plan = one_call_session(
                f"{path.stem}-{lineno}",
                (Segment(trace_prompt_id(file_key, lineno), num_input),),
                num_output,
                trace_output_id(file_key, lineno),
            )
            rows.append((when, plan))
    if not rows:
        return TraceWorkload(path.stem, [])
    first = min(when for when, _ in rows)
    arrivals = [
        SessionArrival((when - first).total_seconds() / rate_scale, plan) for when, plan in rows
    ]
    return TraceWorkload(path.stem, arrivals)


def _csv_int(cell: str, field: str, path: Path, lineno: int, minimum: int) -> int:
    try:
        value = int(cell.strip())
    except ValueError:
        raise RowError(path, lineno, f"field {field!r} must be an integer, got {cell!r}") from None
    if value < minimum:
        raise RowError(path, lineno, f"field {field!r} must be at least {minimum}, got {value}")
    return value
