"""LAN sharing with a real peer on another (virtual) computer: the daemon runs in a network
namespace of its own, the peer in a second one, joined by a veth pair with addresses from a
private test range that exist only inside these two namespaces. Nothing is sent to any other
host, and the daemon's 0.0.0.0 is the namespace's, never this machine's.

LAN sharing follows the setting live (the socket moves), `status` reports the sockets actually
bound, and without LAN sharing a peer from another computer is refused whatever the bind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.gateway.security import hash_key

pytestmark = pytest.mark.slow
PORT = 8000  # the daemon's namespace has a port space of its own
PEER_SCRIPT = """
import sys, urllib.error, urllib.request
url, key, host = sys.argv[1:4]
headers = {"Host": host, **({"Authorization": "Bearer " + key} if key else {})}
request = urllib.request.Request(url, headers=headers)
try:
    with urllib.request.urlopen(request, timeout=10) as r:
        print(r.status, r.read().decode()[:300])
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode()[:300], f"[x-should-retry: {e.headers.get('x-should-retry')}]")
except urllib.error.URLError as e:
    print("refused" if isinstance(e.reason, ConnectionRefusedError) else f"error {e.reason}")
"""


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@dataclass
class Namespaces:
    daemon_ns: str
    peer_ns: str
    daemon_ip: str


@pytest.fixture
def namespaces() -> Iterator[Namespaces]:
    tag = f"{os.getpid() % 100000}"
    daemon_ns, peer_ns = f"tlm-d-{tag}", f"tlm-p-{tag}"
    subnet = f"10.213.{os.getpid() % 250}"
    try:
        ip("netns", "add", daemon_ns)
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        pytest.skip(f"network namespaces are not permitted here (`ip netns add`: {detail})")
    try:
        ip("netns", "add", peer_ns)
        ip("link", "add", f"tlmd{tag}", "type", "veth", "peer", "name", f"tlmp{tag}")
        ip("link", "set", f"tlmd{tag}", "netns", daemon_ns)
        ip("link", "set", f"tlmp{tag}", "netns", peer_ns)
        for ns, dev, host in ((daemon_ns, f"tlmd{tag}", 1), (peer_ns, f"tlmp{tag}", 2)):
            ip("-n", ns, "addr", "add", f"{subnet}.{host}/30", "dev", dev)
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield Namespaces(daemon_ns, peer_ns, f"{subnet}.1")
    finally:
        for ns in (peer_ns, daemon_ns):  # deleting a namespace deletes its end of the veth
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


@dataclass
class LanDaemon:
    ns: Namespaces
    env: dict[str, str]
    proc: subprocess.Popen[bytes]

    def traylm(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.ns.daemon_ns, sys.executable, "-m", "engines", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def status(self) -> dict[str, object]:
        out = self.traylm("status", "--json")
        assert out.returncode == 0, out.stderr
        return dict(json.loads(out.stdout))

    def from_peer(self, path: str, key: str = "", host: str = f"localhost:{PORT}") -> str:
        """A request from the other computer, by default with a forged ``Host: localhost``
        (the Host check guards browsers against DNS rebinding, not a LAN peer)."""
        url = f"http://{self.ns.daemon_ip}:{PORT}{path}"
        peer = ["ip", "netns", "exec", self.ns.peer_ns, sys.executable, "-c", PEER_SCRIPT]
        out = subprocess.run(
            [*peer, url, key, host],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def from_here(self, path: str) -> str:
        """A request from the daemon's own computer (loopback), without a key."""
        url = f"http://127.0.0.1:{PORT}{path}"
        here = ["ip", "netns", "exec", self.ns.daemon_ns, sys.executable, "-c", PEER_SCRIPT]
        out = subprocess.run(
            [*here, url, "", f"127.0.0.1:{PORT}"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    def wait_bound(self, address: str) -> None:
        wait_for(lambda: self.status().get("bound") == [address], f"listening on {address}")


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def lan_daemon(
    namespaces: Namespaces, tmp_path: Path
) -> Iterator[Callable[[dict[str, object]], LanDaemon]]:
    started: list[LanDaemon] = []

    def start(gateway: dict[str, object]) -> LanDaemon:
        env = {**os.environ, "TRAYLM_HOME": str(tmp_path / "home")}
        paths = Paths.from_env(env)
        write_toml_atomic(paths.config_file, {"gateway": gateway})
        with (tmp_path / "serve.log").open("wb") as log:  # the child keeps its own copy
            in_ns = ["ip", "netns", "exec", namespaces.daemon_ns, sys.executable]
            proc = subprocess.Popen(
                [*in_ns, "-m", "engines", "serve", "--port", str(PORT)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
        d = LanDaemon(namespaces, env, proc)
        started.append(d)
        wait_for(lambda: paths.daemon_json.exists() or proc.poll() is not None, "daemon.json")
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        return d

    yield start
    for d in started:
        d.proc.terminate()
        d.proc.wait(30)


def test_lan_sharing_follows_the_setting_live(
    lan_daemon: Callable[[dict[str, object]], LanDaemon],
) -> None:
    key = "tlm-test-key-one"
    d = lan_daemon({"lan_sharing": True, "api_key_sha256": [hash_key(key)]})
    assert d.from_peer("/v1/models", key).startswith("200 ")
    assert d.from_peer("/v1/models", key, host=f"{d.ns.daemon_ip}:{PORT}").startswith("200 ")
    assert d.from_peer("/v1/models").startswith("401 ")

    off = d.traylm("config", "set", "gateway.lan_sharing", "false")
    assert "applied to the running daemon" in off.stdout, off.stderr
    wait_for(lambda: d.from_peer("/v1/models", key) == "refused", "the peer to be refused")
    assert d.status().get("bound") == [f"127.0.0.1:{PORT}"]
    status = d.status()
    assert status["lan_sharing"] is False and status["bind_host"] == "127.0.0.1"
    removed = d.traylm("keys", "remove", hash_key(key)[:8])  # the last key may go now
    assert removed.returncode == 0, removed.stderr
    assert d.from_peer("/v1/models") == "refused"
    assert "this computer only, no API key" in d.traylm("status").stdout

    added = d.traylm("keys", "add")
    new_key = added.stdout.splitlines()[1]
    on = d.traylm("config", "set", "gateway.lan_sharing", "true")
    assert "applied to the running daemon" in on.stdout, on.stderr
    d.wait_bound(f"0.0.0.0:{PORT}")
    assert d.from_peer("/v1/models", new_key).startswith("200 ")
    assert d.from_peer("/api/status").startswith("401 ")  # the control API is never shared


def test_without_lan_sharing_another_computer_is_refused_whatever_the_bind(
    lan_daemon: Callable[[dict[str, object]], LanDaemon],
) -> None:
    d = lan_daemon({"host": "0.0.0.0"})  # bound to every address, but LAN sharing off
    answer = d.from_peer("/v1/models")
    assert answer.startswith("403 ") and "serves only this computer" in answer, answer
    assert "[x-should-retry: false]" in answer  # a client retrying would only be refused again
    assert d.from_peer("/health").startswith("403 ")
    assert d.status().get("bound") == [f"0.0.0.0:{PORT}"]
    local = d.traylm("status")
    assert local.returncode == 0 and "this computer only" in local.stdout


def test_keys_for_lan_clients_only(lan_daemon: Callable[[dict[str, object]], LanDaemon]) -> None:
    """gateway.keys_for = "lan": the other computer needs the key, this one does not."""
    key = "tlm-test-key-lan"
    d = lan_daemon({"lan_sharing": True, "api_key_sha256": [hash_key(key)], "keys_for": "lan"})
    assert d.from_peer("/v1/models").startswith("401 ")
    assert d.from_peer("/v1/models", key).startswith("200 ")
    assert d.from_here("/v1/models").startswith("200 ")
    d.traylm("config", "set", "gateway.keys_for", "all")
    wait_for(lambda: d.from_here("/v1/models").startswith("401 "), "this computer to need it")
