"""Run in a box's namespace: one streamed chat through that box's gateway (its daemon.json's URL; openai SDK), each
content chunk announced on stdout as it comes (the test kills a rank after the first), and
how it ended as the last JSON line.

python -m tests.engines.peers.chat_stream MODEL MAX_TOKENS"""

from __future__ import annotations

import json
import sys

import openai

from engines.config.paths import Paths


def main(model: str, max_tokens: int) -> None:
    url = json.loads(Paths.from_env().daemon_json.read_text())["url"]  # this box's gateway
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=300)
    chunks, text = 0, ""
    try:
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Hello, how are you today?"}],
            max_tokens=max_tokens,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for event in stream:
            if event.choices and event.choices[0].delta.content:
                chunks += 1
                text += event.choices[0].delta.content
                print(json.dumps({"chunk": chunks}), flush=True)
    except openai.APIError as exc:
        print(json.dumps({"chunks": chunks, "error": f"{type(exc).__name__}: {exc}"}), flush=True)
        return
    print(json.dumps({"chunks": chunks, "text": text, "error": ""}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
