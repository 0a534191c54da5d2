"""How much GPU memory an engine takes, by each engine's own rule (pure functions).

The three engines size their memory differently, and the placement planner (engines/ondemand)
must know the rule, not just the weights:

- vLLM preallocates ``gpu_memory_utilization`` of the whole card as CUDA sees it (weights,
  activations, KV cache; the rest of that budget becomes KV cache) and refuses to start unless
  that much is free ("Free memory on device ... less than desired GPU memory utilization"). It
  measures after its CUDA context and, with tensor parallel, NCCL are set up, so those come on
  top: its footprint is that fraction of the card plus them, whatever the model's size.
- SGLang measures the free memory F0 at start, loads the weights, and gives the KV pool what is
  then free minus ``(1 - mem_fraction_static) × F0``, which it keeps for activations and CUDA
  graphs: it grows into all the memory that was free at launch.
- TensorRT-LLM (PyTorch backend) loads the weights, runs a warm-up, and then gives the KV cache
  ``free_gpu_memory_fraction`` of the memory still free.

traylm's ``gpu_memory_utilization`` is passed as vLLM's ``--gpu-memory-utilization`` and
TensorRT-LLM's ``free_gpu_memory_fraction``; SGLang's ``--mem-fraction-static`` comes from the
profile's own ``mem_fraction_static`` and is left to SGLang when that is empty. Overheads
(CUDA context, activations) are estimates until measured on hardware (tests/gpu/).

vLLM's CPU build takes no GPU memory: its weights and its KV cache (exactly
``VLLM_CPU_KVCACHE_SPACE``) live in host RAM (``cpu_need``).
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
CUDA_CONTEXT_BYTES = GIB // 2
"""CUDA context and allocator slack per GPU process. PyTorch's maintainers put the context at
"~700+ MB" depending on the CUDA version and device (discuss.pytorch.org/t/81330); CUDA's lazy
module loading, on by default in PyTorch's CUDA 12/13 builds, brings it to ~0.3-0.5 GiB.
tests/gpu/truth.py measures it on a real card."""
NCCL_BYTES = 3 * GIB // 10
"""NCCL's buffers and kernels per GPU of a tensor- (or data-) parallel engine (estimate: its
channels' buffers of NCCL_BUFFSIZE, 4 MiB each, and its CUDA module)."""
ACTIVATION_BYTES = GIB
"""Activations of the warm-up pass and CUDA graphs per GPU (estimate for 7-70B models)."""
SGLANG_DEFAULT_FRACTION = 0.83
"""What SGLang 0.5.23 picks for ``--mem-fraction-static`` on a 24 GB card when it is not given
(it keeps ~4 GiB of the free memory for activations and CUDA graphs)."""
CPU_RUNTIME_BYTES = GIB
"""Host RAM of a CPU engine's processes besides weights and KV cache: Python, torch, the API
server (estimate)."""
SLEEP_RESIDUAL_BYTES = GIB
"""What a vLLM engine still holds per GPU at sleep level 1: the CUDA context and graphs
(estimate; tests/gpu/sleep_vs_cold.py measures it on a real card)."""


@dataclass(frozen=True)
class MemoryNeed:
    """What one engine takes on each of its GPUs."""

    hold_bytes: int
    """Held per GPU once it is loaded (what the planner books for it)."""
    free_needed_bytes: int
    """Free memory per GPU it needs at launch to start at all."""
    rule: str
    """The engine's rule in words, with the numbers (shown when a model does not fit)."""
    sleep_residual_bytes: int | None = None
    """Still held per GPU while asleep (vLLM sleep mode); None when it cannot sleep."""


def runtime_bytes(world_size: int) -> int:
    """What an engine process holds per GPU outside its own budget: its CUDA context, and
    NCCL's buffers when it spans GPUs."""
    return CUDA_CONTEXT_BYTES + (NCCL_BYTES if world_size > 1 else 0)


def vllm_need(
    *,
    utilization: float,
    total_bytes: int,
    weights_bytes: int | None,
    sleep_mode: bool,
    world_size: int = 1,
) -> MemoryNeed:
    """vLLM: ``utilization`` × the card as CUDA sees it (``total_bytes``: NVML's total less
    the driver's reserve), plus its CUDA context and NCCL, which must be free at launch.
    ``weights_bytes`` is per GPU (after tensor parallel); it only tells whether the budget can
    hold the weights."""
    budget = int(total_bytes * utilization)
    floor = (weights_bytes or 0) + ACTIVATION_BYTES
    extra = runtime_bytes(world_size)
    nccl = " and NCCL" if world_size > 1 else ""
    rule = (
        f"vLLM preallocates gpu_memory_utilization {utilization:.2f} of the card as CUDA sees "
        f"it: {_gib(budget)} of {_gib(total_bytes)}, plus {_gib(extra)} for its CUDA context"
        f"{nccl}, which must be free when it starts"
    )
    if weights_bytes and floor > budget:
        rule += f" (too little for its {_gib(weights_bytes)} of weights per GPU)"
    return MemoryNeed(
        hold_bytes=budget + extra,
        free_needed_bytes=max(budget, floor) + extra,
        rule=rule,
        sleep_residual_bytes=SLEEP_RESIDUAL_BYTES if sleep_mode else None,
    )


def sglang_need(
    *, fraction: float | None, free_bytes: int, weights_bytes: int | None, world_size: int = 1
) -> MemoryNeed:
    """SGLang: grows into what is free at launch; the KV pool is ``fraction`` × free minus the
    weights, so it needs at least (weights + context) / fraction free. ``fraction`` None:
    SGLang's own choice (``SGLANG_DEFAULT_FRACTION``)."""
    weights = weights_bytes or 0
    share = SGLANG_DEFAULT_FRACTION if fraction is None else fraction
    floor = int((weights + runtime_bytes(world_size)) / max(share, 0.05)) + 1
    whose = "SGLang's own" if fraction is None else "the profile's"
    rule = (
        f"SGLang takes the memory free at launch: {whose} mem_fraction_static {share:.2f} of "
        f"it for weights and KV cache, the rest for activations (needs over {_gib(floor)} free)"
    )
    return MemoryNeed(hold_bytes=max(free_bytes, floor), free_needed_bytes=floor, rule=rule)


def trtllm_need(
    *, fraction: float, free_bytes: int, weights_bytes: int | None, world_size: int = 1
) -> MemoryNeed:
    """TensorRT-LLM: weights + warm-up activations, then ``fraction`` of what is left as KV
    cache. Without the weights' size it books ``fraction`` of everything free."""
    base = (weights_bytes or 0) + runtime_bytes(world_size) + ACTIVATION_BYTES
    left = max(0, free_bytes - base)
    hold = base + int(left * fraction)
    rule = (
        f"TensorRT-LLM loads the weights ({_gib(weights_bytes or 0)} per GPU) and activations, "
        f"then takes free_gpu_memory_fraction {fraction:.2f} of the rest as KV cache"
    )
    return MemoryNeed(hold_bytes=hold, free_needed_bytes=base + GIB // 4, rule=rule)


def cpu_need(*, weights_bytes: int | None, kv_cache_bytes: int) -> MemoryNeed:
    """vLLM's CPU build, in host RAM: the weights, exactly ``VLLM_CPU_KVCACHE_SPACE`` of KV
    cache, and the Python/torch runtime around them."""
    weights = weights_bytes or 0
    hold = weights + kv_cache_bytes + CPU_RUNTIME_BYTES
    known = f"{_gib(weights)} of weights" if weights_bytes else "weights of unknown size"
    rule = (
        f"vLLM on the CPU holds its {known}, cpu_kv_cache_gib {_gib(kv_cache_bytes)} of KV "
        f"cache and {_gib(CPU_RUNTIME_BYTES)} of runtime in host RAM"
    )
    return MemoryNeed(hold_bytes=hold, free_needed_bytes=hold, rule=rule)


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"
