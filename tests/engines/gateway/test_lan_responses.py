"""A stored response over a real LAN (network namespaces, as in test_lan.py) with the FAKE
engine: it belongs to the API key that made it, whichever computer asks. Another key gets the
404 of an id never made, on this computer or another."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.gateway.security import hash_key
from tests.engines.gateway.test_lan import PORT, Namespaces, namespaces, wait_for
from tests.fakes.fake_vllm_env import make_fake_vllm_env

__all__ = ["namespaces"]  # the fixture, used by name
pytestmark = pytest.mark.slow
KEY_A, KEY_B = "tlm-test-key-a", "tlm-test-key-b"
ASK = """
import sys, urllib.error, urllib.request
method, url, key, body = sys.argv[1:5]
headers = {"Host": "localhost:%s" % url.split(":")[2].split("/")[0],
           "Authorization": "Bearer " + key, "Content-Type": "application/json"}
request = urllib.request.Request(url, data=body.encode() or None, headers=headers, method=method)
try:
    with urllib.request.urlopen(request, timeout=60) as r:
        print(r.status, r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code, e.read().decode())
"""


@pytest.fixture
def lan_daemon_with_fake_engine(namespaces: Namespaces, tmp_path: Path) -> Iterator[Namespaces]:
    env = {
        **os.environ,
        "TRAYLM_HOME": str(tmp_path / "home"),
        "TRAYLM_ENVS_DIR": str(tmp_path / "envs"),
    }
    paths = Paths.from_env(env)
    make_fake_vllm_env(paths.envs_dir)
    gateway = {"lan_sharing": True, "api_key_sha256": [hash_key(KEY_A), hash_key(KEY_B)]}
    write_toml_atomic(paths.config_file, {"gateway": gateway})
    store = {"VLLM_ENABLE_RESPONSES_API_STORE": "1"}
    model = tmp_path / "model"  # a folder: nothing to fetch from the Hub
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    profile = {"model": str(model), "served_name": "fake", "device": "cpu", "env": store}
    write_toml_atomic(paths.profiles_dir / "fake.toml", profile)
    with (tmp_path / "serve.log").open("wb") as log:
        in_ns = ["ip", "netns", "exec", namespaces.daemon_ns, sys.executable, "-m", "engines"]
        proc = subprocess.Popen(
            [*in_ns, "serve", "--port", str(PORT)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        wait_for(lambda: paths.daemon_json.exists() or proc.poll() is not None, "daemon.json")
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()
        started = subprocess.run(
            [*in_ns, "start", "fake", "--wait", "--timeout", "60"],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert started.returncode == 0, started.stdout + started.stderr
        yield namespaces
    finally:
        proc.terminate()  # the daemon stops its engine
        proc.wait(30)


def ask(ns: str, method: str, url: str, key: str, body: object = None) -> tuple[int, str]:
    """A request made from the computer of namespace ``ns``: (status, body)."""
    data = json.dumps(body) if body is not None else ""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, sys.executable, "-c", ASK, method, url, key, data],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    status, _, text = out.stdout.strip().partition(" ")
    return int(status), text


def test_a_response_belongs_to_its_key_on_any_computer(
    lan_daemon_with_fake_engine: Namespaces,
) -> None:
    ns = lan_daemon_with_fake_engine
    here, there = f"http://127.0.0.1:{PORT}", f"http://{ns.daemon_ip}:{PORT}"
    body = {"model": "fake", "input": "hi", "max_output_tokens": 3}
    status, made = ask(ns.daemon_ns, "POST", here + "/v1/responses", KEY_A, body)
    assert status == 200, made
    response_id = json.loads(made)["id"]
    status, never = ask(ns.peer_ns, "GET", there + "/v1/responses/resp_never", KEY_B)
    assert status == 404 and "no response 'resp_never'" in never
    for ns_name, url in ((ns.peer_ns, there), (ns.daemon_ns, here)):
        status, text = ask(ns_name, "GET", f"{url}/v1/responses/{response_id}", KEY_B)
        assert status == 404, text
        assert text == never.replace("resp_never", response_id)  # as if never made
        status, text = ask(ns_name, "POST", f"{url}/v1/responses/{response_id}/cancel", KEY_B)
        assert status == 404, text
    status, text = ask(ns.peer_ns, "GET", f"{there}/v1/responses/{response_id}", KEY_A)
    assert status == 200 and json.loads(text)["id"] == response_id  # the key, not the computer
