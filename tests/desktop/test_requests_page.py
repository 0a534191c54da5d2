"""The Requests page against a real daemon and the FAKE vLLM engine: requests sent to the
gateway appear in the live list, the filters narrow it, the detail shows the request and its
reply, the templated prompt comes from the engine, "Copy as curl" copies a command that sends
the same body, and "Replay" sends it again (a new request in the list)."""

from __future__ import annotations

import json
import shlex
import urllib.error
import urllib.request

import pytest
from PySide6.QtGui import QGuiApplication

from desktop.app import DesktopApp
from desktop.dashboard.requests_page import COLUMNS, RequestsPage
from tests.desktop.conftest import ThreadedDaemon

pytestmark = pytest.mark.slow


def send(d: ThreadedDaemon, model: str, max_tokens: int) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    req = urllib.request.Request(
        d.url + "/v1/chat/completions",
        data=json.dumps({**body, "max_tokens": max_tokens}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_live_list_filters_detail_curl_and_replay(qtbot, app: DesktopApp, daemon_thread) -> None:
    d = daemon_thread
    d.write_fake_profile("fake")
    app.actions.reload_profiles()
    qtbot.waitUntil(lambda: app.state.profile("fake") is not None)
    app.actions.start_profile("fake")
    qtbot.waitUntil(lambda: "fake" in app.state.served_models(), timeout=20000)
    page = app.open_dashboard("requests").page("requests")
    assert isinstance(page, RequestsPage)
    page.page_shown()
    assert send(d, "fake", 3) == 200 and send(d, "nope", 3) == 404
    qtbot.waitUntil(lambda: len(page.rows) == 2, timeout=10000)  # the live list
    assert {page.table.item(i, 1).text() for i in range(2)} == {"200", "404"}
    cache = COLUMNS.index("Cache")  # the conversation's prefix-cache hit rate
    assert {page.table.item(i, cache).text() for i in range(2)} == {"0% of 1", "-"}
    page.status_filter.setCurrentIndex(page.status_filter.findData("error"))
    qtbot.waitUntil(lambda: [r["status"] for r in page.rows] == [404], timeout=10000)
    page.status_filter.setCurrentIndex(page.status_filter.findData("ok"))
    qtbot.waitUntil(lambda: [r["status"] for r in page.rows] == [200], timeout=10000)
    page.table.selectRow(0)
    qtbot.waitUntil(lambda: page.detail is not None, timeout=10000)
    text = page.text.toPlainText()
    assert "HTTP 200" in text and "--- reply\nw0 w1 w2" in text and '"max_tokens": 3' in text
    page.prompt_button.click()
    qtbot.waitUntil(lambda: "templated it (5 tokens)" in page.text.toPlainText(), timeout=10000)
    page.curl_button.click()
    words = shlex.split(QGuiApplication.clipboard().text())
    assert words[:2] == ["curl", d.url + "/v1/chat/completions"]
    assert json.loads(words[-1])["max_tokens"] == 3
    page.replay_button.click()
    qtbot.waitUntil(lambda: "replayed as req_" in page.result.text(), timeout=10000)
    # the list takes the replayed request in; what the replay said stays in view
    qtbot.waitUntil(lambda: page.count.text() == "2 requests", timeout=10000)
    assert "replayed as req_" in page.result.text()
    qtbot.waitUntil(lambda: len(page.rows) == 2, timeout=10000)  # filter ok: both 200s
    page.page_hidden()
    assert not page.timer.isActive()
