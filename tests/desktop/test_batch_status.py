"""A running batch in the app (real daemon, FAKE engine): the engines page says how far it is
as its lines finish, the same line as the tray's tooltip, and nothing once it ended."""

from __future__ import annotations

import io
import json

import openai
import pytest
from PySide6.QtWidgets import QLabel

from tests.desktop.conftest import ThreadedDaemon

LINES = 300


@pytest.mark.slow
def test_the_engines_page_follows_a_running_batch(qtbot, app, daemon_thread: ThreadedDaemon):
    daemon_thread.write_fake_profile("fake", args="--token-delay 0.2")
    dash = app.open_dashboard("engines")
    label = dash.page("engines").findChild(QLabel, "batchStatus")
    assert label is not None and label.text() == ""
    row = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    data = b"".join(
        json.dumps(
            {"custom_id": f"r{n}", "method": "POST", "url": "/v1/chat/completions", "body": row}
        ).encode()
        + b"\n"
        for n in range(LINES)
    )
    with openai.OpenAI(base_url=daemon_thread.url + "/v1", api_key="x", max_retries=0) as oai:
        made = oai.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
        batch = oai.batches.create(
            input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
        )

        def shown() -> int:
            text = label.text()
            return int(text.split()[1].split("/")[0]) if text.startswith("batch: ") else -1

        qtbot.waitUntil(lambda: shown() > 0, timeout=30000)  # the model loads first
        first = shown()
        assert label.text().endswith(f"/{LINES} done")
        qtbot.waitUntil(lambda: shown() > first, timeout=20000)  # it moves as lines finish
        qtbot.waitUntil(lambda: "\nbatch: " in app.tray.icon.toolTip(), timeout=10000)
        oai.batches.cancel(batch.id)
    qtbot.waitUntil(lambda: label.text() == "", timeout=20000)
