"""The flight recorder's parts on a real SQLite file: memory bounded while the disk is slow
(bodies dropped first, counted, ``record`` never waits), a full disk pausing recording with a
warning, retention by age and size, and replies assembled from every API's stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.config.live import LiveSettings
from engines.config.sections import RequestsSettings, Settings
from engines.gateway.exchange import Exchange, ReplyCapture
from engines.recorder import service
from engines.recorder.assemble import row_of
from engines.recorder.service import RequestRecorder
from engines.recorder.store import ADDED_COLUMNS, SCHEMA, WAL_LIMIT_BYTES, RecorderStore


def settings(tmp_path: Path, **requests: object) -> LiveSettings:
    values = Settings(requests=RequestsSettings(**requests))  # type: ignore[arg-type]
    return LiveSettings(values, config_file=tmp_path / "config.toml")


def exchange(
    n: int, body: bytes = b"{}", capture: str = "full", limit: int = 1 << 20, model: str = "m"
) -> Exchange:
    ex = Exchange(
        id=f"req_{n:024x}",
        arrived_s=time.time(),
        started=time.perf_counter(),
        method="POST",
        path="/v1/chat/completions",
        client="local",
        peer="",
        key="",
        capture=capture,
        body_limit=limit,
    )
    ex.asked(model, body, "application/json", stream=False)
    return ex


def sse(*events: object) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)


async def test_a_slow_disk_keeps_memory_bounded_and_never_blocks(tmp_path: Path) -> None:
    rec = RequestRecorder(
        tmp_path / "requests.db", settings(tmp_path), max_pending_bytes=2 * 1024 * 1024
    )
    await rec.start()
    try:
        stalled = threading.Event()
        release = threading.Event()

        def hold_the_disk() -> None:
            with rec.store._lock:  # a write that takes long: the disk is slow
                stalled.set()
                release.wait(10)

        holder = threading.Thread(target=hold_the_disk)
        holder.start()
        stalled.wait(5)
        body = b'{"x": "' + b"y" * 100_000 + b'"}'
        began = time.perf_counter()
        for n in range(200):  # 20 MB of bodies while nothing can be written
            rec.record(exchange(n, body))
            await asyncio.sleep(0)
        took_s = time.perf_counter() - began
        held = rec._pending_bytes + rec._writing_bytes
        assert held <= 2 * 1024 * 1024 + 200 * 5 * 1024  # bodies up to the bound, then metadata
        assert rec.bodies_dropped > 150 and rec.dropped == 0
        assert took_s < 5  # record() never waited for the disk
        release.set()
        holder.join()
        deadline = time.monotonic() + 10
        while rec.written < 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        rows = await rec.summaries(limit=1000)
        assert len(rows) == 200
        assert {r["capture"] for r in rows} == {"full", "metadata"}
    finally:
        await rec.stop()


async def test_a_full_disk_pauses_recording_with_a_warning(tmp_path: Path) -> None:
    rec = RequestRecorder(tmp_path / "requests.db", settings(tmp_path), period_s=0.05)
    await rec.start()
    try:
        with rec.store.connection() as db:  # SQLite's own "database or disk is full" (SQLITE_FULL)
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            db.execute(f"PRAGMA max_page_count = {pages + 2}")
        rec.record(exchange(1, b'{"x": "' + b"y" * 200_000 + b'"}'))
        deadline = time.monotonic() + 10
        while not rec.paused and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        status = rec.status()
        assert "recording paused" in status["warning"] and "full" in status["warning"]
        assert status["dropped"] == 1
        rec.record(exchange(2))  # serving goes on: recording only drops while paused
        assert rec.status()["pending"] <= 1
    finally:
        await rec.stop()


async def test_retention_by_age_and_size(tmp_path: Path) -> None:
    rec = RequestRecorder(tmp_path / "requests.db", settings(tmp_path, max_mib=1, days=1))
    await rec.start()
    try:
        old = exchange(0)
        old.arrived_s = time.time() - 2 * 86400
        rec.record(old)
        for n in range(1, 8):  # 7 × 300 KB: past the 1 MiB cap
            rec.record(exchange(n, b'{"x": "' + b"y" * 300_000 + b'"}'))
        await rec.flush()
        rec.prune(time.time())  # (the writer prunes too, as soon as a tenth of the cap came)
        rows = await rec.summaries(limit=100)
        assert [r["id"] for r in rows] == [f"req_{n:024x}" for n in (7, 6, 5)]
        assert await asyncio.to_thread(rec.store.total_bytes) <= 1024 * 1024
    finally:
        await rec.stop()


def test_streams_of_every_api_are_assembled() -> None:
    chat = exchange(1)
    tap = ReplyCapture(chat, None)
    tap.feed(sse({"choices": [{"delta": {"reasoning_content": "think "}}]}))
    tap.feed(
        sse(
            {
                "choices": [
                    {
                        "delta": {
                            "tool_calls": [
                                {
                                    "index": 0,
                                    "id": "c1",
                                    "function": {"name": "get", "arguments": '{"a"'},
                                }
                            ]
                        }
                    }
                ]
            },
            {
                "choices": [
                    {
                        "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ": 1}"}}]},
                        "finish_reason": "tool_calls",
                    }
                ]
            },
        )
    )
    chat.answered(200, None)
    row = row_of(chat)
    reply = json.loads(row["reply_json"])
    assert reply["reasoning"] == "think "
    assert reply["tool_calls"][0]["function"] == {"name": "get", "arguments": '{"a": 1}'}
    assert row["finish_reason"] == "tool_calls" and row["ttft_s"] is not None

    claude = exchange(2, b'{"max_tokens": 50}')
    tap = ReplyCapture(claude, None)
    tap.feed(
        sse(
            {"type": "message_start", "message": {"usage": {"input_tokens": 7}}},
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "thinking_delta", "thinking": "hm"},
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "text_delta", "text": "hello"},
            },
            {"type": "message_delta", "delta": {"stop_reason": "max_tokens"}},
        )
    )
    claude.answered(200, None)
    row = row_of(claude)
    assert json.loads(row["reply_json"]) == {"text": "hello", "reasoning": "hm"}
    assert row["finish_reason"] == "max_tokens" and row["cut_by"] == "max_tokens"

    short = exchange(3, b'{"max_tokens": 100}')
    tap = ReplyCapture(short, None)
    tap.feed(sse({"choices": [{"text": "ab", "finish_reason": "length"}],
                  "usage": {"prompt_tokens": 4090, "completion_tokens": 6}}))  # fmt: skip
    short.answered(200, None)
    assert row_of(short)["cut_by"] == "context"  # stopped for length short of max_tokens


def test_a_delta_with_text_and_more_keeps_both() -> None:
    """Most chat deltas carry only text (the fast path); one with reasoning or a tool call
    beside its text keeps them too."""
    ex = exchange(1)
    tap = ReplyCapture(ex, None)
    tap.feed(sse({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
    tap.feed(sse({"choices": [{"delta": {"content": "a", "reasoning_content": "r"}}]}))
    tap.feed(sse({"choices": [{"delta": {"content": "b", "tool_calls": [{"id": "c"}]}}]}))
    ex.answered(200, None)
    reply = json.loads(row_of(ex)["reply_json"])
    assert reply["text"] == "ab" and reply["reasoning"] == "r"
    assert reply["tool_calls"][0]["id"] == "c"


def test_an_event_that_does_not_parse_leaves_the_others() -> None:
    """The events are parsed as one array; one bad event falls back to each on its own."""
    ex = exchange(1)
    tap = ReplyCapture(ex, None)
    tap.feed(sse({"choices": [{"delta": {"content": "one "}}]}))
    tap.feed(b'data: {"choices": [{"delta": {"content": "cut\n\n')
    tap.feed(sse({"choices": [{"delta": {"content": "two"}, "finish_reason": "stop"}]}))
    ex.answered(200, None)
    row = row_of(ex)
    assert json.loads(row["reply_json"])["text"] == "one two" and row["finish_reason"] == "stop"


def test_a_long_reply_is_cut_with_a_marker() -> None:
    ex = exchange(1, limit=1024)
    tap = ReplyCapture(ex, None)
    for _ in range(2000):
        tap.feed(sse({"choices": [{"delta": {"content": "word "}}]}))
    tap.feed(sse({"choices": [{"delta": {}, "finish_reason": "stop"}]}))
    ex.answered(200, None)
    row = row_of(ex)
    reply = json.loads(row["reply_json"])
    assert reply["cut"] and "[cut by traylm:" in reply["text"]
    assert row["finish_reason"] == "stop"  # the tail is always kept
    assert len(ex.reply) <= 4 * 1024


@pytest.fixture
def store(tmp_path: Path) -> Iterator[RecorderStore]:
    """requests.db opened in the test's folder, closed after it."""
    opened = RecorderStore(tmp_path / "requests.db")
    opened.open()
    yield opened
    opened.close()


def test_a_lone_surrogate_is_stored_escaped_and_takes_no_other_row_with_it(
    store: RecorderStore,
) -> None:
    batch = [
        exchange(1, model="\ud800"),
        exchange(2, body='{"q": "\udfff"}'.encode("utf-8", "surrogatepass")),
    ]
    assert store.write([row_of(ex) for ex in batch]) > 0
    models = {r["rid"]: r["model"] for r in store.rows()}
    assert models == {batch[0].id: "\\ud800", batch[1].id: "m"}


def test_one_row_sqlite_refuses_is_left_out_alone(store: RecorderStore) -> None:
    good, bad = row_of(exchange(1)), row_of(exchange(2))
    bad["status"] = 1 << 70  # no SQLite integer holds it
    store.write([good, bad])
    assert [r["rid"] for r in store.rows()] == [good["rid"]]


def test_the_write_ahead_log_shrinks_after_a_large_batch(
    store: RecorderStore, tmp_path: Path
) -> None:
    big = b"x" * (1 << 20)
    store.write([row_of(exchange(n, body=big, limit=1 << 21)) for n in range(40)])
    wal = tmp_path / "requests.db-wal"
    assert wal.stat().st_size > WAL_LIMIT_BYTES  # one transaction of 40 MiB
    store.write([row_of(exchange(99))])  # the next writer resets the log
    assert wal.stat().st_size <= WAL_LIMIT_BYTES


async def test_a_lone_surrogate_is_stored_escaped_beside_the_others(tmp_path: Path) -> None:
    rec = RequestRecorder(tmp_path / "requests.db", settings(tmp_path))
    await rec.start()
    try:
        bad = exchange(1)
        bad.model = "\ud800"  # a client's JSON "\ud800": not valid Unicode
        rec.record(bad)
        rec.record(exchange(2))  # another client's request of the same second
        await rec.flush()
        rows = {r["id"]: r for r in await rec.summaries(limit=10)}
        assert set(rows) == {f"req_{n:024x}" for n in (1, 2)}
        assert rows[f"req_{1:024x}"]["model"] == "\\ud800"
        assert rec.status()["dropped"] == 0
    finally:
        await rec.stop()


async def test_status_says_resumed_once_the_disk_has_room(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "RETRY_FULL_S", 0.3)
    rec = RequestRecorder(tmp_path / "requests.db", settings(tmp_path), period_s=0.05)
    await rec.start()
    try:
        with rec.store.connection() as db:  # SQLite's own "database or disk is full"
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            db.execute(f"PRAGMA max_page_count = {pages + 2}")
        rec.record(exchange(1, b'{"x": "' + b"y" * 200_000 + b'"}'))
        deadline = time.monotonic() + 10
        while not rec.paused and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert "recording paused" in rec.status()["warning"]
        with rec.store.connection() as db:  # the disk freed
            db.execute("PRAGMA max_page_count = 1073741823")
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            rec.record(exchange(2))
            await asyncio.sleep(0.1)
            if any(r["id"] == f"req_{2:024x}" for r in await rec.summaries(limit=5)):
                break
        assert any(r["id"] == f"req_{2:024x}" for r in await rec.summaries(limit=5))
        assert rec.status()["warning"] == ""
    finally:
        await rec.stop()


def test_a_requests_db_made_before_cached_tokens_gets_the_new_columns(tmp_path: Path) -> None:
    old = SCHEMA.replace("    cached_tokens INTEGER,\n", "").replace(
        "    conversation TEXT NOT NULL DEFAULT '',\n", ""
    )
    path = tmp_path / "requests.db"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(old)
    store = RecorderStore(path)
    store.open()
    try:
        with store.connection() as db:
            have = {row[1] for row in db.execute("PRAGMA table_info(requests)")}
        assert set(ADDED_COLUMNS) <= have
        assert store.rows() == []
    finally:
        store.close()
