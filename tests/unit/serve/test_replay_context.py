"""`evinfra replay`'s context limit: every call cut the same way, the flag over whatever the
server lists, and bad values refused by name."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from evinfra.serve.cli import main as serve_cli
from evinfra.serve.replay import Replayer, ReplaySettings, cut_to_context
from evinfra.workloads.factory import make_workload
from evinfra.workloads.replay import CallRef


def test_a_call_that_fits_is_unchanged() -> None:
    assert cut_to_context(12_000, 4_384, 16_384) == (12_000, 4_384)
    assert cut_to_context(20_516, 700, None) == (20_516, 700)


def test_a_long_call_keeps_its_prompts_head_and_a_quarter_for_output() -> None:
    # bug 13's call: 20,516 prompt tokens on a 16,384-token node
    assert cut_to_context(20_516, 5_000, 16_384) == (12_288, 4_096)
    # a short output is kept whole; the prompt gives way
    assert cut_to_context(20_516, 300, 16_384) == (16_084, 300)
    # the prompt fits, prompt + output does not: the output is capped, the prompt cut to
    # what is left
    assert cut_to_context(15_000, 8_000, 16_384) == (12_288, 4_096)
    # the smallest limit: one prompt token, one output token
    assert cut_to_context(10, 10, 2) == (1, 1)
    assert cut_to_context(10, 10, 3) == (2, 1)


@pytest.mark.parametrize("bad", [0, 1, -5])
def test_settings_refuse_a_limit_with_no_room(bad: int) -> None:
    with pytest.raises(ValueError, match="max_context_tokens must be at least 2"):
        ReplaySettings(url="http://127.0.0.1:1", max_context_tokens=bad)


def _cards(max_model_len: int | None) -> httpx.MockTransport:
    card: dict[str, Any] = {"id": "m", "vocab_size": 512}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return httpx.MockTransport(lambda request: httpx.Response(200, json={"data": [card]}))


def _first_call_sent(
    max_context_tokens: int | None, max_model_len: int | None
) -> tuple[int, int, Replayer]:
    """(prompt tokens, max_tokens) of a coding session's first call as the replayer would
    send it to a server whose model card lists `max_model_len`."""
    workload = make_workload("coding", seed=0, concurrency=1)
    settings = ReplaySettings(url="http://test", max_context_tokens=max_context_tokens)
    replayer = Replayer(settings, workload)

    async def discover() -> None:
        transport = _cards(max_model_len)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await replayer._discover(client)

    asyncio.run(discover())
    plan = next(workload.arrivals()).plan
    body, _, num_prompt = replayer._payload(CallRef(plan, 0))
    assert len(body["prompt"]) == num_prompt
    return num_prompt, body["max_tokens"], replayer


def test_the_flag_takes_precedence_over_the_servers_listed_limit() -> None:
    whole_prompt, whole_out, _ = _first_call_sent(None, None)
    assert whole_prompt > 1_000  # a coding session starts with a long system prompt
    limit = whole_prompt // 2
    # a server that lists nothing (Dynamo) and one that lists more or less (evinfra: its
    # KV): with the flag both are sent the same cut call
    sent = {_first_call_sent(limit, listed)[:2] for listed in (None, 10 * limit, limit // 2)}
    assert sent == {cut_to_context(whole_prompt, whole_out, limit)}
    assert sum(sent.pop()) <= limit
    # without it the server's listed limit decides
    assert _first_call_sent(None, limit)[:2] == cut_to_context(whole_prompt, whole_out, limit)
    assert _first_call_sent(None, 10 * whole_prompt)[:2] == (whole_prompt, whole_out)


def test_the_summary_records_the_limit_and_the_calls_cut() -> None:
    whole_prompt, _, _ = _first_call_sent(None, None)
    _, _, replayer = _first_call_sent(whole_prompt // 2, 99_999)
    summary = replayer._summary(1.0)
    assert summary["max_context_tokens"] == whole_prompt // 2
    assert summary["server_max_model_len"] == 99_999
    assert summary["num_cut_calls"] == 1


@pytest.mark.parametrize("bad", ["0", "1", "-3", "lots", "1.5"])
def test_the_cli_refuses_a_bad_limit_by_the_flags_name(
    bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        serve_cli(["replay", "--url", "http://127.0.0.1:1", "--max-context-tokens", bad])
    assert exc.value.code == 2
    assert "argument --max-context-tokens" in capsys.readouterr().err


def test_the_cli_passes_the_limit_to_the_replay(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    import evinfra.serve.replay as replay_module
    from evinfra.serve.replay import ReplayResult

    seen: list[ReplaySettings] = []

    def fake_run(settings: ReplaySettings, workload: Any) -> ReplayResult:
        seen.append(settings)
        return ReplayResult({"system": "x", "num_requests": 0}, [])

    monkeypatch.setattr(replay_module, "run_replay", fake_run)
    argv = ["replay", "--url", "http://127.0.0.1:1", "--out", str(tmp_path)]
    assert serve_cli([*argv, "--max-context-tokens", "16384"]) == 0
    assert serve_cli(argv) == 0
    assert [s.max_context_tokens for s in seen] == [16_384, None]
    assert json.loads((tmp_path / "summary.json").read_text())["system"] == "x"
