"""Kept responses on a real requests.db (engines/recorder/responses.py): the size and age
bounds, which replies are kept (completed and incomplete ones, not failed ones or a stream
that broke off), and a history whose oldest turns were dropped."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from engines.gateway.response_keep import NewResponse
from engines.gateway.response_replay import replayable
from engines.gateway.sse import sse_error
from engines.recorder.service import RequestRecorder
from tests.engines.recorder.test_recorder_parts import settings


def response(n: int, status: str = "completed", text: str = "ok") -> dict[str, Any]:
    return {
        "id": f"resp_{n}",
        "object": "response",
        "status": status,
        "output": [{"type": "message", "role": "assistant", "content": [{"text": text}]}],
    }


def new(n: int, previous: int | None = None, **kw: Any) -> NewResponse:
    body = json.dumps(response(n, **kw)).encode()
    prev = f"resp_{previous}" if previous is not None else ""
    return NewResponse("me", "fake", [{"role": "user", "content": f"q{n}"}], prev, body, False)


def streamed(n: int) -> NewResponse:
    event = {"type": "response.completed", "response": response(n)}
    events = f"event: response.completed\ndata: {json.dumps(event)}\n\n".encode()
    return NewResponse("me", "fake", [], "", events, True)


async def test_the_size_and_age_bounds_drop_the_oldest(tmp_path: Path) -> None:
    rec = RequestRecorder(tmp_path / "requests.db", settings(tmp_path, responses_max_mib=1))
    await rec.start()
    try:
        for n in range(4):  # 4 × 400 KB: past 1 MiB
            rec.responses.keep(new(n, text="x" * 400_000))
        await rec.flush()
        kept = [n for n in range(4) if await rec.responses.find(f"resp_{n}", "me")]
        assert kept == [2, 3]
        rec.prune(time.time() + 31 * 86400)  # past requests.responses_days (30)
        assert await rec.responses.find("resp_3", "me") is None
    finally:
        await rec.stop()


async def test_only_finished_responses_are_kept(tmp_path: Path) -> None:
    rec = RequestRecorder(tmp_path / "requests.db", settings(tmp_path))
    await rec.start()
    try:
        rec.responses.keep(new(1, status="failed"))
        rec.responses.keep(new(2, status="incomplete"))
        rec.responses.keep(streamed(3))
        created = {"type": "response.created", "response": response(4, status="in_progress")}
        broke_off = f"event: response.created\ndata: {json.dumps(created)}\n\n".encode()
        rec.responses.keep(
            NewResponse(
                "me",
                "fake",
                [],
                "",
                broke_off + sse_error("engine went away", path="/v1/responses"),
                True,
            )
        )
        rec.responses.keep(dataclasses.replace(new(5), reply=b'{"error": {"message": "no"}}'))
        found = [n for n in range(1, 6) if await rec.responses.find(f"resp_{n}", "me")]
        assert found == [2, 3]
        assert await rec.responses.find("resp_3", "someone else") is None
    finally:
        await rec.stop()


async def test_a_history_goes_on_from_the_oldest_turn_kept(tmp_path: Path) -> None:
    rec = RequestRecorder(tmp_path / "requests.db", settings(tmp_path, responses_keep=2))
    await rec.start()
    try:
        for n in range(3):
            rec.responses.keep(new(n, previous=n - 1 if n else None))
        history = await rec.responses.history("resp_2", "me")
        assert history is not None
        assert [item.get("content") for item in history if item["role"] == "user"] == [
            "q1",
            "q2",
        ]
    finally:
        await rec.stop()


def test_a_response_without_its_items_or_not_ended_is_not_replayed() -> None:
    assert replayable({"status": "completed", "output": []}) is None
    assert replayable({"status": "completed"}) == "it was kept without its output items"
    assert "'in_progress'" in str(replayable({"status": "in_progress", "output": []}))
