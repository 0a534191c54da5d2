"""Each engine's memory rule (engines/runtime/adapters/memory.py) through its adapter, and vLLM's sleep
mode: only CUDA profiles get it, only when the installed version accepts the flag."""

from __future__ import annotations

import dataclasses

import pytest

from engines.config.profiles import Profile, profile_from_mapping
from engines.envs.manager import load_flags
from engines.errors import ConfigError
from engines.runtime.adapters import adapter_for
from engines.runtime.adapters.base import EngineRuntime, FlagSet
from engines.runtime.adapters.memory import (
    CUDA_CONTEXT_BYTES,
    GIB,
    NCCL_BYTES,
    SLEEP_RESIDUAL_BYTES,
)
from tests.engines.runtime.adapters.test_vllm import runtime

CARD = 24 * GIB


def profile(engine: str = "vllm", **fields: object) -> Profile:
    return profile_from_mapping("p", {"model": "org/model", "engine": engine, **fields})


def vllm_runtime(device: str = "cuda", flags: FlagSet | None = None) -> EngineRuntime:
    made = runtime(device)
    return dataclasses.replace(made, flags=flags) if flags is not None else made


def test_vllm_takes_its_fraction_of_the_card_whatever_the_weights() -> None:
    adapter = adapter_for("vllm")
    small = adapter.memory_need(
        profile(gpu_memory_utilization=0.9), total_bytes=CARD, free_bytes=CARD, weights_bytes=GIB
    )
    big = adapter.memory_need(
        profile(gpu_memory_utilization=0.9),
        total_bytes=CARD,
        free_bytes=CARD // 2,
        weights_bytes=16 * GIB,
    )
    # its budget, and its CUDA context on top (vLLM measures free memory after creating it)
    assert small.hold_bytes == big.hold_bytes == int(CARD * 0.9) + CUDA_CONTEXT_BYTES
    assert small.free_needed_bytes == small.hold_bytes  # it refuses to start with less free
    assert "0.90 of the card as CUDA sees it" in small.rule
    assert "plus 0.5 GiB for its CUDA context, which" in small.rule
    assert small.sleep_residual_bytes == SLEEP_RESIDUAL_BYTES
    half = adapter.memory_need(
        profile(gpu_memory_utilization=0.45), total_bytes=CARD, free_bytes=CARD, weights_bytes=None
    )
    assert half.hold_bytes == int(CARD * 0.45) + CUDA_CONTEXT_BYTES


def test_tensor_parallel_counts_nccl_on_every_engine() -> None:
    tp2 = {"tensor_parallel_size": 2, "gpus": [0, 1]}
    for engine in ("vllm", "sglang", "trtllm"):
        adapter = adapter_for(engine)
        one = adapter.memory_need(
            profile(engine), total_bytes=CARD, free_bytes=CARD, weights_bytes=8 * GIB
        )
        two = adapter.memory_need(
            profile(engine, **tp2), total_bytes=CARD, free_bytes=CARD, weights_bytes=16 * GIB
        )
        assert two.free_needed_bytes > one.free_needed_bytes, engine  # same weights per GPU
    vllm = adapter_for("vllm").memory_need(
        profile(**tp2), total_bytes=CARD, free_bytes=CARD, weights_bytes=None
    )
    assert vllm.hold_bytes == int(CARD * 0.9) + CUDA_CONTEXT_BYTES + NCCL_BYTES
    assert "CUDA context and NCCL" in vllm.rule


def test_vllm_weights_split_by_tensor_parallel_and_too_small_a_budget_said() -> None:
    adapter = adapter_for("vllm")
    tp1 = adapter.memory_need(
        profile(gpu_memory_utilization=0.5),
        total_bytes=CARD,
        free_bytes=CARD,
        weights_bytes=20 * GIB,
    )
    assert "too little for its 20.0 GiB of weights" in tp1.rule
    assert tp1.free_needed_bytes > tp1.hold_bytes
    tp2 = adapter.memory_need(
        profile(gpu_memory_utilization=0.9, tensor_parallel_size=2, gpus=[0, 1]),
        total_bytes=CARD,
        free_bytes=CARD,
        weights_bytes=20 * GIB,
    )
    assert "too little" not in tp2.rule and tp2.free_needed_bytes == tp2.hold_bytes


def test_sglang_grows_into_what_is_free_at_launch() -> None:
    adapter = adapter_for("sglang")
    need = adapter.memory_need(
        profile("sglang", mem_fraction_static=0.8),
        total_bytes=CARD,
        free_bytes=20 * GIB,
        weights_bytes=8 * GIB,
    )
    assert need.hold_bytes == 20 * GIB
    # KV pool = 0.8 x free - weights must be positive: (8 GiB + context) / 0.8 free at least
    assert 10 * GIB < need.free_needed_bytes < 11 * GIB
    assert need.sleep_residual_bytes is None
    assert "the profile's mem_fraction_static 0.80" in need.rule


def test_sglang_left_to_its_own_fraction_whatever_gpu_memory_utilization_says() -> None:
    adapter = adapter_for("sglang")
    need = adapter.memory_need(
        profile("sglang", gpu_memory_utilization=0.95),
        total_bytes=CARD,
        free_bytes=20 * GIB,
        weights_bytes=8 * GIB,
    )
    assert "SGLang's own mem_fraction_static 0.83" in need.rule
    assert need.free_needed_bytes == int((8 * GIB + GIB // 2) / 0.83) + 1


def test_trtllm_takes_its_fraction_of_what_is_left_after_the_weights() -> None:
    adapter = adapter_for("trtllm")
    need = adapter.memory_need(
        profile("trtllm", gpu_memory_utilization=0.5),
        total_bytes=CARD,
        free_bytes=20 * GIB,
        weights_bytes=8 * GIB,
    )
    base = 8 * GIB + CUDA_CONTEXT_BYTES + GIB  # weights, CUDA context, activations
    assert need.hold_bytes == base + (20 * GIB - base) // 2
    assert need.free_needed_bytes > base
    assert "free_gpu_memory_fraction 0.50" in need.rule


def test_sleep_mode_only_on_cuda_and_only_when_the_version_accepts_it() -> None:
    adapter = adapter_for("vllm")
    spec = adapter.launch(profile(), runtime=vllm_runtime("cuda"), port=1, model="org/model")
    assert "--enable-sleep-mode" in spec.argv
    assert spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert spec.sleep is not None and spec.sleep.wake_path == "/wake_up"
    cpu = adapter.launch(profile(), runtime=vllm_runtime("cpu"), port=1, model="org/model")
    assert "--enable-sleep-mode" not in cpu.argv and cpu.sleep is None
    assert "VLLM_SERVER_DEV_MODE" not in cpu.env
    off = adapter.launch(
        profile(sleep_mode=False), runtime=vllm_runtime("cuda"), port=1, model="org/model"
    )
    assert "--enable-sleep-mode" not in off.argv and off.sleep is None
    flags = load_flags("vllm", "0.32.0")
    older = dataclasses.replace(
        flags, flags={k: v for k, v in flags.flags.items() if "sleep" not in k}
    )
    old = adapter.launch(profile(), runtime=vllm_runtime("cuda", older), port=1, model="org/model")
    assert "--enable-sleep-mode" not in old.argv and old.sleep is None


def test_auto_gpus_round_trip_and_refused_at_launch_unplaced() -> None:
    from engines.config.profiles import profile_to_mapping

    p = profile(gpus="auto", tensor_parallel_size=2)
    assert p.gpus_auto and p.gpus == ()
    assert profile_to_mapping(p)["gpus"] == "auto"
    assert not profile(gpus=[1]).gpus_auto
    with pytest.raises(ConfigError, match="placed when the model loads"):
        adapter_for("vllm").launch(p, runtime=vllm_runtime("cuda"), port=1, model="org/model")
    with pytest.raises(ConfigError, match="idle_ttl_s"):
        profile(idle_ttl_s=-5)
