"""Requests: what went through the gateway (the daemon's flight recorder). A live list (asked
again every ``POLL_MS`` while the page is shown), filters (model, status, client, text), and
the selected request's detail: who and where, timings and tokens, the request body, the
reply, the prompt as its engine templated it (on demand), "Copy as curl" and "Replay"."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from desktop.daemon.messages import CallResult
from desktop.dashboard.page import Page, PageContext
from desktop.widgets.result_label import ResultLabel
from desktop.widgets.table import read_only_table
from engines.client import DaemonClient

POLL_MS = 2000
LIST_LIMIT = 200
COLUMNS = (
    "Time",
    "Status",
    "API",
    "Model",
    "Engine",
    "Tokens in → out",
    "Cache",
    "TTFT",
    "Duration",
    "Client",
)


def curl_command(gateway_url: str, detail: Mapping[str, Any]) -> str:
    """The request as a curl command line (its body as recorded; the API key left to fill)."""
    body = str(detail.get("request_body", ""))
    return " ".join(
        [
            "curl",
            shlex.quote(gateway_url.rstrip("/") + str(detail.get("path", ""))),
            "-H",
            shlex.quote(f"Content-Type: {detail.get('content_type') or 'application/json'}"),
            "-d",
            shlex.quote(body),
        ]
    )


def _cells(r: Mapping[str, Any]) -> tuple[str, ...]:
    ttft = f"{r['ttft_s'] * 1000:.0f} ms" if r.get("ttft_s") is not None else "-"
    return (
        time.strftime("%H:%M:%S", time.localtime(float(r["arrived_s"]))),
        str(r["status"]),
        str(r["path"]),
        str(r["model"]),
        str(r["engine_id"]) or "-",
        f"{r.get('prompt_tokens') or 0} → {r.get('completion_tokens') or 0}",
        _cache(r),
        ttft,
        f"{float(r['duration_s']):.2f} s",
        str(r["client"]),
    )


def _cache(r: Mapping[str, Any]) -> str:
    """The conversation's prefix-cache hit rate ("97% of 3": of its 3 requests' prompt
    tokens), "-" where the engine said nothing."""
    rate = r.get("cache_hit_rate")
    if rate is None:
        return "-"
    return f"{float(rate):.0%} of {r.get('conversation_requests') or 1}"


class RequestsPage(Page):
    def __init__(self, ctx: PageContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.rows: tuple[Mapping[str, Any], ...] = ()
        self.detail: Mapping[str, Any] | None = None
        self._asking = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(8, 8, 8, 8)
        layout.addLayout(self._filters())
        split = QSplitter()
        self.table = read_only_table(COLUMNS, "requestsTable", on_select=self.on_row_selected)
        split.addWidget(self.table)
        split.addWidget(self._detail_pane())
        split.setSizes([600, 500])
        layout.addWidget(split, 1)
        self.result = ResultLabel("requestsResult")
        layout.addWidget(self.result)
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.refresh)

    def _filters(self) -> QHBoxLayout:
        row = QHBoxLayout()
        self.model_filter = QLineEdit(placeholderText="model")
        self.model_filter.setObjectName("requestsModel")
        self.status_filter = QComboBox()
        self.status_filter.setObjectName("requestsStatus")
        for label, value in (("any status", ""), ("ok", "ok"), ("errors", "error")):
            self.status_filter.addItem(label, value)
        self.client_filter = QComboBox()
        self.client_filter.setObjectName("requestsClient")
        for label, value in (
            ("any client", ""),
            ("this computer", "local"),
            ("LAN", "lan"),
            ("a paired box", "box"),
            ("a benchmark", "bench"),
            ("the tuner", "tuner"),
            ("the Ollama API", "ollama"),
        ):
            self.client_filter.addItem(label, value)
        self.text_filter = QLineEdit(placeholderText="text in the request or reply")
        self.text_filter.setObjectName("requestsText")
        for edit in (self.model_filter, self.text_filter):
            edit.returnPressed.connect(self.refresh)
        for combo in (self.status_filter, self.client_filter):
            combo.currentIndexChanged.connect(lambda _i: self.refresh())
        row.addWidget(self.model_filter)
        row.addWidget(self.status_filter)
        row.addWidget(self.client_filter)
        row.addWidget(self.text_filter, 1)
        self.count = QLabel()  # the list's size: its own label, so a refresh never hides
        self.count.setObjectName("requestsCount")  # what an action said (replayed as ...)
        row.addWidget(self.count)
        return row

    def _detail_pane(self) -> QWidget:
        pane = QWidget()
        box = QVBoxLayout(pane)
        box.setContentsMargins(0, 0, 0, 0)
        buttons = QHBoxLayout()
        self.prompt_button = QPushButton("Show the templated prompt")
        self.prompt_button.setObjectName("requestsPrompt")
        self.prompt_button.clicked.connect(self.on_prompt_clicked)
        self.curl_button = QPushButton("Copy as curl")
        self.curl_button.setObjectName("requestsCurl")
        self.curl_button.clicked.connect(self.on_curl_clicked)
        self.replay_button = QPushButton("Replay")
        self.replay_button.setObjectName("requestsReplay")
        self.replay_button.clicked.connect(self.on_replay_clicked)
        for b in (self.prompt_button, self.curl_button, self.replay_button):
            b.setEnabled(False)
            buttons.addWidget(b)
        box.addLayout(buttons)
        self.text = QPlainTextEdit(readOnly=True)
        self.text.setObjectName("requestsDetail")
        box.addWidget(self.text, 1)
        return pane

    # ----------------------------------------------------------------- live list

    def page_shown(self) -> None:
        self.refresh()
        self.timer.start()

    def page_hidden(self) -> None:
        self.timer.stop()

    def filters(self) -> dict[str, str]:
        return {
            "model": self.model_filter.text().strip(),
            "status": str(self.status_filter.currentData()),
            "client": str(self.client_filter.currentData()),
            "text": self.text_filter.text().strip(),
        }

    def refresh(self) -> None:
        if self._asking:  # one ask at a time: a slow daemon is not asked twice
            return
        self._asking = True
        wanted = self.filters()

        async def ask(c: DaemonClient) -> object:
            return await c.requests_list(limit=LIST_LIMIT, **wanted)

        self.ctx.bridge.call(ask, self._on_list)

    def _on_list(self, result: CallResult) -> None:
        self._asking = False
        if not result.ok or not isinstance(result.value, tuple):
            self.result.error(result.error or "the daemon has no request recorder")
            return
        rows = tuple(r for r in result.value if isinstance(r, Mapping))
        if [r["id"] for r in rows] == [r["id"] for r in self.rows]:
            return
        selected = self.selected_id()
        self.rows = rows
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            for j, cell in enumerate(_cells(r)):
                self.table.setItem(i, j, QTableWidgetItem(cell))
            if r["id"] == selected:
                self.table.selectRow(i)
        self.count.setText(
            f"{len(rows)} requests" + (" (newest)" if len(rows) >= LIST_LIMIT else "")
        )

    def selected_id(self) -> str:
        row = self.table.currentRow()
        return str(self.rows[row]["id"]) if 0 <= row < len(self.rows) else ""

    # ----------------------------------------------------------------- detail

    def on_row_selected(self) -> None:
        rid = self.selected_id()
        if not rid or (self.detail is not None and self.detail.get("id") == rid):
            return
        self.ctx.bridge.call(lambda c: c.request_detail(rid), self._on_detail)

    def _on_detail(self, result: CallResult) -> None:
        if not result.ok or not isinstance(result.value, Mapping):
            self.result.error(result.error)
            return
        d = self.detail = result.value
        replayable = d["capture"] == "full" and not d["request_cut"] and d["method"] == "POST"
        self.curl_button.setEnabled(replayable)
        self.replay_button.setEnabled(replayable)
        self.prompt_button.setEnabled(replayable and d["path"] == "/v1/chat/completions")
        self.text.setPlainText(describe(d))

    def on_prompt_clicked(self) -> None:
        if self.detail is None:
            return
        rid = str(self.detail["id"])

        def done(result: CallResult) -> None:
            if not result.ok or not isinstance(result.value, Mapping):
                self.result.error(result.error)
                return
            p = result.value
            self.text.appendPlainText(
                f"\n--- prompt as {p['engine_id']} templated it ({p['count']} tokens)\n"
                f"{p['prompt']}"
            )

        self.ctx.bridge.call(lambda c: c.request_prompt(rid), done)

    def on_curl_clicked(self) -> None:
        if self.detail is None:
            return
        url = self.ctx.state.connection.url or "http://127.0.0.1:8000"
        QGuiApplication.clipboard().setText(curl_command(url, self.detail))
        self.result.ok("curl command copied")

    def on_replay_clicked(self) -> None:
        if self.detail is None:
            return
        rid = str(self.detail["id"])

        def done(result: CallResult) -> None:
            if not result.ok or not isinstance(result.value, Mapping):
                self.result.error(result.error)
                return
            r = result.value
            say = self.result.ok if int(r["status"]) < 400 else self.result.error
            say(f"replayed as {r['request_id']}: HTTP {r['status']}")
            self.refresh()

        self.ctx.bridge.call(lambda c: c.replay_request(rid), done)


def describe(d: Mapping[str, Any]) -> str:
    """The detail as text: metadata, the request body, the reply."""
    ttft = f"{d['ttft_s'] * 1000:.0f} ms" if d.get("ttft_s") is not None else "-"
    lines = [
        f"{d['id']}  HTTP {d['status']}  {d['method']} {d['path']}",
        f"model {d['model'] or '-'}  engine {d['engine_id'] or '-'}  GPUs {d['gpus'] or '-'}",
        f"client {d['client']}{' ' + d['peer'] if d['peer'] else ''}"
        f"{'  key ' + d['key'] if d['key'] else ''}",
        f"tokens {d.get('prompt_tokens') or 0} → {d.get('completion_tokens') or 0}  TTFT {ttft}",
        f"duration {float(d['duration_s']):.3f} s  finish {d['finish_reason'] or '-'}"
        f"{'  cut by ' + d['cut_by'] if d['cut_by'] else ''}",
    ]
    if d["error"]:
        lines.append(f"error: {d['error']}")
    if d["request_body"]:
        lines += ["", "--- request", _pretty(str(d["request_body"]))]
    reply = d.get("reply") or {}
    if reply.get("reasoning"):
        lines += ["", "--- reasoning", str(reply["reasoning"])]
    if reply.get("text"):
        lines += ["", "--- reply", str(reply["text"])]
    for call in reply.get("tool_calls") or ():
        lines += ["", "--- tool call", json.dumps(_plain(call))]
    if not reply and d.get("reply_body"):
        lines += ["", "--- reply", _pretty(str(d["reply_body"]))]
    return "\n".join(lines)


def _pretty(text: str) -> str:
    try:
        return json.dumps(json.loads(text), indent=1, ensure_ascii=False)
    except ValueError:
        return text


def _plain(value: object) -> object:
    """A frozen mapping / tuple (from the bridge) back to JSON-able values."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value
