"""A batch that asks for a GPU efficiency profile (metadata ``traylm_efficiency_profile``),
through the real daemon on simulated GPUs with the FAKE engine and the OpenAI SDK: the profile
is put on every GPU when the batch starts sending, its lines run under it, and the profile in
force before is back when it ends; a profile that does not exist, or a computer without GPUs,
is a 400 at create with nothing made."""

from __future__ import annotations

import asyncio
import dataclasses
import io
from pathlib import Path
from typing import Any

import openai
import pytest

from engines.events import Event
from engines.events.batch import BatchProgress
from engines.events.gpu import GPUControlChanged
from engines.gpu.sim import sim_uuid
from tests.conftest import RunningDaemon
from tests.engines.batch.test_batches import CHAT, chat_line, jsonl, until_ended
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake
from tests.engines.gpu.test_daemon import sim_settings

GPU0 = sim_uuid(0)
PROFILE_KEY = "traylm_efficiency_profile"  # the metadata key, as a user writes it


@pytest.fixture
async def sim_daemon(daemon_factory: Any, fake_env: Path) -> RunningDaemon:
    settings = sim_settings()  # one line at a time: the progress between them is seen
    gateway = dataclasses.replace(settings.gateway, batch_lines_at_once=1)
    d: RunningDaemon = await daemon_factory(dataclasses.replace(settings, gateway=gateway))
    return d


@pytest.mark.slow  # three lines of about 1 s, one at a time
async def test_a_batch_runs_under_the_profile_it_asks_for_and_puts_back_the_one_before(
    sim_daemon: RunningDaemon,
) -> None:
    d = sim_daemon
    await start_fake(d, args="--token-delay 0.3")  # a line takes about 1 s
    await d.client.set_efficiency_profile("eco")
    seen: list[str] = []  # profiles applied and batch progress, in the daemon's order
    rows = [chat_line(f"r{n}") for n in range(3)]
    with d.daemon.bus.subscribe(frozenset({"gpu.control", "batch.progress"})) as sub:

        async def watch() -> None:
            while True:
                e: Event = await sub.get()
                if isinstance(e, GPUControlChanged) and e.what == "profile" and e.uuid == GPU0:
                    seen.append(e.detail.removeprefix("efficiency profile "))
                if isinstance(e, BatchProgress) and e.completed and "lines" not in seen:
                    seen.append("lines")

        watcher = asyncio.create_task(watch())
        try:
            async with sdk(d) as client:
                made = await client.files.create(
                    file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch"
                )
                batch = await client.batches.create(
                    input_file_id=made.id, endpoint=CHAT, completion_window="24h",
                    metadata={PROFILE_KEY: "quiet"},
                )  # fmt: skip
                done = await until_ended(client, batch.id)
            async with asyncio.timeout(10):
                while seen[-1:] != ["eco"]:
                    await asyncio.sleep(0.05)  # the put-back's event, published as it lands
        finally:
            watcher.cancel()
    assert done.status == "completed" and done.request_counts is not None
    assert done.request_counts.completed == 3
    assert seen == ["quiet", "lines", "eco"]  # the lines ran under quiet; eco is back after
    assert (await d.client.gpus()).profile == "eco"


async def refused(d: RunningDaemon, profile: str, match: str) -> None:
    """A batch asking for ``profile`` is a 400 matching ``match``, and no batch is made."""
    await start_fake(d)
    async with sdk(d) as client:
        made = await client.files.create(
            file=("in.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch"
        )
        with pytest.raises(openai.BadRequestError, match=match):
            await client.batches.create(
                input_file_id=made.id, endpoint=CHAT, completion_window="24h",
                metadata={PROFILE_KEY: profile},
            )  # fmt: skip
        assert (await client.batches.list()).data == []


async def test_an_unknown_profile_is_a_400_and_no_batch(sim_daemon: RunningDaemon) -> None:
    await refused(sim_daemon, "turbo", "no efficiency profile 'turbo'")
    assert (await sim_daemon.client.gpus()).profile is None


async def test_without_gpus_a_profile_is_a_400_saying_so(daemon: RunningDaemon) -> None:
    await refused(daemon, "eco", "need NVIDIA GPUs")
