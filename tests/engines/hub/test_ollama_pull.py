"""Ollama's /api/pull and /api/delete with the real `ollama` client, through the real daemon,
from the FAKE Hub: a Hub repo id downloads with Ollama's progress lines and ends in "success";
delete removes it from the cache."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import ollama

from engines.config.sections import OllamaSettings
from engines.core.procs import free_loopback_port
from tests.conftest import DaemonFactory, fast_settings
from tests.engines.hub.conftest import cache_repo, hub_settings
from tests.fakes.hub_server import FakeHub


async def test_pull_and_delete_a_hub_repo(
    daemon_factory: DaemonFactory, fake_hub: FakeHub, hf_home: Path
) -> None:
    port = free_loopback_port()
    settings = dataclasses.replace(
        fast_settings(free_loopback_port()),
        hub=hub_settings(),
        ollama=OllamaSettings(enabled=True, port=port),
    )
    await daemon_factory(settings)
    repo = next(iter(fake_hub.repos))
    async with ollama.AsyncClient(host=f"http://127.0.0.1:{port}") as client:
        lines: list[Any] = [p async for p in await client.pull(repo, stream=True)]
        assert lines[-1].status == "success"
        assert any(p.total for p in lines[:-1]), "progress lines carry the bytes"
        assert (cache_repo(hf_home, repo) / "snapshots").is_dir()
        await client.delete(repo)
        assert not list((cache_repo(hf_home, repo) / "snapshots").glob("*/*.safetensors"))
