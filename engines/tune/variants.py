"""Quantized variants of a profile's model that are on this computer already (the tuner never
downloads during a tune).

A local model (a revision in the Hugging Face cache, or a folder registered in the library) is a
quantized variant of the profile's model when its config.json has a ``quantization_config`` of a
method vLLM reads from the checkpoint (``QUANT_METHODS``), and either its model card names the
profile's model as its ``base_model`` (README.md front matter, read by huggingface_hub), or it
has the same architecture and the same size (hidden size, layers, vocabulary) as the profile's
model. Blocking file I/O: call from a thread.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from huggingface_hub import metadata_load

from engines.core.modelinfo import ConfigUnreadable, folder_config
from engines.hub.service import HubFeature

log = logging.getLogger(__name__)
QUANT_METHODS = frozenset({"awq", "gptq", "fp8", "compressed-tensors", "bitsandbytes", "mxfp4"})
"""quantization_config.quant_method values of checkpoints vLLM 0.32 serves as they are."""
SHAPE = ("architectures", "hidden_size", "num_hidden_layers", "vocab_size")


@dataclass(frozen=True)
class ModelOnDisk:
    """A model on this computer: what a profile's ``model`` says to serve it, and its folder."""

    model: str  # a Hub repo id (served from the cache) or a folder path
    folder: Path


@dataclass(frozen=True)
class Variant:
    model: str
    method: str  # the quantization method


def quantized_variants(base_model: str, local: Sequence[ModelOnDisk]) -> list[Variant]:
    """The quantized variants of ``base_model`` among ``local``, in the order given."""
    base_folder = next((m.folder for m in local if m.model == base_model), None)
    if base_folder is None and Path(base_model).is_dir():
        base_folder = Path(base_model)
    base_shape = _shape(_config(base_folder)) if base_folder is not None else None
    if _method(_config(base_folder) if base_folder is not None else {}):
        return []  # the profile's model is quantized itself
    found = []
    for m in local:
        if m.model == base_model:
            continue
        config = _config(m.folder)
        method = _method(config)
        if not method:
            continue
        same = _base_model(m.folder) == base_model.lower().rstrip("/")
        if same or (base_shape is not None and _shape(config) == base_shape):
            found.append(Variant(m.model, method))
    return found


def _config(folder: Path | None) -> dict[str, Any]:
    if folder is None:
        return {}
    try:
        return folder_config(folder)
    except ConfigUnreadable:
        return {}


def _method(config: dict[str, Any]) -> str:
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return method if isinstance(method, str) and method in QUANT_METHODS else ""


def _shape(config: dict[str, Any]) -> tuple[Any, ...] | None:
    shape = tuple(tuple(v) if isinstance(v, list) else v for v in (config.get(k) for k in SHAPE))
    return shape if all(v is not None for v in shape) else None


def _base_model(folder: Path) -> str:
    """The model card's ``base_model`` (one name, or the first of a list), lower case; ""."""
    card = folder / "README.md"
    if not card.is_file():
        return ""
    try:
        meta = metadata_load(card) or {}
    except (OSError, ValueError, yaml.YAMLError) as exc:  # not UTF-8, not YAML front matter
        log.debug("model card %s unreadable: %s", card, exc)
        return ""
    base = meta.get("base_model")
    if isinstance(base, list):
        base = base[0] if base else ""
    return base.lower().rstrip("/") if isinstance(base, str) else ""


def library_models(hub: HubFeature) -> list[ModelOnDisk]:
    """The Hub cache's revisions (served by repo id) and the registered folders that can be
    served (by path)."""
    cached = [ModelOnDisk(m.repo_id, Path(m.snapshot_path)) for m in hub.library.models()]
    folders = [ModelOnDisk(f.path, Path(f.path)) for f in hub.folders.list() if not f.problems]
    return cached + folders
