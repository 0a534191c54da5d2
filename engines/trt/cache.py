"""Built TensorRT engines on disk, keyed by everything that makes them valid.

Layout under ``Paths.trt_engines_dir``::

    <id>/meta.json            the key (identity + environment), sizes and times; written last
    <id>/engine/              config.json + rank<N>.engine (what trtllm-serve loads)
    .partial-<id>-<n>/        a build in progress (removed on failure or cancel)
    build-history.json        step durations of past builds (the ETA of the next one)

The key's *identity* is the model (repo@commit, or a content hash of a local folder), the quant
recipe, TP/PP and every build argument. Its *environment* is the tensorrt_llm and TensorRT
versions, the GPU name and compute capability, and the driver and CUDA major versions. An entry
with the same identity but another environment is refused with the differences (TensorRT
engines do not load across versions or GPU architectures). All methods block: call them from a
thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engines.config.tomlfile import write_bytes_atomic
from engines.errors import ConfigError, EngineError, quoted
from engines.events.trt import TRTCacheEntry

META = "meta.json"
ENGINE_DIR = "engine"
PARTIAL_PREFIX = ".partial-"
HISTORY = "build-history.json"
HISTORY_MAX = 50
PLUGIN_SETTINGS = ("use_fp8_context_fmha",)
"""Build arguments the builder may override; the engine's config.json must agree with the key."""


class EngineVersionMismatch(EngineError):
    code = "engine_version_mismatch"


@dataclass(frozen=True)
class CacheKey:
    identity: Mapping[str, str]
    environment: Mapping[str, str]

    @property
    def identity_id(self) -> str:
        return _digest(self.identity)

    @property
    def id(self) -> str:
        return _digest({"identity": self.identity, "environment": self.environment})


@dataclass(frozen=True)
class Lookup:
    hit: TRTCacheEntry | None
    refused: tuple[tuple[TRTCacheEntry, str], ...] = ()
    """Entries with this identity built for another environment, with the differences."""


@dataclass
class EngineCache:
    root: Path
    budget_bytes: int
    _partials: int = field(default=0, init=False)

    # ------------------------------------------------------------------ reading

    def entries(self, in_use: Mapping[str, Iterable[str]] | None = None) -> list[TRTCacheEntry]:
        """Every complete entry, least recently used first."""
        if not self.root.is_dir():
            return []
        found = []
        for folder in self.root.iterdir():
            if folder.name.startswith(".") or not folder.is_dir():
                continue
            entry = self._read(folder, in_use or {})
            if entry is not None:
                found.append(entry)
        return sorted(found, key=lambda e: e.last_used_s)

    def lookup(self, key: CacheKey) -> Lookup:
        hit = None
        refused = []
        for entry in self.entries():
            meta = self._meta(Path(entry.path))
            if meta.get("identity_id") != key.identity_id:
                continue
            problem = differences(entry.environment, key.environment)
            if not problem:
                problem = self._engine_problem(Path(entry.path), key)
            if problem:
                refused.append((entry, problem))
            else:
                hit = entry
        return Lookup(hit, tuple(refused))

    def engine_dir(self, entry_id: str) -> Path:
        return self.root / entry_id / ENGINE_DIR

    # ------------------------------------------------------------------ writing

    def begin(self, key: CacheKey) -> Path:
        """A fresh staging folder for a build of ``key``."""
        self.root.mkdir(parents=True, exist_ok=True)
        self._partials += 1
        staging = self.root / f"{PARTIAL_PREFIX}{key.id}-{os.getpid()}-{self._partials}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        return staging

    def commit(
        self, staging: Path, key: CacheKey, *, model: str, build_s: float, extra: Mapping[str, Any]
    ) -> TRTCacheEntry:
        """Move a finished build into place (its engine folder must hold config.json and one
        rank<N>.engine per rank); the old entry with the same id is replaced."""
        engine = staging / ENGINE_DIR
        ranks = sorted(engine.glob("rank*.engine"))
        if not (engine / "config.json").exists() or not ranks:
            raise EngineError(
                f"the build left no engine in {engine} (config.json and rank*.engine expected); "
                "see the engine log"
            )
        for leftover in staging.iterdir():
            if leftover.name != ENGINE_DIR:
                _remove(leftover)  # the intermediate checkpoint is not kept
        now = time.time()
        meta = {
            "id": key.id,
            "identity_id": key.identity_id,
            "identity": dict(key.identity),
            "environment": dict(key.environment),
            "model": model,
            "created_s": now,
            "last_used_s": now,
            "build_s": build_s,
            **extra,
        }
        write_bytes_atomic(staging / META, json.dumps(meta, indent=1).encode())
        final = self.root / key.id
        if final.exists():
            shutil.rmtree(final)
        staging.rename(final)
        entry = self._read(final, {})
        assert entry is not None
        return entry

    def touch(self, entry_id: str) -> None:
        folder = self.root / entry_id
        meta = self._meta(folder)
        if meta:
            meta["last_used_s"] = time.time()
            write_bytes_atomic(folder / META, json.dumps(meta, indent=1).encode())

    def remove(self, entry_id: str, in_use: Mapping[str, Iterable[str]]) -> TRTCacheEntry:
        folder = self.root / entry_id
        plain = "/" not in entry_id and entry_id not in ("", ".", "..") and len(entry_id) <= 255
        entry = self._read(folder, in_use) if plain and folder.is_dir() else None
        if entry is None:
            known = ", ".join(e.id for e in self.entries()) or "none"
            raise ConfigError(f"no cached engine {quoted(entry_id)}; cached: {known}")
        if entry.in_use_by:
            raise EngineError(
                f"engine {entry_id} is in use by {', '.join(entry.in_use_by)}; stop it first"
            )
        shutil.rmtree(folder)
        return entry

    def prune(
        self,
        *,
        in_use: Mapping[str, Iterable[str]],
        environment: Mapping[str, str] | None = None,
        budget_bytes: int | None = None,
        keep: str = "",
    ) -> list[TRTCacheEntry]:
        """Remove entries built for another ``environment`` (when given), then the least
        recently used ones until the cache fits ``budget_bytes``. Entries in use (and ``keep``)
        are never removed."""
        removed: list[TRTCacheEntry] = []
        entries = self.entries(in_use)
        for entry in entries:
            stale = environment is not None and differences(entry.environment, environment)
            if stale and not entry.in_use_by and entry.id != keep:
                shutil.rmtree(entry.path, ignore_errors=True)
                removed.append(entry)
        budget = self.budget_bytes if budget_bytes is None else budget_bytes
        left = [e for e in entries if e not in removed]
        total = sum(e.size_bytes for e in left)
        for entry in left:  # least recently used first
            if total <= budget:
                break
            if entry.in_use_by or entry.id == keep:
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry)
            total -= entry.size_bytes
        return removed

    def clean_partials(self) -> int:
        """Remove staging folders left by a daemon that died mid-build (call at start-up)."""
        if not self.root.is_dir():
            return 0
        stale = [p for p in self.root.iterdir() if p.name.startswith(PARTIAL_PREFIX)]
        for p in stale:
            shutil.rmtree(p, ignore_errors=True)
        return len(stale)

    # ------------------------------------------------------------------ build history

    def history(self) -> list[dict[str, Any]]:
        try:
            data = json.loads((self.root / HISTORY).read_text())
        except (OSError, ValueError):
            return []
        return [d for d in data if isinstance(d, dict)] if isinstance(data, list) else []

    def record_build(self, record: Mapping[str, Any]) -> None:
        data = [*self.history(), dict(record)][-HISTORY_MAX:]
        self.root.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(self.root / HISTORY, json.dumps(data, indent=1).encode())

    # ------------------------------------------------------------------ helpers

    def _meta(self, folder: Path) -> dict[str, Any]:
        try:
            data = json.loads((folder / META).read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _read(self, folder: Path, in_use: Mapping[str, Iterable[str]]) -> TRTCacheEntry | None:
        meta = self._meta(folder)
        if not meta or not (folder / ENGINE_DIR).is_dir():
            return None
        identity = {str(k): str(v) for k, v in dict(meta.get("identity", {})).items()}
        users = tuple(sorted(in_use.get(folder.name, ())))
        return TRTCacheEntry(
            id=folder.name,
            model=str(meta.get("model", "")),
            quant_recipe=identity.get("quant_recipe", ""),
            tensor_parallel_size=int(identity.get("tensor_parallel_size", "1")),
            pipeline_parallel_size=int(identity.get("pipeline_parallel_size", "1")),
            arguments={k: v for k, v in identity.items() if "." in k},
            environment={str(k): str(v) for k, v in dict(meta.get("environment", {})).items()},
            size_bytes=_size(folder),
            created_s=float(meta.get("created_s", 0.0)),
            last_used_s=float(meta.get("last_used_s", 0.0)),
            build_s=float(meta.get("build_s", 0.0)),
            path=str(folder),
            in_use_by=users,
        )

    def _engine_problem(self, folder: Path, key: CacheKey) -> str:
        """What the engine's own config.json says, if it contradicts the key (a copied or
        hand-edited folder, or a plugin setting the builder overrode)."""
        try:
            config = json.loads((folder / ENGINE_DIR / "config.json").read_text())
        except (OSError, ValueError):
            return "its engine/config.json is missing or unreadable"
        built = str(config.get("version", ""))
        want = key.environment.get("tensorrt_llm", "")
        if built and want and built != want:
            return f"its config.json says TensorRT-LLM {built}, installed is {want}"
        plugins = config.get("build_config", {}).get("plugin_config", {})
        for name in PLUGIN_SETTINGS:
            asked = key.identity.get(f"build.{name}")
            held = plugins.get(name) if isinstance(plugins, dict) else None
            if (
                isinstance(held, bool)
                and asked in ("enable", "disable")
                and held != (asked == "enable")
            ):
                state = "on" if held else "off"
                return f"its config.json has {name} {state}, the key asks for {asked}"
        return ""


def differences(built: Mapping[str, str], here: Mapping[str, str]) -> str:
    """ "" when an engine built in ``built`` runs in ``here``; else what differs."""
    diffs = [
        f"{name} {built.get(name, '?')} (installed/here: {here.get(name, '?')})"
        for name in sorted(set(built) | set(here))
        if built.get(name) != here.get(name)
    ]
    return "built with " + "; ".join(diffs) if diffs else ""


def mismatch_error(entries: Iterable[tuple[TRTCacheEntry, str]]) -> EngineVersionMismatch:
    lines = [f"{e.id}: {why}" for e, why in entries]
    return EngineVersionMismatch(
        "the cached TensorRT engine for this profile was built for another environment and "
        "TensorRT engines do not load across versions or GPUs: "
        + " | ".join(lines)
        + ". Remove it with `traylm engines cache prune --stale` (or `traylm engines cache rm "
        "ID`) and start the profile again to rebuild it"
    )


def _digest(data: Mapping[str, Any]) -> str:
    text = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _size(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(dirpath) / name).stat().st_size
    return total


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
