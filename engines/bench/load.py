"""Async load generator: streams OpenAI chat completions and times every content chunk.

Each request asks for ``stream_options.include_usage`` so that the engine's own token counts are
used when it sends them (vLLM does); otherwise output tokens are the content chunks counted, and
the level says so (``output_tokens_source = "chunks"``). Requests arrive all at once or as a
Poisson process at a mean rate, and at most ``concurrency`` are in flight; a request's start is
when it is sent (after it got a slot), as in `vllm bench serve`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from engines.bench.metrics import RequestTiming
from engines.gateway.exchange import BENCH_RUN_HEADER, REQUEST_ID_HEADER


@dataclass(frozen=True)
class RequestSpec:
    """One request of a workload."""

    messages: tuple[Mapping[str, str], ...]
    max_tokens: int
    ignore_eos: bool = False
    input_tokens: int | None = None  # counted with the engine's tokenizer, or estimated
    input_source: str = "approx"  # "tokenize" | "approx"
    body: Mapping[str, Any] | None = None
    """A recorded request's body, sent as it is (its model replaced; engines/bench/replay.py)."""
    path: str = ""
    """The route of ``body`` ("/v1/embeddings"); "" for chat completions."""
    at_s: float | None = None
    """When to send it, from the start (a recorded pace); None: by the rate."""


STREAMED_ROUTES = ("/v1/chat/completions", "/v1/completions")
"""Recorded requests on these routes are streamed, so that their first token is timed."""


@dataclass(frozen=True)
class Target:
    """Where requests go: an OpenAI base URL (ending in /v1) and the model name."""

    base_url: str
    model: str
    api_key: str = ""
    timeout_s: float = 600.0
    run_id: int = 0  # sent in BENCH_RUN_HEADER: the recorder marks the requests the run's

    @property
    def chat_url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def url_of(self, spec: RequestSpec) -> str:
        if not spec.path:
            return self.chat_url
        root = self.base_url.rstrip("/").removesuffix("/v1")
        return root + spec.path

    def headers(self) -> dict[str, str]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        if self.run_id:
            headers[BENCH_RUN_HEADER] = str(self.run_id)
        return headers


@dataclass
class LoadResult:
    timings: list[RequestTiming] = field(default_factory=list)
    start_s: float = 0.0  # perf_counter when the first request could go
    end_s: float = 0.0  # perf_counter when the last one finished (or the cancel)
    max_in_flight: int = 0
    cancelled: bool = False

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end_s - self.start_s)


def request_body(target: Target, spec: RequestSpec) -> dict[str, Any]:
    if spec.body is not None:  # a recorded request, to the benchmarked model
        recorded = {**spec.body, "model": target.model}
        if spec.path in STREAMED_ROUTES:
            recorded["stream"] = True
            recorded["stream_options"] = {"include_usage": True}
        return recorded
    body: dict[str, Any] = {
        "model": target.model,
        "messages": [dict(m) for m in spec.messages],
        "max_tokens": spec.max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True  # vLLM/SGLang extension: every request runs to max_tokens
    return body


async def send_request(
    http: aiohttp.ClientSession, target: Target, spec: RequestSpec
) -> RequestTiming:
    """Send one streaming request; never raises for HTTP or connection trouble (the timing
    carries the error instead)."""
    chunks: list[float] = []
    usage: dict[str, Any] = {}
    error = ""
    request_id = ""
    timeout = aiohttp.ClientTimeout(total=target.timeout_s, sock_connect=10)
    start = time.perf_counter()
    try:
        async with http.post(
            target.url_of(spec),
            json=request_body(target, spec),
            headers=target.headers(),
            timeout=timeout,
        ) as resp:
            request_id = resp.headers.get(REQUEST_ID_HEADER, "")[:64]
            if resp.status != 200:
                error = f"HTTP {resp.status}: {_error_message(await resp.text())}"
            elif resp.content_type != "text/event-stream":  # a recorded non-streamed request
                data = await resp.json(content_type=None)
                chunks.append(time.perf_counter())
                if isinstance(data, dict) and isinstance(data.get("usage"), dict):
                    usage.update(data["usage"])
            else:
                error = await _read_stream(resp, chunks, usage)
    except TimeoutError:
        error = f"no complete reply within {target.timeout_s:g} s"
    except aiohttp.ClientError as exc:
        error = f"{type(exc).__name__}: {exc}"[:300]
    except ValueError as exc:  # an SSE line longer than the stream reader's limit
        error = f"unreadable stream: {exc}"[:300]
    end = time.perf_counter()
    return RequestTiming(
        start_s=start,
        end_s=end,
        chunk_times_s=tuple(chunks),
        usage_output_tokens=_int(usage.get("completion_tokens")),
        usage_input_tokens=_int(usage.get("prompt_tokens")),
        input_tokens=spec.input_tokens,
        input_source=spec.input_source,
        error=error,
        request_id=request_id,
    )


async def _read_stream(
    resp: aiohttp.ClientResponse, chunks: list[float], usage: dict[str, Any]
) -> str:
    """Read SSE lines until [DONE]; returns an error text ("" when the stream was fine)."""
    async for raw in resp.content:
        now = time.perf_counter()
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return ""
        try:
            data = json.loads(payload)
        except ValueError:
            return f"the stream sent something that is not JSON: {payload[:80]!r}"
        if not isinstance(data, dict):
            continue
        if data.get("error"):
            return f"the engine reported: {_error_message(json.dumps(data))}"
        if _has_text(data.get("choices")):
            chunks.append(now)
        if isinstance(data.get("usage"), dict):
            usage.update(data["usage"])
    return "" if chunks else "the stream ended without [DONE]"


def _has_text(choices: Any) -> bool:
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return False
    if choices[0].get("text"):  # completions
        return True
    delta = choices[0].get("delta") or {}
    if not isinstance(delta, dict):
        return False
    return any(delta.get(k) for k in ("content", "reasoning_content", "reasoning"))


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
        err = data.get("error", data) if isinstance(data, dict) else data
        message = err.get("message", text) if isinstance(err, dict) else str(err)
    except ValueError:
        message = text
    return str(message).strip()[:200] or "(empty body)"


def poisson_arrivals_s(count: int, rate_rps: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of ``count`` Poisson arrivals; all 0 when rate is 0."""
    if rate_rps <= 0:
        return [0.0] * count
    rng = random.Random(seed)  # noqa: S311 - a schedule, not a secret
    at, out = 0.0, []
    for _ in range(count):
        out.append(at)
        at += rng.expovariate(rate_rps)
    return out


async def run_load(
    http: aiohttp.ClientSession,
    target: Target,
    specs: Sequence[RequestSpec],
    *,
    concurrency: int,
    rate_rps: float = 0.0,
    seed: int = 0,
    stop: asyncio.Event | None = None,
    on_done: Callable[[RequestTiming], None] | None = None,
) -> LoadResult:
    """Send ``specs`` with at most ``concurrency`` in flight. ``stop`` cancels what is in flight
    and returns what finished (``cancelled=True``)."""
    result = LoadResult()
    slots = asyncio.Semaphore(max(1, concurrency))
    in_flight = 0
    if specs and all(s.at_s is not None for s in specs):  # a recorded pace
        arrivals = [float(s.at_s or 0.0) for s in specs]
    else:
        arrivals = poisson_arrivals_s(len(specs), rate_rps, seed)

    async def one(spec: RequestSpec) -> None:
        nonlocal in_flight
        async with slots:
            in_flight += 1
            result.max_in_flight = max(result.max_in_flight, in_flight)
            try:
                timing = await send_request(http, target, spec)
            finally:
                in_flight -= 1
        result.timings.append(timing)
        if on_done is not None:
            on_done(timing)

    tasks: list[asyncio.Task[None]] = []

    async def dispatch() -> None:
        for spec, at_s in zip(specs, arrivals, strict=True):
            delay = at_s - (time.perf_counter() - result.start_s)
            if delay > 0:
                await asyncio.sleep(delay)  # the arrival schedule, not a wait for a condition
            tasks.append(asyncio.create_task(one(spec)))
        await asyncio.gather(*tasks)

    result.start_s = time.perf_counter()
    main = asyncio.create_task(dispatch())
    stopped = asyncio.create_task(stop.wait()) if stop is not None else None
    try:
        waiting = {main, stopped} if stopped is not None else {main}
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not main.done():
            result.cancelled = True
            main.cancel()
            for task in tasks:
                task.cancel()
            await asyncio.gather(main, *tasks, return_exceptions=True)
        if stopped is not None:
            stopped.cancel()
    result.end_s = time.perf_counter()
    if not result.cancelled:
        main.result()  # a bug in a request task surfaces here
    return result
