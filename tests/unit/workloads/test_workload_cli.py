"""`workload generate` and `workload stats` through their handlers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from evinfra.workloads.cli import add_workload_parser, main


def test_generate_then_stats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cu.jsonl"
    code = main(
        [
            "workload",
            "generate",
            "--kind",
            "computer-use",
            "--num-sessions",
            "5",
            "--seed",
            "3",
            "--out",
            str(out),
            "--param",
            "keep_last_screenshots=5",
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert {r["session_id"] for r in rows} == {f"computer-use-{i}" for i in range(5)}
    assert all(r["input_length"] > 0 and r["hash_ids"] for r in rows)
    capsys.readouterr()
    assert main(["workload", "stats", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["num_sessions"] == 5 and stats["num_calls"] == len(rows)
    assert stats["num_truncations"] > 0
    assert main(["workload", "stats", str(out)]) == 0
    table = capsys.readouterr().out
    assert "calls per session" in table and "truncations" in table


def test_errors_are_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.jsonl"
    assert (
        main(
            [
                "workload",
                "generate",
                "--kind",
                "math",
                "--num-sessions",
                "2",
                "--out",
                str(out),
                "--param",
                "turns",
            ]
        )
        == 2
    )
    assert "NAME=VALUE" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0}\n')
    assert main(["workload", "stats", str(bad)]) == 2
    assert "line 1" in capsys.readouterr().err


def test_parser_registers_on_a_host_cli() -> None:
    parser = argparse.ArgumentParser(prog="evinfra")
    add_workload_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["workload", "stats", "f.jsonl", "--block-size", "16"])
    assert args.block_size == 16 and callable(args.func)
