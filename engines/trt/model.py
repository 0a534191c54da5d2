"""What an engine build needs to know about a Hugging Face checkpoint on disk.

Blocking file reads: call from a thread. A repo id is looked up in the local Hugging Face cache
only (an engine build never downloads; `traylm models pull` does).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.core.modelinfo import ConfigUnreadable, folder_config
from engines.errors import ConfigError

WEIGHT_SUFFIXES = (".safetensors", ".bin")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "generation_config.json",
)


@dataclass(frozen=True)
class ModelFacts:
    path: Path
    source_id: str
    """``repo@commit`` for a cached repo; ``local:<sha256>`` of config, index and file sizes."""
    architecture: str
    max_position_embeddings: int | None
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    weights_bytes: int
    dtype: str

    def kv_bytes_per_token(self, kv_dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes


def local_model_dir(model: str, revision: str | None) -> tuple[Path, str]:
    """The checkpoint folder for ``model`` (a local path or a cached repo id) and its source id
    prefix (``repo@commit``, or "" for a local folder)."""
    if model.startswith("/"):
        return Path(model), ""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(model, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as exc:
        raise ConfigError(
            f"mode = 'build' needs {model} on disk and it is not in the Hugging Face cache "
            f"({type(exc).__name__}); download it first with `traylm models pull {model}`"
        ) from None
    return folder, f"{model}@{folder.name}"


def read_model_facts(path: Path, source_id: str = "") -> ModelFacts:
    try:
        config = folder_config(path)
    except ConfigUnreadable as exc:
        raise ConfigError(
            f"{path}: {exc}; point the profile at a Hugging Face model folder"
        ) from None
    text = config.get("text_config") or config
    archs = config.get("architectures") or []
    heads = int(text.get("num_attention_heads") or 0)
    hidden = int(text.get("hidden_size") or 0)
    if not archs or not heads or not hidden:
        raise ConfigError(
            f"{path}/config.json has no architectures/hidden_size/num_attention_heads; "
            "it is not a decoder model TensorRT-LLM can build"
        )
    return ModelFacts(
        path=path,
        source_id=source_id or local_source_id(path),
        architecture=str(archs[0]),
        max_position_embeddings=_int_or_none(text.get("max_position_embeddings")),
        num_layers=int(text.get("num_hidden_layers") or 0),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=int(text.get("num_key_value_heads") or heads),
        head_dim=int(text.get("head_dim") or hidden // heads),
        weights_bytes=weights_bytes(path),
        dtype=str(text.get("torch_dtype") or config.get("torch_dtype") or "float16"),
    )


def weights_bytes(path: Path) -> int:
    """The checkpoint's weight size: the index's total_size, else the weight files' sizes."""
    for index in sorted(path.glob("*.index.json")):
        try:
            total = json.loads(index.read_text()).get("metadata", {}).get("total_size")
        except (OSError, ValueError):
            continue
        if isinstance(total, int) and total > 0:
            return total
    return sum(p.stat().st_size for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)


def local_source_id(path: Path) -> str:
    """A content id of a local folder that changes when its config or weights change."""
    digest = hashlib.sha256()
    for name in ["config.json", *sorted(p.name for p in path.glob("*.index.json"))]:
        file = path / name
        if file.exists():
            digest.update(name.encode() + b"\0" + file.read_bytes())
    for p in sorted(path.iterdir()):
        if p.suffix in WEIGHT_SUFFIXES:
            digest.update(f"{p.name}\0{p.stat().st_size}\n".encode())
    return f"local:{digest.hexdigest()[:24]}"


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, int | float) and value > 0 else None
