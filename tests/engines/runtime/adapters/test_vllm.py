"""VLLMAdapter: argv and env from profiles, flag allow-list checks, and log diagnoses.

The diagnosis lines below are the texts vLLM 0.32 prints (taken from its source: kv_cache_utils,
worker/utils, gpu_model_runner, config/model, config/vllm)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from packaging.version import Version

from engines.config.profiles import Profile, profile_from_mapping
from engines.envs.manager import load_flags
from engines.errors import ConfigError, UnknownFlagError
from engines.runtime.adapters import ADAPTERS, adapter_for
from engines.runtime.adapters.base import EngineRuntime, FlagSet
from engines.runtime.adapters.vllm import VLLMAdapter


def runtime(device: str = "cuda") -> EngineRuntime:
    return EngineRuntime(
        engine="vllm",
        version=Version("0.32.0"),
        python=Path("/env/bin/python"),
        bin_dir=Path("/env/bin"),
        device=device,
        flags=load_flags("vllm", "0.32.0"),
    )


def profile(**fields: object) -> Profile:
    return profile_from_mapping("p", {"model": "org/model", **fields})


def launch(p: Profile, device: str = "cuda") -> tuple[list[str], dict[str, str]]:
    spec = VLLMAdapter().launch(p, runtime=runtime(device), port=41234, model=p.model)
    return list(spec.argv), dict(spec.env)


def flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_registry_has_vllm() -> None:
    assert isinstance(ADAPTERS["vllm"], VLLMAdapter)
    with pytest.raises(ConfigError, match="known engines"):
        adapter_for("llamacpp")


def test_always_loopback_and_given_port() -> None:
    argv, env = launch(profile())
    assert argv[:2] == ["/env/bin/python", "-c"]
    assert "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__')" in argv[2]
    assert flag_value(argv, "--host") == "127.0.0.1"
    assert flag_value(argv, "--port") == "41234"
    assert flag_value(argv, "--model") == "org/model"
    assert env["VLLM_NO_USAGE_STATS"] == "1"


def test_tp2_on_geforce_without_p2p() -> None:
    argv, env = launch(profile(gpus=[0, 1], tensor_parallel_size=2))
    assert flag_value(argv, "--tensor-parallel-size") == "2"
    assert "--disable-custom-all-reduce" in argv
    assert env["NCCL_P2P_DISABLE"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_tp2_with_p2p_keeps_custom_all_reduce() -> None:
    argv, env = launch(profile(gpus=[0, 1], tensor_parallel_size=2, p2p=True))
    assert "--disable-custom-all-reduce" not in argv
    assert "NCCL_P2P_DISABLE" not in env


def test_data_parallel_on_geforce_gets_the_tensor_parallel_p2p_handling() -> None:
    """Data parallel ranks talk over NCCL too (DP sync, MoE all-to-all): on GeForce without
    P2P they get the same settings as tensor parallel."""
    argv, env = launch(profile(gpus=[0, 1], data_parallel_size=2))
    assert flag_value(argv, "--data-parallel-size") == "2"
    assert "--tensor-parallel-size" not in argv
    assert "--disable-custom-all-reduce" in argv
    assert env["NCCL_P2P_DISABLE"] == "1"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    argv, env = launch(profile(gpus=[0, 1], data_parallel_size=2, p2p=True))
    assert "--disable-custom-all-reduce" not in argv and "NCCL_P2P_DISABLE" not in env


def test_single_gpu_on_second_card() -> None:
    argv, env = launch(profile(gpus=[1]))
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "--tensor-parallel-size" not in argv and "NCCL_P2P_DISABLE" not in env


def test_profile_fields_become_flags() -> None:
    argv, _ = launch(
        profile(
            served_name="m",
            aliases=["a1", "a2"],
            max_model_len=8192,
            max_num_seqs=16,
            quantization="awq_marlin",
            kv_cache_dtype="fp8",
            gpu_memory_utilization=0.85,
            revision="abc123",
            dtype="float16",
        )
    )
    i = argv.index("--served-model-name")
    assert argv[i + 1 : i + 4] == ["m", "a1", "a2"]
    assert flag_value(argv, "--max-model-len") == "8192"
    assert flag_value(argv, "--max-num-seqs") == "16"
    assert flag_value(argv, "--quantization") == "awq_marlin"
    assert flag_value(argv, "--kv-cache-dtype") == "fp8"
    assert flag_value(argv, "--gpu-memory-utilization") == "0.85"
    assert flag_value(argv, "--revision") == "abc123"
    assert "--trust-remote-code" not in argv  # off unless the user consents


def test_cpu_build_env_and_no_gpu_flags() -> None:
    argv, env = launch(profile(device="cpu", cpu_kv_cache_gib=2), device="cpu")
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert "--gpu-memory-utilization" not in argv and "CUDA_VISIBLE_DEVICES" not in env


def test_every_emitted_flag_is_in_the_allow_list() -> None:
    flags = load_flags("vllm", "0.32.0")
    argv, _ = launch(
        profile(
            gpus=[0, 1],
            tensor_parallel_size=2,
            max_model_len=4096,
            max_num_seqs=4,
            kv_cache_dtype="fp8",
            quantization="gptq",
            trust_remote_code=True,
            max_num_batched_tokens=4096,
        )
    )
    flags.check(argv[3:])  # raises on any flag the installed version does not accept


@pytest.mark.parametrize(
    ("extra", "hint"),
    [
        (["--use-ray-cluster"], None),  # invented in the source articles
        (["--worker-extension-pool-size", "4"], None),  # invented
        (["--swap-space", "4"], None),  # removed from vLLM
        (["--preemption-mode", "swap"], None),  # removed
        (["--disable-log-requests"], "--enable-log-requests"),  # removed; the opposite exists
        (["--enable-chained-prefill"], "--enable-chunked-prefill"),  # typo in the FAQ
        (["--max-num-seq", "4"], "--max-num-seqs"),
    ],
)
def test_unknown_extra_flags_are_refused_with_the_nearest_name(
    extra: list[str], hint: str | None
) -> None:
    with pytest.raises(UnknownFlagError) as err:
        launch(profile(extra_flags=extra))
    assert f"does not accept {extra[0]}" in err.value.message
    if hint:
        assert f"did you mean {hint}?" in err.value.message


def test_valid_extra_flags_pass_in_every_spelling() -> None:
    extra = [
        "--enforce-eager",
        "--max_num_batched_tokens",
        "2048",
        "--enable-prefix-caching",
        "--block-size=32",
    ]
    argv, _ = launch(profile(extra_flags=extra))
    assert argv[-5:] == extra


def test_flag_choices_are_checked() -> None:
    with pytest.raises(UnknownFlagError, match="valid: auto, bfloat16"):
        launch(profile(extra_flags=["--dtype=bf16"]))


def test_value_without_flag_is_refused() -> None:
    flags = FlagSet("vllm", "x", {})
    with pytest.raises(UnknownFlagError, match="value without a flag"):
        flags.check(["4"])


def test_nvfp4_refused_before_launch_on_ada() -> None:
    with pytest.raises(ConfigError, match="needs a Blackwell GPU"):
        launch(profile(quantization="nvfp4"))


def test_cpu_build_refuses_gpu_quantizations() -> None:
    with pytest.raises(ConfigError, match="CPU build of vLLM cannot run 'awq'"):
        launch(profile(device="cpu", quantization="awq"), device="cpu")


DIAGNOSES = [
    (
        "ValueError: To serve at least one request with the model's max seq len (32768), (4.0 GiB "
        "KV cache is needed, which is larger than the available KV cache memory (2.1 GiB). Based on "
        "the available memory, the estimated maximum model length is 17424. Try increasing "
        "`gpu_memory_utilization` (which also controls CPU memory on the CPU backend) or decreasing "
        "`max_model_len` when initializing the engine.",
        "kv_cache_too_small",
        {"max_model_len": "17424"},
        "max_model_len = 17424",
    ),
    (
        "ValueError: No available memory for the cache blocks. Try increasing "
        "`gpu_memory_utilization` when initializing the engine",
        "no_cache_memory",
        {},
        "quantized",
    ),
    (
        "ValueError: Free memory on device cuda:0 (21.05/23.99 GiB) on startup is less than desired "
        "GPU memory utilization (0.95, 22.79 GiB). Decrease GPU memory utilization or reduce GPU "
        "memory used by other processes.",
        "free_memory_below_fraction",
        {"gpu_memory_utilization": "0.85"},
        "gpu_memory_utilization = 0.85",
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.96 GiB. GPU 0 has a total "
        "capacity of 23.99 GiB",
        "weights_dont_fit",
        {},
        "tensor_parallel_size = 2",
    ),
    (
        "ValueError: Failed to load model - not enough GPU memory. Try lowering "
        "--gpu-memory-utilization",
        "weights_dont_fit",
        {},
        "AWQ",
    ),
    (
        "ValueError: User-specified max_model_len (65536) is greater than the derived "
        "max_model_len (max_position_embeddings=32768 or model_max_length=None in model's "
        "config.json).",
        "model_len_above_limit",
        {"max_model_len": "32768"},
        "max_model_len = 32768",
    ),
    (
        "ValueError: The quantization method fp8 is not supported for the current GPU. Minimum "
        "capability: 89. Current capability: 86.",
        "quantization_unsupported",
        {},
        "Ampere",
    ),
    (
        "ValueError: Unknown quantization method: awqq. Must be one of ['awq', 'gptq']",
        "quantization_unsupported",
        {},
        "Remove `quantization`",
    ),
    (
        "OSError: [Errno 98] error while attempting to bind on address ('127.0.0.1', 8001): "
        "address already in use",
        "port_in_use",
        {},
        "start the engine again",
    ),
    (
        "(EngineCore pid=1) INFO 11-30 [shm_broadcast.py:466] No available shared memory broadcast "
        "block found in 60 seconds. This typically happens when some processes are hanging",
        "shm_broadcast_wait",
        {},
        "Nothing to do",
    ),
    (
        "RuntimeError: NCCL error in: ../torch/csrc/distributed/c10d/NCCLUtils.hpp:275, unhandled "
        "system error",
        "nccl_failure",
        {},
        "NCCL_P2P_DISABLE=1",
    ),
    (
        "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error. Repository Not Found for "
        "url",
        "model_not_found",
        {},
        "traylm models pull",
    ),
]


@pytest.mark.parametrize(("line", "code", "suggested", "advice"), DIAGNOSES)
def test_diagnoses(line: str, code: str, suggested: dict[str, str], advice: str) -> None:
    found = VLLMAdapter().diagnose(line)
    assert found is not None, line
    assert found.code == code
    assert dict(found.suggested) == suggested
    assert advice in found.advice
    assert found.severity == ("info" if code == "shm_broadcast_wait" else "error")


def test_ordinary_lines_are_not_diagnosed() -> None:
    for line in (
        "INFO 11-30 [entry.py:140] Starting vLLM server on http://127.0.0.1:8001",
        "INFO [kv_cache_utils.py:2327] CPU KV cache size: 2,097,152 tokens",
        "Loading safetensors checkpoint shards: 100% Completed | 1/1",
    ):
        assert VLLMAdapter().diagnose(line) is None


def test_real_flag_probe_matches_the_shipped_allow_list() -> None:
    """The shipped list came from resources/probes/argparse_flags.py on vllm-cpu 0.32.0."""
    flags = load_flags("vllm", "0.32.0")
    assert flags.version == "0.32.0"
    assert "--disable-custom-all-reduce" in flags.flags
    assert flags.flags["--served-model-name"].multiple
    assert not flags.flags["--enforce-eager"].takes_value


def test_runner_tool_and_reasoning_parsers_become_flags() -> None:
    argv, _ = launch(profile(runner="pooling"))
    assert flag_value(argv, "--runner") == "pooling"
    assert "--enable-auto-tool-choice" not in argv and "--reasoning-parser" not in argv
    argv, _ = launch(profile(tool_parser="hermes", reasoning_parser="qwen3"))
    assert "--enable-auto-tool-choice" in argv and "--runner" not in argv
    assert flag_value(argv, "--tool-call-parser") == "hermes"
    assert flag_value(argv, "--reasoning-parser") == "qwen3"


def test_an_unknown_parser_is_named_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        launch(profile(tool_parser="llama3-json"))
    text = str(err.value)
    assert "tool_parser = 'llama3-json' is not a name vllm 0.32.0 knows" in text
    assert "did you mean 'llama3_json'?" in text and "hermes" in text
    with pytest.raises(ConfigError, match="reasoning_parser = 'qwen9'"):
        launch(profile(reasoning_parser="qwen9"))


def test_a_quantization_removed_since_the_profile_was_written_is_refused_by_name() -> None:
    """vLLM 0.34 dropped 'fp_quant' from its quantization methods (the shipped flag lists
    record each version's registry): a 0.32 profile that names it is refused before a start."""
    p = profile(quantization="fp_quant", dtype="bfloat16")
    assert "fp_quant" in load_flags("vllm", "0.32.0").flags["--quantization"].choices
    newer = dataclasses.replace(
        runtime(), version=Version("0.34.0"), flags=load_flags("vllm", "0.34.0")
    )
    with pytest.raises(ConfigError, match="quantization = 'fp_quant' is not a name vllm 0.34.0"):
        VLLMAdapter().launch(p, runtime=newer, port=41234, model=p.model)
    for name in ("awq_marlin", "mxfp4", "fp8"):  # the presets' and the Ada-capable ones stay
        assert name in newer.flags.flags["--quantization"].choices


def test_parsers_and_runner_are_vllm_settings() -> None:
    with pytest.raises(ConfigError, match="tool_parser is a vLLM setting"):
        profile(engine="sglang", tool_parser="hermes")
    with pytest.raises(ConfigError, match="runner is a vLLM setting"):
        profile(engine="trtllm", runner="pooling")
    with pytest.raises(ConfigError, match="is not a parser name"):
        profile(tool_parser="--evil")


def test_data_parallel_is_vllms_own_flag_where_the_version_has_it() -> None:
    argv, env = launch(profile(device="cpu", data_parallel_size=2), device="cpu")
    assert flag_value(argv, "--data-parallel-size") == "2"
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in env  # each rank is an engine core process
    assert "--data-parallel-size" not in launch(profile())[0]
    older = runtime("cpu")
    flags = {k: v for k, v in older.flags.flags.items() if k != "--data-parallel-size"}
    older = dataclasses.replace(older, flags=dataclasses.replace(older.flags, flags=flags))
    p = profile(device="cpu", data_parallel_size=2)
    with pytest.raises(UnknownFlagError, match="does not accept --data-parallel-size"):
        VLLMAdapter().launch(p, runtime=older, port=1, model=p.model)


def test_data_parallel_is_for_vllm_and_counts_gpus() -> None:
    with pytest.raises(ConfigError, match="use replicas instead"):
        profile_from_mapping("s", {"model": "org/m", "engine": "sglang", "data_parallel_size": 2})
    with pytest.raises(ConfigError, match="data parallel = 2 needs that many GPUs"):
        profile(gpus=[0], data_parallel_size=2)
    assert profile(gpus=[0, 1], data_parallel_size=2).gpu_count == 2
