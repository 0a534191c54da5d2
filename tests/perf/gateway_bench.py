"""Gateway overhead benchmark: the same synthetic upstream measured directly and through
gateways, in one run, at 1, 64 and 256 concurrent streams.

    .venv/bin/python tests/perf/gateway_bench.py [--tokens 200] [--levels 1,64,256]
    .venv/bin/python tests/perf/gateway_bench.py --paced [--repeat 3]

Upstream: tests/fakes/openai_engine.py (an aiohttp server in its own process, started by the
daemon as a FAKE engine), one SSE event per token. By default it streams as fast as it can; the
client is then CPU-bound and coalescing hides the per-event cost of a gateway. ``--paced`` makes
it stream one token every 20 ms per stream (a 4090-like decode rate), 64 tokens per request: the
case where every event crosses the gateway on its own. Gateways, each in its own process, all
pointed at that upstream:
  traylm     the real daemon (`traylm serve`, aiohttp server + aiohttp client) routing by model
  bare       a minimal aiohttp pass-through (iter_any → write, nothing else): the thinnest relay
  raw        asyncio protocols on uvloop, no HTTP framework, only as much HTTP as these requests
             need (not a usable gateway): the floor of a relay in Python (``--targets``)
  reference  a minimal Starlette + uvicorn (uvloop, httptools) + httpx streaming proxy: the
             other stack measured before choosing aiohttp (fast case only)
Targets are measured interleaved (every level, target after target) and the whole sweep is
repeated ``--repeat`` times; the summary gives each ratio's range over the repeats.
Figures: output tokens/s (and the ratio gateway/direct), TTFT p50/p99 and the TTFT added by the
gateway, and the gateway process's CPU seconds per 1k tokens and peak RSS. The client is an
aiohttp load generator in this process. Everything shares this machine's cores, so the absolute
numbers move with the machine; the ratios are the point. No assertions: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
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

from engines.core.procs import free_loopback_port  # noqa: E402
from tests.fakes.fake_vllm_env import make_fake_vllm_env  # noqa: E402
from tests.fakes.hub_endpoint import ReachableEndpoint  # noqa: E402

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

BARE_RELAY = textwrap.dedent("""
    import sys, aiohttp
    from aiohttp import web
    UP = sys.argv[2]
    async def chat(request):
        body = await request.read()
        http = request.app["http"]
        async with http.post(UP + request.path, data=body,
                             headers={"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(status=up.status,
                                      headers={"Content-Type": up.headers["Content-Type"]})
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(chunk)
            await resp.write_eof()
            return resp
    async def session(app):
        app["http"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                            auto_decompress=False)
        yield
        await app["http"].close()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.cleanup_ctx.append(session)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None, access_log=None,
                backlog=2048)
""")

RAW_RELAY = textwrap.dedent("""
    # asyncio protocols on uvloop, no HTTP framework: parse the request head, pass the bytes
    # to the upstream over a kept connection, pass its chunked reply back unchanged. Only as
    # much HTTP as the benchmark's own requests need: the floor of a relay in Python.
    import asyncio, socket, sys, uvloop
    PORT, UP = int(sys.argv[1]), sys.argv[2]
    UP_HOST, UP_PORT = UP.split("//")[1].split(":")
    HEAD = b"HTTP/1.1 200 OK\\r\\nContent-Type: text/event-stream\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n"
    class Upstream(asyncio.Protocol):
        def __init__(self, down):
            self.down, self.in_head, self.buf = down, True, b""
        def data_received(self, data):
            if self.in_head:
                self.buf += data
                cut = self.buf.find(b"\\r\\n\\r\\n")
                if cut < 0:
                    return
                data, self.buf, self.in_head = self.buf[cut + 4 :], b"", False
                self.down.write(HEAD + data)
            else:
                self.down.write(data)
            if data.endswith(b"\\r\\n0\\r\\n\\r\\n") or data == b"0\\r\\n\\r\\n":
                self.in_head = True
    class Client(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buf, self.up = transport, b"", None
        def data_received(self, data):
            self.buf += data
            cut = self.buf.find(b"\\r\\n\\r\\n")
            if cut < 0:
                return
            head = self.buf[:cut].lower()
            if b"content-length:" not in head:  # the bench's readiness GET
                self.buf = self.buf[cut + 4 :]
                self.transport.write(b"HTTP/1.1 404 Not Found\\r\\nContent-Length: 0\\r\\n\\r\\n")
                return
            length = int(head.split(b"content-length:")[1].split(b"\\r\\n")[0])
            if len(self.buf) < cut + 4 + length:
                return
            body, self.buf = self.buf[cut + 4 : cut + 4 + length], self.buf[cut + 4 + length :]
            request = (b"POST /v1/chat/completions HTTP/1.1\\r\\nHost: %b\\r\\nContent-Type: "
                       b"application/json\\r\\nContent-Length: %d\\r\\n\\r\\n%b"
                       % (UP_HOST.encode(), length, body))
            if self.up is None:
                asyncio.ensure_future(self.connect(request))
            else:
                self.up.write(request)
        async def connect(self, request):
            loop = asyncio.get_running_loop()
            self.up, _ = await loop.create_connection(lambda: Upstream(self.transport), UP_HOST, int(UP_PORT))
            self.up.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.up.write(request)
        def connection_lost(self, exc):
            if self.up is not None:
                self.up.close()
    async def main():
        server = await asyncio.get_running_loop().create_server(Client, "127.0.0.1", PORT, backlog=2048)
        await server.serve_forever()
    uvloop.run(main())
""")

PACED_ARGS = "--token-delay 0.02"
FAST_ARGS = "--chunk-bytes 0"


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
    repeat: int = 0

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
        # open every connection before the clock starts (a gateway keeps its upstream pool
        # warm between measurements, and a burst of 256 connects measures the accept queue)
        await asyncio.gather(*(one_stream(http, url, model, 2) for _ in range(concurrency)))
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
    """CPU seconds and peak RSS of one gateway process during a measurement: the process alone,
    not its children (the daemon's child is the upstream engine, measured by every target)."""

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak_rss = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _cpu(self) -> float:
        times = self.proc.cpu_times()
        return times.user + times.system

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)

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


def offline_hub(stack: contextlib.ExitStack) -> None:
    """A reachable stand-in for the Hub, for the daemons this script starts: the made-up
    "org/bench" is no real repo, and a daemon that cannot reach a Hub refuses to start a model
    that is not downloaded."""
    hub = ReachableEndpoint().start()
    stack.callback(hub.stop)
    os.environ["HF_ENDPOINT"] = hub.url


async def start_traylm(
    home: Path, upstream_args: str, *, root: Path = ROOT, serve_args: tuple[str, ...] = ()
) -> tuple[subprocess.Popen[bytes], int]:
    """A real daemon run from the checkout at ``root`` with one FAKE engine profile; this
    checkout's serves no Ollama API unless ``serve_args`` asks (--ollama-port)."""
    if root == ROOT and not serve_args:
        serve_args = ("--ollama-port", "0")
    envs = home / "envs"
    make_fake_vllm_env(envs)
    profiles = home / "config" / "profiles"
    profiles.mkdir(parents=True)
    (profiles / "bench.toml").write_text(
        f'model = "org/bench"\nserved_name = "bench"\ndevice = "cpu"\n'
        f'[env]\nFAKE_ENGINE_ARGS = "{upstream_args}"\n'
    )
    port = free_loopback_port()
    env = {
        **os.environ,
        "TRAYLM_HOME": str(home),
        "TRAYLM_ENVS_DIR": str(envs),
        "PYTHONPATH": str(root),
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "engines", "serve", "--port", str(port), *serve_args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=root,
    )
    await wait_http(f"http://127.0.0.1:{port}/health")
    subprocess.run(
        [sys.executable, "-m", "engines", "start", "bench", "--wait", "--timeout", "60"],
        env=env,
        check=True,
        capture_output=True,
        cwd=root,
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


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--paced", action="store_true", help="one token every 20 ms per stream")
    ap.add_argument("--tokens", type=int, help="output tokens per request (200; paced: 64)")
    ap.add_argument("--levels", default="1,64,256", help="concurrency levels")
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream slot")
    ap.add_argument("--min-requests", type=int, default=16, help="requests per level at least")
    ap.add_argument("--repeat", type=int, default=1, help="repeat the interleaved sweep N times")
    ap.add_argument(
        "--targets",
        help="gateways to measure besides direct (traylm,bare,raw,reference; default "
        "traylm,bare,reference; paced: no reference)",
    )
    ap.add_argument(
        "--baseline",
        action="append",
        default=[],
        metavar="[NAME=]DIR",
        help="also measure the daemon of another checkout (e.g. `git archive main | tar -x -C "
        "DIR`) as traylm@NAME (default NAME: the folder's name); repeatable",
    )
    args = ap.parse_args()
    args.tokens = args.tokens or (64 if args.paced else 200)
    default_targets = "traylm,bare" if args.paced else "traylm,bare,reference"
    args.targets = (args.targets or default_targets).split(",")
    return args


async def main() -> None:
    args = parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    upstream_args = PACED_ARGS if args.paced else FAST_ARGS
    procs: list[subprocess.Popen[bytes]] = []
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        offline_hub(stack)
        try:
            targets = await start_targets(args, home, upstream_args, procs)
            for repeat in range(args.repeat):
                # rotate the order each repeat so that no target always runs first or last
                order = list(targets.items())
                order = order[repeat % len(order) :] + order[: repeat % len(order)]
                for level in levels:
                    requests = max(level * args.rounds, args.min_requests)
                    for name, (url, pid) in order:
                        results.append(
                            await measure(url, pid, name, level, requests, args.tokens, repeat)
                        )
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
    report(results, args)


async def start_targets(
    args: argparse.Namespace, home: Path, upstream_args: str, procs: list[subprocess.Popen[bytes]]
) -> dict[str, tuple[str, int | None]]:
    daemon, gw_port = await start_traylm(home / "traylm", upstream_args)
    procs.append(daemon)
    up = f"http://127.0.0.1:{engine_port(home / 'traylm')}"
    targets: dict[str, tuple[str, int | None]] = {"direct": (up, None)}
    if "traylm" in args.targets:
        targets["traylm"] = (f"http://127.0.0.1:{gw_port}", daemon.pid)
    for i, spec in enumerate(args.baseline):
        name, _, folder = spec.rpartition("=")
        root = Path(folder).resolve()
        base, base_port = await start_traylm(home / f"base{i}", upstream_args, root=root)
        procs.append(base)
        targets[f"traylm@{name or root.name}"] = (f"http://127.0.0.1:{base_port}", base.pid)
    for name, script in (("bare", BARE_RELAY), ("raw", RAW_RELAY), ("reference", REFERENCE_PROXY)):
        if name in args.targets:
            port = free_loopback_port()
            proc = subprocess.Popen([sys.executable, "-c", script, str(port), up])
            procs.append(proc)
            await wait_http(f"http://127.0.0.1:{port}/v1/chat/completions")
            targets[name] = (f"http://127.0.0.1:{port}", proc.pid)
    return targets


async def measure(
    url: str, pid: int | None, name: str, level: int, requests: int, tokens: int, repeat: int
) -> Result:
    if pid is None:
        r = await load(url, "bench", level, requests, tokens, name)
    else:
        with ProcessMeter(pid) as meter:
            r = await load(url, "bench", level, requests, tokens, name)
        r.cpu_s, r.rss_mb = meter.cpu_s, meter.peak_rss / 2**20
    r.repeat = repeat
    return r


def report(results: list[Result], args: argparse.Namespace) -> None:
    pace = "one token every 20 ms per stream" if args.paced else "as fast as the upstream can"
    print(
        f"\nGateway overhead, {args.tokens} tokens per streamed request ({pace}), one SSE event per token"
    )
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, aiohttp {aiohttp.__version__}")
    head = (
        f"{'rep':>3} {'conc':>5} {'target':<16} {'tok/s':>9} {'ratio':>6} {'TTFT p50':>9} "
        f"{'p99':>8} {'+p50':>7} {'+p99':>7} {'cpu s/1k tok':>12} {'RSS MB':>7} {'err':>4}"
    )
    print(head)
    print("-" * len(head))
    runs: dict[tuple[int, int], dict[str, Result]] = {}
    for r in results:
        runs.setdefault((r.repeat, r.concurrency), {})[r.name] = r
    for (repeat, level), rs in sorted(runs.items()):
        direct = rs["direct"]
        for name, r in rs.items():
            ratio = r.tokens_per_s / direct.tokens_per_s
            add50 = (r.ttft(50) - direct.ttft(50)) * 1000
            add99 = (r.ttft(99) - direct.ttft(99)) * 1000
            cpu = f"{r.cpu_s / r.tokens * 1000:.3f}" if r.cpu_s is not None else "-"
            rss = f"{r.rss_mb:.0f}" if r.rss_mb is not None else "-"
            extra = f"{add50:6.2f}m {add99:6.2f}m" if name != "direct" else f"{'':>7} {'':>7}"
            print(
                f"{repeat:>3} {level:>5} {name:<16} {r.tokens_per_s:>9.0f} {ratio:>6.2f} "
                f"{r.ttft(50) * 1000:>7.2f}ms {r.ttft(99) * 1000:>6.1f}ms {extra} {cpu:>12} "
                f"{rss:>7} {r.errors:>4}"
            )
    summary(runs)


def summary(runs: dict[tuple[int, int], dict[str, Result]]) -> None:
    """Each gateway's ratio to direct, added TTFT and CPU per token, as min–max over repeats."""
    seen: dict[tuple[int, str], list[Result]] = {}
    directs: dict[tuple[int, str], list[Result]] = {}
    for (_, level), rs in runs.items():
        for name, r in rs.items():
            seen.setdefault((level, name), []).append(r)
            directs.setdefault((level, name), []).append(rs["direct"])
    print(
        "\nSummary over repeats, median [min–max]: ratio to direct | TTFT added p50 / p99 (ms) | "
        "gateway CPU µs per token"
    )
    for (level, name), rs in sorted(seen.items()):
        if name == "direct":
            tps = [r.tokens_per_s for r in rs]
            print(f"{level:>5} {name:<16} {min(tps):>7.0f}–{max(tps):.0f} tok/s")
            continue
        pairs = list(zip(rs, directs[(level, name)], strict=True))
        ratio = [r.tokens_per_s / d.tokens_per_s for r, d in pairs]
        p50 = [(r.ttft(50) - d.ttft(50)) * 1000 for r, d in pairs]
        p99 = [(r.ttft(99) - d.ttft(99)) * 1000 for r, d in pairs]
        cpu = [r.cpu_s / r.tokens * 1e6 for r in rs if r.cpu_s is not None and r.tokens]
        cpu_text = f"{statistics.median(cpu):.0f} [{min(cpu):.0f}–{max(cpu):.0f}]" if cpu else "-"
        print(
            f"{level:>5} {name:<16} {statistics.median(ratio):.2f} [{min(ratio):.2f}–"
            f"{max(ratio):.2f}] | +{statistics.median(p50):.2f} [{min(p50):.2f}–{max(p50):.2f}]"
            f" / +{min(p99):.2f}–{max(p99):.2f} | {cpu_text}"
        )
    print(
        "\nratio = gateway tokens/s / direct tokens/s (paced target >= 0.95 and >= bare at 256); "
        "TTFT added at 1 stream (paced target: p50 <= the bare relay's + 0.2 ms); CPU per token (paced target at 256: <= the bare relay's)"
    )


if __name__ == "__main__":
    from tests.fakes.hub_endpoint import reachable_hub_env

    with reachable_hub_env():  # the FAKE engine serves made-up repo ids
        asyncio.run(main())
