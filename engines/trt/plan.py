"""The steps of a TensorRT engine build, as pure functions of a profile and facts.

1. make a TensorRT-LLM checkpoint (TP/PP are fixed here):
   ModelOpt ``quantize.py --qformat RECIPE`` (also for an FP8 KV cache without weight
   quantization: ``--qformat full_prec --kv_cache_dtype fp8``), or the model family's
   ``convert_checkpoint.py``;
2. ``trtllm-build`` the checkpoint into ``config.json`` + ``rank<N>.engine``.

``build_arguments`` lists every argument that shapes the engine (the cache key holds them all);
``plan_build`` turns them into argv, each checked against its tool's flag allow-list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from engines.config.profiles import Profile
from engines.errors import ConfigError
from engines.events.gpu import GPUInfo
from engines.gpu.inventory import capability
from engines.runtime.adapters.base import FlagSet
from engines.trt.model import ModelFacts

CONVERT_FAMILIES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "MixtralForCausalLM": "llama",
}
"""Architectures whose convert_checkpoint.py traylm drives (examples/models/core/<family>/)."""

QUANTIZE_ARCHITECTURES = frozenset(
    {
        *CONVERT_FAMILIES,
        "Qwen2ForCausalLM",
        "GemmaForCausalLM",
        "Gemma2ForCausalLM",
        "Phi3ForCausalLM",
    }
)
"""Architectures ModelOpt's quantize.py exports to a TensorRT-LLM checkpoint."""

QUANTIZE_SCRIPT = Path("quantization") / "quantize.py"
DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_MAX_NUM_TOKENS = 8192
DEFAULT_MAX_SEQ_LEN = 4096
CALIB_SIZE = 512
CALIB_DATASET = "cnn_dailymail"
"""quantize.py's default --calib_dataset: a Hub dataset (abisee/cnn_dailymail), downloaded."""
FP8_ATTENTION_RECIPES = frozenset({"fp8", "w4a8_awq", "nvfp4"})
"""Recipes whose checkpoint TensorRT-LLM's builder lets run context attention in FP8."""
FP8_ATTENTION_MIN_CC = (8, 9)


@dataclass(frozen=True)
class BuildTools:
    """The installed TensorRT-LLM env's build tools and their flag allow-lists."""

    python: Path
    trtllm_build: Path
    examples_dir: Path
    flags: Mapping[str, FlagSet]
    """"quantize", "convert-llama" (convert-<family>), "build"."""


@dataclass(frozen=True)
class BuildStep:
    name: str  # "quantize" | "convert" | "build"
    argv: tuple[str, ...]


@dataclass(frozen=True)
class BuildPlan:
    steps: tuple[BuildStep, ...]
    checkpoint_dir: Path
    engine_dir: Path


def checkpoint_tool(profile: Profile, facts: ModelFacts) -> str:
    """ "quantize" or "convert-<family>"; refuses an architecture neither path can take."""
    if profile.quant_recipe or profile.kv_cache_dtype != "auto":
        if facts.architecture not in QUANTIZE_ARCHITECTURES:
            raise ConfigError(
                f"TensorRT-LLM's engine build cannot quantize {facts.architecture}; it "
                f"quantizes {', '.join(sorted(QUANTIZE_ARCHITECTURES))}. Use mode = 'serve' "
                "(the PyTorch backend needs no build) or engine = 'vllm'"
            )
        return "quantize"
    family = CONVERT_FAMILIES.get(facts.architecture)
    if family is None:
        hint = (
            " (set quant_recipe, e.g. 'fp8' or 'int4_awq', to build it through ModelOpt)"
            if facts.architecture in QUANTIZE_ARCHITECTURES
            else ""
        )
        raise ConfigError(
            f"TensorRT-LLM's engine build cannot convert {facts.architecture}{hint}; it converts "
            f"{', '.join(sorted(CONVERT_FAMILIES))}. Use mode = 'serve' (the PyTorch backend "
            "runs it without a build) or engine = 'vllm'"
        )
    return f"convert-{family}"


def build_arguments(profile: Profile, facts: ModelFacts, gpus: Sequence[GPUInfo]) -> dict[str, str]:
    """Every argument that shapes the engine, as "step.flag" → value ("" for a bare flag)."""
    tool = checkpoint_tool(profile, facts)
    tp, pp = profile.tensor_parallel_size, profile.pipeline_parallel_size
    args = {"checkpoint.tool": tool}
    ckpt = {"dtype": profile.dtype, "tp_size": str(tp), "pp_size": str(pp)}
    if tool == "quantize":
        ckpt["qformat"] = profile.quant_recipe or "full_prec"
        ckpt["calib_size"] = str(CALIB_SIZE)
        if profile.calib_dataset:  # else quantize.py downloads cnn_dailymail from the Hub
            ckpt["calib_dataset"] = str(Path(profile.calib_dataset).expanduser())
        if profile.kv_cache_dtype != "auto":
            ckpt["kv_cache_dtype"] = "fp8"
    else:
        ckpt["workers"] = str(profile.world_size)
    args.update({f"checkpoint.{k}": v for k, v in ckpt.items()})
    seq_len = profile.max_model_len or facts.max_position_embeddings or DEFAULT_MAX_SEQ_LEN
    build = {
        "max_batch_size": str(
            profile.max_batch_size or profile.max_num_seqs or DEFAULT_MAX_BATCH_SIZE
        ),
        "max_input_len": str(seq_len),
        "max_seq_len": str(seq_len),
        "max_num_tokens": str(profile.max_num_batched_tokens or DEFAULT_MAX_NUM_TOKENS),
        "gemm_plugin": "auto",
        "workers": str(profile.world_size),
    }
    fp8_attention = fp8_context_fmha(profile, gpus)
    if fp8_attention is not None:
        build["use_fp8_context_fmha"] = fp8_attention
    args.update({f"build.{k}": v for k, v in build.items()})
    return args


def fp8_context_fmha(profile: Profile, gpus: Sequence[GPUInfo]) -> str | None:
    """Whether the engine runs context attention in FP8 ("enable"/"disable"), when FP8 is in
    play at all (None otherwise). It is what TensorRT-LLM's builder makes of it with paged
    context attention on (its default): on from sm_89 (Ada) for an FP8-family checkpoint with
    an FP8 KV cache, off without the FP8 KV cache or for other checkpoints. Passing the outcome
    explicitly keeps the cache key equal to what the engine really holds."""
    recipe_fp8 = profile.quant_recipe in FP8_ATTENTION_RECIPES
    kv_fp8 = profile.kv_cache_dtype != "auto"
    if not (recipe_fp8 or kv_fp8):
        return None
    capable = bool(gpus) and all(
        capability(g.compute_capability) >= FP8_ATTENTION_MIN_CC for g in gpus
    )
    return "enable" if recipe_fp8 and kv_fp8 and capable else "disable"


def plan_build(
    arguments: Mapping[str, str], *, model_dir: Path, work_dir: Path, tools: BuildTools
) -> BuildPlan:
    checkpoint_dir, engine_dir = work_dir / "checkpoint", work_dir / "engine"
    tool = arguments["checkpoint.tool"]
    ckpt_flags = ["--model_dir", str(model_dir), "--output_dir", str(checkpoint_dir)]
    ckpt_flags += _flags(arguments, "checkpoint.", skip={"checkpoint.tool"})
    if tool == "quantize":
        script = tools.examples_dir / QUANTIZE_SCRIPT
    else:
        family = tool.removeprefix("convert-")
        script = tools.examples_dir / "models" / "core" / family / "convert_checkpoint.py"
    _allowed(tools, tool, ckpt_flags)
    build_flags = ["--checkpoint_dir", str(checkpoint_dir), "--output_dir", str(engine_dir)]
    build_flags += _flags(arguments, "build.")
    _allowed(tools, "build", build_flags)
    return BuildPlan(
        steps=(
            BuildStep(
                "quantize" if tool == "quantize" else "convert",
                (str(tools.python), str(script), *ckpt_flags),
            ),
            BuildStep("build", (str(tools.trtllm_build), *build_flags)),
        ),
        checkpoint_dir=checkpoint_dir,
        engine_dir=engine_dir,
    )


def _flags(
    arguments: Mapping[str, str], prefix: str, skip: frozenset[str] | set[str] = frozenset()
) -> list[str]:
    out: list[str] = []
    for key, value in sorted(arguments.items()):
        if not key.startswith(prefix) or key in skip:
            continue
        out.append("--" + key.removeprefix(prefix))
        if value:
            out.append(value)
    return out


def _allowed(tools: BuildTools, tool: str, argv: list[str]) -> None:
    flags = tools.flags.get(tool)
    if flags is None:
        raise ConfigError(f"no flag allow-list for the {tool} step; reinstall TensorRT-LLM")
    flags.check(argv)
