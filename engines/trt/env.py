"""TensorRT-LLM (and SGLang) specifics of engine environments: what `traylm engines install
trtllm` does after pip, and what `traylm engines doctor` checks on a GPU machine.

- The build steps use two scripts that are not in the wheel (ModelOpt's quantize.py and the
  llama family's convert_checkpoint.py): they are fetched from the release's tag into
  ``<env>/trtllm-examples``.
- Flag allow-lists for every tool are probed from the installed parsers (click for
  trtllm-serve, argparse for the rest); the shipped lists for 1.2.x are the fallback.
- doctor: GPU architecture (FP8 needs Ada/Hopper, NVFP4 Blackwell), the driver's CUDA against
  the CUDA torch was built for, OpenMPI for tensor parallel.
"""

from __future__ import annotations

import asyncio
import ctypes.util
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engines.config.sections import resources_dir
from engines.config.tomlfile import write_bytes_atomic
from engines.envs.steps import META_FILE, Check, EnvExtras, ProgressFn, capture, report
from engines.errors import EngineEnvError
from engines.events.gpu import GPUInfo
from engines.gpu.inventory import Inventory, architecture, capability, sm_name

log = logging.getLogger(__name__)

EXAMPLES_DIR = "trtllm-examples"
EXAMPLES_URL = "https://raw.githubusercontent.com/NVIDIA/TensorRT-LLM/v{version}/examples/{path}"
EXAMPLE_SCRIPTS = ("quantization/quantize.py", "models/core/llama/convert_checkpoint.py")
TOOL_PROBES: dict[str, tuple[str, ...]] = {
    "build": ("trtllm-build",),
    "quantize": ("script", "{examples}/quantization/quantize.py", "trtllm-quantize"),
    "convert-llama": (
        "script",
        "{examples}/models/core/llama/convert_checkpoint.py",
        "trtllm-convert-llama",
    ),
}
FETCH_TIMEOUT_S = 30.0


async def after_install(target: Path, version: str, progress: ProgressFn | None) -> None:
    """Fetch the example scripts the build steps run, then probe every tool's flags."""
    examples = target / EXAMPLES_DIR
    for path in EXAMPLE_SCRIPTS:
        url = EXAMPLES_URL.format(version=version, path=path)
        try:
            data = await asyncio.to_thread(_fetch, url)
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            await report(
                progress,
                "fix",
                f"could not fetch {url} ({exc}); mode = 'build' needs it: install again when "
                "GitHub is reachable (mode = 'serve' works without it)",
            )
            continue
        write_bytes_atomic(examples / path, data)
        await report(progress, "fix", f"fetched {path} of TensorRT-LLM {version}")
    await probe_flags(target, progress)


async def probe_flags(target: Path, progress: ProgressFn | None) -> None:
    probe = str(resources_dir() / "probes" / "argparse_flags.py")
    python = str(target / "bin" / "python")
    jobs = {"": ("trtllm",), **TOOL_PROBES}
    for tool, args in jobs.items():
        argv = [a.format(examples=target / EXAMPLES_DIR) for a in args]
        name = f"flags-{tool}.json" if tool else "flags.json"
        try:
            out = await capture([python, probe, *argv])
            json.loads(out)
        except (EngineEnvError, ValueError) as exc:
            reason = exc.message.splitlines()[-1] if isinstance(exc, EngineEnvError) else exc
            await report(
                progress,
                "probe",
                f"could not probe {tool or 'trtllm-serve'} flags ({reason}); "
                "traylm uses its shipped list for this version line",
            )
            continue
        write_bytes_atomic(target / name, out.encode())
        await report(progress, "probe", f"probed {tool or 'trtllm-serve'} flags")


def import_facts(env_path: Path) -> dict[str, str]:
    """The versions the install's import check printed (``TRAYLM {json}``)."""
    try:
        meta = json.loads((env_path / META_FILE).read_text())
    except (OSError, ValueError):
        return {}
    for line in reversed(str(meta.get("import_check", "")).splitlines()):
        if line.startswith("TRAYLM "):
            try:
                data: dict[str, Any] = json.loads(line[7:])
            except ValueError:
                return {}
            return {k: str(v) for k, v in data.items() if v is not None}
    return {}


def find_openmpi() -> str | None:
    """The OpenMPI runtime library TensorRT-LLM's MPI ranks load, if present."""
    return ctypes.util.find_library("mpi")


async def doctor_checks(env_path: Path, extras: str, gpus: Sequence[GPUInfo]) -> list[Check]:
    facts = import_facts(env_path)
    checks = [gpu_architecture_check(gpus), cuda_check(gpus, facts.get("torch_cuda", ""))]
    if extras == "trtllm":
        mpi = await asyncio.to_thread(find_openmpi)
        checks.append(
            Check(
                "OpenMPI (tensor parallel)",
                mpi is not None,
                f"found {mpi}" if mpi else "libmpi not found: TP > 1 cannot start",
                "" if mpi else "sudo apt install openmpi-bin libopenmpi-dev",
            )
        )
        missing = [p for p in EXAMPLE_SCRIPTS if not (env_path / EXAMPLES_DIR / p).exists()]
        checks.append(
            Check(
                "engine-build scripts",
                not missing,
                "present" if not missing else f"missing {', '.join(missing)}",
                ""
                if not missing
                else "run `traylm engines install trtllm` again with network "
                "access (mode = 'serve' works without them)",
            )
        )
    return [c for c in checks if c.name]


def gpu_architecture_check(gpus: Sequence[GPUInfo]) -> Check:
    if not gpus:
        return Check("GPU architecture", False, "no NVIDIA GPU answered NVML", "install the driver")
    parts = []
    for g in gpus:
        cc = capability(g.compute_capability)
        if cc >= (10, 0):
            formats = "FP8, NVFP4, AWQ, INT8"
        elif cc >= (8, 9):
            formats = "FP8 (weights and KV cache), AWQ, INT8; not NVFP4"
        elif cc >= (8, 0):
            formats = "AWQ, INT8 weight-only; no FP8 (use int4_awq or int8_wo)"
        else:
            formats = "too old for TensorRT-LLM 1.2"
        where = f"{sm_name(g.compute_capability)}, {architecture(g.compute_capability)}"
        parts.append(f"GPU {g.index} {g.name} ({where}): {formats}")
    ok = all(capability(g.compute_capability) >= (8, 0) for g in gpus)
    return Check("GPU architecture", ok, "; ".join(parts), "" if ok else "use vLLM on this GPU")


def cuda_check(gpus: Sequence[GPUInfo], torch_cuda: str) -> Check:
    """The driver must support at least the CUDA version torch was built for."""
    if not gpus or not torch_cuda:
        return Check("", True, "")
    driver = gpus[0].cuda_version
    ok = _version_tuple(driver) >= _version_tuple(torch_cuda)
    return Check(
        "driver/CUDA",
        ok,
        f"driver {gpus[0].driver_version} supports CUDA {driver}; the engine's torch needs "
        f"CUDA {torch_cuda}",
        "" if ok else f"update the NVIDIA driver to one that supports CUDA {torch_cuda}",
    )


def _version_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(".")[:2])
    except ValueError:
        return (0,)


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=FETCH_TIMEOUT_S) as resp:  # noqa: S310 - https only
        data: bytes = resp.read()
    return data


def env_extras(inventory: Inventory) -> dict[str, EnvExtras]:
    """The steps EnvManager runs for the engines that need more than pip (EngineRecipe.extras);
    the doctor reads the GPUs from ``inventory``."""

    async def doctor(env_path: Path, extras: str) -> list[Check]:
        return await doctor_checks(env_path, extras, await inventory.gpus())

    return {
        "trtllm": EnvExtras(doctor_checks=doctor, after_install=after_install),
        "sglang": EnvExtras(doctor_checks=doctor),
    }
