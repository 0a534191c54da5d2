"""The flight recorder with a real LAN peer (tests/engines/gateway/test_lan.py's two network
namespaces): a peer's request is recorded as "lan" with its address and the API key's
fingerprint (never the key), and by default without its body (``requests.capture_lan =
"metadata"``), while this computer's requests keep theirs (``requests.capture = "full"``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import pytest

from engines.gateway.security import hash_key
from tests.engines.gateway.test_lan import PORT, LanDaemon, lan_daemon, namespaces, wait_for

__all__ = ["lan_daemon", "namespaces"]  # the fixtures, used here by name
pytestmark = pytest.mark.slow

POST_SCRIPT = """
import sys, urllib.error, urllib.request
url, key, body, run = sys.argv[1:5]
request = urllib.request.Request(url, data=body.encode(), headers={
    "Host": "localhost", "Authorization": "Bearer " + key, "Content-Type": "application/json",
    "X-Traylm-Bench-Run": run})
try:
    with urllib.request.urlopen(request, timeout=10) as r:
        print(r.status, r.headers["x-request-id"])
except urllib.error.HTTPError as e:
    print(e.code, e.headers["x-request-id"])
"""
BODY = json.dumps({"model": "nope", "messages": [{"role": "user", "content": "secret"}]})


def post(d: LanDaemon, namespace: str, host: str, key: str, *, bench_run: str = "") -> str:
    """POST from ``namespace`` (the peer's, or the daemon's own: this computer); ``bench_run``:
    the request says it is that benchmark run's."""
    url = f"http://{host}:{PORT}/v1/chat/completions"
    out = subprocess.run(
        [
            "ip",
            "netns",
            "exec",
            namespace,
            sys.executable,
            "-c",
            POST_SCRIPT,
            url,
            key,
            BODY,
            bench_run,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    status, rid = out.stdout.split()
    assert status == "404"  # no such model: recorded all the same
    return rid


def test_a_peer_is_recorded_as_lan_with_metadata_only(
    lan_daemon: Callable[[dict[str, object]], LanDaemon],
) -> None:
    key = "tlm-test-key-recorder"
    d = lan_daemon({"lan_sharing": True, "api_key_sha256": [hash_key(key)]})
    wait_for(lambda: d.status().get("bound") == [f"0.0.0.0:{PORT}"], "LAN sharing bound")
    peer_id = post(d, d.ns.peer_ns, d.ns.daemon_ip, key, bench_run="7")  # not believed
    local_id = post(d, d.ns.daemon_ns, "127.0.0.1", key)

    def shown(rid: str) -> dict[str, object]:
        out = d.traylm("requests", "show", rid, "--json")
        return dict(json.loads(out.stdout)) if out.returncode == 0 else {}

    wait_for(lambda: bool(shown(peer_id)) and bool(shown(local_id)), "both requests recorded")
    peer, local = shown(peer_id), shown(local_id)
    peer_ip = d.ns.daemon_ip.rsplit(".", 1)[0] + ".2"  # the veth pair's other end
    assert (peer["client"], peer["peer"]) == ("lan", peer_ip)
    assert peer["key"] == hash_key(key)[:8] and key not in json.dumps(peer)
    assert peer["capture"] == "metadata" and peer["request_body"] == "" and peer["status"] == 404
    assert (local["client"], local["capture"]) == ("local", "full")
    assert "secret" in str(local["request_body"])
