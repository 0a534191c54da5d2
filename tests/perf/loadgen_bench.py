"""How fast the benchmark's own load generator can read streams: its ceiling on this machine.

    .venv/bin/python tests/perf/loadgen_bench.py [--tokens 256] [--levels 1,16,64]

The FAKE engine (tests/fakes/openai_engine.py) streams tokens as fast as it can, and
engines.bench.load.run_load reads them, in this process, exactly as `traylm bench` does. If a
real engine produces tokens faster than the figures printed here, the benchmark under-reports
it (run it on a machine with more free cores, or lower the concurrency). Also printed: the
ITL the generator itself adds per chunk (p50/p99) when the engine sends with no gap, and the
CPU seconds per 1k chunks of this process. No assertions: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.bench.load import RequestSpec, Target, run_load  # noqa: E402
from engines.bench.metrics import level_result  # noqa: E402
from engines.core.procs import free_loopback_port  # noqa: E402
from engines.events import BenchTelemetry  # noqa: E402

FAKE = ROOT / "tests" / "fakes" / "openai_engine.py"


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as http:
        for _ in range(200):
            try:
                async with http.get(url + "/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit("the fake engine did not start")


async def measure(url: str, tokens: int, concurrency: int) -> None:
    spec = RequestSpec(messages=({"role": "user", "content": "hi"},), max_tokens=tokens)
    specs = [spec] * max(16, concurrency * 4)
    me = psutil.Process()
    cpu0 = sum(me.cpu_times()[:2])
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        result = await run_load(http, Target(url + "/v1", "fake"), specs, concurrency=concurrency)
    cpu_s = sum(me.cpu_times()[:2]) - cpu0
    level = level_result(
        result.timings,
        concurrency=concurrency,
        rate_rps=0,
        requests=len(specs),
        level_start_s=result.start_s,
        duration_s=result.duration_s,
        max_concurrency_seen=result.max_in_flight,
        telemetry=BenchTelemetry(available=False),
    )
    chunks = sum(len(t.chunk_times_s) for t in result.timings)
    itl = level.itl.percentiles_s
    print(
        f"concurrency {concurrency:>4}: {level.output_throughput_tps:>9.0f} chunks/s read, "
        f"ITL p50 {itl.get('50', 0) * 1000:6.3f} ms p99 {itl.get('99', 0) * 1000:6.3f} ms, "
        f"{cpu_s / chunks * 1000:6.3f} CPU s per 1k chunks, failed {level.failed}"
    )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--levels", default="1,16,64")
    args = p.parse_args()
    port = free_loopback_port()
    engine = subprocess.Popen(
        [sys.executable, str(FAKE), "--port", str(port), "--served-model-name", "fake"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_ready(url)
        print(f"load generator ceiling, {args.tokens} tokens a request, {psutil.cpu_count()} CPUs")
        started = time.monotonic()
        for level in (int(x) for x in args.levels.split(",")):
            await measure(url, args.tokens, level)
        print(f"({time.monotonic() - started:.1f} s)")
    finally:
        engine.terminate()
        engine.wait(10)


if __name__ == "__main__":
    asyncio.run(main())
