"""``POST /peer/pair`` on the listener's own application (routes.peer_app, served for real over
HTTP here; the listener adds TLS): with no code that could match, the refusal comes before the
body is read, so an unpaired stranger cannot make this box parse what it sends."""

from __future__ import annotations

from pathlib import Path

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from engines.config.live import LiveSettings
from engines.config.sections import Settings
from engines.peers.routes import peer_app
from engines.peers.service import PeersFeature


async def test_no_pairing_in_progress_refuses_before_reading_the_body(tmp_path: Path) -> None:
    live = LiveSettings(Settings(), config_file=tmp_path / "config.toml")
    feature = PeersFeature(settings=live, folder=tmp_path / "peers", peer_app=peer_app)
    server = TestServer(peer_app(feature), host="127.0.0.1")
    await server.start_server()
    try:
        async with (
            ClientSession() as session,
            session.post(
                server.make_url("/peer/pair"),
                data=b"{not json at all",
                headers={"Content-Type": "application/json"},
            ) as resp,
        ):
            body = await resp.json()
        assert resp.status == 403, body
        assert body["error"]["code"] == "pairing_refused"
        assert "no pairing is in progress" in body["error"]["message"]
    finally:
        await server.close()
