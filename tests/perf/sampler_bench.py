"""GPU sampler cost and daemon idle load (prints figures; asserts nothing about time).

    python tests/perf/sampler_bench.py [--samples 2000] [--seconds 30]

1. cost of one 2-GPU sample with the simulator: the backend alone, and the whole sampler step
   (snapshot, event, ring buffer, SQLite downsampling);
2. a real ``traylm serve --simulate-gpus 2`` at 1 Hz: CPU time over ``--seconds`` as % of one
   core, and RSS, next to the same daemon without GPUs (NVML unavailable: no sampling), so the
   difference is what the sampling costs. A subscriber on /api/events (like the dashboard) is
   attached in the sampling run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.core.procs import free_loopback_port
from engines.core.store import Store
from engines.events import Event
from engines.gpu.history import TelemetryHistory
from engines.gpu.sampler import Sampler
from engines.gpu.sim import SimulatedBackend


def sample_cost(n: int) -> None:
    sim = SimulatedBackend(2)
    sim.set_load("0", 0.7)
    t = time.perf_counter()
    for _ in range(n):
        sim.sample()
    backend_us = (time.perf_counter() - t) / n * 1e6
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "t.db")
        store.open()
        events: list[Event] = []
        sampler = Sampler(
            sim,
            interval_s=1.0,
            process_interval_s=5.0,
            publish=events.append,
            history=TelemetryHistory(store, resolution_s=10, keep_days=7),
        )
        costs = []
        for _ in range(n):
            t = time.perf_counter()
            sampler.sample_once()
            costs.append(time.perf_counter() - t)
            if len(events) > 1000:
                events.clear()
        store.close()
    payload = len(json.dumps(events[-1].to_wire()))
    print(f"simulator, 2 GPUs, {n} samples:")
    print(f"  backend.sample()          {backend_us:8.1f} µs per sample")
    print(
        f"  whole sampler step        {statistics.mean(costs) * 1e6:8.1f} µs mean, "
        f"p99 {sorted(costs)[int(n * 0.99)] * 1e6:.1f} µs (event, ring, SQLite downsampling)"
    )
    print(f"  gpu.sample event          {payload:8d} bytes of JSON per sample")


async def daemon_load(seconds: float, simulate: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "TRAYLM_HOME": home, "TRAYLM_ENVS_DIR": f"{home}/envs"}
        port = free_loopback_port()
        args = [
            sys.executable,
            "-c",
            "from engines.cli import main; main()",
            "serve",
            "--port",
            str(port),
        ]
        if simulate:
            args += ["--simulate-gpus", "2"]
        proc = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            daemon_json = Path(home) / "state" / "daemon.json"
            deadline = time.monotonic() + 30
            while not daemon_json.exists():
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("the daemon did not start")
                await asyncio.sleep(0.1)
            token = json.loads(daemon_json.read_text())["token"]
            await asyncio.sleep(3)  # settle: imports, first samples
            ps = psutil.Process(proc.pid)
            stop = asyncio.Event()
            received = 0

            async def listen() -> None:
                nonlocal received
                headers = {"Authorization": f"Bearer {token}"}
                timeout = aiohttp.ClientTimeout(total=None)
                async with (
                    aiohttp.ClientSession(timeout=timeout) as http,
                    http.get(
                        f"http://127.0.0.1:{port}/api/events?kinds=gpu.sample", headers=headers
                    ) as resp,
                ):
                    async for line in resp.content:
                        if line.startswith(b"data:"):
                            received += 1
                        if stop.is_set():
                            return

            listener = asyncio.create_task(listen()) if simulate else None
            before = ps.cpu_times()
            t0 = time.monotonic()
            await asyncio.sleep(seconds)
            after = ps.cpu_times()
            elapsed = time.monotonic() - t0
            rss = ps.memory_info().rss / 2**20
            stop.set()
            if listener is not None:
                listener.cancel()
            cpu = (after.user + after.system - before.user - before.system) / elapsed * 100
            label = "sampling 2 simulated GPUs at 1 Hz" if simulate else "no GPU (no sampling)"
            extra = f", {received} gpu.sample events received" if simulate else ""
            print(f"  daemon, {label:<34} CPU {cpu:5.2f} % of one core, RSS {rss:6.1f} MiB{extra}")
            return cpu, rss
        finally:
            proc.terminate()
            proc.wait(20)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--seconds", type=float, default=30.0)
    args = p.parse_args()
    sample_cost(args.samples)
    print(f"idle daemon over {args.seconds:.0f} s:")
    base_cpu, base_rss = asyncio.run(daemon_load(args.seconds, simulate=False))
    cpu, rss = asyncio.run(daemon_load(args.seconds, simulate=True))
    print(
        f"  sampling adds {cpu - base_cpu:+.2f} % of one core and {rss - base_rss:+.1f} MiB RSS "
        f"(target: ≤ 1 % of one core at 1 Hz)"
    )


if __name__ == "__main__":
    main()
