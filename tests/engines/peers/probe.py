"""Run in a box's namespace: ask a peer listener's /peer/hello as a box that may not be paired
(with this box's own certificate, or with none), and print what came back as one JSON line.

python -m tests.engines.peers.probe URL (cert|none) [JSON]   (with JSON: POSTed as the body)"""

from __future__ import annotations

import asyncio
import json
import sys

import aiohttp

from engines.config.sections import Paths
from engines.peers import tls


async def main(url: str, mode: str, body: str | None = None) -> None:
    identity = tls.load_or_create(Paths.from_env().data_dir / "peers" / "identity", "probe")
    ctx = tls.client_context(identity if mode == "cert" else None, None)
    method, data = ("POST", json.loads(body)) if body is not None else ("GET", None)
    try:
        async with (
            aiohttp.ClientSession() as http,
            http.request(method, url, ssl=ctx, json=data) as resp,
        ):
            print(json.dumps({"status": resp.status, "body": await resp.text()}))
    except (aiohttp.ClientError, OSError) as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
