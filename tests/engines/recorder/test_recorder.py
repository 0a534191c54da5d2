"""The flight recorder through the real daemon and gateway, with the FAKE vLLM engine: every
API route recorded with its reply, failures (engine 400, unknown model, client gone
mid-stream), the 20 MB body cut with a marker, x-request-id on every answer, the CLI's show,
export → bench workload, the templated prompt, a corrupt database set aside."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import sqlite3
import stat
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import pytest

from engines.config.sections import RequestsSettings
from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from tests.conftest import DaemonFactory, RunningDaemon, fast_settings
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake
from tests.traylm_cli import traylm

HI = [{"role": "user", "content": "hi"}]


async def recorded(d: RunningDaemon, rid: str, timeout_s: float = 10.0) -> dict[str, Any]:
    """The record of ``rid`` once the recorder has written it."""
    deadline = time.monotonic() + timeout_s
    while True:
        await d.daemon.requests.flush()
        try:
            return await d.client.request_detail(rid)
        except ControlAPIError as exc:
            if exc.http_status != 404 or time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def post(d: RunningDaemon, path: str, body: Any, **kw: Any) -> tuple[int, str, bytes]:
    async with aiohttp.ClientSession() as http, http.post(d.url + path, json=body, **kw) as r:
        return r.status, r.headers.get("x-request-id", ""), await r.read()


async def test_every_api_route_is_recorded_with_its_reply(daemon: RunningDaemon) -> None:
    d = daemon
    await start_fake(d)
    client = sdk(d)
    raw = await client.chat.completions.with_raw_response.create(
        model="fake", messages=HI, max_tokens=3
    )
    rid = raw.headers["x-request-id"]
    row = await recorded(d, rid)
    assert row["status"] == 200 and row["path"] == "/v1/chat/completions"
    assert row["model"] == "fake" and row["engine_id"] == "fake" and row["gpus"] == "cpu"
    assert row["reply"]["text"] == "w0 w1 w2" and row["finish_reason"] == "length"
    assert row["cut_by"] == "max_tokens" and row["completion_tokens"] == 3
    assert row["client"] == "local" and json.loads(row["request_body"])["messages"] == HI
    assert not row["stream"] and row["ttft_s"] is None

    stream = await client.chat.completions.with_raw_response.create(
        model="fake", messages=HI, max_tokens=4, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream.parse()])
    row = await recorded(d, stream.headers["x-request-id"])
    assert row["stream"] and row["reply"]["text"] == text and text.split()[-1] == "w3"
    assert row["ttft_s"] is not None and row["ttft_s"] <= row["duration_s"]

    done = await client.completions.with_raw_response.create(
        model="fake", prompt="hi", max_tokens=2
    )
    row = await recorded(d, done.headers["x-request-id"])
    assert row["path"] == "/v1/completions" and row["reply"]["text"] == "w0 w1"

    made = await client.responses.with_raw_response.create(
        model="fake", input="hi", max_output_tokens=3
    )
    row = await recorded(d, made.headers["x-request-id"])
    assert row["path"] == "/v1/responses" and row["reply"]["text"] == "w0 w1 w2"

    events = await client.responses.with_raw_response.create(model="fake", input="hi", stream=True)
    async for _ in events.parse():
        pass
    row = await recorded(d, events.headers["x-request-id"])
    assert row["stream"] and row["reply"]["text"].startswith("w0 w1")

    claude = anthropic.AsyncAnthropic(base_url=d.url, api_key="x", max_retries=0)
    msg = await claude.messages.with_raw_response.create(model="fake", max_tokens=3, messages=HI)
    await claude.close()
    row = await recorded(d, msg.headers["x-request-id"])
    assert row["path"] == "/v1/messages" and row["reply"]["text"] == "w0 w1 w2"
    assert row["finish_reason"] == "max_tokens"

    emb = await client.embeddings.with_raw_response.create(model="fake", input=["a", "b"])
    row = await recorded(d, emb.headers["x-request-id"])
    assert row["path"] == "/v1/embeddings" and row["status"] == 200 and row["reply_size"] > 0

    audio = await client.audio.transcriptions.with_raw_response.create(
        model="fake", file=("a.wav", b"RIFF" + bytes(100), "audio/wav")
    )
    row = await recorded(d, audio.headers["x-request-id"])
    assert row["path"] == "/v1/audio/transcriptions" and row["model"] == "fake"
    assert row["content_type"].startswith("multipart/form-data")
    assert "w0 w1 (104 bytes)" in row["reply_body"]

    status, rid, _ = await post(
        d, "/v1/rerank", {"model": "fake", "query": "q", "documents": ["a", "b"]}
    )
    row = await recorded(d, rid)
    assert status == 200 and row["path"] == "/v1/rerank" and '"index"' in row["reply_body"]
    await client.close()

    listed = await d.client.requests_list(limit=100)
    assert len(listed) == 9 and all(r["id"].startswith("req_") for r in listed)
    found = await d.client.requests_list(text="w0 w1 w2 w3")
    assert {r["path"] for r in found} == {"/v1/chat/completions", "/v1/responses"}
    assert await d.client.requests_list(text="not said by anyone") == []
    assert len(await d.client.requests_list(status="error")) == 0
    db = d.paths.data_dir / "requests.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


async def test_failures_are_recorded_and_every_answer_has_an_id(daemon: RunningDaemon) -> None:
    d = daemon
    await start_fake(d)
    # the engine's own 400 (past the FAKE model's context)
    status, rid, body = await post(
        d, "/v1/chat/completions", {"model": "fake", "messages": HI, "max_tokens": 2 * 10**6}
    )
    assert status == 400 and rid
    row = await recorded(d, rid)
    assert row["status"] == 400 and row["error"] and row["error"] in body.decode()
    assert row["engine_id"] == "fake"
    # unknown model: 404 from the gateway, recorded, id in the answer
    status, rid, _ = await post(d, "/v1/chat/completions", {"model": "nope", "messages": HI})
    row = await recorded(d, rid)
    assert status == 404 and row["status"] == 404 and "nope" in row["error"]
    # the gateway's own errors carry an id too, and so do the control API and /health
    status, rid, _ = await post(d, "/v1/nothing", {})
    assert status == 404 and rid.startswith("req_")
    async with aiohttp.ClientSession() as http:
        async with http.get(d.url + "/health") as r:
            assert r.headers["x-request-id"].startswith("req_")
        async with http.get(d.url + "/api/status") as r:  # 401 without the token
            assert r.status == 401 and r.headers["x-request-id"].startswith("req_")
    # `traylm requests show <id>` finds the request from a client's error
    code, out = await traylm("requests", "show", rid, "--json")
    assert code == 0, out
    assert json.loads(out)["id"] == rid
    code, out = await traylm("requests", "show", "bad id")
    assert code == 1 and "is not a request id" in out and "Traceback" not in out


async def test_a_request_that_loads_its_model_is_recorded(daemon: RunningDaemon) -> None:
    """JIT: the model loads on the request (SSE comments meanwhile), then the stream comes."""
    d = daemon
    d.write_profile("cold", model="org/cold", served_name="cold", device="cpu")
    body = {"model": "cold", "messages": HI, "max_tokens": 3, "stream": True}
    status, rid, data = await post(d, "/v1/chat/completions", body)
    assert status == 200 and b"w2" in data and rid
    row = await recorded(d, rid)
    assert (row["status"], row["engine_id"], row["stream"]) == (200, "cold", True)
    assert row["reply"]["text"].split() == ["w0", "w1", "w2"]


@pytest.mark.slow
async def test_ls_and_tail_follow(daemon: RunningDaemon) -> None:
    d = daemon
    await start_fake(d)
    _, first, _ = await post(d, "/v1/chat/completions", {"model": "fake", "messages": HI})
    await recorded(d, first)
    code, out = await traylm("requests", "ls")
    assert code == 0 and first in out and "/v1/chat/completions" in out
    code, out = await traylm("requests", "ls", "--json", "--status", "error")
    assert code == 0 and json.loads(out) == []
    tail = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "engines", "requests", "tail", "-f",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        assert tail.stdout is not None
        line = await asyncio.wait_for(tail.stdout.readline(), 30)
        assert line.startswith(first.encode())  # what came before, then what comes
        _, second, _ = await post(d, "/v1/completions", {"model": "fake", "prompt": "x"})
        line = await asyncio.wait_for(tail.stdout.readline(), 30)
        assert line.startswith(second.encode()) and b"/v1/completions" in line
    finally:
        tail.terminate()
        await tail.wait()


async def test_a_client_gone_mid_stream_is_499_with_what_was_sent(daemon: RunningDaemon) -> None:
    d = daemon
    await start_fake(d, args="--token-delay 0.05")
    body = {"model": "fake", "messages": HI, "max_tokens": 200, "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(d.url + "/v1/chat/completions", json=body) as r,
    ):
        rid = r.headers["x-request-id"]
        seen = b""
        while b"w2" not in seen:
            seen += await r.content.readany()
        r.connection.transport.abort()  # type: ignore[union-attr]
    row = await recorded(d, rid)
    assert row["status"] == 499
    assert row["reply"]["text"].startswith("w0 w1 w2")
    assert len(row["reply"]["text"].split()) < 200


async def test_a_20_mb_body_is_recorded_cut_with_a_marker(
    daemon_factory: DaemonFactory, fake_env: Path
) -> None:
    settings = fast_settings(free_loopback_port(), max_body_bytes=32 * 1024 * 1024)
    d: RunningDaemon = await daemon_factory(settings)
    await start_fake(d)
    big = "x" * (20 * 1024 * 1024)
    body = {"model": "fake", "messages": [{"role": "user", "content": big}], "max_tokens": 1}
    data = io.BytesIO(json.dumps(body).encode())  # aiohttp warns of a 20 MB bytes body
    headers = {"Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(d.url + "/v1/chat/completions", data=data, headers=headers) as r,
    ):
        rid = r.headers["x-request-id"]
    row = await recorded(d, rid)
    assert row["request_cut"] and row["request_size"] > 20 * 1024 * 1024
    limit = RequestsSettings().body_max_bytes
    assert "[cut by traylm:" in row["request_body"][limit - 10 :]
    assert len(row["request_body"]) < limit + 200
    lines = [json.loads(x) async for x in d.client.requests_export()]
    assert lines == [{"traylm_skipped": 1}]  # a cut body is never replayed as if whole
    with pytest.raises(Exception, match="cut when recorded"):
        await d.client.replay_request(rid)


async def test_capture_metadata_keeps_no_bodies(
    daemon_factory: DaemonFactory, fake_env: Path
) -> None:
    settings = fast_settings(free_loopback_port())
    settings = dataclasses.replace(settings, requests=RequestsSettings(capture="metadata"))
    d: RunningDaemon = await daemon_factory(settings)
    await start_fake(d)
    status, rid, _ = await post(
        d, "/v1/chat/completions", {"model": "fake", "messages": HI, "max_tokens": 2}
    )
    row = await recorded(d, rid)
    assert status == 200 and row["capture"] == "metadata"
    assert row["request_body"] == "" and row["reply"] is None and row["reply_body"] == ""
    assert row["completion_tokens"] == 2 and row["finish_reason"] == "length"


async def test_export_replay_and_bench_workload(daemon: RunningDaemon, tmp_path: Path) -> None:
    d = daemon
    await start_fake(d)
    ids = []
    for n in (2, 3):
        _status, rid, _ = await post(
            d, "/v1/chat/completions", {"model": "fake", "messages": HI, "max_tokens": n}
        )
        ids.append(rid)
    await recorded(d, ids[-1])
    out = tmp_path / "day.jsonl"
    code, said = await traylm("requests", "export", str(out))
    assert code == 0 and "exported 2 requests" in said, said
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["custom_id"] for x in lines] == ids
    assert lines[0]["method"] == "POST" and lines[0]["url"] == "/v1/chat/completions"
    assert lines[0]["body"]["max_tokens"] == 2 and lines[0]["traylm"]["arrived_at_s"] > 0
    replayed = await d.client.replay_request(ids[1])
    assert replayed["status"] == 200 and replayed["request_id"] not in ids
    row = await recorded(d, replayed["request_id"])
    assert row["reply"]["text"] == "w0 w1 w2"
    # the export as a benchmark workload: both requests sent again through the gateway
    code, said = await traylm(
        "bench", "run", "--model", "fake", "--workload", str(out), "--as-fast-as-possible"
    )
    assert code == 0, said
    [run] = await d.client.bench_runs()
    level = (await d.client.bench_run(run.id)).levels[0]
    assert (run.workload, level.completed, level.failed) == ("file", 2, 0)
    assert level.output_tokens == 2 + 3

    async def streamed() -> list[dict[str, Any]]:
        await d.daemon.requests.flush()
        return [r for r in await d.client.requests_list(limit=10) if r["stream"]]

    deadline = time.monotonic() + 10  # the bench's last requests may still be on their way
    while len(await streamed()) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert len(await streamed()) == 2  # the bench streams chat requests to time the first token


async def test_the_export_holds_what_was_answered_a_moment_ago(daemon: RunningDaemon) -> None:
    """The recorder writes in batches; an export (the tuner's "my recorded traffic") taken
    right after a reply holds it all the same."""
    await start_fake(daemon)
    _status, rid, _ = await post(
        daemon, "/v1/chat/completions", {"model": "fake", "messages": HI, "max_tokens": 2}
    )
    lines = [json.loads(line) async for line in daemon.client.requests_export()]
    assert [x.get("custom_id") for x in lines] == [rid, None]  # and the count left out


async def test_a_600_kib_body_is_exported_whole_by_the_cli(
    daemon: RunningDaemon, tmp_path: Path
) -> None:
    """A recorded row longer than aiohttp's line buffer (512 KiB) through the real CLI."""
    await start_fake(daemon)
    big = "y" * (600 * 1024)
    msgs = [{"role": "user", "content": big}]
    _status, rid, _ = await post(
        daemon, "/v1/chat/completions", {"model": "fake", "messages": msgs, "max_tokens": 2}
    )
    await recorded(daemon, rid)
    out = tmp_path / "big.jsonl"
    code, said = await traylm("requests", "export", str(out))
    assert code == 0 and "exported 1 request" in said, said
    [line] = [json.loads(x) for x in out.read_text().splitlines()]
    assert line["custom_id"] == rid and line["body"]["messages"][0]["content"] == big


async def test_templated_prompt_from_the_engine(daemon: RunningDaemon) -> None:
    d = daemon
    await start_fake(d)
    _status, rid, _ = await post(
        d, "/v1/chat/completions", {"model": "fake", "messages": HI, "max_tokens": 2}
    )
    await recorded(d, rid)
    prompt = await d.client.request_prompt(rid)
    # the FAKE engine's template: 3 tokens a message, 1 for the generation prompt, the words
    assert prompt["engine_id"] == "fake" and prompt["count"] == 3 + 1 + 1
    await d.client.stop("fake")
    with pytest.raises(ControlAPIError, match="no longer running"):
        await d.client.request_prompt(rid)


async def test_a_corrupt_database_is_set_aside(
    daemon_factory: DaemonFactory, fake_env: Path, paths: Any
) -> None:
    paths.data_dir.mkdir(parents=True, exist_ok=True)
    (paths.data_dir / "requests.db").write_bytes(b"this is not SQLite" * 100)
    d: RunningDaemon = await daemon_factory()
    status = await d.client.status()
    assert "set aside" in status["requests"]["warning"]
    code, out = await traylm("status")
    assert code == 0 and "requests: the request recorder's database was unreadable" in out
    assert list(paths.data_dir.glob("requests.db.corrupt-*"))
    await start_fake(d)
    _, rid, _ = await post(d, "/v1/chat/completions", {"model": "fake", "messages": HI})
    assert (await recorded(d, rid))["status"] == 200
    with sqlite3.connect(paths.data_dir / "requests.db") as db:
        assert db.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 1


async def test_a_stream_read_to_its_last_event_is_a_success(daemon: RunningDaemon) -> None:
    """The openai SDK stops reading at ``[DONE]`` and closes the connection; an engine whose
    body ends a little later (the fake's --end-delay) leaves the gateway writing the end of the
    chunked body to a closed connection. The client got every event: that is a 200, not 499."""
    d = daemon
    await start_fake(d, args="--end-delay 0.5")
    client = sdk(d)
    stream = await client.chat.completions.with_raw_response.create(
        model="fake", messages=HI, max_tokens=3, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream.parse()])
    await client.close()
    row = await recorded(d, stream.headers["x-request-id"])
    assert (row["status"], row["reply"]["text"]) == (200, text) and text.split()[-1] == "w2"
    async with aiohttp.ClientSession() as http, http.get(d.url + "/metrics") as r:
        text = await r.text()
    assert 'traylm_requests_total{route="/v1/chat/completions",status="200"} 1' in text
    assert 'status="499"' not in text


async def test_cached_prompt_tokens_and_a_conversations_cache_hit_rate(
    daemon: RunningDaemon,
) -> None:
    """traylm starts vLLM with --enable-prompt-tokens-details, the recorder keeps each
    request's cached prompt tokens, and `traylm requests ls` shows each conversation's cache
    hit rate (an agent user sees at once when a client breaks the prefix cache)."""
    d = daemon
    await start_fake(d)  # the FAKE engine says cached tokens only when traylm asks
    turn = [{"role": "user", "content": "the same first message"}]
    rids = []
    for messages in (turn, [*turn, {"role": "assistant", "content": "w0"}], HI):
        _, rid, _ = await post(d, "/v1/chat/completions", {"model": "fake", "messages": messages})
        rids.append(rid)
    await recorded(d, rids[-1])
    rows = {r["id"]: r for r in await d.client.requests_list(limit=10)}
    first, second, other = (rows[rid] for rid in rids)
    assert (first["cached_tokens"], second["cached_tokens"], other["cached_tokens"]) == (0, 2, 0)
    assert first["conversation"] == second["conversation"] != other["conversation"]
    assert second["cache_hit_rate"] == pytest.approx(2 / 6)  # 2 of the conversation's 6
    assert second["conversation_requests"] == 2 and other["cache_hit_rate"] == 0
    code, out = await traylm("requests", "ls")
    assert code == 0 and "cache 33% of 2" in out and "cache 0% of 1" in out, out
