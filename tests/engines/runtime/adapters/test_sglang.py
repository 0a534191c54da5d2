"""SGLang through the real daemon, supervisor and gateway, against the FAKE launch_server
(tests/fakes/fake_sglang_server.py) on fake GPUs without P2P; and its adapter as a pure
function."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from packaging.version import Version

from engines.config.profiles import profile_from_mapping
from engines.config.sections import GPUSettings
from engines.core.procs import free_loopback_port
from engines.envs.manager import load_flags
from engines.errors import ConfigError, UnknownFlagError
from engines.events import EngineState, EngineStatus
from engines.runtime.adapters.base import EngineRuntime, FlagSet
from engines.runtime.adapters.sglang import SGLangAdapter
from tests.conftest import RunningDaemon, fast_settings
from tests.fakes.fake_trt_env import make_fake_sglang_env


@pytest.fixture
async def sg(daemon_factory: Any, paths: Any) -> RunningDaemon:
    """A daemon on two simulated GPUs (a CUDA profile needs GPUs to start)."""
    make_fake_sglang_env(paths.envs_dir)
    base = fast_settings(free_loopback_port())
    d: RunningDaemon = await daemon_factory(
        dataclasses.replace(base, gpu=GPUSettings(simulate_gpus=2))
    )
    return d


async def start(d: RunningDaemon, name: str, **fields: Any) -> EngineStatus:
    d.write_profile(
        name, engine="sglang", device="cuda", model="org/" + name, served_name=name, **fields
    )
    await d.client.start(name)
    return await d.client.wait_for_engine(name, (EngineState.READY, EngineState.FAILED), 30)


def launched_argv(d: RunningDaemon, name: str) -> list[str]:
    log = d.daemon.engine(name).log_path.read_text()
    line = [ln for ln in log.splitlines() if ln.startswith("===== argv: ")][-1]
    return shlex.split(line.removeprefix("===== argv: "))


async def test_tp2_without_p2p_disables_custom_all_reduce_and_serves(sg: RunningDaemon) -> None:
    status = await start(
        sg, "qwen", gpus=[0, 1], tensor_parallel_size=2, max_model_len=8192, kv_cache_dtype="fp8"
    )
    assert status.state == EngineState.READY, status.detail
    argv = launched_argv(sg, "qwen")
    assert argv[1:3] == ["-m", "sglang.launch_server"]
    joined = " ".join(argv)
    assert "--model-path org/qwen --host 127.0.0.1" in joined
    assert "--tp-size 2" in joined and "--disable-custom-all-reduce" in joined
    assert "--context-length 8192" in joined and "--kv-cache-dtype fp8_e4m3" in joined
    body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as http,
        http.post(sg.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200 and r.headers["X-Traylm-Engine"] == "qwen"


async def test_p2p_claimed_without_it_fails_with_the_peer_access_diagnosis(
    sg: RunningDaemon,
) -> None:
    status = await start(sg, "p2p", gpus=[0, 1], tensor_parallel_size=2, p2p=True)
    assert status.state == EngineState.FAILED
    assert status.diagnosis is not None and status.diagnosis.code == "peer_access_unsupported"


async def test_memory_diagnosis(sg: RunningDaemon) -> None:
    line = "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static."
    args = f"--print {shlex.quote(line)} --exit 1"
    status = await start(sg, "mem", env={"FAKE_TRT_SGLANG_ARGS": args})
    assert status.state == EngineState.FAILED
    assert status.diagnosis is not None and status.diagnosis.code == "no_cache_memory"


def runtime(flags_version: str = "0.5.23") -> EngineRuntime:
    return EngineRuntime(
        "sglang",
        Version(flags_version),
        Path("/envs/sglang/bin/python"),
        Path("/envs/sglang/bin"),
        "cuda",
        load_flags("sglang", flags_version),
    )


def sglang_profile(**fields: Any) -> Any:
    return profile_from_mapping(
        "p", {"engine": "sglang", "model": "org/m", "device": "cuda", **fields}
    )


def test_the_0_5_23_flag_list_is_the_real_parser() -> None:
    """0.5.23 split --cuda-graph-max-bs into -decode/-prefill and lists the values of
    --quantization and --kv-cache-dtype: the shipped list (probed from that version's parser)
    refuses the old flag and unknown values before a launch."""
    flags = load_flags("sglang", "0.5.23")
    assert flags.complete
    with pytest.raises(UnknownFlagError, match=r"does not accept --cuda-graph-max-bs; did you"):
        flags.check(["--cuda-graph-max-bs", "8"])
    flags.check(["--cuda-graph-max-bs-decode", "8", "--cuda-graph-max-bs-prefill", "4"])
    with pytest.raises(UnknownFlagError, match=r"--quantization 'int3' is not accepted.*awq"):
        SGLangAdapter().launch(
            sglang_profile(quantization="int3"), runtime=runtime(), port=1, model="org/m"
        )
    for kv in ("fp8", "fp8_e4m3", "fp8_e5m2"):
        spec = SGLangAdapter().launch(
            sglang_profile(kv_cache_dtype=kv, quantization="awq"),
            runtime=runtime(),
            port=1,
            model="org/m",
        )
        value = spec.argv[spec.argv.index("--kv-cache-dtype") + 1]
        assert value in (flags.flags["--kv-cache-dtype"].choices or ())
    cpu = sglang_profile(device="cpu")
    with pytest.raises(ConfigError, match="NVIDIA GPUs only"):
        SGLangAdapter().launch(cpu, runtime=runtime(), port=1, model="org/m")


def test_a_partial_allow_list_says_so_instead_of_guessing() -> None:
    partial = FlagSet.from_json(
        {"engine": "sglang", "version": "0.5.0", "complete": False, "flags": {}}
    )
    with pytest.raises(UnknownFlagError, match=r"partial flag list.*reinstall"):
        partial.check(["--rare-flag"])


def test_mem_fraction_static_only_from_the_profile_s_own_field() -> None:
    """SGLang picks --mem-fraction-static for the card itself (~0.83 on 24 GB); vLLM's
    gpu_memory_utilization (a share of the whole card) is never passed as it."""
    left = SGLangAdapter().launch(
        sglang_profile(gpu_memory_utilization=0.95), runtime=runtime(), port=1, model="org/m"
    )
    assert "--mem-fraction-static" not in left.argv
    assert "0.95" not in left.argv
    given = SGLangAdapter().launch(
        sglang_profile(mem_fraction_static=0.78), runtime=runtime(), port=1, model="org/m"
    )
    assert given.argv[given.argv.index("--mem-fraction-static") + 1] == "0.78"
    with pytest.raises(ConfigError, match="mem_fraction_static"):
        sglang_profile(mem_fraction_static=1.5)
