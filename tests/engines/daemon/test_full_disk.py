"""A full disk under traylm's data folder, for real: a small tmpfs mounted as the data folder of a
real daemon, filled with a file while it runs, then emptied. Chats, the chat window's streamed
request and the usage log answer 507 naming the folder, log one line and no traceback, keep
what they could not write in memory, and write it once there is room."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from engines.config.live import LiveSettings
from engines.config.sections import Paths, Settings
from engines.core.procs import free_loopback_port
from engines.core.store import Store
from engines.errors import ControlAPIError, DiskFull
from engines.events import Notice
from engines.gateway.service import CHAT_REPLY_HEADER, TOKEN_HEADER
from engines.gateway.usage import UsageRecord, UsageRecorder
from engines.gpu.history import TelemetryHistory
from engines.gpu.sim import ManualClock, SimulatedBackend
from tests.conftest import DaemonFactory, RunningDaemon
from tests.data_disk import DataDisk, tmpfs_data_folder
from tests.engines.cli.test_cli import traylm
from tests.engines.gateway.test_daemon_gateway import start_fake


@pytest.fixture
def data_disk(paths: Paths) -> Iterator[DataDisk]:
    """Set up before the daemon (list it before daemon_factory), unmounted after it stopped."""
    with tmpfs_data_folder(paths) as disk:
        yield disk


@pytest.fixture
async def served(
    data_disk: DataDisk, daemon_factory: DaemonFactory, fake_env: Path
) -> AsyncIterator[RunningDaemon]:
    d: RunningDaemon = await daemon_factory()
    yield d


async def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.exc_info]


def full_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The store's lines saying the disk is full (the flight recorder, whose requests.db is on
    the same disk, says once of its own that its recording paused)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith("the disk holding traylm's data folder")
    ]


async def disk_status(d: RunningDaemon) -> dict[str, Any]:
    status: dict[str, Any] = (await d.client.status())["disk"]
    return status


async def test_chats_answer_507_naming_the_folder_and_work_again_once_there_is_room(
    served: RunningDaemon, data_disk: DataDisk, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    await start_fake(served)
    c = served.client
    chat = await c.create_chat(model="fake")
    with served.daemon.bus.subscribe(frozenset({"notice"})) as notices:
        data_disk.fill()
        with pytest.raises(ControlAPIError) as created:
            await c.create_chat(model="fake")
        notice = await asyncio.wait_for(notices.get(), 10)
    with pytest.raises(ControlAPIError) as added:
        await c.add_chat_messages(chat.chat_id, [{"role": "user", "content": "hi"}])
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            served.url + "/v1/chat/completions",
            json={"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True},
            headers={CHAT_REPLY_HEADER: f"{chat.chat_id}:1", TOKEN_HEADER: served.daemon.token},
        ) as streamed,
    ):
        body = await streamed.json()
    for error in (created.value, added.value):
        assert (error.http_status, error.code) == (507, "disk_full")
        assert str(served.paths.data_dir) in error.message and "traylm models rm" in error.message
    assert streamed.status == 507 and body["error"]["code"] == "disk_full"
    assert str(served.paths.data_dir) in body["error"]["message"]
    assert isinstance(notice, Notice) and notice.level == "warning"
    assert notice.source == "disk_full" and str(served.paths.data_dir) in notice.message
    status = await disk_status(served)
    assert status["full"] and str(served.paths.data_dir) in status["message"]
    shown = await asyncio.to_thread(traylm, dict(os.environ), "status")
    assert shown.returncode == 0, shown.stderr
    assert (
        f"DISK FULL: the disk holding traylm's data folder {served.paths.data_dir}" in shown.stdout
    )
    assert len(full_lines(caplog)) == 1  # one line for the whole time the disk is full
    assert tracebacks(caplog) == []

    data_disk.free()
    again = await c.create_chat(model="fake", title="after")
    assert (await c.chat(again.chat_id)).chat.title == "after" and again.chat_id != chat.chat_id
    assert not (await disk_status(served))["full"]
    assert tracebacks(caplog) == []


async def test_usage_rows_of_a_full_disk_are_written_once_there_is_room(
    served: RunningDaemon, data_disk: DataDisk, caplog: pytest.LogCaptureFixture
) -> None:
    await start_fake(served)
    await served.daemon.usage.flush()
    before = len(await asyncio.to_thread(served.daemon.store.query, "SELECT id FROM usage"))
    data_disk.fill()
    async with aiohttp.ClientSession() as http:
        for i in range(5):
            body = {"model": "fake", "messages": [{"role": "user", "content": f"{i}"}]}
            async with http.post(served.url + "/v1/chat/completions", json=body) as r:
                assert r.status == 200

    async def refused_and_kept() -> bool:
        s = await disk_status(served)
        return bool(s["full"] and s["usage_rows_waiting"] == 5)

    await wait_until(refused_and_kept, "the usage log's writer to find the disk full")
    data_disk.free()

    async def written() -> bool:
        rows = await asyncio.to_thread(served.daemon.store.query, "SELECT model FROM usage")
        return len(rows) == before + 5

    await wait_until(written, "the kept usage rows to be written")
    status = await disk_status(served)
    assert not status["full"] and status["usage_rows_waiting"] == 0
    assert status["usage_rows_dropped"] == 0
    assert len(full_lines(caplog)) == 1 and tracebacks(caplog) == []


async def test_a_reply_the_disk_filled_under_is_marked_complete_once_it_can_be_saved(
    served: RunningDaemon, data_disk: DataDisk, caplog: pytest.LogCaptureFixture
) -> None:
    await start_fake(served, args="--token-delay 0.02")
    c = served.client
    chat = await c.create_chat(model="fake")
    await c.add_chat_messages(chat.chat_id, [{"role": "user", "content": "tell me"}])
    got = b""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            served.url + "/v1/chat/completions",
            json={
                "model": "fake",
                "messages": [{"role": "user", "content": "tell me"}],
                "stream": True,
                "max_tokens": 60,
            },
            headers={CHAT_REPLY_HEADER: f"{chat.chat_id}:1", TOKEN_HEADER: served.daemon.token},
        ) as r,
    ):
        assert r.status == 200
        async for line in r.content:
            got += line
            if got.count(b"data: {") == 5:
                data_disk.fill()  # mid-stream
    assert got.rstrip().endswith(b"data: [DONE]")  # the client got it whole
    relayed = "".join(
        json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in got.decode().split("\n")
        if line.startswith("data: {")
    )

    async def kept_back() -> bool:
        return bool((await disk_status(served))["replies_waiting"] == 1)

    await wait_until(kept_back, "the reply's end to be kept back")
    assert (await c.chat(chat.chat_id)).messages[1].finish_reason == "interrupted"
    data_disk.free()

    async def saved() -> bool:
        return (await c.chat(chat.chat_id)).messages[1].finish_reason == "stop"

    await wait_until(saved, "the reply to be marked complete")
    reply = (await c.chat(chat.chat_id)).messages[1]
    assert reply.content == relayed and relayed.split()[-1] == "w59"
    assert (await disk_status(served))["replies_waiting"] == 0
    assert len(full_lines(caplog)) == 1 and tracebacks(caplog) == []


async def test_usage_rows_kept_for_a_full_disk_are_bounded(
    data_disk: DataDisk, paths: Paths
) -> None:
    store = Store(paths.db_path)
    await asyncio.to_thread(store.open)
    usage = UsageRecorder(
        store, LiveSettings(Settings(), config_file=paths.config_file), max_pending=3
    )

    def record(model: str) -> None:
        usage.record(UsageRecord(model, "e", "/v1/completions", False, 200, 1, 1, 0.1))

    try:
        data_disk.fill()
        for i in range(5):
            record(f"r{i}")
        with pytest.raises(DiskFull):
            await usage.flush()
        record("r5")
        assert (usage.waiting, usage.dropped) == (3, 3)  # the newest kept, the oldest counted
        data_disk.free()
        await usage.flush()
        rows = await asyncio.to_thread(store.query, "SELECT model FROM usage ORDER BY id")
        assert [r["model"] for r in rows] == ["r3", "r4", "r5"] and usage.waiting == 0
    finally:
        store.close()


def test_a_daemon_started_on_a_full_disk_says_so_and_exits(
    data_disk: DataDisk, paths: Paths, env: dict[str, str]
) -> None:
    store = Store(paths.db_path)  # a database from an earlier run
    store.open()
    store.close()
    data_disk.fill()
    out = traylm(env, "serve", "--port", str(free_loopback_port()))
    assert out.returncode == 1
    assert f"traylm: the disk holding traylm's data folder {paths.data_dir} is full" in out.stderr
    assert "Traceback" not in out.stderr


def test_telemetry_history_goes_on_without_its_rows_while_the_disk_is_full(
    data_disk: DataDisk, paths: Paths
) -> None:
    store = Store(paths.db_path)
    store.open()
    clock = ManualClock(start_s=time.time() // 10 * 10)
    sim = SimulatedBackend(1, clock=clock, wall=clock)
    history = TelemetryHistory(store, resolution_s=1, keep_days=7)
    try:
        history.add(sim.sample())
        data_disk.fill()
        clock.advance(1)
        assert history.add(sim.sample()) == 0  # a completed second, not kept (no error)
        assert store.full is not None
        data_disk.free()
        clock.advance(1)
        assert history.add(sim.sample()) == 1 and store.full is None
    finally:
        store.close()


async def test_a_response_made_while_the_disk_is_full_is_held_then_written(
    served: RunningDaemon, data_disk: DataDisk, caplog: pytest.LogCaptureFixture
) -> None:
    """The Responses API on a full disk: the reply's id exists (retrieve and
    previous_response_id read it from memory), and it is written once there is room (it was
    a 200 with an id that never existed, then or after)."""
    await start_fake(served)
    client = openai.AsyncOpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    try:
        data_disk.fill()
        made = await client.responses.create(model="fake", input="hi", max_output_tokens=2)
        assert (await client.responses.retrieve(made.id)).output_text == "w0 w1"
        chained = await client.responses.create(
            model="fake", input="more", previous_response_id=made.id, max_output_tokens=1
        )
        assert chained.previous_response_id == made.id
        assert (await client.responses.retrieve(chained.id)).previous_response_id == made.id
        kept = served.daemon.requests.responses
        assert kept.held == 2 and kept.dropped == 0
        data_disk.free()
        await served.daemon.requests.responses.flush()
        assert kept.held == 0
        rows = await asyncio.to_thread(
            _kept_ids, served.daemon.requests.store.path, (made.id, chained.id)
        )
        assert rows == {made.id, chained.id}
        assert (await client.responses.retrieve(chained.id)).output_text == "w0"
    finally:
        await client.close()
    assert tracebacks(caplog) == []


def _kept_ids(db_path: Path, ids: tuple[str, ...]) -> set[str]:
    with contextlib.closing(sqlite3.connect(db_path)) as db:
        marks = ",".join("?" * len(ids))
        found = db.execute(f"SELECT response_id FROM responses WHERE response_id IN ({marks})", ids)
        return {str(row[0]) for row in found}
