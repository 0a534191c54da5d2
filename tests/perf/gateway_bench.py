"""Gateway overhead benchmark: the same synthetic upstream measured directly and through
gateways, in one run, at 1, 64 and 256 concurrent streams.

    .venv/bin/python tests/perf/gateway_bench.py [--tokens 200] [--levels 1,64,256]

Upstream: tests/fakes/openai_engine.py streaming tokens as fast as it can (one SSE event per
token). Gateways, each in its own process, all pointed at that upstream:
  traylm     the real daemon (`traylm serve`, aiohttp server + aiohttp client) routing by model.
             (uvloop was also measured for the daemon: no difference beyond noise, so not used)
  reference  a minimal Starlette + uvicorn (uvloop, httptools) + httpx streaming proxy: the
             other stack measured before choosing aiohttp
Figures: output tokens/s (and the ratio gateway/direct), TTFT p50/p99 and the TTFT added by the
gateway, and the gateway process's CPU seconds per 1k tokens and peak RSS. The client is an
aiohttp load generator in this process. Everything shares this machine's cores, so the absolute
numbers move with the machine; the ratios are the point. No assertions: it prints figures.
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
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.procs import free_loopback_port  # noqa: E402
from tests.fakes.fake_vllm_env import make_fake_vllm_env  # noqa: E402

FAKE = ROOT / "tests" / "fakes" / "openai_engine.py"

REFERENCE_PROXY = textwrap.dedent("""
    import sys, httpx, uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse, Response
    from starlette.routing import Route
    UP = sys.argv[2]
    client = httpx.AsyncClient(base_url=UP, timeout=None,
                               limits=httpx.Limits(max_connections=None, max_keepalive_connections=512))
    async def chat(request):
        body = await request.body()
        req = client.build_request("POST", "/v1/chat/completions", content=body,
                                   headers={"content-type": "application/json"})
        resp = await client.send(req, stream=True)
        async def relay():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()
        return StreamingResponse(relay(), status_code=resp.status_code,
                                 media_type=resp.headers.get("content-type"))
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
                loop="uvloop", http="httptools", access_log=False, backlog=2048)
""")


@dataclass
class Result:
    name: str
    concurrency: int
    tokens: int
    seconds: float
    ttft_s: list[float]
    errors: int
    cpu_s: float | None = None
    rss_mb: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds

    def ttft(self, q: float) -> float:
        return (
            float(statistics.quantiles(self.ttft_s, n=100, method="inclusive")[int(q) - 1])
            if len(self.ttft_s) > 1
            else self.ttft_s[0]
        )


async def one_stream(
    http: aiohttp.ClientSession, url: str, model: str, tokens: int
) -> tuple[int, float]:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "x"}],
        "stream": True,
        "max_tokens": tokens,
    }
    started = time.perf_counter()
    ttft = 0.0
    count = 0
    async with http.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if line.startswith(b"data: {"):
                if count == 0:
                    ttft = time.perf_counter() - started
                count += 1
    return count, ttft


async def load(
    url: str, model: str, concurrency: int, requests: int, tokens: int, name: str
) -> Result:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await one_stream(http, url, model, 4)  # warm the connection pool
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)
        ttfts: list[float] = []
        total = 0
        errors = 0

        async def worker() -> None:
            nonlocal total, errors
            while not queue.empty():
                queue.get_nowait()
                try:
                    n, ttft = await one_stream(http, url, model, tokens)
                    total += n
                    ttfts.append(ttft)
                except (aiohttp.ClientError, RuntimeError):
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return Result(name, concurrency, total, elapsed, ttfts, errors)


class ProcessMeter:
    """CPU seconds and peak RSS of one process (with its children) during a measurement."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _family(self) -> list[psutil.Process]:
        return [self.proc, *self.proc.children(recursive=True)]

    def _cpu(self) -> float:
        return sum(p.cpu_times().user + p.cpu_times().system for p in self._family())

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_rss = max(self.peak_rss, sum(p.memory_info().rss for p in self._family()))

    def __enter__(self) -> ProcessMeter:
        self.cpu0 = self._cpu()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.cpu_s = self._cpu() - self.cpu0


async def wait_http(url: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            try:
                async with http.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def start_traylm(home: Path, upstream_args: str) -> tuple[subprocess.Popen[bytes], int]:
    envs = home / "envs"
    make_fake_vllm_env(envs)
    profiles = home / "config" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "bench.toml").write_text(
        f'model = "org/bench"\nserved_name = "bench"\ndevice = "cpu"\n'
        f'[env]\nFAKE_ENGINE_ARGS = "{upstream_args}"\n'
    )
    port = free_loopback_port()
    env = {**os.environ, "TRAYLM_HOME": str(home), "TRAYLM_ENVS_DIR": str(envs)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "engines", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=ROOT,
    )
    await wait_http(f"http://127.0.0.1:{port}/health")
    subprocess.run(
        [sys.executable, "-m", "engines", "start", "bench", "--wait", "--timeout", "60"],
        env=env,
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    return proc, port


def engine_port(home: Path) -> int:
    token = json.loads((home / "state" / "daemon.json").read_text())
    import urllib.request

    req = urllib.request.Request(
        f"{token['url']}/api/engines", headers={"Authorization": f"Bearer {token['token']}"}
    )
    with urllib.request.urlopen(req) as r:
        return int(json.load(r)[0]["port"])


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tokens", type=int, default=200, help="output tokens per request")
    ap.add_argument("--levels", default="1,64,256", help="concurrency levels")
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream slot")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]

    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        daemon, gw_port = await start_traylm(home, "--chunk-bytes 0")
        up_port = engine_port(home)
        ref_port = free_loopback_port()
        ref = subprocess.Popen(
            [sys.executable, "-c", REFERENCE_PROXY, str(ref_port), f"http://127.0.0.1:{up_port}"]
        )
        await wait_http(f"http://127.0.0.1:{ref_port}/v1/chat/completions")
        targets = {
            "direct": (f"http://127.0.0.1:{up_port}", None),
            "traylm": (f"http://127.0.0.1:{gw_port}", daemon.pid),
            "reference": (f"http://127.0.0.1:{ref_port}", ref.pid),
        }
        results: list[Result] = []
        try:
            for level in levels:
                requests = max(level * args.rounds, 16)
                for name, (url, pid) in targets.items():
                    if pid is None:
                        results.append(await load(url, "bench", level, requests, args.tokens, name))
                        continue
                    with ProcessMeter(pid) as meter:
                        r = await load(url, "bench", level, requests, args.tokens, name)
                    r.cpu_s, r.rss_mb = meter.cpu_s, meter.peak_rss / 2**20
                    results.append(r)
        finally:
            for proc in (ref, daemon):
                proc.terminate()
            for proc in (ref, daemon):
                proc.wait(30)
    report(results, args.tokens)


def report(results: list[Result], tokens: int) -> None:
    print(f"\nGateway overhead, {tokens} tokens per streamed request, one SSE event per token")
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, aiohttp {aiohttp.__version__}")
    head = (
        f"{'conc':>5} {'target':<15} {'tok/s':>9} {'ratio':>6} {'TTFT p50':>9} "
        f"{'p99':>8} {'+p50':>7} {'+p99':>7} {'cpu s/1k tok':>12} {'RSS MB':>7} {'err':>4}"
    )
    print(head)
    print("-" * len(head))
    by_level: dict[int, dict[str, Result]] = {}
    for r in results:
        by_level.setdefault(r.concurrency, {})[r.name] = r
    for level, rs in by_level.items():
        direct = rs["direct"]
        for name, r in rs.items():
            ratio = r.tokens_per_s / direct.tokens_per_s
            add50 = (r.ttft(50) - direct.ttft(50)) * 1000
            add99 = (r.ttft(99) - direct.ttft(99)) * 1000
            cpu = f"{r.cpu_s / r.tokens * 1000:.3f}" if r.cpu_s is not None else "-"
            rss = f"{r.rss_mb:.0f}" if r.rss_mb is not None else "-"
            extra = f"{add50:6.2f}m {add99:6.2f}m" if name != "direct" else f"{'':>7} {'':>7}"
            print(
                f"{level:>5} {name:<15} {r.tokens_per_s:>9.0f} {ratio:>6.2f} "
                f"{r.ttft(50) * 1000:>7.2f}ms {r.ttft(99) * 1000:>6.1f}ms {extra} {cpu:>12} "
                f"{rss:>7} {r.errors:>4}"
            )
    print(
        "\nratio = gateway tokens/s / direct tokens/s (target >= 0.95 at 64 streams); "
        "+p50/+p99 = TTFT added by the gateway (target p50 <= 2 ms)"
    )


if __name__ == "__main__":
    from tests.fakes.hub_endpoint import reachable_hub_env

    with reachable_hub_env():  # the FAKE engine serves made-up repo ids
        asyncio.run(main())
