"""FAKE engine, part two: the newer APIs vLLM 0.32 serves, shaped as vLLM shapes them (read from
its source: vllm/entrypoints/openai/responses, anthropic, serve/tokenize, pooling,
speech_to_text), with the model still fake (numbered words).

Like vLLM, which routes exist depends on the task the model runs (``tasks_of``): a generative
model has chat, completions, responses and messages but no embeddings; an embedding model the
reverse; a Whisper model only audio. A route that is not mounted answers FastAPI's bare
``404 {"detail": "Not Found"}``. Without a readable config.json the fake mounts everything (the
older fast tests name models like ``org/fake`` that have no folder).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

from aiohttp import web

ALL_TASKS = frozenset({"generate", "embed", "transcription"})
TOOL_CHOICE_ERROR = (
    '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set'
)
MESSAGES_CONTEXT_TOKENS = 8192
"""A longer ``max_tokens`` on /v1/messages is refused (vLLM refuses what the context cannot
hold, in Anthropic's shape with its own error type)."""
_ids = itertools.count(1)


def tasks_of(args: argparse.Namespace) -> frozenset[str]:
    """vLLM's decision, simplified: --runner, else the architecture's name suffix."""
    if args.runner == "pooling":
        return frozenset({"embed"})
    config = Path(args.model) / "config.json"
    try:
        arch = json.loads(config.read_text())["architectures"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return ALL_TASKS if args.runner == "auto" else frozenset({"generate"})
    if arch.startswith("Whisper"):
        return frozenset({"transcription"})
    if args.runner == "generate" or arch.endswith(("ForCausalLM", "ForConditionalGeneration")):
        return frozenset({"generate"})
    return frozenset({"embed"})


def vllm_error(status: int, message: str, *, type_: str = "BadRequestError", param: Any = None):
    body = {"error": {"message": message, "type": type_, "param": param, "code": status}}
    return web.json_response(body, status=status)


@web.middleware
async def fastapi_not_found(request: web.Request, handler: Any) -> web.StreamResponse:
    """FastAPI's answer for a route that is not mounted."""
    try:
        return await handler(request)
    except web.HTTPNotFound:
        return web.json_response({"detail": "Not Found"}, status=404)
    except web.HTTPMethodNotAllowed:
        return web.json_response({"detail": "Method Not Allowed"}, status=405)


def needs_tool_parser(body: dict[str, Any], args: argparse.Namespace) -> bool:
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        choice = choice.get("type")
    return bool(tools) and choice not in ("none",) and not args.tool_call_parser


class FakeAPIs:
    """Handlers for responses, messages, tokenize, pooling and audio."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.store = os.environ.get("VLLM_ENABLE_RESPONSES_API_STORE") == "1"
        self.responses: dict[str, dict[str, Any]] = {}
        self.ids: dict[str, int] = {}
        self.vocab: dict[int, str] = {}

    def _served(self, body: dict[str, Any]) -> web.Response | None:
        if self.args.accept_any_model or body.get("model") in self.args.served_model_name:
            return None
        return vllm_error(
            404, f"The model `{body.get('model')}` does not exist.", type_="NotFoundError"
        )

    # ------------------------------------------------------------------ responses

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        wrong = self._served(body)
        if wrong is not None:
            return wrong
        if needs_tool_parser(body, self.args):
            return vllm_error(400, TOOL_CHOICE_ERROR)
        previous = body.get("previous_response_id")
        if previous and previous not in self.responses:
            return vllm_error(
                404,
                f"Response with id '{previous}' not found.",
                type_="invalid_request_error",
                param="response_id",
            )
        words = [f"w{i}" for i in range(int(body.get("max_output_tokens") or 8))]
        response = _response(body["model"], words)
        response["previous_response_id"] = previous if isinstance(previous, str) else None
        if self.store and body.get("store", True):
            self.responses[response["id"]] = response
        if not body.get("stream"):
            return web.json_response(response)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for event in _response_events(response, words):
            await resp.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        return resp

    async def get_response(self, request: web.Request) -> web.Response:
        found = self.responses.get(request.match_info["response_id"])
        if found is None:
            return self._not_found(request.match_info["response_id"])
        return web.json_response(found)

    async def cancel_response(self, request: web.Request) -> web.Response:
        found = self.responses.get(request.match_info["response_id"])
        if found is None:
            return self._not_found(request.match_info["response_id"])
        return vllm_error(400, "Cannot cancel a synchronous response.", param="response_id")

    @staticmethod
    def _not_found(response_id: str) -> web.Response:
        return vllm_error(
            404,
            f"Response with id '{response_id}' not found.",
            type_="invalid_request_error",
            param="response_id",
        )

    # ------------------------------------------------------------------ anthropic messages

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if "max_tokens" not in body:  # FastAPI's validation error, OpenAI-shaped as vLLM's is
            return vllm_error(400, "body.max_tokens: Field required")
        wrong = self._served(body)
        if wrong is not None:
            return _anthropic(wrong)
        if needs_tool_parser(body, self.args):
            return _anthropic(vllm_error(400, TOOL_CHOICE_ERROR))
        temperature = body.get("temperature", 1.0)
        if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 1:
            # pydantic's error, answered by vLLM's app-wide handler in OpenAI's shape
            return vllm_error(400, "body.temperature: Input should be less than or equal to 1")
        if int(body["max_tokens"]) > MESSAGES_CONTEXT_TOKENS:  # the handler's own error
            return _anthropic(
                vllm_error(400, f"max_tokens is more than {MESSAGES_CONTEXT_TOKENS} tokens")
            )
        words = [f"w{i}" for i in range(int(body["max_tokens"]))]
        message = {
            "id": f"msg_fake{next(_ids)}",
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": [{"type": "text", "text": " ".join(words)}],
            "stop_reason": "max_tokens",
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": len(words)},
        }
        if not body.get("stream"):
            return web.json_response(message)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        deltas = 0
        for name, data in _message_events(message, words):
            event = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            await resp.write(event)
            deltas += name == "content_block_delta"
            if self.args.crash_after_tokens and deltas >= self.args.crash_after_tokens:
                await resp.write(event[: len(event) // 2])  # killed mid-write, as vLLM was
                await resp.drain()
                await asyncio.sleep(0.05)
                os.kill(os.getpid(), signal.SIGKILL)
            if self.args.token_delay:
                await asyncio.sleep(self.args.token_delay)
        return resp

    async def count_tokens(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"input_tokens": 3 * len(body.get("messages", []))})

    # ------------------------------------------------------------------ tokenize

    async def tokenize(self, request: web.Request) -> web.Response:
        """One token per word (the fake model's own numbered words are words too); a chat
        costs its words plus a small template: 3 tokens a message and 1 for the reply's start."""
        body = await request.json()
        if "messages" in body:
            words = [w for m in body["messages"] for w in str(m.get("content", "")).split()]
            template = 3 * len(body["messages"]) + int(bool(body.get("add_generation_prompt")))
            tokens = [self._token(w) for w in words] + [0] * template
        else:
            tokens = [self._token(w) for w in str(body.get("prompt", "")).split()]
        return web.json_response({"count": len(tokens), "max_model_len": 2048, "tokens": tokens})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await request.json()
        words = [self.vocab[t] for t in body.get("tokens", []) if t in self.vocab]
        return web.json_response({"prompt": " ".join(words)})

    def _token(self, word: str) -> int:
        if word not in self.ids:
            self.ids[word] = len(self.ids) + 1
            self.vocab[self.ids[word]] = word
        return self.ids[word]

    # ------------------------------------------------------------------ pooling

    async def rerank(self, request: web.Request) -> web.Response:
        body = await request.json()
        docs = body.get("documents", [])
        results = [
            {"index": i, "document": {"text": d}, "relevance_score": 1.0 / (i + 1)}
            for i, d in enumerate(docs)
        ]
        return web.json_response(
            {
                "id": f"rerank-{next(_ids)}",
                "model": body.get("model"),
                "results": results,
                "usage": {"total_tokens": len(docs)},
            }
        )

    async def score(self, request: web.Request) -> web.Response:
        body = await request.json()
        second = body.get("documents") or body.get("text_2") or []
        items = second if isinstance(second, list) else [second]
        data = [{"index": i, "object": "score", "score": 0.5} for i, _ in enumerate(items)]
        return web.json_response(
            {
                "id": f"score-{next(_ids)}",
                "object": "list",
                "created": int(time.time()),
                "model": body.get("model"),
                "data": data,
                "usage": {"prompt_tokens": len(items)},
            }
        )

    # ------------------------------------------------------------------ audio

    async def transcribe(self, request: web.Request) -> web.Response:
        form = await request.post()
        audio = form.get("file")
        if not isinstance(audio, web.FileField):
            return vllm_error(400, "file: Field required")
        size = len(audio.file.read())
        return web.json_response(
            {"text": f"w0 w1 ({size} bytes)", "usage": {"type": "duration", "seconds": 1}}
        )


def _response(model: str, words: list[str]) -> dict[str, Any]:
    return {
        "id": f"resp_fake{next(_ids)}",
        "object": "response",
        "created_at": int(time.time()),
        "model": model,
        "status": "completed",
        "output": [
            {
                "id": f"msg_fake{next(_ids)}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": " ".join(words), "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": 3,
            "output_tokens": len(words),
            "total_tokens": 3 + len(words),
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        },
    }


def _response_events(response: dict[str, Any], words: list[str]) -> list[dict[str, Any]]:
    item = response["output"][0]
    started = {**response, "status": "in_progress", "output": []}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {**item, "status": "in_progress", "content": []},
        },
    ]
    for word in words:
        events.append(
            {
                "type": "response.output_text.delta",
                "item_id": item["id"],
                "output_index": 0,
                "content_index": 0,
                "delta": word + " ",
                "logprobs": [],
            }
        )
    events += [
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return [{**e, "sequence_number": i} for i, e in enumerate(events)]


def _message_events(message: dict[str, Any], words: list[str]) -> list[tuple[str, dict[str, Any]]]:
    start = {
        **message,
        "content": [],
        "stop_reason": None,
        "usage": {"input_tokens": 3, "output_tokens": 0},
    }
    events: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
        ),
    ]
    for word in words:
        events.append(
            (
                "content_block_delta",
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": word + " "},
                },
            )
        )
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens"},
                "usage": {"output_tokens": len(words)},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    return events


def _anthropic(resp: web.Response) -> web.Response:
    """vLLM's translate_error_response: its OpenAI-shaped error in Anthropic's shape."""
    error = json.loads(resp.body)["error"]  # type: ignore[arg-type]
    body = {"type": "error", "error": {"type": error["type"], "message": error["message"]}}
    return web.json_response(body, status=resp.status)


def add_routes(app: web.Application, apis: FakeAPIs, tasks: frozenset[str]) -> None:
    app.router.add_post("/tokenize", apis.tokenize)
    app.router.add_post("/detokenize", apis.detokenize)
    if "generate" in tasks:
        app.router.add_post("/v1/responses", apis.create_response)
        app.router.add_get("/v1/responses/{response_id}", apis.get_response)
        app.router.add_post("/v1/responses/{response_id}/cancel", apis.cancel_response)
        app.router.add_post("/v1/messages", apis.messages)
        app.router.add_post("/v1/messages/count_tokens", apis.count_tokens)
    if "embed" in tasks:
        app.router.add_post("/v1/rerank", apis.rerank)
        app.router.add_post("/v1/score", apis.score)
    if "transcription" in tasks:
        app.router.add_post("/v1/audio/transcriptions", apis.transcribe)
        app.router.add_post("/v1/audio/translations", apis.transcribe)
