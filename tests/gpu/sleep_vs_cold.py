"""Real-GPU measurement (needs an NVIDIA GPU, the CUDA vLLM env and a running `traylm serve`):
vLLM sleep mode against a cold start, through traylm. NOT RUN on the project's CI machine (no
GPU there): the planner's sleep estimates (engines/runtime/adapters/memory.py SLEEP_RESIDUAL_BYTES, the
host RAM a sleeping model takes) are unverified until someone runs this.

    python tests/gpu/sleep_vs_cold.py PROFILE [--runs 3]

PROFILE is a vLLM profile on CUDA (sleep_mode stays on, its default). For each run:
1. cold: `unload`, then time a request until its first token (traylm starts the engine);
2. sleep: POST the engine's own /sleep?level=1&mode=wait (on its loopback port, as traylm's
   eviction does) and time it; read the GPU memory the engine's processes still hold (NVML);
3. wake: POST /wake_up and time it, then time a request's first token.
It prints each figure, the memory held awake and asleep per GPU, and the host RAM the daemon's
machine lost while the weights were there. Exit status 1 if the engine cannot sleep.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.config.sections import Paths


def control() -> tuple[str, dict[str, str]]:
    info = json.loads(Paths.from_env().daemon_json.read_text())
    return info["url"], {"Authorization": f"Bearer {info['token']}"}


def engine(url: str, headers: dict[str, str], engine_id: str) -> dict[str, object]:
    for e in httpx.get(f"{url}/api/engines", headers=headers, timeout=10).json():
        if e["engine_id"] == engine_id:
            return dict(e)
    raise SystemExit(f"no engine {engine_id!r}: is the profile loaded?")


def first_token_s(url: str, model: str) -> float:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 8,
        "stream": True,
    }
    started = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=1800) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                return time.perf_counter() - started
    raise SystemExit(f"no token from {model}")


def gpu_memory_of(pids: set[int]) -> dict[int, int]:
    """NVML index → bytes the given processes hold on it."""
    import pynvml

    pynvml.nvmlInit()
    out: dict[int, int] = {}
    for i in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(i)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if p.pid in pids and p.usedGpuMemory:
                out[i] = out.get(i, 0) + int(p.usedGpuMemory)
    pynvml.nvmlShutdown()
    return out


def family(pid: int) -> set[int]:
    proc = psutil.Process(pid)
    return {pid, *(c.pid for c in proc.children(recursive=True))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("profile")
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    url, headers = control()
    cold, sleeps, wakes, warm = [], [], [], []
    for run in range(args.runs):
        httpx.delete(
            f"{url}/api/loaded", params={"model": args.profile}, headers=headers, timeout=120
        )
        cold.append(first_token_s(url, args.profile))
        e = engine(url, headers, args.profile)
        port, pids = e["port"], family(int(str(e["pid"])))
        awake_mem = gpu_memory_of(pids)
        ram_before = psutil.virtual_memory().available
        t0 = time.perf_counter()
        r = httpx.post(f"http://127.0.0.1:{port}/sleep?level=1&mode=wait", timeout=600)
        if r.status_code != 200:
            raise SystemExit(f"the engine cannot sleep ({r.status_code}): {r.text[:200]}")
        sleeps.append(time.perf_counter() - t0)
        asleep_mem = gpu_memory_of(pids)
        ram_taken = ram_before - psutil.virtual_memory().available
        t0 = time.perf_counter()
        httpx.post(f"http://127.0.0.1:{port}/wake_up", timeout=600).raise_for_status()
        wakes.append(time.perf_counter() - t0)
        # straight to the engine: traylm did not put it to sleep here, so it still routes to it
        served = str(e["served_names"][0])  # type: ignore[index]
        warm.append(first_token_s(f"http://127.0.0.1:{port}", served))
        print(
            f"run {run + 1}: cold start to first token {cold[-1]:.1f} s, sleep "
            f"{sleeps[-1]:.2f} s, wake {wakes[-1]:.2f} s, first token after wake "
            f"{warm[-1] * 1000:.0f} ms"
        )
        print(
            f"  GPU memory awake {awake_mem}, asleep {asleep_mem} (bytes per NVML index); "
            f"host RAM taken asleep {ram_taken / 2**30:.1f} GiB"
        )
    print(
        f"median: cold {statistics.median(cold):.1f} s vs wake "
        f"{statistics.median(wakes) + statistics.median(warm):.2f} s (wake + first token)"
    )


if __name__ == "__main__":
    main()
