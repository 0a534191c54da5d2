"""Flight-recorder overhead: the same paced streams through two real daemons, one recording
every request in full (``requests.capture = "full"``, the default for this computer's clients)
and one with the recorder off, in one run, interleaved, at 64 and 256 concurrent streams.

    .venv/bin/python tests/perf/recorder_bench.py [--levels 64,256] [--repeat 3] [--tokens 64]

Each daemon serves its own FAKE engine (tests/fakes/openai_engine.py) streaming one token every
20 ms per stream (tests/perf/gateway_bench.py's paced upstream): every event crosses the gateway
and the recorder's reply capture on its own. Figures per level: output tokens/s of each and the
ratio full/off, TTFT p50/p99 and the TTFT full capture adds, each daemon's CPU per 1k tokens and
peak RSS, and the requests the full daemon recorded. The issue's bar: ≥ 0.98× the tokens/s and
≤ +0.3 ms TTFT. No assertions: it prints figures (they move with the machine's load).
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
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.fakes.hub_endpoint import ReachableEndpoint  # noqa: E402
from tests.perf.gateway_bench import PACED_ARGS, Result, measure, start_traylm  # noqa: E402


def recorded_count(home: Path) -> int:
    info = json.loads((home / "state" / "daemon.json").read_text())
    req = urllib.request.Request(
        f"{info['url']}/api/status", headers={"Authorization": f"Bearer {info['token']}"}
    )
    with urllib.request.urlopen(req) as r:
        status = json.load(r)["requests"]
    return int(status["written"]) + int(status["pending"])


async def start(home: Path, capture: str) -> tuple[subprocess.Popen[bytes], int]:
    (home / "config").mkdir(parents=True)
    (home / "config" / "config.toml").write_text(f'[requests]\ncapture = "{capture}"\n')
    return await start_traylm(home, PACED_ARGS)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--levels", default="64,256")
    ap.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    ap.add_argument("--rounds", type=int, default=2, help="requests per stream slot")
    ap.add_argument("--repeat", type=int, default=1)
    return ap.parse_args()


async def main() -> None:
    args = parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    procs: list[subprocess.Popen[bytes]] = []
    results: list[Result] = []
    with contextlib.ExitStack() as stack:
        home = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        hub = ReachableEndpoint().start()  # "org/bench" is no real repo: the start goes on
        stack.callback(hub.stop)
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            full, full_port = await start(home / "full", "full")
            procs.append(full)
            off, off_port = await start(home / "off", "off")
            procs.append(off)
            targets = {
                "full": (f"http://127.0.0.1:{full_port}", full.pid),
                "off": (f"http://127.0.0.1:{off_port}", off.pid),
            }
            for repeat in range(args.repeat):
                order = list(targets.items())
                if repeat % 2:
                    order.reverse()
                for level in levels:
                    requests = level * args.rounds
                    for name, (url, pid) in order:
                        results.append(
                            await measure(url, pid, name, level, requests, args.tokens, repeat)
                        )
            recorded = recorded_count(home / "full")
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(30)
    report(results, args, recorded)


def report(results: list[Result], args: argparse.Namespace, recorded: int) -> None:
    print(
        f"\nRecorder overhead: {args.tokens} tokens per stream, one every 20 ms; "
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs"
    )
    head = (
        f"{'rep':>3} {'conc':>5} {'capture':<8} {'tok/s':>9} {'ratio':>6} {'TTFT p50':>9} "
        f"{'p99':>8} {'+p50':>8} {'+p99':>8} {'cpu s/1k tok':>12} {'RSS MB':>7} {'err':>4}"
    )
    print(head)
    print("-" * len(head))
    runs: dict[tuple[int, int], dict[str, Result]] = {}
    for r in results:
        runs.setdefault((r.repeat, r.concurrency), {})[r.name] = r
    ratios: dict[int, list[tuple[float, float]]] = {}
    for (repeat, level), rs in sorted(runs.items()):
        off = rs["off"]
        for name in ("off", "full"):
            r = rs[name]
            ratio = r.tokens_per_s / off.tokens_per_s
            add50 = (r.ttft(50) - off.ttft(50)) * 1000
            add99 = (r.ttft(99) - off.ttft(99)) * 1000
            cpu = f"{r.cpu_s / r.tokens * 1000:.3f}" if r.cpu_s is not None else "-"
            print(
                f"{repeat:>3} {level:>5} {name:<8} {r.tokens_per_s:>9.0f} {ratio:>6.3f} "
                f"{r.ttft(50) * 1000:>7.2f}ms {r.ttft(99) * 1000:>6.1f}ms {add50:>6.2f}ms "
                f"{add99:>6.2f}ms {cpu:>12} {r.rss_mb or 0:>7.0f} {r.errors:>4}"
            )
            if name == "full":
                ratios.setdefault(level, []).append((ratio, add50))
    print("\nfull capture vs off, median over repeats: tokens/s ratio | TTFT p50 added")
    for level, pairs in sorted(ratios.items()):
        ratio = statistics.median(p[0] for p in pairs)
        added = statistics.median(p[1] for p in pairs)
        print(f"  {level:>4} streams: {ratio:.3f}x | {added:+.2f} ms")
    print(f"requests recorded by the full-capture daemon: {recorded}")


if __name__ == "__main__":
    asyncio.run(main())
