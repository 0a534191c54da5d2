"""``POST /peer/pair`` on the listener's own application (routes.peer_app, served for real over
HTTP here; the listener adds TLS): with no code that could match, the refusal comes before the
body is read, so an unpaired stranger cannot make this box parse what it sends; with a code
shown, the proof is checked before the rest of the body."""

from __future__ import annotations

from pathlib import Path

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from engines.config.live import LiveSettings
from engines.config.sections import PeersSettings, Settings
from engines.core.procs import free_loopback_port
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


async def test_a_wrong_code_is_refused_before_the_rest_of_the_body_is_read(
    tmp_path: Path,
) -> None:
    """With a code shown, a request whose proof does not match is a wrong code (a try spent),
    whatever else it holds: its protocol, name, port and certificate are never read."""
    peers = PeersSettings(host="127.0.0.1", port=free_loopback_port())
    live = LiveSettings(Settings(peers=peers), config_file=tmp_path / "config.toml")
    feature = PeersFeature(settings=live, folder=tmp_path / "peers", peer_app=peer_app)
    server = TestServer(peer_app(feature), host="127.0.0.1")
    await server.start_server()
    try:
        await feature.start()
        await feature.begin_pairing()
        bodies = [
            {"protocol": "nope", "name": "../x" * 1000, "port": -1, "cert": "not a cert"},
            {"protocol": 7, "cert": feature.identity.cert_pem, "nonce": "n", "proof": "0" * 64},
        ]
        answers = []
        async with ClientSession() as session:
            for body in bodies:
                async with session.post(server.make_url("/peer/pair"), json=body) as resp:
                    answers.append((resp.status, (await resp.json())["error"]))
        assert [(s, e["code"]) for s, e in answers] == [(403, "pairing_refused")] * 2, answers
        assert "the pairing code is wrong (2 tries left)" in answers[0][1]["message"]
        assert "1 tries left" in answers[1][1]["message"]
    finally:
        await feature.stop()
        await server.close()
