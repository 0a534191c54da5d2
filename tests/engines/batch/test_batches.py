"""The Batch API through the real daemon and gateway with the FAKE vLLM engine, driven by the
OpenAI SDK's own batch flow: files.create, batches.create, retrieve until completed,
files.content. A failed line lands in the error file with the engine's message; a batch and
its files belong to the key that made them; malformed input is a 400 with no batch stored;
a cancel keeps what finished; the recorder's export runs as a batch."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from engines.gateway.admission import ENGINE_LOW_PRIORITY
from tests.conftest import RunningDaemon
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake
from tests.traylm_cli import traylm

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(r).encode() + b"\n" for r in rows)


def chat_line(custom_id: str, model: str = "fake", **body: Any) -> dict[str, Any]:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": CHAT,
        "body": {"model": model, "messages": HI, "max_tokens": 3, **body},
    }


@pytest.fixture
async def client(daemon: RunningDaemon) -> AsyncIterator[openai.AsyncOpenAI]:
    async with sdk(daemon) as opened:
        yield opened


async def until_ended(client: openai.AsyncOpenAI, batch_id: str) -> Any:
    """The batch once it ended, read as a client would: retrieve until it says so."""
    async with asyncio.timeout(120):
        while True:
            batch = await client.batches.retrieve(batch_id)
            if batch.status in ("completed", "failed", "cancelled", "expired"):
                return batch
            await asyncio.sleep(0.1)


async def lines_of(client: openai.AsyncOpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    content = await client.files.content(file_id)
    return [json.loads(x) for x in content.content.splitlines()]


async def test_the_sdk_batch_flow(daemon: RunningDaemon, client: openai.AsyncOpenAI) -> None:
    await start_fake(daemon)
    rows = [chat_line(f"req-{n}", max_tokens=n + 1) for n in range(5)]
    rows.append(chat_line("missing", model="no-such-model"))
    made = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    batch = await client.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h", metadata={"job": "t"}
    )
    assert batch.object == "batch" and batch.endpoint == CHAT and batch.metadata == {"job": "t"}
    assert batch.request_counts is not None and batch.request_counts.total == 6
    done = await until_ended(client, batch.id)
    assert done.status == "completed" and done.completed_at and done.request_counts
    assert (done.request_counts.completed, done.request_counts.failed) == (5, 1)
    out = await lines_of(client, done.output_file_id)
    assert sorted(r["custom_id"] for r in out) == [f"req-{n}" for n in range(5)]
    first = next(r for r in out if r["custom_id"] == "req-2")
    assert first["error"] is None and first["response"]["status_code"] == 200
    assert first["response"]["body"]["choices"][0]["message"]["content"] == "w0 w1 w2"
    assert first["response"]["request_id"]
    [failed] = await lines_of(client, done.error_file_id)
    assert failed["custom_id"] == "missing" and failed["response"]["status_code"] == 404
    assert "no-such-model" in failed["error"]["message"]
    output_file = await client.files.retrieve(done.output_file_id or "")
    assert output_file.purpose == "batch_output"
    with pytest.raises(openai.BadRequestError, match="not batch input"):
        await client.batches.create(
            input_file_id=output_file.id, endpoint=CHAT, completion_window="24h"
        )
    page = await client.batches.list()
    assert [b.id for b in page.data] == [batch.id]


async def test_list_pages_with_after_and_limit(
    daemon: RunningDaemon, client: openai.AsyncOpenAI
) -> None:
    await start_fake(daemon)
    made = await client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch"
    )
    ids = []
    for _ in range(3):
        b = await client.batches.create(
            input_file_id=made.id, endpoint=CHAT, completion_window="24h"
        )
        ids.append(b.id)
    first = await client.batches.list(limit=2)
    assert [b.id for b in first.data] == ids[::-1][:2] and first.has_more
    rest = await client.batches.list(limit=2, after=first.data[-1].id)
    assert [b.id for b in rest.data] == ids[:1] and not rest.has_more
    every = [b.id async for b in client.batches.list(limit=1)]  # the SDK's own paging
    assert every == ids[::-1]
    for batch_id in ids:
        await until_ended(client, batch_id)


@pytest.mark.parametrize(
    ("content", "endpoint", "words"),
    [
        (b"not json at all\n", CHAT, "line 1: not a JSON object"),
        (jsonl([chat_line("a"), chat_line("a")]), CHAT, "custom_id 'a' is also on line 1"),
        (jsonl([{**chat_line("a"), "url": "/v1/embeddings"}]), CHAT, "is not the batch's"),
        (jsonl([chat_line("a")]), "/v1/moderations", "endpoint must be one of"),
    ],
)
async def test_malformed_input_is_a_400_and_no_batch(
    daemon: RunningDaemon, client: openai.AsyncOpenAI, content: bytes, endpoint: str, words: str
) -> None:
    made = await client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    with pytest.raises(openai.BadRequestError) as caught:
        await client.batches.create(
            input_file_id=made.id,
            endpoint=endpoint,  # type: ignore[arg-type]
            completion_window="24h",
        )
    assert words in str(caught.value)
    assert (await client.batches.list()).data == []
    assert await asyncio.to_thread(daemon.daemon.batches.batches.listed, None, 10) == []


async def test_a_batch_is_its_makers_only(daemon: RunningDaemon) -> None:
    d = daemon
    await start_fake(d)
    keys = [await d.client.add_api_key() for _ in range(2)]

    def keyed(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=d.url + "/v1", api_key=key, max_retries=0)

    async with keyed(keys[0]) as alice, keyed(keys[1]) as bob:
        await _makers_only(alice, bob)


async def _makers_only(alice: openai.AsyncOpenAI, bob: openai.AsyncOpenAI) -> None:
    made = await alice.files.create(
        file=("in.jsonl", io.BytesIO(jsonl([chat_line("a")]))), purpose="batch"
    )
    with pytest.raises(openai.BadRequestError, match="no file"):
        await bob.batches.create(input_file_id=made.id, endpoint=CHAT, completion_window="24h")
    batch = await alice.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h"
    )
    with pytest.raises(openai.NotFoundError):
        await bob.batches.retrieve(batch.id)
    with pytest.raises(openai.NotFoundError):
        await bob.batches.cancel(batch.id)
    assert (await bob.batches.list()).data == []
    done = await until_ended(alice, batch.id)
    with pytest.raises(openai.NotFoundError):
        await bob.files.content(done.output_file_id or "")


async def test_a_cancel_keeps_what_finished(
    daemon: RunningDaemon, client: openai.AsyncOpenAI
) -> None:
    await start_fake(daemon, args="--token-delay 0.05")
    rows = [chat_line(f"r{n}") for n in range(1000)]
    made = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    batch = await client.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h"
    )
    async with asyncio.timeout(60):
        while not (now := await client.batches.retrieve(batch.id)).request_counts or (
            now.request_counts.completed < 5
        ):
            await asyncio.sleep(0.05)
    cancelled = await client.batches.cancel(batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at
    assert cancelled.request_counts is not None
    kept = await lines_of(client, cancelled.output_file_id)
    assert 5 <= len(kept) == cancelled.request_counts.completed < 1000
    assert all(r["response"]["status_code"] == 200 for r in kept)
    again = await client.batches.retrieve(batch.id)
    assert again.status == "cancelled" and again.request_counts == cancelled.request_counts


async def test_a_batch_past_its_window_expires_keeping_what_finished(
    daemon: RunningDaemon, client: openai.AsyncOpenAI
) -> None:
    """A running batch whose window ends stops sending: its answers are kept, every line never
    sent is in the error file as batch_expired; a queued one past its window sends nothing. The
    windows are cut short by hand (the live records the runner reads)."""
    await start_fake(daemon, args="--token-delay 0.05")
    made = []
    for n in (1000, 3):
        rows = [chat_line(f"r{i}") for i in range(n)]
        made.append(
            await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
        )
    running, queued = [
        await client.batches.create(input_file_id=f.id, endpoint=CHAT, completion_window="24h")
        for f in made
    ]
    feature = daemon.daemon.batches
    live = {b.id: await asyncio.to_thread(feature.get, b.id, None) for b in (running, queued)}
    assert all(r is not None for r in live.values())
    live[queued.id]["expires_at"] = 0
    async with asyncio.timeout(60):
        while (await client.batches.retrieve(running.id)).request_counts.completed < 5:
            await asyncio.sleep(0.05)
    live[running.id]["expires_at"] = 0
    ended = await until_ended(client, running.id)
    assert ended.status == "expired" and ended.expired_at
    kept = await lines_of(client, ended.output_file_id)
    expired = await lines_of(client, ended.error_file_id)
    assert 5 <= len(kept) == ended.request_counts.completed < 1000
    assert len(expired) == ended.request_counts.failed == 1000 - len(kept)
    assert {r["error"]["code"] for r in expired} == {"batch_expired"}
    assert {r["custom_id"] for r in kept + expired} == {f"r{i}" for i in range(1000)}
    late = await until_ended(client, queued.id)
    assert late.status == "expired" and late.output_file_id is None
    assert late.request_counts.failed == 3 and late.request_counts.completed == 0


async def test_the_recorders_export_runs_as_a_batch(
    daemon: RunningDaemon, client: openai.AsyncOpenAI, tmp_path: Path
) -> None:
    from tests.engines.recorder.test_recorder import post, recorded

    await start_fake(daemon)
    ids = []
    for n, stream in ((2, False), (3, True)):
        body = {"model": "fake", "messages": HI, "max_tokens": n, "stream": stream}
        _status, rid, _ = await post(daemon, CHAT, body)
        ids.append(rid)
    await recorded(daemon, ids[-1])
    out = tmp_path / "day.jsonl"
    code, said = await traylm("requests", "export", str(out))
    assert code == 0, said
    made = await client.files.create(file=out, purpose="batch")
    batch = await client.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h"
    )
    done = await until_ended(client, batch.id)
    answers = {r["custom_id"]: r for r in await lines_of(client, done.output_file_id)}
    assert sorted(answers) == sorted(ids)
    texts = [answers[i]["response"]["body"]["choices"][0]["message"]["content"] for i in ids]
    assert texts == ["w0 w1", "w0 w1 w2"]  # the streamed one answered whole


async def test_progress_is_in_status_and_events(
    daemon: RunningDaemon, client: openai.AsyncOpenAI
) -> None:
    await start_fake(daemon)
    made = await client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl([chat_line("a"), chat_line("b")]))), purpose="batch"
    )
    opened = asyncio.Event()
    seen: list[Any] = []

    async def watch() -> None:
        async for event in daemon.client.events(["batch"], opened=opened.set):
            seen.append(event)
            if event.kind == "batch.finished":
                return

    watching = asyncio.create_task(watch())
    await opened.wait()
    batch = await client.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h"
    )
    await asyncio.wait_for(watching, 60)
    assert seen[0].kind == "batch.progress" and seen[0].batch_id == batch.id
    assert (seen[0].status, seen[0].total, seen[0].model) == ("in_progress", 2, "fake")
    assert seen[-1].batch_id == batch.id and seen[-1].status == "completed"
    assert (seen[-1].completed, seen[-1].total) == (2, 2)
    assert (await daemon.client.status())["batches"] == []  # none running now


async def fake_stats(d: RunningDaemon, engine_id: str) -> dict[str, Any]:
    engine = d.daemon.engine(engine_id)
    async with aiohttp.ClientSession() as http, http.get(f"{engine.base_url}/fake/stats") as r:
        data: dict[str, Any] = await r.json()
        return data


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
async def test_lines_ask_vllm_for_low_priority_where_it_schedules_by_it(
    daemon: RunningDaemon, client: openai.AsyncOpenAI, policy: str
) -> None:
    """vLLM refuses a ``priority`` unless run with ``--scheduling-policy priority``: the lines
    carry a low one only to an engine that schedules by it; interactive requests none."""
    await start_fake(daemon, extra_flags=["--scheduling-policy", policy])
    await client.chat.completions.create(model="fake", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    made = await client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl([chat_line("a"), chat_line("b")]))), purpose="batch"
    )
    batch = await client.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h"
    )
    done = await until_ended(client, batch.id)
    assert done.request_counts is not None and done.request_counts.completed == 2
    low = ENGINE_LOW_PRIORITY if policy == "priority" else 0
    assert (await fake_stats(daemon, "fake"))["priorities"] == [0, low, low]


async def test_a_queued_batch_cancelled_ends_at_once(
    daemon: RunningDaemon, client: openai.AsyncOpenAI
) -> None:
    """Batches run one at a time; one still waiting its turn is cancelled with nothing run."""
    await start_fake(daemon, args="--token-delay 0.05")
    big = jsonl([chat_line(f"r{n}") for n in range(1000)])
    made = await client.files.create(file=("in.jsonl", io.BytesIO(big)), purpose="batch")
    running, queued = [
        await client.batches.create(input_file_id=made.id, endpoint=CHAT, completion_window="24h")
        for _ in range(2)
    ]
    cancelled = await client.batches.cancel(queued.id)
    assert cancelled.status == "cancelled" and cancelled.request_counts is not None
    assert cancelled.request_counts.completed == 0 and cancelled.output_file_id is None
    assert (await client.batches.retrieve(running.id)).status == "in_progress"
    await client.batches.cancel(running.id)


@pytest.mark.slow
async def test_a_batch_survives_engine_crashes(
    daemon: RunningDaemon, client: openai.AsyncOpenAI
) -> None:
    """The engine SIGKILLs itself every 40 requests; the supervisor starts it again and the
    lines it dropped go again: every line answered, none failed."""
    await start_fake(daemon, args="--crash-after-requests 40 --token-delay 0.01")
    made = await client.files.create(
        file=("in.jsonl", io.BytesIO(jsonl([chat_line(f"r{n}") for n in range(100)]))),
        purpose="batch",
    )
    batch = await client.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h"
    )
    done = await until_ended(client, batch.id)
    errors = await lines_of(client, done.error_file_id)
    assert done.request_counts is not None and done.request_counts.failed == 0, errors[:2]
    assert done.request_counts.completed == 100
    answered = await lines_of(client, done.output_file_id)
    assert sorted(r["custom_id"] for r in answered) == sorted(f"r{n}" for n in range(100))
