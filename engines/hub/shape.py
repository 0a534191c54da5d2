"""A model's shape and quantization, read from its config.json (no weights needed).

Multimodal configs keep the language model under ``text_config`` (Llava, Gemma 3, Qwen-VL);
the KV cache is the language model's, so that part is read when present.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "I64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F4": 1,  # packed two per byte on disk, counted per element by the Hub
}

TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}


@dataclass(frozen=True)
class Shape:
    architecture: str
    model_type: str
    num_layers: int | None
    hidden_size: int | None
    intermediate_size: int | None
    num_attention_heads: int | None
    num_kv_heads: int | None
    head_dim: int | None
    kv_latent_dim: int | None
    vocab_size: int | None
    max_context: int | None
    dtype: str
    quantization: str | None
    quantization_config: Mapping[str, str]
    needs_remote_code: bool
    tie_word_embeddings: bool


def _int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def parse_config(config: Mapping[str, Any], extra_quant: Mapping[str, Any] | None = None) -> Shape:
    """``extra_quant`` is hf_quant_config.json (ModelOpt checkpoints keep it outside config)."""
    text = config.get("text_config")
    lm: Mapping[str, Any] = text if isinstance(text, Mapping) else config
    archs = config.get("architectures") or []
    hidden = _int(lm, "hidden_size", "n_embd", "d_model")
    heads = _int(lm, "num_attention_heads", "n_head")
    head_dim = _int(lm, "head_dim") or (hidden // heads if hidden and heads else None)
    latent = None
    if _int(lm, "kv_lora_rank"):
        latent = (_int(lm, "kv_lora_rank") or 0) + (_int(lm, "qk_rope_head_dim") or 0)
    qcfg = config.get("quantization_config") or lm.get("quantization_config")
    if not isinstance(qcfg, Mapping) and extra_quant:
        qcfg = extra_quant.get("quantization", extra_quant)
    dtype = str(lm.get("torch_dtype") or lm.get("dtype") or config.get("torch_dtype") or "")
    return Shape(
        architecture=str(archs[0]) if archs else "",
        model_type=str(config.get("model_type", "")),
        num_layers=_int(lm, "num_hidden_layers", "n_layer", "num_layers"),
        hidden_size=hidden,
        intermediate_size=_int(lm, "intermediate_size", "n_inner", "ffn_dim"),
        num_attention_heads=heads,
        num_kv_heads=_int(lm, "num_key_value_heads", "num_kv_heads", "multi_query_group_num")
        or heads,
        head_dim=head_dim,
        kv_latent_dim=latent,
        vocab_size=_int(lm, "vocab_size", "padded_vocab_size"),
        max_context=_int(lm, "max_position_embeddings", "n_positions", "max_seq_len", "seq_length"),
        dtype=dtype or "bfloat16",
        quantization=quantization_name(qcfg) if isinstance(qcfg, Mapping) else None,
        quantization_config=_flatten(qcfg) if isinstance(qcfg, Mapping) else {},
        needs_remote_code=bool(config.get("auto_map")),
        tie_word_embeddings=bool(lm.get("tie_word_embeddings", config.get("tie_word_embeddings"))),
    )


def quantization_name(q: Mapping[str, Any]) -> str | None:
    """A short name an engine understands: awq, gptq, fp8, nvfp4, mxfp4, w4a16, w8a8, ..."""
    method = str(q.get("quant_method") or q.get("quant_algo") or "").lower()
    algo = str(q.get("quant_algo") or "").lower()
    if method in ("modelopt", "modelopt_fp4") or algo:
        return "nvfp4" if "fp4" in (algo or method) else "fp8" if "fp8" in algo else algo or method
    if method == "compressed-tensors":
        return _compressed_tensors_scheme(q)
    return method or None


def _compressed_tensors_scheme(q: Mapping[str, Any]) -> str:
    groups = q.get("config_groups") or {}
    for group in groups.values() if isinstance(groups, Mapping) else ():
        weights = group.get("weights") or {}
        acts = group.get("input_activations") or {}
        bits = weights.get("num_bits")
        kind = weights.get("type")
        if bits == 4 and kind == "float":
            return "nvfp4"
        if bits == 8 and kind == "float":
            return "fp8"
        if bits == 4:
            return "w4a16" if not acts else "w4a8"
        if bits == 8:
            return "w8a8" if acts else "w8a16"
    return "compressed-tensors"


def _flatten(q: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in q.items():
        if isinstance(value, str | int | float | bool) or value is None:
            out[str(key)] = str(value)
        else:
            out[str(key)] = json.dumps(value, sort_keys=True)[:500]
    return out


PACKED_4BIT = frozenset({"awq", "gptq", "w4a16", "w4a8"})
"""Quantizations that pack eight 4-bit weights into each I32 element."""


def model_parameters(parameters: Mapping[str, int], quantization: str | None) -> int | None:
    """The model's parameter count. The Hub counts stored elements, so an AWQ/GPTQ checkpoint
    (eight 4-bit weights packed per I32) would show about a seventh of its real size."""
    if not parameters:
        return None
    packed = parameters.get("I32", 0) if quantization in PACKED_4BIT else 0
    return sum(parameters.values()) + 7 * packed


def weight_bytes_from_parameters(parameters: Mapping[str, int]) -> int:
    """Bytes of the stored tensors, from the Hub's per-dtype element counts."""
    return sum(n * SAFETENSORS_DTYPE_BYTES.get(dtype.upper(), 2) for dtype, n in parameters.items())
