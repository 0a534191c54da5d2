"""`traylm launch` as a user runs it (real subprocesses): the daemon with the FAKE vLLM env,
and a FAKE agent CLI (tests/fakes/fake_agent_cli.py) named claude, codex or opencode on PATH
that records what it was given."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from tests.engines.cli.test_cli import serve, stop_daemon, traylm
from tests.fakes.fake_agent_cli import install_fake_agent, recorded


@pytest.fixture
def agent_env(env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The FAKE agents on PATH, and where they write what they got."""
    bin_dir = tmp_path / "bin"
    for name in ("claude", "codex", "opencode"):
        install_fake_agent(bin_dir, name)
    return {
        **env,
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
        "FAKE_AGENT_RECORD": str(tmp_path / "agent.json"),
    }


@pytest.fixture
def port(agent_env: dict[str, str]) -> Iterator[int]:
    port = free_loopback_port()
    proc = serve(agent_env, "--port", str(port))
    yield port
    stop_daemon(proc)


def write(env: dict[str, str], name: str, **fields: object) -> None:
    write_toml_atomic(
        Path(env["TRAYLM_HOME"]) / "config" / "profiles" / f"{name}.toml",
        {"model": f"org/{name}", "device": "cpu", "served_name": name, **fields},
    )


def got(env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    data = recorded(Path(env["FAKE_AGENT_RECORD"]))
    return list(data["argv"]), dict(data["env"])  # type: ignore[call-overload]


def test_claude_gets_the_gateway_the_model_and_passes_through(
    agent_env: dict[str, str], port: int
) -> None:
    write(agent_env, "coder", tool_parser="hermes")
    env = {**agent_env, "FAKE_AGENT_EXIT": "7", "ANTHROPIC_API_KEY": "sk-ant-users-own"}
    out = traylm(env, "launch", "claude", "--model", "coder", "--", "-p", "say hi", timeout=90)
    assert out.returncode == 7, out.stderr
    assert out.stdout == "fake agent says hi\n"  # the client's own output, untouched
    assert "fake agent note" in out.stderr and "coder: ready" in out.stderr
    argv, seen = got(env)
    assert argv[1:] == ["-p", "say hi"]
    assert seen["ANTHROPIC_BASE_URL"] == f"http://127.0.0.1:{port}"
    for var in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL", "ANTHROPIC_SMALL_FAST_MODEL"):
        assert seen[var] == "coder"
    assert seen["ANTHROPIC_AUTH_TOKEN"] and "ANTHROPIC_API_KEY" not in seen
    assert seen["CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"] == "1"
    assert "coder" in traylm(env, "ps").stdout  # loaded first


@pytest.mark.slow
def test_codex_and_opencode_get_overrides_not_config_files(
    agent_env: dict[str, str], port: int, tmp_path: Path
) -> None:
    write(agent_env, "coder", tool_parser="hermes")
    home = tmp_path / "user-home"
    env = {**agent_env, "HOME": str(home)}
    out = traylm(env, "launch", "codex", "--model", "coder", "--", "exec", "say hi", timeout=90)
    assert out.returncode == 0, out.stderr
    argv, seen = got(env)
    assert argv[-2:] == ["exec", "say hi"]
    overrides = dict(a.split("=", 1) for a in argv[1:-2] if a != "-c")
    assert overrides["model_provider"] == '"traylm"' and overrides["model"] == '"coder"'
    assert overrides["model_providers.traylm.base_url"] == f'"http://127.0.0.1:{port}/v1"'
    assert overrides["model_providers.traylm.wire_api"] == '"responses"'
    assert overrides["model_providers.traylm.env_key"] == '"TRAYLM_API_KEY"'
    assert seen["TRAYLM_API_KEY"]
    out = traylm(env, "launch", "opencode", "--model", "coder", "--", "run", "hi", timeout=90)
    assert out.returncode == 0, out.stderr
    argv, seen = got(env)
    assert argv[1:] == ["run", "hi"]
    config = json.loads(seen["OPENCODE_CONFIG_CONTENT"])
    provider = config["provider"]["traylm"]
    assert provider["options"]["baseURL"] == f"http://127.0.0.1:{port}/v1"
    assert provider["options"]["apiKey"] == "{env:TRAYLM_API_KEY}"
    assert config["model"] == "traylm/coder" and "coder" in provider["models"]
    assert not home.exists()  # no config file of the user's written


@pytest.mark.slow
def test_without_model_the_loaded_one_that_can_call_tools(
    agent_env: dict[str, str], port: int
) -> None:
    write(agent_env, "plain")
    write(agent_env, "coder", tool_parser="hermes")
    assert traylm(agent_env, "load", "plain", "--timeout", "60").returncode == 0
    out = traylm(agent_env, "launch", "claude", timeout=90)
    assert out.returncode == 1 and "no model that can call tools is loaded" in out.stderr
    assert "coder" in out.stderr and "plain" not in out.stderr.split("(")[-1]
    assert traylm(agent_env, "load", "coder", "--timeout", "60").returncode == 0
    out = traylm(agent_env, "launch", "claude", timeout=90)
    assert out.returncode == 0, out.stderr
    assert got(agent_env)[1]["ANTHROPIC_MODEL"] == "coder"


def test_a_model_without_a_tool_parser_is_refused_with_the_fix(
    agent_env: dict[str, str], port: int
) -> None:
    write(agent_env, "plain")
    out = traylm(agent_env, "launch", "claude", "--model", "plain", timeout=90)
    assert out.returncode == 1
    assert "cannot call tools" in out.stderr
    assert "traylm models set plain tool_parser=" in out.stderr
    assert "Traceback" not in out.stderr
    assert not Path(agent_env["FAKE_AGENT_RECORD"]).exists()  # the client never ran
    assert "plain" not in traylm(agent_env, "ps").stdout  # nor was it loaded


@pytest.mark.slow
def test_a_key_made_and_named_for_the_agent(agent_env: dict[str, str], port: int) -> None:
    write(agent_env, "coder", tool_parser="hermes")
    assert traylm(agent_env, "keys", "add", "--name", "mine").returncode == 0
    out = traylm(agent_env, "launch", "claude", "--model", "coder", timeout=90)
    assert out.returncode == 0, out.stderr
    key = got(agent_env)[1]["ANTHROPIC_AUTH_TOKEN"]
    assert key.startswith("tlm-") and "made API key 'claude'" in out.stderr
    listed = traylm(agent_env, "keys", "list").stdout.splitlines()
    assert sorted(line.split()[-1] for line in listed) == ["claude", "mine"]
    out = traylm(agent_env, "launch", "claude", "--model", "coder", timeout=90)
    assert got(agent_env)[1]["ANTHROPIC_AUTH_TOKEN"] == key  # the same key, kept
    assert "made API key" not in out.stderr
    assert len(traylm(agent_env, "keys", "list").stdout.splitlines()) == 2
    env = {**agent_env, "FAKE_AGENT_ASK": "say hi"}
    out = traylm(env, "launch", "claude", "--model", "coder", timeout=90)
    assert out.returncode == 0 and "fake agent got 200" in out.stdout, out.stderr
    [row] = [r for r in traylm(env, "requests", "ls").stdout.splitlines() if "/v1/messages" in r]
    shown = traylm(env, "requests", "show", row.split()[0]).stdout
    fingerprint = next(line.split()[0] for line in listed if line.endswith("claude"))
    assert f"key {fingerprint} (claude)" in shown
    assert traylm(env, "keys", "remove", fingerprint).returncode == 0  # revoked: its name goes
    assert [line.split()[-1] for line in traylm(env, "keys", "list").stdout.splitlines()] == [
        "mine"
    ]
    out = traylm(agent_env, "launch", "claude", "--model", "coder", timeout=90)
    assert "made API key 'claude'" in out.stderr  # a new one, as the old one is refused
    assert got(agent_env)[1]["ANTHROPIC_AUTH_TOKEN"] != key


def test_without_keys_no_key_is_made(agent_env: dict[str, str], port: int) -> None:
    write(agent_env, "coder", tool_parser="hermes")
    out = traylm(agent_env, "launch", "codex", "--model", "coder", timeout=90)
    assert out.returncode == 0, out.stderr
    assert "no API keys" in traylm(agent_env, "keys", "list").stdout


def test_a_client_not_installed_gets_its_install_command(env: dict[str, str]) -> None:
    bare = {**env, "PATH": str(Path(sys.executable).parent)}
    for agent, package in (
        ("claude", "@anthropic-ai/claude-code"),
        ("codex", "@openai/codex"),
        ("opencode", "opencode-ai"),
    ):
        out = traylm(bare, "launch", agent)
        assert out.returncode == 1
        assert f"npm install -g {package}" in out.stderr, out.stderr


def test_a_signal_to_traylm_reaches_the_client(
    agent_env: dict[str, str], port: int, tmp_path: Path
) -> None:
    write(agent_env, "coder", tool_parser="hermes")
    waiting = tmp_path / "waiting"
    env = {**agent_env, "FAKE_AGENT_WAIT": str(waiting)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "engines", "launch", "claude", "--model", "coder"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 90
    while not waiting.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert out == "fake agent says hi\n"
