"""A chat reply in progress survives `kill -9` of the app and of the daemon, with real processes:
`traylm serve`, the FAKE engine, and the chat window's own streaming code (desktop/daemon/gateway.py,
no Qt) in a client process of its own. The daemon keeps the reply as it relays it, marked
interrupted until it completes; the chat window then offers Retry (tests/desktop/test_chat.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import traylm

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[3]
CLIENT = textwrap.dedent("""
    import asyncio, sys
    from desktop.daemon.gateway import ChatDelta, ChatRequest, GatewayHTTP
    url, token, chat_id = sys.argv[1], sys.argv[2], int(sys.argv[3])
    def post(message):
        if isinstance(message, ChatDelta):
            print(message.text, end="", flush=True)
    async def main():
        gateway = GatewayHTTP(post)
        gateway.base_url, gateway.control_token = url, token
        request = ChatRequest(1, "fake", (("user", "tell me", ()),), 0.7, 1.0, 100000,
                              chat_id=chat_id, position=1)
        await gateway.stream_chat(request)
    asyncio.run(main())
""")


class Served:
    """`traylm serve` in this test's home (it can be killed and started again)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.paths = Paths.from_env(env)
        self.port = free_loopback_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engines", "serve", "--port", str(self.port)],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: self._serving(), "the daemon to serve")

    def _serving(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None
        try:
            return bool(json.loads(self.paths.daemon_json.read_text())["pid"] == self.proc.pid)
        except (OSError, ValueError, KeyError):
            return False

    @property
    def token(self) -> str:
        return str(json.loads(self.paths.daemon_json.read_text())["token"])

    def api(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
            method=method,
        )
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())

    def reply(self, chat_id: int) -> dict[str, Any] | None:
        messages = self.api("GET", f"/api/chats/{chat_id}")["messages"]
        return messages[1] if len(messages) > 1 else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def served(env: dict[str, str]) -> Iterator[Served]:
    s = Served(env)
    s.start()
    write_toml_atomic(
        s.paths.profiles_dir / "fake.toml",
        {
            "model": "org/fake",
            "served_name": "fake",
            "device": "cpu",
            "env": {"FAKE_ENGINE_ARGS": "--token-delay 0.05"},
        },
    )
    out = traylm(env, "start", "fake", "--wait", "--timeout", "60")
    assert out.returncode == 0, out.stderr
    yield s
    s.stop()


def new_chat(s: Served) -> int:
    chat_id = int(s.api("POST", "/api/chats", {"model": "fake"})["chat_id"])
    s.api(
        "POST",
        f"/api/chats/{chat_id}/messages",
        {"messages": [{"role": "user", "content": "tell me"}]},
    )
    return chat_id


def test_the_app_killed_mid_reply_leaves_the_reply_kept(served: Served) -> None:
    chat_id = new_chat(served)
    app = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CLIENT,
            f"http://127.0.0.1:{served.port}",
            served.token,
            str(chat_id),
        ],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**served.env, "PYTHONPATH": str(ROOT)},
    )
    assert app.stdout is not None
    os.set_blocking(app.stdout.fileno(), False)
    shown = b""

    def shown_words(n: int) -> bool:
        nonlocal shown
        shown += app.stdout.read() or b""  # type: ignore[union-attr]
        return len(shown.split()) >= n

    wait_for(lambda: shown_words(10), "the app to show ten words")
    app.kill()  # kill -9 of the app mid-reply
    app.wait(10)
    app.stdout.close()

    def kept() -> bool:
        reply = served.reply(chat_id)
        return (
            reply is not None and reply["finish_reason"] == "interrupted" and bool(reply["content"])
        )

    wait_for(kept, "the reply to be kept")
    reply = served.reply(chat_id)
    assert reply is not None and reply["role"] == "assistant"
    assert reply["content"].startswith(shown.decode())  # all the app saw, and what came after
    before = reply["content"]
    wait_for(lambda: served.reply(chat_id)["content"] == before, "the reply to stay")  # type: ignore[index]


def test_the_daemon_killed_mid_reply_leaves_the_reply_kept(served: Served) -> None:
    chat_id = new_chat(served)
    body = json.dumps(
        {
            "model": "fake",
            "messages": [{"role": "user", "content": "tell me"}],
            "stream": True,
            "max_tokens": 100000,
        }
    ).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{served.port}/v1/chat/completions",
        data=body,
        headers={
            "Content-Type": "application/json",
            "X-Traylm-Chat-Reply": f"{chat_id}:1",
            "X-Traylm-Token": served.token,
        },
    )
    stream = urllib.request.urlopen(request, timeout=60)
    got = b""
    try:
        # the daemon saves the reply at most every 0.5 s: kill it once a save has landed
        def saved() -> bool:
            nonlocal got
            got += stream.read1(65536)
            reply = served.reply(chat_id)
            return reply is not None and len(reply["content"].split()) >= 3

        wait_for(saved, "a save of the reply")
        assert served.proc is not None
        served.proc.kill()  # kill -9 of the daemon mid-reply
        served.proc.wait(10)
    finally:
        stream.close()
    served.start()  # (its reaper ends the engine the killed daemon left)
    reply = served.reply(chat_id)
    assert reply is not None and reply["finish_reason"] == "interrupted"
    words = reply["content"].split()
    assert len(words) >= 3 and words == [f"w{i}" for i in range(len(words))]  # from its start
    relayed = "".join(
        json.loads(line[6:])["choices"][0]["delta"]["content"]
        for line in got.decode().split("\n")
        if line.startswith("data: {")
    )
    shorter, longer = sorted((relayed, reply["content"]), key=len)
    assert longer.startswith(shorter)  # the same reply the client was reading
