"""Real-GPU check (needs two NVIDIA GPUs, the CUDA vLLM env and a running `traylm serve`): two
replicas of one model, one per card, against one copy. NOT RUN on the project's CI machine (no
GPU there): the one-copy-per-card placement is verified only on simulated GPUs until someone
runs this.

    python tests/gpu/replicas_two_gpus.py PROFILE [--streams 16] [--tokens 256]

PROFILE is a vLLM profile on CUDA whose model fits one card (gpus = "auto"). The script:
1. loads it with one replica and times ``--streams`` concurrent streams (output tokens/s);
2. unloads it, loads it with ``--replicas 2``, checks the two engines are on different GPUs
   (`traylm ps`), and times the same streams, counting which replica served each
   (X-Traylm-Engine);
3. prints both figures and their ratio. Exit status 1 when the replicas share a card or one
   of them served nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from engines.config.profiles import replica_base
from engines.config.sections import Paths


def control() -> tuple[str, dict[str, str]]:
    info = json.loads(Paths.from_env().daemon_json.read_text())
    return info["url"], {"Authorization": f"Bearer {info['token']}"}


def load(url: str, headers: dict[str, str], profile: str, replicas: int) -> list[dict[str, Any]]:
    httpx.delete(f"{url}/api/loaded", params={"model": profile}, headers=headers, timeout=120)
    body = {"model": profile, "replicas": replicas}
    r = httpx.post(f"{url}/api/loaded", json=body, headers=headers, timeout=120)
    if r.status_code >= 400:
        raise SystemExit(f"load failed: {r.text}")
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline:
        rows = httpx.get(f"{url}/api/loaded", headers=headers, timeout=10).json()
        mine = [row for row in rows if replica_base(str(row["engine_id"])) == profile]
        if len(mine) == replicas and all(row["state"] == "ready" for row in mine):
            return mine
        time.sleep(1)
    raise SystemExit("not ready in 30 minutes")


async def streams(url: str, model: str, count: int, tokens: int) -> tuple[float, Counter[str]]:
    served: Counter[str] = Counter()

    async def one(client: httpx.AsyncClient, i: int) -> int:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Write a long story, number {i}."}],
            "max_tokens": tokens,
            "stream": True,
            "ignore_eos": True,
        }
        got = 0
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            served[r.headers.get("X-Traylm-Engine", "?")] += 1
            async for line in r.aiter_lines():
                got += line.startswith("data: {") and '"content"' in line
        return got

    async with httpx.AsyncClient(timeout=1800) as client:
        started = time.perf_counter()
        total = sum(await asyncio.gather(*(one(client, i) for i in range(count))))
    return total / (time.perf_counter() - started), served


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("profile")
    p.add_argument("--streams", type=int, default=16)
    p.add_argument("--tokens", type=int, default=256)
    args = p.parse_args()
    url, headers = control()
    one = load(url, headers, args.profile, 1)
    model = str(one[0]["name"])
    single, _ = asyncio.run(streams(url, model, args.streams, args.tokens))
    two = load(url, headers, args.profile, 2)
    cards = [str(row["gpus"]) for row in two]
    print(f"replicas on GPUs {cards}")
    double, served = asyncio.run(streams(url, model, args.streams, args.tokens))
    print(f"one copy: {single:.0f} tokens/s; two replicas: {double:.0f} tokens/s")
    print(f"ratio two/one: {double / single:.2f}; served per replica: {dict(served)}")
    if len(set(cards)) != 2 or len(served) != 2:
        print("FAIL: the replicas share a card or one served nothing")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
