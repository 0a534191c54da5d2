"""TensorRT-LLM build progress and engine-cache entries (engines/trt/)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import ClassVar

from engines.events.codec import Event


@dataclasses.dataclass(frozen=True, kw_only=True)
class TRTBuildProgress(Event):
    """A TensorRT engine build for a starting engine: one per step change and about once a
    second while a step runs. ``eta_s`` comes from past builds of similar size (None before the
    first one)."""

    kind: ClassVar[str] = "trt.build"
    engine_id: str
    cache_id: str
    state: str  # "running" | "done" | "failed" | "cancelled"
    step: str  # "quantize" | "convert" | "build" | ""
    step_index: int  # 1-based
    steps_total: int
    elapsed_s: float
    eta_s: float | None = None
    detail: str = ""


@dataclasses.dataclass(frozen=True)
class TRTCacheEntry:
    """One built TensorRT engine in the cache, for `traylm engines cache ls` and the UI."""

    id: str
    model: str
    quant_recipe: str
    tensor_parallel_size: int
    pipeline_parallel_size: int
    arguments: Mapping[str, str]
    environment: Mapping[str, str]
    """tensorrt_llm and tensorrt versions, GPU name, compute capability, driver/CUDA major."""
    size_bytes: int
    created_s: float
    last_used_s: float
    build_s: float
    path: str
    in_use_by: tuple[str, ...] = ()
    compatible: bool = True
    problem: str = ""
    """Why this engine cannot run here (another TensorRT-LLM version, another GPU)."""
