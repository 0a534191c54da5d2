"""The TensorRT-LLM adapter, build plan and pre-build checks as pure functions, against the flag
allow-lists traylm ships (taken from the real trtllm-serve/trtllm-build/quantize.py/
convert_checkpoint.py definitions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version

from engines.config.profiles import Profile, profile_from_mapping
from engines.envs.manager import load_flags
from engines.errors import ConfigError, UnknownFlagError
from engines.events.gpu import GPUInfo
from engines.gpu.sim import SimulatedBackend
from engines.runtime.adapters.base import RUN_DIR, EngineRuntime
from engines.runtime.adapters.trtllm import CONFIG_NAME, RULES, TRTLLMAdapter
from engines.trt.checks import check_build_model, check_fit, check_precision
from engines.trt.model import read_model_facts
from engines.trt.plan import BuildTools, build_arguments, plan_build
from tests.fakes.fake_trt_env import make_tiny_hf_model

ADA = list(SimulatedBackend(2).open())  # the simulator's RTX 4090s, as the inventory has them


def _gpu(name: str, cc: str) -> GPUInfo:
    return GPUInfo(
        uuid=f"GPU-{name}",
        index=0,
        name=name,
        compute_capability=cc,
        memory_total_bytes=80 * 2**30,
        driver_version="570.1",
        cuda_version="12.8",
    )


AMPERE = [_gpu("NVIDIA A100-SXM4-80GB", "8.0")]
HOPPER = [_gpu("NVIDIA H100", "9.0")]


def runtime() -> EngineRuntime:
    return EngineRuntime(
        "trtllm",
        Version("1.2.1"),
        Path("/envs/trtllm-1.2.1/bin/python"),
        Path("/envs/trtllm-1.2.1/bin"),
        "cuda",
        load_flags("trtllm", "1.2.1"),
    )


def profile(**fields: object) -> Profile:
    data = {"engine": "trtllm", "model": "/models/tiny", "device": "cuda", **fields}
    return profile_from_mapping("p", data)


def tools() -> BuildTools:
    flags = {
        t: load_flags("trtllm", "1.2.1", tool=t) for t in ("quantize", "convert-llama", "build")
    }
    return BuildTools(Path("/env/bin/python"), Path("/env/bin/trtllm-build"), Path("/ex"), flags)


def test_serve_argv_for_tp2_uses_underscored_click_flags_and_a_config_file() -> None:
    spec = TRTLLMAdapter().launch(
        profile(gpus=[0, 1], tensor_parallel_size=2, max_num_seqs=16, max_model_len=4096),
        runtime=runtime(),
        port=41000,
        model="/models/tiny",
    )
    assert spec.argv[:2] == ("/envs/trtllm-1.2.1/bin/trtllm-serve", "/models/tiny")
    joined = " ".join(spec.argv)
    assert "--backend pytorch --host 127.0.0.1 --port 41000" in joined
    assert "--tp_size 2" in joined and "--max_batch_size 16" in joined
    assert "--max_seq_len 4096" in joined
    assert f"--extra_llm_api_options {RUN_DIR}/{CONFIG_NAME}" in joined
    assert "--config" not in spec.argv  # an alias newer than some 1.2.x releases
    assert spec.env["CUDA_VISIBLE_DEVICES"] == "0,1" and spec.env["NCCL_P2P_DISABLE"] == "1"
    config = json.loads(spec.files[CONFIG_NAME])
    assert config["allreduce_strategy"] == "NCCL"
    assert spec.metrics_path == "/prometheus/metrics"


def test_build_mode_serves_the_engine_with_the_tensorrt_backend() -> None:
    spec = TRTLLMAdapter().launch(
        profile(mode="build"), runtime=runtime(), port=1, model="/cache/abc/engine"
    )
    joined = " ".join(spec.argv)
    assert spec.argv[1] == "/cache/abc/engine"
    assert "--backend tensorrt" in joined and "--tokenizer /models/tiny" in joined
    config = json.loads(spec.files[CONFIG_NAME])
    assert "allreduce_strategy" not in config  # not a TensorRT-backend setting


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--usage_mode", "x"), "does not accept --usage_mode"),
        (("--enable_qnfp4",), "does not accept --enable_qnfp4"),
        (("--memory_pool_library_width", "2"), "does not accept --memory_pool_library_width"),
        (("--tp-size", "2"), "did you mean --tp_size?"),  # click does not fold '-' into '_'
        (("--log_level", "loud"), "valid: internal_error, error, warning, info"),
    ],
)
def test_invented_and_misspelled_serve_flags_are_refused(
    flags: tuple[str, ...], message: str
) -> None:
    with pytest.raises(UnknownFlagError, match=message.replace("?", r"\?")):
        TRTLLMAdapter().launch(
            profile(extra_flags=list(flags)), runtime=runtime(), port=1, model="/m"
        )


def test_build_tool_allow_lists_refuse_invented_values() -> None:
    build = load_flags("trtllm", "1.2.1", tool="build")
    with pytest.raises(UnknownFlagError, match="valid: auto, float16, float32, bfloat16, int32"):
        build.check(["--gpt_attention_plugin", "float"])
    build.check(["--gpt_attention_plugin", "bfloat16", "--workers", "2"])
    with pytest.raises(UnknownFlagError, match="--tp_size"):
        build.check(["--tp_size", "2"])  # TP is fixed at checkpoint time; trtllm-build has none
    quantize = load_flags("trtllm", "1.2.1", tool="quantize")
    with pytest.raises(UnknownFlagError, match="valid: nvfp4, fp8"):
        quantize.check(["--qformat", "int3_magic"])


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"quant_recipe": "fp8"}, "needs mode = 'build'"),
        ({"mode": "build", "quant_recipe": "int2"}, "not a ModelOpt recipe"),
        ({"extra_flags": ["--config", "mine.yaml"]}, "may not set --config"),
        ({"device": "cpu"}, "NVIDIA GPUs only"),
    ],
)
def test_profile_mistakes_are_refused(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        TRTLLMAdapter().launch(profile(**fields), runtime=runtime(), port=1, model="/m")


def test_every_rule_matches_its_real_log_line_and_says_what_to_do() -> None:
    lines = {
        "fp8_unsupported": "[TRT] [E] 9: [standardEngineBuilder.cpp::buildEngine::2266] Error "
        "Code 9: Internal Error (Networks with FP8 precision require hardware with FP8 support.)",
        "out_of_memory": "[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::140] Error Code "
        "2: OutOfMemory (no further information)",
        "engine_version_mismatch": "The engine plan file is generated on an incompatible device, "
        "expecting compute 8.9 got compute 8.0, please rebuild.",
        "build_failed": "[TRT-LLM] [E] Engine building failed, please check the error log.",
        "nccl_failure": "NCCL error in: /src/nccl.cu:42, unhandled system error",
        "model_not_found": "huggingface_hub.errors.RepositoryNotFoundError: 401 Client Error",
    }
    adapter = TRTLLMAdapter()
    for code, line in lines.items():
        found = adapter.diagnose(line)
        assert found is not None and found.code == code, line
        assert found.advice
    mismatch = adapter.diagnose(
        "The engine plan file is not compatible with this version of TensorRT, expecting library "
        "version 10.13.3.9 got 10.13.2.6, please rebuild."
    )
    assert mismatch is not None and "10.13.2.6" in mismatch.summary
    assert adapter.diagnose("[TRT-LLM] [I] Set gemm_plugin to auto.") is None
    assert {r.code for r in RULES} >= set(lines)


@pytest.mark.parametrize(
    ("line", "code", "severity"),
    [
        (
            "[TensorRT-LLM][ERROR] tensorrt_llm::common::TllmException: [TensorRT-LLM][ERROR] "
            "Assertion failed: FP8 FMHA cannot be enabled because Context FMHA is not supported. "
            "(/src/cpp/tensorrt_llm/plugins/gptAttentionCommon/gptAttentionCommon.cpp:300)",
            "fp8_attention_unsupported",
            "error",
        ),
        (
            "AssertionError: FP8 FMHA cannot be enabled because Context FMHA is not supported.",
            "fp8_attention_unsupported",
            "error",
        ),
        (
            "[TensorRT-LLM][ERROR] Assertion failed: FP8 FMHA cannot be enabled except on Ada or "
            "Hopper Arch.",
            "fp8_attention_unsupported",
            "error",
        ),
        (
            "AssertionError: FP8 FMHA can only be enabled on sm_89, sm_90, sm_100, sm_103, sm_120 "
            "or sm_121.",
            "fp8_attention_unsupported",
            "error",
        ),
        (
            "[TensorRT-LLM][WARNING] maxAttentionWindowVec too large to fit at least one sequence "
            "in kvCache. Old: [32768], New: [11264]",
            "kv_cache_too_small",
            "warning",
        ),
        (
            "RuntimeError: Attention window too large to fit even a single sequence in the KV "
            "cache. Failing fast rather than attempting an adjustment of the window sizes. Old: "
            "[32768], New: [11264]",
            "kv_cache_too_small",
            "error",
        ),
    ],
)
def test_fp8_attention_and_kv_window_rules_match_the_upstream_messages(
    line: str, code: str, severity: str
) -> None:
    found = TRTLLMAdapter().diagnose(line)
    assert found is not None and (found.code, found.severity) == (code, severity)
    if code == "fp8_attention_unsupported":
        assert "kv_cache_dtype = 'auto'" in found.advice
    else:
        assert "max_model_len" in found.advice


def test_a_shortened_context_suggests_max_model_len() -> None:
    found = TRTLLMAdapter().diagnose(
        "[TensorRT-LLM][WARNING] maxSequenceLen is reduced to maxAttentionWindow: 11264"
    )
    assert found is not None and found.severity == "warning"
    assert found.suggested == {"max_model_len": "11264"}
    assert "max_model_len = 11264" in found.advice


def test_build_plan_quantize_then_build_with_only_real_flags(tmp_path: Path) -> None:
    facts = read_model_facts(make_tiny_hf_model(tmp_path / "m"))
    p = profile(
        mode="build", quant_recipe="fp8", kv_cache_dtype="fp8", gpus=[0, 1], tensor_parallel_size=2
    )
    args = build_arguments(p, facts, ADA)
    plan = plan_build(args, model_dir=facts.path, work_dir=tmp_path / "w", tools=tools())
    quantize, build = plan.steps
    assert quantize.argv[:2] == ("/env/bin/python", "/ex/quantization/quantize.py")
    q = " ".join(quantize.argv)
    assert "--qformat fp8" in q and "--kv_cache_dtype fp8" in q and "--tp_size 2" in q
    b = " ".join(build.argv)
    assert build.argv[0] == "/env/bin/trtllm-build"
    assert f"--checkpoint_dir {tmp_path / 'w' / 'checkpoint'}" in b
    assert "--use_fp8_context_fmha enable" in b and "--workers 2" in b
    assert build_arguments(p, facts, HOPPER)["build.use_fp8_context_fmha"] == "enable"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"quant_recipe": "fp8", "kv_cache_dtype": "fp8"}, "enable"),  # Ada runs FP8 FMHA
        ({"quant_recipe": "w4a8_awq", "kv_cache_dtype": "fp8"}, "enable"),
        ({"quant_recipe": "fp8"}, "disable"),  # needs the FP8 KV cache with paged FMHA
        ({"quant_recipe": "int4_awq", "kv_cache_dtype": "fp8"}, "disable"),  # not an FP8 recipe
        ({"kv_cache_dtype": "fp8"}, "disable"),
        ({"quant_recipe": "int4_awq"}, None),  # FP8 not in play: no flag
        ({}, None),
    ],
)
def test_fp8_context_attention_follows_the_builder_from_sm_89(
    tmp_path: Path, fields: dict[str, str], expected: str | None
) -> None:
    facts = read_model_facts(make_tiny_hf_model(tmp_path / "m"))
    args = build_arguments(profile(mode="build", **fields), facts, ADA)
    assert args.get("build.use_fp8_context_fmha") == expected


def test_plain_build_converts_llama_and_refuses_what_it_cannot(tmp_path: Path) -> None:
    llama = read_model_facts(make_tiny_hf_model(tmp_path / "llama"))
    args = build_arguments(profile(mode="build"), llama, ADA)
    plan = plan_build(args, model_dir=llama.path, work_dir=tmp_path / "w", tools=tools())
    assert plan.steps[0].name == "convert"
    assert plan.steps[0].argv[1] == "/ex/models/core/llama/convert_checkpoint.py"
    qwen = read_model_facts(
        make_tiny_hf_model(tmp_path / "qwen", architecture="Qwen2ForCausalLM", model_type="qwen2")
    )
    with pytest.raises(ConfigError, match="set quant_recipe"):
        build_arguments(profile(mode="build"), qwen, ADA)
    assert build_arguments(profile(mode="build", quant_recipe="int4_awq"), qwen, ADA)


def test_precision_checks_name_the_gpu_and_the_alternative() -> None:
    with pytest.raises(ConfigError, match=r"A100.*sm_80, Ampere.*'int4_awq'.*'int8_wo'"):
        check_precision(profile(mode="build", quant_recipe="fp8"), AMPERE)
    with pytest.raises(ConfigError, match="FP8"):
        check_precision(profile(kv_cache_dtype="fp8"), AMPERE)
    check_precision(profile(mode="build", quant_recipe="int4_awq"), AMPERE)
    check_precision(profile(mode="build", quant_recipe="fp8"), ADA)
    with pytest.raises(ConfigError, match="Blackwell"):
        check_precision(profile(quantization="nvfp4"), HOPPER)


def test_fit_and_context_checks(tmp_path: Path) -> None:
    small = read_model_facts(make_tiny_hf_model(tmp_path / "s"))
    check_fit(profile(mode="build"), small, ADA[:1])
    check_build_model(profile(mode="build", max_model_len=4096), small)
    with pytest.raises(ConfigError, match="limit of 4096"):
        check_build_model(profile(mode="build", max_model_len=4097), small)
    with pytest.raises(ConfigError, match="does not divide"):
        check_build_model(profile(mode="build", gpus=[0, 1, 2], tensor_parallel_size=3), small)
    big = read_model_facts(
        make_tiny_hf_model(tmp_path / "b", index_total_size=140 * 2**30)
    )  # a 70B model in 16-bit
    with pytest.raises(ConfigError, match=r"weights need about 140\.0 GiB"):
        check_fit(profile(mode="build"), big, ADA[:1])
    with pytest.raises(ConfigError, match=r"weights need about 21\.0 GiB"):
        # int4 AWQ over two 4090s still leaves ~21 GiB of weights per GPU: more than a 4090
        # has after the runtime's overhead
        check_fit(
            profile(mode="build", quant_recipe="int4_awq", gpus=[0, 1], tensor_parallel_size=2),
            big,
            ADA,
        )
