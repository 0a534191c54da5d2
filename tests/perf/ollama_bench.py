"""Ollama's API against the gateway: the same paced FAKE engine streamed through :11434's
/api/chat (NDJSON, turned from the engine's events) and through :8000's /v1/chat/completions
(SSE relayed), interleaved, in one run of one real daemon, at 1, 64 and 256 streams.

    .venv/bin/python tests/perf/ollama_bench.py [--levels 1,64,256] [--repeat 3] [--tokens 64]

The upstream streams one token every 20 ms per stream (``gateway_bench.PACED_ARGS``: every
event crosses on its own). Figures: output tokens/s of each and the ratio ollama/gateway (the
target: at least 0.95 at 64 and 256 streams), TTFT p50 of each and the TTFT Ollama's API adds
at one stream (the target: at most 0.3 ms). No assertions: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.core.procs import free_loopback_port  # noqa: E402
from tests.perf.gateway_bench import (  # noqa: E402
    PACED_ARGS,
    Result,
    load,
    offline_hub,
    start_traylm,
)


async def ollama_stream(
    http: aiohttp.ClientSession, url: str, model: str, tokens: int
) -> tuple[int, float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "x"}],
        "options": {"num_predict": tokens},
    }
    started = time.perf_counter()
    ttft, count = 0.0, 0
    async with http.post(url + "/api/chat", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if b'"done":false' in line:
                if count == 0:
                    ttft = time.perf_counter() - started
                count += 1
    return count, ttft


async def ollama_load(url: str, level: int, requests: int, tokens: int) -> Result:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(ollama_stream(http, url, "bench", 2) for _ in range(level)))
        queue = list(range(requests))
        ttfts: list[float] = []
        total = errors = 0

        async def worker() -> None:
            nonlocal total, errors
            while queue:
                queue.pop()
                try:
                    n, ttft = await ollama_stream(http, url, "bench", tokens)
                    total += n
                    ttfts.append(ttft)
                except (aiohttp.ClientError, RuntimeError):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(level)))
        elapsed = time.perf_counter() - started
    return Result("ollama", level, total, elapsed, ttfts, errors)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--levels", default="1,64,256", help="concurrency levels")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream slot")
    ap.add_argument("--repeat", type=int, default=1, help="repeat the interleaved sweep N times")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    rows: list[tuple[Result, Result]] = []
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        offline_hub(stack)
        ollama_port = free_loopback_port()
        proc: subprocess.Popen[bytes]
        proc, port = await start_traylm(
            home, PACED_ARGS, serve_args=("--ollama-port", str(ollama_port))
        )
        try:
            gateway, ollama = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ollama_port}"
            for repeat in range(args.repeat):
                for level in levels:
                    requests = max(level * args.rounds, 16)
                    runs = [
                        functools.partial(
                            load, gateway, "bench", level, requests, args.tokens, "gateway"
                        ),
                        functools.partial(ollama_load, ollama, level, requests, args.tokens),
                    ]
                    if repeat % 2:
                        runs.reverse()  # neither always first
                    pair = sorted([await run() for run in runs], key=lambda r: r.name)
                    rows.append((pair[0], pair[1]))
        finally:
            proc.terminate()
            proc.wait(30)
    report(rows)


def report(rows: list[tuple[Result, Result]]) -> None:
    print(
        f"{'streams':>7} {'gateway tok/s':>14} {'ollama tok/s':>13} {'ratio':>6} "
        f"{'TTFT p50 gw ms':>15} {'TTFT p50 ol ms':>15} {'added ms':>9} {'errors':>6}"
    )
    for gateway, ollama in rows:
        added = (ollama.ttft(50) - gateway.ttft(50)) * 1e3
        print(
            f"{gateway.concurrency:>7} {gateway.tokens_per_s:>14.0f} {ollama.tokens_per_s:>13.0f} "
            f"{ollama.tokens_per_s / gateway.tokens_per_s:>6.3f} {gateway.ttft(50) * 1e3:>15.2f} "
            f"{ollama.ttft(50) * 1e3:>15.2f} {added:>9.2f} {gateway.errors + ollama.errors:>6}"
        )
    one = [(g, o) for g, o in rows if g.concurrency == 1]
    if one:
        added = statistics.median((o.ttft(50) - g.ttft(50)) * 1e3 for g, o in one)
        print(f"added TTFT at one stream (median over repeats): {added:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
