"""Engine adapters, registered in a plain dict (no import-time registration magic)."""

from __future__ import annotations

from engines.runtime.adapters.base import EngineAdapter
from engines.runtime.adapters.sglang import SGLangAdapter
from engines.runtime.adapters.trtllm import TRTLLMAdapter
from engines.runtime.adapters.vllm import VLLMAdapter

ADAPTERS: dict[str, EngineAdapter] = {
    "vllm": VLLMAdapter(),
    "trtllm": TRTLLMAdapter(),
    "sglang": SGLangAdapter(),
}


def adapter_for(engine: str) -> EngineAdapter:
    from engines.errors import ConfigError

    try:
        return ADAPTERS[engine]
    except KeyError:
        raise ConfigError(
            f"no adapter for engine {engine!r}; known engines: {', '.join(sorted(ADAPTERS))}"
        ) from None
