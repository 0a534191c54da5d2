"""Will a model fit? Memory arithmetic for vLLM and TensorRT-LLM on a GPU set (pure functions).

Per GPU: budget = utilization × memory (vLLM ``gpu_memory_utilization``; TensorRT-LLM gives
``free_gpu_memory_fraction`` of what is free after loading, modelled the same way); weights are
split by tensor parallel; overhead = CUDA context + activation peak of the profiling run + CUDA
graphs (+ NCCL buffers with TP). What is left is KV cache:

    KV bytes per token = 2 (K and V) × layers × KV heads × head_dim × bytes(KV dtype)

(MLA models store one latent of ``kv_lora_rank + qk_rope_head_dim`` per layer instead, replicated
on every GPU). On the CPU build the KV budget is exactly ``VLLM_CPU_KVCACHE_SPACE``, which is how
the formula is checked against the real engine (tests/integration/test_fit_vllm.py).

Overheads on GPUs are estimates (checked against nothing but published logs so far); the verdict
leaves 25 % of room for them before saying "fits".
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from engines.events.gpu import GPUInfo
from engines.events.hub import FitFix, FitResult, ModelDetails
from engines.gpu.inventory import RTX_4090, capability, cuda_total_bytes

GIB = 1 << 30
FIT_ENGINES = ("vllm", "trtllm")
BLOCK_TOKENS = 16
CPU_BLOCK_TOKENS = 128  # vllm-cpu 0.32 logs KV sizes in blocks of 128 tokens (measured)
HEADROOM = 1.25
CUDA_CONTEXT_BYTES = GIB // 2
CUDA_GRAPH_BYTES = GIB // 4
NCCL_BYTES = 3 * GIB // 10
LARGE_CARD_BYTES = 70 * GIB
"""vLLM's profiling run takes ``max_num_batched_tokens`` tokens and ``max_num_seqs`` sequences;
unset, vLLM's server picks them by the card (EngineArgs.get_batch_defaults in
vllm/engine/arg_utils.py, 0.32/0.33): 8192 tokens and 1024 sequences from 70 GiB (A100s
excepted), else 2048 and 256. TensorRT-LLM's ``max_num_tokens`` defaults to 8192."""

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1, "float8_e4m3fn": 1}
_KV_FP8 = ("fp8", "fp8_e4m3", "fp8_e5m2")

# Quantizations each engine runs on a compute capability; (minimum capability, note).
_SUPPORT: dict[str, dict[str | None, tuple[float, str]]] = {
    "vllm": {
        None: (7.0, ""),
        "awq": (7.5, ""),
        "gptq": (7.5, ""),
        "fp8": (7.5, "FP8 is native on Ada (8.9); older GPUs use a weight-only fallback"),
        "w8a8": (7.5, ""),
        "w8a16": (7.5, ""),
        "w4a16": (7.5, ""),
        "w4a8": (8.9, ""),
        "bitsandbytes": (7.0, ""),
        "mxfp4": (8.0, ""),
        # vLLM can load NVFP4 on Ada only through a slow weight-only fallback; traylm treats
        # it as unsupported there (the vLLM adapter refuses it too) and suggests FP8 or AWQ.
        "nvfp4": (
            10.0,
            "NVFP4 needs Blackwell (compute capability 10.0) for FP4 tensor cores; on Ada (8.9) "
            "pick an FP8 or AWQ variant",
        ),
    },
    "trtllm": {
        None: (8.0, ""),
        "awq": (8.0, ""),
        "gptq": (8.0, ""),
        "fp8": (8.9, ""),
        "w8a8": (8.9, ""),
        "w4a8": (8.9, ""),
        "nvfp4": (10.0, "NVFP4 needs Blackwell (compute capability 10.0); Ada is 8.9"),
        "mxfp4": (9.0, "MXFP4 needs Hopper or Blackwell"),
    },
}


@dataclass(frozen=True)
class FitRequest:
    engine: str = "vllm"
    gpus: tuple[GPUInfo, ...] = (RTX_4090,)
    tensor_parallel: int | None = None  # default: every GPU of the set
    context_len: int | None = None  # default: the model's native context
    concurrency: int = 1
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.90
    device: str = "cuda"  # "cpu": the KV budget is cpu_kv_cache_bytes, exactly
    cpu_kv_cache_bytes: int = GIB
    gpus_available: int = 2  # GPUs the machine has (for the "TP 2" suggestion)
    weights_bytes: int | None = None  # override (variants); default: the model's files
    max_num_batched_tokens: int | None = None  # the profile's; default: the engine's, per card
    max_num_seqs: int | None = None  # the profile's; default: the engine's, per card


def supported(engine: str, quantization: str | None, compute_capability: str) -> tuple[bool, str]:
    table = _SUPPORT.get(engine, {})
    if quantization not in table:
        return False, f"{engine} does not list {quantization} quantization"
    minimum, note = table[quantization]
    ok = capability(compute_capability) >= capability(f"{minimum:.1f}")
    return ok, note


def kv_bytes_per_token(model: ModelDetails, kv_cache_dtype: str, tensor_parallel: int = 1) -> int:
    """KV bytes one token takes on ONE GPU at this tensor-parallel size (all layers)."""
    layers = model.num_layers or 0
    dtype_bytes = 1 if kv_cache_dtype in _KV_FP8 else _DTYPE_BYTES.get(model.dtype, 2)
    if model.kv_latent_dim:
        return layers * model.kv_latent_dim * dtype_bytes
    heads = model.num_kv_heads or 0
    per_gpu_heads = math.ceil(heads / tensor_parallel) if heads else 0
    return 2 * layers * per_gpu_heads * (model.head_dim or 0) * dtype_bytes


def estimate(model: ModelDetails, req: FitRequest) -> FitResult:
    result = _estimate(model, req)
    if result.verdict == "fits" or not result.supported or req.device == "cpu":
        return result
    return dataclasses.replace(result, fixes=_fixes(model, req, result))


def _estimate(model: ModelDetails, req: FitRequest) -> FitResult:
    tp = req.tensor_parallel or (1 if req.device == "cpu" else len(req.gpus))
    context = req.context_len or model.max_context or 4096
    weights_total = req.weights_bytes if req.weights_bytes is not None else _weights(model)
    cc = current_cc(req)
    ok, note = supported(req.engine, model.quantization, "9.9" if req.device == "cpu" else cc)
    notes = tuple(n for n in (note, _shape_note(model)) if n)
    per_token_gpu = kv_bytes_per_token(model, req.kv_cache_dtype, tp)
    if req.device == "cpu":
        budget = weights = overhead = 0
        kv_budget = req.cpu_kv_cache_bytes
    else:
        memory = min(cuda_total_bytes(g) for g in req.gpus[:tp]) if req.gpus else 0
        budget = int(memory * req.gpu_memory_utilization)
        weights = math.ceil(weights_total / tp)
        overhead = _overhead(model, tp, *batch_defaults(req))
        kv_budget = max(0, budget - weights - overhead)
    block = CPU_BLOCK_TOKENS if req.device == "cpu" else BLOCK_TOKENS
    tokens = _kv_tokens(kv_budget, per_token_gpu, block)
    seqs = tokens // context if context else 0
    verdict, reason = _verdict(req, context, weights, overhead, budget, kv_budget, tokens, seqs)
    if not ok:
        verdict, reason = "wont_fit", note or f"{req.engine} cannot run {model.quantization} here"
    return FitResult(
        engine=req.engine,
        gpus=tuple(req.gpus[:tp]) if req.device != "cpu" else (),
        tensor_parallel=tp,
        quantization=model.quantization,
        kv_cache_dtype=req.kv_cache_dtype,
        context_len=context,
        concurrency=req.concurrency,
        budget_bytes_per_gpu=budget,
        weights_bytes_per_gpu=weights,
        overhead_bytes_per_gpu=overhead,
        kv_budget_bytes_per_gpu=kv_budget,
        kv_bytes_per_token=kv_bytes_per_token(model, req.kv_cache_dtype, 1),
        kv_tokens=tokens,
        sequences_fit=seqs,
        verdict=verdict,
        reason=reason,
        supported=ok,
        notes=notes,
    )


def _kv_tokens(kv_budget: int, per_token: int, block: int) -> int:
    if per_token <= 0:
        return 0
    return int(kv_budget // (per_token * block) * block)


def _weights(model: ModelDetails) -> int:
    if model.weights_bytes:
        return model.weights_bytes
    return (model.parameters or 0) * _DTYPE_BYTES.get(model.dtype, 2)


def batch_defaults(req: FitRequest) -> tuple[int, int]:
    """(tokens, sequences) of the engine's profiling run: the request's (a profile's
    ``max_num_batched_tokens``/``max_num_seqs``), else the engine's own default for the card."""
    large = bool(req.gpus) and all(
        (g.memory_total_bytes or 0) >= LARGE_CARD_BYTES and "a100" not in g.name.lower()
        for g in req.gpus
    )
    if req.engine == "trtllm":
        tokens, seqs = 8192, 256
    else:
        tokens, seqs = (8192, 1024) if large else (2048, 256)
    return req.max_num_batched_tokens or tokens, req.max_num_seqs or seqs


def _overhead(model: ModelDetails, tp: int, tokens: int, seqs: int) -> int:
    hidden = model.hidden_size or 0
    inter = model.intermediate_size or 4 * hidden
    act_bytes = 2
    activations = tokens * (2 * inter // tp + 4 * hidden) * act_bytes
    logits = seqs * (model.vocab_size or 0) * 4
    nccl = NCCL_BYTES if tp > 1 else 0
    return CUDA_CONTEXT_BYTES + CUDA_GRAPH_BYTES + nccl + activations + logits


def _verdict(
    req: FitRequest,
    context: int,
    weights: int,
    overhead: int,
    budget: int,
    kv_budget: int,
    tokens: int,
    seqs: int,
) -> tuple[str, str]:
    if req.device != "cpu" and weights + overhead > budget:
        return "wont_fit", (
            f"weights need {_gib(weights)} per GPU plus about {_gib(overhead)} of runtime "
            f"overhead, but the budget is {_gib(budget)} "
            f"({req.gpu_memory_utilization:.0%} of the GPU)"
        )
    if tokens < context:
        return "wont_fit", (
            f"one {context:,}-token sequence needs more KV cache than the {_gib(kv_budget)} "
            f"left ({tokens:,} tokens fit)"
        )
    if seqs < req.concurrency:
        return "tight", (
            f"{seqs} sequence(s) of {context:,} tokens fit at once ({tokens:,} KV tokens); "
            f"with {req.concurrency} at full length, the rest wait"
        )
    if tokens < req.concurrency * context * HEADROOM:
        return "tight", f"fits with less than 25% to spare ({tokens:,} KV tokens)"
    return "fits", f"{seqs} sequence(s) of {context:,} tokens fit at once ({tokens:,} KV tokens)"


def _shape_note(model: ModelDetails) -> str:
    if not model.num_layers or not (model.num_kv_heads or model.kv_latent_dim):
        return "the model's shape is unknown (config.json not readable): KV cache not estimated"
    return ""


def _embedding_params(model: ModelDetails) -> int:
    per = (model.vocab_size or 0) * (model.hidden_size or 0)
    return per if model.tie_word_embeddings else 2 * per


def _variant_bytes(model: ModelDetails, bytes_per_param: float) -> int | None:
    if model.quantization or not model.parameters:
        return None
    emb = min(_embedding_params(model), model.parameters)
    return int((model.parameters - emb) * bytes_per_param + emb * 2)


def _fixes(model: ModelDetails, req: FitRequest, current: FitResult) -> tuple[FitFix, ...]:
    options: list[tuple[str, str, FitRequest]] = []
    if req.kv_cache_dtype not in _KV_FP8:
        options.append(("fp8_kv", "FP8 KV cache (halves KV memory)", _with(req, kv="fp8")))
    if current.tensor_parallel == 1 and req.gpus_available >= 2 and req.gpus:
        heads = model.num_attention_heads or 0
        if heads % 2 == 0:
            gpus = (req.gpus[0], req.gpus[0]) if len(req.gpus) < 2 else req.gpus[:2]
            options.append(("tp2", "tensor parallel over 2 GPUs", _with(req, gpus=gpus, tp=2)))
    fp8 = _variant_bytes(model, 1.0)
    if fp8 is not None and supported(req.engine, "fp8", current_cc(req))[0]:
        options.append(("fp8_variant", "an FP8 variant of this model", _with(req, w=fp8)))
    awq = _variant_bytes(model, 0.5 * 1.04)
    if awq is not None:
        options.append(("awq_variant", "an AWQ (4-bit) variant of this model", _with(req, w=awq)))
    fixes = []
    for change, text, changed in options:
        variant = _estimate(model, changed)
        if _rank(variant.verdict) > _rank(current.verdict):
            fixes.append(FitFix(change, text, variant.verdict))
            continue
        shorter = _shorter_context(variant)
        if shorter:
            text = f"{text} and a context of {shorter:,} tokens"
            fixes.append(FitFix(change, text, "fits", shorter))
    shorter = _shorter_context(current)
    if shorter:
        fixes.append(FitFix("shorter_context", f"a context of {shorter:,} tokens", "fits", shorter))
    return tuple(fixes)


def _shorter_context(current: FitResult) -> int | None:
    """The longest context (a multiple of 1024, or 256 when small) at which ``concurrency``
    sequences fit with the 25 % headroom; None when the weights do not fit at all."""
    used = current.weights_bytes_per_gpu + current.overhead_bytes_per_gpu
    if current.kv_tokens <= 0 or used > current.budget_bytes_per_gpu or not current.supported:
        return None
    per_seq = int(current.kv_tokens / (current.concurrency * HEADROOM))
    step = 1024 if per_seq >= 2048 else 256
    ctx = per_seq // step * step
    return ctx if 256 <= ctx < current.context_len else None


def current_cc(req: FitRequest) -> str:
    """The oldest compute capability of the request's GPUs ("0" without GPUs)."""
    oldest = min(req.gpus, key=lambda g: capability(g.compute_capability), default=None)
    return oldest.compute_capability if oldest is not None else "0"


def _with(
    req: FitRequest,
    *,
    kv: str | None = None,
    gpus: tuple[GPUInfo, ...] | None = None,
    tp: int | None = None,
    w: int | None = None,
) -> FitRequest:
    return dataclasses.replace(
        req,
        kv_cache_dtype=kv or req.kv_cache_dtype,
        gpus=gpus or req.gpus,
        tensor_parallel=tp or req.tensor_parallel,
        weights_bytes=w if w is not None else req.weights_bytes,
    )


def _rank(verdict: str) -> int:
    return {"wont_fit": 0, "tight": 1, "fits": 2}[verdict]


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def fit_matrix(
    model: ModelDetails,
    gpus: tuple[GPUInfo, ...] = (),
    *,
    context_len: int | None = None,
    concurrency: int = 1,
    kv_cache_dtype: str = "auto",
) -> list[FitResult]:
    """The badges of the Models page: each engine on 1 GPU and on 2 (detected GPUs, or RTX
    4090s when none is detected)."""
    pool = gpus or (RTX_4090, RTX_4090)
    sets = [pool[:1]] + ([pool[:2]] if len(pool) >= 2 else [])
    return [
        estimate(
            model,
            FitRequest(
                engine=engine,
                gpus=gpu_set,
                context_len=context_len,
                concurrency=concurrency,
                kv_cache_dtype=kv_cache_dtype,
                gpus_available=len(pool),
            ),
        )
        for engine in FIT_ENGINES
        for gpu_set in sets
    ]


CPU_RUNTIME_BYTES = 2 * GIB  # the CPU build's own memory next to weights and KV (torch, vLLM)


def cpu_estimate(
    model: ModelDetails, *, kv_cache_bytes: int, ram_bytes: int, context_len: int | None = None
) -> FitResult:
    """The CPU build: its KV cache is exactly ``kv_cache_bytes``; weights, that cache and the
    runtime live in ``ram_bytes`` of system memory (tight above 80 %)."""
    result = estimate(
        model,
        FitRequest(device="cpu", cpu_kv_cache_bytes=kv_cache_bytes, context_len=context_len),
    )
    weights = _weights(model)
    need = weights + kv_cache_bytes + CPU_RUNTIME_BYTES
    verdict, reason = result.verdict, result.reason
    if need > ram_bytes:
        verdict = "wont_fit"
        reason = (
            f"weights {_gib(weights)} + KV cache {_gib(kv_cache_bytes)} + about "
            f"{_gib(CPU_RUNTIME_BYTES)} for the engine need more than this computer's "
            f"{_gib(ram_bytes)} of memory"
        )
    elif verdict == "fits" and need > 0.8 * ram_bytes:
        verdict = "tight"
        reason = f"needs about {_gib(need)} of the {_gib(ram_bytes)} of memory"
    return dataclasses.replace(
        result,
        verdict=verdict,
        reason=reason,
        weights_bytes_per_gpu=weights,
        budget_bytes_per_gpu=ram_bytes,
    )
