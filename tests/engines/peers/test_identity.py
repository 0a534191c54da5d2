"""Pairing's files and the checks made before any other box is involved: a real in-process
daemon on loopback (the peer listener on 127.0.0.1 and a free port)."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
import yarl

from engines.config.sections import Paths, PeersSettings
from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from tests.conftest import DaemonFactory, fast_settings

ROOT = Path(__file__).resolve().parents[3]


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


MAKE = """
import sys, time
from pathlib import Path
from engines.peers import tls
folder, go = Path(sys.argv[1]), Path(sys.argv[2])
print("waiting", flush=True)
while not go.exists():
    time.sleep(0.001)
own = tls.load_or_create(folder, "twin")
tls.server_context(own, [])  # refuses a key that is not the certificate's
print(own.fingerprint, flush=True)
"""


def test_two_processes_making_one_identity_at_once_get_one_that_works(tmp_path: Path) -> None:
    """Made at the same moment by two processes, the key of one beside the certificate of the
    other would fail every TLS listener (KEY_VALUES_MISMATCH: 13 of 30 pairs before the lock)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for trial in range(3):
        folder, go = tmp_path / f"identity{trial}", tmp_path / f"go{trial}"
        twins = [
            subprocess.Popen(
                [sys.executable, "-c", MAKE, str(folder), str(go)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for _ in range(2)
        ]
        assert all(t.stdout is not None and t.stdout.readline() == "waiting\n" for t in twins)
        go.touch()  # both start making it now
        outs = [t.communicate(timeout=60)[0] for t in twins]
        assert [t.returncode for t in twins] == [0, 0], outs
        assert outs[0] == outs[1]  # one identity, and both use it
