"""vLLM across versions: the entrypoint each version prefers (0.33 deprecates the module entry),
served for real through the daemon from a FAKE 0.33 env, and the install-time flag probe on the
CUDA recipe (whose 0.33 ships no list) recording the installed version's flags."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import aiohttp
import pytest
from packaging.version import Version

from engines.config.profiles import profile_from_mapping
from engines.envs import manager as manager_module
from engines.envs.builds import Build, PipStep
from engines.envs.manager import FLAGS_FILE, RECIPES, EnvManager, load_flags
from engines.events import EngineState
from engines.runtime.adapters.base import EngineRuntime
from engines.runtime.adapters.vllm import VLLMAdapter
from tests.conftest import RunningDaemon
from tests.fakes.fake_vllm_env import make_fake_vllm_env


def launch(version: str) -> list[str]:
    runtime = EngineRuntime(
        "vllm",
        Version(version),
        Path("/env/bin/python"),
        Path("/env/bin"),
        "cuda",
        load_flags("vllm", "0.32.0"),
    )
    profile = profile_from_mapping("p", {"model": "org/model", "device": "cuda"})
    return list(VLLMAdapter().launch(profile, runtime=runtime, port=1, model="org/model").argv)


@pytest.mark.parametrize("version", ["0.33.0", "0.33.0rc1", "0.34.2"])
def test_from_0_33_the_cli_serve_entry_takes_the_model_as_its_argument(version: str) -> None:
    argv = launch(version)
    # run from -c code (vllm_start.api_server_command): the same module as `-m` would run
    assert argv[:2] == ["/env/bin/python", "-c"]
    assert "run_module('vllm.entrypoints.cli.main', run_name='__main__')" in argv[2]
    assert argv[3:5] == ["serve", "org/model"]
    assert "--model" not in argv  # `vllm serve --model` is deprecated too


def test_before_0_33_the_module_entry_takes_model_as_a_flag() -> None:
    argv = launch("0.32.0")
    assert argv[:2] == ["/env/bin/python", "-c"]
    assert "run_module('vllm.entrypoints.openai.api_server', run_name='__main__')" in argv[2]
    assert argv[3:5] == ["--model", "org/model"]


async def test_a_0_33_env_is_served_through_its_cli_entry(daemon_factory, paths) -> None:  # type: ignore[no-untyped-def]
    make_fake_vllm_env(paths.envs_dir, version="0.33.0")
    d: RunningDaemon = await daemon_factory()
    d.write_profile("new", model="org/new", served_name="new", device="cpu")
    await d.client.start("new")
    status = await d.client.wait_for_engine("new", (EngineState.READY, EngineState.FAILED), 30)
    assert status.state == EngineState.READY, status.detail
    log = d.daemon.engine("new").log_path.read_text()
    argv = shlex.split(
        [ln for ln in log.splitlines() if ln.startswith("===== argv: ")][-1].split(": ", 1)[1]
    )
    assert argv[1] == "-c" and "run_module('vllm.entrypoints.cli.main'" in argv[2]
    assert argv[3:5] == ["serve", "org/new"]
    body = {"model": "new", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        aiohttp.ClientSession() as http,
        http.post(d.url + "/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200 and (await r.json())["choices"][0]["message"]["content"] == "w0 w1"


FAKE_VLLM_SETUP = """
from setuptools import setup
setup(name="vllm", version="0.33.0", packages=[
    "vllm", "vllm.utils", "vllm.entrypoints", "vllm.entrypoints.launchers"], py_modules=["torch"])
"""
FAKE_CLI_ARGS = """
def make_arg_parser(parser):
    parser.add_argument("--model")
    parser.add_argument("--max-model-len")
    parser.add_argument("--new-in-0-33", choices=["a", "b"])
    return parser
"""


def write_fake_vllm_package(root: Path) -> Path:
    """A FAKE `vllm` 0.33.0 distribution (and a FAKE `torch` module): just enough for the import
    check and for resources/probes/argparse_flags.py to build "its" parser."""
    modules = {
        "setup.py": FAKE_VLLM_SETUP,
        "torch.py": "import types\n__version__ = '2.9.0+fake'\nversion = types.SimpleNamespace(cuda='13.0')\n",
        "vllm/__init__.py": "__version__ = '0.33.0'\n",
        "vllm/utils/__init__.py": "",
        "vllm/utils/argparse_utils.py": "from argparse import ArgumentParser as FlexibleArgumentParser\n",
        "vllm/entrypoints/__init__.py": "",
        "vllm/entrypoints/launchers/__init__.py": "",
        "vllm/entrypoints/launchers/cli_args.py": FAKE_CLI_ARGS,
    }
    for name, text in modules.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.slow
async def test_the_cuda_recipe_probes_the_flags_of_the_version_it_installs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = RECIPES[("vllm", "cuda")]
    assert recipe.default_version == "0.34.0" and recipe.probe_flags
    pkg = write_fake_vllm_package(tmp_path / "src")

    def local_build(engine: str, version: str, cuda: str) -> Build:
        """The driver's build, but its one pip step installs the FAKE 0.33 package (the real
        ones come from PyPI and PyTorch's index: tests/engines/envs/test_builds.py checks those)."""
        return Build(engine, "cuda", "0.33.0", "13.0", (PipStep((str(pkg),), engine=True),), "")

    monkeypatch.setattr(manager_module, "choose_build", local_build)
    env = await EnvManager(tmp_path / "envs").install("vllm", device="cuda", version="0.33.0")
    recorded = json.loads((env.path / FLAGS_FILE).read_text())
    assert recorded["version"] == "0.33.0"
    assert recorded["flags"]["--new-in-0-33"]["choices"] == ["a", "b"]
    flags = env.runtime().flags
    assert flags.version == "0.33.0" and "--new-in-0-33" in flags.flags
