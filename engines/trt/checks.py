"""Refuse a TensorRT-LLM start before anything long begins: a GPU that cannot run the precision,
an architecture the build cannot take, a context the model or the GPUs cannot hold.

Pure functions of the profile and the facts; each raises ConfigError with the reason and what to
do instead.
"""

from __future__ import annotations

from collections.abc import Sequence

from engines.config.profiles import Profile
from engines.errors import ConfigError
from engines.events.gpu import GPUInfo
from engines.gpu.backend import cuda_order
from engines.gpu.inventory import architecture, by_cuda_index, capability, sm_name
from engines.trt.model import ModelFacts
from engines.trt.plan import checkpoint_tool

GIB = 1024**3
FP8_QUANTIZATION = frozenset({"fp8", "modelopt", "modelopt_fp8", "fbgemm_fp8", "w4a8_awq"})
FP4_QUANTIZATION = frozenset({"nvfp4", "modelopt_fp4", "mxfp4"})
WEIGHT_FACTOR = {
    None: 1.0,
    "fp8": 0.52,
    "w4a8_awq": 0.3,
    "int4_awq": 0.3,
    "int4_wo": 0.3,
    "int8_wo": 0.55,
    "nvfp4": 0.3,
}
"""Engine weight size relative to a 16-bit checkpoint (embeddings and lm_head stay 16-bit)."""
RUNTIME_OVERHEAD_BYTES = 2 * GIB
"""CUDA context, cuBLAS/NCCL workspaces and activations at modest batch sizes."""


def check_gpus(profile: Profile, gpus: Sequence[GPUInfo]) -> list[GPUInfo]:
    """The profile's GPUs; refuses when there are none or some indices are missing."""
    if not gpus:
        raise ConfigError(
            "TensorRT-LLM needs an NVIDIA GPU and none was found (NVML did not answer); install "
            "the NVIDIA driver, or use engine = 'vllm' with device = 'cpu'"
        )
    found = by_cuda_index(gpus, profile.gpus)
    missing = sorted(set(profile.gpus) - {i for i, _ in found})
    if missing:
        have = ", ".join(f"{i} ({g.name})" for i, g in enumerate(cuda_order(gpus)))
        raise ConfigError(f"gpus lists {missing} but this machine has GPUs {have}; fix gpus")
    return [g for _, g in found]


def check_precision(profile: Profile, gpus: Sequence[GPUInfo]) -> None:
    """FP8 needs Ada or Hopper; NVFP4 needs Blackwell; 4/8-bit weight-only needs Ampere."""
    recipe = profile.quant_recipe
    quant = (profile.quantization or "").lower()
    oldest = min(gpus, key=lambda g: capability(g.compute_capability))
    cc = oldest.compute_capability
    where = f"GPU {oldest.index} is an {oldest.name} ({sm_name(cc)}, {architecture(cc)})"
    if (recipe == "nvfp4" or quant in FP4_QUANTIZATION) and capability(cc) < (10, 0):
        raise ConfigError(
            f"NVFP4 runs on Blackwell GPUs only and {where}; use quant_recipe = 'fp8' "
            "(Ada/Hopper) or 'int4_awq'"
        )
    fp8 = recipe in {"fp8", "w4a8_awq"} or quant in FP8_QUANTIZATION
    if profile.kv_cache_dtype != "auto":
        fp8 = True
    if fp8 and capability(cc) < (8, 9):
        raise ConfigError(
            f"FP8 (weights, activations or KV cache) needs an Ada (sm_89) or Hopper GPU and "
            f"{where}; use quant_recipe = 'int4_awq' (AWQ) or 'int8_wo' (INT8 weight-only) with "
            "kv_cache_dtype = 'auto'"
        )
    if recipe in {"int4_awq", "int4_wo", "int8_wo"} and capability(cc) < (8, 0):
        raise ConfigError(f"quant_recipe {recipe!r} needs an Ampere or newer GPU and {where}")
    names = {g.name for g in gpus}
    if len(names) > 1 and profile.mode == "build":
        raise ConfigError(
            f"a TensorRT engine is built for one GPU model, but gpus mixes {sorted(names)}; "
            "list GPUs of the same model"
        )


def check_build_model(profile: Profile, facts: ModelFacts) -> None:
    checkpoint_tool(profile, facts)  # refuses an architecture the build cannot take
    limit = facts.max_position_embeddings
    if profile.max_model_len and limit and profile.max_model_len > limit:
        raise ConfigError(
            f"max_model_len {profile.max_model_len} is above {facts.architecture}'s limit of "
            f"{limit} tokens (max_position_embeddings); set max_model_len = {limit} or less"
        )
    if facts.num_heads % profile.tensor_parallel_size:
        raise ConfigError(
            f"tensor_parallel_size {profile.tensor_parallel_size} does not divide the model's "
            f"{facts.num_heads} attention heads; use a divisor"
        )


def check_fit(profile: Profile, facts: ModelFacts, gpus: Sequence[GPUInfo]) -> None:
    """Refuse an engine whose weights, or one full-length sequence of KV cache, cannot fit."""
    world = profile.world_size
    memory = min(g.memory_total_bytes or 0 for g in gpus)
    weights = facts.weights_bytes * WEIGHT_FACTOR.get(profile.quant_recipe, 1.0) / world
    usable = memory * 0.95 - RUNTIME_OVERHEAD_BYTES
    if weights > usable:
        raise ConfigError(
            f"the engine's weights need about {weights / GIB:.1f} GiB per GPU and a "
            f"{gpus[0].name} has {memory / GIB:.1f} GiB; use tensor_parallel_size = "
            f"{world * 2} (with that many gpus), or a smaller recipe (quant_recipe = "
            "'int4_awq' stores about 0.3 bytes per 16-bit weight byte)"
        )
    kv_bytes = 1 if profile.kv_cache_dtype != "auto" else 2
    seq_len = profile.max_model_len or facts.max_position_embeddings or 4096
    per_token = facts.kv_bytes_per_token(kv_bytes) / min(world, facts.num_kv_heads)
    one_sequence = seq_len * per_token
    kv_room = (usable - weights) * profile.gpu_memory_utilization
    if one_sequence > kv_room:
        fits = int(kv_room // per_token) if per_token else 0
        raise ConfigError(
            f"one {seq_len}-token sequence needs {one_sequence / GIB:.1f} GiB of KV cache per "
            f"GPU but only about {max(kv_room, 0) / GIB:.1f} GiB is left after the weights; set "
            f"max_model_len = {max(fits, 0)} or less, kv_cache_dtype = 'fp8' (Ada/Hopper), or "
            "tensor_parallel_size = 2"
        )
