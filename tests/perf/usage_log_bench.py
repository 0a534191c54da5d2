"""What the usage log costs the gateway: requests/s through the real daemon to the FAKE engine
with the usage log on (every request becomes a row in SQLite, written in batches from a thread)
and off. Prints both figures, their ratio and the rows written. Not a test: run it by hand.

    .venv/bin/python tests/perf/usage_log_bench.py [--requests 2000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


async def run(requests: int, concurrency: int, usage_on: bool) -> tuple[float, int]:
    from engines.client import DaemonClient
    from engines.config.sections import Paths
    from engines.config.tomlfile import write_toml_atomic
    from engines.core.procs import free_loopback_port
    from engines.daemon import Daemon
    from engines.events import EngineState
    from tests.conftest import fast_settings
    from tests.fakes.fake_vllm_env import make_fake_vllm_env

    with tempfile.TemporaryDirectory() as home:
        os.environ["TRAYLM_HOME"] = home
        os.environ["TRAYLM_ENVS_DIR"] = str(Path(home) / "envs")
        paths = Paths.from_env()
        make_fake_vllm_env(paths.envs_dir)
        port = free_loopback_port()
        daemon = Daemon(paths, fast_settings(port, max_concurrent=1024))
        ready = asyncio.Event()
        task = asyncio.create_task(daemon.run(ready=ready, install_signal_handlers=False))
        await ready.wait()
        if not usage_on:
            assert daemon.ctx is not None
            daemon.ctx.usage = None
        client = await DaemonClient.connect(paths)
        write_toml_atomic(
            paths.profiles_dir / "fake.toml",
            {"model": "org/fake", "served_name": "fake", "device": "cpu"},
        )
        await client.start("fake")
        await client.wait_for_engine("fake", (EngineState.READY,), 30)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(requests):
            queue.put_nowait(i)
        async with aiohttp.ClientSession() as http:

            async def worker() -> None:
                while not queue.empty():
                    queue.get_nowait()
                    async with http.post(url, json=body) as r:
                        await r.read()
                        assert r.status == 200

            started = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - started
        await asyncio.sleep(1.5)  # let the usage log flush
        rows = daemon.store.query("SELECT COUNT(*) AS n FROM usage")[0]["n"]
        await client.close()
        daemon.request_stop("bench done")
        await task
        return requests / elapsed, int(rows)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--concurrency", type=int, default=32)
    a = p.parse_args()
    off, _ = asyncio.run(run(a.requests, a.concurrency, usage_on=False))
    on, rows = asyncio.run(run(a.requests, a.concurrency, usage_on=True))
    print(f"requests={a.requests} concurrency={a.concurrency}")
    print(f"usage log off: {off:8.1f} req/s")
    print(f"usage log on:  {on:8.1f} req/s  ({rows} rows written)")
    print(f"ratio on/off:  {on / off:.3f}")


if __name__ == "__main__":
    from tests.fakes.hub_endpoint import reachable_hub_env

    with reachable_hub_env():  # the FAKE engine serves made-up repo ids
        main()
