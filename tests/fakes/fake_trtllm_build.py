"""FAKE trtllm-build (tensorrt_llm/commands/build.py).

Same flags and plugin choices as the real command (argparse, from
resources/flags/trtllm-build-1.2.json): `--gpt_attention_plugin float` or `--usage_mode` exit 2
with argparse's usage error. It reads a TensorRT-LLM checkpoint (config.json + one
rank<N>.safetensors per rank), refuses what the real builder refuses on the fake GPU
(FAKE_GPU_CC): an unknown architecture, FP8 below Ada, NVFP4 below Blackwell — with the real log
lines. FP8 context attention is resolved as tensorrt_llm/builder.py does (paged context FMHA on:
FP8 KV cache → on, without it → off; below sm_89 → off), then checked as the attention plugin
does (only sm_89/sm_90; never when the model cannot use context FMHA, knob --no-context-fmha). It
writes config.json (with "version" and the resolved plugin_config) and one rank<N>.engine per
rank. See fake_trt_tools.py for the knobs (--oom, --seconds, ...).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakes import fake_trt_tools as t

MODEL_MAP = {
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "MixtralForCausalLM",
    "QWenForCausalLM",
    "Qwen2ForCausalLM",
    "GemmaForCausalLM",
    "Gemma2ForCausalLM",
    "Phi3ForCausalLM",
}
FP8_ALGOS = {"FP8", "W4A8_AWQ", "FP8_PER_CHANNEL_PER_TOKEN"}
FP8_FMHA_ALGOS = {"FP8", "W4A8_AWQ", "NVFP4"}
FP8_FMHA_ARCHS = {(8, 9), (9, 0)}


def fail(line: str) -> None:
    t.say(f"{t.stamp()} [TRT-LLM] [E] {line}")
    t.say(f"{t.stamp()} [TRT-LLM] [E] Engine building failed, please check the error log.")
    t.say("AssertionError: Engine building failed, please check error log.")
    sys.exit(1)


def warn(line: str) -> None:
    t.say(f"{t.stamp()} [TRT-LLM] [W] {line}")


def plugin_assertion(info: str) -> None:
    t.say(
        "[TensorRT-LLM][ERROR] tensorrt_llm::common::TllmException: [TensorRT-LLM][ERROR] "
        f"Assertion failed: {info} (/src/tensorrt_llm/cpp/tensorrt_llm/plugins/"
        "gptAttentionCommon/gptAttentionCommon.cpp:300)"
    )
    fail("Build failed for rank 0")


def resolve_fmha(args: Any, quant: dict[str, Any], cc: tuple[int, int]) -> dict[str, bool]:
    """The builder's rules for FP8 and paged context FMHA, with its warnings (defaults: both
    enabled, as PluginConfig has them)."""
    paged = (args.use_paged_context_fmha or "enable") == "enable"
    fp8_fmha = (args.use_fp8_context_fmha or "enable") == "enable"
    fp8_kv = quant.get("kv_cache_quant_algo") == "FP8"
    if (args.context_fmha or "enable") == "disable":
        warn("Context FMHA is disabled, FP8 Context FMHA and Paged Context FMHA are disabled.")
        return {"use_fp8_context_fmha": False, "use_paged_context_fmha": False}
    if quant.get("quant_algo") not in FP8_FMHA_ALGOS or cc < (8, 9):
        if quant.get("quant_algo") not in FP8_FMHA_ALGOS and fp8_fmha:
            warn(
                "FP8 Context FMHA is disabled because it must be used together with the fp8 "
                "quantization workflow."
            )
        elif fp8_fmha:
            warn(
                "FP8 context FMHA is disabled because it is only supported on Ada and Hopper Arch."
            )
        fp8_fmha = False
        if paged and fp8_kv:
            paged = False
            warn("FP8 Paged Context FMHA is disabled because FP8 context FMHA is disabled.")
    elif paged and fp8_fmha and not fp8_kv:
        fp8_fmha = False
        warn(
            "FP8 Paged Context FMHA is disabled because it must be used together with fp8 KV Cache."
        )
    elif paged and fp8_kv and not fp8_fmha:
        fp8_fmha = True
        warn("FP8 Context FMHA is enabled to support FP8 Paged Context FMHA.")
    return {"use_fp8_context_fmha": fp8_fmha, "use_paged_context_fmha": paged}


def main() -> None:
    args = t.parser_from_allow_list("trtllm-build-1.2.json", "trtllm-build").parse_args()
    k = t.knobs("build")
    t.banner()
    t.start(k)
    ckpt = Path(args.checkpoint_dir or ".")
    config = t.read_json(ckpt / "config.json")
    arch = str(config.get("architecture"))
    if arch not in MODEL_MAP:
        t.say("Traceback (most recent call last):")
        t.say(f"AssertionError: Unsupported model architecture: {arch}")
        sys.exit(1)
    mapping = dict(config.get("mapping", {}))  # type: ignore[call-overload]
    world = int(mapping.get("world_size", 1))
    missing = [r for r in range(world) if not (ckpt / f"rank{r}.safetensors").exists()]
    if missing:
        fail(f"checkpoint {ckpt} has no rank{missing[0]}.safetensors for world size {world}")
    quant = dict(config.get("quantization") or {})  # type: ignore[call-overload]
    fp8 = quant.get("quant_algo") in FP8_ALGOS or quant.get("kv_cache_quant_algo") == "FP8"
    cc = t.gpu_cc()
    for name in ("gpt_attention_plugin", "gemm_plugin", "nccl_plugin"):
        t.say(f"{t.stamp()} [TRT-LLM] [I] Set {name} to {getattr(args, name) or 'auto'}.")
    if quant.get("quant_algo") == "NVFP4" and cc < (10, 0):
        fail("NVFP4 quantization requires a Blackwell GPU (SM100 or newer)")
    if fp8 and cc < (8, 9):
        t.say(
            f"{t.stamp()} [TRT] [E] 9: [standardEngineBuilder.cpp::buildEngine::2266] Error Code "
            "9: Internal Error (Networks with FP8 precision require hardware with FP8 support.)"
        )
        fail("Build failed for rank 0")
    plugins = resolve_fmha(args, quant, cc)
    if plugins["use_fp8_context_fmha"]:
        if k.no_context_fmha:
            plugin_assertion("FP8 FMHA cannot be enabled because Context FMHA is not supported.")
        if cc not in FP8_FMHA_ARCHS:
            plugin_assertion("FP8 FMHA cannot be enabled except on Ada or Hopper Arch.")
    size = sum(p.stat().st_size for p in ckpt.glob("rank*.safetensors"))
    workers = max(1, min(int(args.workers or 1), world))
    lines = []
    for rank in range(world):
        lines += [
            f"{t.stamp()} [TRT-LLM] [I] Build TensorRT engine Unnamed Network {rank}",
            f"{t.stamp()} [TRT] [I] [MemUsageChange] Init builder kernel library: CPU +1973, "
            "GPU +350, now: CPU 2339, GPU 767 (MiB)",
            f"{t.stamp()} [TRT] [I] Engine generation completed in 1.1 seconds.",
        ]
    t.work(t.seconds_for(size, per_gib=60.0) * world / workers, lines, k)
    out = Path(args.output_dir or "engine_outputs")
    out.mkdir(parents=True, exist_ok=True)
    engine_config = {
        "version": t.version(),
        "pretrained_config": config,
        "build_config": {
            "max_batch_size": int(args.max_batch_size or 2048),
            "max_input_len": int(args.max_input_len or 1024),
            "max_seq_len": int(args.max_seq_len or 2048),
            "max_num_tokens": int(args.max_num_tokens or 8192),
            "plugin_config": {
                "gemm_plugin": args.gemm_plugin,
                "dtype": config.get("dtype"),
                **plugins,
            },
        },
        "fake_build": {
            "compute_capability": ".".join(map(str, cc)),
            "tensorrt": t.tensorrt_version(),
        },
    }
    (out / "config.json").write_text(json.dumps(engine_config, indent=1))
    for rank in range(world):
        part = ckpt / f"rank{rank}.safetensors"
        (out / f"rank{rank}.engine").write_bytes(b"\1" * part.stat().st_size)
    t.say(f"{t.stamp()} [TRT-LLM] [I] Total time of building all engines: 00:00:01")


if __name__ == "__main__":
    main()
