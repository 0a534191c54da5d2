"""EAGLE-3 speculative decoding as a tuner candidate: only for a model whose EAGLE-3 draft is
known (``EAGLE3_DRAFTS``) and already on this computer (the tuner never downloads during a tune).

vLLM 0.32 takes it as ``--speculative-config '{"method": "eagle3", "model": DRAFT,
"num_speculative_tokens": N}'`` (vllm/config/speculative.py: SpeculativeConfig, method
"eagle3"). DRAFT is given as the draft's local folder, so the engine reads no Hub. GPU-only:
EAGLE-3 gave 1.71x at concurrency 1 on a 4090 (vLLM PR 24243) and loses its gain as the batch
grows, which is what the tuner measures at the workload's concurrency.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from engines.tune.variants import ModelOnDisk

EAGLE3_DRAFTS: Mapping[str, str] = {
    # target repo id (lower case) → its EAGLE-3 draft; the pairs vLLM 0.32's own sources name
    "meta-llama/llama-3.1-8b-instruct": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
    "qwen/qwen3-8b": "AngelSlim/Qwen3-8B_eagle3",
    "openai/gpt-oss-120b": "nvidia/gpt-oss-120b-Eagle3-v2",
}
SPEC_TOKENS = 3


def eagle3_draft(model: str, local: Sequence[ModelOnDisk]) -> tuple[str, str]:
    """(the draft's local folder, "") or ("", why there is no EAGLE-3 candidate)."""
    draft = EAGLE3_DRAFTS.get(model.lower().rstrip("/"))
    if draft is None:
        return "", f"EAGLE-3: no draft is known for {model}"
    here = next((m for m in local if m.model.lower() == draft.lower()), None)
    if here is None:
        return "", (
            f"EAGLE-3: its draft {draft} is not on this computer (`traylm models pull {draft}`;"
            " a tune downloads nothing)"
        )
    return str(here.folder), ""


def eagle3_flags(draft_folder: str) -> tuple[str, str]:
    spec = {"method": "eagle3", "model": draft_folder, "num_speculative_tokens": SPEC_TOKENS}
    return ("--speculative-config", json.dumps(spec, separators=(",", ":")))
