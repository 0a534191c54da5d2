"""The fit estimator's arithmetic on published model shapes (pure functions, no I/O). The KV
formula is checked against the real vLLM engine in tests/integration/test_fit_vllm.py."""

from __future__ import annotations

import dataclasses
from typing import Any

from engines.events import ModelDetails
from engines.hub.fit import GIB, RTX_4090, FitRequest, estimate, fit_matrix, kv_bytes_per_token
from engines.hub.shape import parse_config


def details(**kw: Any) -> ModelDetails:
    base: dict[str, Any] = dict(
        repo_id="org/m",
        revision="main",
        commit_sha="0" * 40,
        architecture="LlamaForCausalLM",
        model_type="llama",
        parameters=None,
        parameters_by_dtype={},
        num_layers=32,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_kv_heads=8,
        head_dim=128,
        kv_latent_dim=None,
        vocab_size=128256,
        max_context=131072,
        dtype="bfloat16",
        quantization=None,
        quantization_config={},
        license="",
        gated="",
        private=False,
        needs_remote_code=False,
        files=(),
        skipped_files=(),
        download_bytes=0,
        weights_bytes=0,
    )
    base.update(kw)
    return ModelDetails(**base)


LLAMA_8B = details(parameters=8_030_261_248, weights_bytes=16_060_522_496)
LLAMA_70B = details(
    parameters=70_553_706_496,
    weights_bytes=141_107_412_992,
    num_layers=80,
    hidden_size=8192,
    intermediate_size=28672,
    num_attention_heads=64,
)


def test_kv_bytes_per_token_is_2_x_layers_x_kv_heads_x_head_dim_x_dtype() -> None:
    assert kv_bytes_per_token(LLAMA_8B, "auto") == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token(LLAMA_8B, "fp8") == 65536
    assert kv_bytes_per_token(LLAMA_8B, "auto", tensor_parallel=2) == 65536
    few_heads = details(num_kv_heads=1)
    assert kv_bytes_per_token(few_heads, "auto", tensor_parallel=2) == 2 * 32 * 1 * 128 * 2
    mla = details(num_layers=61, kv_latent_dim=512 + 64, num_kv_heads=128)
    assert kv_bytes_per_token(mla, "auto") == 61 * 576 * 2
    assert kv_bytes_per_token(mla, "auto", tensor_parallel=2) == 61 * 576 * 2  # replicated


def test_llama_8b_on_one_4090_needs_a_shorter_context_or_tp2() -> None:
    r = estimate(LLAMA_8B, FitRequest(engine="vllm", gpus=(RTX_4090,)))
    assert r.verdict == "wont_fit" and "131,072-token sequence" in r.reason
    assert r.weights_bytes_per_gpu == LLAMA_8B.weights_bytes
    assert 30_000 < r.kv_tokens < 50_000  # ~5 GiB of KV at 128 KiB per token
    changes = {f.change: f for f in r.fixes}
    assert changes["tp2"].verdict in ("tight", "fits")
    assert changes["shorter_context"].verdict == "fits"
    ctx = changes["shorter_context"].context_len
    assert ctx is not None and ctx % 1024 == 0 and ctx <= r.kv_tokens / 1.25
    assert "and a context of" in changes["fp8_kv"].description  # fp8 KV alone is not enough
    ok = estimate(LLAMA_8B, FitRequest(engine="vllm", context_len=ctx))
    assert ok.verdict == "fits"


def test_llama_70b_bf16_does_not_fit_two_4090s_but_an_awq_variant_does() -> None:
    r = estimate(LLAMA_70B, FitRequest(engine="vllm", gpus=(RTX_4090, RTX_4090), context_len=8192))
    assert r.verdict == "wont_fit" and "weights need" in r.reason
    assert r.weights_bytes_per_gpu > 60 * GIB
    fixes = {f.change: f for f in r.fixes}
    assert "awq_variant" in fixes and "fp8_variant" not in fixes
    assert fixes["awq_variant"].verdict in ("fits", "tight")
    assert "shorter_context" not in fixes, "no context makes 70 GiB of weights fit"


def test_concurrency_makes_it_tight_and_headroom_is_required_for_fits() -> None:
    short = estimate(LLAMA_8B, FitRequest(context_len=8192, concurrency=1))
    assert short.verdict == "fits" and short.sequences_fit >= 4
    many = estimate(LLAMA_8B, FitRequest(context_len=8192, concurrency=short.sequences_fit + 1))
    assert many.verdict == "tight" and "the rest wait" in many.reason


def test_ada_runs_fp8_but_not_nvfp4() -> None:
    fp8 = details(quantization="fp8", weights_bytes=8_500_000_000)
    for engine in ("vllm", "trtllm"):
        r = estimate(fp8, FitRequest(engine=engine, context_len=8192))
        assert r.supported and r.verdict == "fits"
    nvfp4 = details(quantization="nvfp4", weights_bytes=5_000_000_000)
    trt = estimate(nvfp4, FitRequest(engine="trtllm", context_len=8192))
    assert not trt.supported and trt.verdict == "wont_fit" and "Blackwell" in trt.reason
    vllm = estimate(nvfp4, FitRequest(engine="vllm", context_len=8192))
    assert not vllm.supported and "FP8 or AWQ" in vllm.reason  # the vLLM adapter refuses it too


def test_cpu_budget_is_exactly_the_kv_cache_space() -> None:
    tiny = details(num_layers=2, num_kv_heads=1, head_dim=64, max_context=2048)
    r = estimate(tiny, FitRequest(device="cpu", cpu_kv_cache_bytes=GIB, context_len=512))
    assert r.kv_tokens == GIB // (2 * 2 * 1 * 64 * 2) == 2_097_152
    assert r.sequences_fit == 2_097_152 // 512


def test_matrix_defaults_to_one_and_two_4090s_per_engine() -> None:
    results = fit_matrix(LLAMA_8B, context_len=8192)
    assert [(r.engine, len(r.gpus)) for r in results] == [
        ("vllm", 1),
        ("vllm", 2),
        ("trtllm", 1),
        ("trtllm", 2),
    ]
    assert all(r.gpus[0] == RTX_4090 for r in results)


def test_config_parsing_handles_gqa_multimodal_and_quantization_schemes() -> None:
    llava = parse_config(
        {
            "architectures": ["LlavaForConditionalGeneration"],
            "text_config": {
                "num_hidden_layers": 32,
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "max_position_embeddings": 32768,
            },
        }
    )
    assert (llava.num_layers, llava.num_kv_heads, llava.head_dim) == (32, 8, 128)
    awq = parse_config({"quantization_config": {"quant_method": "awq", "bits": 4}})
    assert awq.quantization == "awq" and awq.quantization_config["bits"] == "4"
    ct = {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {}}}}
    ct["config_groups"]["g"]["weights"] = {"num_bits": 4, "type": "float"}
    assert parse_config({"quantization_config": ct}).quantization == "nvfp4"
    ct["config_groups"]["g"]["weights"] = {"num_bits": 8, "type": "float"}
    assert parse_config({"quantization_config": ct}).quantization == "fp8"
    modelopt = parse_config({}, {"quantization": {"quant_algo": "NVFP4"}})
    assert modelopt.quantization == "nvfp4"
    mla = parse_config({"kv_lora_rank": 512, "qk_rope_head_dim": 64, "num_attention_heads": 128})
    assert mla.kv_latent_dim == 576
    assert parse_config({"auto_map": {"AutoModel": "x.Y"}}).needs_remote_code


def test_packed_4bit_checkpoints_report_their_real_parameter_count() -> None:
    from engines.hub.shape import model_parameters

    # Llama-3.3-70B AWQ as the Hub lists it: 8.6B I32 elements (8 weights each) + 0.7B F16
    stored = {"I32": 8_600_000_000, "F16": 700_000_000}
    assert model_parameters(stored, "awq") == 8 * 8_600_000_000 + 700_000_000
    assert model_parameters(stored, None) == 9_300_000_000  # unquantized: counted as stored
    assert model_parameters({"BF16": 1000}, "gptq") == 1000
    assert model_parameters({}, "awq") is None


def test_cpu_build_fits_in_memory_or_says_how_much_is_missing() -> None:
    from engines.hub.fit import cpu_estimate

    small = details(num_layers=24, num_kv_heads=2, head_dim=64, max_context=32768,
                    weights_bytes=GIB)  # fmt: skip
    r = cpu_estimate(small, kv_cache_bytes=4 * GIB, ram_bytes=24 * GIB, context_len=4096)
    assert (r.verdict, r.weights_bytes_per_gpu, r.gpus) == ("fits", GIB, ())
    r = cpu_estimate(small, kv_cache_bytes=4 * GIB, ram_bytes=8 * GIB, context_len=4096)
    assert r.verdict == "tight" and "7.0 GiB of the 8.0 GiB" in r.reason
    r = cpu_estimate(small, kv_cache_bytes=4 * GIB, ram_bytes=6 * GIB, context_len=4096)
    assert r.verdict == "wont_fit"
    assert "need more than this computer's 6.0 GiB of memory" in r.reason


def test_activations_follow_the_profile_s_batched_tokens_else_vllm_s_default_for_the_card() -> None:
    """vLLM's server profiles max_num_batched_tokens tokens: 2048 by default on a card under
    70 GiB (EngineArgs.get_batch_defaults), 8192 on an H100-class card; a profile's own value
    replaces the default. Activations grow with it: 14336 × 2 + 4096 × 4 values × 2 bytes per
    token for Llama 8B."""
    per_token = (2 * 14336 + 4 * 4096) * 2
    default = estimate(LLAMA_8B, FitRequest(context_len=8192))
    own = estimate(LLAMA_8B, FitRequest(context_len=8192, max_num_batched_tokens=8192))
    assert own.overhead_bytes_per_gpu - default.overhead_bytes_per_gpu == (8192 - 2048) * per_token
    assert own.kv_tokens < default.kv_tokens
    fewer = estimate(LLAMA_8B, FitRequest(context_len=8192, max_num_seqs=16))
    assert default.overhead_bytes_per_gpu - fewer.overhead_bytes_per_gpu == (256 - 16) * 128256 * 4
    h100 = dataclasses.replace(
        RTX_4090,
        name="NVIDIA H100 80GB HBM3",
        memory_total_bytes=80 * GIB,
        compute_capability="9.0",
    )
    a100 = dataclasses.replace(h100, name="NVIDIA A100-SXM4-80GB", compute_capability="8.0")
    big = estimate(LLAMA_8B, FitRequest(gpus=(h100,), context_len=8192))
    assert big.overhead_bytes_per_gpu - default.overhead_bytes_per_gpu == (
        (8192 - 2048) * per_token + (1024 - 256) * 128256 * 4
    )
    same = estimate(LLAMA_8B, FitRequest(gpus=(a100,), context_len=8192))
    assert same.overhead_bytes_per_gpu == default.overhead_bytes_per_gpu  # A100s keep 2048


def test_the_budget_is_a_share_of_the_memory_cuda_sees_not_nvmls_total() -> None:
    """A 4090 is 23.99 GiB in NVML and 23.64 GiB in torch: the driver's reserve is in NVML's
    total and no engine gets it, so the utilisation share is taken of the rest (the simulated
    cards, NVML v2 and the default 4090 all carry the reserve)."""
    from engines.gpu.sim import RESERVED_BYTES, SimulatedBackend

    assert RTX_4090.memory_reserved_bytes == RESERVED_BYTES
    for gpu in (RTX_4090, SimulatedBackend(1).open()[0]):
        assert gpu.memory_total_bytes and gpu.memory_reserved_bytes == RESERVED_BYTES
        result = estimate(LLAMA_8B, FitRequest(gpus=(gpu,), gpu_memory_utilization=0.9))
        usable = gpu.memory_total_bytes - RESERVED_BYTES
        assert result.budget_bytes_per_gpu == int(usable * 0.9)
    headless = dataclasses.replace(RTX_4090, memory_reserved_bytes=None)  # NVML v1 only
    result = estimate(LLAMA_8B, FitRequest(gpus=(headless,), gpu_memory_utilization=0.9))
    assert result.budget_bytes_per_gpu == int(RTX_4090.memory_total_bytes * 0.9)
