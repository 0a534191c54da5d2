"""TensorRT-LLM: profile → `trtllm-serve` argv, env and options YAML; its failures → advice.

Two modes (``Profile.mode``):

- ``serve`` (default): the PyTorch backend runs the Hugging Face checkpoint directly,
  ``trtllm-serve MODEL --backend pytorch ...``; nothing is built.
- ``build``: a TensorRT engine is built first (engines/trt/build.py, cached by engines/trt/cache.py)
  and served with ``trtllm-serve ENGINE_DIR --backend tensorrt --tokenizer MODEL_DIR``. The daemon
  passes the engine folder as ``model``; ``profile.model`` is then the local checkpoint folder.

trtllm-serve is a click command: flags are spelled with underscores (``--tp_size``) and click does
not treat '-' and '_' alike. Settings without a flag go into the generated YAML, passed with
``--extra_llm_api_options`` (every release has it; its ``--config`` alias is newer); for two
GeForce cards without P2P it sets NCCL all-reduce. The log texts matched below are the ones
TensorRT-LLM prints (its source and TensorRT(-LLM) issue threads).
"""

from __future__ import annotations

import json
import re
from typing import Any

from engines.config.profiles import Profile
from engines.errors import ConfigError
from engines.events.core import Diagnosis
from engines.runtime.adapters import cuda_init
from engines.runtime.adapters.base import (
    PORT_IN_USE,
    RUN_DIR,
    EngineRuntime,
    LaunchSpec,
    LogRule,
    first_diagnosis,
    tp_env,
    weights_per_gpu,
)
from engines.runtime.adapters.memory import MemoryNeed, trtllm_need

CONFIG_NAME = "trtllm-serve.yaml"
"""The generated --extra_llm_api_options file (JSON text, which YAML loaders read as YAML)."""

QUANT_RECIPES = ("fp8", "int4_awq", "w4a8_awq", "int8_wo", "int4_wo", "nvfp4")
"""ModelOpt recipes (quantize.py --qformat) a build-mode profile may name."""

RESERVED_FLAGS = frozenset(
    {"--config", "--extra_llm_api_options", "--host", "--port", "--backend", "--tokenizer"}
)

REBUILD = (
    "Rebuild it: `traylm engines cache prune --stale` (or `traylm engines cache rm ID`), then "
    "start the profile again; traylm builds a fresh engine for the installed versions."
)

KV_TOO_SMALL = (
    "Lower max_model_len, raise gpu_memory_utilization (TensorRT-LLM's free-memory fraction for "
    "the KV cache), or use kv_cache_dtype = 'fp8'."
)
NO_FP8_ATTENTION = (
    "Set kv_cache_dtype = 'auto': TensorRT-LLM turns FP8 context attention on when paged context "
    "attention meets an FP8 KV cache, and traylm then builds with --use_fp8_context_fmha "
    "disable. FP8 weights (quant_recipe = 'fp8') still work."
)


def _suggest_window(m: re.Match[str]) -> dict[str, str]:
    return {"max_model_len": m.group("window")}


RULES: tuple[LogRule, ...] = (
    *cuda_init.RULES,
    LogRule(
        "fp8_unsupported",
        re.compile(r"Networks with FP8 precision require hardware with FP8 support"),
        "FP8 is not supported by this GPU",
        "FP8 needs an Ada (RTX 40xx, sm_89), Hopper or newer GPU. On Ampere (RTX 30xx, A100) use "
        "quant_recipe = 'int4_awq' (AWQ) or 'int8_wo' (INT8 weight-only) and kv_cache_dtype = "
        "'auto'.",
    ),
    LogRule(
        "fp8_attention_unsupported",
        re.compile(r"FP8 FMHA cannot be enabled because Context FMHA is not supported"),
        "FP8 context attention needs fused context attention (FMHA), which this model cannot use",
        NO_FP8_ATTENTION,
    ),
    LogRule(
        "fp8_attention_unsupported",
        re.compile(
            r"FP8 FMHA cannot be enabled except on Ada or Hopper Arch|"
            r"FP8 FMHA can only be enabled on sm_89"
        ),
        "This TensorRT-LLM version runs FP8 context attention on Ada and Hopper GPUs only",
        NO_FP8_ATTENTION,
    ),
    LogRule(
        "out_of_memory",
        re.compile(
            r"Error Code 2: OutOfMemory|CUDA out of memory|torch\.OutOfMemoryError|"
            r"CUDA runtime error in .*cudaMalloc\w*\(.*\): out of memory|"
            r"Requested amount of GPU memory \(\d+ bytes\) could not be allocated"
        ),
        "Ran out of GPU memory",
        "Lower max_batch_size and max_num_batched_tokens (the engine sizes its activation "
        "buffers from them), lower max_model_len or gpu_memory_utilization, use an FP8 KV cache "
        "(kv_cache_dtype = 'fp8') or a 4-bit recipe (quant_recipe = 'int4_awq'), or spread the "
        "model with tensor_parallel_size = 2.",
    ),
    LogRule(
        "peer_access_unsupported",
        re.compile(
            r"peer access is not supported between these two devices|"
            r"cudaErrorPeerAccessUnsupported"
        ),
        "The GPUs cannot access each other's memory (no peer-to-peer)",
        "Set p2p = false in the profile: traylm then sets NCCL_P2P_DISABLE=1 and "
        "allreduce_strategy: NCCL, which stock-driver GeForce cards need. Only patched drivers "
        "give P2P (check `nvidia-smi topo -p2p rw`); if TP still stalls, look at IOMMU/ACS in the "
        "BIOS.",
    ),
    LogRule(
        "engine_version_mismatch",
        re.compile(
            r"The engine plan file is not compatible with this version of TensorRT, "
            r"expecting library version (?P<want>[\d.]+) got (?P<have>[\d.]+)"
        ),
        "The engine was built with another TensorRT version ({have}, this one is {want})",
        REBUILD,
    ),
    LogRule(
        "engine_version_mismatch",
        re.compile(
            r"The engine plan file is generated on an incompatible device, expecting compute "
            r"(?P<want>[\d.]+) got compute (?P<have>[\d.]+)"
        ),
        "The engine was built for compute capability {have}, this GPU is {want}",
        REBUILD,
    ),
    LogRule(
        "architecture_unsupported",
        re.compile(r"Unsupported model architecture: (?P<arch>\w+)"),
        "TensorRT-LLM cannot build the {arch} architecture",
        "Use mode = 'serve' (the PyTorch backend runs many more architectures without a build) "
        "or engine = 'vllm'.",
    ),
    LogRule(
        "mpi_missing",
        re.compile(
            r"libmpi\.so[.\d]*: cannot open shared object file|"
            r"mpi4py\S* .*(?:ImportError|not found)|MPI_Init\w* (?:failed|returned an error)"
        ),
        "OpenMPI is missing (TensorRT-LLM runs tensor-parallel ranks as MPI processes)",
        "Install it: `sudo apt install openmpi-bin libopenmpi-dev` (Debian/Ubuntu), then start "
        "again. `traylm engines doctor` checks for it.",
    ),
    LogRule(
        "kv_cache_too_small",
        re.compile(r"Attention window too large to fit even a single sequence in the KV cache"),
        "The KV cache cannot hold one sequence of the context length",
        KV_TOO_SMALL,
    ),
    LogRule(
        "kv_cache_too_small",
        re.compile(r"maxAttentionWindowVec too large to fit at least one sequence in kvCache"),
        "The KV cache cannot hold one sequence of the context length: TensorRT-LLM shortened the "
        "attention window",
        KV_TOO_SMALL,
        severity="warning",  # it runs on with a shorter window; the next line gives the length
    ),
    LogRule(
        "context_shortened",
        re.compile(r"maxSequenceLen is reduced to maxAttentionWindow: (?P<window>\d+)"),
        "Requests are limited to {window} tokens (what the KV cache holds for one sequence)",
        "Set max_model_len = {max_model_len} to make that limit explicit, or free memory for the "
        "KV cache: " + KV_TOO_SMALL,
        severity="warning",
        suggest=_suggest_window,
    ),
    LogRule(
        "model_not_found",
        re.compile(
            r"Repository Not Found|RepositoryNotFoundError|GatedRepoError|"
            r"is not a local folder and is not a valid model identifier"
        ),
        "The model could not be found or accessed",
        "Download it first with `traylm models pull REPO` or point the profile at a local "
        "folder; log in to Hugging Face for gated models.",
    ),
    LogRule(
        "nccl_failure",
        re.compile(r"NCCL error|ncclUnhandledCudaError|ncclSystemError|NCCL WARN .*timeout"),
        "Tensor-parallel communication (NCCL) failed",
        "Keep p2p = false on GeForce cards (traylm sets NCCL_P2P_DISABLE=1 and NCCL all-reduce); "
        "if it still stalls, disable IOMMU or enable ACS override in the BIOS.",
    ),
    LogRule(
        "port_in_use",
        re.compile(r"Failed to bind socket to \S+: \[Errno 98\]"),
        "The engine's port is already taken",
        PORT_IN_USE.advice,
    ),
    PORT_IN_USE,
    LogRule(
        "build_failed",
        re.compile(r"Engine building failed, please check (?:the )?error log"),
        "trtllm-build failed",
        "The lines above in the engine log show why; common causes have their own advice "
        "(memory, FP8 support, architecture).",
        severity="warning",  # the summary line after the cause: it must not replace it
    ),
)


class TRTLLMAdapter:
    """`trtllm-serve` for the PyTorch backend (serve) and for built engines (build)."""

    name = "trtllm"

    def launch(
        self, profile: Profile, *, runtime: EngineRuntime, port: int, model: str
    ) -> LaunchSpec:
        check_profile(profile)
        backend = "tensorrt" if profile.mode == "build" else "pytorch"
        flags = self._flags(profile, port=port, backend=backend, model=model)
        runtime.flags.check(flags)  # our own flags too: a renamed flag fails before launch
        runtime.flags.check(profile.extra_flags)
        return LaunchSpec(
            argv=(str(runtime.bin_dir / "trtllm-serve"), model, *flags, *profile.extra_flags),
            env=self._env(profile),
            served_names=profile.served_names,
            metrics_path="/prometheus/metrics" if backend == "pytorch" else None,
            files={CONFIG_NAME: json.dumps(serve_config(profile, backend), indent=1) + "\n"},
        )

    def diagnose(self, line: str) -> Diagnosis | None:
        return first_diagnosis(RULES, line)

    def memory_need(
        self, profile: Profile, *, total_bytes: int, free_bytes: int, weights_bytes: int | None
    ) -> MemoryNeed:
        return trtllm_need(
            fraction=profile.gpu_memory_utilization,
            free_bytes=free_bytes,
            weights_bytes=weights_per_gpu(profile, weights_bytes),
            world_size=profile.gpu_count,
        )

    @staticmethod
    def _flags(profile: Profile, *, port: int, backend: str, model: str) -> list[str]:
        argv = ["--backend", backend, "--host", "127.0.0.1", "--port", str(port)]
        if backend == "tensorrt":
            argv += ["--tokenizer", profile.model]
        argv += ["--log_level", "info"]
        if profile.tensor_parallel_size > 1:
            argv += ["--tp_size", str(profile.tensor_parallel_size)]
        if profile.pipeline_parallel_size > 1:
            argv += ["--pp_size", str(profile.pipeline_parallel_size)]
        batch = profile.max_batch_size or profile.max_num_seqs
        if batch:
            argv += ["--max_batch_size", str(batch)]
        if profile.max_num_batched_tokens:
            argv += ["--max_num_tokens", str(profile.max_num_batched_tokens)]
        if profile.max_model_len:
            argv += ["--max_seq_len", str(profile.max_model_len)]
        argv += ["--kv_cache_free_gpu_memory_fraction", f"{profile.gpu_memory_utilization:g}"]
        if profile.trust_remote_code:
            argv.append("--trust_remote_code")
        if profile.revision and backend == "pytorch" and not model.startswith("/"):
            argv += ["--revision", profile.revision]
        argv += ["--extra_llm_api_options", f"{RUN_DIR}/{CONFIG_NAME}"]
        return argv

    @staticmethod
    def _env(profile: Profile) -> dict[str, str]:
        env = tp_env(profile)
        env["PYTHONUNBUFFERED"] = "1"
        env["TRTLLM_NO_USAGE_STATS"] = "1"
        env.update(profile.env)
        return env


def serve_config(profile: Profile, backend: str) -> dict[str, Any]:
    """The --extra_llm_api_options YAML: what trtllm-serve has no flag for."""
    kv: dict[str, Any] = {"free_gpu_memory_fraction": profile.gpu_memory_utilization}
    config: dict[str, Any] = {"kv_cache_config": kv}
    if backend == "pytorch":
        if profile.kv_cache_dtype != "auto":
            kv["dtype"] = "fp8"
        if profile.dtype != "auto":
            config["dtype"] = profile.dtype
        if profile.world_size > 1 and not profile.p2p:
            config["allreduce_strategy"] = "NCCL"  # custom all-reduce needs P2P
        config["enable_iter_perf_stats"] = True
        config["return_perf_metrics"] = True  # Prometheus at /prometheus/metrics
    return config


def check_profile(profile: Profile) -> None:
    """Refuse what TensorRT-LLM cannot do, whatever the GPU (GPU checks are in engines/trt)."""
    if profile.device == "cpu":
        raise ConfigError(
            "TensorRT-LLM runs on NVIDIA GPUs only; set device = 'cuda' (or 'auto'), or use "
            "engine = 'vllm' with device = 'cpu'"
        )
    if profile.quant_recipe and profile.mode != "build":
        raise ConfigError(
            f"quant_recipe = {profile.quant_recipe!r} needs mode = 'build' (ModelOpt quantizes "
            "while building a TensorRT engine); in mode 'serve' use a pre-quantized checkpoint"
        )
    if profile.quant_recipe and profile.quant_recipe not in QUANT_RECIPES:
        raise ConfigError(
            f"quant_recipe {profile.quant_recipe!r} is not a ModelOpt recipe traylm builds; "
            f"valid: {', '.join(QUANT_RECIPES)}"
        )
    taken = RESERVED_FLAGS.intersection(f.split("=", 1)[0] for f in profile.extra_flags)
    if taken:
        raise ConfigError(
            f"extra_flags may not set {', '.join(sorted(taken))}: traylm sets them (the YAML it "
            "generates holds the settings from the profile)"
        )
