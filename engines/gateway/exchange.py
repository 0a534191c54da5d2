"""What the gateway learns about one request, for the flight recorder (engines/recorder/).

The gateway's middleware gives every request an id (sent back as ``x-request-id`` on every
answer, errors included) and, for a request on a model route that the ``requests.capture``
setting records, an ``Exchange``: who asked (this computer or a LAN peer, the API key's
fingerprint, never the key), the route, and then what forward.py and the relay learn (the
model, the engine and its GPUs, the body, tokens, TTFT, the reply). Nothing here parses a
reply or touches a disk: on the request's path an exchange only keeps bytes, bounded; the
recorder parses and writes them in batches from a thread.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from aiohttp import web

from engines.config.sections import RequestsSettings
from engines.gateway.proxy import ReplySink, UsageSink
from engines.gateway.security import Guard, hash_key

REQUEST_ID_HEADER = "x-request-id"
REQUEST_ID = web.RequestKey("traylm.request_id", str)
"""The recorder's id of the request (every request gets one)."""

CAPTURE_FULL = "full"
CAPTURE_METADATA = "metadata"
CAPTURE_OFF = "off"
CAPTURE_MODES = (CAPTURE_FULL, CAPTURE_METADATA, CAPTURE_OFF)

EVENTS_HEAD_FACTOR = 4
"""A stream's events are kept up to this many times ``requests.body_max_bytes`` (the reply
assembled from them is cut at ``body_max_bytes``: events wrap each token in JSON)."""
EVENTS_TAIL_BYTES = 16 * 1024
"""The last bytes of a stream, always kept: its finish reason, usage and error are there."""
MODEL_NAME_MAX_CHARS = 256
BENCH_RUN_HEADER = "X-Traylm-Bench-Run"
"""The benchmark run a request of this computer belongs to (engines/bench/load.py sends it)."""


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


@dataclass(eq=False, slots=True)
class Exchange:
    """One recorded request, filled in as it goes (see the module docstring)."""

    id: str
    arrived_s: float
    started: float
    method: str
    path: str
    client: str
    """"local" (this computer), "lan" (another one; ``peer`` is its address) or "box" (a paired
    box's request this box served for it; ``peer`` is the box's name)."""
    peer: str
    key: str
    """The first 8 hex digits of the API key's SHA-256 (as `traylm keys list` shows it)."""
    capture: str
    body_limit: int
    model: str = ""
    engine_id: str = ""
    gpus: str = ""
    remote: bool = False
    stream: bool = False
    content_type: str = ""
    request_body: bytes = b""
    request_size: int = 0
    status: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    duration_s: float = 0.0
    reply: bytes = b""
    """A whole reply (bounded), or the head of a stream's events (``streamed``)."""
    reply_size: int = 0
    reply_tail: bytes = b""
    streamed: bool = False
    reply_cut: bool = False
    _events: bytearray = field(default_factory=bytearray)

    @property
    def full(self) -> bool:
        return self.capture == CAPTURE_FULL

    def asked(self, model: str, body: bytes, content_type: str, *, stream: bool) -> None:
        """The request as forward.py relays it (before an attached server's renaming)."""
        self.model = model[:MODEL_NAME_MAX_CHARS]
        self.stream = stream
        self.content_type = content_type
        self.request_size = len(body)
        if self.full:
            self.request_body = bytes(body[: self.body_limit])

    def counted(self, usage: UsageSink | None) -> UsageSink:
        """A usage sink that notes the tokens here, then passes them on to ``usage``."""

        def sink(status: int, prompt: int | None, completion: int | None, seconds: float) -> None:
            self.prompt_tokens, self.completion_tokens = prompt, completion
            if usage is not None:
                usage(status, prompt, completion, seconds)

        return sink

    def answered(self, status: int, body: bytes | None) -> None:
        """The end of the request: its status and, for a whole reply, its body."""
        self.status = status
        self.duration_s = time.perf_counter() - self.started
        if self.streamed:
            self.reply = bytes(self._events)
            self._events = bytearray()
        elif body is not None:
            self.reply_size = len(body)
            self.reply_cut = len(body) > self.body_limit
            self.reply = bytes(body[: self.body_limit])

    def size_bytes(self) -> int:
        """What this exchange holds in memory (the recorder's bound on its queue)."""
        return len(self.request_body) + len(self.reply) + len(self.reply_tail) + 512

    def drop_bodies(self) -> None:
        """Keep only what metadata needs (the recorder is behind: memory first)."""
        self.request_body = b""
        self.reply = self.reply[-EVENTS_TAIL_BYTES:] if self.streamed else self.reply[:4096]
        self.capture = CAPTURE_METADATA


class ReplyCapture:
    """A ``ReplySink`` that keeps a stream's events on its exchange (bounded: a head of
    ``EVENTS_HEAD_FACTOR`` × the body limit when bodies are kept, and always a tail), then
    passes them on to ``inner`` (a chat window's ReplyTap)."""

    __slots__ = ("_ex", "_head_limit", "_inner")

    def __init__(self, exchange: Exchange, inner: ReplySink | None) -> None:
        self._ex = exchange
        self._inner = inner
        self._head_limit = exchange.body_limit * EVENTS_HEAD_FACTOR if exchange.full else 0

    def feed(self, events: bytes) -> None:
        ex = self._ex
        if ex.ttft_s is None:
            ex.ttft_s = time.perf_counter() - ex.started
            ex.streamed = True
        ex.reply_size += len(events)
        if len(ex._events) + len(events) <= self._head_limit:
            ex._events += events
        else:
            ex.reply_cut = ex.reply_cut or ex.full
            ex.reply_tail = (ex.reply_tail + events)[-EVENTS_TAIL_BYTES:]
        if self._inner is not None:
            self._inner.feed(events)

    async def finish(self) -> None:
        if self._inner is not None:
            await self._inner.finish()


EXCHANGE = web.RequestKey("traylm.exchange", Exchange)
"""The exchange of a request the recorder keeps (absent for the others)."""


def recorded(request: web.Request) -> bool:
    """The model routes: every POST outside the control API, and a Response's retrieve."""
    if not _model_side(request):
        return False
    return request.method == "POST" or request.path.startswith("/v1/responses/")


def _model_side(request: web.Request) -> bool:
    """Outside the control API (/api), which traylm's own tools call."""
    path = request.path
    return not (path.startswith("/api/") or path == "/api")


def begin(
    request: web.Request,
    rid: str,
    settings: RequestsSettings,
    guard: Guard,
    *,
    local: bool,
    box: str = "",
    refused: bool = False,
    client: str = "",
    model_route: bool | None = None,
) -> Exchange | None:
    """The exchange of a request the ``requests.capture`` settings record, or None. ``box``: a
    paired box's request (its name), recorded as another computer's; ``refused``: a request
    of any method outside the control API that the gateway refused (a wrong key on GET
    /v1/models), recorded though its method is not. ``client`` and ``model_route``: another
    API's server (Ollama's) names its client and says which of its routes are model routes."""
    capture = settings.capture if local else settings.capture_lan
    if model_route is None:
        model_route = recorded(request) or (refused and _model_side(request))
    if capture == CAPTURE_OFF or not model_route:
        return None
    key = ""
    internal = guard.internal(
        request.headers.get("Authorization"), request.headers.get("x-api-key")
    )
    if guard.keys_required and not internal:
        auth = request.headers.get("Authorization", "")
        given = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        given = given or request.headers.get("x-api-key", "").strip()
        key = hash_key(given)[:8] if given else ""
    run = _bench_run(request) if local and not box else ""
    who = client or ("box" if box else ("bench" if run else "local") if local else "lan")
    exchange = Exchange(
        id=rid,
        arrived_s=time.time(),
        started=time.perf_counter(),
        method=request.method,
        path=request.path[:512],
        client="tuner" if internal else who,
        peer=box or (f"run #{run}" if run else "" if local else str(request.remote or "")),
        key=key,
        capture=capture,
        body_limit=settings.body_max_bytes,
    )
    request[EXCHANGE] = exchange
    return exchange


def _bench_run(request: web.Request) -> str:
    """The benchmark run a request says it belongs to (a number), or "". Only this computer's
    requests are believed: a LAN client cannot pass its requests off as a benchmark's."""
    value = request.headers.get(BENCH_RUN_HEADER, "").strip()
    return value if value.isdigit() and len(value) <= 12 else ""
