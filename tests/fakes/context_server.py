"""FAKE OpenAI-compatible server with a small context, to be attached to a real daemon
(``traylm attach``): a conversation that outgrows it is refused the way vLLM refuses it.

Tokens are words here: a prompt's tokens are the words of its messages (plus one per message),
a reply is "w0 w1 …". With ``clamp`` off (vLLM's way) a request whose prompt plus max_tokens
exceeds the context is a 400 with vLLM's message; with ``clamp`` on (llama.cpp's and Ollama's
way) the reply is cut when the context is full, with finish_reason "length".
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web

from engines.core.procs import free_loopback_port


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(len(str(m.get("content", "")).split()) + 1 for m in messages)


class FakeContextServer:
    """Serves one model, ``name``, with a context of ``context_tokens`` on a thread of its own."""

    def __init__(self, name: str, context_tokens: int, *, clamp: bool = False) -> None:
        self.name = name
        self.context_tokens = context_tokens
        self.clamp = clamp
        self.prompts: list[int] = []  # each request's prompt tokens, refused ones too
        self.port = free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> FakeContextServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _health(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, _request: web.Request) -> web.Response:
        model = {"id": self.name, "object": "model", "max_model_len": self.context_tokens}
        return web.json_response({"object": "list", "data": [model]})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = prompt_tokens(body.get("messages", []))
        self.prompts.append(prompt)
        asked = int(body.get("max_tokens") or 16)
        room = self.context_tokens - prompt
        if prompt + asked > self.context_tokens and (not self.clamp or room < 1):
            message = (
                f"This model's maximum context length is {self.context_tokens} tokens. However, "
                f"you requested {prompt + asked} tokens ({prompt} in the messages, {asked} in "
                "the completion). Please reduce the length of the messages or completion."
            )
            error = {"object": "error", "message": message, "type": "BadRequestError",
                     "param": None, "code": 400}  # fmt: skip
            return web.json_response(error, status=400)
        count = min(asked, room)
        finish = "length"  # max_tokens reached, or (clamped) the context full
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(count):
            delta = {"choices": [{"index": 0, "delta": {"content": f"w{i} "}}]}
            await resp.write(f"data: {json.dumps(delta)}\n\n".encode())
        end = {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
        usage = {"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": count}}
        await resp.write(f"data: {json.dumps(end)}\n\ndata: {json.dumps(usage)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp
