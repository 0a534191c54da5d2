"""Can a profile start on this computer? A pure function of the profile, the engine
environments the daemon lists and the NVIDIA GPUs it sees, so that the tray never offers as its
first action a start that fails at once (a 2×RTX 4090 preset on a computer without a GPU or
without the engine).

The shipped presets are written for RTX 4090s: with ``device = "auto"`` they still need a GPU
(on the CPU they would "run" an 8B model at a word a minute). A profile of the user's own with
``device = "auto"`` runs on the CPU build where there is no GPU, as the daemon decides.
"""

from __future__ import annotations

from collections.abc import Sequence

from desktop.messages import EnvEntry, ProfileEntry

ENGINE_NAMES = {"vllm": "vLLM", "trtllm": "TensorRT-LLM", "sglang": "SGLang"}


def profile_device(entry: ProfileEntry, real_gpus: int) -> str:
    """cuda or cpu: where the profile runs here."""
    device = str(entry.fields.get("device", "auto"))
    if device in ("cuda", "cpu"):
        return device
    return "cuda" if real_gpus or entry.preset else "cpu"


def gpus_needed(entry: ProfileEntry) -> int:
    tp = int(str(entry.fields.get("tensor_parallel_size", 1)))
    pp = int(str(entry.fields.get("pipeline_parallel_size", 1)))
    return max(1, tp * pp)


def profile_blocker(entry: ProfileEntry, envs: Sequence[EnvEntry] | None, real_gpus: int) -> str:
    """Why ``entry`` cannot start here, in a few words ("" when it can). ``envs`` None means
    the daemon has not listed them yet: nothing is known to block."""
    engine = str(entry.fields.get("engine", "vllm"))
    device = profile_device(entry, real_gpus)
    if device == "cuda":
        needed = gpus_needed(entry)
        if real_gpus == 0:
            return "needs an NVIDIA GPU"
        if real_gpus < needed:
            return f"needs {needed} NVIDIA GPUs ({real_gpus} here)"
    if envs is None:
        return ""
    if not any(e.complete and e.engine == engine and e.device == device for e in envs):
        build = "CPU build" if device == "cpu" else "CUDA build"
        return f"needs the {ENGINE_NAMES.get(engine, engine)} engine ({build}): not installed"
    return ""
