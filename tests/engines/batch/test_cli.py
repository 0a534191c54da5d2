"""`traylm batches ls|show|cancel` against the real daemon (FAKE engine): every caller's
batches listed with their counts, `show --follow` follows one to its end with progress lines,
a cancel keeps what finished, an unknown id is a clear error."""

from __future__ import annotations

import asyncio
import io
import json

import openai
import pytest

from tests.conftest import RunningDaemon
from tests.engines.batch.test_batches import CHAT, chat_line, jsonl
from tests.engines.gateway.test_daemon_gateway import sdk, start_fake
from tests.traylm_cli import traylm


async def make_batch(client: openai.AsyncOpenAI, lines: int) -> str:
    rows = [chat_line(f"r{n}") for n in range(lines)]
    made = await client.files.create(file=("in.jsonl", io.BytesIO(jsonl(rows))), purpose="batch")
    batch = await client.batches.create(
        input_file_id=made.id, endpoint=CHAT, completion_window="24h"
    )
    return batch.id


@pytest.mark.slow
async def test_ls_show_follow_and_cancel(daemon: RunningDaemon) -> None:
    await start_fake(daemon, args="--token-delay 0.2")
    async with sdk(daemon) as client:
        first = await make_batch(client, 200)
        code, said = await traylm("batches", "show", first, "--follow")
        assert code == 0, said
        assert "in_progress: " in said and "/200 done" in said  # progress lines on stderr
        assert "status       completed" in said and "200/200 done" in said
        assert "output file  file-" in said

        second = await make_batch(client, 400)
        async with asyncio.timeout(60):
            while (await client.batches.retrieve(second)).request_counts.completed < 2:  # type: ignore[union-attr]
                await asyncio.sleep(0.05)
        code, said = await traylm("batches", "cancel", second)
        assert code == 0 and f"{second}: cancelled" in said, said
        kept = (await client.batches.retrieve(second)).request_counts
        assert kept is not None and 2 <= kept.completed < 400

    code, said = await traylm("batches", "ls")
    assert code == 0, said
    lines = said.splitlines()
    assert lines[0].startswith(second) and "cancelled" in lines[0]
    assert lines[1].startswith(first) and "completed" in lines[1] and "200/200 done" in lines[1]
    code, said = await traylm("batches", "ls", "--json")
    assert [b["id"] for b in json.loads(said)] == [second, first]
    code, said = await traylm("batches", "show", "batch_" + "0" * 24)
    assert code != 0 and "no batch" in said and "traylm batches ls" in said
    assert "Traceback" not in said
