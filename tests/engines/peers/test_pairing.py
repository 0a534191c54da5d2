"""Pairing of traylm boxes: real `traylm serve` daemons in network
namespaces (boxes.py), driven by the real `traylm` command at each box."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from engines.config.sections import Paths
from tests.engines.peers.boxes import PEER_PORT, Box, boxes

__all__ = ["boxes"]  # the fixture
pytestmark = pytest.mark.slow  # three daemons and a dozen `traylm` runs per test
RELAY_PORT = 9471  # in box A's own namespace: no other process there holds ports


def _code(box: Box, *args: str) -> str:
    return str(box.json("pair", *args)["code"])


def _probe(box: Box, url: str, mode: str) -> dict[str, object]:
    out = box.python("-m", "tests.engines.peers.probe", url, mode)
    assert out.returncode == 0, out.stderr
    data: dict[str, object] = json.loads(out.stdout)
    return data


def _wait_pairing_over(box: Box, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while box.json("status")["peers"]["pairing"]:  # type: ignore[index]
        assert time.monotonic() < deadline, "the pairing did not end"
        time.sleep(0.2)


def test_pairing_takes_the_right_code_once_and_refuses_the_rest(boxes: dict[str, Box]) -> None:
    a, b, c = boxes["a"], boxes["b"], boxes["c"]
    for box in (a, b, c):
        box.serve()
    hello = f"https://{a.address}:{PEER_PORT}/peer/hello"
    assert a.listening() == ""  # nothing listens on the LAN before a pairing
    assert "ConnectorError" in str(_probe(b, hello, "none").get("error"))

    shown = a.json("pair")
    code = str(shown["code"])
    assert shown["addresses"] == [f"10.77.0.1:{PEER_PORT}", f"10.77.1.1:{PEER_PORT}"]
    assert a.listening() == f"0.0.0.0:{PEER_PORT}"
    wrong = b.traylm("pair", a.address, "2345623456")
    assert wrong.returncode == 1
    assert "the pairing code is wrong (2 tries left)" in wrong.stderr, wrong.stderr
    assert "not a pairing code" in b.traylm("pair", a.address, "hello").stderr

    paired = b.traylm("pair", a.address, code.lower())  # typed in any case
    assert paired.returncode == 0, paired.stderr
    assert "paired with box-a at 10.77.0.1:8471" in paired.stdout

    [on_a], [on_b] = a.peers(), b.peers()
    assert (on_a["name"], on_a["address"], on_a["reachable"]) == ("box-b", "10.77.0.2:8471", True)
    assert (on_b["name"], on_b["address"], on_b["reachable"]) == ("box-a", "10.77.0.1:8471", True)
    assert on_a["fingerprint"] == b.json("peers")["fingerprint"]
    assert on_b["fingerprint"] == a.json("peers")["fingerprint"]
    assert on_a["last_seen_s"] is not None
    table = a.traylm("peers").stdout
    assert (
        "this box: box-a" in table and f"listening for paired boxes: 0.0.0.0:{PEER_PORT}" in table
    )
    assert "box-b" in table and "10.77.0.2:8471" in table and "reachable" in table
    no_code = b.traylm("pair", a.address)
    assert no_code.returncode == 1 and "give the code too" in no_code.stderr

    reused = c.traylm("pair", "10.77.1.1", code)
    assert reused.returncode == 1
    assert "this pairing code was already used (to pair with box-b)" in reused.stderr

    short = _code(a, "--expires-in", "1")
    _wait_pairing_over(a)
    expired = c.traylm("pair", "10.77.1.1", short)
    assert "this pairing code expired; run `traylm pair` on box-a" in expired.stderr

    c_hello = f"https://10.77.1.1:{PEER_PORT}/peer/hello"
    with_cert = _probe(c, c_hello, "cert")  # the TLS handshake refuses C's certificate
    assert "error" in with_cert and "status" not in with_cert, with_cert
    without = _probe(c, c_hello, "none")
    assert without["status"] == 403
    assert "this box is not paired with box-a" in str(without["body"])
    assert [p["name"] for p in a.peers()] == ["box-b"]


def test_three_wrong_codes_spend_the_code(boxes: dict[str, Box]) -> None:
    a, b = boxes["a"], boxes["b"]
    a.serve()
    b.serve()
    code = _code(a)
    for _ in range(2):
        assert "tries left" in b.traylm("pair", a.address, "2345623456").stderr
    last = b.traylm("pair", a.address, "2345623456").stderr
    assert "wrong, and that was the last try" in last
    assert a.listening() == ""  # the spent code closed the listener
    closed = b.traylm("pair", a.address, code).stderr
    assert "no traylm box answers at 10.77.0.1:8471" in closed
    assert "run `traylm pair` on it first" in closed
    _code(a)  # a new pairing: the spent code is still refused, and says why
    spent = b.traylm("pair", a.address, code).stderr
    assert "this pairing code was spent by too many wrong codes" in spent
    assert a.peers() == [] and b.peers() == []


def test_restart_keeps_unpair_removes_and_a_changed_certificate_is_named(
    boxes: dict[str, Box],
) -> None:
    a, b = boxes["a"], boxes["b"]
    a.serve()
    b.serve()
    assert b.traylm("pair", a.address, _code(a)).returncode == 0

    a.stop()
    down = b.peers()[0]
    assert down["reachable"] is False and "box 'box-a' at 10.77.0.1:8471 is not reachable" in str(
        down["problem"]
    )
    a.serve()
    assert [(p["name"], p["reachable"]) for p in a.peers()] == [("box-b", True)]
    assert [(p["name"], p["reachable"]) for p in b.peers()] == [("box-a", True)]

    out = b.traylm("unpair", "box-a")
    assert out.returncode == 0, out.stderr
    assert "removed here and there" in out.stdout
    assert a.peers() == [] and b.peers() == []
    assert a.listening() == "" and b.listening() == ""

    assert b.traylm("pair", a.address, _code(a)).returncode == 0
    b.stop()  # box B is reinstalled: a new identity
    shutil.rmtree(Paths.from_env(b.env).data_dir / "peers" / "identity")
    b.serve()
    [seen_by_a] = a.peers()
    assert seen_by_a["reachable"] is False
    problem = str(seen_by_a["problem"])
    assert "box 'box-b' at 10.77.0.2:8471 presented a certificate that is not the one paired" in (
        problem
    )
    assert "`traylm unpair box-b` and pair the boxes again" in problem
    [seen_by_b] = b.peers()
    assert "box 'box-a' at 10.77.0.1:8471 refused this box's certificate" in str(
        seen_by_b["problem"]
    )
    out = a.traylm("unpair", "box-b")
    assert out.returncode == 0 and "removed here only" in out.stdout, out.stdout + out.stderr
    assert a.peers() == []


def test_a_machine_in_the_middle_cannot_pair_and_the_waiting_pair_sees_the_real_one(
    boxes: dict[str, Box], tmp_path: Path
) -> None:
    a, b = boxes["a"], boxes["b"]
    a.serve()
    b.serve()
    waiting = subprocess.Popen(
        a.command("-m", "engines", "pair"), env=a.env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    relays = [  # each relay its own identity folder: two making one folder race (key vs cert)
        subprocess.Popen(
            a.command(
                "-m", "tests.engines.peers.mitm", str(tmp_path / f"mitm{port}"), str(port), target
            ),
            env=a.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for port, target in ((RELAY_PORT, f"https://127.0.0.1:{PEER_PORT}"), (RELAY_PORT + 1, "-"))
    ]
    try:
        assert waiting.stdout is not None
        first = waiting.stdout.readline()
        assert first.startswith("pairing code: "), first
        code = first.split()[2]
        for relay in relays:
            assert relay.stdout is not None and relay.stdout.readline().strip() == "ready"

        # a box that answers as if it knew the code: B checks its proof and pins nothing
        pretender = b.traylm("pair", f"{a.address}:{RELAY_PORT + 1}", code)
        assert pretender.returncode == 1
        assert f"the box at 10.77.0.1:{RELAY_PORT + 1} did not prove it knows the code" in (
            pretender.stderr
        )
        assert b.peers() == []

        # B types the right code, but reaches A through the relay: the proofs cover the
        # relay's certificate, not A's, so A refuses and nothing is pinned on either side
        through = b.traylm("pair", f"{a.address}:{RELAY_PORT}", code)
        assert through.returncode == 1
        assert "refused the pairing: the pairing code is wrong (2 tries left)" in through.stderr
        assert a.peers() == [] and b.peers() == []

        direct = b.traylm("pair", a.address, code)
        assert direct.returncode == 0, direct.stderr
        out, _ = waiting.communicate(timeout=60)
        assert waiting.returncode == 0, out
        assert out.rstrip().endswith("paired with box-b"), out
    finally:
        for proc in (waiting, *relays):
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
