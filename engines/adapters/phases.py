"""Where an engine's start has got, read from its log: pure functions of one log line.

vLLM logs each stage of a start (checked against the source of the installed 0.32 CPU build and
a real start of it here): the engine core, loading the model and its weight shards, torch.compile
and the warm-up, memory profiling, the KV cache, CUDA graph capture (GPU builds), then the API
server. A start that takes minutes then shows which stage it is in instead of a bare
"starting". Engines whose log traylm has not checked (TensorRT-LLM, SGLang) have no phases.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StartPhase:
    key: str  # engine | model | weights | compile | memory | kv_cache | graphs | warmup | server
    words: str  # what the user reads: "loading weights (3 of 8 shards)"
    progress: float | None = None  # 0..1 within this phase, when the log says


_Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], StartPhase]]


def _fixed(key: str, words: str) -> Callable[[re.Match[str]], StartPhase]:
    return lambda _m: StartPhase(key, words)


def _counted(key: str, words: str, unit: str) -> Callable[[re.Match[str]], StartPhase]:
    def phase(m: re.Match[str]) -> StartPhase:
        done, total = int(m.group("done")), int(m.group("total"))
        share = done / total if total else None
        return StartPhase(key, f"{words} ({done} of {total} {unit})", share)

    return phase


def _kv(m: re.Match[str]) -> StartPhase:
    return StartPhase("kv_cache", f"allocating the KV cache ({m.group('tokens')} tokens)")


VLLM_RULES: tuple[_Rule, ...] = (
    (re.compile(r"Initializing a V1 LLM engine"), _fixed("engine", "starting the engine core")),
    (re.compile(r"Starting to load model"), _fixed("model", "loading the model")),
    (re.compile(r"Loading safetensors checkpoint shards:.*?\|\s*(?P<done>\d+)/(?P<total>\d+)"),
     _counted("weights", "loading weights", "shards")),
    (re.compile(r"Loading weights took|Model loading took"),
     _fixed("weights", "weights loaded")),
    (re.compile(r"Dynamo bytecode transform|Compiling a graph for|Warming up model for the "
                r"compilation"), _fixed("compile", "compiling and warming up the model")),
    (re.compile(r"Warming up done|torch\.compile took"), _fixed("compile", "model compiled")),
    (re.compile(r"Memory profiling takes"), _fixed("memory", "measuring memory")),
    (re.compile(r"KV cache size: (?P<tokens>[\d,]+) tokens"), _kv),
    (re.compile(r"Capturing CUDA graphs.*?\|\s*(?P<done>\d+)/(?P<total>\d+)"),
     _counted("graphs", "capturing CUDA graphs", "sizes")),
    (re.compile(r"Graph capturing finished"), _fixed("graphs", "CUDA graphs captured")),
    (re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
     _fixed("warmup", "warm-up done")),
    (re.compile(r"Starting vLLM (API )?server"), _fixed("server", "starting the API server")),
)  # fmt: skip

RULES: dict[str, tuple[_Rule, ...]] = {"vllm": VLLM_RULES}


def start_phase(engine: str, line: str) -> StartPhase | None:
    """The phase a log line of ``engine`` announces, or None."""
    for pattern, make in RULES.get(engine, ()):
        found = pattern.search(line)
        if found:
            return make(found)
    return None
