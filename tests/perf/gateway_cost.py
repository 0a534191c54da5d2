"""Where a gateway's CPU goes: per request, per relayed token, and while idle.

    .venv/bin/python tests/perf/gateway_cost.py [--repeat 3] [--baseline NAME=DIR ...]

The same paced upstream as ``gateway_bench.py --paced`` (one token every 20 ms per stream), 64
concurrent streams, through each gateway: the real daemon (``traylm``, and ``traylm@NAME`` for
another checkout), the bare aiohttp relay on asyncio's loop (``bare``) and the same relay on
uvloop (``bare-uvloop``, the loop traylm runs on). For each, the gateway process's own CPU
seconds (user + system) are read around a run of 1-token requests and a run of 64-token
requests: the first gives the cost of a request, the difference the cost of each further token,
without a profiler in the way. Then the daemon's CPU while nothing is asked of it (its own
watchers and timers), which a per-token figure at low load also carries. Targets are measured
interleaved and the whole set repeated; the figures are the repeats, lowest first. No
assertions: it prints figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from engines.core.procs import free_loopback_port  # noqa: E402
from tests.perf import gateway_bench as gb  # noqa: E402

STREAMS = 64
RUNS = ((1, 1280), (64, 320))  # (tokens per request, requests)
UVLOOP_RELAY = gb.BARE_RELAY.replace(
    "web.run_app(app,", "import uvloop; web.run_app(app, loop=uvloop.new_event_loop(),"
)


def cpu_s(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


async def start_relay(
    script: str, upstream: str, procs: list[subprocess.Popen[bytes]]
) -> tuple[str, int]:
    port = free_loopback_port()
    proc = subprocess.Popen([sys.executable, "-c", script, str(port), upstream])
    procs.append(proc)
    await gb.wait_http(f"http://127.0.0.1:{port}/v1/chat/completions")
    return f"http://127.0.0.1:{port}", proc.pid


async def idle_cpu_ms_per_s(pid: int, seconds: float) -> float:
    before, started = cpu_s(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (cpu_s(pid) - before) / (time.monotonic() - started) * 1000


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline", action="append", default=[], metavar="[NAME=]DIR")
    args = ap.parse_args()
    procs: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        gb.offline_hub(stack)
        try:
            picked = argparse.Namespace(targets=["traylm", "bare"], baseline=args.baseline)
            targets = await gb.start_targets(picked, home, gb.PACED_ARGS, procs)
            upstream = targets.pop("direct")[0]
            targets["bare-uvloop"] = await start_relay(UVLOOP_RELAY, upstream, procs)
            daemons = {n: pid for n, (_, pid) in targets.items() if n.startswith("traylm")}
            await asyncio.sleep(3)  # the daemons' start-up work is done
            idle = {n: await idle_cpu_ms_per_s(pid, 10) for n, pid in daemons.items()}
            per: dict[tuple[str, int], list[float]] = {}
            for _ in range(args.repeat):
                for name, (url, pid) in targets.items():
                    for tokens, requests in RUNS:
                        before = cpu_s(pid)
                        await gb.load(url, "bench", STREAMS, requests, tokens, name)
                        per.setdefault((name, tokens), []).append((cpu_s(pid) - before) / requests)
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
    print(f"\nGateway CPU, paced upstream, {STREAMS} streams ({args.repeat} repeats, lowest first)")
    print(
        f"{'target':<18} {'µs per 1-token request':<26} {'µs per 64-token request':<26} µs per further token"
    )
    for name in targets:
        one = sorted(per[(name, 1)])
        full = sorted(per[(name, 64)])
        token = sorted((b - a) / 63 for a, b in zip(one, full, strict=True))
        print(
            f"{name:<18} {' '.join(f'{x * 1e6:.0f}' for x in one):<26} "
            f"{' '.join(f'{x * 1e6:.0f}' for x in full):<26} "
            f"{' '.join(f'{x * 1e6:.1f}' for x in token)}"
        )
    for name, ms in idle.items():
        print(f"{name}: {ms:.1f} ms of CPU per second while idle (one ready engine)")


if __name__ == "__main__":
    from tests.fakes.hub_endpoint import reachable_hub_env

    with reachable_hub_env():  # the FAKE engine serves made-up repo ids
        asyncio.run(main())
