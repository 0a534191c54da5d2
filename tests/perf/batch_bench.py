"""Batches in idle time, measured: interactive TTFT p95 at a light load with and without a
batch running, and a batch's tokens/s against the same requests sent straight to the engine.

    .venv/bin/python tests/perf/batch_bench.py [--repeat 2] [--lines 800] [--lines-at-once 16]

Upstream: the paced FAKE engine (tests/fakes/openai_engine.py, one token every 20 ms per
stream, 64 tokens a request) behind a real `traylm serve` (tests/perf/gateway_bench.py starts
both). Interactive load: ``--interactive`` streams (2) of chat requests, TTFT measured by the
client. Each repeat measures, interleaved: interactive alone; interactive while a batch of
``--lines`` runs (created through /v1/files and /v1/batches, cancelled after); the batch alone
(created to completed, tokens/s from its output file); and the same requests sent straight to
the engine's port at 1x, 4x and 16x ``--lines-at-once`` (the best of them is "direct at its best
concurrency"). The FAKE engine's streams do not slow one another as a GPU's do, so the TTFT
figure shows the gateway's share (the admission, the runner's CPU) only; the engine's share
needs a real engine (vLLM with --scheduling-policy priority). No assertions: it prints figures.
The issue's targets: TTFT p95 +<= 10 % with a batch; batch tokens/s >= 0.9x direct.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import openai

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.perf.gateway_bench import (  # noqa: E402
    PACED_ARGS,
    Result,
    engine_port,
    load,
    offline_hub,
    start_traylm,
)

TOKENS = 64
CHAT = "/v1/chat/completions"


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2, help="measurement rounds (2)")
    ap.add_argument("--lines", type=int, default=800, help="lines of each batch (800)")
    ap.add_argument("--lines-at-once", type=int, default=16, help="gateway.batch_lines_at_once")
    ap.add_argument("--interactive", type=int, default=2, help="interactive streams (2)")
    ap.add_argument("--requests", type=int, default=60, help="interactive requests a round (60)")
    return ap.parse_args()


def batch_input(lines: int) -> bytes:
    row = {"model": "bench", "messages": [{"role": "user", "content": "x"}], "max_tokens": TOKENS}
    return b"".join(
        json.dumps({"custom_id": f"l{n}", "method": "POST", "url": CHAT, "body": row}).encode()
        + b"\n"
        for n in range(lines)
    )


async def run_batch(
    client: openai.AsyncOpenAI, data: bytes, *, cancel_after: asyncio.Task[Result] | None = None
) -> float:
    """Create a batch; with ``cancel_after``, cancel it when that task ends, else wait for its
    end. Returns its output tokens/s from its start to its end."""
    made = await client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
    batch = await client.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h"
    )
    started = time.perf_counter()
    if cancel_after is not None:
        await cancel_after
        batch = await client.batches.cancel(batch.id)
    while batch.status not in ("completed", "cancelled", "failed"):
        await asyncio.sleep(0.05)
        batch = await client.batches.retrieve(batch.id)
    elapsed = time.perf_counter() - started
    if batch.output_file_id is None:
        return 0.0
    out = (await client.files.content(batch.output_file_id)).content.splitlines()
    tokens = sum(json.loads(x)["response"]["body"]["usage"]["completion_tokens"] for x in out)
    return tokens / elapsed


async def direct(port: int, concurrency: int, lines: int) -> float:
    """The batch's requests sent straight to the engine (non-streamed, as a batch sends)."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "x"}], "max_tokens": TOKENS}
    url = f"http://127.0.0.1:{port}{CHAT}"
    left = iter(range(lines))
    tokens = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:

        async def worker() -> None:
            nonlocal tokens
            for _ in left:
                async with http.post(url, json=body) as r:
                    tokens += (await r.json())["usage"]["completion_tokens"]

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return tokens / (time.perf_counter() - started)


def p95(values: list[float]) -> float:
    return float(statistics.quantiles(values, n=100, method="inclusive")[94])


async def main() -> None:
    args = parse_args()
    data = batch_input(args.lines)
    rows: list[dict[str, float]] = []
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        offline_hub(stack)
        (home / "config").mkdir(parents=True)
        (home / "config" / "config.toml").write_text(
            f"[gateway]\nbatch_lines_at_once = {args.lines_at_once}\n"
        )
        proc, port = await start_traylm(home, PACED_ARGS)
        url = f"http://127.0.0.1:{port}"
        try:
            async with openai.AsyncOpenAI(
                base_url=url + "/v1", api_key="x", max_retries=0
            ) as client:
                for _ in range(args.repeat):
                    rows.append(await one_round(args, client, url, engine_port(home), data))
        finally:
            proc.terminate()
            proc.wait(30)
    report(args, rows)


async def one_round(
    args: argparse.Namespace, client: openai.AsyncOpenAI, url: str, eport: int, data: bytes
) -> dict[str, float]:
    def interactive() -> asyncio.Task[Result]:
        return asyncio.create_task(
            load(url, "bench", args.interactive, args.requests, TOKENS, "interactive")
        )

    alone = await interactive()
    during_task = interactive()
    await run_batch(client, data, cancel_after=during_task)
    during = during_task.result()
    batch_tps = await run_batch(client, data)
    best = max([await direct(eport, args.lines_at_once * k, args.lines) for k in (1, 4, 16)])
    same = await direct(eport, args.lines_at_once, args.lines)
    return {
        "ttft_alone_ms": p95(alone.ttft_s) * 1000,
        "ttft_batch_ms": p95(during.ttft_s) * 1000,
        "batch_tps": batch_tps,
        "direct_best_tps": best,
        "direct_same_tps": same,
    }


def report(args: argparse.Namespace, rows: list[dict[str, float]]) -> None:
    print(
        f"paced FAKE engine (20 ms a token, {TOKENS} tokens); {args.interactive} interactive "
        f"streams; batches of {args.lines} lines, {args.lines_at_once} at once"
    )
    for n, r in enumerate(rows, 1):
        rise = r["ttft_batch_ms"] / r["ttft_alone_ms"] - 1
        print(
            f"round {n}: interactive TTFT p95 {r['ttft_alone_ms']:.1f} ms alone, "
            f"{r['ttft_batch_ms']:.1f} ms with a batch ({rise:+.0%}; target <= +10 %); "
            f"batch {r['batch_tps']:.0f} tok/s = {r['batch_tps'] / r['direct_best_tps']:.2f}x "
            f"direct at its best ({r['direct_best_tps']:.0f}), "
            f"{r['batch_tps'] / r['direct_same_tps']:.2f}x direct at {args.lines_at_once} at once"
        )


if __name__ == "__main__":
    asyncio.run(main())
