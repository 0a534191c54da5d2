"""Run in a box's namespace: chats through that box's gateway (its daemon.json's URL; openai
SDK), each line of output one JSON object, so a test reads which replica served what.

python -m tests.engines.peers.box_chat stream MODEL MAX_TOKENS TEXT
    one streamed chat (TEXT: its conversation): {"engine": X-Traylm-Engine} first, {"chunk": n} as each content chunk
    comes (the test may kill a box after the first), then {"chunks", "error"}
python -m tests.engines.peers.box_chat many MODEL COUNT
    COUNT short chats one after another, each its own conversation: {"engine", "error"} each
"""

from __future__ import annotations

import json
import sys

import openai

from engines.config.paths import Paths


def _client() -> openai.OpenAI:
    url = json.loads(Paths.from_env().daemon_json.read_text())["url"]  # this box's gateway
    return openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=120)


def _say(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


def stream(model: str, max_tokens: int, text: str) -> None:
    chunks = 0
    try:
        raw = _client().chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": text}],
            max_tokens=max_tokens,
            stream=True,
        )
        _say(engine=raw.headers.get("x-traylm-engine", ""))
        for event in raw.parse():
            if event.choices and event.choices[0].delta.content:
                chunks += 1
                _say(chunk=chunks)
    except openai.APIError as exc:
        _say(chunks=chunks, error=f"{type(exc).__name__}: {exc}")
        return
    _say(chunks=chunks, error="")


def many(model: str, count: int) -> None:
    client = _client()
    for i in range(count):
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": f"question {i}"}],  # a new conversation
                max_tokens=2,
            )
            raw.parse()
            _say(engine=raw.headers.get("x-traylm-engine", ""), error="")
        except openai.APIError as exc:
            _say(engine="", error=f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    if sys.argv[1] == "stream":
        stream(sys.argv[2], int(sys.argv[3]), sys.argv[4])
    else:
        many(sys.argv[2], int(sys.argv[3]))
