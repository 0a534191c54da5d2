"""What vLLM makes of a model: the tasks it serves, and the tool-call and reasoning parsers its
family needs.

Pure functions of a profile and the model's config.json (read elsewhere, engines/core/modelinfo.py).
The task rules follow vLLM 0.32's ``ModelConfig`` (an architecture's name suffix decides
generate or pooling when ``--runner auto``; a sentence-transformers folder is a pooling model),
and every parser name below is in vLLM 0.32's parser registries (the flag probe records them).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engines.config.profiles import Profile

# vLLM's architecture-suffix defaults (vllm/config/model.py _SUFFIX_TO_DEFAULTS), in its order.
_GENERATE_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "ChatModel", "LMHeadModel")
_CLASSIFY_SUFFIXES = (
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForAudioClassification",
    "ForImageClassification",
    "ForVideoClassification",
    "ClassificationModel",
)
_EMBED_SUFFIXES = ("ForTextEncoding", "EmbeddingModel", "ForRewardModeling", "RewardModel", "Model")
# Speech-to-text models vLLM serves only through /v1/audio/* (supports_transcription_only).
_TRANSCRIPTION_ONLY = re.compile(r"^Whisper")


def model_tasks(
    profile: Profile, architectures: Sequence[str], *, sentence_transformers: bool = False
) -> frozenset[str]:
    """The vLLM task the engine will run the model as ("generate", "embed", "classify" or
    "transcription"), from the profile's runner and the model's architectures."""
    arch = architectures[0] if architectures else ""
    if profile.runner == "pooling":
        return frozenset({"classify" if arch.endswith(_CLASSIFY_SUFFIXES) else "embed"})
    if profile.runner == "generate":
        return frozenset({"transcription" if _TRANSCRIPTION_ONLY.match(arch) else "generate"})
    if _TRANSCRIPTION_ONLY.match(arch):
        return frozenset({"transcription"})
    if sentence_transformers:  # some sentence-transformers models use *ForCausalLM names
        return frozenset({"embed"})
    for suffixes, task in (
        (_GENERATE_SUFFIXES, "generate"),
        (_CLASSIFY_SUFFIXES, "classify"),
        (_EMBED_SUFFIXES, "embed"),
    ):
        if arch.endswith(suffixes):
            return frozenset({task})
    return frozenset({"generate"})


@dataclass(frozen=True)
class Parsers:
    """vLLM's --tool-call-parser and --reasoning-parser for a model family ("" = none)."""

    tool: str = ""
    reasoning: str = ""


def family_parsers(model: str, config: Mapping[str, Any] | None = None) -> Parsers:
    """The parsers a model's family needs, from its repo id or folder name and its config.json
    (``model_type``, Llama 3's rope type). Unknown families get none (tool calling off)."""
    name = model.rstrip("/").lower()
    config = config or {}
    model_type = str(config.get("model_type", "")).lower()
    rope = config.get("rope_scaling")
    llama3_rope = isinstance(rope, Mapping) and rope.get("rope_type") == "llama3"
    if "deepseek-r1" in name:  # R1 and its Qwen/Llama distills think in <think> blocks
        return Parsers(reasoning="deepseek_r1")
    if "qwen3-coder" in name:
        return Parsers(tool="qwen3_coder")
    if model_type in ("qwen3", "qwen3_moe") or "qwen3" in name:
        return Parsers(tool="hermes", reasoning="qwen3")
    if model_type == "qwen2" or re.search(r"qwen2\.?5", name):
        return Parsers(tool="hermes")
    if model_type in ("mistral", "mixtral") or re.search(r"mistral|mixtral|ministral", name):
        return Parsers(tool="mistral")
    if re.search(r"llama-?3", name) or (model_type == "llama" and llama3_rope):
        return Parsers(tool="llama3_json")
    return Parsers()
