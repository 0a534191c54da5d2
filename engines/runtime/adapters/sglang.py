"""SGLang: profile → `python -m sglang.launch_server` argv/env; its failures → advice.

SGLang flags are the ServerArgs field names with '-' (``--mem-fraction-static``); it runs in its
own venv (its torch pins differ from vLLM's). On two GeForce cards without P2P, custom
all-reduce must be off (``--disable-custom-all-reduce``) or tensor parallel fails with "peer
access is not supported between these two devices". Readiness: ``/health`` and ``/v1/models``;
Prometheus metrics at ``/metrics`` with ``--enable-metrics``.

``--mem-fraction-static`` is passed only when the profile sets ``mem_fraction_static``: left
out, SGLang picks it for the card (about 0.83 on a 24 GB card in 0.5.23), which keeps ~4 GiB
for activations and CUDA graphs. vLLM's ``gpu_memory_utilization`` (0.90-0.95) is a share of
the whole card, not of what is free, and would leave SGLang too little.
"""

from __future__ import annotations

import re

from engines.config.profiles import Profile
from engines.errors import ConfigError
from engines.events.core import Diagnosis
from engines.runtime.adapters import cuda_init
from engines.runtime.adapters.base import (
    PORT_IN_USE,
    EngineRuntime,
    LaunchSpec,
    LogRule,
    first_diagnosis,
    tp_env,
    weights_per_gpu,
)
from engines.runtime.adapters.memory import MemoryNeed, sglang_need

KV_DTYPES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}


def _suggest_context(m: re.Match[str]) -> dict[str, str]:
    return {"max_model_len": m.group("derived")}


RULES: tuple[LogRule, ...] = (
    *cuda_init.RULES,
    LogRule(
        "no_cache_memory",
        re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
        "No memory left for the KV cache after loading the weights",
        "Raise mem_fraction_static (SGLang's --mem-fraction-static), use a smaller or "
        "quantized (AWQ/GPTQ/FP8) model, or tensor_parallel_size = 2.",
    ),
    LogRule(
        "weights_dont_fit",
        re.compile(r"CUDA out of memory|torch\.OutOfMemoryError"),
        "Ran out of GPU memory",
        "Lower mem_fraction_static (SGLang needs room outside its static pool for "
        "activations and CUDA graphs), lower max_num_batched_tokens (chunked prefill size), use "
        "a quantized model, or tensor_parallel_size = 2.",
    ),
    LogRule(
        "peer_access_unsupported",
        re.compile(r"peer access is not supported between these two devices"),
        "The GPUs cannot access each other's memory (no peer-to-peer)",
        "Keep p2p = false (traylm then passes --disable-custom-all-reduce and "
        "NCCL_P2P_DISABLE=1); or add '--enable-p2p-check' to extra_flags.",
    ),
    LogRule(
        "model_len_above_limit",
        re.compile(
            r"User-specified context_length \((?P<asked>\d+)\) is greater than the derived "
            r"context_length \((?P<derived>\d+)\)"
        ),
        "max_model_len {asked} is above the model's limit of {derived} tokens",
        "Set max_model_len = {max_model_len} (the model was trained for that context).",
        suggest=_suggest_context,
    ),
    LogRule(
        "architecture_unsupported",
        re.compile(r"Model architectures? \[?'?(?P<arch>\w+)'?\]? (?:is|are) not supported"),
        "SGLang does not support the {arch} architecture",
        "Upgrade the engine (`traylm engines install sglang --version NEWER`) or use vLLM.",
    ),
    LogRule(
        "model_not_found",
        re.compile(
            r"Repository Not Found|RepositoryNotFoundError|GatedRepoError|"
            r"is not a local folder and is not a valid model identifier"
        ),
        "The model could not be found or accessed",
        "Download it first with `traylm models pull REPO`, or log in to Hugging Face for gated "
        "models.",
    ),
    LogRule(
        "nccl_failure",
        re.compile(r"NCCL error|ncclUnhandledCudaError|ncclSystemError|NCCL WARN .*timeout"),
        "Tensor-parallel communication (NCCL) failed",
        "Keep p2p = false on GeForce cards; if it still stalls, disable IOMMU or enable ACS "
        "override in the BIOS.",
    ),
    PORT_IN_USE,
)


class SGLangAdapter:
    """SGLang's OpenAI-compatible server (CUDA)."""

    name = "sglang"

    def launch(
        self, profile: Profile, *, runtime: EngineRuntime, port: int, model: str
    ) -> LaunchSpec:
        if profile.device == "cpu":
            raise ConfigError(
                "traylm runs SGLang on NVIDIA GPUs only; set device = 'cuda', or use "
                "engine = 'vllm' with device = 'cpu'"
            )
        argv = self._flags(profile, port=port, model=model)
        runtime.flags.check(argv)
        runtime.flags.check(profile.extra_flags)
        return LaunchSpec(
            argv=(str(runtime.python), "-m", "sglang.launch_server", *argv, *profile.extra_flags),
            env={**tp_env(profile), "PYTHONUNBUFFERED": "1", **profile.env},
            served_names=profile.served_names,
        )

    def diagnose(self, line: str) -> Diagnosis | None:
        return first_diagnosis(RULES, line)

    def memory_need(
        self, profile: Profile, *, total_bytes: int, free_bytes: int, weights_bytes: int | None
    ) -> MemoryNeed:
        return sglang_need(
            fraction=profile.mem_fraction_static,
            free_bytes=free_bytes,
            weights_bytes=weights_per_gpu(profile, weights_bytes),
            world_size=profile.gpu_count,
        )

    @staticmethod
    def _flags(profile: Profile, *, port: int, model: str) -> list[str]:
        argv = [
            "--model-path",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            profile.effective_served_name,
            "--enable-metrics",
        ]
        if profile.mem_fraction_static is not None:
            argv += ["--mem-fraction-static", f"{profile.mem_fraction_static:g}"]
        if profile.dtype != "auto":
            argv += ["--dtype", profile.dtype]
        if profile.revision and not model.startswith("/"):
            argv += ["--revision", profile.revision]
        if profile.max_model_len:
            argv += ["--context-length", str(profile.max_model_len)]
        if profile.max_num_seqs:
            argv += ["--max-running-requests", str(profile.max_num_seqs)]
        if profile.max_num_batched_tokens:
            argv += ["--chunked-prefill-size", str(profile.max_num_batched_tokens)]
        if profile.quantization:
            argv += ["--quantization", profile.quantization]
        if profile.kv_cache_dtype != "auto":
            argv += ["--kv-cache-dtype", KV_DTYPES[profile.kv_cache_dtype]]
        if profile.trust_remote_code:
            argv.append("--trust-remote-code")
        if profile.tensor_parallel_size > 1:
            argv += ["--tp-size", str(profile.tensor_parallel_size)]
        if profile.pipeline_parallel_size > 1:
            argv += ["--pp-size", str(profile.pipeline_parallel_size)]
        if profile.world_size > 1 and not profile.p2p:
            argv.append("--disable-custom-all-reduce")
        return argv
