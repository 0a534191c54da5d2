"""TensorRT-LLM through the real daemon, supervisor and gateway, against the FAKE TensorRT-LLM
tools (tests/fakes/fake_trtllm_*.py, fake_quantize.py, fake_convert_checkpoint.py) on two
simulated RTX 4090s (gpu.simulate_gpus = 2; the fake tools see the same hardware).

Covered: serve mode (PyTorch backend) with TP 2 argv/env/YAML, build mode cache miss → build
(progress events, ETA from history) → serve, cache hit without a rebuild, cancel during a build,
refusal of an engine built for another version, each diagnosis, refusals before any build, and a
switch from vLLM to TensorRT-LLM behind the same model alias.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from engines.config.sections import GPUSettings, Settings
from engines.core.procs import free_loopback_port
from engines.errors import ControlAPIError
from engines.events import EngineState, EngineStatus, Event, TRTBuildProgress
from tests.conftest import RunningDaemon, fast_settings
from tests.fakes.fake_trt_env import make_fake_trtllm_env, make_tiny_hf_model
from tests.fakes.fake_vllm_env import make_fake_vllm_env

READY_OR_FAILED = (EngineState.READY, EngineState.FAILED)


def trt_settings() -> Settings:
    return dataclasses.replace(
        fast_settings(free_loopback_port()), gpu=GPUSettings(simulate_gpus=2)
    )


@pytest.fixture
async def trt(daemon_factory: Any, paths: Any) -> RunningDaemon:
    make_fake_trtllm_env(paths.envs_dir)
    d: RunningDaemon = await daemon_factory(trt_settings())
    return d


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    return make_tiny_hf_model(tmp_path / "models" / "tiny-llama")


async def start(d: RunningDaemon, name: str, timeout_s: float = 60, **fields: Any) -> EngineStatus:
    fields.setdefault("engine", "trtllm")
    fields.setdefault("device", "cuda")
    fields.setdefault("served_name", name)
    d.write_profile(name, **fields)
    await d.client.start(name)
    return await d.client.wait_for_engine(name, READY_OR_FAILED, timeout_s)


async def launch_info(d: RunningDaemon, name: str) -> dict[str, Any]:
    engine = d.daemon.engine(name)
    async with aiohttp.ClientSession() as http, http.get(f"{engine.base_url}/fake/launch") as r:
        data: dict[str, Any] = await r.json()
    return data


async def chat(d: RunningDaemon, model: str) -> tuple[int, dict[str, str], dict[str, Any]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with (
        aiohttp.ClientSession() as http,
        http.post(d.url + "/v1/chat/completions", json=body) as r,
    ):
        return r.status, dict(r.headers), await r.json()


def collect(d: RunningDaemon, kinds: frozenset[str]) -> tuple[list[Event], Any]:
    seen: list[Event] = []
    cm = d.daemon.bus.subscribe(kinds)
    sub = cm.__enter__()

    async def pump() -> None:
        while True:
            seen.append(await sub.get())

    task = asyncio.create_task(pump())

    def close() -> None:
        task.cancel()
        cm.__exit__(None, None, None)

    return seen, close


# --------------------------------------------------------------------------- serve mode


async def test_serve_mode_tp2_argv_env_and_generated_yaml(
    trt: RunningDaemon, model_dir: Path
) -> None:
    status = await start(
        trt,
        "tiny",
        model=str(model_dir),
        gpus=[0, 1],
        tensor_parallel_size=2,
        max_batch_size=8,
        max_num_batched_tokens=4096,
        max_model_len=2048,
        kv_cache_dtype="fp8",
        gpu_memory_utilization=0.85,
    )
    assert status.state == EngineState.READY, status.detail
    info = await launch_info(trt, "tiny")
    argv = info["argv"]
    assert argv[0] == str(model_dir)
    pairs = dict(zip(argv[1::2], argv[2::2], strict=False))
    assert pairs["--backend"] == "pytorch"
    assert pairs["--host"] == "127.0.0.1"
    assert pairs["--tp_size"] == "2"
    assert pairs["--max_batch_size"] == "8"
    assert pairs["--max_num_tokens"] == "4096"
    assert pairs["--max_seq_len"] == "2048"
    assert pairs["--kv_cache_free_gpu_memory_fraction"] == "0.85"
    assert pairs["--extra_llm_api_options"].endswith("tiny.run/trtllm-serve.yaml")
    assert info["env"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert info["env"]["NCCL_P2P_DISABLE"] == "1"
    assert info["config"]["allreduce_strategy"] == "NCCL"  # no P2P on GeForce: NCCL all-reduce
    assert info["config"]["kv_cache_config"] == {"free_gpu_memory_fraction": 0.85, "dtype": "fp8"}
    code, headers, body = await chat(trt, "tiny")
    assert code == 200 and headers["X-Traylm-Engine"] == "tiny"
    assert body["choices"][0]["message"]["content"] == "w0 w1 w2"


async def test_p2p_claimed_on_gpus_without_it_is_diagnosed(
    trt: RunningDaemon, model_dir: Path
) -> None:
    """p2p = true drops NCCL_P2P_DISABLE and NCCL all-reduce; the (fake) 4090s then fail the
    way real ones do, and the diagnosis says to turn p2p off."""
    status = await start(
        trt, "p2p", model=str(model_dir), gpus=[0, 1], tensor_parallel_size=2, p2p=True
    )
    assert status.state == EngineState.FAILED
    assert status.diagnosis is not None and status.diagnosis.code == "peer_access_unsupported"
    assert "p2p = false" in status.detail


LINES = {
    "fp8_unsupported": "[01/01/2026-10:00:00] [TRT] [E] 9: [standardEngineBuilder.cpp::buildEngine"
    "::2266] Error Code 9: Internal Error (Networks with FP8 precision require hardware with FP8 "
    "support.)",
    "out_of_memory": "[TensorRT-LLM][ERROR] CUDA runtime error in ::cudaMallocAsync(ptr, n, "
    "mCudaStream->get()): out of memory",
    "peer_access_unsupported": "[TensorRT-LLM][ERROR] CUDA runtime error in "
    "cudaDeviceEnablePeerAccess(peer, 0): peer access is not supported between these two devices",
    "engine_version_mismatch": "[TensorRT-LLM][ERROR] 6: The engine plan file is not compatible "
    "with this version of TensorRT, expecting library version 10.13.3.9 got 10.13.2.6, please "
    "rebuild.",
    "architecture_unsupported": "AssertionError: Unsupported model architecture: "
    "Qwen3NextForCausalLM",
    "mpi_missing": "ImportError: libmpi.so.40: cannot open shared object file: No such file or "
    "directory",
    "kv_cache_too_small": "RuntimeError: Attention window too large to fit even a single sequence "
    "in the KV cache. Failing fast rather than attempting an adjustment of the window sizes. Old: "
    "[32768], New: [11264]",
    "fp8_attention_unsupported": "[TensorRT-LLM][ERROR] Assertion failed: FP8 FMHA cannot be "
    "enabled because Context FMHA is not supported.",
    "port_in_use": "RuntimeError: Failed to bind socket to 127.0.0.1:40001: [Errno 98] Address "
    "already in use",
}


@pytest.mark.parametrize("code", sorted(LINES))
async def test_each_diagnosis_reaches_the_engine_status(
    trt: RunningDaemon, model_dir: Path, code: str
) -> None:
    args = f"--print {shlex.quote(LINES[code])} --exit 1"
    status = await start(trt, "diag", model=str(model_dir), env={"FAKE_TRT_SERVE_ARGS": args})
    assert status.state == EngineState.FAILED
    assert status.diagnosis is not None and status.diagnosis.code == code
    assert status.diagnosis.advice in status.detail
    assert status.restarts == 0


# --------------------------------------------------------------------------- build mode


@pytest.mark.slow
async def test_build_miss_then_cache_hit_then_eta_for_the_next_build(
    trt: RunningDaemon, model_dir: Path
) -> None:
    events, close = collect(trt, frozenset({"trt.build"}))
    fields = {
        "model": str(model_dir),
        "mode": "build",
        "quant_recipe": "fp8",
        "kv_cache_dtype": "fp8",
        "gpus": [0, 1],
        "tensor_parallel_size": 2,
        "max_batch_size": 4,
        "max_model_len": 2048,
    }
    status = await start(trt, "built", **fields)
    assert status.state == EngineState.READY, status.detail
    progress = [e for e in events if isinstance(e, TRTBuildProgress)]
    assert [p.state for p in progress][-1] == "done"
    steps = [p.step for p in progress if p.state == "running"]
    assert steps[0] == "quantize" and steps[-1] == "build"
    assert all(p.steps_total == 2 for p in progress)
    assert all(p.eta_s is None for p in progress if p.state == "running")  # no history yet
    entries = await trt.client.trt_cache()
    assert len(entries) == 1
    entry = entries[0]
    assert entry.in_use_by == ("built",)
    assert entry.environment["tensorrt_llm"] == "1.2.1"
    assert entry.environment["gpu"] == "NVIDIA GeForce RTX 4090 (simulated)"  # the inventory's
    assert entry.environment["compute_capability"] == "8.9"
    assert entry.arguments["build.use_fp8_context_fmha"] == "enable"  # Ada runs FP8 FMHA
    assert entry.arguments["checkpoint.qformat"] == "fp8"
    engine_dir = Path(entry.path) / "engine"
    assert sorted(p.name for p in engine_dir.iterdir()) == [
        "config.json",
        "rank0.engine",
        "rank1.engine",
    ]
    info = await launch_info(trt, "built")
    assert info["argv"][0] == str(engine_dir)
    pairs = dict(zip(info["argv"][1::2], info["argv"][2::2], strict=False))
    assert pairs["--backend"] == "tensorrt" and pairs["--tokenizer"] == str(model_dir)
    assert (await chat(trt, "built"))[0] == 200

    # a restart, then a second start, serve the cached engine: no build events
    events.clear()
    await trt.client.restart("built")
    status = await trt.client.wait_for_engine("built", READY_OR_FAILED, 60)
    assert status.state == EngineState.READY, status.detail
    assert not [e for e in events if isinstance(e, TRTBuildProgress)]
    await trt.client.stop("built")
    events.clear()
    status = await start(trt, "built", **fields)
    assert status.state == EngineState.READY, status.detail
    assert not [e for e in events if isinstance(e, TRTBuildProgress)]
    assert any("cache hit" in line for line in await trt.client.logs("built", 200))
    again = (await trt.client.trt_cache())[0]
    assert again.id == entry.id and again.last_used_s > entry.last_used_s

    # another build argument is another engine; its build now has an ETA from history
    await trt.client.stop("built")
    events.clear()
    status = await start(trt, "built", **{**fields, "max_batch_size": 8})
    assert status.state == EngineState.READY, status.detail
    running = [e for e in events if isinstance(e, TRTBuildProgress) and e.state == "running"]
    assert running and all(p.eta_s is not None for p in running)
    assert len(await trt.client.trt_cache()) == 2
    close()


async def test_cancel_during_build_kills_the_group_and_removes_partial_output(
    trt: RunningDaemon, model_dir: Path
) -> None:
    events, close = collect(trt, frozenset({"trt.build"}))
    trt.write_profile(
        "slow",
        engine="trtllm",
        device="cuda",
        model=str(model_dir),
        mode="build",
        env={"FAKE_TRT_CONVERT_ARGS": "--seconds 60"},
    )
    await trt.client.start("slow")
    for _ in range(200):
        if any(isinstance(e, TRTBuildProgress) and e.step == "convert" for e in events):
            break
        await asyncio.sleep(0.05)

    def converters() -> list[psutil.Process]:
        found = []
        for p in psutil.process_iter(["cmdline"]):
            if any("convert_checkpoint.py" in part for part in p.info["cmdline"] or []):
                found.append(p)
        return found

    for _ in range(100):
        if converters():
            break
        await asyncio.sleep(0.05)
    assert converters(), "the convert step should be running"
    root = trt.paths.trt_engines_dir
    assert [p for p in root.iterdir() if p.name.startswith(".partial-")]
    status = await trt.client.stop("slow")
    assert status.state == EngineState.STOPPED
    assert converters() == []
    assert [p.name for p in root.iterdir() if p.name.startswith(".partial-")] == []
    assert await trt.client.trt_cache() == []
    assert any(isinstance(e, TRTBuildProgress) and e.state == "cancelled" for e in events)
    close()


async def test_engine_built_for_another_version_is_refused_with_the_reason(
    trt: RunningDaemon, model_dir: Path
) -> None:
    fields = {"model": str(model_dir), "mode": "build"}
    assert (await start(trt, "v", **fields)).state == EngineState.READY
    await trt.client.stop("v")
    make_fake_trtllm_env(trt.paths.envs_dir, version="1.2.2")  # an upgrade: newest is used
    with pytest.raises(ControlAPIError) as err:
        await trt.client.start("v")
    message = err.value.message
    assert err.value.code == "engine_version_mismatch"
    assert "tensorrt_llm 1.2.1 (installed/here: 1.2.2)" in message
    assert "cache prune --stale" in message
    removed = await trt.client.trt_cache_prune(stale=True)
    assert len(removed) == 1
    status = await start(trt, "v", **fields)  # rebuilt for 1.2.2
    assert status.state == EngineState.READY, status.detail
    (entry,) = await trt.client.trt_cache()
    assert entry.environment["tensorrt_llm"] == "1.2.2"


async def test_build_out_of_memory_fails_with_advice(trt: RunningDaemon, model_dir: Path) -> None:
    status = await start(
        trt, "oom", model=str(model_dir), mode="build", env={"FAKE_TRT_BUILD_ARGS": "--oom"}
    )
    assert status.state == EngineState.FAILED
    assert status.diagnosis is not None and status.diagnosis.code == "out_of_memory"
    assert "max_batch_size" in status.detail
    assert await trt.client.trt_cache() == []
    root = trt.paths.trt_engines_dir
    assert [p.name for p in root.iterdir() if p.name.startswith(".partial-")] == []


async def test_fp8_attention_a_model_cannot_run_is_diagnosed_at_build(
    trt: RunningDaemon, model_dir: Path
) -> None:
    fields = {"model": str(model_dir), "mode": "build", "quant_recipe": "fp8"}
    no_fmha = {"FAKE_TRT_BUILD_ARGS": "--no-context-fmha"}
    status = await start(trt, "f", kv_cache_dtype="fp8", env=no_fmha, **fields)
    assert status.state == EngineState.FAILED
    assert status.diagnosis is not None and status.diagnosis.code == "fp8_attention_unsupported"
    assert "kv_cache_dtype = 'auto'" in status.detail
    status = await start(trt, "f", env=no_fmha, **fields)  # the advice: no FP8 KV cache
    assert status.state == EngineState.READY, status.detail
    (entry,) = await trt.client.trt_cache()
    assert entry.arguments["build.use_fp8_context_fmha"] == "disable"


@pytest.mark.parametrize(
    ("fields", "model_kw", "expected"),
    [
        ({"quant_recipe": "nvfp4"}, {}, "NVFP4 runs on Blackwell GPUs only"),
        ({}, {"architecture": "Qwen3ForCausalLM", "model_type": "qwen3"}, "cannot convert"),
        ({"max_model_len": 8192}, {}, "above LlamaForCausalLM's limit of 4096"),
        ({}, {"index_total_size": 140 * 2**30}, "use tensor_parallel_size = 2"),
        (
            {"max_model_len": 4096},
            {
                "hidden_size": 8192,
                "layers": 80,
                "heads": 64,
                "kv_heads": 64,
                "index_total_size": 16 * 2**30,
            },
            "KV cache per GPU",
        ),
    ],
)
async def test_bad_build_input_is_refused_before_any_build(
    trt: RunningDaemon,
    tmp_path: Path,
    fields: dict[str, Any],
    model_kw: dict[str, Any],
    expected: str,
) -> None:
    folder = make_tiny_hf_model(tmp_path / "bad", **model_kw)
    trt.write_profile(
        "bad", engine="trtllm", device="cuda", model=str(folder), mode="build", **fields
    )
    with pytest.raises(ControlAPIError) as err:
        await trt.client.start("bad")
    assert expected in err.value.message
    assert "bad" not in {e.engine_id for e in await trt.client.engines()}
    assert not trt.paths.trt_engines_dir.exists() or not list(trt.paths.trt_engines_dir.iterdir())


# --------------------------------------------------------------------------- switch


async def test_switch_from_vllm_to_trtllm_behind_the_same_alias(
    trt: RunningDaemon, model_dir: Path
) -> None:
    make_fake_vllm_env(trt.paths.envs_dir)
    trt.write_profile("v", engine="vllm", device="cpu", model="org/chat", served_name="chat")
    await trt.client.start("v")
    assert (await trt.client.wait_for_engine("v", READY_OR_FAILED, 30)).state == EngineState.READY
    code, headers, _ = await chat(trt, "chat")
    assert code == 200 and headers["X-Traylm-Engine"] == "v"
    trt.write_profile("t", engine="trtllm", device="cuda", model=str(model_dir), served_name="chat")
    with pytest.raises(ControlAPIError, match="already served by engine 'v'"):
        await trt.client.start("t")
    await trt.client.stop("v")
    await trt.client.start("t")
    assert (await trt.client.wait_for_engine("t", READY_OR_FAILED, 30)).state == EngineState.READY
    code, headers, _ = await chat(trt, "chat")
    assert code == 200 and headers["X-Traylm-Engine"] == "t"
    async with aiohttp.ClientSession() as http, http.get(trt.url + "/v1/models") as r:
        models = (await r.json())["data"]
    loaded = [(m["id"], m["traylm"]["engine"]) for m in models if m["status"]["value"] == "loaded"]
    assert loaded == [("chat", "trtllm")]  # every profile is listed; only t serves now


# --------------------------------------------------------------------------- calibration data

FP8_BUILD = {"mode": "build", "quant_recipe": "fp8", "max_batch_size": 4, "max_model_len": 2048}


async def test_fp8_build_offline_says_it_needs_its_calibration_data(
    trt: RunningDaemon, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ModelOpt's quantize.py downloads cnn_dailymail from the Hub by default: offline and not
    cached, the start is refused at once with the way to give a local copy."""
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: offline
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    trt.write_profile("q", engine="trtllm", device="cuda", model=str(model_dir), **FP8_BUILD)
    with pytest.raises(ControlAPIError) as err:
        await trt.client.start("q")
    assert "calibrates it on the cnn_dailymail dataset" in err.value.message
    assert "calib_dataset = '/path/to/cnn_dailymail'" in err.value.message
    assert "q" not in {e.engine_id for e in await trt.client.engines()}
    # a cached copy of the dataset is enough offline
    (tmp_path / "empty-hf-home" / "hub" / "datasets--abisee--cnn_dailymail").mkdir(parents=True)
    status = await start(trt, "q", model=str(model_dir), **FP8_BUILD)
    assert status.state == EngineState.READY, status.detail


async def test_a_local_calibration_dataset_goes_to_quantize_py(
    trt: RunningDaemon, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-hf-home"))
    calib = tmp_path / "cnn_dailymail"
    calib.mkdir()
    status = await start(trt, "c", model=str(model_dir), calib_dataset=str(calib), **FP8_BUILD)
    assert status.state == EngineState.READY, status.detail
    (entry,) = await trt.client.trt_cache()
    assert entry.arguments["checkpoint.calib_dataset"] == str(calib)
    trt.write_profile(
        "d",
        engine="trtllm",
        device="cuda",
        model=str(model_dir),
        calib_dataset=str(tmp_path / "missing"),
        **FP8_BUILD,
    )
    with pytest.raises(ControlAPIError) as err:
        await trt.client.start("d")
    assert "is not a folder on this computer" in err.value.message
