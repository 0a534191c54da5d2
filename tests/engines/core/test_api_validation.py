"""The control API's one validation layer (engines/core/http.py), against a real daemon over
HTTP: a number past Python's int-string limit in a query and a lone surrogate anywhere in a
body get a 400 that names the parameter or the field, never a traceback; names are bounded and
an error quotes only a short prefix of what the client sent."""

from __future__ import annotations

import dataclasses
import io
import json
from typing import Any

import aiohttp
import pytest

from engines.config.sections import PeersSettings
from engines.core.procs import free_loopback_port
from engines.errors import quoted
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings

HUGE = "9" * 5000


async def _send(
    d: RunningDaemon, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {d.client.info.token}"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, d.url + path, data=_data(body), headers=headers) as resp,
    ):
        return resp.status, json.loads(await resp.read())


def _data(body: bytes | None) -> io.BytesIO | None:
    return None if body is None else io.BytesIO(body)  # aiohttp warns on a large bytes body


@pytest.mark.parametrize(
    ("path", "name"),
    [
        (f"/api/requests?limit={HUGE}", "limit"),
        (f"/api/requests?after=1{'0' * 30}", "after"),
        ("/api/requests?before=%C2%B2", "before"),  # "²" is a digit to str.isdigit, not to int
        (f"/api/bench/runs?limit={HUGE}", "limit"),
        (f"/api/gpus/history?points={HUGE}", "points"),
        ("/api/gpus/history?seconds=nan", "seconds"),
        (f"/api/engines/x/logs?tail={HUGE}", "tail"),
        ("/api/profiles/x?dry_run=maybe", "dry_run"),
        (f"/api/chats/{'1' * 30}", "conversation id"),
    ],
)
async def test_a_bad_number_in_a_query_or_path_is_a_400_naming_it(
    daemon: RunningDaemon, path: str, name: str
) -> None:
    method = "PUT" if path.startswith("/api/profiles") else "GET"
    body = b'{"model": "org/x"}' if method == "PUT" else None
    status, answer = await _send(daemon, method, path, body)
    assert status == 400, answer
    message = answer["error"]["message"]
    assert message.startswith(f"{name} must be"), message
    assert len(message) < 200, message


@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [
        ("POST", "/api/chats", {"model": "\ud800"}, "model"),
        (
            "POST",
            "/api/chats",
            {"model": "m", "params": {"stop": ["a", "\udcff"]}},
            "params.stop[1]",
        ),
        ("PATCH", "/api/chats/1", {"title": "x\ud800"}, "title"),
        ("PUT", "/api/profiles/x", {"model": "org/x", "description": "\ud800"}, "description"),
        ("PUT", "/api/profiles/x", {"model": "org/x", "env": {"\ud800": "1"}}, "a key in env"),
    ],
)
async def test_a_lone_surrogate_in_a_body_is_a_400_naming_the_field(
    daemon: RunningDaemon, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    await daemon.client.create_chat(model="m")  # /api/chats/1 exists
    status, answer = await _send(daemon, method, path, json.dumps(body).encode())
    assert status == 400, answer
    assert answer["error"]["message"].startswith(f"{field} is not valid Unicode"), answer
    assert not (daemon.paths.profiles_dir / "x.toml").exists()


async def test_a_body_that_is_not_an_object_is_refused(daemon: RunningDaemon) -> None:
    for body in (b"[]", b"1", b'"x"', b"null"):
        status, answer = await _send(daemon, "POST", "/api/chats", body)
        assert status == 400 and "must be a JSON object" in answer["error"]["message"], answer


async def test_a_profile_s_names_are_bounded(daemon: RunningDaemon) -> None:
    for field in ("model", "served_name"):
        body = {"model": "org/x", field: "m" * (2 << 20)}  # 2 MB
        status, answer = await _send(daemon, "PUT", "/api/profiles/x", json.dumps(body).encode())
        assert status == 400, answer["error"]["message"][:300]
        message = answer["error"]["message"]
        assert f"{field} {quoted('m' * 300)} is longer than 256 characters" in message
        assert len(message) < 1000
    body = {"model": "org/x", "aliases": ["ok", "a" * 257]}
    status, answer = await _send(daemon, "PUT", "/api/profiles/x", json.dumps(body).encode())
    assert status == 400 and "aliases: " in answer["error"]["message"], answer
    status, answer = await _send(
        daemon, "PUT", "/api/profiles/x", json.dumps({"model": "o/" + "m" * 254}).encode()
    )
    assert status == 200, answer  # 256 characters is a name
    assert not (daemon.paths.profiles_dir / "x.toml").read_text().count("m" * 300)


async def test_a_3_mb_model_name_is_quoted_short_in_the_404(daemon: RunningDaemon) -> None:
    name = "m" * (3 << 20)
    body = json.dumps({"model": name, "messages": [{"role": "user", "content": "hi"}]})
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{daemon.url}/v1/chat/completions", data=_data(body.encode())) as resp,
    ):
        answer = json.loads(await resp.read())
    assert resp.status == 404, str(answer)[:300]
    message = answer["error"]["message"]
    assert message.startswith(f"the model {quoted(name)} is not served"), message[:300]
    assert len(message) < 1000
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{daemon.url}/v1/models/{'m' * 4000}") as resp,
    ):
        answer = json.loads(await resp.read())
    assert resp.status == 404 and len(answer["error"]["message"]) < 1000, str(answer)[:300]


def test_quoted_shows_a_short_prefix_and_escapes() -> None:
    assert quoted("abc") == "'abc'"
    assert quoted("x" * 81) == repr("x" * 80) + "…"
    assert quoted("a\ud800") == "'a\\ud800'"
    assert quoted(["a"]) == "['a']" and quoted(-1) == "-1"


async def test_pairing_refuses_unknown_fields_like_the_other_routes(
    daemon_factory: DaemonFactory,
) -> None:
    settings = dataclasses.replace(
        fast_settings(free_loopback_port()),
        peers=PeersSettings(host="127.0.0.1", port=free_loopback_port()),
    )
    d = await daemon_factory(settings)
    for path, body in (
        ("/api/peers/pairing", {"expires_in_s": 60, "expires_in": 60}),
        ("/api/peers/join", {"address": "127.0.0.1:1", "code": "ABCDE-FGHJK", "colour": 1}),
    ):
        status, answer = await _send(d, "POST", path, json.dumps(body).encode())
        assert status == 400, answer
        assert answer["error"]["message"].startswith("unknown fields "), answer
    assert not (await d.client.pairing()).active
