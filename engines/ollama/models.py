"""traylm's models as Ollama lists them: ``/api/tags`` (every servable model that can start
here), ``/api/ps`` (the loaded ones, ``size_vram`` what traylm booked for them, ``expires_at``
when the idle TTL unloads them) and ``/api/show``. Family, parameter size and quantization
come from each model's config.json (engines/core/modelinfo.py), the size from its weight files.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from engines.core.modelinfo import read_model_info
from engines.errors import ModelUnavailable, quoted
from engines.events.models import ServableModel
from engines.ollama.shapes import tagged
from engines.ondemand.service import ModelsOnDemand

WEIGHTS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
NEVER = datetime(2318, 1, 1, tzinfo=UTC)
"""``expires_at`` of a model that is never unloaded (pinned, or no TTL): what Ollama reports
for keep_alive -1, far in the future."""
DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}


def _weights_bytes(config_path: Path | None) -> int:
    if config_path is None:
        return 0
    folder = config_path.parent
    return sum(p.stat().st_size for pattern in WEIGHTS for p in folder.glob(pattern))


def _params(config: Mapping[str, Any]) -> int:
    """About how many parameters a transformer of this config has (12·L·h² + vocab·h)."""
    text = config.get("text_config")
    c = text if isinstance(text, Mapping) else config
    h = c.get("hidden_size") or c.get("d_model") or 0
    layers = c.get("num_hidden_layers") or c.get("n_layer") or 0
    vocab = c.get("vocab_size") or 0
    if not all(isinstance(x, int) for x in (h, layers, vocab)):
        return 0
    tied = c.get("tie_word_embeddings", True)
    return int(12 * layers * h * h + vocab * h * (1 if tied else 2))


def _size_text(n: int) -> str:
    if n >= 1_000_000_000:
        return f"{n / 1e9:.1f}B"
    return f"{n / 1e6:.1f}M" if n else ""


def _quant(config: Mapping[str, Any]) -> str:
    q = config.get("quantization_config")
    if isinstance(q, Mapping):
        method = str(q.get("quant_method", "")).upper()
        bits = q.get("bits") or q.get("w_bit")
        return f"{method}_INT{bits}" if bits else method
    dtype = config.get("torch_dtype") or config.get("dtype") or ""
    return DTYPES.get(str(dtype), str(dtype).upper())


def details(model: str) -> dict[str, Any]:
    """Ollama's ``details`` of a model (a repo id or a folder), and its size and config.
    Blocking: reads files."""
    info = read_model_info(model)
    config: Mapping[str, Any] = info.config if info is not None else {}
    family = info.model_type if info is not None else ""
    found = Path(model) / "config.json" if model.startswith("/") else _cached(model)
    return {
        "details": {
            "parent_model": "",
            "format": "safetensors",
            "family": family,
            "families": [family] if family else None,
            "parameter_size": _size_text(_params(config)),
            "quantization_level": _quant(config),
        },
        "size": _weights_bytes(found if found is not None and found.is_file() else None),
        "config": dict(config),
    }


def _cached(repo_id: str) -> Path | None:
    from huggingface_hub import try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:
        return None
    return Path(cached) if isinstance(cached, str) else None


def _digest(m: ServableModel) -> str:
    return hashlib.sha256(f"{m.engine_id}:{m.model}".encode()).hexdigest()


def _row(m: ServableModel, name: str, info: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": tagged(name),
        "model": tagged(name),
        "modified_at": datetime.now(UTC).isoformat(),
        "size": info["size"],
        "digest": _digest(m),
        "details": info["details"],
    }


async def tags(ondemand: ModelsOnDemand) -> list[dict[str, Any]]:
    """Every servable model (and its aliases) that can start on this computer."""
    listed = [m for m in await ondemand.listing() if not m.blocked]
    infos = await asyncio.gather(*(asyncio.to_thread(details, m.model) for m in listed))
    return [
        _row(m, name, info)
        for m, info in zip(listed, infos, strict=True)
        for name in (m.name, *m.aliases)
    ]


async def loaded(ondemand: ModelsOnDemand) -> list[dict[str, Any]]:
    """The models loaded (or loading), with the memory traylm booked and when they unload."""
    servable = {m.engine_id: m for m in await ondemand.listing()}
    out = []
    for row in ondemand.ps():
        m = servable.get(row.engine_id)
        if m is None or row.box:
            continue
        info = await asyncio.to_thread(details, m.model)
        if row.unloads_in_s is not None:
            expires = datetime.now(UTC) + timedelta(seconds=row.unloads_in_s)
        elif row.ttl_s > 0 and not row.pinned:
            expires = datetime.now(UTC) + timedelta(seconds=row.ttl_s)  # busy: after the TTL
        else:
            expires = NEVER
        size = row.vram_bytes or row.ram_bytes or info["size"]
        item = _row(m, m.name, info)
        item.update(
            size=size,
            size_vram=row.vram_bytes,
            expires_at=expires.isoformat().replace("+00:00", "Z"),
            context_length=_context(info["config"]),
        )
        out.append(item)
    return out


def _context(config: Mapping[str, Any]) -> int:
    text = config.get("text_config")
    c = text if isinstance(text, Mapping) else config
    value = c.get("max_position_embeddings")
    return value if isinstance(value, int) else 0


async def show(ondemand: ModelsOnDemand, name: str) -> dict[str, Any]:
    """/api/show: details, model_info (the config's numbers under Ollama's key names) and
    capabilities; an unknown name raises 404, and one that cannot start here (left out of
    /api/tags) 400 saying why, as a chat with it is refused."""
    m = next((m for m in await ondemand.listing() if name in (m.name, *m.aliases, *m.names)), None)
    if m is None:
        raise ModelUnavailable(
            f"model {quoted(name)} not found", code="model_not_found", http_status=404
        )
    if m.blocked:
        raise ModelUnavailable(
            f"model {quoted(name)} cannot start on this computer: {m.blocked}",
            code=m.blocked_code or "model_unavailable",
            http_status=400,
        )
    info = await asyncio.to_thread(details, m.model)
    family = info["details"]["family"] or "general"
    config = info["config"]
    model_info = {
        "general.architecture": family,
        "general.parameter_count": _params(config),
        f"{family}.context_length": _context(config),
    }
    capabilities = ["completion", "tools"]
    if m.accepts_images:
        capabilities.append("vision")
    return {
        "modelfile": f"# served by traylm\nFROM {m.model}\n",
        "parameters": "",
        "template": "{{ .Prompt }}",
        "details": info["details"],
        "model_info": model_info,
        "capabilities": capabilities,
        "modified_at": datetime.now(UTC).isoformat(),
    }
