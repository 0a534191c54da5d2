"""``GatewayContext``: what the gateway's routes work with, built once by the daemon.

It holds the gateway's settings (kept current through the settings subscription), the model
router (``ModelRouter``: which upstream serves a model, and loading one that is not loaded), the
per-upstream admission queues, the pause switch the thermal guard uses, and the two hooks the
daemon gives it: the remote fallback and the usage log. ``resolve`` is where a request's model
becomes an upstream.
"""

from __future__ import annotations

import asyncio
import logging
import re
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from engines.config.live import SettingsView
from engines.config.profiles import Profile
from engines.config.sections import Settings
from engines.core.http import error_response, openai_error
from engines.core.metrics import MetricsRegistry
from engines.errors import ModelUnavailable, TraylmError, quoted
from engines.events.codec import Event
from engines.events.models import ServableModel
from engines.gateway.admission import Admission
from engines.gateway.balance import Affinity
from engines.gateway.capabilities import CapabilityCache
from engines.gateway.exchange import Exchange
from engines.gateway.loading import Progress
from engines.gateway.metrics import GatewayMetrics
from engines.gateway.proxy import ReplySink, UsageSink
from engines.gateway.response_keep import ResponseStore
from engines.gateway.response_owners import ResponseOwners
from engines.gateway.security import Guard, header_bytes
from engines.gateway.throughput import ThroughputReporter
from engines.gateway.upstream import Upstream
from engines.gateway.upstream_client import UpstreamClient
from engines.gateway.usage import MODEL_NAME_MAX_CHARS, UNKNOWN_MODEL, UsageRecord
from engines.runtime.supervisor import EngineView
from engines.runtime.traffic import EngineTraffic

log = logging.getLogger(__name__)

SWEEP_PERIOD_S = 1.0
IDLE_SWEEP_S = 10.0  # nothing in flight: no stream can stall sooner (or than the limit)
CHAT_REPLY_HEADER = "X-Traylm-Chat-Reply"
TOKEN_HEADER = "X-Traylm-Token"  # noqa: S105 - a header name, not a secret
_CHAT_REPLY_RE = re.compile(r"^(\d{1,12}):(\d{1,9})$")
NOT_SERVED = "not_served"
"""ModelRouter.state of a name that no engine, profile or attached server serves."""
Fallback = Callable[[str, str], Upstream | None]
"""Remote fallback hook: (model, why) → an upstream, or None (engines/remote/service.py)."""
UsageLog = Callable[[UsageRecord], None]
"""Usage-log hook: one record per request (engines/gateway/usage.py)."""
ExchangeLog = Callable[[Exchange], None]
"""Flight-recorder hook: each recorded request once it is answered (engines/recorder/)."""
ReplyHook = Callable[[int, int, str], Awaitable[ReplySink]]
"""Chat-reply hook: (conversation id, position, model) → the sink that keeps the reply as it
streams (engines/chats/service.py ``tap_reply``); raises TraylmError (no such conversation)."""


class ModelRouter(EngineView, Protocol):
    """What the gateway asks of the daemon's models on demand (engines/ondemand/service.py)."""

    def upstream(self, model: str, affinity: Affinity | None = None) -> Upstream | None:
        """The upstream serving ``model`` now (a ready engine, an attached server that
        answers), or None; of several replicas, the one ``affinity`` and their load pick
        (balance.py). Dict lookups only: every request asks."""
        ...

    async def load(
        self, model: str, progress: Progress | None, affinity: Affinity | None = None
    ) -> Upstream:
        """Make ``model`` servable (start or wake it, single flight, placing it on the GPUs)
        and return its upstream once ready; ``progress`` is called at once and then every few
        seconds while it loads. Raises ModelUnavailable (unknown, JIT off, no room, failed)."""
        ...

    def state(self, model: str) -> str:
        """Why ``model`` has no upstream now, in a word: "not_served" (unknown), or its
        engine's state ("stopped", "starting", "sleeping", ...), or an attached server's."""
        ...

    def keep_alive(self, upstream: Upstream, seconds: float) -> None:
        """A request's ``keep_alive``: how long its model stays loaded after this request
        (0: unload when it ends; negative: never unload)."""
        ...

    async def listing(self) -> list[ServableModel]:
        """Every servable model with its status (GET /v1/models), read fresh (a profile saved
        a moment ago is listed)."""
        ...

    async def start_profile(self, model: str, *, fresh: bool) -> Profile | None:
        """The profile a load of ``model`` would start its engine from; None when its engine
        runs (asleep included) or loads already, for an attached server, or an unknown name.
        ``fresh``: after a new read of the catalog (a setting changed a moment ago)."""
        ...

    def served_as(self, engine_id: str) -> str:
        """Where an engine's settings live: "profile", "preset", "folder", "library",
        "attached", or "" (started with --model). Blocking (may read the profiles folder)."""
        ...


@dataclass
class Pause:
    """Set by the thermal guard: new requests get 503 until it is lifted."""

    reason: str
    retry_after_s: int = 30


class GatewayContext:
    """The gateway's state and hooks. No I/O: connections to engines open with the first request."""

    def __init__(
        self,
        *,
        settings: SettingsView,
        routing: ModelRouter,
        registry: MetricsRegistry,
        control_token: str,
        fallback: Fallback | None = None,
        usage: UsageLog | None = None,
        traffic: EngineTraffic | None = None,
        replies: ReplyHook | None = None,
        exchanges: ExchangeLog | None = None,
        kept: ResponseStore | None = None,
        publish: Callable[[Event], None] | None = None,
    ) -> None:
        """``traffic``: where relayed requests are counted for the supervisor (a private one
        when not given); ``replies``: keeps a chat reply as it streams, when the chat window
        asks for it (engines/chats); ``exchanges``: the flight recorder (engines/recorder);
        ``kept``: where Responses API responses are kept (the recorder's); ``publish``: the
        bus, for the throughput events while requests run."""
        self.kept = kept
        self.replies = replies
        self.exchanges = exchanges
        self.routing = routing
        self.traffic = traffic if traffic is not None else EngineTraffic()
        self.registry = registry
        self.control_token = control_token
        self.fallback = fallback
        self.usage = usage
        self.metrics = GatewayMetrics(registry)
        self.upstreams = UpstreamClient()
        self.admissions: dict[str, Admission] = {}
        self.throughput = (
            ThroughputReporter(
                tokens=self.metrics.tokens_out, admissions=self.admissions, publish=publish
            )
            if publish is not None
            else None
        )
        self.capabilities = CapabilityCache(routing.served_as)
        self.responses = ResponseOwners()
        self.pause: Pause | None = None
        self.started_at_s = time.time()
        self.settings = settings.current
        # the Host check keeps the port the gateway listens on: a new gateway.port applies at
        # the next start (checking it now locked every client out of the running daemon)
        self._listening_port = self.settings.gateway.port
        # the daemon's own measurements (tune, upgrade) pass the key check with this: random
        # for each run, never written anywhere; the recorder marks their requests the tuner's
        self.internal_key = "tlm-internal-" + secrets.token_urlsafe(32)
        self.guard = self._guard(self.settings)
        settings.subscribe(self.apply_settings)
        registry.gauge(
            "traylm_queue_depth",
            "Requests waiting for an engine.",
            lambda: {(("engine", k),): float(a.waiting) for k, a in self.admissions.items()},
        )
        registry.gauge(
            "traylm_requests_in_flight",
            "Requests being served by an engine.",
            lambda: {(("engine", k),): float(a.in_flight) for k, a in self.admissions.items()},
        )

    def _guard(self, settings: Settings) -> Guard:
        g = settings.gateway
        return Guard.build(
            hosts=g.allowed_hosts,
            origins=g.allowed_origins,
            key_digests=g.api_key_sha256,
            port=self._listening_port,
            lan=g.lan_sharing,
            keys_for=g.keys_for,
            internal_key=self.internal_key,
        )

    def apply_settings(self, settings: Settings) -> None:
        """The settings subscription: new keys, hosts and queue limits apply at once."""
        self.settings = settings
        self.guard = self._guard(settings)
        g = settings.gateway
        for adm in self.admissions.values():
            adm.max_concurrent, adm.max_queue = g.max_concurrent, g.max_queue
            adm.queue_timeout_s = g.queue_timeout_s

    def admission(self, engine_id: str) -> Admission:
        adm = self.admissions.get(engine_id)
        if adm is None:
            g = self.settings.gateway
            adm = self.admissions[engine_id] = Admission(
                max_concurrent=g.max_concurrent,
                max_queue=g.max_queue,
                queue_timeout_s=g.queue_timeout_s,
                on_busy=self.throughput.busy if self.throughput is not None else None,
            )
        return adm

    # ----------------------------------------------------------------- for the thermal guard

    @property
    def paused(self) -> str | None:
        """Why new requests are refused, or None."""
        return self.pause.reason if self.pause is not None else None

    def pause_requests(self, reason: str) -> None:
        self.pause = Pause(reason)

    def resume_requests(self) -> None:
        self.pause = None

    def in_flight(self, engine_id: str) -> int:
        """Requests an engine is serving now (the simulator's load follows it)."""
        adm = self.admissions.get(engine_id)
        return adm.in_flight if adm is not None else 0

    def activity(self, upstream: str) -> tuple[int, int, float | None]:
        """(requests in flight, requests queued, time.monotonic() since when it has been
        idle or None if no request has ended) for one upstream: idle unload reads it."""
        adm = self.admissions.get(upstream)
        if adm is None:
            return 0, 0, None
        return adm.in_flight, adm.waiting, adm.idle_since_s

    # ----------------------------------------------------------------- routing

    async def resolve(
        self,
        model: str,
        *,
        progress: Progress | None = None,
        affinity: Affinity | None = None,
        for_box: str = "",
    ) -> tuple[Upstream, Admission] | web.Response:
        """The upstream and admission queue for ``model``, or the error to answer with.

        Contract for every route that relays a request (``/v1/...``):

        - For a model that is ready this returns without suspending (dict lookups only).
        - For a servable model that is not loaded it may wait, up to a cold start, while the
          model loads; ``progress`` is then called every few seconds with a ``LoadProgress``
          (a streaming route passes ``ColdStream(request)`` so that the client gets bytes
          while it waits). Without ``progress`` it waits silently.
        - Enter ``admission.slot()`` right after it returns, before any other await: idle
          unload and eviction count a request as in flight from there.
        - ``affinity``: what ties the request to one of several replicas (balance.py).
        - ``for_box``: the paired box that sent the request: never the remote fallback (this
          box's user pays for it), and a model not ready here loads only with
          peers.load_for_peers.
        - An error comes back as an OpenAI-shaped ``web.Response`` (404 unknown model, 503 no
          room or load failed, ...), never as an exception.
        """
        up = self.routing.upstream(model, affinity)
        if up is None and for_box and not self.settings.peers.load_for_peers:
            return unavailable(
                ModelUnavailable(
                    f"{quoted(model)} stopped on the box asked, which loads no model for a paired "
                    "box (peers.load_for_peers is off there)",
                    code="model_not_loaded",
                    retry=False,
                )
            )
        if up is None:
            # a model with a remote alias goes there while it is not ready (no local load)
            fallback = (
                self.fallback(model, self.routing.state(model))
                if self.fallback and not for_box
                else None
            )
            if fallback is not None:
                return fallback, self.admission(f"remote:{fallback.name}")
            try:
                up = await self.routing.load(model, progress, affinity)
            except ModelUnavailable as exc:
                return unavailable(exc)
        return up, self.admission(up.name)

    # ----------------------------------------------------------------- usage log

    def usage_sink(self, path: str, model: str, upstream: Upstream) -> UsageSink | None:
        """``model`` was routed (an engine serves it, or it is a remote alias): it is a name
        from traylm's own configuration, kept as it is."""
        record = self.usage
        if record is None:
            return None
        model = model[:MODEL_NAME_MAX_CHARS]

        def sink(
            status: int, prompt: int | None, completion: int | None, duration_s: float
        ) -> None:
            record(
                UsageRecord(
                    model,
                    upstream.name,
                    path,
                    upstream.remote,
                    status,
                    prompt,
                    completion,
                    duration_s,
                )
            )

        return sink

    async def sweep_stalled_clients(self) -> None:
        """Runs while the gateway serves: once a second while requests are in flight (while
        none are, no stream can stall before the limit: it sleeps up to that long), a stream
        whose client took no write for gateway.client_stall_timeout_s is ended. Its connection
        is closed, so the relay's handler ends, the engine's request is aborted and the
        concurrency slot freed."""
        while True:
            limit_s = self.settings.gateway.client_stall_timeout_s
            idle = not self.traffic.any_in_flight()
            await asyncio.sleep(min(limit_s, IDLE_SWEEP_S) if idle else SWEEP_PERIOD_S)
            for flow in self.traffic.stalled_writers(time.monotonic(), limit_s):
                if flow.client is not None and not flow.client.is_closing():
                    flow.why = f"the client read nothing for {limit_s:g} s"
                    log.warning("ended a stream whose client read nothing for %g s", limit_s)
                    flow.client.abort()

    async def chat_reply(self, request: web.Request, model: str) -> ReplySink | web.Response | None:
        """The sink that keeps this chat reply as it streams, when the request asks for it
        (``X-Traylm-Chat-Reply: CHAT_ID:POSITION`` with the control token in
        ``X-Traylm-Token``: only traylm's own chat window writes to conversations); None when
        it does not; the error to answer with when the ask is wrong."""
        spec = request.headers.get(CHAT_REPLY_HEADER)
        if spec is None or self.replies is None or request.path != "/v1/chat/completions":
            return None
        token = request.headers.get(TOKEN_HEADER, "")
        if not secrets.compare_digest(header_bytes(token), self.control_token.encode()):
            return openai_error(
                401,
                f"{CHAT_REPLY_HEADER} needs the control token (daemon.json) in {TOKEN_HEADER}",
                type_="unauthorized",
            )
        found = _CHAT_REPLY_RE.match(spec.strip())
        if found is None:
            return openai_error(
                400, f"{CHAT_REPLY_HEADER} must be CHAT_ID:POSITION (two whole numbers)"
            )
        try:
            return await self.replies(int(found[1]), int(found[2]), model)
        except TraylmError as exc:
            return error_response(exc)

    def log_refused(self, path: str, model: str, status: int, engine_id: str = "") -> None:
        """Requests the gateway answered itself (not served, starting, paused, queue full).
        A model no engine serves is logged as "(unknown)": the log never keeps what a client
        sent (a 7 MiB name once grew the database by 315 MiB in 8 s)."""
        if self.usage is not None:
            if self.routing.state(model) == NOT_SERVED:
                model = UNKNOWN_MODEL
            record = UsageRecord(
                model[:MODEL_NAME_MAX_CHARS], engine_id, path, False, status, None, None, 0.0
            )
            self.usage(record)


def unavailable(exc: ModelUnavailable) -> web.Response:
    """A ModelUnavailable as the OpenAI-shaped error: 404 names the model param; Retry-After
    when waiting helps; ``x-should-retry: false`` stops the openai SDK from retrying what will
    fail again (it retries every 5xx otherwise)."""
    headers = {"x-should-retry": "true" if exc.retry else "false"}
    if exc.retry_after_s is not None:
        headers["Retry-After"] = str(exc.retry_after_s)
    return openai_error(
        exc.http_status,
        exc.message,
        type_="invalid_request_error" if exc.http_status == 400 else exc.code,
        code=exc.code,
        param="model" if exc.http_status == 404 else None,
        headers=headers,
    )


GATEWAY: web.AppKey[GatewayContext] = web.AppKey("gateway", GatewayContext)
"""``request.app[GATEWAY]``: the gateway's context (middlewares and the OpenAI routes)."""
