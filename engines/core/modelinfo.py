"""A model's own description, read from disk: its config.json (architectures, model type) and
whether it is a sentence-transformers folder, from a local folder or the Hugging Face cache.
``folder_config`` is the one reader of a model folder's config.json; everything that needs a
model's config (the hub's folder check and library, the catalog, the TensorRT-LLM build) calls
it or ``read_model_info``.

Blocking and offline: callers on the event loop run it in a thread. Nothing is downloaded; a
model that is neither a folder nor in the cache has no info (None).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ConfigUnreadable(ValueError):
    """A model folder's config.json is missing, not JSON, or not a JSON object; the message
    says which, in words a user can act on."""


def folder_config(folder: Path) -> dict[str, Any]:
    """The config.json of the model folder ``folder``; ConfigUnreadable says why not."""
    path = folder / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigUnreadable("no config.json") from None
    except (OSError, ValueError) as exc:
        raise ConfigUnreadable(f"config.json is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigUnreadable("config.json is not a JSON object")
    return data


@dataclass(frozen=True)
class ModelInfo:
    architectures: tuple[str, ...]
    model_type: str
    sentence_transformers: bool
    """The folder has a sentence-transformers Pooling module (vLLM runs it for embeddings)."""
    config: Mapping[str, Any] = field(default_factory=dict)

    @property
    def accepts_images(self) -> bool:
        """The model takes images: its config.json describes a vision encoder (``vision_config``:
        LLaVA, Qwen2-VL, Gemma 3, Llama 3.2 Vision, InternVL, ...; ``img_processor``: Phi-3
        Vision). Text-only models have neither, and vLLM refuses images for them."""
        return isinstance(self.config.get("vision_config"), Mapping) or isinstance(
            self.config.get("img_processor"), Mapping
        )


def read_model_info(model: str, revision: str | None = None) -> ModelInfo | None:
    """The info of ``model`` (a local folder or a repo id in the HF cache), or None."""
    found = _local_file(model, "config.json", revision)
    try:
        config = folder_config(found.parent) if found is not None else None
    except ConfigUnreadable as exc:
        log.debug("cannot read %s: %s", found, exc)
        return None
    if config is None:
        return None
    modules = _read_json(model, "modules.json", revision)
    pooling = isinstance(modules, list) and any(
        isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling") for m in modules
    )
    archs = config.get("architectures")
    return ModelInfo(
        architectures=tuple(str(a) for a in archs) if isinstance(archs, list) else (),
        model_type=str(config.get("model_type", "")),
        sentence_transformers=pooling,
        config=config,
    )


def _read_json(model: str, filename: str, revision: str | None) -> object:
    path = _local_file(model, filename, revision)
    if path is None:
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.debug("cannot read %s: %s", path, exc)
        return None


def _local_file(model: str, filename: str, revision: str | None) -> Path | None:
    folder = Path(model).expanduser()
    if model.startswith(("/", "./", "../", "~")):
        found = folder / filename
        return found if found.is_file() else None
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model, filename, revision=revision)
    except ValueError:  # not a valid repo id
        return None
    return Path(cached) if isinstance(cached, str) else None
