"""The chat's MCP host against a REAL stdio MCP server written with the same SDK
(tests/fakes/mcp_server.py): tools listed and called, a server that crashes at start, a call
that times out, what the server's environment holds, and its process gone after close."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from desktop.chat.mcp_config import MCPServerConfig
from desktop.chat.mcp_host import MCPHost
from engines.core.procs import free_loopback_port

SERVER = str(Path(__file__).parents[1] / "fakes" / "mcp_server.py")


def calc_server(
    name: str = "calc", *args: str, env: dict[str, str] | None = None
) -> MCPServerConfig:
    return MCPServerConfig(name, sys.executable, (SERVER, *args), env or {})


async def test_tools_are_listed_and_called(tmp_path: Path) -> None:
    host = MCPHost((calc_server(),), call_timeout_s=1.0)
    ready = await host.ensure_started()
    assert ready.failures == ()
    assert sorted(t.name for t in ready.tools) == ["add", "slow"]
    offered = json.loads(ready.openai_json())
    add = next(t for t in offered if t["function"]["name"] == "add")
    assert add["type"] == "function" and set(add["function"]["parameters"]["properties"]) == {
        "a",
        "b",
    }
    result = await host.call("add", '{"a": 2, "b": 40}')
    assert (result.text, result.failed) == ("42", False)
    slow = await host.call("slow", '{"seconds": 30}')
    assert slow.failed and "did not answer within 1 s" in slow.text
    again = await host.call("add", '{"a": 1, "b": 1}')  # the server still serves after it
    assert again.text == "2"
    bad = await host.call("add", "{not json")
    assert bad.failed and "not valid JSON" in bad.text
    await host.close()


@pytest.mark.slow
async def test_a_server_that_crashes_at_start_is_said_and_the_others_serve() -> None:
    host = MCPHost((calc_server("broken", "--crash"), calc_server("calc")))
    ready = await host.ensure_started()
    assert [t.name for t in ready.tools if t.server == "calc"] == ["add", "slow"]
    assert len(ready.failures) == 1 and ready.failures[0].startswith("broken: ")
    assert "crashing at start on purpose" in ready.failures[0]
    result = await host.call("add", '{"a": 1, "b": 2}')
    assert result.text == "3"
    await host.close()


async def test_a_missing_command_is_said() -> None:
    host = MCPHost((MCPServerConfig("gone", "/no/such/mcp-server"),))
    ready = await host.ensure_started()
    assert ready.tools == () and "not found" in ready.failures[0]
    await host.close()


async def test_the_server_gets_no_traylm_env_and_is_gone_after_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRAYLM_API_KEY", "sk-secret-traylm-key")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-traylm-key")
    env_file = tmp_path / "env.json"
    host = MCPHost((calc_server("calc", "--env-file", str(env_file), env={"GIVEN": "yes"}),))
    await host.ensure_started()
    seen = json.loads(env_file.read_text())
    env = seen["env"]
    assert env["GIVEN"] == "yes" and "PATH" in env
    assert not [k for k in env if k.startswith("TRAYLM")]
    assert "sk-secret-traylm-key" not in json.dumps(env)
    assert set(env) - {"GIVEN"} <= {"HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", "LC_CTYPE"}
    pid = int(seen["pid"])
    assert psutil.pid_exists(pid)
    await host.close()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert os.environ["TRAYLM_API_KEY"]  # (the test's own process still has it)


async def test_a_streamable_http_server_is_reached_by_its_url() -> None:
    port = free_loopback_port()
    proc = subprocess.Popen([sys.executable, SERVER, "--http-port", str(port)])
    try:
        while True:  # until it listens (or fails)
            assert proc.poll() is None, "the HTTP MCP server exited"
            try:
                _reader, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        host = MCPHost((MCPServerConfig("web", url=f"http://127.0.0.1:{port}/mcp"),))
        ready = await host.ensure_started()
        assert ready.failures == () and {t.server for t in ready.tools} == {"web"}
        assert (await host.call("add", '{"a": 20, "b": 22}')).text == "42"
        await host.close()
    finally:
        proc.terminate()
        proc.wait(10)
