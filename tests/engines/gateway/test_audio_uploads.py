"""Bad audio uploads through the real daemon and gateway (FAKE engine): each gets a clear 4xx in
OpenAI's shape, a 2 GB upload is refused while it arrives (never held in memory), and the
gateway keeps serving afterwards."""

from __future__ import annotations

import asyncio
import dataclasses
import resource

import aiohttp
import openai
import pytest

from engines.procs import free_loopback_port
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.test_daemon_gateway import sdk, start_fake

TWO_GB = 2 * 1024**3
LIMIT_BYTES = 1024 * 1024
CHUNK = bytes(1024 * 1024)


@pytest.fixture
async def small_limit(daemon_factory, fake_env) -> RunningDaemon:
    settings = fast_settings(free_loopback_port())
    gateway = dataclasses.replace(settings.gateway, max_audio_bytes=LIMIT_BYTES)
    d: RunningDaemon = await daemon_factory(dataclasses.replace(settings, gateway=gateway))
    await start_fake(d)
    return d


async def raw_request(port: int, head: str, body_chunks: int) -> tuple[bytes, int]:
    """Send ``head`` and up to ``body_chunks`` MiB of body while reading the answer; stop
    sending as soon as it arrives. Returns (the answer, bytes of body sent)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head.encode())
    sent = 0

    async def send() -> None:
        nonlocal sent
        chunked = "chunked" in head
        for _ in range(body_chunks):
            if chunked:
                writer.write(f"{len(CHUNK):x}\r\n".encode() + CHUNK + b"\r\n")
            else:
                writer.write(CHUNK)
            await writer.drain()
            sent += len(CHUNK)

    sender = asyncio.create_task(send())
    try:
        answer = await asyncio.wait_for(reader.read(4096), 60)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
        await asyncio.gather(writer.wait_closed(), return_exceptions=True)
    return answer, sent


def head(port: int, *, length: int | None) -> str:
    size = f"Content-Length: {length}" if length is not None else "Transfer-Encoding: chunked"
    return (
        "POST /v1/audio/transcriptions HTTP/1.1\r\n"
        f"Host: 127.0.0.1:{port}\r\n"
        "Content-Type: multipart/form-data; boundary=XyZ\r\n"
        f"{size}\r\n\r\n"
    )


async def test_a_2gb_upload_is_refused_while_it_arrives(small_limit: RunningDaemon) -> None:
    d = small_limit
    rss_before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    answer, sent = await raw_request(d.port, head(d.port, length=TWO_GB), body_chunks=2048)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"audio upload larger than 1048576 bytes (2147483648 bytes)" in answer
    assert b"gateway.max_audio_bytes" in answer
    # no Content-Length: the gateway counts what arrives and stops reading past the limit
    answer, sent = await raw_request(d.port, head(d.port, length=None), body_chunks=2048)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 256 * LIMIT_BYTES, f"{sent} bytes went out before the refusal"
    print(f"chunked upload: {sent / LIMIT_BYTES:.0f} MiB sent before the 413")
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before_kib) / 1024
    assert grown_mib < 200, f"peak memory grew by {grown_mib:.0f} MiB"
    async with sdk(d) as client:  # still serving
        assert (await client.models.list()).data


async def test_bad_forms_get_a_clear_400(small_limit: RunningDaemon) -> None:
    url = small_limit.url + "/v1/audio/transcriptions"
    async with aiohttp.ClientSession() as http:
        form = aiohttp.FormData(default_to_multipart=True)
        form.add_field("model", "fake")
        async with http.post(url, data=form) as r:
            body = await r.json()
            assert r.status == 400 and body["error"]["param"] == "file"
            assert "no 'file' part" in body["error"]["message"]
        form = aiohttp.FormData()
        form.add_field("file", b"RIFF", filename="a.wav", content_type="audio/wav")
        async with http.post(url, data=form) as r:
            body = await r.json()
            assert r.status == 400 and "no 'model' field" in body["error"]["message"]
        async with http.post(url, json={"model": "fake", "file": "a.wav"}) as r:
            body = await r.json()
            assert r.status == 400 and "multipart/form-data" in body["error"]["message"]
    async with sdk(small_limit) as client:
        with pytest.raises(openai.APIStatusError) as err:
            await client.audio.transcriptions.create(
                model="fake", file=("a.wav", bytes(LIMIT_BYTES + 1), "audio/wav")
            )
        assert err.value.status_code == 413
    form = aiohttp.FormData()  # the openai SDK deprecated translations; the route stays
    form.add_field("model", "fake")
    form.add_field("file", b"RIFF" * 10, filename="a.wav", content_type="audio/wav")
    url = small_limit.url + "/v1/audio/translations"
    async with aiohttp.ClientSession() as http, http.post(url, data=form) as r:
        assert (await r.json())["text"] == "w0 w1 (40 bytes)"
