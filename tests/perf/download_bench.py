"""Download benchmark: traylm's pull (daemon + worker process + verification) against
``hf download`` (the huggingface_hub CLI), from the same FAKE Hub on loopback, in one run.

    .venv/bin/python tests/perf/download_bench.py [--size-gib 3] [--rounds 2]

The repo holds one multi-GB safetensors file generated on the fly by the server (nothing big is
stored but the downloaded copies, deleted after each run) plus small config files. Printed:
wall time and throughput of each tool, the ratio (traylm / hf, target >= 0.95) for the download
phase and end to end (traylm also hashes every byte before calling the model ready; hf does
not), and the peak RSS of traylm's worker process sampled every 0.1 s during the big file
(it should stay flat, far below the file size). Figures only: nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.client import DaemonClient
from engines.config.sections import HubSettings, Paths
from engines.core.procs import free_loopback_port
from engines.daemon import Daemon
from engines.events import DownloadState, DownloadStateChanged
from engines.hub import attempt
from tests.conftest import fast_settings
from tests.fakes.hub_server import FakeHub, FakeRepo, bytes_file, safetensors_file

REPO = "bench/big-model"
MIB = 1 << 20


def make_repo(size_bytes: int) -> FakeRepo:
    rows = size_bytes // (2 * 4096)
    files = {
        "model.safetensors": safetensors_file(
            "model.safetensors", {"w": ("BF16", (rows, 4096))}, seed=7
        ),
        "config.json": bytes_file(
            "config.json",
            b'{"architectures": ["LlamaForCausalLM"], "model_type": "llama",'
            b' "num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 32}',
        ),
        "tokenizer.json": bytes_file("tokenizer.json", b'{"version": "1.0"}'),
        "generation_config.json": bytes_file("generation_config.json", b"{}"),
    }
    return FakeRepo(REPO, files)


class RSSSampler:
    """Peak and per-second RSS of a process (and its children) while it runs."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, int]] = []
        self.pid: int | None = None

    async def run(self, stop: asyncio.Event) -> None:
        began = time.monotonic()
        while not stop.is_set():
            if self.pid:
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    proc = psutil.Process(self.pid)
                    rss = proc.memory_info().rss + sum(
                        c.memory_info().rss for c in proc.children(recursive=True)
                    )
                    self.samples.append((time.monotonic() - began, rss))
            await asyncio.sleep(0.1)

    @property
    def peak(self) -> int:
        return max((r for _, r in self.samples), default=0)

    def profile(self) -> str:
        if not self.samples:
            return "no samples"
        n = len(self.samples)
        picks = [self.samples[int(i * (n - 1) / 4)] for i in range(5)]
        return " ".join(f"{t:.1f}s:{r / MIB:.0f}MiB" for t, r in picks)


async def traylm_run(url: str, home: Path) -> dict[str, float]:
    os.environ["TRAYLM_HOME"] = str(home / "traylm")
    os.environ["HF_HOME"] = str(home / "hf")
    paths = Paths.from_env()
    settings = dataclasses.replace(
        fast_settings(free_loopback_port()),
        hub=HubSettings(min_free_gib=0.5, stall_timeout_s=120),
    )
    daemon = Daemon(paths, settings)
    ready = asyncio.Event()
    task = asyncio.create_task(daemon.run(ready=ready, install_signal_handlers=False))
    await ready.wait()
    client = await DaemonClient.connect(paths)
    sampler = RSSSampler()
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop))
    marks: dict[str, float] = {}
    done = asyncio.Event()

    async def watch() -> None:
        """Follow the download through the daemon's event stream, as the desktop app does."""
        async for event in client.events(kinds=("download",)):
            if isinstance(event, DownloadStateChanged):
                state = event.status.state
                if event.status.worker_pid:
                    sampler.pid = event.status.worker_pid
                marks.setdefault(state.value, time.monotonic())
                if state in (DownloadState.READY, DownloadState.FAILED):
                    marks["message"] = 0.0
                    done.set()
                    return

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.sleep(0.3)  # the event stream is open before the pull starts
        began = time.monotonic()
        status = await client.pull(REPO)
        await done.wait()
        end = time.monotonic()
        status = await client.download(status.id)
        if status.state != DownloadState.READY:
            raise SystemExit(f"traylm pull failed: {status.message}")
        verify_at = marks.get("verifying")
    finally:
        watcher.cancel()
        stop.set()
        await sampling
        await client.close()
        daemon.request_stop("bench")
        await task
    return {
        "download_s": (verify_at or end) - began,
        "total_s": end - began,
        "peak_rss": sampler.peak,
        "profile": sampler.profile(),  # type: ignore[dict-item]
    }


async def hf_run(url: str, home: Path) -> dict[str, float]:
    env = dict(os.environ, HF_ENDPOINT=url, HF_HOME=str(home / "hf"))
    env.pop("TRAYLM_HOME", None)
    hf = Path(sys.executable).with_name("hf")
    sampler = RSSSampler()
    stop = asyncio.Event()
    sampling = asyncio.create_task(sampler.run(stop))
    began = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        str(hf),
        "download",
        REPO,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
        env=env,
    )
    sampler.pid = proc.pid
    code = await proc.wait()
    end = time.monotonic()
    stop.set()
    await sampling
    if code != 0:
        raise SystemExit(f"hf download failed with exit {code}")
    return {"download_s": end - began, "total_s": end - began, "peak_rss": sampler.peak}


def serve(size: int) -> None:
    """The FAKE Hub in its own process, so it never shares a GIL with the daemon under test."""
    hub = FakeHub().start()
    hub.add_repo(make_repo(size))
    print(hub.url, flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
    hub.stop()


async def start_server(size: int) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--serve",
        str(size),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    url = (await proc.stdout.readline()).decode().strip()
    if not url.startswith("http"):
        raise SystemExit("the fake Hub did not start")
    return proc, url


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gib", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument(
        "--hash-while-downloading",
        choices=("auto", "on", "off"),
        default="auto",
        help="auto: what traylm does (on with 4 or more CPUs)",
    )
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve)
        return
    if args.hash_while_downloading != "auto":
        on = args.hash_while_downloading == "on"
        attempt.hash_while_downloading = lambda: on  # the daemon runs in this process
    print(
        f"{os.cpu_count()} CPUs; traylm hashes while downloading: "
        f"{attempt.hash_while_downloading()}"
    )
    size = int(args.size_gib * (1 << 30))
    print(f"generating a {size / (1 << 30):.2f} GiB safetensors file (hashing it once)...")
    server, url = await start_server(size)
    total_bytes = sum(f.size for f in make_repo(1 << 20).files.values()) - (1 << 20) + size
    os.environ["HF_ENDPOINT"] = url
    for name in ("HF_TOKEN", "HF_HUB_CACHE"):
        os.environ.pop(name, None)
    results: dict[str, list[dict[str, float]]] = {"traylm": [], "hf": []}
    try:
        for r in range(args.rounds):
            order = [("traylm", traylm_run), ("hf", hf_run)]
            for tool, run in order if r % 2 == 0 else order[::-1]:  # alternate who goes first
                home = Path(tempfile.mkdtemp(prefix=f"dlbench-{tool}-"))
                try:
                    res = await run(url, home)
                finally:
                    shutil.rmtree(home, ignore_errors=True)
                results[tool].append(res)
                rate = total_bytes / res["download_s"] / MIB
                print(
                    f"round {r + 1} {tool:<6} download {res['download_s']:6.2f} s "
                    f"({rate:7.1f} MiB/s)  total {res['total_s']:6.2f} s  "
                    f"peak RSS {res['peak_rss'] / MIB:6.0f} MiB"
                )
                if tool == "traylm":
                    print(f"       worker RSS over time: {res['profile']}")
    finally:
        assert server.stdin is not None
        server.stdin.close()
        await server.wait()
    report(results, total_bytes, args.rounds)


def report(results: dict[str, list[dict[str, float]]], total_bytes: int, rounds: int) -> None:
    med = {
        tool: {k: statistics.median(x[k] for x in runs) for k in ("download_s", "total_s")}
        for tool, runs in results.items()
    }
    peak = max(x["peak_rss"] for x in results["traylm"])
    print()
    print(f"file: {total_bytes / (1 << 30):.2f} GiB; medians over {rounds} round(s)")
    print(
        f"throughput ratio traylm/hf, download phase: "
        f"{med['hf']['download_s'] / med['traylm']['download_s']:.3f} (target >= 0.95)"
    )
    print(
        f"throughput ratio traylm/hf, end to end incl. sha256 verification: "
        f"{med['hf']['total_s'] / med['traylm']['total_s']:.3f}"
    )
    print(
        f"traylm worker peak RSS: {peak / MIB:.0f} MiB for a {total_bytes / MIB:.0f} MiB file "
        f"(hf download: {max(x['peak_rss'] for x in results['hf']) / MIB:.0f} MiB)"
    )


if __name__ == "__main__":
    asyncio.run(main())
