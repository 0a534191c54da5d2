"""Names that go into control-API paths, against a real `traylm serve` with a FAKE engine.

The client (engines/client/__init__.py, used by the CLI and the desktop app) quotes every name as one
path segment, and refuses names that are not profile-style names (the daemon's own rule) with
that rule; the daemon refuses them on every /api route that takes such a name, before any
action. Hostile names stop, restart, shut down or write nothing.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from engines.client import DaemonClient, api_path
from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.errors import ControlAPIError
from tests.conftest import RunningDaemon
from tests.engines.cli.test_cli import traylm
from tests.fakes.fake_trt_env import make_tiny_hf_model

RULE = "1-64 letters, digits, '.', '_' or '-'"
HOSTILE = [
    "a/b",
    "fast/restart#",
    "../shutdown#",
    "x?y",
    "%2e%2e",
    "",
    "..",
    "n" * 300,
    "modèle",
    "fast\n",
]


@pytest.fixture
def fast(env: dict[str, str], served: tuple[subprocess.Popen[str], int]) -> dict[str, Any]:
    """The engine `fast` started (FAKE), as `traylm status --json` reports it."""
    profile = {"model": "org/fast", "served_name": "fast", "device": "cpu"}
    write_toml_atomic(Paths.from_env(env).profiles_dir / "fast.toml", profile)
    started = traylm(env, "start", "fast", "--wait", "--timeout", "60")
    assert started.returncode == 0, started.stderr
    return only_engine(env)


def only_engine(env: dict[str, str]) -> dict[str, Any]:
    out = traylm(env, "status", "--json")
    assert out.returncode == 0, out.stderr  # the daemon still answers
    (engine,) = json.loads(out.stdout)["engines"]
    return dict(engine)


def assert_untouched(env: dict[str, str], before: dict[str, Any]) -> None:
    after = only_engine(env)
    assert (after["state"], after["pid"], after["restarts"]) == ("ready", before["pid"], 0)


@pytest.mark.slow
def test_the_cli_refuses_hostile_names(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int], fast: dict[str, Any]
) -> None:
    """Before quoting, `stop 'fast/restart#'` restarted fast and `stop '../shutdown#'` shut the
    daemon down (and the CLI died with a traceback); `stop ''` stopped the only engine."""
    runs = [
        *(("stop", name, "engine") for name in HOSTILE),
        *((cmd, name, "engine") for cmd in ("restart", "logs") for name in HOSTILE[1:3]),
        ("detach", "../shutdown#", "attached server"),
        ("models rm", "x?y", "model folder"),
    ]
    for command, name, what in runs:
        out = traylm(env, *command.split(), name)
        assert out.returncode == 1, (command, name, out.stdout, out.stderr)
        assert f"is not a valid {what} name" in out.stderr, (command, name, out.stderr)
        assert RULE in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert served[0].poll() is None  # not shut down
    assert_untouched(env, fast)


def raw(port: int, token: str, method: str, path: str, body: Any = None) -> tuple[int, str]:
    """One request with ``path`` sent exactly as written (already percent-encoded)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


@pytest.mark.slow
def test_the_daemon_refuses_names_that_are_not_profile_names(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int], fast: dict[str, Any]
) -> None:
    """What another client (curl) may send: each refused with 400 and the rule, and nothing
    happens (no stop, no restart, no profile file)."""
    paths = Paths.from_env(env)
    token = json.loads(paths.daemon_json.read_text())["token"]
    port = served[1]
    long_name = "n" * 65
    for method, path, body in [
        ("POST", "/api/engines/fast%0A/stop", None),
        ("POST", "/api/engines/fast%0A/restart", None),
        ("POST", "/api/engines/x%3Fy/stop", None),
        ("GET", "/api/engines/%C3%A9/logs", None),
        ("POST", f"/api/engines/{long_name}/stop", None),
        ("PUT", "/api/profiles/ok%0A", {"model": "org/ok"}),
        ("GET", "/api/profiles/%252e%252e", None),
        ("DELETE", "/api/profiles/fast%23", None),
        ("DELETE", "/api/attached/x%20y", None),
        ("DELETE", "/api/models/local/mod%C3%A8le", None),
    ]:
        status, text = raw(port, token, method, path, body)
        assert status == 400, (method, path, status, text)
        error = json.loads(text)["error"]
        assert error["type"] == "invalid_name" and RULE in error["message"], (path, error)
    assert sorted(p.name for p in paths.profiles_dir.iterdir()) == ["fast.toml"]
    assert served[0].poll() is None
    assert_untouched(env, fast)


@pytest.mark.slow
def test_repo_ids_keep_working_and_each_part_is_one_segment(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    """Library model ids are ORG/NAME: two segments, each quoted; a third part is refused."""

    async def go() -> None:
        async with await DaemonClient.connect(Paths.from_env(env)) as c:
            trusted = await c.trust_model("org/some-model", False)
            assert trusted == {"repo_id": "org/some-model", "trust_remote_code": False}
            for bad in ("org/a/b", "../shutdown", "org/..", "noslash"):
                with pytest.raises(ControlAPIError, match="org/name") as refused:
                    await c.trust_model(bad, True)
                assert refused.value.code == "invalid_name"

    asyncio.run(go())
    assert served[0].poll() is None


async def test_a_model_folder_cannot_be_named_what_its_route_refuses(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """`traylm models add PATH --name 'tiny\\n'` registered a folder that no DELETE could
    name afterwards; the name is checked by the same rule when the folder is added."""
    model = make_tiny_hf_model(tmp_path / "tiny-chat")
    with pytest.raises(ControlAPIError, match=RULE) as refused:
        await daemon.client.add_local_folder(str(model), name="tiny\n")
    assert refused.value.code == "invalid_name"
    assert await daemon.client.local_folders() == []


def test_api_path_quotes_each_name_as_one_segment() -> None:
    assert api_path("/api/engines/{}/stop", "../shutdown#") == "/api/engines/..%2Fshutdown%23/stop"
    assert api_path("/api/engines/{}/stop", "x?y") == "/api/engines/x%3Fy/stop"
    assert api_path("/api/profiles/{}", "%2e%2e") == "/api/profiles/%252e%252e"
    assert api_path("/api/profiles/{}", "modèle") == "/api/profiles/mod%C3%A8le"
    assert api_path("/api/chats/{}/messages", 7) == "/api/chats/7/messages"
    for name in ("", ".", ".."):
        with pytest.raises(ControlAPIError) as refused:
            api_path("/api/gpus/{}/fans", name)
        assert refused.value.http_status == 400
