"""Bad input gets a 400/401 or a readable error naming the file, never a 500 or a traceback:
JSON nested deeper than the parser's limit, a non-ASCII Authorization header, config files that
are not UTF-8, and malformed HTTP (answered 400 and logged as one line, not an ERROR traceback)."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from engines.config.sections import Paths
from engines.core.procs import free_loopback_port
from engines.gateway.security import hash_key
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.engines.cli.test_cli import traylm

DEEP = 100_000


async def raw_request(port: int, head: bytes) -> tuple[int, bytes]:
    """Send bytes as they are (aiohttp's client refuses what a hostile client sends); return
    the status and the body the gateway answered with."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


async def test_json_nested_past_the_parser_limit_is_400(daemon: RunningDaemon) -> None:
    async with aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {daemon.client.info.token}"}
    ) as http:
        for method, path, body in (
            ("POST", "/v1/chat/completions", b"[" * DEEP + b"]" * DEEP),
            ("POST", "/v1/chat/completions", b'{"model": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
            ("PATCH", "/api/settings", b'{"a": ' + b"[" * DEEP),
            ("POST", "/api/chats", b"[" * DEEP),
            ("PUT", "/api/models/org/name/trust", b"[" * DEEP),
        ):
            async with http.request(method, daemon.url + path, data=body) as r:
                data = await r.json()
                assert r.status == 400, (path, r.status, data)
                message = data["error"]["message"]
                assert "nested too deeply" in message or "must be JSON" in message, data


async def test_non_ascii_authorization_is_401(daemon_factory: DaemonFactory, fake_env) -> None:
    d = await daemon_factory(
        fast_settings(free_loopback_port(), api_key_sha256=(hash_key("tlm-right"),))
    )
    for path in (b"/v1/models", b"/api/status"):
        for value in ("Bearer ké".encode(), b"Bearer \xff\xfe", "Bearer 鍵".encode()):
            status, body = await raw_request(
                d.port,
                b"GET "
                + path
                + b" HTTP/1.1\r\nHost: localhost\r\nAuthorization: "
                + value
                + b"\r\nConnection: close\r\n\r\n",
            )
            assert status == 401, (path, value, status, body)
            assert b'"unauthorized"' in body


async def test_malformed_http_is_one_line_not_a_traceback(
    daemon: RunningDaemon, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for head in (
        b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nno colon here\r\n\r\n",
        b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\nContent-Length: x\r\n\r\n",
        b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + bytes(range(64)) + b"\r\n\r\n",
    ):
        status, _ = await raw_request(daemon.port, head)
        assert status == 400, head[:40]
    http_records = [r for r in caplog.records if r.name.startswith(("aiohttp", "engines"))]
    assert not [r for r in http_records if r.levelno >= logging.ERROR or r.exc_info], [
        (r.name, r.levelname, r.getMessage()) for r in http_records
    ]
    assert any("malformed request" in r.getMessage() for r in http_records)
    assert (await daemon.client.status())["pid"]  # and the daemon serves on


def write_not_utf8(path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode().replace(b"@", b"\xff\xfe"))


async def test_profile_not_utf8_is_listed_as_broken_naming_the_file(
    daemon: RunningDaemon,
) -> None:
    bad = daemon.paths.profiles_dir / "broken.toml"
    write_not_utf8(bad, 'model = "org/m"\ndescription = "caf@"\n')
    daemon.write_profile("fine", model="org/fine", device="cpu")
    listing = await daemon.client.profiles()
    assert "fine" in [p["name"] for p in listing["profiles"]]
    (line,) = listing["broken"]
    assert str(bad) in line and "not UTF-8" in line and "line 2" in line


def test_cli_reads_files_that_are_not_utf8_without_a_traceback(env: dict[str, str]) -> None:
    paths = Paths.from_env(env)
    write_not_utf8(paths.profiles_dir / "broken.toml", 'model = "org/@"\n')
    out = traylm(env, "profiles")
    assert out.returncode == 1 and "Traceback" not in out.stderr + out.stdout
    assert f"BROKEN: {paths.profiles_dir / 'broken.toml'}: not UTF-8" in out.stdout
    out = traylm(env, "profiles", "broken")
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "broken.toml: not UTF-8 text (line 1" in out.stderr
    write_not_utf8(paths.config_file, "[gateway]\n# @\nport = 8001\n")
    for args in (("config", "get"), ("serve", "--port", str(free_loopback_port()))):
        out = traylm(env, *args)
        assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
        assert f"{paths.config_file}: not UTF-8 text (line 2" in out.stderr, out.stderr
