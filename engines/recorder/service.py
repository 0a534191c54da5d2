"""The flight recorder: every request through the gateway, kept in ``requests.db``.

The gateway hands each recorded request's ``Exchange`` to ``record`` once it is answered (a
deque append, no I/O, never a wait). A background task takes what is pending every
``period_s`` and, in a thread, assembles each reply (assemble.py) and writes the batch in one
transaction. Memory stays bounded when the disk is slow: once what waits (and the batch being
written) passes ``max_pending_bytes``, a new exchange keeps only its metadata (a few KiB,
``bodies_dropped``); past ``max_pending`` rows the oldest unwritten ones go (``dropped``).
A full disk pauses recording (the batch is dropped and counted) with a warning in
``traylm status``; serving goes on, and writing is tried again after ``RETRY_FULL_S``.
Retention: ``requests.days`` and ``requests.max_mib``, pruned at start, hourly, and whenever
what was written since the last prune passes a tenth of the cap.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from engines.config.live import SettingsView
from engines.core.doorbell import Doorbell
from engines.errors import TraylmError, quoted
from engines.gateway.exchange import Exchange
from engines.gateway.upstream import Upstream
from engines.recorder.assemble import CUT_MARKER, row_of
from engines.recorder.responses import KeptResponses
from engines.recorder.store import RecorderStore

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 3600.0
RETRY_FULL_S = 30.0
EXPORT_PAGE_ROWS = 500
TOKENIZE_TIMEOUT_S = 30.0


class RequestNotFound(TraylmError):
    code = "not_found"
    http_status = 404


class PromptUnavailable(TraylmError):
    code = "prompt_unavailable"
    http_status = 409


class RequestRecorder:
    """The flight recorder (see the module docstring). A part of the daemon: started and
    stopped with it; the gateway's ``exchanges`` hook is ``record``."""

    name = "requests"

    def __init__(
        self,
        path: Path,
        settings: SettingsView,
        *,
        upstream_of: Callable[[str], Upstream | None] | None = None,
        period_s: float = 0.25,
        max_pending: int = 20_000,
        max_pending_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        """``upstream_of``: model name → the ``Upstream`` serving it now, or None (the
        gateway's router; the templated prompt asks that engine)."""
        self.store = RecorderStore(path)
        self.responses = KeptResponses(self.store, settings)
        """The Responses API's kept responses (the gateway's ``kept``), in the same file."""
        self._settings = settings
        self._upstream_of = upstream_of
        self._period_s = period_s
        self._pending: collections.deque[Exchange] = collections.deque(maxlen=max_pending)
        self._pending_bytes = 0
        self._writing_bytes = 0  # the batch being written: still in memory
        self._max_pending_bytes = max_pending_bytes
        self._task: asyncio.Task[None] | None = None
        self._bell = Doorbell()  # rung by record: the writer sleeps while nothing comes
        self._opened = False
        self._paused_until = 0.0
        self._since_prune = 0
        self.paused = ""
        self.written = 0
        self.dropped = 0
        self.bodies_dropped = 0
        self.failed_batches = 0

    # ----------------------------------------------------------------- the request's path

    def record(self, exchange: Exchange) -> None:
        """An answered request (the gateway's hook): queued, never waited on."""
        size = exchange.size_bytes()
        if self._pending_bytes + self._writing_bytes + size > self._max_pending_bytes:
            exchange.drop_bodies()
            self.bodies_dropped += 1
            size = exchange.size_bytes()
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
            self._pending_bytes -= self._pending[0].size_bytes()
        self._pending.append(exchange)
        self._pending_bytes += size
        self._bell.ring()

    # ----------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        await asyncio.to_thread(self.store.open)
        self._opened = True
        self._task = asyncio.create_task(self._run(), name="request-recorder")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        with contextlib.suppress(sqlite3.Error):
            await self.flush()
        await asyncio.to_thread(self.store.close)

    def status(self) -> dict[str, Any]:
        """``traylm status``'s ``requests`` key."""
        r = self._settings.current.requests
        warning = self.paused or self.store.warning
        return {
            "capture": r.capture,
            "capture_lan": r.capture_lan,
            "written": self.written,
            "pending": len(self._pending),
            "dropped": self.dropped,
            "bodies_dropped": self.bodies_dropped,
            "responses_dropped": self.responses.dropped,
            "warning": warning,
        }

    async def flush(self) -> None:
        """Write what is pending now (the writer's step; tests and stop call it too)."""
        if not self._opened:
            return
        await self.responses.flush()
        if not self._pending:
            return
        batch = list(self._pending)
        self._pending.clear()
        self._writing_bytes, self._pending_bytes = self._pending_bytes, 0
        try:
            written = await asyncio.to_thread(self._write, batch)
        except BaseException:
            self.dropped += len(batch)
            raise
        finally:
            self._writing_bytes = 0
        self.written += len(batch)
        self._since_prune += written
        if self.paused:  # the disk has room again: status says so at once
            log.warning("request recording resumed")
            self.paused = ""

    def _write(self, batch: list[Exchange]) -> int:
        return self.store.write([row_of(ex) for ex in batch])

    async def _run(self) -> None:
        pruned_at = 0.0
        while True:
            if pruned_at and not self._pending:  # asleep until a request is recorded
                await self._bell.wait(PRUNE_EVERY_S)
            await asyncio.sleep(self._period_s)  # what comes meanwhile goes in this batch
            try:
                cap = self._max_bytes()
                due = time.monotonic() - pruned_at >= PRUNE_EVERY_S or not pruned_at
                if due or self._since_prune > cap // 10:
                    pruned_at = time.monotonic()
                    self._since_prune = 0
                    await asyncio.to_thread(self.prune, time.time())
                if time.monotonic() >= self._paused_until:
                    await self.flush()
                else:
                    self._drop_pending()
            except sqlite3.OperationalError as exc:
                self._pause(exc)
            except Exception:  # boundary: a failing write must never stop the recorder
                self.failed_batches += 1
                log.exception("writing recorded requests failed")

    def _pause(self, exc: sqlite3.OperationalError) -> None:
        self._paused_until = time.monotonic() + RETRY_FULL_S
        self.paused = (
            f"request recording paused: {exc} (free disk space in "
            f"{self.store.path.parent}); serving goes on, recording retries every "
            f"{RETRY_FULL_S:g} s"
        )
        self._drop_pending()
        log.warning("%s", self.paused)

    def _drop_pending(self) -> None:
        self.dropped += len(self._pending)
        self._pending.clear()
        self._pending_bytes = 0

    def _max_bytes(self) -> int:
        return int(self._settings.current.requests.max_mib * 1024 * 1024)

    def prune(self, now_s: float) -> int:
        r = self._settings.current.requests
        gone = self.responses.prune(now_s)
        return gone + self.store.prune(
            older_than_s=now_s - r.days * 86400, max_bytes=self._max_bytes()
        )

    # ----------------------------------------------------------------- reading

    async def _written_for_reader(self) -> None:
        """What was answered before a reader asked is written first (a client's error id
        shown at once by `traylm requests show`); a full disk pauses recording, as in the
        writer's own step, and the reader gets what is written."""
        if time.monotonic() < self._paused_until:
            return
        try:
            await self.flush()
        except sqlite3.OperationalError as exc:  # a full disk: as the writer's own step
            self._pause(exc)

    async def note_errors(self, reasons: Mapping[str, str]) -> None:
        """Why a client found these requests failed (request id → reason), on the rows the
        gateway saw no error on: a benchmark's verdict (engines/bench/service.py)."""
        if not reasons or not self._opened:
            return
        await self._written_for_reader()
        try:
            await asyncio.to_thread(self.store.note_errors, reasons)
        except sqlite3.OperationalError as exc:  # a full disk: as the writer's own step
            self._pause(exc)

    async def summaries(self, **filters: Any) -> list[dict[str, Any]]:
        await self._written_for_reader()
        rows = await asyncio.to_thread(self.store.rows, **filters)
        return [_summary(r) for r in rows]

    async def get(self, rid: str) -> dict[str, Any]:
        if any(ex.id == rid for ex in self._pending):
            await self._written_for_reader()
        row = await asyncio.to_thread(self.store.get, rid)
        if row is None:
            raise RequestNotFound(
                f"no recorded request {quoted(rid)}; `traylm requests ls` lists them (the recorder "
                "keeps requests.days and requests.max_mib of them)"
            )
        return _detail(row)

    async def export_pages(self) -> AsyncIterator[str | int]:
        """The export's lines (OpenAI Batch input JSONL), a page of rows at a time; then a
        last item, the count of requests left out (no body kept, cut, or not JSON)."""
        await self._written_for_reader()  # the last seconds' requests are in the export too
        after = 0
        skipped = 0
        while True:
            rows = await asyncio.to_thread(self.store.page_for_export, after, EXPORT_PAGE_ROWS)
            if not rows:
                break
            after = rows[-1]["id"]
            lines = []
            for row in rows:
                line = batch_line(row)
                if line is None:
                    skipped += 1
                else:
                    lines.append(json.dumps(line) + "\n")
            yield "".join(lines)
        yield skipped

    async def prompt(self, rid: str) -> dict[str, Any]:
        """The prompt as the engine that served ``rid`` templates it: its ``/tokenize`` of the
        messages with the generation prompt, then ``/detokenize`` of those tokens."""
        row = await asyncio.to_thread(self.store.get, rid)
        if row is None:
            raise RequestNotFound(f"no recorded request {quoted(rid)}; `traylm requests ls`")
        body = _json_body(row)
        if body is None or not isinstance(body.get("messages"), list):
            raise PromptUnavailable(
                "only a chat request whose body was recorded in full has a templated prompt "
                f"(this one: {row['path']}, capture {row['capture']}"
                f"{', body cut' if row['request_cut'] else ''})"
            )
        upstream = self._upstream_of(row["model"]) if self._upstream_of else None
        if upstream is None or upstream.name != row["engine_id"] or upstream.remote:
            now = f"; {row['model']} is served by {upstream.name} now" if upstream else ""
            raise PromptUnavailable(
                f"the engine that served this request ({row['engine_id'] or 'none'}) is no "
                f"longer running{now}; start it again (`traylm load {row['model']}`) to see "
                "the prompt it templated"
            )
        return await tokenize_prompt(upstream, body)


async def tokenize_prompt(upstream: Upstream, body: dict[str, Any]) -> dict[str, Any]:
    """vLLM's ``POST /tokenize`` (messages, add_generation_prompt, the chat-template fields
    the request carried) then ``POST /detokenize``: the prompt text and its token count."""
    model = upstream.model_name or str(body.get("model", ""))
    ask: dict[str, Any] = {
        "model": model,
        "messages": body["messages"],
        "add_generation_prompt": body.get("add_generation_prompt", True),
    }
    for name in ("tools", "chat_template", "chat_template_kwargs", "continue_final_message"):
        if name in body:
            ask[name] = body[name]
    timeout = aiohttp.ClientTimeout(total=TOKENIZE_TIMEOUT_S)
    try:
        async with aiohttp.ClientSession(
            base_url=upstream.base_url, headers=dict(upstream.headers), timeout=timeout
        ) as http:
            async with http.post("/tokenize", json=ask) as resp:
                data = await resp.json(content_type=None)
                if resp.status != 200 or not isinstance(data, dict):
                    raise PromptUnavailable(
                        f"engine {upstream.name} refused /tokenize (HTTP {resp.status}): "
                        f"{str(data)[:300]}"
                    )
            tokens = data.get("tokens") or []
            async with http.post("/detokenize", json={"model": model, "tokens": tokens}) as r:
                text = await r.json(content_type=None)
                if r.status != 200 or not isinstance(text, dict):
                    raise PromptUnavailable(
                        f"engine {upstream.name} refused /detokenize (HTTP {r.status})"
                    )
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise PromptUnavailable(
            f"engine {upstream.name} did not answer /tokenize ({type(exc).__name__}); "
            "is it still running? `traylm ps`"
        ) from None
    return {
        "engine_id": upstream.name,
        "prompt": str(text.get("prompt", "")),
        "tokens": tokens,
        "count": int(data.get("count", len(tokens))),
    }


def _json_body(row: dict[str, Any]) -> dict[str, Any] | None:
    if row["capture"] != "full" or row["request_cut"]:
        return None
    if not str(row["content_type"]).startswith("application/json"):
        return None
    try:
        body = json.loads(row["request_body"])
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def batch_line(row: dict[str, Any]) -> dict[str, Any] | None:
    """One export line in the OpenAI Batch input format, traylm's extras under ``traylm``;
    None for a request that cannot be sent again (no whole JSON body kept)."""
    body = _json_body(row)
    if body is None or row["method"] != "POST":
        return None
    return {
        "custom_id": row["rid"],
        "method": "POST",
        "url": row["path"],
        "body": body,
        "traylm": {"arrived_at_s": row["arrived_s"], "status": row["status"]},
    }


def _summary(row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    out["id"] = out.pop("rid")
    out["order"] = row["id"]
    out["remote"] = bool(row["remote"])
    out["stream"] = bool(row["stream"])
    out["request_cut"] = bool(row["request_cut"])
    out["reply_cut"] = bool(row["reply_cut"])
    return out


def _detail(row: dict[str, Any]) -> dict[str, Any]:
    out = _summary({k: v for k, v in row.items() if k not in ("request_body", "reply_body")})
    raw: bytes = row["request_body"]
    text = raw.decode("utf-8", "replace")
    if row["request_cut"]:
        text += CUT_MARKER.format(size=row["request_size"], kept=len(raw))
    out["request_body"] = text
    out["reply"] = json.loads(row["reply_json"]) if row["reply_json"] else None
    reply_raw: bytes = row["reply_body"]
    out["reply_body"] = reply_raw.decode("utf-8", "replace")
    return out
