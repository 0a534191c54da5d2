"""The Files API through the real daemon and gateway, driven by the OpenAI SDK: an upload is
stored whole, listed, read back and deleted; it belongs to the key that made it; a refused
upload (too large, not multipart, wrong purpose) is a clear 400 with nothing left on disk."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest

from engines.core.procs import free_loopback_port
from tests.conftest import RunningDaemon, fast_settings

LIMIT_BYTES = 64 * 1024
LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {}}\n'


@pytest.fixture
async def small_limit(daemon_factory, fake_env) -> RunningDaemon:
    settings = fast_settings(free_loopback_port())
    gateway = dataclasses.replace(settings.gateway, max_file_bytes=LIMIT_BYTES)
    d: RunningDaemon = await daemon_factory(dataclasses.replace(settings, gateway=gateway))
    return d


@pytest.fixture
async def sdk(small_limit: RunningDaemon) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=small_limit.url + "/v1", api_key="none", max_retries=0
    ) as client:
        yield client


def leftovers(d: RunningDaemon) -> list[str]:
    folder = d.paths.data_dir / "files"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def test_upload_list_content_delete(
    small_limit: RunningDaemon, sdk: openai.AsyncOpenAI
) -> None:
    made = await sdk.files.create(file=("in.jsonl", io.BytesIO(LINE * 10)), purpose="batch")
    assert (made.object, made.purpose, made.bytes, made.filename) == (
        "file",
        "batch",
        len(LINE) * 10,
        "in.jsonl",
    )
    assert [f.id for f in (await sdk.files.list()).data] == [made.id]
    assert (await sdk.files.retrieve(made.id)).bytes == made.bytes
    assert (await sdk.files.content(made.id)).content == LINE * 10
    assert leftovers(small_limit) == [made.id]
    assert (await sdk.files.delete(made.id)).deleted
    with pytest.raises(openai.NotFoundError):
        await sdk.files.retrieve(made.id)
    assert leftovers(small_limit) == []


async def test_too_large_is_refused_and_nothing_kept(
    small_limit: RunningDaemon, sdk: openai.AsyncOpenAI
) -> None:
    too_big = LINE * (LIMIT_BYTES // len(LINE) + 1)
    with pytest.raises(openai.BadRequestError, match="gateway.max_file_bytes"):
        await sdk.files.create(file=("in.jsonl", io.BytesIO(too_big)), purpose="batch")
    assert leftovers(small_limit) == []
    assert (await sdk.files.list()).data == []


async def test_bad_forms_are_refused(small_limit: RunningDaemon, sdk: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError, match="purpose must be one of batch"):
        await sdk.files.create(file=("in.jsonl", io.BytesIO(LINE)), purpose="fine-tune")
    url = small_limit.url + "/v1/files"
    async with aiohttp.ClientSession() as http, http.post(url, json={"file": "x"}) as resp:
        assert resp.status == 400
        assert "multipart/form-data" in (await resp.json())["error"]["message"]
    assert leftovers(small_limit) == []
