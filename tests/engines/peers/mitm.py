"""A HOSTILE relay for the pairing tests (a stand-in for a machine between two boxes): it
terminates the joining box's TLS with a certificate of its own, passes the pairing request on
to the real box unchanged, and passes the answer back. Run in the box's namespace:

python -m tests.engines.peers.mitm FOLDER LISTEN_PORT TARGET_URL

TARGET_URL "-": it passes nothing on and answers every pairing as if it succeeded, with a
made-up proof (a box that pretends to know the code). It prints "ready" once it listens, then
serves until killed."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp
from aiohttp import web

from engines.peers import tls


async def main(folder: Path, port: int, target: str) -> None:
    own = tls.load_or_create(folder, "in the middle")

    async def relay(request: web.Request) -> web.Response:
        body = await request.read()
        if target == "-":
            return web.json_response({"name": "box-in-the-middle", "proof": "0" * 64})
        ctx = tls.client_context(None, None)
        headers = {"Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(f"{target}/peer/pair", data=body, ssl=ctx, headers=headers) as resp,
        ):
            return web.Response(status=resp.status, body=await resp.read(), headers=headers)

    app = web.Application()
    app.router.add_post("/peer/pair", relay)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port, ssl_context=tls.server_context(own, [])).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]))
