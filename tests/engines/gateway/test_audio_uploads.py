"""Bad audio uploads through the real daemon and gateway (FAKE engine): each gets a clear 4xx in
OpenAI's shape, a 2 GB upload is refused while it arrives (never held in memory), and the
gateway keeps serving afterwards."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import resource

import aiohttp
import openai
import pytest

from engines.core.procs import free_loopback_port
from engines.gateway.audio import FIRST_PART_WITHIN_BYTES, MAX_FORM_PARTS
from tests.conftest import RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake

TWO_GB = 2 * 1024**3
LIMIT_BYTES = 1024 * 1024
CHUNK = bytes(1024 * 1024)
FIRST_CHUNK = (
    b'--XyZ\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
).ljust(len(CHUNK), b"\0")
"""The first MiB of a form whose audio never ends."""


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
        for i in range(body_chunks):
            chunk = CHUNK if i else FIRST_CHUNK
            if chunked:
                writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            else:
                writer.write(chunk)
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


def form_of_tiny_parts(tiny_parts: int, *, preamble: bytes = b"") -> bytes:
    """A form with the audio and the model first, then ``tiny_parts`` fields of one byte."""
    audio = (
        b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        b"Content-Type: audio/wav\r\n\r\nRIFF\r\n"
    )
    model = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nfake\r\n'
    tiny = b'--b\r\nContent-Disposition: form-data; name="x"\r\n\r\n1\r\n'
    return preamble + audio + model + tiny * tiny_parts + b"--b--\r\n"


async def upload_while_asking_health(d: RunningDaemon, body: bytes) -> tuple[int, str, int, int]:
    """Send ``body`` to /v1/audio/transcriptions (1 MiB at a time, stopping at the answer)
    while another client asks /health again and again. Returns (status, error message, body
    bytes sent, /health answers received while the upload was in flight)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", d.port)
    writer.write(
        (
            "POST /v1/audio/transcriptions HTTP/1.1\r\n"
            f"Host: 127.0.0.1:{d.port}\r\n"
            "Content-Type: multipart/form-data; boundary=b\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
    )
    sent = 0
    answered = asyncio.Event()

    async def send() -> None:
        nonlocal sent
        for start in range(0, len(body), len(CHUNK)):
            writer.write(body[start : start + len(CHUNK)])
            await writer.drain()
            sent += len(body[start : start + len(CHUNK)])

    async def ask_health() -> int:
        answers = 0
        async with aiohttp.ClientSession() as http:
            while not answered.is_set():
                # generous: the loop held by the upload kept /health waiting for a minute
                async with asyncio.timeout(20), http.get(d.url + "/health") as r:
                    assert r.status == 200
                answers += 1
        return answers

    health = asyncio.create_task(ask_health())
    sender = asyncio.create_task(send())
    try:
        async with asyncio.timeout(20):
            answer = await reader.read(8192)
    finally:
        answered.set()
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
        writer.close()
        await asyncio.gather(writer.wait_closed(), return_exceptions=True)
    head, _, payload = answer.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    return status, json.loads(payload)["error"]["message"], sent, await health


async def test_a_form_of_many_tiny_parts_is_refused_at_the_part_limit(
    daemon: RunningDaemon,
) -> None:
    """24 MB of 470,000 tiny parts (under the 25 MiB limit) once held the
    event loop for a minute while the form was parsed; /health waited all that time."""
    await start_fake(daemon)
    body = form_of_tiny_parts(470_000)
    assert 24 * 10**6 < len(body) < daemon.daemon.ctx.settings.gateway.max_audio_bytes
    status, message, sent, _ = await upload_while_asking_health(daemon, body)
    assert status == 400, message
    assert f"more than {MAX_FORM_PARTS} parts" in message
    assert sent < len(body), "the gateway read the whole form instead of stopping at the limit"
    # a preamble of millions of empty lines: each line is a step of the parser
    body = form_of_tiny_parts(1, preamble=b"\r\n" * 12_000_000)
    status, message, sent, _ = await upload_while_asking_health(daemon, body)
    assert status == 400, message
    assert f"no form part begins in the first {FIRST_PART_WITHIN_BYTES} bytes" in message
    assert sent < len(body)
    # at the limit, the form goes through; one more part is refused
    url = daemon.url + "/v1/audio/transcriptions"
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=form_with_parts(MAX_FORM_PARTS)) as r:
            assert r.status == 200 and (await r.json())["text"] == "w0 w1 (40 bytes)"
        async with http.post(url, data=form_with_parts(MAX_FORM_PARTS + 1)) as r:
            assert r.status == 400
            assert f"more than {MAX_FORM_PARTS} parts" in (await r.json())["error"]["message"]


def form_with_parts(parts: int) -> aiohttp.FormData:
    form = aiohttp.FormData()
    form.add_field("file", b"RIFF" * 10, filename="a.wav", content_type="audio/wav")
    form.add_field("model", "fake")
    for i in range(parts - 2):
        form.add_field(f"x{i}", "1")
    return form


async def test_malformed_forms_get_a_400_naming_the_problem(small_limit: RunningDaemon) -> None:
    url = small_limit.url + "/v1/audio/transcriptions"
    model = b'--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nfake\r\n'
    nested = (
        b'--b\r\nContent-Disposition: form-data; name="file"\r\n'
        b"Content-Type: multipart/mixed; boundary=c\r\n\r\n"
        b'--c\r\nContent-Disposition: file; filename="a.wav"\r\n\r\nRIFF\r\n--c--\r\n'
    )
    long_header = b"--b\r\nContent-Disposition: form-data; name=file; x=" + b"y" * 200_000
    cases = {
        # (Content-Type, body): what the 400 says
        ("multipart/form-data", model + b"--b--\r\n"): "could not be read",
        ("multipart/form-data; boundary=b", model): "could not be read",  # no closing boundary
        ("multipart/form-data; boundary=b", model + nested + b"--b--\r\n"): "multipart body of",
        ("multipart/form-data; boundary=b", long_header): "could not be read",
    }
    async with aiohttp.ClientSession() as http:
        for (ctype, body), says in cases.items():
            async with http.post(url, data=body, headers={"Content-Type": ctype}) as r:
                error = (await r.json())["error"]
                assert r.status == 400 and says in error["message"], (ctype, body[:80], error)
        async with http.get(small_limit.url + "/health") as r:  # still serving
            assert r.status == 200
