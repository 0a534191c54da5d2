"""The chat window's HTTP client for the OpenAI endpoint on :8000 (no Qt; runs on the bridge loop).

It talks to the gateway exactly like any other local app: ``GET /v1/models`` and a streamed
``POST /v1/chat/completions``. Text arrives as ``ChatDelta`` messages (coalesced to a few dozen
per second so the GUI thread stays idle); the call's result is one ``ChatStreamEnded`` with
TTFT and tokens/s, or with a ``ChatError`` that says what went wrong. Cancelling the call is
the Stop button: the request is closed (the gateway then aborts it in the engine) and the reply
so far is returned with ``finish_reason="stopped"``.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

Post = Callable[[object], None]
DELTA_EVERY_S = 0.04
# an engine's refusal of a conversation longer than its context (vLLM: "This model's maximum
# context length is 4096 tokens. However, you requested ..."; newer: "... is too large")
CONTEXT_FULL = re.compile(r"maximum context length|more than the model's context", re.IGNORECASE)
Message = tuple[str, str, tuple[str, ...]]  # (role, content, images as data: URLs)
MIN_RATE_SPAN_S = 0.02  # tokens arriving over less than this give no tokens/s figure


@dataclass(frozen=True)
class ChatRequest:
    request_id: int
    model: str
    messages: tuple[Message, ...]  # (role, content, images)
    temperature: float
    top_p: float
    max_tokens: int
    chat_id: int = 0  # with position: the daemon keeps the reply there as it streams
    position: int = -1
    tools_json: str = ""
    """OpenAI ``tools`` (a JSON list) the model may call; "" offers none."""
    tool_turns_json: str = ""
    """This reply's tool rounds so far (a JSON list of OpenAI messages: the assistant's
    ``tool_calls``, then one ``tool`` message per call), sent after ``messages``."""

    def payload(self) -> dict[str, object]:
        messages: list[object] = [
            {"role": role, "content": _content(text, images)}
            for role, text, images in self.messages
        ]
        if self.tool_turns_json:
            messages += json.loads(self.tool_turns_json)
        out: dict[str, object] = {
            "model": self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
        }
        if self.tools_json:
            out["tools"] = json.loads(self.tools_json)
            out["tool_choice"] = "auto"
        return out


def _content(text: str, images: tuple[str, ...]) -> str | list[dict[str, object]]:
    """A message's content: its text, or with images OpenAI's content parts (the text, then
    one ``image_url`` part per image), which vLLM's chat template turns into image tokens."""
    if not images:
        return text
    parts: list[dict[str, object]] = [{"type": "text", "text": text}] if text else []
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return parts


@dataclass(frozen=True)
class ChatDelta:
    request_id: int
    text: str  # new text since the previous delta


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a reply, gathered from its streamed deltas."""

    call_id: str
    name: str
    arguments: str  # JSON text, as the model wrote it

    def openai(self) -> dict[str, object]:
        function = {"name": self.name, "arguments": self.arguments}
        return {"id": self.call_id, "type": "function", "function": function}


@dataclass(frozen=True)
class ChatError:
    """kind: model_not_found | engine_starting | engine_unavailable | model_load_failed |
    unauthorized | gateway_unreachable | connection_lost | engine_error | http_error.
    ``code``: the gateway's own error type (traylm's error code, for the fix button)."""

    kind: str
    message: str
    http_status: int = 0
    code: str = ""


@dataclass(frozen=True)
class ModelsListed:
    names: tuple[str, ...]
    """Every model the gateway serves, loaded ones first (the others load on a request)."""
    error: ChatError | None
    loaded: tuple[str, ...] = ()
    """Those answering now (no load before the reply)."""
    context_tokens: Mapping[str, int] = field(default_factory=dict)
    """Each model's context in tokens, where the gateway says (vLLM's ``max_model_len``)."""


@dataclass(frozen=True)
class ChatLoading:
    """The model of a request is loading (models on demand): the gateway's SSE comment, e.g.
    "loading fake (starting: loading weights, 12 s)"."""

    request_id: int
    text: str


@dataclass(frozen=True)
class ChatStreamEnded:
    request_id: int
    model: str
    content: str
    finish_reason: str  # stop | length | context | stopped | error | interrupted
    ttft_s: float | None
    tokens_per_s: float | None
    completion_tokens: int
    duration_s: float
    error: ChatError | None = None
    prompt_tokens: int | None = None  # how much of the context the conversation took
    load_s: float | None = None  # the model loaded first (on demand): how long that took
    tool_calls: tuple[ToolCall, ...] = ()  # the model asks for these (finish "tool_calls")

    def stats(self) -> dict[str, float]:
        out = {"duration_s": round(self.duration_s, 3)}
        if self.load_s is not None:
            out["load_s"] = round(self.load_s, 2)
        if self.ttft_s is not None:
            out["ttft_s"] = round(self.ttft_s, 4)
        if self.tokens_per_s is not None:
            out["tokens_per_s"] = round(self.tokens_per_s, 2)
        if self.completion_tokens:
            out["completion_tokens"] = float(self.completion_tokens)
        if self.prompt_tokens is not None:
            out["prompt_tokens"] = float(self.prompt_tokens)
        return out


_ERROR_KINDS = {
    "model_not_found": "model_not_found",
    "engine_starting": "engine_starting",
    "engine_unavailable": "engine_unavailable",
    "unauthorized": "unauthorized",
    "paused": "engine_unavailable",
    "rate_limit_exceeded": "engine_unavailable",
    "model_not_loaded": "model_not_found",  # engines.jit is off: load it first
    "model_load_failed": "model_load_failed",  # models on demand: the load failed
    "hub_unavailable": "model_load_failed",  # (its model cannot be fetched offline)
}


def _status(model: dict[str, object]) -> str:
    """A /v1/models entry's state (``status.value``, llama.cpp's shape); one without a status
    (another server) is loaded."""
    status = model.get("status")
    return str(status.get("value", "loaded")) if isinstance(status, dict) else "loaded"


def error_from_body(status: int, body: bytes) -> ChatError:
    try:
        err = json.loads(body)["error"]
        message, type_ = str(err.get("message", "")), str(err.get("type", ""))
    except (ValueError, KeyError, TypeError, AttributeError):
        message, type_ = body.decode(errors="replace")[:300], ""
    if status == 401:
        type_ = "unauthorized"
    kind = _ERROR_KINDS.get(type_, "model_not_found" if status == 404 else "http_error")
    if status == 400 and CONTEXT_FULL.search(message):
        kind = "context_full"  # the engine's words (vLLM's 400): the window says it plainly
    return ChatError(kind, message or f"HTTP {status}", status, type_)


def context_tokens(message: str) -> int | None:
    """The model's context in tokens, from the engine's error ("maximum context length is
    4096 tokens"), when it says."""
    found = re.search(r"context length is (\d+)", message)
    return int(found.group(1)) if found else None


def requested_tokens(message: str) -> int | None:
    """How many tokens the refused request needed, from the engine's error ("you requested
    2100 tokens", "your request has 2100 input tokens"), when it says."""
    found = re.search(r"you requested (\d+) tokens|request has (\d+) input tokens", message)
    return int(found.group(1) or found.group(2)) if found else None


class _Collector:
    """Accumulates one streamed reply and posts coalesced deltas."""

    def __init__(self, request: ChatRequest, post: Post) -> None:
        self.request = request
        self.post = post
        self.started = time.perf_counter()
        self.first_token_at: float | None = None
        self.loading = False  # the gateway said the model is loading first
        self.first_data_at: float | None = None  # the engine's first chunk (after any load)
        self.last_token_at = 0.0
        self.parts: list[str] = []
        self.pending = ""
        self.last_post = 0.0
        self.chunks = 0
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.finish = ""
        self.error: ChatError | None = None
        self.calls: dict[int, list[str]] = {}  # index: [id, name, arguments so far]

    def feed(self, line: bytes) -> bool:
        """One SSE line; False once the stream says [DONE]."""
        text = line.decode(errors="replace").strip()
        if text.startswith(": loading ") and self.first_token_at is None:
            self.loading = True
            self.post(ChatLoading(self.request.request_id, text[2:]))
            return True
        if not text.startswith("data:"):
            return True
        if self.first_data_at is None:
            self.first_data_at = time.perf_counter()
        data = text[5:].strip()
        if data == "[DONE]":
            return False
        try:
            chunk = json.loads(data)
        except ValueError:
            return True
        if "error" in chunk:
            err = chunk["error"] or {}
            type_ = str(err.get("type", ""))  # a cold model's failed load ends the stream so
            # traylm itself stopping cut the reply off: kept as interrupted, like a lost
            # connection (Retry once the daemon is back), not an engine's failure
            if type_ == "traylm_stopping":
                kind = "connection_lost"
            else:
                kind = _ERROR_KINDS.get(type_, "engine_error")
            self.error = ChatError(kind, str(err.get("message", "engine error")), 502, type_)
            return True
        usage = chunk.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]
            prompt = usage.get("prompt_tokens")
            self.prompt_tokens = prompt if isinstance(prompt, int) else None
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            if delta.get("content"):
                self._add(str(delta["content"]))
            for call in delta.get("tool_calls") or ():
                self._add_call(call)
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
        return True

    def _add_call(self, call: object) -> None:
        """A tool call's delta: its first names the call; the later ones add arguments."""
        if not isinstance(call, dict):
            return
        index = call.get("index", 0)
        parts = self.calls.setdefault(index if isinstance(index, int) else 0, ["", "", ""])
        function = call.get("function") or {}
        parts[0] = str(call.get("id") or parts[0])
        parts[1] += str(function.get("name") or "")
        parts[2] += str(function.get("arguments") or "")

    def _add(self, text: str) -> None:
        now = time.perf_counter()
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.chunks += 1
        self.parts.append(text)
        self.pending += text
        if now - self.last_post >= DELTA_EVERY_S:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        if self.pending:
            self.post(ChatDelta(self.request.request_id, self.pending))
            self.pending = ""
        self.last_post = now if now is not None else time.perf_counter()

    def ended(self, finish: str, error: ChatError | None = None) -> ChatStreamEnded:
        self.flush()
        end = time.perf_counter()
        tokens = self.usage_tokens if self.usage_tokens is not None else self.chunks
        # after a load on demand the time to the first token counts from the engine's first
        # chunk: the load is said apart (a 30 s load is not a 30 s TTFT)
        since = self.first_data_at if self.loading and self.first_data_at else self.started
        ttft = self.first_token_at - since if self.first_token_at is not None else None
        load_s = since - self.started if self.loading and self.first_data_at else None
        rate = None
        first = self.first_token_at
        span_s = self.last_token_at - first if first is not None else 0.0
        # the decode rate after the first token, from when the tokens arrived; tokens that came
        # in one burst (held back on their way, a reply of a few tokens) give no measurable rate
        if tokens > 1 and span_s >= MIN_RATE_SPAN_S:
            rate = (tokens - 1) / span_s
        error = error or self.error
        finish = finish or self.finish or "stop"
        cut_early = self.usage_tokens is not None and tokens < self.request.max_tokens
        if finish == "length" and cut_early:
            finish = "context"  # cut before max_tokens: the model's context was full
        return ChatStreamEnded(
            request_id=self.request.request_id,
            model=self.request.model,
            content="".join(self.parts),
            finish_reason=_finish_reason(error, finish),
            ttft_s=ttft,
            tokens_per_s=rate,
            completion_tokens=tokens,
            duration_s=end - self.started,
            error=error,
            prompt_tokens=self.prompt_tokens,
            load_s=load_s,
            tool_calls=tuple(
                ToolCall(call_id or f"call_{i}", name, arguments)
                for i, (call_id, name, arguments) in sorted(self.calls.items())
                if name
            ),
        )


def _finish_reason(error: ChatError | None, finish: str) -> str:
    """A reply cut off on its way (lost connection) is interrupted: the window offers Retry."""
    if error is None:
        return finish
    return "interrupted" if error.kind == "connection_lost" else "error"


class GatewayHTTP:
    """One aiohttp session to the gateway, created on the bridge loop on first use."""

    def __init__(self, post: Post) -> None:
        self._post = post
        self.base_url = ""
        self.api_key = ""
        self.control_token = ""  # lets the daemon keep a chat reply as it streams
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=600)
            )
        return self._session

    def _headers(self) -> dict[str, str]:
        """The chat's own credential: the daemon's control token lets it through whatever the
        API keys (a key added in Settings never locks the open chat out); a key entered by
        hand is sent too."""
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if self.control_token:
            headers["X-Traylm-Token"] = self.control_token
        return headers

    def _keep_reply(self, request: ChatRequest) -> dict[str, str]:
        """Ask the daemon to keep the reply in the conversation as it streams (it survives the
        app being killed mid-reply)."""
        if not request.chat_id or request.position < 0 or not self.control_token:
            return {}
        return {"X-Traylm-Chat-Reply": f"{request.chat_id}:{request.position}"}

    def _unreachable(self, exc: BaseException) -> ChatError:
        where = self.base_url or "the gateway (no daemon connected yet)"
        return ChatError(
            "gateway_unreachable",
            f"cannot reach {where} ({type(exc).__name__}); the daemon may be down: "
            "the app reconnects on its own",
        )

    async def models(self) -> ModelsListed:
        """Names the gateway serves now (``GET /v1/models``), or why they could not be read."""
        if not self.base_url:
            return ModelsListed((), self._unreachable(ConnectionError("not connected")))
        try:
            async with self._http().get(
                self.base_url + "/v1/models",
                headers=self._headers(),
                timeout=aiohttp.ClientTimeout(total=10),
            ) as resp:
                body = await resp.read()
                if resp.status != 200:
                    return ModelsListed((), error_from_body(resp.status, body))
                data = json.loads(body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            return ModelsListed((), self._unreachable(exc))
        except ValueError as exc:
            return ModelsListed((), ChatError("http_error", f"bad /v1/models answer: {exc}"))
        # the gateway lists every servable model with its status (models on demand): all are
        # offered, since sending loads one; the loaded ones first, so a new chat starts on one
        listed = [m for m in data.get("data", ()) if isinstance(m, dict) and "id" in m]
        rank = {"loaded": 0, "loading": 1}
        listed.sort(key=lambda m: rank.get(_status(m), 2))
        names = tuple(str(m["id"]) for m in listed)
        loaded = tuple(str(m["id"]) for m in listed if _status(m) == "loaded")
        context = {
            str(m["id"]): int(m["max_model_len"])
            for m in listed
            if isinstance(m.get("max_model_len"), int) and m["max_model_len"] > 0
        }
        return ModelsListed(names, None, loaded, context)

    async def stream_chat(self, request: ChatRequest) -> ChatStreamEnded:
        collector = _Collector(request, self._post)
        if not self.base_url:
            return collector.ended("error", self._unreachable(ConnectionError("not connected")))
        try:
            async with self._http().post(
                self.base_url + "/v1/chat/completions",
                json=request.payload(),
                headers={**self._headers(), **self._keep_reply(request)},
            ) as resp:
                if resp.status != 200:
                    return collector.ended("error", error_from_body(resp.status, await resp.read()))
                async for line in resp.content:
                    if not collector.feed(line):
                        break
                else:
                    if collector.error is None:
                        return collector.ended(
                            "error",
                            ChatError(
                                "connection_lost",
                                "the stream ended before the reply was complete; "
                                "the partial reply is kept",
                            ),
                        )
        except asyncio.CancelledError:
            return collector.ended("stopped")  # the Stop button: keep what arrived
        except aiohttp.ClientConnectorError as exc:
            return collector.ended("error", self._unreachable(exc))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return collector.ended(
                "error",
                ChatError(
                    "connection_lost",
                    f"lost the connection to the gateway mid-reply ({type(exc).__name__}); "
                    "the partial reply is kept. Retry once the daemon is back.",
                ),
            )
        return collector.ended("")

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
