"""The prompts of the built-in workloads: the requests one benchmark level sends.

- ``random``: every request has ``input_len`` prompt tokens and asks for ``output_len`` tokens
  with ``ignore_eos`` (so every reply has exactly that length). Prompts are random words, cut to
  length with the served model's own tokenizer through vLLM's ``/tokenize`` and ``/detokenize``
  (counted as the chat template renders them). Without those routes (TensorRT-LLM, a remote API)
  the prompt is ``input_len`` words and its length is labelled ``approx``.
- ``chat``: a small built-in set of varied prompts, replies as long as the model wants up to
  ``output_len`` tokens (no ``ignore_eos``).

Every prompt starts differently, so prefix caching does not turn the run into a cache test.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Mapping, Sequence
from typing import Any

import aiohttp

from engines.bench.load import RequestSpec
from engines.errors import ConfigError

WORKLOADS = ("random", "chat")
TOKENIZE_PARALLEL = 8
FIT_TRIES = 4

_WORDS_TEXT = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect use class control care field development role effort rate heart drug "
    "show leader light voice wife police mind price report decision son view relationship town "
    "road arm difference value building action model season society tax director position "
    "player record paper space ground form event official matter center couple site project "
    "activity star table need court oil situation cost industry figure street image phone data "
    "picture practice piece land product doctor wall patient worker news test movie north love "
    "support technology step baby computer type attention film tree source organization hair "
    "window evidence population river green bright quiet simple early small large strong"
)
WORDS: tuple[str, ...] = tuple(_WORDS_TEXT.split())

CHAT_PROMPTS = (
    "Explain in two sentences why the sky is blue.",
    "Write a short poem about a lighthouse keeper who counts ships.",
    "What are three practical tips for keeping a small vegetable garden healthy in summer?",
    "Summarise the plot of a detective story in which the butler is innocent.",
    "Translate 'good morning, how did you sleep?' into French, Spanish and German.",
    "Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring.",
    "List five questions a new employee could ask in their first week.",
    "Describe how a bicycle gear system works to a ten-year-old.",
    "Compare renting and buying a flat in a paragraph of pros and cons.",
    "Give me a recipe for a quick vegetarian pasta dinner for two.",
    "What is the difference between a list and a tuple in Python? Answer briefly.",
    "Draft a polite email asking a colleague to review a document by Friday.",
)


class EngineTokenizer:
    """vLLM's tokenizer routes (``/tokenize``, ``/detokenize`` at the server root)."""

    def __init__(self, http: aiohttp.ClientSession, root_url: str, model: str) -> None:
        self._http = http
        self._root = root_url.rstrip("/")
        self._model = model
        self.max_model_len: int | None = None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        timeout = aiohttp.ClientTimeout(total=30, sock_connect=5)
        async with self._http.post(self._root + path, json=body, timeout=timeout) as resp:
            if resp.status != 200:
                raise LookupError(f"{path}: HTTP {resp.status}")
            data = await resp.json(content_type=None)
        if not isinstance(data, dict):
            raise LookupError(f"{path}: not a JSON object")
        return data

    async def probe(self) -> bool:
        """True when both routes answer (and remembers the model's max_model_len)."""
        try:
            data = await self._post("/tokenize", {"model": self._model, "prompt": "hello"})
            await self._post("/detokenize", {"model": self._model, "tokens": data["tokens"]})
        except (LookupError, KeyError, TypeError, ValueError, aiohttp.ClientError, TimeoutError):
            return False
        limit = data.get("max_model_len")
        self.max_model_len = limit if isinstance(limit, int) else None
        return True

    async def tokens(self, text: str) -> list[int]:
        body = {"model": self._model, "prompt": text, "add_special_tokens": False}
        return [int(t) for t in (await self._post("/tokenize", body))["tokens"]]

    async def text(self, tokens: Sequence[int]) -> str:
        body = {"model": self._model, "tokens": list(tokens)}
        return str((await self._post("/detokenize", body))["prompt"])

    async def chat_count(self, messages: Sequence[Mapping[str, str]]) -> int:
        body = {
            "model": self._model,
            "messages": [dict(m) for m in messages],
            "add_generation_prompt": True,
        }
        return int((await self._post("/tokenize", body))["count"])


def _user(text: str) -> tuple[Mapping[str, str], ...]:
    return ({"role": "user", "content": text},)


def _random_words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


async def build_requests(
    workload: str,
    *,
    count: int,
    input_len: int,
    output_len: int,
    seed: int,
    tokenizer: EngineTokenizer | None,
) -> list[RequestSpec]:
    """``count`` requests of ``workload``; prompts differ with ``seed``."""
    if workload not in WORKLOADS:
        raise ConfigError(f"unknown workload {workload!r}; use one of: {', '.join(WORKLOADS)}")
    rng = random.Random(seed)  # noqa: S311 - prompts, not secrets
    if workload == "chat":
        return [_chat_request(rng, i, output_len) for i in range(count)]
    if tokenizer is None:
        return [
            RequestSpec(
                messages=_user(_random_words(rng, input_len)),
                max_tokens=output_len,
                ignore_eos=True,
                input_tokens=input_len,
                input_source="approx",
            )
            for _ in range(count)
        ]
    overhead = await _template_overhead(tokenizer)
    if input_len <= overhead:
        raise ConfigError(
            f"--input-len {input_len} is not longer than the chat template's own {overhead} "
            f"tokens; use --input-len {overhead + 1} or more"
        )
    limit = tokenizer.max_model_len
    if limit is not None and input_len + output_len > limit:
        raise ConfigError(
            f"--input-len {input_len} + --output-len {output_len} exceeds the model's "
            f"max_model_len {limit}; shorten them"
        )
    texts = [_random_words(rng, input_len + 8) for _ in range(count)]
    gate = asyncio.Semaphore(TOKENIZE_PARALLEL)

    async def fitted(text: str) -> RequestSpec:
        async with gate:
            messages, n = await _fit(tokenizer, text, input_len, overhead)
        return RequestSpec(
            messages=messages,
            max_tokens=output_len,
            ignore_eos=True,
            input_tokens=n,
            input_source="tokenize",
        )

    return list(await asyncio.gather(*(fitted(t) for t in texts)))


def _chat_request(rng: random.Random, index: int, output_len: int) -> RequestSpec:
    prompt = CHAT_PROMPTS[rng.randrange(len(CHAT_PROMPTS))]
    text = f"Request {index}. {prompt}"  # a different start: no prefix-cache hits
    return RequestSpec(
        messages=_user(text),
        max_tokens=output_len,
        ignore_eos=False,
        input_tokens=round(len(text.split()) * 1.3),
        input_source="approx",
    )


async def _template_overhead(tokenizer: EngineTokenizer) -> int:
    """Tokens the chat template adds around one user message."""
    probe = "hello world"
    return await tokenizer.chat_count(_user(probe)) - len(await tokenizer.tokens(probe))


async def _fit(
    tokenizer: EngineTokenizer, text: str, input_len: int, overhead: int
) -> tuple[tuple[Mapping[str, str], ...], int]:
    """Cut ``text`` at a token boundary so that the rendered chat prompt has ``input_len``
    tokens (re-encoding a cut can merge differently, so it checks and retries)."""
    ids = await tokenizer.tokens(text)
    keep = min(len(ids), input_len - overhead)
    best: tuple[tuple[Mapping[str, str], ...], int] | None = None
    for _ in range(FIT_TRIES):
        messages = _user(await tokenizer.text(ids[:keep]))
        n = await tokenizer.chat_count(messages)
        if best is None or abs(n - input_len) < abs(best[1] - input_len):
            best = (messages, n)
        if n == input_len or (keep >= len(ids) and n < input_len):
            break
        keep = max(1, min(len(ids), keep + input_len - n))
    assert best is not None
    return best
