"""Pairing's files and the checks made before any other box is involved: a real in-process
daemon on loopback (the peer listener on 127.0.0.1 and a free port)."""

from __future__ import annotations

import dataclasses
import stat

import aiohttp
import pytest
import yarl

from engines.config.sections import Paths, PeersSettings
from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from tests.conftest import DaemonFactory, fast_settings


def _settings(**peers: object) -> object:
    fields = {"host": "127.0.0.1", "port": free_loopback_port(), **peers}
    return dataclasses.replace(
        fast_settings(free_loopback_port()),
        peers=PeersSettings(**fields),  # type: ignore[arg-type]
    )


def _mode(path: object) -> int:
    return stat.S_IMODE(path.stat().st_mode)  # type: ignore[attr-defined]


async def test_a_damaged_peers_file_is_set_aside_and_the_daemon_serves(
    paths: Paths, daemon_factory: DaemonFactory
) -> None:
    peers_file = paths.data_dir / "peers" / "peers.json"
    peers_file.parent.mkdir(parents=True)
    peers_file.write_text("{not json")
    running = await daemon_factory(_settings())
    view = await running.client.peers()
    assert view.peers == () and view.listening == ""
    assert not peers_file.exists()
    assert (peers_file.parent / "peers.json.damaged").read_text() == "{not json"


async def test_the_identity_is_private_and_a_box_cannot_pair_with_itself(
    paths: Paths, daemon_factory: DaemonFactory
) -> None:
    running = await daemon_factory(_settings(name="box-a"))
    identity = paths.data_dir / "peers" / "identity"
    assert _mode(identity / "key.pem") == 0o600
    view = await running.client.peers()
    assert view.name == "box-a" and view.listening == ""

    code = await running.client.begin_pairing()
    port = running.daemon.settings.peers.port
    assert view.fingerprint == code.fingerprint
    assert code.qr.endswith(
        f"/{code.code.replace('-', '')}?fp=" + code.fingerprint.replace("-", "").lower()
    )
    assert (await running.client.peers()).listening == f"127.0.0.1:{port}"
    with pytest.raises(ControlAPIError, match="a box cannot pair with itself"):
        await running.client.join_peer(f"127.0.0.1:{port}", code.code)
    assert (await running.client.peers()).peers == ()

    state = await running.client.cancel_pairing()
    assert not state.active and state.outcome == "the code was cancelled"
    assert (await running.client.peers()).listening == ""


async def test_a_box_name_other_boxes_cannot_keep_is_refused_before_pairing(
    daemon_factory: DaemonFactory,
) -> None:
    running = await daemon_factory(_settings(name="my box"))
    with pytest.raises(ControlAPIError, match=r"'my box' \(peers.name\) is not a valid box name"):
        await running.client.begin_pairing()
    assert (await running.client.peers()).listening == ""


async def test_unpair_names_what_it_cannot_find(daemon_factory: DaemonFactory) -> None:
    running = await daemon_factory(_settings())
    with pytest.raises(ControlAPIError, match="no paired box is named 'ghost'; `traylm peers`"):
        await running.client.unpair("ghost")
    with pytest.raises(ControlAPIError, match="is not a valid box name"):
        await running.client.unpair("../shutdown#")
    headers = {"Authorization": f"Bearer {running.client.info.token}"}
    async with (  # as curl may send it
        aiohttp.ClientSession(headers=headers) as http,
        http.delete(yarl.URL(f"{running.url}/api/peers/x%3Fy", encoded=True)) as resp,
    ):
        assert resp.status == 400
        assert "is not a valid box name" in (await resp.json())["error"]["message"]
